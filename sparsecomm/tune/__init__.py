"""The tuner: predicting a call's time from its message schedule and choosing what runs.

* :mod:`~sparsecomm.tune.costmodel`: every algorithm's bytes, rounds and alpha-beta time without
  running it, on one level or a cluster of nodes (``sparsecomm.costmodel`` is this module);
* :mod:`~sparsecomm.tune.two_level_schedule`: the message schedule of the reducer's two-level call;
* :mod:`~sparsecomm.tune.tables`: the candidates and the measured compute and codec costs;
* :mod:`~sparsecomm.tune.chooser`: the predicted-fastest algorithm, placement and shortlist;
* :mod:`~sparsecomm.tune.links`: the ping-pong and its alpha-beta fit per Comm, a cluster's two links;
* :mod:`~sparsecomm.tune.auto`: the ``auto`` algorithm, which runs the choice per tensor
  (registered when this package is imported, as ``import sparsecomm`` does).
"""

from .chooser import choose_algorithm, choose_layout, shortlist
from .costmodel import LAYOUTS, Prediction, cluster_traffic, predict
from .links import link_fit, measure_links, pingpong
from .tables import (CANDIDATES, CODEC_BASES, CODEC_COST, CODEC_VARIANTS, COMPUTE_NS, VARIANT_CODECS, compute_ns,
                     split_variant, variant_options, with_codec_variants)
from . import auto  # noqa: F401  (registers the "auto" algorithm)
from .auto import AutoAlgorithm

__all__ = ["choose_algorithm", "choose_layout", "shortlist", "LAYOUTS", "Prediction", "cluster_traffic", "predict",
           "link_fit", "measure_links", "pingpong", "CANDIDATES", "CODEC_BASES", "CODEC_COST", "CODEC_VARIANTS",
           "COMPUTE_NS", "VARIANT_CODECS", "compute_ns", "split_variant", "variant_options", "with_codec_variants",
           "AutoAlgorithm"]
