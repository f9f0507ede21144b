"""What a rank is given, from either backend, and ``--mpi-rank``, the step mpirun runs for each.

A rank gets torchrun's variables (:func:`_rank_env`), the network namespace and interface of
its node (:func:`node_namespace`, :func:`node_interface`) and the death signal that ends it
with its parent (:data:`_PR_SET_PDEATHSIG`). With ``--backend mpi``, mpirun starts every rank
as ``python -I <this file> --mpi-rank PER_NODE PREFIX MASTER PORT -- CMD...``
(:func:`_mpi_rank`): the rank sets its variables from ``OMPI_COMM_WORLD_RANK``/``_SIZE`` and
execs the command inside its node's namespace. That step runs this file by path, isolated,
before the rank's own program: so this module imports the standard library only, never the
package (whose ``__init__`` imports torch), and the launcher's other modules import the
names they share with it from here.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys

#: internal: how mpirun starts each rank through this file (see :func:`_mpi_rank`)
_MPI_RANK = "--mpi-rank"
_PR_SET_PDEATHSIG = 1


def _libc():
    import ctypes  # only where needed: the --mpi-rank step runs with -I and the standard library

    return ctypes.CDLL(None, use_errno=True)


def _process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, killed and not yet reaped by its parent, is not running)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        return True  # exists but unreadable: count it as running, never remove a live launch's network


def node_namespace(prefix: str, per_node: int, node: int) -> str:
    """The network namespace of ``node``: ``<prefix>r<node>`` with one rank per node, else
    ``<prefix>n<node>``."""
    return f"{prefix}{'r' if per_node == 1 else 'n'}{node}"


def node_interface(node: int) -> str:
    """The name of ``node``'s link inside its namespace."""
    return f"eth{node}"


def in_namespace(namespace: str, cmd: list[str]) -> list[str]:
    """``cmd`` run inside network namespace ``namespace``."""
    return ["ip", "netns", "exec", namespace, *cmd]


def _launcher_python(cmd: list[str], path: str | None = None) -> tuple[list[str], str | None]:
    """``cmd`` with a bare ``python`` or ``python3`` as its first word replaced by the interpreter
    running the launcher, when PATH (``path``, default this process's) would find another one
    or none; and a line saying so. Else ``cmd`` unchanged and None.

    torchrun runs a script with its own interpreter too; without this, ``.venv/bin/python -m
    sparsecomm.launch -- python train.py`` in a shell whose venv is not activated would run
    every rank on the system's Python, which has no torch. A path (``/usr/bin/python3``), or a
    PATH whose ``python`` is in the launcher's own folder, is run as given."""
    if not cmd or cmd[0] not in ("python", "python3") or not sys.executable:
        return cmd, None
    found = shutil.which(cmd[0], path=path)
    if found and os.path.dirname(os.path.abspath(found)) == os.path.dirname(os.path.abspath(sys.executable)):
        return cmd, None
    note = (f"sparsecomm.launch: the ranks run {cmd[0]} as {sys.executable}, the launcher's "
            f"({found or 'none'} on PATH; give a path to run another)")
    return [sys.executable, *cmd[1:]], note


def _rank_env(rank: int, size: int, per_node: int, master: str, port: int | str, ifname: str) -> dict[str, str]:
    """The variables every rank gets, from either backend: torchrun's on ``size // per_node``
    nodes of ``per_node`` ranks, plus gloo's interface."""
    node, nodes = rank // per_node, size // per_node
    return dict(MASTER_ADDR=master, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                LOCAL_RANK=str(rank % per_node), LOCAL_WORLD_SIZE=str(per_node),
                GROUP_RANK=str(node), GROUP_WORLD_SIZE=str(nodes), NODE_RANK=str(node),
                ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(size),
                SPARSECOMM_NPROC_PER_NODE=str(per_node), GLOO_SOCKET_IFNAME=ifname, PYTHONUNBUFFERED="1")


def _mpi_rank(argv: list[str]) -> int:
    """Run by mpirun for each rank: set the rank's variables, enter its namespace, exec the command."""
    if len(argv) < 6 or argv[4] != "--":
        raise SystemExit(f"usage: {_MPI_RANK} PER_NODE PREFIX MASTER PORT -- CMD... (started by mpirun, see launch())")
    per_node, prefix, master, port, _, *cmd = argv
    rank, size = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])
    per_node = int(per_node)
    node = rank // per_node
    os.environ.update(_rank_env(rank, size, per_node, master, port, node_interface(node) if prefix else "lo"))
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
    argv = in_namespace(node_namespace(prefix, per_node, node), cmd) if prefix else cmd
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"sparsecomm.launch: rank {rank} cannot run {argv[0]}: {exc}", file=sys.stderr, flush=True)
        return 127


if __name__ == "__main__":  # mpirun's command line for each rank (see mpi._mpirun_command)
    if sys.argv[1:2] != [_MPI_RANK]:
        raise SystemExit(f"usage: {_MPI_RANK} PER_NODE PREFIX MASTER PORT -- CMD... (started by mpirun, see launch())")
    sys.exit(_mpi_rank(sys.argv[2:]))
