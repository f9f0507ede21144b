"""One rank of tests/test_lightning.py: a LightningModule trained with SparseDDPStrategy on CPU.

Started as a plain process per rank with ``LOCAL_RANK``/``NODE_RANK``/``MASTER_ADDR``/
``MASTER_PORT`` (Lightning's own environment: the processes exist already, so the Trainer does
not launch any). ``--save DIR`` checkpoints after every epoch; ``--resume CKPT`` continues from
one. Writes ``<out>/rank<r>.pt``: the final parameters, the hook's step and, per step, how many
buckets it reduced.
"""

from __future__ import annotations

import argparse
import os
import warnings

import torch

import sparsecomm as sc

STEPS_PER_EPOCH = 3


def main() -> None:
    import lightning as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint

    from sparsecomm.integrations.lightning import SparseDDPStrategy

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--save", default=None)
    p.add_argument("--resume", default=None)
    args = p.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    g = torch.Generator().manual_seed(0)
    n = 16 * args.devices * STEPS_PER_EPOCH
    x, y = torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=False)

    state = sc.DDPHookState("topka", 0.05)
    reduced = []

    class Count(Callback):
        def on_train_batch_end(self, *_):
            reduced.append(sum(s["nnz_out"] > 0 for s in state.last_stats.values()))

    callbacks = [Count()]
    if args.save:
        callbacks.append(ModelCheckpoint(dirpath=args.save, every_n_epochs=1, save_top_k=-1, filename="{epoch}"))
    trainer = L.Trainer(strategy=SparseDDPStrategy(state, bucket_cap_mb=0.005), accelerator="cpu",
                        devices=args.devices, max_epochs=args.epochs, callbacks=callbacks, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=bool(args.save))
    model = Net()
    trainer.fit(model, data, ckpt_path=args.resume)
    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    torch.save({"params": flat, "step": state.step, "reduced": reduced},
               os.path.join(args.out, f"rank{trainer.global_rank}.pt"))
    state.close()


if __name__ == "__main__":
    main()
