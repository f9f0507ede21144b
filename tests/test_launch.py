"""The launcher: ranks over an emulated 1 Gbit/s network, failure propagation, cleanup.

Both backends run the same table of cases: ``gloo`` (the launcher starts each rank) and
``mpi`` (one Open MPI ``mpirun`` starts them; mpi4py programs and gloo programs both run).
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from sparsecomm.launch import _MPIOutput, main, parse_rate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAN_SHAPE = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
needs_shaping = pytest.mark.skipif(not CAN_SHAPE, reason="emulating links needs root and iproute2 (ip, tc)")
MPIRUN = shutil.which("mpirun")
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None
needs_mpi = pytest.mark.skipif(
    MPIRUN is None or not HAVE_MPI4PY,
    reason="--backend mpi needs Open MPI's mpirun on PATH and mpi4py "
           f"[mpirun: {MPIRUN or 'missing'}, mpi4py: {'ok' if HAVE_MPI4PY else 'missing'}]")

RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    mode = sys.argv[1]
    if mode == "fail" and os.environ["RANK"] == "1":
        print("rank 1 fails on purpose", flush=True)
        sys.exit(3)
    if mode == "fail":
        time.sleep(120)  # must be stopped by the launcher, not waited for
    dist.init_process_group("gloo")
    payload = torch.zeros(12_500_000, dtype=torch.uint8)  # 100 Mbit
    dist.barrier()
    start = time.perf_counter()
    if dist.get_rank() == 0:
        dist.send(payload, 1)
    elif dist.get_rank() == 1:
        dist.recv(payload, 0)
    dist.barrier()
    seconds = time.perf_counter() - start
    print(f"ifname={os.environ['GLOO_SOCKET_IFNAME']} world={dist.get_world_size()} "
          f"link={os.environ['SPARSECOMM_BANDWIDTH']} gbit_s={0.1 / seconds:.3f}")
    dist.destroy_process_group()
""")

# Run as ``python -m mpi4py``: then an exit after MPI_Init aborts the job instead of waiting
# in MPI_Finalize for the other ranks.
MPI_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == (str(rank), str(size)), "torchrun variables"
    mode = sys.argv[1]
    if mode == "fail" and rank == 1:
        print("rank 1 fails on purpose", flush=True)
        sys.exit(3)
    if mode == "fail":
        time.sleep(120)  # must be stopped by mpirun, not waited for
    payload = np.zeros(12_500_000, dtype=np.uint8)  # 100 Mbit, ping-ponged twice
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(2):
        if rank == 0:
            comm.Send(payload, 1)
            comm.Recv(payload, 1)
        elif rank == 1:
            comm.Recv(payload, 0)
            comm.Send(payload, 0)
    comm.Barrier()
    seconds = time.perf_counter() - start
    print(f"ifname={os.environ['GLOO_SOCKET_IFNAME']} world={size} "
          f"link={os.environ['SPARSECOMM_BANDWIDTH']} gbit_s={0.4 / seconds:.3f}")
