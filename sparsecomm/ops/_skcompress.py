"""SKCompress kernels ("SKCompress: compressing sparse and nonuniform gradient", sections
4-6, Appendix A): quantiles, sign-split quantile buckets, and the COO message codec
(grouped MinMaxSketch + Huffman for values, delta-binary keys with adaptive prefix).

The contracts, the hash and the byte layout are documented once, in
``csrc/include/sparsecomm/skcompress.h``. In short:

* :func:`skcompress_quantiles` -- ``nq + 1`` quantiles of ``x`` (the item at rank
  ``floor(j n / nq)``, then the maximum); exact (an O(n) radix select) when
  ``n <= exact_max`` -- by default at every size (:data:`EXACT_ALWAYS`) -- else from a
  deterministic mergeable compactor sketch (capacity :data:`SKETCH_K` per level) whose
  rank error is at most ``n * H / SKETCH_K`` with ``H`` the number of levels that
  compacted, ``H <= floor(log2(n / SKETCH_K)) + 1``.
* :func:`skcompress_quantize` -- the buckets the codec uses: ``q / 2`` per sign over the
  magnitudes (zeros count as positive), splits from the quantiles above.
* :func:`skcompress_encode` / :func:`skcompress_decode` -- one COO vector to a message body
  and back; :func:`skcompress_encode_decoded` also returns the values a receiver decodes
  (what a lossy sender keeps, without decoding its own body). Keys are lossless; with
  ``value_codec=1`` a value decodes to the mean of a
  bucket of the same sign that is never further from zero than its own (Min on insert,
  Max on query, a key's group fixed by its bucket). The decoder validates everything and
  raises :class:`sparsecomm.errors.WireFormatError`.

CPU only: the paper runs MinMaxSketch and Huffman coding on the CPU too (section 7.7);
tensors on other devices are copied to the CPU and back.
"""
from __future__ import annotations

import operator
from typing import Tuple

import torch

from ._errors import translating

__all__ = ["skcompress_quantiles", "skcompress_quantize", "skcompress_encode", "skcompress_encode_decoded",
           "skcompress_decode",
           "EXACT_ALWAYS", "SKC_REVISION", "SKETCH_K", "MAX_Q", "MAX_ROWS_SKC", "MAX_T", "INDEX_CODECS", "VALUE_CODECS", "PREFIXES"]

_ops = torch.ops.sparsecomm
SKETCH_K = 4096       # SC_SKC_SKETCH_K
EXACT_ALWAYS = 2 ** 63 - 1  # exact_max: exact quantiles at every size
SKC_REVISION = 2      # SC_SKC_REVISION: the body layout's revision (body byte 2)
MAX_Q = 4096          # SC_SKC_MAX_Q
MAX_ROWS_SKC = 16     # SC_SKC_MAX_ROWS
MAX_T = 64.0          # SC_SKC_MAX_T
INDEX_CODECS = {"none": 0, "delta_binary": 1}
VALUE_CODECS = {"none": 0, "skcompress": 1}
PREFIXES = {"auto": 0, "fixed": 1, "huffman": 2}


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t if t.device.type == "cpu" else t.cpu()


@translating
def skcompress_quantiles(x: torch.Tensor, nq: int, exact_max: int = EXACT_ALWAYS) -> torch.Tensor:
    """float64 tensor of ``nq + 1`` quantiles of the 1-D float tensor ``x`` (see module)."""
    return _ops.skcompress_quantiles(_cpu(x), operator.index(nq), operator.index(exact_max))


@translating
def skcompress_quantize(v: torch.Tensor, q: int = 256, exact_max: int = EXACT_ALWAYS
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(bucket int32[n], splits float64[2, q/2 + 1], used int64[2])``: row 0 of the splits is
    the negative sign, row 1 the positive; ``used[s]`` buckets of sign ``s`` are in use and
    bucket ``b`` spans ``splits[s, b] .. splits[s, b + 1]`` (magnitudes)."""
    return _ops.skcompress_quantize(_cpu(v), operator.index(q), operator.index(exact_max))


def _encode_args(idx, val, n, index_codec, value_codec, q, s, t, r, m, prefix, exact_max) -> tuple:
    """The encoders' schema arguments: tensors on the CPU, integers as integers, t a float."""
    return (_cpu(idx), _cpu(val), operator.index(n), operator.index(index_codec), operator.index(value_codec),
            operator.index(q), operator.index(s), float(t), operator.index(r), operator.index(m),
            operator.index(prefix), operator.index(exact_max))


@translating
def skcompress_encode(idx: torch.Tensor, val: torch.Tensor, n: int, *, index_codec: int = 1,
                      value_codec: int = 1, q: int = 256, s: int = 2, t: float = 0.2, r: int = 8,
                      m: int = 0, prefix: int = 0, exact_max: int = EXACT_ALWAYS) -> torch.Tensor:
    """The message body (uint8, on the CPU) of the COO vector ``(idx, val)`` of length ``n``.

    ``idx`` strictly ascending in ``[0, n)`` (int32/int64), ``val`` float32/float64 (finite
    when ``value_codec=1``). ``index_codec``: 0 raw, 1 delta-binary; ``value_codec``: 0 raw,
    1 SKCompress; ``q`` buckets in all (even, <= 4096), ``s`` sketch rows (1..16), ``t``
    columns per key of each group's sketch (0 < t <= 64), ``r`` groups per sign (1..q/2,
    <= 255), ``m`` 0 (choose) or 2/4/8/16, ``prefix`` 0 auto, 1 fixed, 2 Huffman.
    """
    return _ops.skcompress_encode(*_encode_args(idx, val, n, index_codec, value_codec, q, s, t, r, m, prefix,
                                                exact_max))


@translating
def skcompress_encode_decoded(idx: torch.Tensor, val: torch.Tensor, n: int, *, index_codec: int = 1,
                              value_codec: int = 1, q: int = 256, s: int = 2, t: float = 0.2, r: int = 8,
                              m: int = 0, prefix: int = 0, exact_max: int = EXACT_ALWAYS
                              ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(body, decoded)``: :func:`skcompress_encode`'s body, and the values (``val``'s dtype,
    on the CPU) that :func:`skcompress_decode` returns for it, bit for bit -- the encoder
    queries its own sketch, so a sender that keeps its error needs no decode."""
    return _ops.skcompress_encode_decoded(*_encode_args(idx, val, n, index_codec, value_codec, q, s, t, r, m,
                                                        prefix, exact_max))


@translating
def skcompress_decode(body: torch.Tensor, n: int, count: int, dtype: torch.dtype, *,
                      expect_index: int = -1, expect_value: int = -1) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(idx int64, val dtype)`` of a body holding ``count`` entries of a length-``n`` vector;
    ``expect_*``: the codecs the receiver expects (-1: any). Malformed bodies raise
    :class:`~sparsecomm.errors.WireFormatError` naming the field."""
    return _ops.skcompress_decode(_cpu(body), operator.index(n), operator.index(count), dtype,
                                  operator.index(expect_index), operator.index(expect_value))
