"""The hooks room: where sparsecomm meets a training framework's gradient reduction.

* :mod:`~sparsecomm.hooks.ddp`: :class:`DDPHookState`, :func:`ddp_hook` and :func:`register` for DDP;
* :mod:`~sparsecomm.hooks.fsdp`: :class:`FSDPHookState` and :func:`register_hook`, the inter-node
  step of FSDP2;
* :mod:`~sparsecomm.hooks.config`: what both states share (configuration, reducer factory,
  load checks, half-precision averaging, deferred owner check, close);
* :mod:`~sparsecomm.hooks.bucket_layout`: the DDP hook's own bucket layout (exact resume across
  DDP's bucket rebuild);
* :mod:`~sparsecomm.hooks.bucket_worker`: the background worker that overlaps buckets with backward;
* :mod:`~sparsecomm.hooks.policy`: :class:`Policy`, which parameters go dense or through another
  treatment.
"""

from .ddp import DDPHookState, ddp_hook, register
from . import fsdp
from .fsdp import FSDPHookState, register_hook
from .policy import Policy, Rule, Treatment

__all__ = ["DDPHookState", "ddp_hook", "register", "FSDPHookState", "register_hook", "fsdp", "Policy", "Rule",
           "Treatment"]