""")

PROGRAMS = {"gloo": (RANK_SCRIPT, []), "mpi4py": (MPI_SCRIPT, ["-m", "mpi4py"])}


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line.strip()}


def _netns_files() -> set[str]:
    """Folders of /etc/netns (what ``ip netns exec`` mounts over /etc in a namespace)."""
    return {f"/etc/netns/{name}" for name in (os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else ())}


def _leftovers(launcher_pid: int) -> list[str]:
    """Namespaces, root-namespace links and /etc/netns folders still named after that launch
    (prefix sc<pid>)."""
    own = re.compile(rf"(/etc/netns/)?sc{launcher_pid}(r\d+|n\d+|br|h)")
    return sorted(name for name in _namespaces() | _links() | _netns_files() if own.fullmatch(name))


def _launch(tmp_path, bandwidth: str, mode: str, nproc: int = 2, timeout: float = 120,
            backend: str = "gloo", program: str = "gloo", shape: tuple[str, ...] = ()):
    """Run the launcher on a test program; returns (CompletedProcess, seconds, launcher pid).

    ``shape`` replaces ``--nproc nproc`` (e.g. ``("--nnodes", "2", "--nproc-per-node", "2")``).
    """
    source, runner = PROGRAMS[program]
    script = tmp_path / "rank.py"
    script.write_text(source)
    cmd = [sys.executable, "-m", "sparsecomm.launch", *(shape or ("--nproc", str(nproc))), "--bandwidth", bandwidth,
           "--backend", backend, "--", sys.executable, *runner, str(script), mode]
    start = time.monotonic()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) as popen:
        try:
            stdout, stderr = popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            popen.terminate()  # the launcher cleans up on SIGTERM
            stdout, stderr = popen.communicate()
            raise AssertionError(f"launch did not finish in {timeout} s:\n{stdout}\n{stderr}") from None
    proc = subprocess.CompletedProcess(cmd, popen.returncode, stdout, stderr)
    return proc, time.monotonic() - start, popen.pid


shaped_mpi = [needs_shaping, needs_mpi]

# backend, program, bandwidth, GLOO_SOCKET_IFNAME of rank 0 and 1, Gbit/s range of the slowest rank
RUNS = [
    pytest.param("gloo", "gloo", "1gbit", ("eth0", "eth1"), (0.5, 1.1), marks=needs_shaping, id="gloo-shaped"),
    pytest.param("gloo", "gloo", "none", ("lo", "lo"), (0, float("inf")), id="gloo-loopback"),
    pytest.param("mpi", "mpi4py", "1gbit", ("eth0", "eth1"), (0.5, 1.1), marks=shaped_mpi, id="mpi-mpi4py-shaped"),
    pytest.param("mpi", "gloo", "1gbit", ("eth0", "eth1"), (0.5, 1.1), marks=shaped_mpi, id="mpi-gloo-shaped"),
    pytest.param("mpi", "mpi4py", "none", ("lo", "lo"), (0, float("inf")), marks=needs_mpi, id="mpi-mpi4py-loopback"),
]


@pytest.mark.parametrize("backend,program,bandwidth,ifnames,rates", RUNS)
def test_ranks_run_at_the_given_rate_and_clean_up(tmp_path, backend, program, bandwidth, ifnames, rates):
    proc, _, pid = _launch(tmp_path, bandwidth, "ok", backend=backend, program=program)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if "gbit_s=" in line)
    assert [line.split("]")[0] for line in lines] == ["[rank 0", "[rank 1"], proc.stdout
    for line, ifname in zip(lines, ifnames):
        assert f"ifname={ifname} world=2 link={'' if bandwidth == 'none' else bandwidth} " in line
    rate = min(float(line.rsplit("gbit_s=", 1)[1]) for line in lines)
    assert rates[0] < rate < rates[1], f"expected {rates} Gbit/s over {bandwidth}, measured {rate}"
    # c10d's store names every peer it accepts; inside a namespace without names for its
    # addresses each rank warned (the ranks' stderr is in the launcher's stdout)
    assert "cannot be retrieved" not in proc.stdout + proc.stderr, proc.stdout
    if CAN_SHAPE:
        assert _leftovers(pid) == []


TWO_BY_TWO = ("--nnodes", "2", "--nproc-per-node", "2")

# backend, program, what the launcher says about the failure, cluster shape (default: --nproc 2)
FAILURES = [
    pytest.param("gloo", "gloo", "rank 1 exited with 3", (), marks=needs_shaping, id="gloo"),
    pytest.param("mpi", "gloo", "rank 1 exited with 3", (), marks=shaped_mpi, id="mpi-plain-exit"),
    # MPI_Abort from mpi4py; mpirun's report naming the rank does not always come through
    pytest.param("mpi", "mpi4py", r"(rank 1|mpirun) exited with 3", (), marks=shaped_mpi, id="mpi-mpi4py-abort"),
    # rank 1 shares node 0's namespace with rank 0
    pytest.param("gloo", "gloo", "rank 1 exited with 3", TWO_BY_TWO, marks=needs_shaping, id="gloo-2x2"),
]


@pytest.mark.parametrize("backend,program,message,shape", FAILURES)
def test_failing_rank_fails_the_launch_and_leaves_no_namespace(tmp_path, backend, program, message, shape):
    proc, seconds, pid = _launch(tmp_path, "1gbit", "fail", backend=backend, program=program, shape=shape)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "[rank 1] rank 1 fails on purpose" in proc.stdout
    assert re.search(message, proc.stdout), proc.stdout
    assert seconds < 60, "the sleeping rank was waited for instead of stopped"
    assert _leftovers(pid) == []


def test_missing_mpirun_is_one_clear_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no mpirun
    assert main(["--nproc", "2", "--bandwidth", "none", "--backend", "mpi", "--", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs Open MPI's mpirun on PATH" in err


# chunks as mpirun --tag-output writes them -> lines the launcher prints, failing rank it reads
TAGGED = [
    pytest.param(["[1,0]<stdout>:hello\n", "[1,1]<stderr>:oops\n"], ["[rank 0] hello", "[rank 1] oops"], None,
                 id="whole-lines"),
    pytest.param(["[1,0]<stdout>:line 0[1,1]<stdout>:line 1[1,0]<stdout>:\n", "[1,1]<stdout>:\n"],
                 ["[rank 0] line 0", "[rank 1] line 1"], None, id="interleaved-chunks"),
    pytest.param(["[1,0]<stdout>:out [1,0]<stderr>:err\n", "[1,0]<stdout>:more\n"],
                 ["[rank 0] err", "[rank 0] out more"], None, id="stdout-and-stderr-apart"),
    pytest.param(["----\n", "  Process name: [[57613,1],1]\n", "  Exit code:    3\n", "[1,0]<stdout>:last"],
                 ["[mpirun] ----", "[mpirun]   Process name: [[57613,1],1]", "[mpirun]   Exit code:    3",
                  "[rank 0] last"], 1, id="mpirun-report-and-unfinished-line"),
    pytest.param(["MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD\n"],
                 ["[mpirun] MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD"], 2, id="abort"),
]


@pytest.mark.parametrize("chunks,lines,failed_rank", TAGGED)
def test_mpirun_output_is_prefixed_by_rank(chunks, lines, failed_rank):
    out = io.StringIO()
    sink = _MPIOutput(out)
    for chunk in chunks:
        sink.feed(chunk)
    sink.close()
    assert out.getvalue().splitlines() == lines
    assert sink.failed_rank == failed_rank


@pytest.mark.parametrize("text,expected", [("1gbit", "1gbit"), ("100MBIT", "100mbit"), ("none", None)])
def test_rate_parsing(text, expected):
    assert parse_rate(text) == expected


@pytest.mark.parametrize("text", ["1gb", "fast", "", "-1gbit"])
def test_bad_rate_is_rejected(text):
    with pytest.raises(Exception, match="bandwidth must look like"):
        parse_rate(text)


@pytest.mark.parametrize("env, expected", [
    ({"SPARSECOMM_BANDWIDTH": "1gbit", "GLOO_SOCKET_IFNAME": "eth0"},
     ("emulated cluster, 1gbit links (interface eth0)", "1gbit")),
    ({"SPARSECOMM_BANDWIDTH": "", "GLOO_SOCKET_IFNAME": "lo"}, ("plain loopback (interface lo)", "")),
    ({"GLOO_SOCKET_IFNAME": "ib0"}, ("network interface ib0, link not emulated by sparsecomm.launch", "")),
    ({"SPARSECOMM_BANDWIDTH": "1gbit", "SPARSECOMM_MEASURED_BANDWIDTH": "957000000", "GLOO_SOCKET_IFNAME": "eth0"},
     ("emulated cluster, 1gbit links (0.957 Gbit/s measured rank 0 -> rank 1, interface eth0)", "1gbit")),
    ({"SPARSECOMM_BANDWIDTH": "100mbit", "SPARSECOMM_MEASURED_BANDWIDTH": "", "GLOO_SOCKET_IFNAME": "eth1"},
     ("emulated cluster, 100mbit links (interface eth1)", "100mbit")),
    ({"SPARSECOMM_BANDWIDTH": "1gbit", "SPARSECOMM_MEASURED_BANDWIDTH": "957000000", "GLOO_SOCKET_IFNAME": "eth0",
      "SPARSECOMM_NPROC_PER_NODE": "1", "WORLD_SIZE": "4"},
     ("emulated cluster, 1gbit links (0.957 Gbit/s measured rank 0 -> rank 1, interface eth0)", "1gbit")),
    ({"SPARSECOMM_BANDWIDTH": "1gbit", "SPARSECOMM_MEASURED_BANDWIDTH": "957000000", "GLOO_SOCKET_IFNAME": "eth1",
      "SPARSECOMM_MEASURED_INTRA_BANDWIDTH": "25300000000", "SPARSECOMM_NPROC_PER_NODE": "2", "WORLD_SIZE": "4"},
     ("emulated cluster, 2 nodes x 2 ranks, 1gbit links between nodes (0.957 Gbit/s measured node 0 -> node 1, "
      "interface eth1), loopback inside a node (25.3 Gbit/s measured)", "1gbit")),
    ({"SPARSECOMM_BANDWIDTH": "", "GLOO_SOCKET_IFNAME": "lo", "SPARSECOMM_NPROC_PER_NODE": "3", "WORLD_SIZE": "6"},
     ("plain loopback, 2 nodes x 3 ranks (interface lo)", "")),
])
def test_describe_link_says_only_what_the_launcher_set(monkeypatch, env, expected):
    from sparsecomm.launch import describe_link

    for name in ("SPARSECOMM_BANDWIDTH", "SPARSECOMM_MEASURED_BANDWIDTH", "GLOO_SOCKET_IFNAME", "WORLD_SIZE",
                 "SPARSECOMM_MEASURED_INTRA_BANDWIDTH", "SPARSECOMM_NPROC_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert describe_link() == expected


# -- a SIGKILLed launcher, stale namespaces, the measured rate -------------------------------------

SLEEPER = textwrap.dedent("""
    import os, sys, time
    path = os.path.join(sys.argv[1], f"pid.{os.environ['RANK']}")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)
    time.sleep(300)
