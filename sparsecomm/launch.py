"""Start ranks on this machine, optionally over an emulated cluster network.

    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- python train.py --epochs 1
    python -m sparsecomm.launch --nnodes 2 --nproc-per-node 2 --bandwidth 1gbit -- python train.py
    python -m sparsecomm.launch --nproc 2 --bandwidth none -- python train.py
    python -m sparsecomm.launch --nproc 2 --bandwidth 1gbit --backend mpi -- python -m mpi4py prog.py

The cluster has N nodes of L ranks each (``--nnodes N --nproc-per-node L``, L defaults to 1);
``--nproc P`` is P nodes of one rank, and may be given with either of the two others when it
equals their product. With ``--bandwidth RATE`` (e.g. ``1gbit``, ``100mbit``) every node is one
network namespace with one veth link into a bridge namespace (a switch), and both ends of each
link are shaped with ``tc ... tbf rate RATE`` -- a full-duplex switch port of that speed, which
reproduces the papers' 1 Gbit/s Ethernet clusters (``netem`` is not available here; ``tbf``
is). The L ranks of a node share its namespace, its address and so its one link, as the GPUs
of a node share its network card: two ranks of a node sending to other nodes at once get about
half the rate each. Between two ranks of one node, traffic goes to the node's own address,
which the kernel delivers over the namespace's loopback, never through the shaped link
(measured: 100 MB between two ranks of a node in 0.03 s, 27 Gbit/s, with no byte through the
node's shaped ``tc`` queue; 0.96 Gbit/s between nodes over 1gbit). Every node's namespace
names the emulated addresses in a ``hosts`` file of its own and looks names up there only
(``/etc/netns/<namespace>/``, which ``ip netns exec`` mounts over /etc): c10d looks up the
name of every peer it accepts, and the namespaces cannot reach this machine's DNS server
(:meth:`EmulatedNetwork.name_files`). This needs root and
iproute2. ``--bandwidth none`` runs all ranks on plain loopback.

Each rank gets the variables torchrun sets on N nodes (MASTER_ADDR (node 0's address),
MASTER_PORT, RANK = node * L + local rank, WORLD_SIZE = N * L, LOCAL_RANK, LOCAL_WORLD_SIZE =
L, GROUP_RANK = NODE_RANK = node, GROUP_WORLD_SIZE = N, ROLE_RANK, ROLE_WORLD_SIZE) plus
GLOO_SOCKET_IFNAME (the node's link, ``eth<node>``; ``lo`` on loopback), so a script calling
``torch.distributed.init_process_group("gloo")`` works unchanged, and SPARSECOMM_BANDWIDTH
(the link rate, empty on loopback) and SPARSECOMM_NPROC_PER_NODE (L) so it can say what network
it ran on. Output lines are prefixed with the rank. When a rank fails, the others are stopped
and the launch exits non-zero. Every namespace the launch made is removed on exit, also on
Ctrl-C or a crash of a rank.

Before the ranks start, the launcher measures the links with one TCP connection, at most
0.3 s: with one rank per node from rank 0's namespace to rank 1's, printing ``link: 1 Gbit/s
configured, 0.958 Gbit/s measured rank 0 -> rank 1``; with several, from node 0 to node 1 and
between two ends inside node 0, printing ``link: 2 nodes x 2 ranks; between nodes 1 Gbit/s
configured, 0.957 Gbit/s measured node 0 -> node 1; inside a node loopback, 13.7 Gbit/s
measured rank 0 -> rank 1``. The ranks get the rate between nodes as
SPARSECOMM_MEASURED_BANDWIDTH and the one inside a node as SPARSECOMM_MEASURED_INTRA_BANDWIDTH
(bits/s, empty when not measured: one node, one rank per node for the latter, or ``--bandwidth
none``), and :func:`describe_link` names them.

If the launcher itself is killed outright (SIGKILL, the OOM killer), every process it started
(the ranks, ``ip netns exec``, mpirun and through it the mpi ranks) gets SIGKILL from the
kernel (PR_SET_PDEATHSIG), so no rank runs on. Its namespaces cannot be removed then; the next
launch removes them (``sc<pid>r<rank>``, ``sc<pid>n<node>`` and ``sc<pid>br`` namespaces and
the ``sc<pid>h`` link of the mpi backend whose launcher pid no longer runs, killing anything
still inside) and leaves those of live launches alone.

``--backend gloo`` (the default) starts the ranks itself. ``--backend mpi`` starts them with
one Open MPI ``mpirun`` (tested with 4.1), so mpi4py programs (``sparsecomm.comm.MPIComm``) run
too, and gloo programs still get the variables above. MPI's traffic (``--mca btl self,tcp``)
goes over the shaped links between nodes and over loopback inside a node; mpirun's PMIx server
is reached through one extra, unshaped veth from the root namespace into the bridge, which only
the mpi backend creates and which is removed with the namespaces. Each rank starts through this
module (``--mpi-rank``, internal), which sets the rank's variables from
``OMPI_COMM_WORLD_RANK``/``_SIZE`` and execs the command inside the namespace of the rank's
node. mpirun's tagged output is turned into the same ``[rank N]`` lines (its own messages get
``[mpirun]``). mpirun stops the other ranks when one exits non-zero. Note that an mpi4py
program which exits non-zero after MPI was initialized first waits in ``MPI_Finalize`` for the
other ranks; run it as ``python -m mpi4py prog.py`` so that an exit or an uncaught exception
aborts the whole job at once. With ``--bandwidth none`` mpirun runs on loopback (TCP over
``lo``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

__all__ = ["EmulatedNetwork", "launch", "main", "parse_rate", "find_mpirun", "describe_link", "LaunchError",
           "NetworkSetupError", "measure_rate", "remove_stale_namespaces"]

_SUBNET = "10.213.0"  # private addresses inside the launch's own namespaces only
_HOST_BYTE = 254  # last byte of the root namespace's address on the bridge (mpi backend)
_MPI_RANK = "--mpi-rank"  # internal: how mpirun starts each rank through this module (see _mpi_rank)
# what this module names things: namespaces sc<launcher pid>r<rank> (one rank per node),
# sc<pid>n<node> (several) and sc<pid>br, the mpi host link sc<pid>h
_OWN_NAMESPACE = re.compile(r"sc(\d+)(?:[rn]\d+|br)")
_OWN_HOST_LINK = re.compile(r"sc(\d+)h")
_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000
#: ``ip netns exec NAME`` bind-mounts the files of /etc/netns/NAME over those of /etc for the
#: command it runs: a node's ``hosts`` file there names the emulated addresses
_NETNS_ETC = "/etc/netns"


class LaunchError(RuntimeError):
    """The launch cannot start on this machine."""


class NetworkSetupError(LaunchError):
    """The emulated network cannot be built on this machine."""


def parse_rate(text: str) -> str | None:
    """Validate a tc rate such as ``1gbit``, ``500mbit``; ``none`` means no shaping."""
    if text.lower() == "none":
        return None
    if not re.fullmatch(r"\d+(\.\d+)?(kbit|mbit|gbit)", text.lower()):
        raise argparse.ArgumentTypeError(f"bandwidth must look like 1gbit, 100mbit or 'none', got {text!r}")
    return text.lower()


def _rate_bits(rate: str) -> float:
    """bits/s of a tc rate that :func:`parse_rate` accepted (tc's units are decimal: 1kbit = 1000 bit/s)."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", rate)
    if found is None:
        raise ValueError(f"not a tc rate: {rate!r}")
    number, unit = found.groups()
    return float(number) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[unit]


def _format_bits(bits: float, unit_of: float | None = None) -> str:
    """1e9 -> '1 Gbit/s', 9.5e7 -> '95 Mbit/s'; in the unit ``unit_of`` would get, if given
    (9.6e8 next to a configured 1e9 -> '0.96 Gbit/s')."""
    reference = bits if unit_of is None else unit_of
    for scale, unit in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if reference >= scale or scale == 1e3:
            return f"{bits / scale:.3g} {unit}"
    raise AssertionError("unreachable")


def _libc():
    import ctypes  # only where needed: the --mpi-rank step runs with -I and the standard library

    return ctypes.CDLL(None, use_errno=True)


def _die_with_parent(sig: int = signal.SIGKILL):
    """A ``preexec_fn`` that makes the child get ``sig`` when this process dies, even by SIGKILL.

    PR_SET_PDEATHSIG survives ``exec`` (here: ``ip netns exec`` execs the command, it does not
    fork) unless the exec changes credentials (set-user-ID files; not ``ip`` run by root), and
    fires when the *thread* that forked the child exits, so :func:`launch` starts and waits for
    its processes in one thread. If the parent died between fork and prctl, the child kills itself.
    None where prctl does not exist (not Linux).
    """
    try:
        prctl = _libc().prctl  # resolved before the fork: the child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return set_death_signal


def _process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, killed and not yet reaped by its parent, is not running)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        return True  # exists but unreadable: count it as running, never remove a live launch's network


