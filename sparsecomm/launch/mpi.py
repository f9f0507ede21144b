"""The mpi backend: Open MPI's mpirun starts every rank, its tagged output becomes ``[rank N]`` lines.

:func:`find_mpirun` finds mpirun (Open MPI only); :func:`_mpirun_command` is the one mpirun
for all ranks, each rank started through :mod:`sparsecomm.launch.rank` (``--mpi-rank``), which
enters the rank's namespace and execs the command; :class:`_MPIOutput` turns mpirun's
``--tag-output`` stream into the launcher's lines and reads the failing rank from it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from . import rank as rank_step
from .network import EmulatedNetwork, LaunchError
from .rank import _MPI_RANK


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


def _mpirun_command(mpirun: str, cmd: list[str], nproc: int, per_node: int, network: EmulatedNetwork | None,
                    master: str, port: int) -> tuple[list[str], dict[str, str]]:
    """One mpirun for all ranks, each started through ``_mpi_rank`` (:mod:`.rank`, run by path)."""
    argv = [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--tag-output",
            "-np", str(nproc), "--mca", "btl", "self,tcp",
            "--mca", "btl_tcp_if_include", network.cidr if network else "lo",
            # -I: the wrapper needs only the standard library, not the package (which imports torch)
            sys.executable, "-I", os.path.abspath(rank_step.__file__), _MPI_RANK,
            str(per_node), network.prefix if network else "", master, str(port), "--", *cmd]
    env = dict(os.environ, SPARSECOMM_LAUNCHER_PID=str(os.getpid()))
    if network:  # ranks in their namespaces reach mpirun's PMIx server through the host link
        env.update(PMIX_MCA_ptl_tcp_remote_connections="1", PMIX_MCA_ptl_tcp_if_include=network.host_interface)
    return argv, env


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