""")

needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="--backend mpi needs Open MPI's mpirun on PATH")


def _running(pid: int) -> bool:
    """True while pid runs (a zombie left for pid 1 to reap does not run)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _start_sleepers(tmp_path, bandwidth: str, backend: str = "gloo", nproc: int = 2, shape: tuple[str, ...] = ()):
    """Start a launch whose ranks write their pid and sleep; returns (Popen, rank pids).

    ``shape`` replaces ``--nproc nproc``; ``nproc`` is then its number of ranks.
    """
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    piddir = tmp_path / "pids"
    piddir.mkdir()
    cmd = [sys.executable, "-m", "sparsecomm.launch", *(shape or ("--nproc", str(nproc))), "--bandwidth", bandwidth,
           "--backend", backend, "--", sys.executable, str(script), str(piddir)]
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    deadline = time.monotonic() + 60
    files = [piddir / f"pid.{rank}" for rank in range(nproc)]
    while not all(f.exists() for f in files):
        if popen.poll() is not None or time.monotonic() > deadline:
            popen.kill()
            raise AssertionError(f"the ranks did not start:\n{popen.communicate()[0]}")
        time.sleep(0.05)
    return popen, [int(f.read_text()) for f in files]


KILLED = [
    pytest.param("gloo", "1gbit", (), marks=needs_shaping, id="gloo-shaped"),
    pytest.param("gloo", "none", (), id="gloo-loopback"),
    pytest.param("mpi", "1gbit", (), marks=[needs_shaping, needs_mpirun], id="mpi-shaped"),
    pytest.param("mpi", "none", (), marks=needs_mpirun, id="mpi-loopback"),
    pytest.param("gloo", "1gbit", TWO_BY_TWO, marks=needs_shaping, id="gloo-shaped-2x2"),
]


