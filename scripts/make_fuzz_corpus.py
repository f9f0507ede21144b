#!/usr/bin/env python3
"""Write the seed corpus of the libFuzzer targets (csrc/fuzz/fuzz_<target>.c) into
csrc/fuzz/corpus/<target>/: small valid messages and near-valid ones (one field, one
index, one padding byte or one size off), in the input format each target documents at
its top.

Plain struct packing, no torch and no sparsecomm import, so the corpus can be rebuilt on
any machine; the layouts are those of sparsecomm/formats (header.py, coo.py, stream.py, densestream.py),
and tests/test_wire.py checks that the Python encoders produce the same bytes.

    python scripts/make_fuzz_corpus.py          # rewrite csrc/fuzz/corpus
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "csrc", "fuzz", "corpus")

MAGIC = 0x4D435053
COO, DENSE, SIGNATURE, DENSE_BLOCKS = 1, 2, 3, 4
F32, F64, F16, BF16, I32, I64, U8 = 1, 2, 3, 4, 5, 6, 7
SIZE = {F32: 4, F64: 8, F16: 2, BF16: 2, I32: 4, I64: 8, U8: 1}
PACK = {F32: "<f", F64: "<d", I32: "<i", I64: "<q"}


def pad8(b: bytes) -> bytes:
    return b + bytes(-len(b) % 8)


def header(kind, vdt, idt, sender, n, count, *, magic=MAGIC, version=1, reserved=b"\0\0\0") -> bytes:
    return struct.pack("<IHBBB3sIQQ", magic, version, kind, vdt, idt, reserved, sender, n, count)


def index_code(n: int) -> int:
    return I32 if n < 2**31 else I64


def values(vdt: int, vals) -> bytes:
    if vdt in (F16, BF16):  # raw 16-bit patterns: float16 via struct 'e', bfloat16 = top half of f32
        if vdt == F16:
            return b"".join(struct.pack("<e", v) for v in vals)
        return b"".join(struct.pack("<f", v)[2:] for v in vals)
    return b"".join(struct.pack(PACK[vdt], v) for v in vals)


def indices(n: int, idx) -> bytes:
    code = index_code(n)
    return b"".join(struct.pack(PACK[code], i) for i in idx)


def coo(idx, vals, n, vdt=F32, sender=1, count=None, hdr=None) -> bytes:
    count = len(idx) if count is None else count
    h = hdr or header(COO, vdt, index_code(n), sender, n, count)
    return h + pad8(indices(n, idx)) + values(vdt, vals)


def stream_sparse(idx, vals, n, offset, vdt=F32, sender=1) -> bytes:
    return (header(COO, vdt, index_code(n), sender, n, len(idx)) + struct.pack("<q", offset)
            + pad8(indices(n, idx)) + pad8(values(vdt, vals)))


def stream_dense(vals, offset, vdt=F32, sender=1) -> bytes:
    n = len(vals)
    return header(DENSE, vdt, 0, sender, n, n) + struct.pack("<q", offset) + pad8(values(vdt, vals))


def qsgd(n, bits, bucket, offset=0, sender=1, levels=None, scales=None) -> bytes:
    nb = -(-n // bucket)
    s = (1 << (bits - 1)) - 1
    levels = [(i * 3) % (2 * s + 1) for i in range(n)] if levels is None else levels
    if bits == 8:
        packed = bytes(levels)
    else:
        packed = bytes((levels[i] | ((levels[i + 1] if i + 1 < n else 0) << 4)) for i in range(0, n, 2))
    scales = [1.0 + b for b in range(nb)] if scales is None else scales
    return (header(DENSE, U8, 0, sender, n, len(packed)) + struct.pack("<qii", offset, bucket, bits)
            + pad8(b"".join(struct.pack("<f", x) for x in scales)) + pad8(packed))


def ds_width(n: int) -> int:
    return max(1, (max(n - 1, 0).bit_length() + 7) // 8)


def densestream(starts, lengths, n, lo, hi, vdt=F32, sender=1, vals=None, width=None) -> bytes:
    """formats/densestream.py: header, [lo][hi][nvalues][width + 7 zero bytes], fields, values."""
    w = ds_width(n) if width is None else width
    nv = sum(lengths)
    vals = [float(1 + i % 5) for i in range(nv)] if vals is None else vals
    fields = b"".join(s.to_bytes(8, "little")[:w] for s in starts) + b"".join(
        (l - 1).to_bytes(8, "little")[:w] for l in lengths)
    return (header(DENSE_BLOCKS, vdt, 0, sender, n, len(starts)) + struct.pack("<qqqB7x", lo, hi, nv, w)
            + pad8(fields) + pad8(values(vdt, vals)))


def flip(msg: bytes, pos: int, value: int) -> bytes:
    b = bytearray(msg)
    b[pos] = value & 0xFF
    return bytes(b)


def header_seeds():
    for sel in (0, 0x3F ^ 0x3F, 0x01, 0x08):
        yield bytes([sel]) + header(COO, F32, I32, 3, 1000, 10)
    for kind, vdt, idt in ((DENSE, F64, 0), (SIGNATURE, U8, 0), (COO, F16, I32), (COO, BF16, I64)):
        yield b"\0" + header(kind, vdt, idt, 7, 2**31 + 5, 99)
    good = header(COO, F32, I32, 3, 1000, 10)
    yield b"\0" + header(COO, F32, I32, 3, 1000, 10, magic=0x4D435054)
    yield b"\0" + header(COO, F32, I32, 3, 1000, 10, version=2)
    yield b"\0" + header(4, F32, I32, 3, 1000, 10)
    yield b"\0" + header(COO, 8, I32, 3, 1000, 10)
    yield b"\0" + header(COO, F32, I32, 3, 1000, 10, reserved=b"\0\1\0")
    yield b"\0" + header(COO, F32, I32, 3, 2**64 - 1, 10)
    yield b"\0" + header(COO, F32, I32, 3, 1000, 2**63)
    yield b"\0" + good[:31]
    yield b"\0" + good + b"trailing"
    yield b"\0"


def coo_seeds():
    yield b"\x04" + coo([1, 5, 9], [1.0, -2.0, 3.5], 10)
    yield b"\x05" + coo([0, 1, 2, 3, 4], [0.5] * 5, 5, F64)
    yield b"\x06" + coo([2, 7, 30], [1.0, 2.0, 65504.0], 31, F16)
    yield b"\x07" + coo([3], [1e30], 4, BF16)
    yield b"\x04" + coo([], [], 100)
    yield b"\x04" + coo([0, 2**31 + 3, 2**40], [1.0, float("inf"), float("nan")], 2**41)
    yield b"\x04" + coo(list(range(0, 200, 3)), [float(i) for i in range(67)], 200, F32, sender=9)
    yield b"\x0c" + coo([1, 5, 9], [1.0, -2.0, 3.5], 10)                 # count expectation off
    yield b"\x04" + coo([1, 5, 5], [1.0, 2.0, 3.0], 10)                  # repeated index
    yield b"\x04" + coo([5, 1, 9], [1.0, 2.0, 3.0], 10)                  # unsorted
    yield b"\x04" + coo([1, 5, 10], [1.0, 2.0, 3.0], 10)                 # index == N
    yield b"\x04" + coo([-1, 5, 9], [1.0, 2.0, 3.0], 10)                 # negative
    yield b"\x04" + flip(coo([1, 5, 9], [1.0, 2.0, 3.0], 10), 44, 1)     # padding byte
    yield b"\x04" + coo([1, 5, 9], [1.0, 2.0, 3.0], 10)[:-1]             # one byte short
    yield b"\x04" + coo([1, 5, 9], [1.0, 2.0, 3.0], 10, count=4)         # count vs size
    yield b"\x04" + coo([1, 5], [1.0, 2.0], 10, hdr=header(COO, F32, I64, 1, 10, 2))  # index dtype


def coo_raw_seeds():
    def raw(sel, limit, vecs, ib=4, vb=4):
        out = bytes([sel]) + struct.pack("<H", limit) + bytes(len(i) for i, _ in vecs)
        for i, _ in vecs:
            out += b"".join(struct.pack("<i" if ib == 4 else "<q", x) for x in i)
        for _, v in vecs:
            out += b"".join(struct.pack("<f" if vb == 4 else "<d", x) for x in v)
        return out
    yield raw(0x08, 100, [([1, 5, 9], [1.0, 2.0, 3.0]), ([0, 5, 99], [4.0, 5.0, 6.0])])
    yield raw(0x18, 100, [([1, 5, 9], [1.0, 2.0, 3.0]), ([5], [1.0]), ([9, 10], [1.0, 2.0])])
    yield raw(0x08 | 0x03, 0xFFFF, [([1, 2], [1.0, 2.0]), ([2, 3], [3.0, 4.0])], ib=8, vb=8)
    yield raw(0x00, 10, [([3, 3, 3], [1.0, 2.0, 3.0])])                  # repeats: serial scatter
    yield raw(0x00, 10, [([9, 2, 4], [1.0, 2.0, 3.0])])                  # unsorted
    yield raw(0x00, 10, [([1, 10], [1.0, 2.0])])                         # out of range
    yield raw(0x80, 10, [([1, 2], [1.0, 2.0])])                          # overlap
    yield raw(0x08, 4, [([0, 1], [float("nan"), 1.0]), ([1], [float("inf")])])


def stream_seeds():
    yield b"\x04" + stream_sparse([3, 50], [1.0, 2.0], 100, 7)
    yield b"\x05" + stream_sparse([0, 1, 2], [1.0, 2.0, 3.0], 64, 0, F64)
    yield b"\x06" + stream_sparse([5], [1.5], 20, 100, F16)
    yield b"\x04" + stream_sparse([], [], 10, 3)
    yield b"\x04" + stream_dense([1.0, 2.0, 3.0, 4.0, 5.0], 7)
    yield b"\x05" + stream_dense([1.0, -2.0], 0, F64)
    yield b"\x04" + stream_dense([], 0)
    yield b"\x04" + stream_sparse([3, 50], [1.0, 2.0], 2**31 + 1, 7)      # int64 indices
    yield b"\x04" + stream_sparse([50, 3], [1.0, 2.0], 100, 7)           # unsorted
    yield b"\x04" + stream_sparse([3, 100], [1.0, 2.0], 100, 7)          # out of range
    yield b"\x04" + stream_sparse(list(range(60)), [1.0] * 60, 100, 7)   # past delta = 50
    yield b"\x04" + stream_sparse([3, 50], [1.0, 2.0], 100, -1)          # negative offset
    yield b"\x04" + flip(stream_dense([1.0, 2.0, 3.0], 7), 40 + 12, 9)   # value padding
    yield b"\x04" + stream_dense([1.0, 2.0, 3.0], 7)[:-8]                # short


def qsgd_seeds():
    yield b"\x00" + qsgd(9, 4, 6, offset=3)
    yield b"\x01" + qsgd(9, 8, 4, offset=0)
    yield b"\x02" + qsgd(16, 4, 16)
    yield b"\x00" + qsgd(1, 8, 1)
    yield b"\x00" + qsgd(0, 8, 3)
    yield b"\x00" + qsgd(9, 4, 5)                                        # odd bucket, 4 bits
    yield b"\x00" + qsgd(9, 4, 6, levels=[15] * 9)                       # level above 2s
    yield b"\x00" + qsgd(9, 8, 4, scales=[1.0, float("nan"), 2.0])       # NaN scale
    yield b"\x00" + qsgd(9, 8, 4, scales=[1.0, -1.0, 2.0])               # negative scale
    yield b"\x00" + flip(qsgd(9, 8, 4), 48 + 13, 1)                     # scale padding
    yield b"\x00" + flip(qsgd(9, 4, 6), 48 + 8 + 4, 0xF0)               # odd n: last nibble
    yield b"\x00" + flip(qsgd(9, 4, 6), 44, 5)                          # bits 5


def topk_seeds():
    def tk(sel, k, blocks, kpb, xs, fmt="<f"):  # sel | 0xE0: also the radix path
        return bytes([sel]) + struct.pack("<HHH", k, blocks, kpb) + b"".join(struct.pack(fmt, x) for x in xs)
    yield tk(0, 3, 2, 2, [1.0, -5.0, 3.0, 0.0, -0.0, 2.0, 7.0, -7.0])
    yield tk(1, 2, 3, 1, [1.0, 2.0, float("inf"), -float("inf")], "<d")
    yield tk(2, 4, 1, 4, [1.0, -1.0, 1.0, -1.0, 2.0, 0.5], "<e")
    yield tk(3, 5, 4, 2, [float(i % 5) for i in range(16)], "<e")
    yield tk(0, 2, 2, 1, [1.0, float("nan"), 3.0])
    yield tk(4, 100, 50, 3, [float((i * 37) % 11) - 5 for i in range(40)])
    yield tk(0, 0, 0, 0, [])
    yield tk(0xE0, 3, 2, 2, [1.0, -5.0, 3.0, 0.0, -0.0, 2.0, 7.0, -7.0])    # with the radix path
    yield tk(0xE3, 5, 4, 2, [float(i % 5) for i in range(16)], "<e")


def sketch_seeds():
    def sk(sel, rows, cols, seed, n, idx, vals, fmt="<f"):
        return (bytes([sel]) + struct.pack("<BHQH", rows, cols, seed, n) + bytes([len(idx)])
                + b"".join(struct.pack("<q", i) for i in idx) + b"".join(struct.pack(fmt, v) for v in vals))
    yield sk(0, 3, 64, 1, 40, [0, 5, 17, 39], [1.0, -2.0, 3.0, 4.0])
    yield sk(1, 5, 16, 7, 100, [99, 0, 0], [1.0, 1.0, 1.0], "<d")
    yield sk(2, 1, 1, 0, 16, [3], [float("nan")])
    yield sk(0, 0, 64, 1, 8, [1], [1.0])                                 # rows 0
    yield sk(0, 65, 64, 1, 8, [1], [1.0])                                # rows > max
    yield sk(0, 2, 0, 1, 8, [1], [1.0])                                  # cols 0
    yield sk(0, 2, 32, 1, 8, [8, -1], [1.0, 2.0])                        # out of range
    yield sk(3, 4, 1000, 123456789, 200, list(range(0, 200, 13)), [float(i) for i in range(16)])


def densestream_seeds():
    good = densestream([300, 310, 400], [5, 2, 100], 1000, 250, 500)
    yield b"\x01" + good                                                    # own expectations
    yield b"\x00" + densestream([0, 3], [2, 1], 8, 0, 8, F64)
    yield b"\x01" + densestream([5], [3], 20, 0, 20, F16, vals=[1.0, 0.0, -2.0])
    yield b"\x01" + densestream([5], [3], 20, 0, 20, BF16, vals=[1.0, 0.0, -2.0])
    yield b"\x00" + densestream([], [], 1, 0, 1)                              # N = 1, empty
    yield b"\x00" + densestream([0], [1], 1, 0, 1)
    yield b"\x00" + densestream([0], [70000], 70000, 0, 70000)                # one dense block, width 3
    yield b"\x03" + good                                                    # expectation off
    yield b"\x00" + densestream([310, 300, 400], [5, 2, 100], 1000, 250, 500) # unsorted
    yield b"\x00" + densestream([300, 302, 400], [5, 2, 100], 1000, 250, 500) # overlapping
    yield b"\x00" + densestream([300, 310, 450], [5, 2, 100], 1000, 250, 500) # past hi
    yield b"\x00" + densestream([300, 310, 450], [5, 2, 100], 500, 0, 500)    # past N
    yield b"\x00" + densestream([300], [5], 1000, 250, 500, width=3)          # bad width
    yield b"\x00" + flip(good, 58, 1)                                        # reserved byte
    yield b"\x00" + good[:-8]                                                 # short
    yield b"\x00" + flip(good, len(good) - 1, 1)                             # value padding
    yield b"\x04" + struct.pack("<HB", 20, 6) + bytes([0, 2, 5, 2, 9, 2])   # raw blocks: valid
    yield b"\x04" + struct.pack("<HB", 20, 6) + bytes([0, 2, 1, 2, 9, 2])   # raw: overlap
    yield b"\x04" + struct.pack("<HB", 10, 6) + bytes([0, 2, 5, 2, 9, 2])   # raw: past n
    yield b"\x04" + struct.pack("<HB", 20, 5) + bytes([0, 2, 5, 0, 9, 2])   # raw: empty block


def zen_seeds():
    """[u16 n][parts - 1][log2 block][seed][owner][bitmap]: lengths around the class's
    ceil(size / 8) (which the target's reference works out), all-zero and all-one bitmaps."""
    for n, parts, lb, seed, owner, nbytes in [(1000, 2, 0, 7, 1, 63), (1000, 2, 0, 7, 1, 62), (100, 0, 2, 1, 0, 13),
                                              (77, 4, 3, 9, 2, 2), (0, 0, 0, 0, 0, 0), (4099, 32, 6, 3, 5, 16)]:
        head = struct.pack("<HBBBB", n, parts, lb, seed, owner)
        yield head + bytes(nbytes)
        yield head + b"\xff" * nbytes


TARGETS = {
    "header": header_seeds,
    "coo": coo_seeds,
    "coo_raw": coo_raw_seeds,
    "stream": stream_seeds,
    "qsgd": qsgd_seeds,
    "topk": topk_seeds,
    "sketch": sketch_seeds,
    "densestream": densestream_seeds,
    "zen": zen_seeds,
}


def main() -> int:
    for target, seeds in TARGETS.items():
        d = os.path.join(OUT, target)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for i, data in enumerate(seeds()):
            name = f"seed-{i:02d}-{hashlib.sha1(data).hexdigest()[:10]}"
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{target}: {len(os.listdir(d))} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
