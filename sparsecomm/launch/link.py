"""The link's rate: what ``--bandwidth`` accepts, what the launch prints about it, what a rank reads of it.

:func:`parse_rate` checks a tc rate; :func:`_report_link` measures the links at start
(:func:`~sparsecomm.launch.network.measure_rate`), prints the configured and measured rates and
hands them to the ranks; :func:`describe_link`, called inside a rank, names the link it runs
on from the variables the launcher set.
"""

from __future__ import annotations

import argparse
import os
import re

from .network import EmulatedNetwork, LaunchError, measure_rate


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