def _kill_namespace(name: str) -> None:
    """SIGKILL every process inside network namespace ``name``, then delete the namespace and
    its files under /etc/netns.

    A namespace (and its veth links) lives on as long as a process is inside it.
    """
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    shutil.rmtree(os.path.join(_NETNS_ETC, name), ignore_errors=True)


def remove_stale_namespaces() -> list[str]:
    """Remove the namespaces and host links of launches whose launcher no longer runs.

    A launcher killed with SIGKILL cannot remove its network; the next launch does, here:
    every ``sc<pid>r<rank>``/``sc<pid>n<node>``/``sc<pid>br`` namespace and ``sc<pid>h`` link
    whose ``<pid>`` is not a running process goes (processes still inside are killed first, its
    /etc/netns folder with it). Those of a live
    launch, including one starting concurrently, are left alone. Returns what was removed.
    """
    names = {line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()}
    with contextlib.suppress(OSError):   # a hosts folder whose namespace is gone already
        names.update(os.listdir(_NETNS_ETC))
    links = [line.split(":")[1].strip().split("@")[0]
             for line in _run(["ip", "-o", "link", "show"]).splitlines() if line.count(":") >= 2]
    alive: dict[int, bool] = {}

    def stale(pattern: re.Pattern, name: str) -> bool:
        found = pattern.fullmatch(name)
        if not found:
            return False
        pid = int(found.group(1))
        if pid not in alive:
            alive[pid] = pid == os.getpid() or _process_alive(pid)
        return not alive[pid]

    removed = []
    for link in links:  # the host link first, as down() does (not left to the namespace teardown)
        if stale(_OWN_HOST_LINK, link):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
            removed.append(link)
    for name in sorted(names, key=lambda n: n.endswith("br")):  # the rank namespaces before the bridge
        if stale(_OWN_NAMESPACE, name):
            _kill_namespace(name)
            removed.append(name)
    return removed


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetworkSetupError(f"{' '.join(cmd)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


@dataclass
class EmulatedNetwork:
    """One namespace per node joined through a bridge namespace by shaped veth links.

    ``size`` ranks, ``per_node`` in each node (``size // per_node`` nodes). The ranks of a node
    share its namespace, its one shaped link and its address; traffic between them stays
    inside the namespace (over its loopback: see the module docstring). With
    ``host_link=True`` (the mpi backend) an unshaped veth also joins the root namespace to the
    bridge, at ``host_address``, in a /24 the root namespace does not use yet.
    """

    size: int
    rate: str
    prefix: str = field(default_factory=lambda: f"sc{os.getpid()}")
    host_link: bool = False
    per_node: int = 1
    subnet: str = _SUBNET
    created: list[str] = field(default_factory=list)
    host_made: bool = False
    #: what :meth:`up` removed of launches that no longer run (see :func:`remove_stale_namespaces`)
    removed_stale: list[str] = field(default_factory=list)

    @staticmethod
    def check_possible() -> None:
        missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
        if missing:
            raise NetworkSetupError(f"{' and '.join(missing)} not found (install iproute2)")
        if os.geteuid() != 0:
            raise NetworkSetupError("building network namespaces needs root")

    @property
    def nodes(self) -> int:
        return self.size // self.per_node

    def node_of(self, rank: int) -> int:
        return rank // self.per_node

    def namespace(self, node: int) -> str:
        return f"{self.prefix}{'r' if self.per_node == 1 else 'n'}{node}"

    def interface(self, node: int) -> str:
        return f"eth{node}"

    def address(self, node: int) -> str:
        return f"{self.subnet}.{node + 1}"

    @property
    def cidr(self) -> str:
        return f"{self.subnet}.0/24"

    @property
    def bridge_namespace(self) -> str:
        return f"{self.prefix}br"

    @property
    def host_interface(self) -> str:
        """The root namespace's end of the host link (at most 15 characters)."""
        return f"{self.prefix}h"

    @property
    def host_address(self) -> str:
        return f"{self.subnet}.{_HOST_BYTE}"

    def up(self) -> None:
        self.check_possible()
        if self.per_node < 1 or self.size % self.per_node:
            raise ValueError(f"{self.size} ranks do not make nodes of {self.per_node}")
        if self.nodes > 250:
            raise NetworkSetupError("at most 250 nodes fit the emulated subnet")
        self.removed_stale = remove_stale_namespaces()
        # two mpi launches at once must not both pick the same free subnet: hold a lock from
        # the choice until the host link has its address (then the next launch sees it)
        with _subnet_lock() if self.host_link else contextlib.nullcontext():
            if self.host_link:
                self.subnet = _free_subnet()
            shape = ["tbf", "rate", self.rate, "burst", "256kb", "latency", "10ms"]
            bridge_ns = self.bridge_namespace
            self._add_namespace(bridge_ns)
            _run(["ip", "-n", bridge_ns, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", bridge_ns, "link", "set", "br0", "up"])
            for node in range(self.nodes):
                ns, port, iface = self.namespace(node), f"p{node}", self.interface(node)
                self._add_namespace(ns)
                _run(["ip", "-n", bridge_ns, "link", "add", port, "type", "veth", "peer", "name", iface, "netns", ns])
                _run(["ip", "-n", bridge_ns, "link", "set", port, "master", "br0"])
                _run(["ip", "-n", bridge_ns, "link", "set", port, "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", iface])
                _run(["ip", "-n", ns, "link", "set", iface, "up"])
                # both directions of the switch port: the rank's egress and the bridge port's egress
                _run(["tc", "-n", ns, "qdisc", "add", "dev", iface, "root", *shape])
                _run(["tc", "-n", bridge_ns, "qdisc", "add", "dev", port, "root", *shape])
            if self.host_link:  # unshaped: only mpirun's control traffic (PMIx) uses it
                host = self.host_interface
                _run(["ip", "link", "add", host, "type", "veth", "peer", "name", "host", "netns", bridge_ns])
                self.host_made = True
                _run(["ip", "-n", bridge_ns, "link", "set", "host", "master", "br0"])
                _run(["ip", "-n", bridge_ns, "link", "set", "host", "up"])
                _run(["ip", "addr", "add", f"{self.host_address}/24", "dev", host])
                _run(["ip", "link", "set", host, "up"])
            self._name_addresses()

    def name_files(self) -> dict[str, str]:
        """The files every node's namespace gets over /etc (``ip netns exec`` mounts them):

        * ``hosts``: this machine's /etc/hosts, then a name for every emulated address (the
          node's namespace name; the mpi host link's name), also in its IPv4-mapped IPv6
          form, the form in which c10d's dual-stack store socket sees its peers;
        * ``nsswitch.conf``: this machine's, with names looked up in that file only.

        c10d names the peer of every socket its store accepts (``getnameinfo``); a name not in
        the file would fall through to DNS, whose server a namespace cannot reach
        (EAI_AGAIN), and every rank would print "The hostname of the client socket cannot be
        retrieved". An address not in the file is answered at once, as a number.
        """
        def read(path: str, default: str) -> str:
            try:
                with open(path) as f:
                    return f.read()
            except OSError:
                return default

        named = [(self.address(node), self.namespace(node)) for node in range(self.nodes)]
        if self.host_link:
            named.append((self.host_address, self.host_interface))
        lines = [f"{prefix}{address} {name}" for address, name in named for prefix in ("", "::ffff:")]
        hosts = (read("/etc/hosts", "127.0.0.1 localhost\n").rstrip("\n") +
                 "\n# sparsecomm.launch: the emulated nodes\n" + "\n".join(lines) + "\n")
        nsswitch = [line for line in read("/etc/nsswitch.conf", "").splitlines()
                    if line.split(":")[0].strip() != "hosts"]
        return {"hosts": hosts, "nsswitch.conf": "\n".join([*nsswitch, "hosts: files"]) + "\n"}

    def _name_addresses(self) -> None:
        """Write :meth:`name_files` into /etc/netns/<namespace>/ of every node."""
        files = self.name_files()
        for node in range(self.nodes):
            folder = os.path.join(_NETNS_ETC, self.namespace(node))
            try:
                os.makedirs(folder, exist_ok=True)
                for name, text in files.items():
                    with open(os.path.join(folder, name), "w") as f:
                        f.write(text)
            except OSError as exc:
                raise NetworkSetupError(f"cannot write {folder} (the names of the emulated addresses): "
                                        f"{exc}") from exc

    def _add_namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self.created.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def down(self) -> None:
        """Remove the host link and every namespace this network made (their links go with them).

        Processes still inside a namespace (a rank that escaped its launcher) are killed
        first, since a namespace and its links live on as long as a process is in it.
        """
        if self.host_made:  # deleted here, not left to the (asynchronous) namespace teardown
            subprocess.run(["ip", "link", "del", self.host_interface], capture_output=True)
            self.host_made = False
        for name in reversed(self.created):
            _kill_namespace(name)
        self.created.clear()

    def wrap(self, rank: int, cmd: list[str]) -> list[str]:
        """``cmd`` run inside the namespace of ``rank``'s node."""
        return ["ip", "netns", "exec", self.namespace(self.node_of(rank)), *cmd]


def _socket_in_namespace(namespace: str, bind: tuple[str, int] | None = None) -> socket.socket:
    """A TCP socket created inside network namespace ``namespace`` (it stays there when used).

    Made on a short-lived thread that enters the namespace (setns applies to the calling
    thread only) and exits with it, so the launcher's own threads never change namespace.
    """
    made: dict[str, object] = {}

    def enter() -> None:
        try:
            with open(os.path.join("/run/netns", namespace)) as handle:
                if _libc().setns(handle.fileno(), _CLONE_NEWNET) != 0:
                    import ctypes

                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns into {namespace}: {os.strerror(errno)}")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            if bind is not None:
                sock.bind(bind)
                sock.listen(1)
            made["socket"] = sock
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller's thread
            made["error"] = exc

    thread = threading.Thread(target=enter, name=f"sparsecomm-setns-{namespace}")
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]
    return made["socket"]


def measure_rate(network: EmulatedNetwork, source: int = 0, dest: int = 1, max_bytes: int = 4 << 20,
                 max_seconds: float = 0.3) -> float:
    """bits/s from node ``source`` to node ``dest`` over one TCP connection between their namespaces.

    Both ends use the nodes' addresses, as gloo does with GLOO_SOCKET_IFNAME set; with
    ``source == dest`` the connection stays inside the node's namespace, the path between two
    ranks of one node (the kernel delivers traffic to a local address over loopback). The
    receiver stops after ``max_bytes`` or ``max_seconds`` from its first byte, whichever
    comes first, and the rate is taken over the second half of that time, after tbf's burst
    (256 kB let through at once) and TCP's slow start. Well under a second at any rate.
    """
    server = _socket_in_namespace(network.namespace(dest), bind=(network.address(dest), 0))
    client = _socket_in_namespace(network.namespace(source))
    conn = None
    try:
        server.settimeout(5)
        client.settimeout(5)
        client.connect(server.getsockname())
        conn, _ = server.accept()
        conn.settimeout(5)
        chunk = bytes(64 << 10)

        def send() -> None:
            try:
                deadline = time.monotonic() + max_seconds + 5
                while time.monotonic() < deadline:
                    client.sendall(chunk)
            except OSError:  # the receiver closed: done
                pass

        sender = threading.Thread(target=send, name="sparsecomm-rate-sender", daemon=True)
        sender.start()
        buffer = bytearray(256 << 10)
        samples: list[tuple[float, int]] = []
        total, first = 0, None
        while total < max_bytes:
            got = conn.recv_into(buffer)
            if not got:
                break
            now = time.perf_counter()
            first = now if first is None else first
            total += got
            samples.append((now, total))
            if now - first >= max_seconds:
                break
        conn.close()
        conn = None
        client.close()  # unblocks the sender
        sender.join(timeout=5)
        if len(samples) < 3:
            raise LaunchError(f"only {total} bytes arrived")
        middle = samples[0][0] + (samples[-1][0] - samples[0][0]) / 2
        start = next(sample for sample in samples if sample[0] >= middle)
        if start == samples[-1]:
            start = samples[len(samples) // 2 - 1]
        return (samples[-1][1] - start[1]) * 8 / (samples[-1][0] - start[0])
    finally:
        for sock in (conn, client, server):
            if sock is not None:
                sock.close()


@contextlib.contextmanager
def _subnet_lock():
    """An exclusive lock shared by every launch on this machine (a file in the temp folder)."""
    with open(os.path.join(tempfile.gettempdir(), "sparsecomm-launch-subnet.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield   # closing the file releases the lock


def _free_subnet() -> str:
    """A 10.213.X /24 with no address in the root namespace (the host link is visible there)."""
    used = set(re.findall(r"\binet 10\.213\.(\d+)\.", _run(["ip", "-4", "-o", "addr", "show"])))
    for third in range(256):
        if str(third) not in used:
            return f"10.213.{third}"
    raise NetworkSetupError("no free 10.213.X.0/24 subnet left in the root namespace")


def find_mpirun() -> str:
    """Path of Open MPI's mpirun, or LaunchError saying what is missing."""
    path = shutil.which("mpirun")
    if path is None:
        raise LaunchError("--backend mpi needs Open MPI's mpirun on PATH (e.g. apt-get install openmpi-bin)")
    version = subprocess.run([path, "--version"], capture_output=True, text=True)
    text = (version.stdout + version.stderr).strip()
    if "Open MPI" not in text and "OpenRTE" not in text:
        raise LaunchError(f"--backend mpi needs Open MPI's mpirun, but {path} is {text.splitlines()[0] if text else '?'}")
    return path


def describe_link() -> tuple[str, str]:
    """(where this rank's traffic goes, the emulated rate or ''), from what the launcher set.

    Programs started by this launcher have SPARSECOMM_BANDWIDTH (empty on loopback) and, when
    the launcher measured the link at start, SPARSECOMM_MEASURED_BANDWIDTH (bits/s, rank 0 to
    rank 1, or node 0 to node 1); with several ranks per node (SPARSECOMM_NPROC_PER_NODE) the
    nodes and the measured rate inside a node (SPARSECOMM_MEASURED_INTRA_BANDWIDTH) are named
    too. Under another launcher (torchrun, mpirun) the link is unknown and only the interface is named.
    """
    iface = os.environ.get("GLOO_SOCKET_IFNAME")
    rate = os.environ.get("SPARSECOMM_BANDWIDTH")
    measured = os.environ.get("SPARSECOMM_MEASURED_BANDWIDTH")
    per_node, world = os.environ.get("SPARSECOMM_NPROC_PER_NODE", ""), os.environ.get("WORLD_SIZE", "")
    if rate is not None and per_node.isdigit() and world.isdigit() and int(per_node) > 1:
        return _describe_nodes(int(world) // int(per_node), int(per_node), rate, measured,
                               os.environ.get("SPARSECOMM_MEASURED_INTRA_BANDWIDTH"), iface)
    if rate and measured:
        try:
            where = (f"{_format_bits(float(measured), _rate_bits(rate))} measured rank 0 -> rank 1, "
                     f"interface {iface}")
        except ValueError:
            where = f"interface {iface}"
        return f"emulated cluster, {rate} links ({where})", rate
    if rate:
        return f"emulated cluster, {rate} links (interface {iface})", rate
    if rate is not None:
        return f"plain loopback (interface {iface or 'lo'})", ""
    return f"network interface {iface or 'chosen by the backend'}, link not emulated by sparsecomm.launch", ""


def _describe_nodes(nodes: int, per_node: int, rate: str, measured: str | None, intra: str | None,
                    iface: str | None) -> tuple[str, str]:
    """:func:`describe_link` of a launch with several ranks per node."""
    shape = f"{nodes} node{'s' if nodes != 1 else ''} x {per_node} ranks"
    if not rate:
        return f"plain loopback, {shape} (interface {iface or 'lo'})", ""
    try:
        between = f"{_format_bits(float(measured), _rate_bits(rate))} measured node 0 -> node 1, " if measured else ""
        inside = f" ({_format_bits(float(intra))} measured)" if intra else ""
    except ValueError:
        between, inside = "", ""
    return (f"emulated cluster, {shape}, {rate} links between nodes ({between}interface {iface}), "
            f"loopback inside a node{inside}", rate)


def _rank_env(rank: int, size: int, per_node: int, master: str, port: int | str, ifname: str) -> dict[str, str]:
    """The variables every rank gets, from either backend: torchrun's on ``size // per_node``
    nodes of ``per_node`` ranks, plus gloo's interface."""
    node, nodes = rank // per_node, size // per_node
    return dict(MASTER_ADDR=master, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                LOCAL_RANK=str(rank % per_node), LOCAL_WORLD_SIZE=str(per_node),
                GROUP_RANK=str(node), GROUP_WORLD_SIZE=str(nodes), NODE_RANK=str(node),
                ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(size),
                SPARSECOMM_NPROC_PER_NODE=str(per_node), GLOO_SOCKET_IFNAME=ifname, PYTHONUNBUFFERED="1")


def _mpirun_command(mpirun: str, cmd: list[str], nproc: int, per_node: int, network: EmulatedNetwork | None,
                    master: str, port: int) -> tuple[list[str], dict[str, str]]:
    """One mpirun for all ranks, each started through ``_mpi_rank`` (this file, run by path)."""
    argv = [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--tag-output",
            "-np", str(nproc), "--mca", "btl", "self,tcp",
            "--mca", "btl_tcp_if_include", network.cidr if network else "lo",
            # -I: the wrapper needs only the standard library, not the package (which imports torch)
            sys.executable, "-I", os.path.abspath(__file__), _MPI_RANK,
            str(per_node), network.prefix if network else "", master, str(port), "--", *cmd]
    env = dict(os.environ, SPARSECOMM_LAUNCHER_PID=str(os.getpid()))
    if network:  # ranks in their namespaces reach mpirun's PMIx server through the host link
        env.update(PMIX_MCA_ptl_tcp_remote_connections="1", PMIX_MCA_ptl_tcp_if_include=network.host_interface)
    return argv, env


def _mpi_rank(argv: list[str]) -> int:
    """Run by mpirun for each rank: set the rank's variables, enter its namespace, exec the command."""
    if len(argv) < 6 or argv[4] != "--":
        raise SystemExit(f"usage: {_MPI_RANK} PER_NODE PREFIX MASTER PORT -- CMD... (started by mpirun, see launch())")
    per_node, prefix, master, port, _, *cmd = argv
    rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    per_node = int(per_node)
    network = EmulatedNetwork(size, "", prefix=prefix, per_node=per_node) if prefix else None
    os.environ.update(_rank_env(rank, size, per_node, master, port,
                                network.interface(network.node_of(rank)) if network else "lo"))
    try:  # die with mpirun even if it is killed outright (survives the execs below)
        _libc().prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    # mpirun dies with the launcher (its own death signal); if that happened before the prctl
    # above, this rank's parent is gone already and nothing would stop it: leave now
    launcher = os.environ.pop("SPARSECOMM_LAUNCHER_PID", "")
    if launcher.isdigit() and not _process_alive(int(launcher)):
        print(f"sparsecomm.launch: rank {rank}: the launcher (pid {launcher}) is gone; not starting",
              file=sys.stderr, flush=True)
        return 1
    argv = network.wrap(rank, cmd) if network else cmd
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"sparsecomm.launch: rank {rank} cannot run {argv[0]}: {exc}", file=sys.stderr, flush=True)
        return 127


class _RankLines:
    """Prefix each line of one rank's output (the gloo backend: one pipe per rank)."""

    def __init__(self, out, rank: int):
        self.out, self.rank = out, rank

    def feed(self, text: str) -> None:
        self.out.write(f"[rank {self.rank}] {text}")
        self.out.flush()

    def close(self) -> None:
        pass


class _MPIOutput:
    """Turn mpirun's ``--tag-output`` stream into the same ``[rank N] line`` lines.

    mpirun puts ``[job,rank]<stdout>:`` before every chunk a rank writes and after every
    newline inside one, so chunks of different ranks can share a line of mpirun's output;
    the rank's own text is reassembled per (rank, stream) and written line by line. Text
    after a newline and before the next tag is mpirun's own and gets ``[mpirun]``. The
    first failing rank named in mpirun's report is kept in ``failed_rank``.
    """

    _TAG = re.compile(r"\[\d+,(\d+)\]<(stdout|stderr|stddiag)>:")
    _FAILED = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]|MPI_ABORT was invoked on rank (\d+)")

    def __init__(self, out):
        self.out = out
        self.owner: tuple[str, str] | None = None  # whose text continues the current line
        self.pending: dict[tuple[str, str] | None, str] = {}
        self.failed_rank: int | None = None

    def feed(self, text: str) -> None:
        pos = 0
        for tag in self._TAG.finditer(text):
            self._text(text[pos:tag.start()])
            self.owner = (tag.group(1), tag.group(2))
            pos = tag.end()
        self._text(text[pos:])

    def _text(self, text: str) -> None:
        while text:
            line, newline, text = text.partition("\n")
            line = self.pending.pop(self.owner, "") + line
            if not newline:
                self.pending[self.owner] = line
                return
            self._write(self.owner, line)
            self.owner = None  # after a newline, a rank's text always starts with a new tag

    def _write(self, owner, line: str) -> None:
        # mpirun's own report and the rank's tagged <stddiag> lines both may name the failure
        found = self._FAILED.search(line)
        if found and self.failed_rank is None:
            self.failed_rank = int(found.group(1) or found.group(2))
        self.out.write(f"[rank {owner[0]}] {line}\n" if owner else f"[mpirun] {line}\n")
        self.out.flush()

    def close(self) -> None:
        for owner, line in list(self.pending.items()):
            if line:
                self._write(owner, line)
        self.pending.clear()


def _pump(stream, sink) -> None:
    for line in iter(stream.readline, b""):
        sink.feed(line.decode(errors="replace"))
    sink.close()
    stream.close()


def launch(cmd: list[str], nproc: int, rate: str | None, port: int = 29500, out=None,
           backend: str = "gloo", nproc_per_node: int = 1) -> int:
    """Run ``cmd`` as ``nproc`` ranks, ``nproc_per_node`` to a node; returns the exit code
    (first failing rank's, or 0).

    ``backend="gloo"`` starts one process per rank; ``"mpi"`` starts one mpirun for all.
    """
    if backend not in ("gloo", "mpi"):
        raise ValueError(f"backend must be 'gloo' or 'mpi', got {backend!r}")
    if nproc_per_node < 1 or nproc < 1 or nproc % nproc_per_node:
        raise ValueError(f"{nproc} ranks do not make whole nodes of {nproc_per_node} ranks")
    out = out or sys.stdout
    mpirun = find_mpirun() if backend == "mpi" else None
    network = EmulatedNetwork(nproc, rate, host_link=mpirun is not None, per_node=nproc_per_node) if rate else None
    procs: list[subprocess.Popen] = []
    sinks: list = []
    pumps: list[threading.Thread] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def interrupted(signum, frame):  # turn SIGTERM into the same clean path as Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        if network:
            network.up()
            if network.removed_stale:
                out.write("sparsecomm.launch: removed the network of launches no longer running: "
                          f"{', '.join(network.removed_stale)}\n")
        measured, measured_intra = _report_link(network, rate, nproc, nproc_per_node, out)
        master = network.address(0) if network else "127.0.0.1"
        # lets a program report the link it ran on
        link_env = {"SPARSECOMM_BANDWIDTH": rate or "", "SPARSECOMM_MEASURED_BANDWIDTH": measured,
                    "SPARSECOMM_MEASURED_INTRA_BANDWIDTH": measured_intra}
        if mpirun:
            argv, env = _mpirun_command(mpirun, cmd, nproc, nproc_per_node, network, master, port)
            jobs = [(argv, {**env, **link_env}, _MPIOutput(out))]
        else:
            jobs = [(network.wrap(rank, cmd) if network else cmd,
                     dict(os.environ, **link_env, **_rank_env(
                         rank, nproc, nproc_per_node, master, port,
                         network.interface(network.node_of(rank)) if network else "lo")),
                     _RankLines(out, rank))
                    for rank in range(nproc)]
        for argv, env, sink in jobs:
            # killed with the launcher, even by SIGKILL (mpirun: its ranks die with it in turn)
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_die_with_parent())
            procs.append(proc)
            sinks.append(sink)
            pump = threading.Thread(target=_pump, args=(proc.stdout, sink), daemon=True)
            pump.start()
            pumps.append(pump)
        index, status = _wait_first_failure(procs)
        if status and mpirun:  # mpirun has stopped the others already; it names the rank
            pumps[0].join(timeout=5)
            rank = sinks[0].failed_rank
            out.write(f"sparsecomm.launch: rank {rank} exited with {status}; mpirun stopped the other ranks\n"
                      if rank is not None else f"sparsecomm.launch: mpirun exited with {status}; ranks stopped\n")
        elif status:
            out.write(f"sparsecomm.launch: rank {index} exited with {status}; stopping the other ranks\n")
        return status
    except KeyboardInterrupt:
        out.write("sparsecomm.launch: interrupted; stopping the ranks\n")
        return 130
    finally:
        _stop(procs)
        for pump in pumps:
            pump.join(timeout=2)
        if network:
            network.down()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _report_link(network: EmulatedNetwork | None, rate: str | None, nproc: int, per_node: int,
                 out) -> tuple[str, str]:
    """Print the configured and measured rates; returns bits/s as text between nodes (rank 0 ->
    rank 1 with one rank per node) and inside node 0 ('' where not measured)."""
    if network is None:
        out.write("sparsecomm.launch: link: plain loopback, not shaped (--bandwidth none), not measured\n")
        return "", ""
    configured_bits = _rate_bits(rate)
    configured = _format_bits(configured_bits)
    if per_node == 1:
        if nproc < 2:
            out.write(f"sparsecomm.launch: link: {configured} configured, not measured (one rank)\n")
            return "", ""
        bits, text = _measure_for_report(network, 0, 1, configured_bits, "rank 0 -> rank 1")
        out.write(f"sparsecomm.launch: link: {configured} configured, {text}\n")
        out.flush()
        return bits, ""
    nodes = network.nodes
    if nodes < 2:
        between = f"between nodes {configured} configured, not measured (one node)"
        bits = ""
    else:
        bits, text = _measure_for_report(network, 0, 1, configured_bits, "node 0 -> node 1")
        between = f"between nodes {configured} configured, {text}"
    # the receiver stops at 0.1 s: loopback moves tens of MB in that time
    intra, text = _measure_for_report(network, 0, 0, None, "rank 0 -> rank 1", max_bytes=1 << 30, max_seconds=0.1)
    out.write(f"sparsecomm.launch: link: {nodes} node{'s' if nodes != 1 else ''} x {per_node} ranks; {between}; "
              f"inside a node loopback, {text}\n")
    out.flush()
    return bits, intra


def _measure_for_report(network: EmulatedNetwork, source: int, dest: int, unit_of: float | None, between: str,
                        **limits) -> tuple[str, str]:
    """(bits/s as text or '', what to print) of :func:`measure_rate` from node ``source`` to ``dest``."""
    try:
        bits = measure_rate(network, source, dest, **limits)
    except (OSError, LaunchError) as exc:  # the launch goes on: the measurement is only a report
        return "", f"not measured ({exc})"
    return str(round(bits)), f"{_format_bits(bits, unit_of)} measured {between}"


def _wait_first_failure(procs: list[subprocess.Popen]) -> tuple[int, int]:
    """Wait until all exit 0 (returns (-1, 0)) or one fails (returns its index and code)."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            return failed[0]
        if all(c == 0 for c in codes):
            return -1, 0
        time.sleep(0.05)


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _cluster_shape(parser: argparse.ArgumentParser, nproc: int | None, nnodes: int | None,
                   per_node: int | None) -> tuple[int, int]:
    """(nodes, ranks per node) from --nproc / --nnodes / --nproc-per-node, or a parser error."""
    for flag, value in (("--nproc", nproc), ("--nnodes", nnodes), ("--nproc-per-node", per_node)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    if nproc is None and nnodes is None:
        parser.error("give --nproc P (P nodes of one rank) or --nnodes N [--nproc-per-node L]")
    if nproc is None:
        return nnodes, per_node or 1
    if nnodes is None and per_node is None:
        return nproc, 1
    nnodes = nnodes if nnodes is not None else nproc // per_node
    per_node = per_node if per_node is not None else nproc // nnodes
    if nnodes * per_node != nproc:
        parser.error(f"--nproc {nproc} is not --nnodes x --nproc-per-node ({nnodes} x {per_node}); "
                     "give --nnodes and --nproc-per-node alone, or values whose product is --nproc")
    return nnodes, per_node


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [_MPI_RANK]:
        return _mpi_rank(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m sparsecomm.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, help="number of ranks, one per node (--nnodes P --nproc-per-node 1)")
    parser.add_argument("--nnodes", type=int, help="number of nodes, each with its own shaped link")
    parser.add_argument("--nproc-per-node", type=int, help="ranks per node, sharing its link (default 1)")
    parser.add_argument("--bandwidth", type=parse_rate, default="1gbit",
                        help="link rate per node (tc syntax, e.g. 1gbit, 100mbit) or 'none' for loopback")
    parser.add_argument("--backend", choices=["gloo", "mpi"], default="gloo",
                        help="how the ranks start: gloo (one process each, torchrun-style variables) "
                             "or mpi (one Open MPI mpirun, the same variables too)")
    parser.add_argument("--port", type=int, default=29500, help="MASTER_PORT")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- followed by the command each rank runs")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("give the command to run after --")
    nnodes, per_node = _cluster_shape(parser, args.nproc, args.nnodes, args.nproc_per_node)
    if args.backend == "mpi":
        try:
            find_mpirun()
        except LaunchError as exc:
            print(f"sparsecomm.launch: {exc}", file=sys.stderr)
            return 2
    if args.bandwidth:
        try:
            EmulatedNetwork.check_possible()
        except NetworkSetupError as exc:
            print(f"sparsecomm.launch: cannot emulate a {args.bandwidth} network here ({exc}); "
                  "rerun with --bandwidth none to use plain loopback", file=sys.stderr)
            return 2
    try:
        return launch(cmd, nnodes * per_node, args.bandwidth, args.port, backend=args.backend,
                      nproc_per_node=per_node)
    except NetworkSetupError as exc:
        print(f"sparsecomm.launch: {exc}; rerun with --bandwidth none to use plain loopback", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"sparsecomm.launch: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