@pytest.mark.parametrize("backend,bandwidth,shape", KILLED)
def test_sigkilled_launcher_leaves_no_rank_running(tmp_path, backend, bandwidth, shape):
    popen, pids = _start_sleepers(tmp_path, bandwidth, backend, nproc=4 if shape else 2, shape=shape)
    assert all(_running(pid) for pid in pids)
    popen.kill()  # SIGKILL: no handler, no cleanup in the launcher
    popen.communicate()
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if _running(pid)] == [], "ranks outlived their SIGKILLed launcher"
    if CAN_SHAPE:  # whatever it left is removed by the next launch (tested below); do it now
        from sparsecomm.launch import remove_stale_namespaces

        if bandwidth != "none":
            assert _leftovers(popen.pid), "a SIGKILLed launcher cannot remove its namespaces itself"
        remove_stale_namespaces()
        assert _leftovers(popen.pid) == []


@needs_shaping
def test_next_launch_removes_stale_namespaces_but_not_a_live_launch(tmp_path):
    (tmp_path / "live").mkdir()
    (tmp_path / "dead").mkdir()
    live, _ = _start_sleepers(tmp_path / "live", "1gbit")
    try:
        dead, _ = _start_sleepers(tmp_path / "dead", "1gbit", nproc=3)
        dead.kill()
        dead.communicate()
        stale = _leftovers(dead.pid)
        namespaces = sorted(f"sc{dead.pid}{suffix}" for suffix in ("br", "r0", "r1", "r2"))
        assert stale == sorted(namespaces + [f"/etc/netns/sc{dead.pid}r{node}" for node in range(3)]), \
            "a SIGKILLed launcher cannot remove its namespaces itself"
        live_names = _leftovers(live.pid)
        assert len(live_names) == 3 + 2   # two nodes' namespaces and /etc/netns folders, the bridge
        proc, _, pid = _launch(tmp_path, "1gbit", "ok")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        removed = re.search(r"removed the network of launches no longer running: (.*)", proc.stdout)
        assert removed and sorted(removed.group(1).split(", ")) == namespaces, proc.stdout
        assert _leftovers(dead.pid) == []
        assert _leftovers(pid) == []
        assert _leftovers(live.pid) == live_names, "a live launch's namespaces were touched"
        assert live.poll() is None
    finally:
        live.terminate()  # SIGTERM: the launcher's clean path
        live.communicate(timeout=30)
    assert _leftovers(live.pid) == []


