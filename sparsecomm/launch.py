"""Start P ranks on this machine, optionally over an emulated cluster network.

    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- python train.py --epochs 1
    python -m sparsecomm.launch --nproc 2 --bandwidth none -- python train.py
    python -m sparsecomm.launch --nproc 2 --bandwidth 1gbit --backend mpi -- python -m mpi4py prog.py

With ``--bandwidth RATE`` (e.g. ``1gbit``, ``100mbit``) every rank runs in its own network
namespace with one veth link into a bridge namespace (a switch), and both ends of each link
are shaped with ``tc ... tbf rate RATE`` -- a full-duplex switch port of that speed, which
reproduces the papers' 1 Gbit/s Ethernet clusters (``netem`` is not available here; ``tbf``
is). This needs root and iproute2. ``--bandwidth none`` runs the ranks on plain loopback.

Each rank gets the variables torchrun sets (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE) plus GLOO_SOCKET_IFNAME, so a script calling
``torch.distributed.init_process_group("gloo")`` works unchanged, and SPARSECOMM_BANDWIDTH
(the link rate, empty on loopback) so it can say what network it ran on. Output lines are prefixed
with the rank. When a rank fails, the others are stopped and the launch exits non-zero.
Every namespace the launch made is removed on exit, also on Ctrl-C or a crash of a rank.

``--backend gloo`` (the default) starts the P ranks itself. ``--backend mpi`` starts them with
one Open MPI ``mpirun`` (tested with 4.1), so mpi4py programs (``sparsecomm.comm.MPIComm``) run
too, and gloo programs still get the variables above. MPI's traffic (``--mca btl self,tcp``)
goes over the shaped links; mpirun's PMIx server is reached through one extra, unshaped veth
from the root namespace into the bridge, which only the mpi backend creates and which is
removed with the namespaces. Each rank starts through this module (``--mpi-rank``, internal),
which sets the rank's variables from ``OMPI_COMM_WORLD_*`` and execs the command inside the
rank's namespace. mpirun's tagged output is turned into the same ``[rank N]`` lines (its own
messages get ``[mpirun]``). mpirun stops the other ranks when one exits non-zero. Note that
an mpi4py program which exits non-zero after MPI was initialized first waits in
``MPI_Finalize`` for the other ranks; run it as ``python -m mpi4py prog.py`` so that an exit
or an uncaught exception aborts the whole job at once. With ``--bandwidth none`` mpirun runs
on loopback (TCP over ``lo``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

__all__ = ["EmulatedNetwork", "launch", "main", "parse_rate", "find_mpirun", "describe_link", "LaunchError",
           "NetworkSetupError"]

_SUBNET = "10.213.0"  # private addresses inside the launch's own namespaces only
_HOST_BYTE = 254  # last byte of the root namespace's address on the bridge (mpi backend)
_MPI_RANK = "--mpi-rank"  # internal: how mpirun starts each rank through this module (see _mpi_rank)


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


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetworkSetupError(f"{' '.join(cmd)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


@dataclass
class EmulatedNetwork:
    """P rank namespaces joined through a bridge namespace by shaped veth links.

    With ``host_link=True`` (the mpi backend) an unshaped veth also joins the root namespace
    to the bridge, at ``host_address``, in a /24 the root namespace does not use yet.
    """

    size: int
    rate: str
    prefix: str = field(default_factory=lambda: f"sc{os.getpid()}")
    host_link: bool = False
    subnet: str = _SUBNET
    created: list[str] = field(default_factory=list)
    host_made: bool = False

    @staticmethod
    def check_possible() -> None:
        missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
        if missing:
            raise NetworkSetupError(f"{' and '.join(missing)} not found (install iproute2)")
        if os.geteuid() != 0:
            raise NetworkSetupError("building network namespaces needs root")

    def namespace(self, rank: int) -> str:
        return f"{self.prefix}r{rank}"

    def interface(self, rank: int) -> str:
        return f"eth{rank}"

    def address(self, rank: int) -> str:
        return f"{self.subnet}.{rank + 1}"

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
        if self.size > 250:
            raise NetworkSetupError("at most 250 ranks fit the emulated subnet")
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
            for rank in range(self.size):
                ns, port, iface = self.namespace(rank), f"p{rank}", self.interface(rank)
                self._add_namespace(ns)
                _run(["ip", "-n", bridge_ns, "link", "add", port, "type", "veth", "peer", "name", iface, "netns", ns])
                _run(["ip", "-n", bridge_ns, "link", "set", port, "master", "br0"])
                _run(["ip", "-n", bridge_ns, "link", "set", port, "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{self.address(rank)}/24", "dev", iface])
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
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.created.clear()

    def wrap(self, rank: int, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(rank), *cmd]


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

    Programs started by this launcher have SPARSECOMM_BANDWIDTH (empty on loopback); under
    another launcher (torchrun, mpirun) the link is unknown and only the interface is named.
    """
    iface = os.environ.get("GLOO_SOCKET_IFNAME")
    rate = os.environ.get("SPARSECOMM_BANDWIDTH")
    if rate:
        return f"emulated cluster, {rate} links (interface {iface})", rate
    if rate is not None:
        return f"plain loopback (interface {iface or 'lo'})", ""
    return f"network interface {iface or 'chosen by the backend'}, link not emulated by sparsecomm.launch", ""


