"""The checks every Comm backend runs on every rank (shared by the gloo and MPI tests).

``run_checks(comm)`` exercises one Comm and returns a JSON-serialisable dict of what this
rank received and what its counters said; the test files recompute what each rank must
have received and counted from the message-size tables below, with their own arithmetic.
Payloads are generated from ``(source, destination, index)`` so a message delivered to
the wrong rank, from the wrong rank, or out of order shows up as different bytes.
"""

from __future__ import annotations

import time

import torch

DENSE_DTYPES = ("float32", "float64", "float16", "bfloat16")
DENSE_N = 1000
SMALL_SHAPE = (2, 3)


# -- message tables (also used by the tests to build references) ---------------------------
def ring_size(src: int) -> int:
    return 3 + src


def a2a_size(src: int, dst: int, idx: int) -> int:
    """Two messages per ordered pair in one round; the first large, the second small."""
    return 1000 + 17 * src + dst if idx == 0 else 1 + src + 2 * dst


def var_size(src: int, dst: int) -> int:
    """Sizes the receiver does not know; 1 byte for several pairs."""
    return 1 + (7 * src + 3 * dst) % 11


def bruck_size(q: int) -> int:
    return 1 + 5 * q


#: the bound of the checks' call with one (what a reducer call sets: max_message_bytes)
BOUND = 64


def bounded_size(src: int, dst: int) -> int:
    """Sizes of the bounded variable-size round: 0 (an empty message) for some pairs."""
    return (7 * src + 3 * dst) % 13 * 4


def bruck_var_size(q: int) -> int:
    return 1 + (13 * q) % 9


def payload_bytes(src: int, dst: int, idx: int, n: int) -> bytes:
    return bytes((i * (2 * src + 1) + 29 * src + 7 * dst + 13 * idx + 1) % 256 for i in range(n))


def payload(src: int, dst: int, idx: int, n: int, device="cpu") -> torch.Tensor:
    return torch.frombuffer(bytearray(payload_bytes(src, dst, idx, n)), dtype=torch.uint8).to(device) \
        if n else torch.empty(0, dtype=torch.uint8, device=device)


