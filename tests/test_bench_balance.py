"""The balance benchmark (`python -m sparsecomm.bench balance`): its per-rank, per-phase byte
counts against the reducer's own per-call counts, its summary against max/mean computed here,
its rank gradients on a real task, and the balance it reports for zen and for the range split
on a gradient with one hot layer."""
from __future__ import annotations

import torch

import sparsecomm as sc
from sparsecomm.bench import balance
from sparsecomm.comm import simulate

P, N, HOT, DENSITY = 4, 1 << 16, 1 << 14, 0.01


def _hot_layer_gradients(seed: int = 3) -> list[list[torch.Tensor]]:
    """Two steps per rank: small noise everywhere, a first "layer" of HOT entries 100 times
    larger, so every rank's top 1 % lies in the first quarter of the index space."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(P):
        steps = []
        for _ in range(2):
            x = 0.01 * torch.randn(N, generator=g)
            x[:HOT] = torch.randn(HOT, generator=g)
            steps.append(x)
        out.append(steps)
    return out


def _reducer_bytes(grads, name, **options) -> list[tuple[int, int]]:
    """Per rank, (sent, received) of the second call, as the reducer itself counts it."""
    def rank(comm):
        red = sc.SparseAllreduce(name, DENSITY, comm=comm, **options)
        red(grads[comm.rank][0])
        red(grads[comm.rank][1])
        return red.last_stats["bytes_sent"], red.last_stats["bytes_recv"]
    return simulate(P, rank).results


def _max_over_mean(values) -> float:
    return max(values) * len(values) / sum(values)


def test_counts_match_the_reducer_and_zen_spreads_a_hot_layer_the_range_split_does_not():
    grads = _hot_layer_gradients()
    ratios = {}
    for spec, name, options in (("zen", "zen", {}), ("sparcml_split_allgather", "sparcml_split_allgather", {}),
                                ("zen:block=1", "zen", {"block": 1})):
        per_rank = balance.measure(grads, spec, DENSITY)
        sent = [sum(v[0] for v in r.values()) for r in per_rank]
        received = [sum(v[1] for v in r.values()) for r in per_rank]
        assert list(zip(sent, received)) == _reducer_bytes(grads, name, **options), spec
        for phase in {ph for r in per_rank for ph in r}:   # every phase's messages arrive somewhere
            assert sum(r.get(phase, [0, 0])[0] for r in per_rank) == sum(r.get(phase, [0, 0])[1] for r in per_rank)
        summary = balance.summarize(per_rank)
        assert summary["received"]["max"] == max(received)
        assert abs(summary["received"]["max_over_mean"] - _max_over_mean(received)) < 1e-12
        assert abs(summary["sent"]["max_over_mean"] - _max_over_mean(sent)) < 1e-12
        ratios[spec] = _max_over_mean(received), _max_over_mean(sent), per_rank
    zen_received, zen_sent, zen_ranks = ratios["zen"]
    assert set(zen_ranks[0]) == {"reduce/exchange_var", "reduce/bruck_allgather_var"}  # push, then pull
    push = [r["reduce/exchange_var"][1] for r in zen_ranks]
    assert _max_over_mean(push) < 1.3, push   # 256 hot blocks of 64 hashed to 4 owners
    assert zen_received < 1.2 and zen_sent < 1.2, (zen_received, zen_sent)
    assert max(ratios["zen:block=1"][:2]) < 1.2
    # the range split: the first range's owner receives every rank's hot layer, then sends its sum to all
    _, split_sent, split_ranks = ratios["sparcml_split_allgather"]
    split_push = [r["_split_phase/exchange_var"][1] for r in split_ranks]
    assert _max_over_mean(split_push) > 3.0, split_push
    assert split_sent > 1.5 * zen_sent, (split_sent, zen_sent)


def test_rank_gradients_differ_by_shard_and_cover_the_model():
    grads, model = balance.rank_gradients("digits", 2, warmup=2)
    n = 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10   # the digits MLP 64-256-256-10
    assert "MLP 64-256-256-10" in model
    assert [len(g) for g in grads] == [2, 2]
    assert all(g.shape == (n,) and torch.isfinite(g).all() and g.abs().sum() > 0 for r in grads for g in r)
    assert not torch.equal(grads[0][1], grads[1][1])   # each rank its own shard
    assert not torch.equal(grads[0][0], grads[0][1])   # the model stepped between the two


def test_parse_algorithm():
    assert balance.parse_algorithm("zen") == ("zen", {})
    assert balance.parse_algorithm("zen:block=16,pull_form=bitmap") == ("zen", {"block": 16, "pull_form": "bitmap"})
