"""SKCompress kernels against numpy / pure-Python references written here: quantiles (exact
and the sketch's stated rank-error bound), sign-split quantile buckets, the COO codec's round
trips (lossless keys; values never change sign, never decode to a bucket further from zero,
stay in their group), the exact bit counts of the delta-binary keys and the choice of the
smallest scheme, the corner cases (empty, N = 1, one symbol, all equal, deltas of 2^31 - 1,
64-bit keys) and malformed bodies (one per field, plus random corruption)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sparsecomm import ops
from sparsecomm.errors import WireFormatError

K = ops._skcompress.SKETCH_K


def _rng(seed):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- quantiles

@pytest.mark.parametrize("n,nq", [(1, 1), (1, 4), (7, 3), (1000, 128), (5000, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_quantiles_exact_mode_is_the_sorted_rank(n, nq, dtype):
    x = torch.from_numpy(_rng(n).standard_normal(n)).to(dtype)
    got = ops.skcompress_quantiles(x, nq, exact_max=n).numpy()
    xs = np.sort(x.double().numpy())
    want = [xs[(j * n) // nq] for j in range(nq)] + [xs[-1]]
    assert np.array_equal(got, want)


@pytest.mark.parametrize("n,dist", [(50_000, "normal"), (200_000, "heavy"), (100_000, "ties"), (40_000, "sorted")])
def test_quantile_sketch_rank_error_within_its_bound(n, dist):
    r = _rng(n)
    x = {"normal": r.standard_normal(n), "heavy": r.standard_cauchy(n),
         "ties": r.integers(0, 50, n).astype(np.float64), "sorted": np.arange(n, dtype=np.float64)}[dist]
    nq = 256
    got = ops.skcompress_quantiles(torch.from_numpy(x), nq, exact_max=0).numpy()
    xs = np.sort(x)
    levels = math.floor(math.log2(n / K)) + 1
    bound = n * levels / K
    worst = 0.0
    for j in range(nq):
        target = (j * n) // nq
        lo, hi = np.searchsorted(xs, got[j], "left"), np.searchsorted(xs, got[j], "right") - 1
        assert lo <= hi, "a quantile must be one of the inserted values"
        worst = max(worst, max(0, lo - target, target - hi))
    assert worst <= bound, (worst, bound)
    assert got[-1] == xs[-1]


# ---------------------------------------------------------------- quantize

def _ref_quantize(v: np.ndarray, q: int):
    """Buckets per sign over magnitudes from exact quantiles (the header's definition)."""
    B = q // 2
    bucket = np.zeros(v.size, dtype=np.int64)
    splits = np.zeros((2, B + 1))
    used = [0, 0]
    for sg in (0, 1):
        sel = (v >= 0) if sg else (v < 0)
        a = np.abs(v[sel])
        if a.size == 0:
            continue
        nb = min(B, a.size)
        s = np.sort(a)
        sp = [s[0]] + [s[(j * a.size) // nb] for j in range(1, nb)] + [s[-1]]
        splits[sg, :nb + 1] = sp
        used[sg] = nb
        bucket[sel] = [sum(1 for j in range(1, nb) if sp[j] <= x) for x in a]
    return bucket, splits, used


@pytest.mark.parametrize("n,q", [(0, 256), (1, 256), (5, 4), (300, 256), (2000, 16), (999, 2)])
def test_quantize_matches_reference(n, q):
    v = _rng(n + q).standard_normal(n) * np.exp(_rng(1).standard_normal(n))
    v[::7] = 0.0
    b, sp, used = ops.skcompress_quantize(torch.from_numpy(v), q, exact_max=1 << 20)
    rb, rsp, rused = _ref_quantize(v, q)
    assert used.tolist() == rused
    assert np.array_equal(sp.numpy(), rsp)
    assert np.array_equal(b.numpy(), rb)


@pytest.mark.parametrize("levels,n", [(575, 75000), (128, 20000), (16, 20000), (3, 5000), (40, 300)])
@pytest.mark.parametrize("outlier", [False, True])
def test_quantize_repeated_values_matches_reference(levels, n, outlier):
    """Values drawn from few distinct ones (sums of decoded values look like this): the
    splits are those values, often several equal, and nearly every value lies in a bin of
    the lookup table with a split inside. An outlier stretches the key range so that many
    splits share one bin."""
    r = _rng(levels * 7 + n)
    v = (r.standard_normal(levels) * 3)[r.integers(0, levels, n)]
    if outlier:
        v[n // 2] = 1e30
        v[n // 3] = -1e-30
    b, sp, used = ops.skcompress_quantize(torch.from_numpy(v).float(), 256, exact_max=1 << 20)
    rb, rsp, rused = _ref_quantize(v.astype(np.float32).astype(np.float64), 256)
    assert used.tolist() == rused
    assert np.array_equal(sp.numpy(), rsp)
    assert np.array_equal(b.numpy(), rb)


# ---------------------------------------------------------------- codec round trips

def _message(n_entries, N, seed, dist="normal", dtype=torch.float32):
    r = _rng(seed)
    idx = np.sort(r.choice(N, size=n_entries, replace=False)) if n_entries else np.zeros(0, np.int64)
    v = {"normal": lambda: r.standard_normal(n_entries),
         "skewed": lambda: r.standard_normal(n_entries) ** 3 * 1e-3 - 1e-4,
         "positive": lambda: np.abs(r.standard_normal(n_entries)),
         "equal": lambda: np.full(n_entries, -0.25),
         "tiny": lambda: r.standard_normal(n_entries) * 1e-38}[dist]()
    return torch.from_numpy(idx.astype(np.int64)), torch.from_numpy(v).to(dtype)


def _check_values(val, dec, q, r, exact_max=65536):
    """Decoded values: the mean of a bucket of the same sign and group, never further from zero."""
    v = val.double().numpy()
    b, sp, used = (t.numpy() for t in ops.skcompress_quantize(val, q, exact_max))
    B = q // 2
    G = -(-B // r)
    d = dec.double().numpy()
    sign = (v >= 0).astype(int)
    for sg in (0, 1):
        sel = sign == sg
        if not sel.any():
            continue
        nb = used[sg]
        lo, hi = sp[sg, :nb], sp[sg, 1:nb + 1]
        means = (torch.from_numpy(lo + (hi - lo) * 0.5).to(val.dtype)).double().numpy()
        mag = np.abs(d[sel])
        if sg == 0:
            assert np.all(d[sel] <= 0), "a negative value decoded positive"
        else:
            assert np.all(d[sel] >= 0), "a non-negative value decoded negative"
        # the decoded magnitude is some bucket's mean; find which (means ascend)
        pos = np.searchsorted(means, mag, "left")
        pos = np.minimum(pos, nb - 1)
        assert np.all(means[pos] == mag), "decoded value is not a bucket mean"
        # equal means of neighbouring buckets: take the largest index with that mean
        pos_hi = np.searchsorted(means, mag, "right") - 1
        true_b = b[sel]
        assert np.all(pos <= true_b), "decoded bucket further from zero than the true one"
        assert np.all(pos_hi // G >= true_b // G) and np.all(pos // G <= true_b // G), "left its group"
        assert np.all(mag <= hi[true_b]), "decoded magnitude beyond the true bucket"


CASES = [  # (entries, N, dist, dtype)
    (0, 10, "normal", torch.float32), (1, 1, "normal", torch.float32), (1, 1000, "normal", torch.float64),
    (3, 3, "equal", torch.float32), (500, 1000, "skewed", torch.float32), (2000, 2000, "positive", torch.float32),
    (4000, 10 ** 6, "normal", torch.float64), (70_000, 10 ** 7, "skewed", torch.float32),
    (3000, 2 ** 33, "normal", torch.float32), (800, 5000, "tiny", torch.float32),
]


@pytest.mark.parametrize("entries,N,dist,dtype", CASES)
@pytest.mark.parametrize("index_codec", [0, 1])
@pytest.mark.parametrize("value_codec", [0, 1])
def test_round_trip(entries, N, dist, dtype, index_codec, value_codec):
    idx, val = _message(entries, N, entries + N, dist, dtype)
    q, r = 256, 8
    body = ops.skcompress_encode(idx, val, N, index_codec=index_codec, value_codec=value_codec, q=q, r=r)
    di, dv = ops.skcompress_decode(body, N, entries, dtype, expect_index=index_codec, expect_value=value_codec)
    assert torch.equal(di, idx)
    if value_codec == 0:
        assert torch.equal(dv, val)
    else:
        _check_values(val, dv, q, r)


@pytest.mark.parametrize("q,s,t,r", [(2, 1, 0.01, 1), (16, 4, 1.0, 2), (256, 2, 0.2, 8), (512, 1, 64.0, 255),
                                     (4096, 16, 0.5, 255), (10, 3, 0.3, 5)])
def test_sketch_parameters(q, s, t, r):
    idx, val = _message(5000, 100_000, q + s, "skewed")
    body = ops.skcompress_encode(idx, val, 100_000, q=q, s=s, t=t, r=r)
    di, dv = ops.skcompress_decode(body, 100_000, 5000, torch.float32)
    assert torch.equal(di, idx)
    _check_values(val, dv, q, r)


@pytest.mark.parametrize("entries,N,dist,dtype", CASES)
@pytest.mark.parametrize("value_codec", [0, 1])
def test_encoder_returns_what_the_decoder_decodes(entries, N, dist, dtype, value_codec):
    """The encoder's own decoded values (what a lossy sender keeps) equal the decoder's, bit
    for bit, and its body is the plain encoder's."""
    idx, val = _message(entries, N, entries + N + 1, dist, dtype)
    body = ops.skcompress_encode(idx, val, N, value_codec=value_codec)
    body2, sent = ops.skcompress_encode_decoded(idx, val, N, value_codec=value_codec)
    _, dv = ops.skcompress_decode(body, N, entries, dtype)
    assert torch.equal(body2, body)
    assert sent.dtype == dtype and torch.equal(sent.view(torch.uint8), dv.view(torch.uint8))


@pytest.mark.parametrize("q,s,t,r", [(2, 1, 0.01, 1), (16, 4, 1.0, 2), (10, 3, 0.3, 5), (1024, 3, 0.1, 1),
                                     (4096, 16, 0.5, 255)])
def test_encoder_decoded_values_every_sketch_shape(q, s, t, r):
    """Odd row counts, cells of two bytes (G > 255: q = 1024, r = 1), one group and 255
    groups, float32 and float64."""
    for dist in ("skewed", "normal", "equal"):
        for dtype in (torch.float32, torch.float64):
            idx, val = _message(6000, 100_000, q + s + r, dist, dtype)
            body, sent = ops.skcompress_encode_decoded(idx, val, 100_000, q=q, s=s, t=t, r=r)
            _, dv = ops.skcompress_decode(body, 100_000, 6000, dtype)
            assert sent.dtype == dtype and torch.equal(sent.view(torch.uint8), dv.view(torch.uint8))


def test_underestimates_only_over_many_random_messages():
    """Thousands of random messages of every shape: never a sign flip, never a larger bucket."""
    r = _rng(7)
    for trial in range(1500):
        N = int(r.integers(1, 5000))
        entries = int(r.integers(0, min(N, 400) + 1))
        dist = ["normal", "skewed", "positive", "equal", "tiny"][trial % 5]
        q = int(r.choice([2, 4, 16, 64, 256]))
        groups = int(r.integers(1, q // 2 + 1))
        idx, val = _message(entries, N, trial, dist)
        body = ops.skcompress_encode(idx, val, N, q=q, s=int(r.integers(1, 5)), t=float(r.uniform(0.05, 2)),
                                     r=min(groups, 255), index_codec=trial % 2)
        di, dv = ops.skcompress_decode(body, N, entries, torch.float32)
        assert torch.equal(di, idx)
        _check_values(val, dv, q, min(groups, 255))


def test_large_t_decodes_almost_every_bucket_exactly():
    idx, val = _message(20_000, 10 ** 6, 3, "normal")
    body = ops.skcompress_encode(idx, val, 10 ** 6, t=64.0, s=4)
    _, dv = ops.skcompress_decode(body, 10 ** 6, 20_000, torch.float32)
    b, sp, used = ops.skcompress_quantize(val, 256, 65536)
    sg = (val >= 0).long().numpy()
    lo, hi = sp.numpy()[sg, b.numpy()], sp.numpy()[sg, b.numpy() + 1]
    want = torch.from_numpy(lo + (hi - lo) * 0.5).float() * torch.where(val >= 0, 1.0, -1.0)
    assert (dv == want).float().mean() > 0.99


# ---------------------------------------------------------------- keys: exact sizes and choice

def _ref_delta_bits(keys, N, m, scheme):
    W = 32 if N <= 2 ** 32 else 64
    b = W // m
    d = [keys[0]] + [keys[i] - keys[i - 1] - 1 for i in range(1, len(keys))] if len(keys) else []
    c = [max(1, -(-max(1, x.bit_length()) // b)) for x in d]
    data = sum(ci * b for ci in c)
    if scheme == 0:
        return data + len(d) * int(math.log2(m))
    freq = [c.count(j + 1) for j in range(m)]
    return data + _ref_huffman_cost(freq) + 8 * m


def _ref_huffman_cost(freq):
    """Total bits of an optimal prefix code (sum of merged weights), one symbol: 1 bit each."""
    import heapq
    f = [x for x in freq if x]
    if len(f) <= 1:
        return sum(f)
    heapq.heapify(f)
    cost = 0
    while len(f) > 1:
        a, b = heapq.heappop(f), heapq.heappop(f)
        cost += a + b
        heapq.heappush(f, a + b)
    return cost


KEY_SETS = {
    "dense_run": (list(range(100, 400)), 1000),
    "random": (sorted(_rng(3).choice(10 ** 6, 3000, replace=False).tolist()), 10 ** 6),
    "clustered": (sorted(set((_rng(4).integers(0, 50, 2000) * 20000 + _rng(5).integers(0, 30, 2000)).tolist())), 10 ** 6),
    "max_delta": ([0, 2 ** 31], 2 ** 31 + 1),           # a delta of 2^31 - 1
    "last_index": ([2 ** 32 - 1], 2 ** 32),
    "wide": ([5, 2 ** 40, 2 ** 62], 2 ** 63 - 1),
    "single": ([0], 1),
    "empty": ([], 7),
}


@pytest.mark.parametrize("name", sorted(KEY_SETS))
@pytest.mark.parametrize("m", [2, 4, 8, 16])
@pytest.mark.parametrize("scheme", [0, 1])
def test_delta_binary_exact_size_and_lossless(name, m, scheme):
    keys, N = KEY_SETS[name]
    idx = torch.tensor(keys, dtype=torch.int64)
    val = torch.ones(len(keys))
    body = ops.skcompress_encode(idx, val, N, index_codec=1, value_codec=0, m=m, prefix=1 + scheme)
    bits = _ref_delta_bits(keys, N, m, scheme)
    table = m if scheme else 0
    huff_table_bits = 8 * m if scheme else 0
    assert body.numel() == 8 + 2 + table + 8 + -(-(bits - huff_table_bits) // 8) + 4 * len(keys)
    di, dv = ops.skcompress_decode(body, N, len(keys), torch.float32)
    assert di.tolist() == keys and torch.equal(dv, val)


@pytest.mark.parametrize("name", sorted(KEY_SETS))
def test_auto_picks_the_smallest_scheme(name):
    keys, N = KEY_SETS[name]
    idx = torch.tensor(keys, dtype=torch.int64)
    val = torch.ones(len(keys))
    auto = ops.skcompress_encode(idx, val, N, index_codec=1, value_codec=0).numel()
    best = min(_ref_delta_bits(keys, N, m, s) for m in (2, 4, 8, 16) for s in (0, 1))
    sizes = [ops.skcompress_encode(idx, val, N, index_codec=1, value_codec=0, m=m, prefix=p).numel()
             for m in (2, 4, 8, 16) for p in (1, 2)]
    assert auto == min(sizes)
    # the chosen scheme's bit count (table included) is the reference minimum
    assert auto >= 8 + 2 + 8 + best // 8 + 4 * len(keys)


def _ref_stream_codes(keys, N, m):
    """Per key its prefix value (c - 1) and data bits (c * b), each stream's first key from -1:
    one stream below 8192 keys, else two (the first n // 2 keys, then the rest)."""
    W = 32 if N <= 2 ** 32 else 64
    b = W // m
    n = len(keys)
    starts = [0, n // 2] if n >= 8192 else [0]
    codes = []
    for s, a in enumerate(starts):
        e = starts[s + 1] if s + 1 < len(starts) else n
        prev = -1
        stream = []
        for k in keys[a:e]:
            c = max(1, -(-max(1, (k - prev - 1).bit_length()) // b))
            stream.append((c - 1, c * b))
            prev = k
        codes.append(stream)
    return codes


@pytest.mark.parametrize("n", [8191, 8192, 20001])
def test_delta_binary_two_streams_from_8192_keys(n):
    """Sections of 8192 keys or more are two streams, each from an absolute key: the size is
    the smallest scheme's, counted per stream (each zero-padded, each with its u64 bit count)."""
    N = 50 * n
    keys = sorted(_rng(n).choice(N, n, replace=False).tolist())
    idx = torch.tensor(keys, dtype=torch.int64)
    val = torch.ones(n)
    codes = _ref_stream_codes(keys, N, 2)   # the stream split does not depend on m
    best = None
    for m in (2, 4, 8, 16):
        streams = _ref_stream_codes(keys, N, m)
        for scheme in (0, 1):
            body = ops.skcompress_encode(idx, val, N, index_codec=1, value_codec=0, m=m, prefix=1 + scheme)
            if scheme == 0:
                lens = [int(math.log2(m))] * m
                table = 0
            else:   # the body's code lengths (optimal ones tie differently), checked optimal
                freq = [sum(1 for st in streams for p, _ in st if p == j) for j in range(m)]
                lens = body[10:10 + m].tolist()
                assert sum(f * ln for f, ln in zip(freq, lens)) == _ref_huffman_cost(freq)
                table = m
            size = sum(-(-sum(lens[p] + d for p, d in st) // 8) for st in streams)
            total = 8 + 2 + table + 8 * len(streams) + size + 4 * n
            best = total if best is None else min(best, total)
            assert body.numel() == total, (m, scheme)
            di, dv = ops.skcompress_decode(body, N, n, torch.float32)
            assert di.tolist() == keys
    assert len(codes) == (2 if n >= 8192 else 1)
    assert ops.skcompress_encode(idx, val, N, index_codec=1, value_codec=0).numel() == best


def test_one_symbol_and_all_equal_values():
    idx = torch.arange(0, 5000)
    val = torch.full((5000,), 3.0)
    body = ops.skcompress_encode(idx, val, 5000, index_codec=1, value_codec=1, prefix=2)
    di, dv = ops.skcompress_decode(body, 5000, 5000, torch.float32)
    assert torch.equal(di, idx) and torch.equal(dv, val)  # one bucket of width 0: exact


# ---------------------------------------------------------------- bad arguments, non-finite

@pytest.mark.parametrize("kw", [dict(q=3), dict(q=0), dict(q=8192), dict(s=0), dict(s=17), dict(t=0.0),
                                dict(t=65.0), dict(t=float("nan")), dict(r=0), dict(r=129), dict(m=3),
                                dict(prefix=3), dict(index_codec=2), dict(value_codec=5)])
def test_bad_options_raise_value_error(kw):
    with pytest.raises(ValueError):
        ops.skcompress_encode(torch.arange(3), torch.ones(3), 10, **kw)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_values_are_rejected_by_the_lossy_codec(bad):
    with pytest.raises(ValueError, match="NaN"):
        ops.skcompress_encode(torch.arange(3), torch.tensor([1.0, bad, 2.0]), 10)


@pytest.mark.parametrize("idx,N", [([3, 2], 10), ([1, 1], 10), ([-1], 10), ([10], 10)])
def test_bad_indices_raise_value_error(idx, N):
    with pytest.raises(ValueError):
        ops.skcompress_encode(torch.tensor(idx), torch.ones(len(idx)), N)


# ---------------------------------------------------------------- malformed bodies

def _body(index_codec=1, value_codec=1, n_entries=200, N=10_000, seed=0, **kw):
    idx, val = _message(n_entries, N, seed, "skewed")
    return ops.skcompress_encode(idx, val, N, index_codec=index_codec, value_codec=value_codec, **kw), N, n_entries


def _varint(b, off):
    """(value, next offset) of the LEB128 varint at b[off]."""
    value, shift = 0, 0
    while True:
        byte = int(b[off])
        value |= (byte & 0x7F) << shift
        off += 1
        shift += 7
        if not byte & 0x80:
            return value, off


def _layout(body):
    """Offsets of the sketch body's fields (value codec 1), parsed here from the documented
    layout: [8-byte head][u32 B][u16 G][u8 s][u8 r][u32 nb_neg][u32 nb_pos][means]
    [2r x (varint n_l, varint cols_l)][u8 id scheme][2r id code lengths if Huffman][u64 id bits]
    [ids][G cell code lengths][u64 cell bits][cells][keys]."""
    b = body.numpy()
    B = int(b[8:12].view("<u4")[0]); G = int(b[12:14].view("<u2")[0]); s = int(b[14]); r = int(b[15])
    nb = b[16:24].view("<u4").astype(int)
    means = 24
    lists = means + 4 * int(nb.sum())
    at, n_l, cols, list_at = lists, [], [], []
    for _ in range(2 * r):
        list_at.append(at)
        v, at = _varint(b, at)
        n_l.append(v)
        v, at = _varint(b, at)
        cols.append(v)
    id_scheme = at
    id_table = at + 1 if b[at] else None
    id_bits_at = at + 1 + (2 * r if b[at] else 0)
    id_bits = _get64(body, id_bits_at)
    ids = id_bits_at + 8
    table = ids + (id_bits + 7) // 8
    cbits = table + G
    cells = cbits + 8
    keys = cells + (_get64(body, cbits) + 7) // 8
    return dict(B=B, G=G, s=s, r=r, nb=nb, means=means, lists=lists, list_at=list_at, n_l=n_l, cols=cols,
                id_scheme=id_scheme, id_table=id_table, id_bits=id_bits_at, ids=ids, table=table, cbits=cbits,
                cells=cells, keys=keys)


def _get64(b, off):
    return int.from_bytes(bytes(b[off:off + 8].tolist()), "little")


def _set64(b, off, v):
    b[off:off + 8] = torch.tensor(list(int(v).to_bytes(8, "little")), dtype=torch.uint8)


def _mutations():
    out = []

    def add(name, field, fn, **kw):
        out.append((name, field, fn, kw))

    def setb(off, v):
        def f(b, L):
            b[off if off >= 0 else b.numel() + off] = v
            return b
        return f

    add("index codec", "codec", setb(0, 7))
    add("value codec", "codec", setb(1, 9))
    add("unexpected codec", "codec", lambda b, L: (b.__setitem__(0, 0), b)[1])
    add("revision", "revision", setb(2, 1))
    add("reserved", "reserved", setb(5, 1))
    add("truncated", None, lambda b, L: b[:-1].clone())
    add("extra byte", None, lambda b, L: torch.cat([b, torch.zeros(1, dtype=torch.uint8)]))
    add("header only", "size|count", lambda b, L: b[:5].clone())
    add("rows zero", "params", setb(14, 0))
    add("groups zero", "params", setb(15, 0))
    add("group width", "params", lambda b, L: (b.__setitem__(12, b[12] + 1), b)[1])
    add("buckets", "buckets", lambda b, L: (b[16:20].view(torch.int32).fill_(100000), b)[1])
    add("mean nan", "means", lambda b, L: (b[L["means"]:L["means"] + 4].view(torch.float32).fill_(float("nan")), b)[1])
    add("mean negative", "means", lambda b, L: (b[L["means"]:L["means"] + 4].view(torch.float32).fill_(-1.0), b)[1])
    add("means decreasing", "means",
        lambda b, L: (b[L["means"] + 4:L["means"] + 8].view(torch.float32).fill_(0.0),
                      b[L["means"]:L["means"] + 4].view(torch.float32).fill_(1e30), b)[2])
    # (the first list's varints are one byte each in this body: n_l and cols_l < 128)
    add("list size", "lists", lambda b, L: (b.__setitem__(L["lists"], b[L["lists"]] + 1), b)[1])
    add("list columns", "lists", lambda b, L: (b.__setitem__(L["lists"] + 1, 0), b)[1])
    add("list size overlong varint", "lists",
        lambda b, L: torch.cat([b[:L["lists"]], torch.tensor([int(b[L["lists"]]) | 0x80, 0], dtype=torch.uint8),
                                b[L["lists"] + 1:]]))
    add("id scheme", "code_table", lambda b, L: (b.__setitem__(L["id_scheme"], 2), b)[1])
    # a whole byte more: the padding check alone would not see it
    add("id bits", "padding", lambda b, L: (_set64(b, L["id_bits"], _get64(b, L["id_bits"]) + 8), b)[1])
    # a fixed-width id moved to another list: the lists' id counts no longer match n_l
    add("id of another list", "lists", lambda b, L: (b.__setitem__(L["ids"], int(b[L["ids"]]) ^ 0x10), b)[1])
    add("code table length", "code_table", lambda b, L: (b.__setitem__(L["table"], 16), b)[1])
    add("code table kraft", "code_table",
        lambda b, L: (b[L["table"]:L["table"] + L["G"]].fill_(0), b.__setitem__(L["table"], 2),
                      b.__setitem__(L["table"] + 1, 2), b)[3])
    add("cell bits", None, lambda b, L: (_set64(b, L["cbits"], _get64(b, L["cbits"]) + 1), b)[1])
    return out


@pytest.mark.parametrize("name,field,fn,kw", _mutations(), ids=[m[0] for m in _mutations()])
def test_malformed_sketch_body(name, field, fn, kw):
    body, N, count = _body()
    bad = fn(body.clone(), _layout(body))
    with pytest.raises(WireFormatError) as info:
        ops.skcompress_decode(bad, N, count, torch.float32, expect_index=1, expect_value=1)
    if field:
        assert any(f in str(info.value) for f in field.split("|")), str(info.value)


def test_malformed_keys_and_counts():
    # raw keys: order and range
    idx = torch.tensor([1, 5, 9])
    body = ops.skcompress_encode(idx, torch.ones(3), 10, index_codec=0, value_codec=0)
    for pos, v, field in [(12, 1, "index_order"), (8, 10, "index_range"), (16, 5, "index_order")]:
        bad = body.clone()
        bad[pos:pos + 4].view(torch.int32).fill_(v)
        with pytest.raises(WireFormatError, match=field):
            ops.skcompress_decode(bad, 10, 3, torch.float32)
    # delta keys: m, scheme, prefix beyond m, a delta past N, padding, bit count
    body = ops.skcompress_encode(idx, torch.ones(3), 10, index_codec=1, value_codec=0, m=4, prefix=1)
    for mutate, field in [(lambda b: b.__setitem__(8, 3), "prefix"), (lambda b: b.__setitem__(9, 2), "prefix"),
                          (lambda b: b.__setitem__(18, 0xFF), "index_range|prefix|code"),
                          (lambda b: _set64(b, 10, _get64(b, 10) - 1), "padding|code"),
                          (lambda b: _set64(b, 10, _get64(b, 10) + 9), "size|padding"),
                          (lambda b: _set64(b, 10, 10 ** 6), "size")]:
        bad = body.clone()
        mutate(bad)
        with pytest.raises(WireFormatError, match=field):
            ops.skcompress_decode(bad, 10, 3, torch.float32)
    with pytest.raises(WireFormatError, match="index_range"):
        ops.skcompress_decode(body, 6, 3, torch.float32)  # keys beyond a smaller N
    with pytest.raises(WireFormatError, match="count"):
        ops.skcompress_decode(body, 10, 10 ** 9, torch.float32)  # count the body cannot hold
    with pytest.raises(WireFormatError):
        ops.skcompress_decode(body, 10, 4, torch.float32)
    # padding bits set
    bad = body.clone()
    nbits = _get64(bad, 10)
    if nbits % 8:
        bad[18 + nbits // 8] |= 1
        with pytest.raises(WireFormatError, match="padding"):
            ops.skcompress_decode(bad, 10, 3, torch.float32)


def _with_lists(body, L, pairs):
    """The body with its list table (2r varint pairs) replaced by `pairs`."""
    table = bytearray()
    for n_l, cols in pairs:
        for v in (n_l, cols):
            while v >= 0x80:
                table.append(v & 0x7F | 0x80)
                v >>= 7
            table.append(v)
    return torch.cat([body[:L["lists"]], torch.tensor(list(table), dtype=torch.uint8), body[L["id_scheme"]:]])


def test_list_claims_and_cell_out_of_range():
    # a list of a sign without buckets: one positive bucket per group (q = 4, r = 2, G = 1), the
    # positive lists' keys claimed by the negative lists
    idx = torch.tensor([1, 2])
    body = ops.skcompress_encode(idx, torch.tensor([1.0, 2.0]), 10, index_codec=0, value_codec=1, q=4, r=2)
    L = _layout(body)
    assert L["G"] == 1 and list(L["nb"]) == [0, 2] and L["n_l"] == [0, 0, 1, 1]
    bad = _with_lists(body, L, [(1, L["cols"][2]), (1, L["cols"][3]), (0, 0), (0, 0)])
    # ... and the two list ids (fixed width, 2 bits: 2 and 3) now naming lists 0 and 1
    ids = _layout(bad)["ids"]
    assert int(body[L["ids"]]) == 0b10110000
    bad[ids] = 0b00010000
    with pytest.raises(WireFormatError, match="lists"):
        ops.skcompress_decode(bad, 10, 2, torch.float32)
    # a cell holding an offset past its list's buckets in use: q = 4, r = 1 (G = 2), one positive
    # value, so the positive list has one bucket (offsets < 1); a code table of both offsets and
    # the cell's code for offset 1
    body = ops.skcompress_encode(torch.tensor([3]), torch.tensor([1.5]), 10, index_codec=0, value_codec=1, q=4, r=1)
    L = _layout(body)
    assert L["G"] == 2 and list(L["nb"]) == [0, 1] and _get64(body, L["cbits"]) >= 1
    ok_values = ops.skcompress_decode(body, 10, 1, torch.float32)[1]
    assert ok_values.tolist() == [1.5]
    bad = body.clone()
    bad[L["table"]:L["table"] + 2] = torch.tensor([1, 1], dtype=torch.uint8)   # offsets 0 and 1: codes 0, 1
    cells = _get64(body, L["cbits"])
    bad[L["cells"]] = (0xFF << (8 - cells)) & 0xFF                          # every cell holds offset 1
    with pytest.raises(WireFormatError, match="cell"):
        ops.skcompress_decode(bad, 10, 1, torch.float32)


@pytest.mark.parametrize("index_codec,value_codec", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_random_corruption_never_crashes(index_codec, value_codec):
    """Flipped bytes: a WireFormatError, or a vector that is still a valid COO vector."""
    body, N, count = _body(index_codec, value_codec, n_entries=300, N=5000, seed=index_codec)
    r = _rng(11 + value_codec)
    for _ in range(400):
        bad = body.clone()
        for _ in range(int(r.integers(1, 4))):
            bad[int(r.integers(0, bad.numel()))] ^= int(r.integers(1, 256))
        try:
            di, dv = ops.skcompress_decode(bad, N, count, torch.float32)
        except WireFormatError:
            continue
        assert di.numel() == count and (di.numel() == 0 or (bool((di[1:] > di[:-1]).all()) and int(di[-1]) < N))


# ---------------------------------------------------------------- MinMaxSketch, exactly

_M64 = (1 << 64) - 1


def _ref_mix(z: int) -> int:
    """splitmix64's finaliser (the header's mix)."""
    z &= _M64
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _ref_col(key: int, row: int, cols: int) -> int:
    """One hash a pair of rows: the high half gives the even row's column, the low half the odd's."""
    h = _ref_mix(key ^ _ref_mix(0x5C0DE + row // 2))
    half = h >> 32 if row % 2 == 0 else h & 0xFFFFFFFF
    return (half * cols) >> 32


@pytest.mark.parametrize("seed,q,s,t,r", [(1, 256, 2, 0.2, 8), (2, 64, 3, 0.1, 2), (3, 16, 1, 0.3, 1)])
def test_minmax_sketch_decodes_exactly_min_insert_max_query(seed, q, s, t, r):
    """Section 4.2 / Appendix A.2 on one message, bucket for bucket: each (sign, group) list
    has s rows of cols cells (cols read from the body); a cell holds the least in-group offset
    of the keys hashed to it (Min on insert), a key decodes to the largest of its s cells (Max
    on query), i.e. to the mean of bucket group * G + that offset. Few columns per key, so
    collisions make the rule visible: the test checks first that the reference differs both
    from the true buckets and from the group floors, then that the decoder agrees exactly."""
    N, entries = 50_000, 3000
    idx, val = _message(entries, N, seed, "normal")
    body = ops.skcompress_encode(idx, val, N, index_codec=0, value_codec=1, q=q, s=s, t=t, r=r).numpy()
    _, dv = ops.skcompress_decode(torch.from_numpy(body.copy()), N, entries, torch.float32)
    v = val.double().numpy()
    bucket, splits, used = _ref_quantize(v, q)
    B = q // 2
    G = -(-B // r)
    # the body's list table: after the 8-byte head, [u32 B][u16 G][u8 s][u8 r], two u32 nb and
    # the nb_neg + nb_pos float32 means, 2r x [varint n_l][varint cols_l], negative groups first
    head = np.frombuffer(body[8:16].tobytes(), dtype=np.dtype([("B", "<u4"), ("G", "<u2"), ("s", "u1"), ("r", "u1")]))[0]
    assert (head["B"], head["G"], head["s"], head["r"]) == (B, G, s, r)
    nb = np.frombuffer(body[16:24].tobytes(), dtype="<u4")
    assert nb.tolist() == used
    at = 24 + 4 * int(nb.sum())
    table = []
    for _ in range(2 * r):
        n_l, at = _varint(body, at)
        cols, at = _varint(body, at)
        table.append((n_l, cols))
    sign = (v >= 0).astype(int)           # 0: negative, 1: non-negative (zeros count as positive)
    group, offset = bucket // G, bucket % G
    keys = idx.numpy()
    want_bucket = np.empty(entries, dtype=np.int64)
    for sg in (0, 1):
        for g in range(r):
            members = np.flatnonzero((sign == sg) & (group == g))
            n_l, cols = (int(x) for x in table[sg * r + g])
            assert n_l == members.size
            if n_l == 0:
                continue
            cells = np.full((s, cols), G, dtype=np.int64)
            for e in members:                                   # Min on insert
                for j in range(s):
                    c = _ref_col(int(keys[e]), j, cols)
                    cells[j, c] = min(cells[j, c], offset[e])
            for e in members:                                   # Max on query
                want_bucket[e] = g * G + max(cells[j, _ref_col(int(keys[e]), j, cols)] for j in range(s))
    assert (want_bucket != bucket).any(), "no collision: the case cannot tell the rule from exact decoding"
    assert (want_bucket != group * G).any(), "the case cannot tell the rule from the group floor"
    lo = splits[sign, want_bucket]
    hi = splits[sign, want_bucket + 1]
    means = torch.from_numpy((lo + hi) / 2).float().numpy()
    want = np.where(sign == 1, means, -means)
    assert np.array_equal(dv.numpy(), want), int((dv.numpy() != want).sum())