def small_input(rank: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(SMALL_SHAPE, generator=g, dtype=torch.float64) * 10 ** (rank % 4)
    return x.to(dtype) if dtype.is_floating_point else (x * 100).round().to(dtype)


def dense_input(rank: int, dtype_name: str, n: int = DENSE_N) -> torch.Tensor:
    g = torch.Generator().manual_seed(2000 + rank)
    return torch.randn(n, generator=g, dtype=torch.float64).to(getattr(torch, dtype_name))


def _hex(t: torch.Tensor) -> str:
    return t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes().hex()


def _delta(comm, before) -> list:
    d = comm.stats - before
    return [d.bytes_sent, d.bytes_recv, d.rounds]


# -- the checks -----------------------------------------------------------------------------
def run_checks(comm) -> dict:
    from sparsecomm.comm.collectives import bruck_allgather, bruck_allgather_var

    P, r, dev = comm.size, comm.rank, comm.device
    out: dict = {"rank": r, "size": P}
    others = [q for q in range(P) if q != r]

    # 1. ring: send to r+1, receive from r-1 (a different peer unless P == 2)
    s = comm.stats.snapshot()
    if P > 1:
        nxt, prv = (r + 1) % P, (r - 1) % P
        buf = torch.empty(ring_size(prv), dtype=torch.uint8, device=dev)
        comm.sendrecv(payload(r, nxt, 0, ring_size(r), dev), nxt, buf, prv)
        out["ring"] = _hex(buf)
    else:
        out["ring"] = ""
    out["ring_stats"] = _delta(comm, s)

    # 2. all-to-all in one round, two messages per pair (ordering within the pair)
    s = comm.stats.snapshot()
    sends = [(q, payload(r, q, i, a2a_size(r, q, i), dev)) for q in others for i in (0, 1)]
    recvs = [(q, torch.empty(a2a_size(q, r, i), dtype=torch.uint8, device=dev)) for q in others for i in (0, 1)]
    comm.exchange(sends, recvs)
    out["a2a"] = {str(q): [_hex(recvs[2 * j][1]), _hex(recvs[2 * j + 1][1])] for j, q in enumerate(others)}
    out["a2a_stats"] = _delta(comm, s)

    # 3. exchange_var with every other rank, sizes unknown to the receiver
    s = comm.stats.snapshot()
    got = comm.exchange_var([(q, payload(r, q, 5, var_size(r, q), dev)) for q in others], others)
    out["var"] = {str(q): _hex(t) for q, t in zip(others, got)}
    out["var_stats"] = _delta(comm, s)

    # 3b. exchange_var shifted: send to r+1 only, receive from r-1 only
    s = comm.stats.snapshot()
    if P > 1:
        got = comm.exchange_var([((r + 1) % P, payload(r, (r + 1) % P, 6, var_size(r, 0), dev))], [(r - 1) % P])
        out["var_ring"] = _hex(got[0])
    else:
        out["var_ring"] = ""
    out["var_ring_stats"] = _delta(comm, s)

    # 4. allgather_small / allreduce_small
    s = comm.stats.snapshot()
    g = comm.allgather_small(small_input(r, torch.float64))
    out["allgather"] = _hex(g)
    out["allgather_shape"] = list(g.shape)
    out["allgather_stats"] = _delta(comm, s)
    for dt in ("float32", "int64"):
        for op in ("sum", "max", "min"):
            s = comm.stats.snapshot()
            res = comm.allreduce_small(small_input(r, getattr(torch, dt)), op=op)
            out[f"allreduce_small_{dt}_{op}"] = _hex(res)
            out[f"allreduce_small_{dt}_{op}_stats"] = _delta(comm, s)

    # 5. dense allreduce (native), every dtype, plus a non-contiguous view
    for dt in DENSE_DTYPES:
        x = dense_input(r, dt).to(dev)
        s = comm.stats.snapshot()
        y = comm.allreduce_dense(x)
        out[f"dense_{dt}"] = _hex(x)
        out[f"dense_{dt}_same_object"] = y is x
        out[f"dense_{dt}_stats"] = _delta(comm, s)
    base = dense_input(r, "float32", 24).reshape(4, 6).to(dev)
    view = base.t()
    comm.allreduce_dense(view)
    out["dense_noncontig"] = _hex(base)

    # 6. Bruck all-gathers
    s = comm.stats.snapshot()
    blocks = bruck_allgather(comm, payload(r, 0, 7, bruck_size(r), dev), [bruck_size(q) for q in range(P)])
    out["bruck"] = [_hex(b) for b in blocks]
    out["bruck_stats"] = _delta(comm, s)
    s = comm.stats.snapshot()
    blocks = bruck_allgather(comm, payload(r, 0, 8, 16, dev), [16] * P)
    out["bruck_equal"] = [_hex(b) for b in blocks]
    out["bruck_equal_stats"] = _delta(comm, s)
    s = comm.stats.snapshot()
    blocks = bruck_allgather_var(comm, payload(r, 0, 9, bruck_var_size(r), dev))
    out["bruck_var"] = [_hex(b) for b in blocks]
    out["bruck_var_stats"] = _delta(comm, s)

    # 6b. the variable-size steps inside a call with a bound, as every reducer call has one:
    #     where the backend receives short or probes, the sizes cost no round of their own
    scope = comm.new_scope("checks")
    with comm.call_scope(scope, max_message_bytes=BOUND):
        s = comm.stats.snapshot()
        got = comm.exchange_var([(q, payload(r, q, 10, bounded_size(r, q), dev)) for q in others], others)
        out["var_bounded"] = {str(q): _hex(t) for q, t in zip(others, got)}
        out["var_bounded_stats"] = _delta(comm, s)
        s = comm.stats.snapshot()
        blocks = bruck_allgather_var(comm, payload(r, 0, 11, bruck_var_size(r), dev))
        out["bruck_var_bounded"] = [_hex(b) for b in blocks]
        out["bruck_var_bounded_stats"] = _delta(comm, s)

    # 7. barrier
    s = comm.stats.snapshot()
    comm.barrier()
    out["barrier_stats"] = _delta(comm, s)

    # 8. invalid peers raise ValueError before anything is posted
    bad = {}
    for name, peer in (("self", r), ("negative", -1), ("size", P), ("large", P + 5)):
        s = comm.stats.snapshot()
        try:
            comm.exchange([(peer, payload(r, 0, 0, 4, dev))], [])
            bad[name] = "no error"
        except ValueError:
            bad[name] = "ValueError"
        except Exception as e:  # noqa: BLE001 - reported to the test
            bad[name] = f"{type(e).__name__}: {e}"
        try:
            comm.exchange([], [(peer, torch.empty(4, dtype=torch.uint8, device=dev))])
            bad[name + "_recv"] = "no error"
        except ValueError:
            bad[name + "_recv"] = "ValueError"
        except Exception as e:  # noqa: BLE001
            bad[name + "_recv"] = f"{type(e).__name__}: {e}"
        assert _delta(comm, s) == [0, 0, 0]
    out["bad_peer"] = bad
    # a last ring so that no rank leaves while another still checks
    comm.barrier()
    return out


def run_timeout(comm, timeout: float, settle: float) -> dict:
    """Rank P-1 starts a dense allreduce nobody joins, then waits for messages from
    ranks 0 and 1, of which only rank 1 sends. Other ranks stay alive ``settle`` seconds."""
    from sparsecomm.comm.base import CommTimeoutError

    P, r, dev = comm.size, comm.rank, comm.device
    out: dict = {"rank": r}
    last = P - 1
    if r == 1 and last != 1:
        # the send completes once rank P-1 posts its receive, after its first timeout
        comm.timeout = settle
        comm.exchange([(last, payload(1, last, 0, 10, dev))], [])
    if r == last:
        srcs = [0, 1] if P > 2 else [0]
        # the collective first: on gloo a timed-out receive closes the pair for good
        for what in ("allreduce", "exchange"):
            t0 = time.monotonic()
            try:
                if what == "exchange":
                    comm.exchange([], [(q, torch.empty(10, dtype=torch.uint8, device=dev)) for q in srcs])
                else:
                    comm.allreduce_dense(torch.ones(8, device=dev))
                out[what] = "no error"
            except CommTimeoutError as e:
                out[what] = "CommTimeoutError"
                out[what + "_msg"] = str(e)
            except Exception as e:  # noqa: BLE001
                out[what] = f"{type(e).__name__}: {e}"
            out[what + "_s"] = time.monotonic() - t0
    else:
        time.sleep(settle)
    return out
