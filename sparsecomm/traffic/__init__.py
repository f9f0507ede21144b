"""Traffic of one allreduce call without running it: bytes and rounds of every rank, and its time.

Each algorithm writes its own message schedule as a classmethod ``traffic(P, N, k, sets,
dtype, **options)`` beside its ``reduce()`` (:mod:`sparsecomm.algorithms`); this module holds
what those share:

* :class:`Traffic`, the record they fill round by round (bytes sent and received and rounds
  per rank, the per-round cost) and its alpha-beta time, with the rounds every message schedule reuses
  (:meth:`Traffic.bruck_allgather`, :meth:`Traffic.allgather_int64`, and the variable-size
  :meth:`Traffic.var_round` and :meth:`Traffic.bruck_allgather_var`), recorded with their size
  rounds, which :meth:`Traffic.unsized` folds into the payloads' rounds for the Comms that
  send sizes along (gloo and the simulated world inside a reducer call, MPI's probes);
* :func:`fit_alpha_beta`, the inverse of :meth:`Traffic.time`: alpha and beta from measured
  message times;
* the ranks' selected index sets (:class:`IndexSets`) the set-based message schedules need, and a model
  of real gradients' sets (:func:`model_sets`, :func:`default_sets`) for when the real ones are
  not at hand.

It sizes messages with :mod:`sparsecomm.formats` and imports no algorithm.
"""

from .links import Links, fit_alpha_beta
from .record import UNNAMED_PEER, Traffic, stream_message_nbytes
from .sets import IndexSets, default_sets, model_sets, union_sorted

__all__ = ["Traffic", "Links", "IndexSets", "model_sets", "default_sets", "fit_alpha_beta", "union_sorted",
           "stream_message_nbytes", "UNNAMED_PEER"]
