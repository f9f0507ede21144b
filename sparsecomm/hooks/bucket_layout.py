"""The DDP hook's bucket layout: which parameters each of the hook's reducers reduces, in what
order, and the regrouping of DDP buckets that are not the layout's.

DDP reduces its initial bucket layout in its first iteration and rebuilds its buckets after it
(in the order gradients became ready); a fresh DDP -- after a restart -- does the same again.
Bucket membership and order decide the result of every position-dependent algorithm (spardl's
blocks, gssgd's hashes, even gloo's dense ring sums for P >= 3), so the hook does not follow
DDP's buckets blindly: it reduces every step in its *layout*, recorded in its state (per
bucket: parameter ordinals, offsets, size, dtype), with one reducer per layout bucket.

* The layout is DDP's initial one (the first iteration the state sees) for steps 0 and 1, and
  DDP's rebuilt one from step 2 (:data:`ADOPT_STEP`) on: it is recorded when first seen (step 1)
  and adopted once, at the start of step 2. A checkpoint taken after any step therefore knows
  the layout of the next step -- after step 1 the rebuild has not been seen, and the next step
  uses the initial layout; after step 2 it has.
* When DDP's buckets of an iteration are not the layout's (the step that sees the rebuild
  first; the first iteration after a restart, which is DDP's initial layout again), each DDP
  bucket's gradients are copied into the layout buckets' buffers, every layout bucket starts
  as soon as it is complete, in layout order (the same on every rank), and the averaged result
  is copied back; DDP's Future of a bucket completes when the last layout bucket covering it
  has. Otherwise each DDP bucket is its layout bucket, reduced in place at no extra cost.
* After a restart from a checkpoint taken after step 1, the rebuilt layout is unknown at step
  2, where it must already be used: that one iteration's buckets are held until its last
  bucket and then reduced in the (adopted) rebuilt layout.
* Adopting the rebuilt layout keeps every residual (the hook's part: residuals are cut per
  parameter and reassembled; a bucket equal to the old layout's bucket of the same index keeps
  its reducer).

Parameter ordinals are the order in which the layout first saw the parameters (DDP's initial
bucketing is deterministic, so they agree across ranks and across restarts). A parameter whose
shape or dtype differs from the layout's raises a ValueError (the model changed: build a new
state).

This module decides which layout bucket runs when and where its result goes; reducing one is
the hook's (the ``start`` and ``adopt`` callables :meth:`BucketLayout.route` is given).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from .bucket_worker import fail_future

__all__ = ["ADOPT_STEP", "BucketLayout", "Entry", "LayoutBucket"]

#: one parameter's place in a bucket: (parameter ordinal, offset, numel, shape)
Entry = tuple[int, int, int, torch.Size]
#: the first step reduced in DDP's rebuilt layout (see the module docstring)
ADOPT_STEP = 2
#: where a layout bucket's result goes: (DDP buffer, offset there, offset in the layout bucket, numel, DDP index)
Scatter = tuple[torch.Tensor, int, int, int, int]


class LayoutBucket:
    """One bucket of the hook's reduction layout: what its reducer reduces, in what order, and
    its treatment under a per-parameter policy (:mod:`sparsecomm.hooks.policy`; "" without one)."""

    __slots__ = ("entries", "numel", "dtype", "treatment")

    def __init__(self, entries: list[Entry], numel: int, dtype: torch.dtype, treatment: str = ""):
        self.entries = entries
        self.numel = numel
        self.dtype = dtype
        self.treatment = treatment

    def matches(self, entries: list[Entry], buffer: torch.Tensor) -> bool:
        return self.entries == entries and self.numel == buffer.numel() and self.dtype == buffer.dtype

    def to_state(self) -> dict[str, Any]:
        state = {"entries": [(o, off, n, tuple(shape)) for o, off, n, shape in self.entries], "numel": self.numel,
                 "dtype": self.dtype}
        if self.treatment:   # without a policy: the keys as before
            state["treatment"] = self.treatment
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "LayoutBucket":
        return cls([(int(o), int(off), int(n), torch.Size(shape)) for o, off, n, shape in state["entries"]],
                   int(state["numel"]), state["dtype"], str(state.get("treatment", "")))


def same_layout(a: list[LayoutBucket], b: list[LayoutBucket]) -> bool:
    return len(a) == len(b) and all(x.entries == y.entries and x.numel == y.numel and x.dtype == y.dtype
                                    and x.treatment == y.treatment for x, y in zip(a, b))


def split_by_treatment(bucket: LayoutBucket, treatment_of: dict[int, str]) -> list[LayoutBucket]:
    """``bucket`` (one DDP bucket) as layout buckets of one treatment each, in the order each
    treatment first appears (the same on every rank), each parameter's offset counted anew; a
    bucket of one treatment stays as it is (reduced in place, no copy)."""
    groups: dict[str, list[Entry]] = {}
    for entry in bucket.entries:
        groups.setdefault(treatment_of[entry[0]], []).append(entry)
    if len(groups) == 1:
        (treatment,) = groups
        return [LayoutBucket(bucket.entries, bucket.numel, bucket.dtype, treatment)]
    out = []
    for treatment, entries in groups.items():
        offset, placed = 0, []
        for ordinal, _, numel, shape in entries:
            placed.append((ordinal, offset, numel, shape))
            offset += numel
        out.append(LayoutBucket(placed, offset, bucket.dtype, treatment))
    return out


class _Regrouping:
    """Book-keeping of one backward pass whose DDP buckets differ from the layout."""

    __slots__ = ("step", "defer", "deferred", "next", "missing", "scatter", "waiting")

    def __init__(self, step: int, defer: bool = False):
        self.step = step    # the hook's step when the iteration began (warm-up or not)
        self.defer = defer  # hold every bucket until the last: this iteration's layout becomes the hook's
        self.deferred: list[tuple[int, torch.Tensor, list[Entry], torch.futures.Future]] = []
        self.next = 0       # the next layout bucket to start (they start in layout order on every rank)
        self.missing: dict[int, int] = {}   # layout bucket -> parameters not gathered yet
        self.scatter: dict[int, list[Scatter]] = {}   # layout bucket -> where its result goes
        # DDP bucket index -> [its Future, its buffer, layout buckets still running for it]
        self.waiting: dict[int, list[Any]] = {}


#: ``start(j, target, step, future, scatter)``: reduce layout bucket ``j`` held in ``target``
#: (averaged in place) at hook step ``step``, copy the result to ``scatter``, complete ``future``
Start = Callable[[int, torch.Tensor, int, torch.futures.Future, Any], None]


class BucketLayout:
    """The layout the hook reduces in (``buckets``), the rebuilt layout waiting for
    :data:`ADOPT_STEP` (``rebuilt``), and the routing of each DDP bucket through it."""

    def __init__(self, treat: Callable[[torch.Tensor], str] | None = None) -> None:
        #: a policy's treatment of a parameter ("" for all without one): DDP's buckets are split by it
        self.treat = treat
        #: ordinal -> treatment, decided when the parameter is first seen
        self.treatments: dict[int, str] = {}
        self.buckets: list[LayoutBucket] = []
        self.complete = False  # every bucket of the first iteration recorded
        self.final = False     # the layout is DDP's rebuilt one: never replaced again
        self.rebuilt: list[LayoutBucket] | None = None  # DDP's rebuilt layout, the hook's from ADOPT_STEP
        #: id(parameter) -> ordinal
        self.ordinals: dict[int, int] = {}
        #: DDP's buckets as last seen: bucket index -> [(param ordinal, offset, numel, shape)]
        self.ddp_buckets: dict[int, list[Entry]] = {}
        self._observed: list[LayoutBucket] = []  # DDP's buckets so far in this iteration
        self._seen = 0  # iterations since construction or load_state (DDP's first: its initial layout)
        self._recorded = 0  # DDP buckets of the first iteration recorded so far
        self._where: dict[int, tuple[int, int, int, torch.Size]] = {}  # ordinal -> (bucket, offset, numel, shape)
        self._buffers: dict[int, torch.Tensor] = {}  # layout bucket -> its gather buffer (off-layout DDP buckets)
        self._iteration: _Regrouping | None = None
        self._ended: _Regrouping | None = None  # the iteration whose last bucket arrived, for end_iteration
        #: DDP buckets that were not a bucket of the layout and went through its gather buffers
        #: (each costs one copy of its gradients in and one of the result out)
        self.regrouped_buckets = 0

    # -- the checkpoint's part ----------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        # These key names are the checkpoint's on-disk format (CHECKPOINT_VERSION): keep them.
        return {"layout": [bucket.to_state() for bucket in self.buckets] if self.complete else None,
                "layout_final": self.final,
                "next_layout": None if self.rebuilt is None else [bucket.to_state() for bucket in self.rebuilt]}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state`'s keys of a checkpoint; forget the gather buffers and any
        iteration in progress."""
        self._buffers.clear()
        self._iteration = None
        self.buckets, self._where, self.complete, self._recorded = [], {}, False, 0
        if state["layout"]:
            self._set([LayoutBucket.from_state(bucket) for bucket in state["layout"]])
        self.final = bool(state["layout_final"])
        self._seen = 0
        self.rebuilt = None if not state["next_layout"] else \
            [LayoutBucket.from_state(bucket) for bucket in state["next_layout"]]

    # -- changing the layout ------------------------------------------------------------------
    def _set(self, buckets: list[LayoutBucket]) -> None:
        self.buckets = list(buckets)
        self._where = {}
        for j, bucket in enumerate(buckets):
            self._place(j, bucket)
        self.complete = True

    def _place(self, j: int, bucket: LayoutBucket) -> None:
        for ordinal, offset, numel, shape in bucket.entries:
            self._where[ordinal] = (j, offset, numel, shape)
            self.treatments.setdefault(ordinal, bucket.treatment)

    def adopt(self, buckets: list[LayoutBucket]) -> set[int]:
        """Make ``buckets`` (DDP's rebuilt layout) the layout for good; return the indices of
        the buckets equal to the old layout's bucket of the same index (their reducers stay)."""
        old = self.buckets
        keep = {j for j, bucket in enumerate(buckets) if j < len(old) and same_layout([bucket], [old[j]])}
        self._buffers = {j: buf for j, buf in self._buffers.items() if j in keep}
        self._set(buckets)
        self.final, self.rebuilt = True, None
        return keep

    def entries_of(self, bucket: dist.GradBucket) -> list[Entry]:
        buffer = bucket.buffer()
        base, item = buffer.data_ptr(), buffer.element_size()
        entries = []
        for param, grad in zip(bucket.parameters(), bucket.gradients()):
            ordinal = self.ordinals.setdefault(id(param), len(self.ordinals))
            if ordinal not in self.treatments and self.treat is not None:
                self.treatments[ordinal] = self.treat(param)
            entries.append((ordinal, (grad.data_ptr() - base) // item, grad.numel(), param.shape))
        return entries

    # -- one DDP bucket -------------------------------------------------------------------------
    def route(self, bucket: dist.GradBucket, step: int, start: Start,
              adopt: Callable[[list[LayoutBucket]], None]) -> torch.futures.Future:
        """Route DDP bucket ``bucket`` of hook step ``step`` through the layout: ``start`` each
        layout bucket once complete, ``adopt`` (which calls :meth:`adopt`) a new layout when
        due. The Future completes with the bucket's average. After the last bucket of an
        iteration the caller counts the step and calls :meth:`end_iteration`."""
        index, buffer = bucket.index(), bucket.buffer()
        entries = self.entries_of(bucket)
        self.ddp_buckets[index] = entries
        if index == 0 or self._iteration is None:
            if self.rebuilt is not None and step >= ADOPT_STEP:
                adopt(self.rebuilt)
            # DDP's layout is settled (this is not its first iteration) but unknown at a step
            # that must already use it (a resume from a checkpoint after step 1): hold this
            # iteration's buckets until its layout is known, then adopt it
            defer = (self.complete and not self.final and self.rebuilt is None
                     and self._seen >= 1 and step >= ADOPT_STEP)
            self._iteration = _Regrouping(step, defer)
            self._observed = []
        it = self._iteration
        observed = split_by_treatment(LayoutBucket(entries, buffer.numel(), buffer.dtype),
                                      {entry[0]: self.treatments.get(entry[0], "") for entry in entries})
        self._observed += observed
        if not self.complete:  # the first backward this layout sees: DDP's buckets (split by treatment)
            if index != self._recorded:
                raise RuntimeError(f"sparsecomm: DDP bucket {index} arrived while recording bucket "
                                   f"{self._recorded} of the first iteration (buckets run in index order)")
            self._recorded += 1
            for layout_bucket in observed:
                self.buckets.append(layout_bucket)
                self._place(len(self.buckets) - 1, layout_bucket)
            if bucket.is_last():
                self._set(self.buckets)
        future: torch.futures.Future = torch.futures.Future()
        if it.defer:
            it.deferred.append((index, buffer, entries, future))
        else:
            self._dispatch(index, buffer, entries, it, future, start)
        if bucket.is_last():
            if it.defer:
                if not same_layout(self._observed, self.buckets):
                    adopt(self._observed)
                self.final = True
                for held_index, held, held_entries, held_future in it.deferred:   # in the layout now known
                    self._dispatch(held_index, held, held_entries, it, held_future, start)
            elif self.complete and not self.final and self.rebuilt is None and self._seen >= 1:
                # DDP's settled layout (it rebuilds after its first iteration, if at all)
                if same_layout(self._observed, self.buckets):
                    self.final = True
                else:
                    self.rebuilt = self._observed  # the layout from ADOPT_STEP on
            self._seen += 1
            self._iteration = None
            self._ended = it
        return future

    def _dispatch(self, index: int, buffer: torch.Tensor, entries: list[Entry], it: _Regrouping,
                  future: torch.futures.Future, start: Start) -> None:
        """DDP bucket ``index``: reduced in place when it is the next layout bucket, else
        gathered into the layout buckets' buffers."""
        j = it.next
        if j < len(self.buckets) and j not in it.missing and self.buckets[j].matches(entries, buffer):
            it.next += 1
            start(j, buffer, it.step, future, ())  # the layout's own bucket: reduced in place
            # later layout buckets an earlier DDP bucket completed in the gather buffers run now
            self._start_complete(it, start)
        else:
            self.regrouped_buckets += 1
            self._gather(index, buffer, entries, it, future, start)

    def end_iteration(self) -> None:
        """After the last DDP bucket of an iteration: a ValueError if its buckets lacked
        parameters of the layout (the model changed)."""
        it, self._ended = self._ended, None
        if it is not None and it.next != len(self.buckets):
            short = {j: it.missing.get(j, len(self.buckets[j].entries)) for j in range(it.next, len(self.buckets))}
            raise ValueError(f"sparsecomm: this iteration's DDP buckets lack parameters of the hook's recorded "
                             f"layout (recorded bucket: parameters missing = {short}): the model changed; "
                             "build a new DDPHookState (and drop its state_dict) for it")

    def _gather(self, index: int, buffer: torch.Tensor, entries: list[Entry], it: _Regrouping,
                future: torch.futures.Future, start: Start) -> None:
        """Copy a DDP bucket that is not the layout's into the layout buckets' buffers; start
        every layout bucket that is then complete, in layout order."""
        touched = set()
        for ordinal, offset, numel, shape in entries:
            where = self._where.get(ordinal)
            if where is None or where[2] != numel or where[3] != shape:
                raise ValueError(f"sparsecomm: DDP bucket {index} holds parameter {ordinal} (shape {tuple(shape)}), "
                                 "which the hook's recorded layout does not have with that shape: the model "
                                 "changed; build a new DDPHookState (and drop its state_dict) for it")
            j, layout_offset, _, _ = where
            if self.buckets[j].dtype != buffer.dtype:
                raise ValueError(f"sparsecomm: parameter {ordinal} is {buffer.dtype} in DDP bucket {index} but "
                                 f"{self.buckets[j].dtype} in the hook's recorded layout: the model changed")
            if j < it.next or it.missing.get(j) == 0:
                raise ValueError(f"sparsecomm: parameter {ordinal} reached the hook twice in one iteration")
            target = self._buffers.get(j)
            if target is None:
                target = self._buffers[j] = torch.zeros(self.buckets[j].numel, dtype=buffer.dtype,
                                                        device=buffer.device)
            target[layout_offset:layout_offset + numel].copy_(buffer[offset:offset + numel])
            it.missing[j] = it.missing.get(j, len(self.buckets[j].entries)) - 1
            it.scatter.setdefault(j, []).append((buffer, offset, layout_offset, numel, index))
            touched.add(j)
        it.waiting[index] = [future, buffer, len(touched)]
        if not touched:
            future.set_result(buffer)
        self._start_complete(it, start)

    def _start_complete(self, it: _Regrouping, start: Start) -> None:
        """Start every layout bucket from ``it.next`` on whose gather buffer is complete, in
        layout order (the same on every rank)."""
        while it.next < len(self.buckets) and it.missing.get(it.next) == 0:
            j = it.next
            it.next += 1
            scatter = it.scatter.pop(j)
            done: torch.futures.Future = torch.futures.Future()
            owners = sorted({entry[4] for entry in scatter})
            done.add_done_callback(lambda f, owners=owners, it=it: _settle(f, owners, it))
            start(j, self._buffers[j], it.step, done, scatter)


def _settle(done: torch.futures.Future, owners: list[int], it: _Regrouping) -> None:
    """A layout bucket finished: complete the DDP buckets it was the last one for, or fail
    them all with its exception (its own type, see ``fail_future``)."""
    try:
        done.wait()
    except BaseException as exc:  # noqa: BLE001 - handed on to DDP's Futures
        for owner in owners:
            future = it.waiting[owner][0]
            if not future.done():
                fail_future(future, exc)
        return
    for owner in owners:
        record = it.waiting[owner]
        record[2] -= 1
        if record[2] == 0 and not record[0].done():
            record[0].set_result(record[1])
