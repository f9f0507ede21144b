"""ResNet-20 / VGG on CIFAR-shaped images with PyTorch Lightning and sparsecomm's hook.

    python examples/train_lightning.py --nproc 2 --steps 20                 # 2 CPU processes
    python examples/train_lightning.py --nproc 1 --steps 20                 # the same script, 1 process
    python examples/train_lightning.py --nproc 2 --epochs 2 --save-dir ckpt # a checkpoint per epoch
    python examples/train_lightning.py --nproc 2 --epochs 3 --resume ckpt/epoch=1.ckpt
    torchrun --nnodes 2 --nproc-per-node 8 ... examples/train_lightning.py --accelerator gpu --nproc 8

The whole integration is one line: ``Trainer(strategy=SparseDDPStrategy(sc.DDPHookState(...)))``
(sparsecomm.integrations.lightning; docs/integrations.md). Lightning starts the ``--nproc``
processes itself (or joins torchrun's); the hook runs on CPU too, and every checkpoint carries
every rank's hook state, so ``--resume`` continues exactly. Data as in train_image.py: CIFAR from
``--data-dir`` (an error naming the expected files if the folder does not hold them); without
``--data-dir``, generated CIFAR-shaped images (announced). ``--steps N`` trains N optimizer steps
whatever ``--epochs`` says (as many epochs as that takes); without it, ``--epochs`` epochs. Rank 0
prints, every ``--log-every`` steps, the hook's ``state.summary()`` (bytes this rank sent, their
ratio to a dense allreduce's, algorithm, density) and the training loss.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from train_image import DATA_DIR_HELP, data_dir_error, describe_data, generated  # noqa: E402

import sparsecomm as sc  # noqa: E402
from sparsecomm.bench.tasks import find_cifar, load_cifar  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["vgg16", "vgg19", "resnet20"], default="resnet20")
    p.add_argument("--algorithm", default="spardl", help=f"from: {', '.join(sc.algorithms.names())}")
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--nproc", type=int, default=2, help="processes (Lightning's devices) per node")
    p.add_argument("--accelerator", default="cpu", help="Lightning's accelerator: cpu, gpu, auto")
    p.add_argument("--epochs", type=int, default=1, help="epochs to train when --steps is not given")
    p.add_argument("--steps", type=int, default=None,
                   help="stop after this many updates, however many epochs that takes (overrides --epochs)")
    p.add_argument("--batch", type=int, default=32, help="per-process batch size")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    p.add_argument("--train-size", type=int, default=2000, help="generated data only")
    p.add_argument("--test-size", type=int, default=500, help="generated data only")
    p.add_argument("--save-dir", default=None, help="write a checkpoint after every epoch here")
    p.add_argument("--resume", default=None, help="a checkpoint to continue from")
    p.add_argument("--log-every", type=int, default=5, help="steps between rank 0's lines (and step 1)")
    args = p.parse_args(argv)
    if args.steps is not None and args.steps < 1 or args.epochs < 1 or args.log_every < 1:
        p.error("--steps, --epochs and --log-every must be at least 1")
    error = data_dir_error(args.data_dir)
    if error:
        p.error(error)
    return args


def main(argv: list[str] | None = None) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint

    from sparsecomm.integrations.lightning import SparseDDPStrategy

    args = parse(argv)
    sc.algorithms.get(args.algorithm)   # a clear error before any process starts
    torch.set_num_threads(1)
    found = find_cifar(args.data_dir)
    train_x, train_y, test_x, test_y = load_cifar(found) if found else generated(args.train_size, args.test_size)
    classes = 100 if int(train_y.max()) + 1 > 10 else 10

    class ImageClassifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = models.build(args.model, classes)

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch, _):
            x, y = batch
            self.log("accuracy", (self.net(x).argmax(1) == y).float().mean(), sync_dist=True, prog_bar=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    state = sc.DDPHookState(args.algorithm, 1.0 if args.algorithm == "dense" else args.density)

    class HookReport(Callback):
        """From rank 0: what the hook reduced (state.summary()) and the training loss."""

        def on_train_batch_end(self, trainer, pl_module, outputs, *_):
            step = trainer.global_step
            if trainer.is_global_zero and (step % args.log_every == 0 or step == 1):
                print(f"{state.summary()}; loss {float(outputs['loss']):.4f}", flush=True)

    def loader(x, y, shuffle):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=args.batch,
                                           shuffle=shuffle)

    callbacks = [HookReport()]
    if args.save_dir:
        callbacks.append(ModelCheckpoint(dirpath=args.save_dir, every_n_epochs=1, save_top_k=-1, filename="{epoch}"))
    trainer = L.Trainer(strategy=SparseDDPStrategy(state), accelerator=args.accelerator, devices=args.nproc,
                        # --steps alone decides the length: no epoch limit then (-1: none)
                        max_epochs=-1 if args.steps else args.epochs, max_steps=args.steps or -1,
                        callbacks=callbacks, logger=False,
                        enable_checkpointing=bool(args.save_dir), enable_model_summary=False,
                        enable_progress_bar=False)
    if trainer.is_global_zero:
        print(describe_data(argparse.Namespace(data_dir=args.data_dir, train_size=args.train_size,
                                               test_size=args.test_size)), flush=True)
    model = ImageClassifier()
    trainer.fit(model, loader(train_x, train_y, True), ckpt_path=args.resume)
    accuracy = trainer.validate(model, loader(test_x, test_y, False), verbose=False)[0]["accuracy"]
    if trainer.is_global_zero:
        print(f"done: {trainer.world_size} processes, {args.algorithm} at density {state.density:g}, hook step "
              f"{state.step}, test accuracy {accuracy:.3f}", flush=True)
    state.close()


if __name__ == "__main__":
    main()
