"""Start P ranks on this machine, optionally over an emulated cluster network.

    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- python train.py --epochs 1
    python -m sparsecomm.launch --nproc 2 --bandwidth none -- python train.py

With ``--bandwidth RATE`` (e.g. ``1gbit``, ``100mbit``) every rank runs in its own network
namespace with one veth link into a bridge namespace (a switch), and both ends of each link
are shaped with ``tc ... tbf rate RATE`` -- a full-duplex switch port of that speed, which
reproduces the papers' 1 Gbit/s Ethernet clusters (``netem`` is not available here; ``tbf``
is). This needs root and iproute2. ``--bandwidth none`` runs the ranks on plain loopback.

Each rank gets the variables torchrun sets (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE) plus GLOO_SOCKET_IFNAME, so a script calling
``torch.distributed.init_process_group("gloo")`` works unchanged. Output lines are prefixed
with the rank. When a rank fails, the others are stopped and the launch exits non-zero.
Every namespace the launch made is removed on exit, also on Ctrl-C or a crash of a rank.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

__all__ = ["EmulatedNetwork", "launch", "main", "parse_rate", "NetworkSetupError"]

_SUBNET = "10.213.0"  # private addresses inside the launch's own namespaces only


class NetworkSetupError(RuntimeError):
    """The emulated network cannot be built on this machine."""


def parse_rate(text: str) -> str | None:
    """Validate a tc rate such as ``1gbit``, ``500mbit``; ``none`` means no shaping."""
    if text.lower() == "none":
        return None
    if not re.fullmatch(r"\d+(\.\d+)?(kbit|mbit|gbit)", text.lower()):
        raise argparse.ArgumentTypeError(f"bandwidth must look like 1gbit, 100mbit or 'none', got {text!r}")
    return text.lower()


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetworkSetupError(f"{' '.join(cmd)} failed: {proc.stderr.strip() or proc.stdout.strip()}")


@dataclass
class EmulatedNetwork:
    """P rank namespaces joined through a bridge namespace by shaped veth links."""

    size: int
    rate: str
    prefix: str = field(default_factory=lambda: f"sc{os.getpid()}")
    created: list[str] = field(default_factory=list)

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
        return f"{_SUBNET}.{rank + 1}"

    @property
    def bridge_namespace(self) -> str:
        return f"{self.prefix}br"

    def up(self) -> None:
        self.check_possible()
        if self.size > 250:
            raise NetworkSetupError("at most 250 ranks fit the emulated subnet")
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

    def _add_namespace(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self.created.append(name)
        _run(["ip", "-n", name, "link", "set", "lo", "up"])

    def down(self) -> None:
        """Remove every namespace this network made (their links go with them)."""
        for name in reversed(self.created):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.created.clear()

    def wrap(self, rank: int, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(rank), *cmd]


def _pump(stream, rank: int, out) -> None:
    for line in iter(stream.readline, b""):
        out.write(f"[rank {rank}] {line.decode(errors='replace')}")
        out.flush()
    stream.close()


def launch(cmd: list[str], nproc: int, rate: str | None, port: int = 29500, out=None) -> int:
    """Run ``cmd`` as ``nproc`` ranks; returns the exit code (first failing rank's, or 0)."""
    out = out or sys.stdout
    network = EmulatedNetwork(nproc, rate) if rate else None
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def interrupted(signum, frame):  # turn SIGTERM into the same clean path as Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        if network:
            network.up()
        master = network.address(0) if network else "127.0.0.1"
        for rank in range(nproc):
            env = dict(os.environ, MASTER_ADDR=master, MASTER_PORT=str(port), RANK=str(rank),
                       WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
                       GLOO_SOCKET_IFNAME=network.interface(rank) if network else "lo",
                       PYTHONUNBUFFERED="1")
            argv = network.wrap(rank, cmd) if network else cmd
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            procs.append(proc)
            pump = threading.Thread(target=_pump, args=(proc.stdout, rank, out), daemon=True)
            pump.start()
            pumps.append(pump)
        status = 0
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, status = failed[0]
                out.write(f"sparsecomm.launch: rank {rank} exited with {status}; stopping the other ranks\n")
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(0.05)
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
    parser = argparse.ArgumentParser(prog="python -m sparsecomm.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, required=True, help="number of ranks")
    parser.add_argument("--bandwidth", type=parse_rate, default="1gbit",
                        help="link rate per rank (tc syntax, e.g. 1gbit, 100mbit) or 'none' for loopback")
    parser.add_argument("--backend", choices=["gloo"], default="gloo",
                        help="what the ranks are prepared for (gloo: torchrun-style variables)")
    parser.add_argument("--port", type=int, default=29500, help="MASTER_PORT")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- followed by the command each rank runs")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("give the command to run after --")
    if args.nproc < 1:
        parser.error("--nproc must be >= 1")
    if args.bandwidth:
        try:
            EmulatedNetwork.check_possible()
        except NetworkSetupError as exc:
            print(f"sparsecomm.launch: cannot emulate a {args.bandwidth} network here ({exc}); "
                  "rerun with --bandwidth none to use plain loopback", file=sys.stderr)
            return 2
    try:
        return launch(cmd, args.nproc, args.bandwidth, args.port)
    except NetworkSetupError as exc:
        print(f"sparsecomm.launch: {exc}; rerun with --bandwidth none to use plain loopback", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
