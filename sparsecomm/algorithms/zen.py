"""``zen``: the hash-balanced sparse allreduce of "ZEN: Empowering Distributed Training with
Sparsity-driven Data Synchronization" (Wang et al., OSDI 2025).

The observation it fixes: splitting the index space into P equal ranges (SparCML's split
all-gather, ``sparcml_split_allgather``; DenseStream; Ok-Topk's boundaries partly) puts most
non-zeros of a real gradient into the few ranges of its hot layers, and the owner of a hot
range sends and receives far more than the others. ZEN partitions by a *hash* of the index
instead, so every owner gets about k/P of every rank's selection wherever the non-zeros lie.

One call (after the local top-k, the same selection as ``topka``: fused with the gradient's
add; what is not selected stays in the residual):

1. *Partition*: the selected pairs are split by owner in one stable pass
   (:func:`sparsecomm.ops.zen_partition`; owner of index i: the hash class of its block
   ``i >> log2(block)``, ``fastrange(splitmix64(seed + block))``, :mod:`sparsecomm.ops._zen`).
2. *Push*: every rank sends each owner its pairs (COO, one round of ``exchange_var``); the
   owner adds the P lists in rank order (:func:`sparsecomm.ops.merge_add_many`: float32 sums
   for half types, rounded once), so every owner's sum has the same bits wherever it is read.
3. *Pull*: every owner's reduced pairs go to every rank (Bruck all-gather of variable-size
   blocks, :func:`sparsecomm.comm.collectives.bruck_allgather_var`), each in the form of
   fewest bytes for its fill (:mod:`sparsecomm.formats.zen`: an index list, a bitmap over the
   owner's hash class with the values, or the dense values of the class); every rank writes
   the P disjoint results into ``out``.

Lossless: ``out`` is exactly the sum of the ranks' selections (the reducer divides by P).

Options: ``seed`` (the hash's seed; every rank must use the same, as for every option),
``block`` (``"auto"``, the default: :func:`auto_block` of k and P; or a power of two: indices
hashed in blocks of ``block``, so a class is a list of whole blocks whose bitmap is cheap to
build and read; 1 is the paper's per-index hash),
``pull_form`` (``"auto"``: per message the fewest bytes; or one form for every message), and the
COO codecs (``index_codec``, ``value_codec``, :mod:`sparsecomm.formats.codec`; "SKCompress",
sections 4-5): every push message and the pull's index form go through the codec (the coded
index list's real length is what ``"auto"`` compares with the bitmap and dense forms, which stay
as they are). With a lossy value codec a sender keeps what its push messages did not carry, and
an owner whose pull is a coded index list keeps the error of its sum and uses the decoded values
itself, so every rank writes the same bits. ``traffic()`` counts the plain messages.

Cost per rank: one push round of P - 1 COO messages, then ceil(log2 P) rounds for the pull
blocks (each variable-size round doubled by a size round only where the Comm needs one:
:meth:`~sparsecomm.comm.base.Comm.sizes_take_a_round`); about 2 (P-1)/P k (c + s)
bytes sent when the selections barely overlap, balanced across ranks by the hash.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import ops
from ..comm.collectives import bruck_allgather_var
from ..formats.coo import coo_nbytes
from ..formats.header import index_dtype_for
from ..formats.zen import (PULL_FORMS, ZenClasses, choose_form, decode_pull, decode_push, encode_pull, pull_form_of,
                           pull_nbytes)
from ..options import Option
from ..traffic import IndexSets, Traffic
from .base import Algorithm, register

__all__ = ["Zen", "DEFAULT_SEED", "MAX_BLOCK", "AUTO_MAX_BLOCK", "BLOCKS_PER_OWNER", "auto_block"]

#: the hash's default seed (any fixed value: it only has to be the same on every rank)
DEFAULT_SEED = 0x5A454E
MAX_BLOCK = 1 << 30
#: the largest block ``"auto"`` chooses: a skipped block costs the bitmap codecs one hash, so
#: 64 indices per hash keep them near one read pass of the bitmap's 64-bit words
AUTO_MAX_BLOCK = 64
#: ``"auto"``'s balance floor: every owner gets at least this many blocks' worth of one rank's k
#: even when the k selected indices are one contiguous run (the worst layout for blocks)
BLOCKS_PER_OWNER = 128


def auto_block(k: int, parts: int) -> int:
    """The block of ``block="auto"``: the largest power of two up to :data:`AUTO_MAX_BLOCK`
    with ``k >= BLOCKS_PER_OWNER * parts * block`` (1 when none is).

    Why: the hash deals *blocks* to owners, so an owner's share of a selection that covers B
    blocks is binomial, about B / P +- sqrt(B / P) blocks; a real gradient's top-k sits in its
    few hot layers, and a coarse block leaves few blocks to deal (ResNet-20's top 0.1% at P = 8
    covered 12 blocks of 64 in all: the busiest owner received 2.2x the mean, docs/zen.md). With
    at least 128 blocks per owner in the contiguous worst case the spread is within about 1.1x
    for P up to 8. The block only needs to be large when the pull's class bitmaps pay (fill
    m / s above about 1/32, i.e. k large against N / P), and then k is large and so is the block;
    a small k gets a small block and a small class table (N / block <= 128 P / density)."""
    block = AUTO_MAX_BLOCK
    while block > 1 and k < BLOCKS_PER_OWNER * parts * block:
        block //= 2
    return block


def _block_ok(value: Any, options: Any) -> bool:
    if value == "auto":
        return True
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_BLOCK \
        and value & (value - 1) == 0


@register
class Zen(Algorithm):
    name = "zen"
    lossless = True
    fuses_add = True
    uses_coo_codec = True  # the push messages and the index form of the pull (module docstring)
    # the owner hash (ops/_zen.py) and the pull forms (formats/zen.py): ranks must share both
    wire_revision = "splitmix64-fastrange-blocks/pull-index-bitmap-dense"
    option_specs = {
        "seed": Option(DEFAULT_SEED, int, min=0, max=2**63 - 1, doc="the hash's seed, the same on every rank"),
        "block": Option("auto", (int, str), check=_block_ok,
                        what=f"'auto' or a power of two in 1..{MAX_BLOCK}", doc="indices hashed together"),
        "pull_form": Option("auto", str, choices=("auto",) + PULL_FORMS,
                            doc="the pull messages' form; auto: the fewest bytes per message"),
    }

    def __init__(self, comm, **options: Any):
        super().__init__(comm, **options)
        self._classes: ZenClasses | None = None

    def block_for(self, k: int, size: int) -> int:
        """The block this call hashes with: the option, or :func:`auto_block` of (k, P)."""
        block = self.options["block"]
        return auto_block(k, size) if block == "auto" else block

    def classes(self, n: int, size: int, block: int, device: torch.device) -> ZenClasses:
        """The hash classes of [0, n) among ``size`` owners (built once per n, block and device)."""
        c = self._classes
        if c is None or c.n != n or c.parts != size or c.block != block or c.device != device:
            c = self._classes = ZenClasses.build(n, size, self.options["seed"], block, device)
        return c

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        comm, n, rank, size = self.comm, acc.numel(), self.comm.rank, self.comm.size
        seed, block, dtype = self.options["seed"], self.block_for(k, size), acc.dtype
        with self.timed("select"):
            values, indices = self.select_topk(acc, k, grad, clear=True)
            classes = self.classes(n, size, block, acc.device)
            indices, values, counts = ops.zen_partition(indices, values, n, size, seed, block)
        cuts = np.concatenate([[0], np.cumsum(counts.tolist())]).tolist()
        peers = [j for j in range(size) if j != rank]
        codec = self.codec
        sends = []
        for j in peers:
            piece_i, piece_v = indices[cuts[j]:cuts[j + 1]], values[cuts[j]:cuts[j + 1]]
            message, sent = codec.encode(piece_i, piece_v, n, rank)
            if not codec.lossless:   # what the value codec did not carry stays in this rank's residual
                acc.index_copy_(0, piece_i, piece_v - sent)
            sends.append((j, message))
        received = dict(zip(peers, comm.exchange_var(sends, peers))) if peers else {}
        with self.timed("merge"):
            itype = index_dtype_for(n)
            lists = [(indices[cuts[rank]:cuts[rank + 1]].to(itype), values[cuts[rank]:cuts[rank + 1]]) if j == rank
                     else decode_push(received[j], classes=classes, value_dtype=dtype, receiver=rank, sender=j,
                                      codec=codec)
                     for j in range(size)]
            if size == 1:
                mine_i, mine_v = lists[0]
            else:
                mine_i, mine_v = ops.merge_add_many([x[0] for x in lists], [x[1] for x in lists], n)
            message = None
            if size > 1:   # mine_v becomes what every rank decodes (a lossy codec's values)
                message, mine_v = self._pull_message(mine_i, mine_v, classes, acc)
            form = pull_form_of(message) if message is not None else "index"
        blocks = bruck_allgather_var(comm, message) if size > 1 else [None]
        total, known = 0, size == 1 or form != "dense"
        with self.timed("scatter"):
            out.zero_()
            for j in range(size):  # the classes are disjoint: each owner's pairs written once
                if j == rank:
                    i, v = mine_i, mine_v
                else:
                    i, v = decode_pull(blocks[j], classes=classes, value_dtype=dtype, receiver=rank, sender=j,
                                       codec=codec)
                    known &= pull_form_of(blocks[j]) != "dense"  # a dense class carries its zeros
                ops.scatter_set_(out, i, v)
                total += i.numel()
        self.last_nnz = total if known else None

    def _pull_message(self, mine_i: torch.Tensor, mine_v: torch.Tensor, classes: ZenClasses,
                      acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(message, values)``: this owner's reduced pairs in the pull form of fewest bytes (or
        the forced one), and the values every rank will decode from it. With a codec the index
        form is the codec's message, whose real length is compared; a lossy value codec's error
        of the sum stays in the owner's residual."""
        rank, n, dtype, codec = self.comm.rank, classes.n, mine_v.dtype, self.codec
        m, s = mine_i.numel(), classes.sizes[rank]
        form = self.options["pull_form"]
        if codec.plain:
            if form == "auto":
                form = choose_form(m, s, n, dtype)
            return encode_pull(mine_i, mine_v, form, classes, rank), mine_v
        coded = sent = None
        if form in ("auto", "index"):
            coded, sent = codec.encode(mine_i, mine_v, n, rank)
        if form == "auto":   # the smallest of the coded index list and the plain bitmap and dense forms
            sizes = {"index": coded.numel(), "bitmap": pull_nbytes("bitmap", m, s, n, dtype),
                     "dense": pull_nbytes("dense", m, s, n, dtype)}
            form = min(PULL_FORMS, key=lambda f: (sizes[f], PULL_FORMS.index(f)))
        if form != "index":
            return encode_pull(mine_i, mine_v, form, classes, rank), mine_v
        if not codec.lossless:
            acc.index_add_(0, mine_i, mine_v - sent)
        return coded, sent

    traffic_model = "set-based"
    traffic_needs_sets = True

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets, dtype: torch.dtype = torch.float32,
                **options: Any) -> Traffic:
        """The push round and the pull all-gather, sizes from the ranks' index sets (hashed at the
        sets' length: exact when the sets are at N, ``scale`` 1)."""
        opts = {key: options.get(key, spec.default) for key, spec in cls.option_specs.items()}
        seed, form = opts["seed"], opts["pull_form"]
        t = Traffic(P)
        if P == 1:
            return t
        n = sets.n
        # the sets' k at their length n: auto's block for it keeps the blocks per owner of (N, k)
        block = auto_block(max(len(x) for x in sets.sets), P) if opts["block"] == "auto" else opts["block"]
        classes = ZenClasses.build(n, P, seed, block)
        pieces = []   # pieces[r][c]: rank r's indices of class c
        for r in range(P):
            idx = torch.as_tensor(np.asarray(sets.sets[r], dtype=np.int64), device="cpu")
            got, _, counts = ops.zen_partition(idx, torch.zeros(idx.numel(), device="cpu"), n, P, seed, block)
            cuts = np.concatenate([[0], np.cumsum(counts.tolist())]).tolist()
            pieces.append([got[cuts[c]:cuts[c + 1]].numpy() for c in range(P)])
        src, dst, nb = [], [], []
        for r in range(P):
            for c in range(P):
                if c != r:
                    src.append(r)
                    dst.append(c)
                    nb.append(coo_nbytes(sets.count(pieces[r][c]), N, dtype))
        t.var_round(src, dst, nb)
        sizes = []
        for c in range(P):
            m = sets.count(np.unique(np.concatenate([pieces[r][c] for r in range(P)])))
            s = sets.count(classes.sizes[c])
            f = choose_form(m, s, N, dtype) if form == "auto" else form
            sizes.append(pull_nbytes(f, m, s, N, dtype))
        t.bruck_allgather(range(P), sizes, var=True)
        return t
