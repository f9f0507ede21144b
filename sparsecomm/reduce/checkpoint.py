"""What every sparsecomm checkpoint records so that it cannot be loaded wrongly.

A reducer's or the DDP hook's state is *per rank*: each rank's residual is what that rank did
not send, and auto's trial times are that rank's clock. A state loaded on another rank, or in a
run with another number of ranks, would be accepted by the arithmetic and silently drift from
the uninterrupted run. So each state records

* ``checkpoint_version``: the layout of the checkpoint itself (:data:`CHECKPOINT_VERSION`), kept
  apart from the wire format's ``FORMAT_VERSION``: messages and checkpoints change separately;
* ``rank`` and ``world_size``: whose state it is (None while the state has not met a process
  group: then it holds nothing per rank);
* ``fingerprint``: 63 bits that are the same on every rank of one save -- a hash of the
  configuration, the world size and the step (call count), never of anything per rank -- and
  differ between saves at different steps. ``load_state_dict`` hands it to the reducers
  (``SparseAllreduce.set_checkpoint_fingerprint``, 0 when fresh), whose first-call handshake compares it:
  ranks resumed from different saves, or some resumed and some fresh, raise the same error on
  every rank before any message whose size depends on the state. Two runs of one configuration
  saved at the same step have the same fingerprint (nothing run-specific is agreed without a
  collective, and ``state_dict()`` must stay local: users call it on some ranks only).

Version 1 is the first version with these fields. A state written before it (it carries the wire
``format_version`` and no ``checkpoint_version``) is refused with an error that says so: it
records no rank, so a rank-0-only save loaded everywhere could not be told apart from a
per-rank save.
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

import torch

#: the layout of sparsecomm's checkpoints (state_dict), independent of the wire format's version
CHECKPOINT_VERSION = 1

#: what to do, in every error about a state loaded on the wrong rank or world size
HOW_TO_SAVE = ("the state is per rank (each rank's residuals): save one file per rank, e.g. "
               "torch.save(state.state_dict(), f\"hook_rank{rank}.pt\") on every rank and load each rank's own "
               "file, or use torch.distributed.checkpoint (dcp.save({..., \"hook\": state}) / dcp.load), which "
               "keeps each rank's part apart")


def fingerprint(*parts: Any) -> int:
    """A nonzero 63-bit hash of ``parts`` (their ``repr``): equal on ranks holding equal parts."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") & ((1 << 63) - 1)) or 1


def check_version(state: Any, what: str) -> None:
    """Refuse anything but a checkpoint of this layout, saying what it is instead."""
    if not isinstance(state, dict):
        raise ValueError(f"{what}.load_state_dict expects the dict its state_dict() returned, got "
                         f"{type(state).__name__}")
    version = state.get("checkpoint_version")
    if version is None and "format_version" in state:
        raise ValueError(f"this {what} state_dict was written by an older sparsecomm (before checkpoints recorded "
                         "their rank and world size), so it cannot be checked against this rank: resume from a "
                         f"checkpoint saved by this version, or start this {what} fresh (its residuals, what the "
                         "ranks had not sent yet, are then dropped)")
    if version != CHECKPOINT_VERSION:
        raise ValueError(f"this {what} state_dict has checkpoint_version {version!r}; this sparsecomm reads "
                         f"version {CHECKPOINT_VERSION}: load it with the sparsecomm that wrote it")


def loaded_fingerprint(state: dict[str, Any]) -> int:
    """The ``fingerprint`` of a state being loaded, or a ValueError if it is not one."""
    mark = state.get("fingerprint")
    if type(mark) is not int or not 0 <= mark < 1 << 63:
        raise ValueError(f"state_dict's fingerprint must be an int in [0, 2**63), got {mark!r}")
    return mark


def check_world_size(what: str, saved_size: Any, size: int | None) -> None:
    """Refuse a state saved with another number of ranks (``size`` None: not known yet)."""
    if saved_size is not None and size is not None and int(saved_size) != size:
        raise ValueError(f"this {what} state_dict was saved by a run of {saved_size} ranks; this run has {size}. "
                         "A world-size change on resume is not supported: the residuals are per rank and cannot "
                         f"be re-split. Resume with {saved_size} ranks, or build the {what} fresh without loading "
                         "its state (the residuals, what the ranks had not sent yet, are dropped)")


def check_owner(what: str, saved_rank: Any, saved_size: Any, rank: int | None, size: int | None,
                per_rank: bool) -> None:
    """Refuse a state saved by another rank (when it holds per-rank data) or with another
    number of ranks. ``rank``/``size`` None: not known here yet (checked again when they are)."""
    check_world_size(what, saved_size, size)
    if per_rank and saved_rank is not None and rank is not None and int(saved_rank) != rank:
        raise ValueError(f"this {what} state_dict holds the state of rank {saved_rank} (of {saved_size}); this is "
                         f"rank {rank}. Loading it here would silently drift from the uninterrupted run: "
                         + HOW_TO_SAVE)