MEASURED = re.compile(r"sparsecomm\.launch: link: (\S+) (\S+) configured, (\S+) (\S+) measured rank 0 -> rank 1")


@needs_shaping
@pytest.mark.parametrize("rate,bits", [("10mbit", 1e7), ("100mbit", 1e8), ("1gbit", 1e9)])
def test_measured_rate_is_near_the_configured_one_and_quick(rate, bits):
    from sparsecomm.launch import EmulatedNetwork, measure_rate

    network = EmulatedNetwork(2, rate, prefix=f"sc{os.getpid()}")
    try:
        network.up()
        start = time.perf_counter()
        measured = measure_rate(network)
        seconds = time.perf_counter() - start
    finally:
        network.down()
    assert 0.8 * bits < measured < 1.05 * bits, f"{measured / 1e6:.1f} Mbit/s measured over {rate}"
    assert seconds < 1.0


@needs_shaping
def test_launch_prints_and_exports_the_measured_rate(tmp_path):
    cmd = [sys.executable, "-m", "sparsecomm.launch", "--nproc", "2", "--bandwidth", "100mbit", "--",
           sys.executable, "-c", "import os; print('measured=' + os.environ['SPARSECOMM_MEASURED_BANDWIDTH'])"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = MEASURED.search(proc.stdout)
    assert found, proc.stdout
    assert found.group(1, 2, 4) == ("100", "Mbit/s", "Mbit/s")
    printed = float(found.group(3))
    assert 80 < printed < 105, proc.stdout
    exported = {int(line.rsplit("=", 1)[1]) for line in proc.stdout.splitlines() if "measured=" in line}
    assert len(exported) == 1 and abs(exported.pop() / 1e6 - printed) < 0.1, proc.stdout
    assert proc.stdout.index("measured rank 0 -> rank 1") < proc.stdout.index("[rank 0]"), \
        "the rate is measured before the ranks start"


@pytest.mark.parametrize("nproc,bandwidth,message", [
    pytest.param(1, "1gbit", "link: 1 Gbit/s configured, not measured (one rank)", marks=needs_shaping, id="one-rank"),
    pytest.param(2, "none", "link: plain loopback, not shaped (--bandwidth none), not measured", id="loopback"),
])
def test_rate_is_not_measured_without_two_shaped_ranks(nproc, bandwidth, message):
    cmd = [sys.executable, "-m", "sparsecomm.launch", "--nproc", str(nproc), "--bandwidth", bandwidth, "--",
           sys.executable, "-c", "import os; print('measured=' + os.environ['SPARSECOMM_MEASURED_BANDWIDTH'])"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"sparsecomm.launch: {message}\n" in proc.stdout
    assert proc.stdout.count("] measured=\n") == nproc


@pytest.mark.parametrize("bits,unit_of,text", [
    (1e9, None, "1 Gbit/s"), (9.57e8, 1e9, "0.957 Gbit/s"), (9.57e8, None, "957 Mbit/s"),
    (1e8, None, "100 Mbit/s"), (9.5e6, 1e7, "9.5 Mbit/s"), (5e5, None, "500 kbit/s"), (12, None, "0.012 kbit/s"),
])
def test_rates_are_printed_in_the_configured_unit(bits, unit_of, text):
    from sparsecomm.launch import _format_bits

    assert _format_bits(bits, unit_of) == text


@pytest.mark.parametrize("text,bits", [("1gbit", 1e9), ("100mbit", 1e8), ("2.5mbit", 2.5e6), ("64kbit", 64e3)])
def test_tc_rates_are_decimal_bits(text, bits):
    from sparsecomm.launch import _rate_bits

    assert _rate_bits(text) == bits


# -- nodes of several ranks: --nnodes N --nproc-per-node L ---------------------------------------

ENV_SCRIPT = textwrap.dedent("""
    import os
    names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
             "NODE_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "GLOO_SOCKET_IFNAME", "MASTER_ADDR"]
    print("env " + " ".join(f"{name}={os.environ[name]}" for name in names), flush=True)
""")

# shape flags, bandwidth, backend, (nodes, ranks per node), GLOO_SOCKET_IFNAME of each node
SHAPES = [
    pytest.param(TWO_BY_TWO, "1gbit", "gloo", (2, 2), ["eth0", "eth1"], marks=needs_shaping, id="2x2-shaped"),
    pytest.param(TWO_BY_TWO, "1gbit", "mpi", (2, 2), ["eth0", "eth1"], marks=shaped_mpi, id="2x2-shaped-mpi"),
    pytest.param(("--nnodes", "2", "--nproc-per-node", "2"), "none", "gloo", (2, 2), ["lo", "lo"], id="2x2-loopback"),
    pytest.param(("--nproc", "3"), "none", "gloo", (3, 1), ["lo"] * 3, id="nproc-is-one-rank-per-node"),
]


@pytest.mark.parametrize("shape,bandwidth,backend,nodes_ranks,ifnames", SHAPES)
def test_every_rank_gets_torchruns_variables_of_its_node(tmp_path, shape, bandwidth, backend, nodes_ranks, ifnames):
    script = tmp_path / "env.py"
    script.write_text(ENV_SCRIPT)
    cmd = [sys.executable, "-m", "sparsecomm.launch", *shape, "--bandwidth", bandwidth, "--backend", backend,
           "--", sys.executable, str(script)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) as popen:
        stdout, stderr = popen.communicate(timeout=120)
    assert popen.returncode == 0, stdout + stderr
    if CAN_SHAPE:
        assert _leftovers(popen.pid) == []
    proc = subprocess.CompletedProcess(cmd, popen.returncode, stdout, stderr)
    nodes, per_node = nodes_ranks
    seen = {}
    for line in proc.stdout.splitlines():
        found = re.fullmatch(r"\[rank (\d+)\] env (.*)", line)
        if found:
            seen[int(found.group(1))] = dict(item.split("=", 1) for item in found.group(2).split())
    world = nodes * per_node
    assert sorted(seen) == list(range(world)), proc.stdout
    masters = {env.pop("MASTER_ADDR") for env in seen.values()}
    assert len(masters) == 1, "every rank must meet at the same master"
    for rank, env in seen.items():
        node = rank // per_node
        assert env == {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % per_node),
                       "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(nodes),
                       "NODE_RANK": str(node), "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
                       "GLOO_SOCKET_IFNAME": ifnames[node]}, f"rank {rank}"


# Over 100mbit: rank 0 -> 1 stays inside node 0; rank 0 -> 2 crosses the link; then ranks 0 and 1
# both send to node 1 at once through node 0's one link. Each receiver prints Mbit/s.
RATES_SCRIPT = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0:
        print("exported " + os.environ["SPARSECOMM_MEASURED_BANDWIDTH"] + " "
              + os.environ["SPARSECOMM_MEASURED_INTRA_BANDWIDTH"], flush=True)
    payload = torch.zeros(5_000_000, dtype=torch.uint8)  # 40 Mbit
    for label, pairs in (("intra", [(0, 1)]), ("inter", [(0, 2)]), ("shared", [(0, 2), (1, 3)])):
        dist.barrier()
        start = time.perf_counter()
        for src, dst in pairs:
            if rank == src:
                dist.send(payload, dst)
            elif rank == dst:
                dist.recv(payload, src)
                print(f"{label} {src}->{dst} mbit_s={40 / (time.perf_counter() - start):.1f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
""")

TWO_LEVEL_LINK = re.compile(r"sparsecomm\.launch: link: 2 nodes x 2 ranks; between nodes 100 Mbit/s configured, "
                            r"(\S+) Mbit/s measured node 0 -> node 1; inside a node loopback, (\S+) ([GM])bit/s "
                            r"measured rank 0 -> rank 1")


@needs_shaping
def test_ranks_of_a_node_talk_over_loopback_and_share_its_link(tmp_path):
    script = tmp_path / "rates.py"
    script.write_text(RATES_SCRIPT)
    cmd = [sys.executable, "-m", "sparsecomm.launch", *TWO_BY_TWO, "--bandwidth", "100mbit", "--",
           sys.executable, str(script)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) as popen:
        stdout, stderr = popen.communicate(timeout=120)
    assert popen.returncode == 0, stdout + stderr
    rates = {found.group(1): float(found.group(2))
             for found in re.finditer(r"\] (\w+ \d->\d) mbit_s=(\S+)", stdout)}
    # bounds leave room for a loaded machine: through the link, intra would be at most ~105
    assert rates["intra 0->1"] > 300, f"ranks of one node must not go through the 100 Mbit/s link: {rates}"
    assert 70 < rates["inter 0->2"] < 115, rates
    shared = [rates["shared 0->2"], rates["shared 1->3"]]
    assert max(shared) < 80, f"two ranks sending through their node's link at once must share it: {rates}"
    assert 70 < 2 * min(shared) < 115, rates  # together about the link's rate (the slower flow ends last)
    found = TWO_LEVEL_LINK.search(stdout)
    assert found, stdout
    inter, intra = float(found.group(1)), float(found.group(2)) * {"G": 1e3, "M": 1}[found.group(3)]
    assert 70 < inter < 115 and intra > 300, stdout
    exported = re.search(r"\[rank 0\] exported (\d+) (\d+)", stdout)
    assert exported, stdout
    exported_inter, exported_intra = int(exported.group(1)) / 1e6, int(exported.group(2)) / 1e6
    assert abs(exported_inter - inter) < 0.1 and abs(exported_intra - intra) < 0.01 * intra, \
        "the ranks get the rates the launcher printed"
    assert _leftovers(popen.pid) == []


@pytest.mark.parametrize("flags,message", [
    (["--nproc", "0"], "--nproc must be >= 1, got 0"),
    (["--nnodes", "0"], "--nnodes must be >= 1, got 0"),
    (["--nnodes", "2", "--nproc-per-node", "0"], "--nproc-per-node must be >= 1, got 0"),
    (["--nproc-per-node", "2"], "give --nproc P (P nodes of one rank) or --nnodes N"),
    (["--nproc", "4", "--nnodes", "3"], "--nproc 4 is not --nnodes x --nproc-per-node (3 x 1)"),
    (["--nproc", "5", "--nproc-per-node", "2"], "--nproc 5 is not --nnodes x --nproc-per-node (2 x 2)"),
    (["--nproc", "4", "--nnodes", "2", "--nproc-per-node", "3"],
     "--nproc 4 is not --nnodes x --nproc-per-node (2 x 3)"),
])
def test_inconsistent_cluster_shapes_are_rejected(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        main([*flags, "--bandwidth", "none", "--", "true"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flags,nproc,per_node", [
    (["--nproc", "4", "--nnodes", "2"], 4, 2), (["--nproc", "6", "--nproc-per-node", "3"], 6, 3),
    (["--nproc", "4", "--nnodes", "2", "--nproc-per-node", "2"], 4, 2), (["--nnodes", "3"], 3, 1),
])
def test_consistent_cluster_shapes_are_launched(monkeypatch, flags, nproc, per_node):
    import sparsecomm.launch.cli as launcher  # where main() calls launch

    called = {}
    monkeypatch.setattr(launcher, "launch", lambda cmd, n, rate, port, backend, nproc_per_node:
                        called.update(nproc=n, per_node=nproc_per_node) or 0)
    assert main([*flags, "--bandwidth", "none", "--", "true"]) == 0
    assert called == {"nproc": nproc, "per_node": per_node}


def _fake_pythons(folder) -> None:
    """A ``python`` and a ``python3`` in ``folder`` that are not the launcher's (no torch there)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3"):
        (folder / name).write_text('#!/bin/sh\necho "ModuleNotFoundError: No module named torch ($0)"\nexit 1\n')
        (folder / name).chmod(0o755)


def test_which_python_a_rank_runs(tmp_path, monkeypatch):
    from sparsecomm.launch.rank import _launcher_python

    venv, system, empty = tmp_path / "venv" / "bin", tmp_path / "usr" / "bin", tmp_path / "empty"
    _fake_pythons(venv)
    _fake_pythons(system)
    empty.mkdir()
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    cmd = ["python", "train.py"]
    # the venv activated: PATH's python is the launcher's, run as given
    assert _launcher_python(cmd, path=f"{venv}{os.pathsep}{system}") == (cmd, None)
    assert _launcher_python(["python3", "x.py"], path=str(venv)) == (["python3", "x.py"], None)
    # not activated: PATH finds another python, or none (Debian has python3 only)
    for word, path, on_path in [("python", system, system / "python"), ("python3", system, system / "python3"),
                                ("python", empty, "none")]:
        new, note = _launcher_python([word, "train.py", "--epochs", "1"], path=str(path))
        assert new == [str(venv / "python"), "train.py", "--epochs", "1"]
        assert note == (f"sparsecomm.launch: the ranks run {word} as {venv / 'python'}, the launcher's "
                        f"({on_path} on PATH; give a path to run another)")
    for given in (["/usr/bin/python3", "x.py"], ["python3.9", "x.py"], ["torchrun", "x.py"], ["./python"], []):
        assert _launcher_python(given, path=str(system)) == (given, None)


LAUNCHER_PYTHON = [
    pytest.param("gloo", "none", id="gloo-loopback"),
    pytest.param("gloo", "1gbit", marks=needs_shaping, id="gloo-shaped"),
    pytest.param("mpi", "none", marks=needs_mpi, id="mpi-loopback"),
]


@pytest.mark.parametrize("backend,bandwidth", LAUNCHER_PYTHON)
def test_a_bare_python_runs_as_the_launchers_interpreter(tmp_path, backend, bandwidth):
    """``.venv/bin/python -m sparsecomm.launch -- python x.py`` without the venv activated runs
    the ranks in the venv, not on PATH's python (which has no torch)."""
    other = tmp_path / "bin"
    _fake_pythons(other)
    env = dict(os.environ, PATH=f"{other}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = [sys.executable, "-m", "sparsecomm.launch", "--nproc", "2", "--bandwidth", bandwidth, "--backend", backend,
           "--", "python", "-c", "import sys, torch; print('ran on', sys.executable)"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(line for line in r.stdout.splitlines() if "ran on" in line) == [
        f"[rank {rank}] ran on {sys.executable}" for rank in range(2)]
    assert f"the ranks run python as {sys.executable}, the launcher's ({other / 'python'} on PATH" in r.stdout
