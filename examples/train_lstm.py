"""The SparDL paper's LSTM task: sentiment classification of IMDB reviews with DDP + a hook.

    python examples/train_lstm.py --algorithm spardl --density 0.01 --steps 100
    python examples/train_lstm.py --data-dir ~/data/aclImdb --epochs 1 --algorithm topka
    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- python examples/train_lstm.py --steps 50

Data: IMDB from ``--data-dir`` when it has the aclImdb layout (``train/pos``, ``train/neg``,
``test/pos``, ``test/neg``, one review per ``.txt``): lower-cased, ``<br />`` and punctuation
turned into spaces, split on whitespace; the vocabulary is the ``--vocab`` - 2 most frequent
training words (0 = padding, 1 = unknown); each review is cut or padded to ``--seq-len``.
Otherwise GENERATED token sequences, announced at start: random tokens, of which a fixed
tenth of the vocabulary is "positive" and another tenth "negative"; the label says whether a
sequence holds more positive than negative tokens (a rule the LSTM can learn).
Model: embedding 64, 2-layer LSTM of 128, linear head (``models.LSTMClassifier``).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from models import LSTMClassifier  # noqa: E402

# the IMDB reader is the time-to-accuracy benchmark's (one copy, in the package)
from sparsecomm.bench.tasks import has_imdb, load_imdb, tokenize  # noqa: E402,F401


def generated(n_train: int, n_test: int, vocab: int, seq_len: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    polarity = torch.zeros(vocab, dtype=torch.long)
    ids = torch.randperm(vocab - 2, generator=gen) + 2
    tenth = max(1, vocab // 10)
    polarity[ids[:tenth]], polarity[ids[tenth:2 * tenth]] = 1, -1
    out = []
    for n in (n_train, n_test):
        x = torch.randint(2, vocab, (n, seq_len), generator=gen)
        score = polarity[x].sum(dim=1)
        out += [x, (score > 0).long()]  # ties count as negative
    return tuple(out)


def describe_data(args: argparse.Namespace) -> str:
    if has_imdb(args.data_dir):
        return f"data: IMDB (aclImdb layout) from {args.data_dir}: train/pos, train/neg, test/pos, test/neg"
    why = f"no aclImdb folders in {args.data_dir!r}" if args.data_dir else "no --data-dir"
    return (f"GENERATED DATA ({why}): random token sequences (vocabulary {args.vocab}, length {args.seq_len}), "
            f"label = more 'positive' than 'negative' tokens -- NOT IMDB, accuracy is not comparable")


def run_rank(rank: int, world: int, args: argparse.Namespace) -> dict:
    torch.set_num_threads(max(1, args.threads))
    if rank == 0:
        _common.banner(describe_data(args))
    if has_imdb(args.data_dir):
        train_x, train_y, test_x, test_y = load_imdb(args.data_dir, args.vocab, args.seq_len)
    else:
        train_x, train_y, test_x, test_y = generated(args.train_size, args.test_size, args.vocab, args.seq_len)
    perm = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed))
    part = perm[_common.shard(len(train_x), rank, world)]
    torch.manual_seed(args.seed)
    ddp, state = _common.make_ddp(LSTMClassifier(args.vocab), args.algorithm, args.density)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    run = _common.train(ddp, state, optimizer, train_x[part], train_y[part], args, rank,
                        desc=f"lstm {args.algorithm}")
    params = sum(p.numel() for p in ddp.module.parameters())
    return _common.report(ddp, state, run, test_x, test_y, args, rank, world,
                          f"LSTM classifier ({params / 1e6:.2f} M parameters): {world} ranks x {len(part)} training "
                          f"sequences of {args.seq_len} tokens, batch {args.batch} per rank, Adam lr {args.lr}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_args(parser, steps=None, epochs=1, batch=32, lr=0.002)
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--train-size", type=int, default=4000, help="generated data only")
    parser.add_argument("--test-size", type=int, default=1000, help="generated data only")
    args = parser.parse_args(argv)
    print(describe_data(args), flush=True)
    _common.start(__file__, argv, args, run_rank)


if __name__ == "__main__":
    main()
