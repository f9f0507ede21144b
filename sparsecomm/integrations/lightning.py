"""PyTorch Lightning: sparsecomm's DDP hook on every accelerator, its state in Lightning's checkpoints.

    import sparsecomm as sc
    from sparsecomm.integrations.lightning import SparseDDPStrategy

    strategy = SparseDDPStrategy(sc.DDPHookState("topka", density=0.01))
    trainer = lightning.Trainer(strategy=strategy, accelerator="cpu", devices=2)  # or "gpu"
    trainer.fit(model)                      # trainer.fit(model, ckpt_path=...) resumes exactly

Lightning's own ``DDPStrategy(ddp_comm_hook=...)`` registers a comm hook only on CUDA devices
and silently drops it elsewhere; and its checkpoints are written by rank 0 alone, which would
keep rank 0's residuals and lose every other rank's. :class:`SparseDDPStrategy` registers the
hook on any device (:func:`sparsecomm.register`) and, in every checkpoint that holds the
optimizer state (not ``save_weights_only``), stores the hook's state under ``"sparsecomm"`` with
every rank's part (:meth:`~sparsecomm.DDPHookState.gathered_state_dict`, a collective Lightning's
``save_checkpoint`` runs on every rank). ``trainer.fit(..., ckpt_path=...)`` gives each rank its
own part back, so the resumed run continues as the uninterrupted one would (error feedback
included). A checkpoint without the key (written by another strategy) resumes with a fresh
hook state and says so.

Works with ``lightning`` (``lightning.pytorch``) and, where only it is installed, the older
``pytorch_lightning`` package: pass the strategy to the Trainer of the same package.
"""

from __future__ import annotations

import warnings
from typing import Any

from .. import DDPHookState, register

try:
    from lightning.pytorch.strategies import DDPStrategy
    from lightning.pytorch.trainer.states import TrainerFn
except ImportError:  # the older package name
    try:
        from pytorch_lightning.strategies import DDPStrategy
        from pytorch_lightning.trainer.states import TrainerFn
    except ImportError as exc:
        raise ImportError("sparsecomm.integrations.lightning needs PyTorch Lightning: "
                          "pip install 'lightning>=2.2,<3' (it keeps your torch; in a sparsecomm checkout, "
                          "pip install '.[lightning]')") from exc

__all__ = ["SparseDDPStrategy", "CHECKPOINT_KEY"]

#: where the hook's state sits in a Lightning checkpoint
CHECKPOINT_KEY = "sparsecomm"


class SparseDDPStrategy(DDPStrategy):
    """Lightning's DDP strategy with sparsecomm's hook (``hook_state``) on every device type and
    the hook's state in the checkpoints. ``ddp_kwargs`` are :class:`DDPStrategy`'s (``timeout``,
    ``process_group_backend``, ``find_unused_parameters``, ``bucket_cap_mb``, ...); its own comm
    hook arguments are refused: the hook is sparsecomm's."""

    strategy_name = "sparsecomm_ddp"

    def __init__(self, hook_state: DDPHookState, **ddp_kwargs: Any) -> None:
        if not isinstance(hook_state, DDPHookState):
            raise TypeError(f"SparseDDPStrategy(hook_state): a sparsecomm.DDPHookState, got "
                            f"{type(hook_state).__name__} (e.g. sparsecomm.DDPHookState('topka', density=0.01))")
        taken = sorted(k for k in ("ddp_comm_state", "ddp_comm_hook", "ddp_comm_wrapper", "model_averaging_period")
                       if ddp_kwargs.get(k) is not None)
        if taken:
            raise ValueError(f"SparseDDPStrategy registers sparsecomm's hook itself; drop {taken} "
                             "(use lightning's DDPStrategy for another comm hook)")
        super().__init__(**ddp_kwargs)
        self.hook_state = hook_state

    def _register_ddp_hooks(self) -> None:
        # every device type: Lightning's DDPStrategy registers comm hooks on CUDA only
        register(self.model, self.hook_state)

    def setup_optimizers(self, trainer: Any) -> None:
        super().setup_optimizers(trainer)
        clash = self.hook_state.momentum_clash(self.optimizers)
        if clash is not None:
            warnings.warn(clash, UserWarning, stacklevel=2)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        # Lightning calls this on every rank and writes on rank 0: the gather is collective
        if "optimizer_states" in checkpoint:   # not a weights-only checkpoint
            checkpoint[CHECKPOINT_KEY] = self.hook_state.gathered_state_dict()
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: Any = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        module = self.lightning_module
        fitting = module is not None and module._trainer is not None and module.trainer.state.fn == TrainerFn.FITTING
        if fitting:   # validate/test/predict load weights only: the hook keeps its state
            saved = checkpoint.get(CHECKPOINT_KEY)
            if saved is None:
                warnings.warn(f"{checkpoint_path}: no sparsecomm hook state in this checkpoint (written by another "
                              "strategy, or with save_weights_only): the hook starts fresh, so its error feedback "
                              "restarts", UserWarning, stacklevel=2)
            else:
                self.hook_state.load_state_dict(saved)
        return checkpoint
