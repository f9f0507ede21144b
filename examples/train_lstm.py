"""A word-level LSTM language model on WikiText-2 with DDP + a hook; prints held-out perplexity.

    python examples/train_lstm.py --algorithm topka --density 0.01 --steps 100 --eval-tokens 20000
    python examples/train_lstm.py --nproc 4 --algorithm spardl --epochs 1
    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- python examples/train_lstm.py --steps 200
    torchrun --nproc-per-node 4 examples/train_lstm.py --algorithm dense --steps 200

Data: REAL -- WikiText-2 (Merity et al. 2016, CC BY-SA 3.0), whose test and validation splits
ship with sparsecomm in ``sparsecomm/bench/data/wikitext-2/`` (its README: source, licence,
counts); nothing is downloaded. ``test.txt`` (245,569 tokens) trains and the vocabulary is its
14,143 words (``<unk>`` and ``<eos>`` included); ``valid.txt`` is held out: perplexity on it
(its first ``--eval-tokens``, default all 217,646), words ``test.txt`` lacks read as ``<unk>``.
Tokens are each line's words and then ``<eos>``. ``--data-dir DIR`` reads the same two files
from DIR instead; a DIR without them is an error (there is no fallback to other data).
Model: embedding ``--hidden``, 2-layer LSTM of ``--hidden``, a softmax over the vocabulary
(``models.LSTMLanguageModel``; 13.9 M parameters at the default 400); Adam, gradient norm
clipped to ``--clip`` after the hook's reduction.
Training: truncated backpropagation through time. Each rank takes a contiguous share of the
training text, reads it as ``--batch`` streams and takes the next ``--bptt`` tokens of every
stream each update, carrying the LSTM state (detached) from one update to the next; an epoch is
one pass over the share. The task is the time-to-accuracy benchmark's ``wikitext2``
(``sparsecomm.bench.tasks.wikitext2_task``), with these arguments.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

from sparsecomm.bench import tasks  # noqa: E402


def make_task(args: argparse.Namespace) -> tasks.Task:
    return tasks.wikitext2_task(args.data_dir, args.hidden, seq_len=args.bptt, batch=args.batch,
                                eval_tokens=args.eval_tokens or None, lr=args.lr, dropout=args.dropout,
                                clip=args.clip or None)


def train(ddp: nn.Module, state: _common.HookState, optimizer: torch.optim.Optimizer, task: tasks.Task,
          x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace, rank: int, desc: str) -> dict:
    """Truncated BPTT over this rank's streams; losses, per-update times and bytes sent per update
    (what ``_common.summarize`` reads)."""
    length = tasks.stream_length(len(x), args.batch)   # updates per pass; then the state starts from zeros
    steps = args.steps if args.steps is not None else args.epochs * length
    order = tasks.stream_order(len(x), args.batch, steps)
    every = max(1, steps // 5) if rank == 0 and not args.no_progress else 0
    losses, times, sent = [], [], []
    carry = None
    ddp.train()
    for step, idx in enumerate(order):
        start = time.perf_counter()
        optimizer.zero_grad()
        logits, carry = ddp(x[idx], None if step % length == 0 else carry)
        carry = tasks.detach_state(carry)
        loss = tasks.loss_of(logits, y[idx])
        loss.backward()
        if task.clip:
            nn.utils.clip_grad_norm_(ddp.parameters(), task.clip)
        optimizer.step()
        times.append(time.perf_counter() - start)
        sent.append(sum(s.get("bytes_sent", 0) for s in state.last_stats.values()))
        losses.append(loss.item())
        if every and len(times) % every == 0:
            print(f"{desc}: {len(times)}/{steps} updates, loss {losses[-1]:.3f} "
                  f"(perplexity {math.exp(losses[-1]):.0f}), {1000 * times[-1]:.0f} ms", flush=True)
    return {"losses": losses, "times": times, "bytes": sent}


def held_out(model: nn.Module, task: tasks.Task, rank: int, world: int) -> tuple[float, float, int]:
    """(perplexity, next-word accuracy, tokens) on the held-out text, each rank reading its share."""
    part = _common.shard(len(task.test_x), rank, world)
    sums = tasks.evaluation_sums(model, task.test_x[part], task.test_y[part], task.eval_batch, sequential=True)
    totals = torch.tensor(sums, dtype=torch.float64)
    dist.all_reduce(totals)
    correct, loss, count = totals.tolist()
    return math.exp(loss / count), correct / count, int(count)


def run_rank(rank: int, world: int, args: argparse.Namespace) -> dict:
    torch.set_num_threads(max(1, args.threads))
    task = make_task(args)
    if rank == 0:
        _common.banner(f"DATA: {task.data}")
    part = _common.shard(len(task.train_x), rank, world)   # a contiguous share of the text
    x, y = task.train_x[part], task.train_y[part]
    if tasks.stream_length(len(x), args.batch) < 1:
        raise ValueError(f"{len(x)} segments of {args.bptt} tokens per rank cannot make {args.batch} streams")
    torch.manual_seed(args.seed)
    ddp, state = _common.make_ddp(task.build(), args.algorithm, args.density)
    optimizer = task.optimizer(list(ddp.parameters()))
    run = train(ddp, state, optimizer, task, x, y, args, rank, desc=f"wikitext2 {args.algorithm}")
    perplexity, acc, tokens = held_out(ddp.module, task, rank, world)
    row = {"algorithm": getattr(state, "label", state.algorithm), "density": state.density,
           **_common.summarize(run, acc), "perplexity": perplexity}
    if rank == 0:
        params = sum(p.numel() for p in ddp.module.parameters())
        print(f"\n{task.model} ({params / 1e6:.2f} M parameters): {world} ranks x {x.numel():,} training tokens, "
              f"{args.batch} streams x {args.bptt} tokens per rank per update, Adam lr {args.lr}")
        print("per-update time: median over updates 4..N, max over ranks; bytes: sent per rank per update")
        print("| algorithm | density | updates | per-update (ms) | bytes/step (sent per rank) | final loss | "
              "held-out perplexity | next-word accuracy |")
        print("|---|---|---|---|---|---|---|---|")
        print(f"| {row['algorithm']} | {row['density']:g} | {row['steps']} | {1000 * row['step_s']:.1f} | "
              f"{row['bytes'] / 1e6:.4f} MB | {row['final_loss']:.4f} | {perplexity:.2f} | {100 * acc:.2f}% |")
        print(f"held-out perplexity: {perplexity:.2f} on {tokens:,} tokens of {tasks.WIKITEXT2_HELD_OUT}")
        print(f"loss finite: {row['finite']}, first {run['losses'][0]:.4f} -> last {run['losses'][-1]:.4f}")
        sys.stdout.flush()
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_args(parser, steps=None, epochs=1, batch=10, lr=1e-3)
    parser.add_argument("--hidden", type=int, default=400, help="embedding and LSTM width")
    parser.add_argument("--bptt", type=int, default=35, help="tokens per stream per update")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--clip", type=float, default=0.25, help="gradient norm clipped to (0: none)")
    parser.add_argument("--eval-tokens", type=int, default=0,
                        help=f"perplexity on the first this many tokens of {tasks.WIKITEXT2_HELD_OUT} (0: all)")
    args = parser.parse_args(argv)
    try:
        folder = tasks.wikitext2_dir(args.data_dir)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"data: WikiText-2 from {folder}: {tasks.WIKITEXT2_TRAIN} trains, {tasks.WIKITEXT2_HELD_OUT} is held out",
          flush=True)
    _common.start(__file__, argv, args, run_rank)


if __name__ == "__main__":
    main()
