"""Benchmark tooling: ``python -m sparsecomm.bench {collectives,kernels,accuracy,phases,scale,links,balance}``.

Tooling, not library: the library (everything else under :mod:`sparsecomm` but
:mod:`sparsecomm.launch` and :mod:`sparsecomm.testing`) never imports this package
(tests/test_import_rules.py checks it). The command line is :mod:`sparsecomm.bench.cli`;
each subcommand is a module with a ``main(argv)``: :mod:`~sparsecomm.bench.collectives`,
:mod:`~sparsecomm.bench.kernels`, :mod:`~sparsecomm.bench.accuracy` (with its
:mod:`~sparsecomm.bench.tasks` and :mod:`~sparsecomm.bench.models`),
:mod:`~sparsecomm.bench.phases`, :mod:`~sparsecomm.bench.scale` and
:mod:`~sparsecomm.bench.linkcheck` (``links``: a cluster's links, under the user's launcher) and
:mod:`~sparsecomm.bench.balance` (bytes per rank and phase on real top-k gradients);
:mod:`~sparsecomm.bench.baselines` wraps PyTorch's own DDP hooks for comparison.
"""