def pack_rank_part(what: str, local: dict[str, Any]) -> dict[str, Any]:
    """``{"sparsecomm": what, "checkpoint_version", "world_size", "fingerprint", "rank<r>": bytes}``:
    this rank's ``local`` state as ``torch.save`` bytes under a key of its own rank (``rank?``
    while unknown), so ``torch.distributed.checkpoint`` writes each rank's own and gives it back
    to that rank; the few keys beside it are the same on every rank."""
    buffer = io.BytesIO()
    torch.save(local, buffer)
    key = "rank?" if local["rank"] is None else f"rank{local['rank']}"
    return {"sparsecomm": what, "checkpoint_version": CHECKPOINT_VERSION,
            "world_size": local["world_size"], "fingerprint": local["fingerprint"], key: buffer.getvalue()}


def unpack_rank_part(what: str, packed: dict[str, Any], rank: int | None, size: int | None = None) -> dict[str, Any]:
    """Rank ``rank``'s local state out of :func:`pack_rank_part`'s dict (the only part, when
    there is one: its owner is checked by the caller), or the error naming whose it is. A save of
    another world size than ``size`` is refused first, as such (a rank added since has no part)."""
    check_version(packed, what)
    check_world_size(what, packed.get("world_size"), size)
    parts = {key: value for key, value in packed.items() if key.startswith("rank")}
    key = f"rank{rank}" if f"rank{rank}" in parts else ("rank?" if "rank?" in parts else None)
    if key is None and len(parts) == 1:
        # another rank's (refused by the owner check if it holds per-rank data), or, while this
        # rank is unknown, checked against the Comm's rank when it is built
        key = next(iter(parts))
    if key is None or not isinstance(parts[key], (bytes, bytearray)):
        raise ValueError(f"this {what} state_dict holds the parts {sorted(parts)}, none of them this "
                         f"rank's (rank {rank}): " + HOW_TO_SAVE)
    local = torch.load(io.BytesIO(parts[key]), weights_only=True)
    if not isinstance(local, dict):
        raise ValueError(f"this {what} state_dict's part {key} is not a state: {type(local).__name__}")
    return local


def gather_rank_parts(what: str, packed: dict[str, Any], comm) -> dict[str, Any]:
    """Every rank's :func:`pack_rank_part` dict merged at rank 0 of ``comm`` (collective), for
    frameworks that write one checkpoint file from rank 0 (Lightning's ``save_checkpoint``,
    Accelerate's ``save_state``) and hand that file to every rank on resume, where
    :func:`unpack_rank_part` picks the rank's own part. Rank 0 gets ``rank0`` ... ``rank<P-1>``;
    the other ranks get their own dict back (what they would have written).

    The parts travel as opaque bytes: rank 0 stores them and never decodes a peer's. Every
    rank first shares (world size, fingerprint): ranks of different saves (a state stepped more
    on some ranks) raise the same ValueError everywhere, before any part moves."""
    rank, size = comm.rank, comm.size
    mine = packed.get(f"rank{rank}")
    if not isinstance(mine, (bytes, bytearray)):
        raise ValueError(f"{what}: this state's part is not keyed by this rank ({rank}): "
                         f"build the Comm before gathering (keys: {sorted(packed)})")
    if size == 1:
        return packed
    scope = comm.new_scope(f"{what} checkpoint gather")
    with comm.call_scope(scope, agreed=lambda exc: isinstance(exc, ValueError)):
        header = torch.tensor([int(packed["world_size"]), int(packed["fingerprint"])], dtype=torch.int64)
        every = comm.allgather_small(header.to(comm.device)).cpu()
        if not bool((every == every[0]).all()):
            differing = [r for r in range(size) if not torch.equal(every[r], every[0])]
            raise ValueError(f"{what}: the ranks' states are of different saves (world size, fingerprint per "
                             f"rank: {every.tolist()}; ranks {differing} differ from rank 0): call the save at "
                             "the same point on every rank")
        if rank != 0:
            comm.exchange_var([(0, torch.frombuffer(bytearray(mine), dtype=torch.uint8).to(comm.device))], [])
            return packed
        received = comm.exchange_var([], list(range(1, size)))
    merged = dict(packed)
    for peer, payload in zip(range(1, size), received):
        merged[f"rank{peer}"] = payload.cpu().numpy().tobytes()
    return merged
