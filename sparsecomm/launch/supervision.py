"""Running the ranks: :func:`launch` starts them, prefixes their output, stops them all at the first failure.

Every process it starts gets SIGKILL from the kernel when the launcher dies, even by SIGKILL
(:func:`_die_with_parent`); the network it built is removed on every way out but that one
(the next launch removes it then: :func:`~sparsecomm.launch.network.remove_stale_namespaces`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from .link import _report_link
from .mpi import _MPIOutput, _mpirun_command, find_mpirun
from .network import EmulatedNetwork
from .rank import _PR_SET_PDEATHSIG, _launcher_python, _libc, _rank_env


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


class _RankLines:
    """Prefix each line of one rank's output (the gloo backend: one pipe per rank)."""

    def __init__(self, out, rank: int):
        self.out, self.rank = out, rank

    def feed(self, text: str) -> None:
        self.out.write(f"[rank {self.rank}] {text}")
        self.out.flush()

    def close(self) -> None:
        pass


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
    cmd, note = _launcher_python(cmd)
    if note:
        out.write(note + "\n")
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
