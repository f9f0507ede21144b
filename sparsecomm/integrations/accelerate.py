"""Hugging Face Accelerate: sparsecomm's DDP hook on a prepared model, saved by ``save_state``.

::

    import sparsecomm
    from sparsecomm.integrations.accelerate import register

    accelerator = Accelerator(cpu=True)            # or on GPUs: Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    state = register(accelerator, model, sparsecomm.DDPHookState("spardl", density=0.01))
    if resuming:
        accelerator.load_state(checkpoint_dir)     # after register: it restores the hook too
    ...
    accelerator.save_state(checkpoint_dir)         # on every process, as Accelerate asks

:func:`register` puts :func:`sparsecomm.ddp_hook` on the DistributedDataParallel model that
``accelerator.prepare`` returned (also inside ``torch.compile``'s wrapper, as with
``Accelerator(dynamo_backend=...)``) and registers a :class:`HookCheckpoint` with
``accelerator.register_for_checkpointing``. Accelerate calls every registered object's
``state_dict()`` on every process and writes ``custom_checkpoint_<i>.pkl`` from the main process
only; on ``load_state`` every process reads that one file. The hook's state is per rank (each
rank's residuals), so :class:`HookCheckpoint` hands Accelerate
:meth:`~sparsecomm.DDPHookState.gathered_state_dict` (every rank's part at rank 0, as opaque
bytes) and each rank's ``load_state_dict`` takes its own part back: training resumed in fresh
processes continues bit-identically to the uninterrupted run.

A 1-process run of the same script (``python train.py``: Accelerate leaves the module bare) has
nothing to reduce: the hook is not registered, :func:`sparsecomm.register` says so once (a
UserWarning), and the checkpoint still saves and loads. Gradient accumulation
(``accelerator.accumulate(model)``) skips DDP's reduction, and with it the hook, on the steps
that do not synchronize: the hook reduces once per optimizer step, and its ``step`` counts
those. Mixed precision (``mixed_precision="bf16"``) autocasts the forward pass; the
parameters, and so the buckets the hook reduces, stay float32.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

try:
    import accelerate
    from accelerate.utils import DistributedType
except ImportError as exc:   # the integration is optional: the core never imports this module
    raise ImportError("sparsecomm.integrations.accelerate needs Hugging Face Accelerate, which is not installed: "
                      "pip install 'accelerate>=1.0' (it keeps your torch; in a sparsecomm checkout, "
                      "pip install '.[accelerate]')") from exc

import torch

from .. import DDPHookState
from .. import register as register_ddp

__all__ = ["HookCheckpoint", "register"]

#: Accelerate's modes whose prepared model is not a DistributedDataParallel, and what to use instead
_NOT_DDP = {
    DistributedType.FSDP: "FSDP shards the gradients itself; for FSDP2 use sparsecomm.fsdp.register_hook(model, "
                          "sparsecomm.FSDPHookState(...))",
    DistributedType.DEEPSPEED: "DeepSpeed reduces the gradients inside its engine, which has no DDP comm hook",
    DistributedType.MEGATRON_LM: "Megatron-LM reduces the gradients inside its own model wrapper",
    DistributedType.XLA: "XLA reduces the gradients with its own collectives",
}


class HookCheckpoint:
    """What :func:`register` gives ``accelerator.register_for_checkpointing``: the hook's state
    as one object whose ``state_dict()`` is :meth:`DDPHookState.gathered_state_dict` (collective:
    Accelerate's ``save_state`` calls it on every process) and whose ``load_state_dict()`` is
    :meth:`DDPHookState.load_state_dict` (each rank takes its own part of the one file).

    Register it yourself (``accelerator.register_for_checkpointing(HookCheckpoint(state,
    accelerator))``) only where :func:`register` does not fit, e.g. a hook registered by hand."""

    def __init__(self, state: DDPHookState, accelerator: Any):
        if not isinstance(state, DDPHookState):
            raise TypeError(f"HookCheckpoint(state, accelerator): state must be a sparsecomm.DDPHookState, got "
                            f"{type(state).__name__}")
        self.state = state
        self.accelerator = accelerator

    def state_dict(self) -> dict[str, Any]:
        _check_one_writer(self.accelerator)   # before the collective: the same answer on every rank
        try:
            return self.state.gathered_state_dict()
        except TimeoutError as exc:   # the Comm's CommTimeoutError: its message, and the likely cause
            raise type(exc)(f"{exc} (saving the hook's state, which accelerator.save_state gathers from every "
                            "process: call save_state on every process, not only under `if "
                            "accelerator.is_main_process`)") from exc

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state.load_state_dict(state_dict)

    def __repr__(self) -> str:   # Accelerate logs the objects it saves by name
        return f"HookCheckpoint({self.state.algorithm}, density={self.state.density:g}, step={self.state.step})"


def register(accelerator: "accelerate.Accelerator", model: torch.nn.Module, state: DDPHookState) -> DDPHookState:
    """Register :func:`sparsecomm.ddp_hook` with ``state`` on ``model``, the model
    ``accelerator.prepare`` returned, and the hook's state for ``accelerator.save_state`` /
    ``load_state`` (:class:`HookCheckpoint`); return ``state`` (``state.step``,
    ``state.last_stats``: what the hook reduced).

    Call it after ``accelerator.prepare(model, ...)`` and before ``accelerator.load_state``,
    once per model, on every process, in the same order relative to other
    ``register_for_checkpointing`` calls in the saving and the resuming script (Accelerate
    matches the objects to its ``custom_checkpoint_<i>.pkl`` files by position).

    Raises ValueError when the launch and the Accelerator disagree (several processes started,
    e.g. by torchrun, but this Accelerator runs one: on a machine without GPUs
    ``Accelerator()`` needs ``cpu=True``, else every process trains alone), when
    ``save_on_each_node`` would write a partial file on several nodes, or when Accelerate already
    registers its own comm hook (``DistributedDataParallelKwargs(comm_hook=...)``); TypeError for
    FSDP, DeepSpeed, Megatron-LM and XLA runs, whose models take no DDP hook; and what
    :func:`sparsecomm.register` raises."""
    if not (hasattr(accelerator, "register_for_checkpointing") and hasattr(accelerator, "num_processes")):
        raise TypeError(f"register(accelerator, model, state): accelerator must be an accelerate.Accelerator, got "
                        f"{type(accelerator).__name__}")
    launched = _launched_processes()
    if launched > 1 and accelerator.num_processes == 1:
        raise ValueError(f"{launched} processes were launched (WORLD_SIZE={launched}) but this Accelerator runs 1 "
                         "process, so each process would train alone with nothing reduced: Accelerate found no "
                         "GPU and was not told to use the CPU. Build it with Accelerator(cpu=True), or launch "
                         "with accelerate launch --cpu")
    why_not = _NOT_DDP.get(accelerator.distributed_type)
    if why_not is not None:
        raise TypeError(f"sparsecomm's DDP hook needs Accelerate's DistributedDataParallel; this Accelerator runs "
                        f"{accelerator.distributed_type.value}: {why_not}")
    handler = getattr(accelerator, "ddp_handler", None)
    own_hook = getattr(handler, "comm_hook", None)
    if own_hook is not None and getattr(own_hook, "value", own_hook) != "no":
        raise ValueError(f"this Accelerator registers its own DDP comm hook ({getattr(own_hook, 'value', own_hook)}, "
                         "from DistributedDataParallelKwargs(comm_hook=...)) and a DDP model takes one hook: drop "
                         "comm_hook from the kwargs handler to use sparsecomm's")
    _check_one_writer(accelerator)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        register_ddp(model, state)
    for warning in said:   # said about the user's call, not this module's
        warnings.warn(warning.message, warning.category, stacklevel=2)
    clash = state.momentum_clash(getattr(accelerator, "_optimizers", ()))
    if clash is not None:
        warnings.warn(clash, UserWarning, stacklevel=2)
    accelerator.register_for_checkpointing(HookCheckpoint(state, accelerator))
    return state


def _launched_processes() -> int:
    """The number of processes the launcher started (torchrun's, Accelerate's or MPI's variable), 1 if none."""
    for name in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 1


def _check_one_writer(accelerator: Any) -> None:
    """Refuse ``save_on_each_node`` across several nodes: each node's first process would write
    the file, and only rank 0's holds every rank's part (the others hold their own), so on a
    shared file system the last writer wins and on resume most ranks would find no part of
    theirs. Decided from configuration alone, so every rank answers the same."""
    config = getattr(accelerator, "project_configuration", None)
    if not getattr(config, "save_on_each_node", False) or accelerator.num_processes == 1:
        return
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) == accelerator.num_processes:
        return   # one node: its first process is the main process, which writes every part
    raise ValueError("ProjectConfiguration(save_on_each_node=True) on several nodes: the hook's checkpoint holds "
                     "every rank's part only on rank 0, so each node's own file would miss its ranks' parts. Set "
                     "save_on_each_node=False (rank 0 writes one file, every rank reads it back), or save the hook "
                     "per rank yourself: torch.save(state.state_dict(), f\"hook_rank{rank}.pt\")")
