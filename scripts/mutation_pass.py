"""A small mutation pass over the algorithm modules (mutmut is not installed).

Each mutant is one hand-written textual change (an off-by-one in a bound, a dropped
averaging, a swapped min/max, a wrong sign, a skipped residual update, ...) of one module.
The script never touches the checkout it is run from: it copies the committed tree (``git
archive HEAD``; the compiled extension comes along) to a work directory, applies one
mutant at a time there, runs that module's test files with ``pytest -x -q`` under a timeout
(``PYTHONPATH`` pointing at the copy, so spawned ranks import the mutant too), and restores
the module's original bytes in a ``finally:`` before the next mutant.

A mutant is *killed* when pytest fails (or errors), *survived* when the tests pass, and
*timeout* when they run past ``--timeout`` (not counted as killed: a hang and a slow pass
look alike). Survivors are listed with the reason found
for each in docs/mutation.md.

    python scripts/mutation_pass.py [--work /tmp/mutwork] [--only densestream ...] \
        [--timeout 600] [--json docs/results/mutation.json] [--baseline]

One pytest at a time; tests marked slow or mpi are deselected (``-m "not slow and not mpi"``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALG = "sparsecomm/algorithms/"

#: module -> (its test files, a -k expression or None), run with -x
TESTS = {
    "topka": (["tests/test_algorithms.py", "tests/test_codecs.py"], "topka"),
    "dense": (["tests/test_algorithms.py"], "dense"),
    "_folding": (["tests/test_gtopk.py"], None),
    "_qsgd": (["tests/test_sparcml.py", "tests/test_stream.py"], "qsgd or quantize or topkdsa or stream"),
    "_sparse_stream": (["tests/test_sparcml.py", "tests/test_stream.py"], None),
    "sparcml": (["tests/test_sparcml.py", "tests/test_codecs.py"], "not test_codecs or sparcml or topkdsa"),
    "gtopk": (["tests/test_gtopk.py", "tests/test_codecs.py"], "not test_codecs or gtopk"),
    "densestream": (["tests/test_densestream.py"], None),
    "skcompress": (["tests/test_codecs.py"], "skcompress"),
    "auto": (["tests/test_auto.py"], None),
    "spardl": (["tests/test_spardl.py", "tests/test_codecs.py"], "not test_codecs or spardl"),
}

#: (module, what the mutant does, original text (must occur once), mutated text)
MUTANTS: list[tuple[str, str, str, str]] = [
    # -- topka
    ("topka", "lossy codec's error kept with the wrong sign",
     "acc.index_copy_(0, indices, values - sent)", "acc.index_copy_(0, indices, sent - values)"),
    ("topka", "skipped residual update: selected entries stay in acc",
     "clear=codec.lossless)", "clear=False)"),
    ("topka", "out not zeroed between the merged entries",
     "ops.scatter_set_(out, merged_indices, merged_values, zero_rest=True)",
     "ops.scatter_set_(out, merged_indices, merged_values, zero_rest=False)"),
    ("topka", "off-by-one: two ranks take the one-rank path (the peer's vector dropped)",
     "if len(decoded) == 1:", "if len(decoded) <= 2:"),
    ("topka", "merge in reverse rank order",
     "ops.merge_add_many([d[0] for d in decoded],\n                                                                   [d[1] for d in decoded])",
     "ops.merge_add_many([d[0] for d in decoded[::-1]],\n                                                                   [d[1] for d in decoded[::-1]])"),
    ("topka", "last_nnz off by one",
     "self.last_nnz = merged_indices.numel()", "self.last_nnz = merged_indices.numel() - 1"),
    # -- dense
    ("dense", "skipped residual update (acc not cleared)", "        acc.zero_()\n", "\n"),
    ("dense", "averages where the contract is a sum",
     "        self.comm.allreduce_dense(out)\n", "        self.comm.allreduce_dense(out)\n        out.div_(self.comm.size)\n"),
    ("dense", "last_nnz wrong", "self.last_nnz = acc.numel()", "self.last_nnz = 0"),
    ("dense", "non-finite policy flag flipped", "propagates_nonfinite = True", "propagates_nonfinite = False"),
    # -- _folding
    ("_folding", "off-by-one: one more rank gets a partner", "elif rank < extra:", "elif rank <= extra:"),
    ("_folding", "size check off by one", "if size < 1:", "if size < 0:"),
    ("_folding", "wrong partner of a folded rank", "partner: int | None = rank - p2", "partner: int | None = (rank - p2 + 1) % p2"),
    # -- _qsgd
    ("_qsgd", "the same seed every step", " + step * 0x94D049BB133111EB)", ")"),
    ("_qsgd", "the same seed on every rank", " + rank * 0xBF58476D1CE4E5B9", ""),
    ("_qsgd", "wrong offset in the message", "return encode_qsgd(packed, scales, x.numel(), offset, bits",
     "return encode_qsgd(packed, scales, x.numel(), 0, bits"),
    ("_qsgd", "seed mask narrowed to 31 bits", "& (2**63 - 1)", "& (2**31 - 1)"),
    ("_qsgd", "dequantize with a wrong bucket size",
     "return ops.qsgd_dequantize(packed, scales, n, bits, bucket_size, dtype)",
     "return ops.qsgd_dequantize(packed, scales, n, bits, max(2, bucket_size // 2) if bits == 8 else bucket_size, dtype)"),
    # -- _sparse_stream
    ("_sparse_stream", "off-by-one in the dense switch of a new stream",
     "return s.densified() if s.count > stream_delta(n, values.dtype) else s",
     "return s.densified() if s.count >= stream_delta(n, values.dtype) else s"),
    ("_sparse_stream", "write_into leaves stale values between entries",
     "ops.scatter_set_(view, self.indices, self.values, zero_rest=True)",
     "ops.scatter_set_(view, self.indices, self.values, zero_rest=False)"),
    ("_sparse_stream", "off-by-one in concat's shifted indices",
     "other.indices.to(it) + self.n,", "other.indices.to(it) + self.n - 1,"),
    ("_sparse_stream", "sent values of a lossy codec dropped (the sender goes on with the exact stream)",
     "    if values is stream.values:\n        return message, stream\n",
     "    if True:\n        return message, stream\n"),
    ("_sparse_stream", "delta check of a coded stream off by one", "if idx.numel() > delta:", "if idx.numel() >= delta:"),
    ("_sparse_stream", "sparse + sparse switches to dense too late",
     "if self.count + other.count > self.delta:", "if self.count + other.count > 2 * self.delta:"),
    # -- sparcml
    ("sparcml", "split bounds by ceiling instead of floor", "return [j * n // p for j in range(p + 1)]",
     "return [-(-j * n // p) for j in range(p + 1)]"),
    ("sparcml", "lossy codec's error kept with the wrong sign",
     "stream.values - sent.values)", "sent.values - stream.values)"),
    ("sparcml", "every rank of a group keeps the codec error (counted several times)",
     "keep_error=rank % distance == 0)", "keep_error=True)"),
    ("sparcml", "summation order swapped between partners", "if peer < rank:   # lower rank's stream first",
     "if peer > rank:   # lower rank's stream first"),
    ("sparcml", "QSGD error kept with the wrong sign", "acc[lo:hi] += mine.values - own", "acc[lo:hi] -= mine.values - own"),
    ("sparcml", "choose: min/max swapped", "return \"sparcml_recursive_double\" if t_rd <= t_sag else",
     "return \"sparcml_recursive_double\" if t_rd >= t_sag else"),
    ("sparcml", "split phase drops the last rank's piece", "        for j in range(size):\n            s = piece(j)",
     "        for j in range(size - 1):\n            s = piece(j)"),
    ("sparcml", "dense switch of choose off by one", "if big_k >= stream_delta(n, value_dtype):",
     "if big_k > stream_delta(n, value_dtype):"),
    # -- gtopk
    ("gtopk", "skipped residual update of what a merge drops",
     "                ops.scatter_add_(acc, mi[drop], mv[drop])  # what this merge drops stays here\n", ""),
    ("gtopk", "off-by-one in the kept count", "kept_v, pos = ops.topk(mv, k)", "kept_v, pos = ops.topk(mv, k - 1)"),
    ("gtopk", "lossy codec's error kept with the wrong sign", "ops.scatter_add_(acc, entries[0], entries[1] - sent)",
     "ops.scatter_add_(acc, entries[0], sent - entries[1])"),
    ("gtopk", "broadcast skips its first level", "            d = p2 // 2\n            while d >= 1:",
     "            d = p2 // 4\n            while d >= 1:"),
    ("gtopk", "last_nnz off by one", "self.last_nnz = k\n", "self.last_nnz = k + 1\n"),
    ("gtopk", "fold partner drops its own selection",
     "cur = merge_keep(cur, decode(recv_payload(fold.partner), fold.partner))",
     "cur = merge_keep(decode(recv_payload(fold.partner), fold.partner), (cur[0][:0], cur[1][:0]))"),
    # -- densestream
    ("densestream", "boundaries averaged over the power-of-two core only",
     "b = average_boundaries(table.sum(0), size, n)", "b = average_boundaries(table[:p2].sum(0), p2, n)"),
    ("densestream", "off-by-one in a rank's proposals",
     "pos = torch.tensor([j * m // parts for j in range(1, parts)]",
     "pos = torch.tensor([min(m - 1, j * m // parts + 1) for j in range(1, parts)]"),
    ("densestream", "skipped residual update (selection stays in acc)", "            acc.index_fill_(0, indices, 0)  # what", "            pass  # what"),
    ("densestream", "proposal check skipped", "        check_proposals(table, n, rank)\n", ""),
    ("densestream", "summation order swapped between partners",
     "pair = (theirs.blocks, kept) if peer < rank else (kept, theirs.blocks)",
     "pair = (theirs.blocks, kept) if peer > rank else (kept, theirs.blocks)"),
    ("densestream", "boundary mean rounded up instead of down",
     "return [0] + [int(s) // size for s in summed.tolist()] + [n]",
     "return [0] + [-(-int(s) // size) for s in summed.tolist()] + [n]"),
    ("densestream", "k not capped at N", "        k = min(k, n)\n        with self.timed(\"select\"):\n            values, indices = ops.topk(acc, k)",
     "        with self.timed(\"select\"):\n            values, indices = ops.topk(acc, k)"),
    # -- skcompress (the algorithm)
    ("skcompress", "ps: codec error kept with the wrong sign", "acc.index_copy_(0, indices, values - sent)",
     "acc.index_copy_(0, indices, sent - values)"),
    ("skcompress", "ps: the aggregate's error dropped",
     "                ops.scatter_add_(acc, sum_idx, sum_val - idx_sent)  # the aggregate's error stays here\n", ""),
    ("skcompress", "ps: rank 0's own contribution dropped",
     "sum_idx, sum_val = ops.merge_add_many([mine[0]] + [p[0] for p in parts],\n                                                      [mine[1]] + [p[1] for p in parts])",
     "sum_idx, sum_val = ops.merge_add_many([p[0] for p in parts] or [mine[0]],\n                                                      [p[1] for p in parts] or [mine[1]])"),
    ("skcompress", "topology not validated", 'Option("allgather", str, choices=_TOPOLOGIES)', 'Option("allgather", str)'),
    ("skcompress", "ps: out not zeroed between entries", "ops.scatter_set_(out, idx, val, zero_rest=True)  # a COO",
     "ops.scatter_set_(out, idx, val, zero_rest=False)  # a COO"),
    ("skcompress", "ps: last_nnz counts the local selection", "        self.last_nnz = idx.numel()", "        self.last_nnz = count"),
    # -- auto
    ("auto", "compute term halved in the predictions",
     "preds[name] = wire.time(alpha, beta) + compute_ns(name, density, compute) * 1e-9 * N",
     "preds[name] = wire.time(alpha, beta) + compute_ns(name, density, compute) * 0.5e-9 * N"),
    ("auto", "the most expensive prediction chosen",
     "best = min(preds, key=lambda n: (preds[n], list(candidates).index(n)))",
     "best = max(preds, key=lambda n: (preds[n], list(candidates).index(n)))"),
    ("auto", "shortlist one short", "return [n for n in ranked if predictions[n] <= margin * best][:size]",
     "return [n for n in ranked if predictions[n] <= margin * best][:max(1, size - 1)]"),
    ("auto", "interpolation weights swapped", "return points[i] * (1 - w) + points[i + 1] * w",
     "return points[i] * w + points[i + 1] * (1 - w)"),
    ("auto", "a candidate's time is its fastest rank's, not its slowest's", "slowest = table.amax(0).tolist()",
     "slowest = table.amin(0).tolist()"),
    ("auto", "a rank's worst trial instead of its best",
     "mine = torch.tensor([min(self.trial_times[name]) for name in self.trials]",
     "mine = torch.tensor([max(self.trial_times[name]) for name in self.trials]"),
    ("auto", "each rank uses its own fit instead of rank 0's",
     "return float(table[0, 0]), float(table[0, 1])",
     "return float(table[comm.rank, 0]), float(table[comm.rank, 1])"),
    # -- spardl
    ("spardl", "block quota by floor instead of ceiling", "quota = -(-k // q)", "quota = max(1, k // q)"),
    ("spardl", "R-SAG discarded values not shared (dropped averaging)",
     "ops.scatter_add_(acc, d_idx, d_val * (1.0 / (2 << s)))", "ops.scatter_add_(acc, d_idx, d_val * (1.0 / (1 << s)))"),
    ("spardl", "B-SAG discarded values not shared among the d holders",
     "ops.scatter_add_(acc, d_idx, d_val * (1.0 / d))", "ops.scatter_add_(acc, d_idx, d_val)"),
    ("spardl", "B-SAG h moves against its step", "st[\"h\"] = max(k / size, min(d * k / size, st[\"h\"] + step))",
     "st[\"h\"] = max(k / size, min(d * k / size, st[\"h\"] - step))"),
    ("spardl", "off-by-one in an SRS bag's last offset", "hi = min(2 * dist, q) - 1 ", "hi = min(2 * dist, q) "),
    ("spardl", "skipped residual update: the result's entries keep their journalled values",
     "                ops.scatter_set_(acc, all_idx, xi)\n", ""),
    ("spardl", "R-SAG merge order swapped between partners", "if layout.team & (1 << s):   # the lower",
     "if not layout.team & (1 << s):   # the lower"),
    ("spardl", "default teams also at P = 2", "teams = 2 if (size >= 4 and size % 2 == 0) else 1",
     "teams = 2 if (size >= 2 and size % 2 == 0) else 1"),
]


def copy_checkout(work: str) -> str:
    """The committed tree (HEAD, not anyone's uncommitted edits) plus the compiled extension."""
    if os.path.exists(work):
        shutil.rmtree(work)
    os.makedirs(work)
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", ROOT, "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", work], input=archive, check=True)
    for name in os.listdir(os.path.join(ROOT, "sparsecomm")):
        if name.startswith("_C") and name.endswith(".so"):
            shutil.copy2(os.path.join(ROOT, "sparsecomm", name), os.path.join(work, "sparsecomm", name))
    return head


def run_tests(work: str, tests: tuple[list[str], str | None], timeout: float) -> tuple[str, float, str]:
    env = dict(os.environ, PYTHONPATH=work, OMP_NUM_THREADS="1")
    files, kexpr = tests
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:logging", "-p", "no:cacheprovider",
           "-m", "not slow and not mpi", *(["-k", kexpr] if kexpr else []), *files]
    start = time.monotonic()
    # a session of its own, so that a timeout ends pytest and the ranks it spawned (by group id)
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return "timeout", time.monotonic() - start, stdout[-300:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    took = time.monotonic() - start
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    last = lines[-1] if lines else stderr[-300:]
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    status = "survived" if proc.returncode == 0 else "killed"
    return status, took, (failed[0] if failed else last)[:300]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/mutwork")
    ap.add_argument("--only", nargs="*", help="modules to mutate (default: all)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--baseline", action="store_true", help="first run each module's tests unmutated")
    ap.add_argument("--reuse", action="store_true", help="keep an existing work copy")
    ap.add_argument("--resume", default=None, help="a JSON of an earlier (partial) pass: keep its results and "
                                                 "run only the mutants it lacks")
    args = ap.parse_args()
    # SIGTERM runs the finally: blocks below (the mutated module is restored) like Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if not (args.reuse and os.path.isdir(args.work)):
        print(f"work copy of HEAD {copy_checkout(args.work)} in {args.work}", flush=True)
    mods = args.only or list(TESTS)
    results = []
    if args.resume:
        with open(args.resume) as f:
            results = [r for r in json.load(f) if r["status"] in ("killed", "survived", "timeout")]
    done = {(r["module"], r["mutant"]) for r in results}
    for mod in mods:
        path = os.path.join(args.work, ALG + mod + ".py")
        tests = TESTS[mod]
        if args.baseline:
            status, took, note = run_tests(args.work, tests, args.timeout)
            print(f"[baseline] {mod}: {'green' if status == 'survived' else status} ({took:.0f} s) {note}", flush=True)
            if status != "survived":
                results.append({"module": mod, "mutant": "(baseline)", "status": "baseline " + status, "note": note})
                continue
        for m, what, old, new in MUTANTS:
            if m != mod or (m, what) in done:
                continue
            with open(path, "rb") as f:
                original = f.read()
            text = original.decode()
            if text.count(old) != 1:
                print(f"{mod}: mutant {what!r}: the original text occurs {text.count(old)} times; skipped", flush=True)
                results.append({"module": mod, "mutant": what, "status": "not applied", "note": ""})
                continue
            try:
                with open(path, "wb") as f:
                    f.write(text.replace(old, new).encode())
                status, took, note = run_tests(args.work, tests, args.timeout)
            finally:
                with open(path, "wb") as f:
                    f.write(original)
            print(f"{mod}: {status:8s} {took:6.0f} s  {what}  | {note}", flush=True)
            results.append({"module": mod, "mutant": what, "status": status, "seconds": round(took, 1),
                            "note": note})
            if args.json:  # after every mutant: a partial pass keeps what it found
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=1)
    print("\nmodule            killed / total (timeouts: not counted as killed)")
    for mod in mods:
        rows = [r for r in results if r["module"] == mod and r["status"] in ("killed", "timeout", "survived")]
        dead = sum(r["status"] == "killed" for r in rows)
        slow = sum(r["status"] == "timeout" for r in rows)
        print(f"{mod:18s}{dead:3d} / {len(rows)}" + (f"  ({slow} timed out)" if slow else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