def _rank_env(rank: int, size: int, master: str, port: int | str, ifname: str,
              local_rank: int | str | None = None, local_size: int | str | None = None) -> dict[str, str]:
    """The variables every rank gets, from either backend (torchrun's, plus gloo's interface)."""
    return dict(MASTER_ADDR=master, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                LOCAL_RANK=str(rank if local_rank is None else local_rank),
                LOCAL_WORLD_SIZE=str(size if local_size is None else local_size),
                GLOO_SOCKET_IFNAME=ifname, PYTHONUNBUFFERED="1")


def _mpirun_command(mpirun: str, cmd: list[str], nproc: int, network: EmulatedNetwork | None,
                    master: str, port: int) -> tuple[list[str], dict[str, str]]:
    """One mpirun for all ranks, each started through ``_mpi_rank`` (this file, run by path)."""
    argv = [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--tag-output",
            "-np", str(nproc), "--mca", "btl", "self,tcp",
            "--mca", "btl_tcp_if_include", network.cidr if network else "lo",
            # -I: the wrapper needs only the standard library, not the package (which imports torch)
            sys.executable, "-I", os.path.abspath(__file__), _MPI_RANK,
            network.prefix if network else "", master, str(port), "--", *cmd]
    env = dict(os.environ)
    if network:  # ranks in their namespaces reach mpirun's PMIx server through the host link
        env.update(PMIX_MCA_ptl_tcp_remote_connections="1", PMIX_MCA_ptl_tcp_if_include=network.host_interface)
    return argv, env


def _mpi_rank(argv: list[str]) -> int:
    """Run by mpirun for each rank: set the rank's variables, enter its namespace, exec the command."""
    if len(argv) < 5 or argv[3] != "--":
        raise SystemExit(f"usage: {_MPI_RANK} PREFIX MASTER PORT -- CMD... (started by mpirun, see launch())")
    prefix, master, port, _, *cmd = argv
    rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    network = EmulatedNetwork(size, "", prefix=prefix) if prefix else None
    os.environ.update(_rank_env(rank, size, master, port, network.interface(rank) if network else "lo",
                                os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK"),
                                os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")))
    try:  # die with mpirun even if it is killed outright (survives the execs below)
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
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
           backend: str = "gloo") -> int:
    """Run ``cmd`` as ``nproc`` ranks; returns the exit code (first failing rank's, or 0).

    ``backend="gloo"`` starts one process per rank; ``"mpi"`` starts one mpirun for all.
    """
    if backend not in ("gloo", "mpi"):
        raise ValueError(f"backend must be 'gloo' or 'mpi', got {backend!r}")
    out = out or sys.stdout
    mpirun = find_mpirun() if backend == "mpi" else None
    network = EmulatedNetwork(nproc, rate, host_link=mpirun is not None) if rate else None
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
        master = network.address(0) if network else "127.0.0.1"
        link_env = {"SPARSECOMM_BANDWIDTH": rate or ""}  # lets a program report the link it ran on
        if mpirun:
            argv, env = _mpirun_command(mpirun, cmd, nproc, network, master, port)
            jobs = [(argv, {**env, **link_env}, _MPIOutput(out))]
        else:
            jobs = [(network.wrap(rank, cmd) if network else cmd,
                     dict(os.environ, **link_env, **_rank_env(rank, nproc, master, port,
                                                  network.interface(rank) if network else "lo")),
                     _RankLines(out, rank))
                    for rank in range(nproc)]
        for argv, env, sink in jobs:
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [_MPI_RANK]:
        return _mpi_rank(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m sparsecomm.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, required=True, help="number of ranks")
    parser.add_argument("--bandwidth", type=parse_rate, default="1gbit",
                        help="link rate per rank (tc syntax, e.g. 1gbit, 100mbit) or 'none' for loopback")
    parser.add_argument("--backend", choices=["gloo", "mpi"], default="gloo",
                        help="how the ranks start: gloo (one process each, torchrun-style variables) "
                             "or mpi (one Open MPI mpirun, the same variables too)")
    parser.add_argument("--port", type=int, default=29500, help="MASTER_PORT")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- followed by the command each rank runs")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("give the command to run after --")
    if args.nproc < 1:
        parser.error("--nproc must be >= 1")
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
        return launch(cmd, args.nproc, args.bandwidth, args.port, backend=args.backend)
    except NetworkSetupError as exc:
        print(f"sparsecomm.launch: {exc}; rerun with --bandwidth none to use plain loopback", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"sparsecomm.launch: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
