"""The emulated cluster network: one namespace per node, shaped veth links into a bridge.

:class:`EmulatedNetwork` builds it (``ip netns``, veth pairs, ``tc ... tbf`` on both ends of
each link, a ``hosts`` file per node) and tears it down; :func:`remove_stale_namespaces`
removes what launches killed outright left behind; :func:`measure_rate` times one TCP
connection between two nodes' namespaces. The errors a launch reports as one line live here
too (:class:`LaunchError`, :class:`NetworkSetupError`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

from .rank import _libc, _process_alive, in_namespace, node_interface, node_namespace

_SUBNET = "10.213.0"  # private addresses inside the launch's own namespaces only
_HOST_BYTE = 254  # last byte of the root namespace's address on the bridge (mpi backend)
# what this package names things: namespaces sc<launcher pid>r<rank> (one rank per node),
# sc<pid>n<node> (several) and sc<pid>br, the mpi host link sc<pid>h
_OWN_NAMESPACE = re.compile(r"sc(\d+)(?:[rn]\d+|br)")
_OWN_HOST_LINK = re.compile(r"sc(\d+)h")
_CLONE_NEWNET = 0x40000000
#: ``ip netns exec NAME`` bind-mounts the files of /etc/netns/NAME over those of /etc for the
#: command it runs: a node's ``hosts`` file there names the emulated addresses
_NETNS_ETC = "/etc/netns"


class LaunchError(RuntimeError):
    """The launch cannot start on this machine."""


class NetworkSetupError(LaunchError):
    """The emulated network cannot be built on this machine."""


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
    inside the namespace (over its loopback: see the package docstring). With
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
        return node_namespace(self.prefix, self.per_node, node)

    def interface(self, node: int) -> str:
        return node_interface(node)

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
        return in_namespace(self.namespace(self.node_of(rank)), cmd)


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
