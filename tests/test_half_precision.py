"""Half-precision buckets in the DDP hook: the average is the float32 sum divided by P in
float32, rounded once to the bucket's dtype -- never the sum rounded to float16 first (2 ranks
with an fp16 gradient of 40000 would then give inf: 80000 > 65504).

Each rank holds one half-precision parameter whose gradient is a vector written here
(``loss = (w * c_r).sum()``, so the gradient is exactly ``c_r``), and the bucket goes once
through PyTorch's DDP with its default allreduce, and once through the sparsecomm hook with
every algorithm at density 1 (every entry let through, so the sum is exact) and with a
warm-up step (a plain dense allreduce with DDP's arithmetic: its result is DDP's). The values are chosen so that both arithmetics are
exact: the results must equal DDP's, bit for bit, and the hand-written expected averages --
except where DDP's own arithmetic overflows: 3 ranks at 65504 pre-divide to 21840 in float16
(65504 / 3 rounded), whose sum 65520 rounds to inf; dividing the float32 sum gives 65504.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import sparsecomm as sc
from sparsecomm.testing import spawn

ALGORITHMS = sc.algorithms.names()
#: algorithms whose messages carry quantized values (SKCompress's quantile buckets): at density 1
#: they are not exact, so for them the test checks what the half path must still give: finite
#: averages (no overflow before the division), never a sign flip, the same on every rank
QUANTIZED = {"skcompress"}
#: (P, dtype) -> {index: DDP's result} where DDP's pre-division overflows and ours does not
DDP_OVERFLOWS = {(3, torch.float16): {2: float("inf")}}

#: P -> dtype -> (per-rank gradient rows, the expected average), by hand
CASES = {
    2: {
        torch.float16: ([[40000.0, 65504.0, -40000.0, 40000.0, 1.0, 0.5, -65504.0],
                         [40000.0, 65504.0, -40000.0, 39936.0, 3.0, 0.5, -65504.0]],
                        [40000.0, 65504.0, -40000.0, 39968.0, 2.0, 0.5, -65504.0]),
        torch.bfloat16: ([[2.0 ** 120 * 3, -5.0, 1.0, 1.0e38, 39936.0],
                          [2.0 ** 120 * 3, -5.0, 3.0, 1.0e38, 39936.0]],
                         [2.0 ** 120 * 3, -5.0, 2.0, 1.0e38, 39936.0]),
    },
    3: {
        torch.float16: ([[60000.0, 60000.0, 65504.0, 3.0, -60000.0],
                         [60000.0, 60000.0, 65504.0, 3.0, -60000.0],
                         [60000.0, 59904.0, 65504.0, 3.0, -60000.0]],
                        [60000.0, 59968.0, 65504.0, 3.0, -60000.0]),   # DDP: inf at index 2
        torch.bfloat16: ([[2.0 ** 100 * 3, 6.0, 1.0e38], [2.0 ** 100 * 3, 6.0, 1.0e38], [2.0 ** 100 * 3, 6.0, 1.0e38]],
                         [2.0 ** 100 * 3, 6.0, 1.0e38]),
    },
}


class _Scale(nn.Module):
    def __init__(self, n: int, dtype: torch.dtype):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(n, dtype=dtype))

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return (self.w * c).sum()


def _averaged(c: torch.Tensor, hook_state: sc.DDPHookState | None, steps: int = 1) -> list[list[float]]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_Scale(c.numel(), c.dtype))
    if hook_state is not None:
        model.register_comm_hook(hook_state, sc.ddp_hook)
    grads = []
    for _ in range(steps):
        model.zero_grad()
        model(c).backward()
        grads.append(model.module.w.grad.float().tolist())
    return grads


def _half_rank(rank: int, world_size: int):
    results = {}
    for dtype, (rows, _) in CASES[world_size].items():
        c = torch.tensor(rows[rank], dtype=dtype)
        results[dtype, "ddp"] = _averaged(c, None)[0]
        for algorithm in ALGORITHMS:
            results[dtype, algorithm] = _averaged(c, sc.DDPHookState(algorithm, 1.0, async_comm=False))[0]
        warm, sparse = _averaged(c, sc.DDPHookState("topka", 1.0, warmup_steps=1), steps=2)
        results[dtype, "warm-up"], results[dtype, "topka after warm-up"] = warm, sparse
    return results


@pytest.mark.distributed
@pytest.mark.parametrize("size", [2, 3])
def test_half_bucket_average_matches_ddp_near_the_top_of_the_range(size):
    runs = spawn(_half_rank, size, timeout=180)
    for dtype, (rows, expected) in CASES[size].items():
        expected = torch.tensor(expected, dtype=dtype).float().tolist()   # the values as the dtype holds them
        ddp_expected = list(expected)
        for index, value in DDP_OVERFLOWS.get((size, dtype), {}).items():
            ddp_expected[index] = value
        for rank, results in enumerate(runs):
            assert results[dtype, "ddp"] == ddp_expected, (dtype, rank, results[dtype, "ddp"])
            # warm-up steps are DDP's own arithmetic (divide in the bucket's dtype, then sum)
            assert results[dtype, "warm-up"] == ddp_expected, (size, dtype, rank, results[dtype, "warm-up"])
            for how in [*ALGORITHMS, "topka after warm-up"]:
                got = results[dtype, how]
                if how in QUANTIZED:
                    assert got == runs[0][dtype, how], (size, dtype, how, rank, got)
                    assert all(abs(v) < float("inf") and v * e >= 0 for v, e in zip(got, expected)), \
                        (size, dtype, how, rank, got)
                else:
                    assert got == expected, (size, dtype, how, rank, got)


def test_the_fp16_case_overflows_when_rounded_before_dividing():
    """What the hook used to do (round the float32 sum to the bucket's dtype, then divide)
    gives inf for 2 ranks at 40000; dividing in float32 first gives 40000."""
    total = torch.tensor([40000.0, 40000.0], dtype=torch.float16).float().sum()
    assert total.to(torch.float16).div(2).item() == float("inf")
    assert total.div(2).to(torch.float16).item() == 40000.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reducer_hands_back_the_float32_sum_when_out_is_float32(dtype):
    """The reducer's side of the hook's arithmetic: out may be float32 for a half gradient and
    then receives the float32 sum, not rounded (simulated P = 2, density 1: exact)."""
    from sparsecomm.comm import simulate

    def fn(comm):
        grad = torch.tensor([40000.0, 1.0, -3.0], dtype=dtype)
        out = torch.empty(3, dtype=torch.float32)
        returned = sc.SparseAllreduce("topka", 1.0, comm=comm)(grad, out=out)
        return returned is out, out.tolist()

    for same, values in simulate(2, fn).results:
        assert same and values == torch.tensor([40000.0, 1.0, -3.0], dtype=dtype).float().mul(2).tolist()
