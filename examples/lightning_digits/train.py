"""Train a tiny Lightning model on scikit-learn's digits, recorded by goodput automatically.

``goodput.instrument()`` is the only goodput line: the Lightning instrumentor
adds a callback to the ``Trainer`` and records accelerator init, training prep
(including the sanity check), every step (numbered with ``trainer.global_step``),
data loading, validation (as ``custom:eval`` badput), every checkpoint save
(``ModelCheckpoint``, optionally ``AsyncCheckpointIO``) and the checkpoint
restore of a resumed run. The data set ships with scikit-learn: nothing is
downloaded. It runs on the CPU in a few seconds (plus about 5 s to import Lightning).

Run it (job name and spool directory come from the environment)::

    export GOODPUT_RUN_DIR=runs/lightning-digits GOODPUT_JOB_NAME=lightning-digits
    python examples/lightning_digits/train.py --ckpt-dir checkpoints/lightning-digits \\
        --max-steps 60 --fail-at-step 45          # crashes in step 45 (a Python exception)
    python examples/lightning_digits/train.py --ckpt-dir checkpoints/lightning-digits \\
        --max-steps 60 --resume last              # attempt 1: resumes from step 40
    goodput report runs/lightning-digits

The second run is attempt 1 of the same job: it restores the last checkpoint
(step 40, with ``--ckpt-every 10``), so steps 41-44 of attempt 0 are wasted
progress. ``--async-ckpt`` writes checkpoints in a background thread
(``AsyncCheckpointIO``): the report then shows the writes as asynchronous work.
"""

from __future__ import annotations

import argparse
import time

import goodput

goodput.instrument()  # before Lightning is imported (it would work after, too)

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt-dir", default="checkpoints/lightning-digits")
    p.add_argument("--max-steps", type=int, default=60, help="train until this global step")
    p.add_argument("--ckpt-every", type=int, default=10, help="checkpoint every N steps")
    p.add_argument("--val-every", type=int, default=20, help="validate every N training batches")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    p.add_argument("--step-sleep", type=float, default=0.01,
                   help="extra seconds per training step (makes the tiny steps measurable)")
    p.add_argument("--load-sleep", type=float, default=0.002,
                   help="extra seconds per batch fetch (a slow input pipeline)")
    p.add_argument("--async-ckpt", action="store_true", help="write checkpoints in background")
    p.add_argument("--resume", default=None, help='checkpoint to resume from: a path or "last"')
    p.add_argument("--fail-at-step", type=int, default=0,
                   help="raise an exception in this step (simulates a crash)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


class DigitsModel(pl.LightningModule):
    """A two-layer MLP for the 8x8 digits (64 inputs, 10 classes)."""

    def __init__(self, lr: float = 0.05, step_sleep: float = 0.0, fail_at_step: int = 0):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        )
        self.lr = lr
        self.step_sleep = step_sleep
        self.fail_at_step = fail_at_step

    def training_step(self, batch, batch_idx):
        """One forward/backward of a batch (``x``: [B, 64] floats, ``y``: [B] labels)."""
        if self.fail_at_step and self.trainer.global_step + 1 == self.fail_at_step:
            raise RuntimeError(f"simulated crash in step {self.fail_at_step}")
        x, y = batch
        if self.step_sleep:
            time.sleep(self.step_sleep)
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        """Validation accuracy of a batch."""
        x, y = batch
        acc = (self.net(x).argmax(dim=1) == y).float().mean()
        self.log("val_acc", acc, prog_bar=False)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def loaders(batch_size: int, load_sleep: float, seed: int) -> tuple[DataLoader, DataLoader]:
    """Train and validation loaders over scikit-learn's bundled digits (1,797 images)."""
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    train, val = TensorDataset(x[:1500], y[:1500]), TensorDataset(x[1500:], y[1500:])

    def collate(items):
        if load_sleep:
            time.sleep(load_sleep)
        xs, ys = zip(*items, strict=True)
        return torch.stack(xs), torch.stack(ys)

    gen = torch.Generator().manual_seed(seed)
    return (
        DataLoader(train, batch_size=batch_size, shuffle=True, generator=gen, collate_fn=collate),
        DataLoader(val, batch_size=100, collate_fn=collate),
    )


def main(argv: list[str] | None = None) -> int:
    """Train (or resume) the job; returns the exit status."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    pl.seed_everything(args.seed, verbose=False)
    train, val = loaders(args.batch_size, args.load_sleep, args.seed)
    checkpoints = ModelCheckpoint(
        dirpath=args.ckpt_dir, filename="step-{step:06d}", auto_insert_metric_name=False,
        every_n_train_steps=args.ckpt_every, save_top_k=-1, save_last=True,
    )
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=args.max_steps,
        val_check_interval=args.val_every, check_val_every_n_epoch=None,
        accumulate_grad_batches=args.accumulate, callbacks=[checkpoints],
        plugins=[AsyncCheckpointIO()] if args.async_ckpt else None,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
    )
    model = DigitsModel(step_sleep=args.step_sleep, fail_at_step=args.fail_at_step)
    trainer.fit(model, train, val, ckpt_path=args.resume)
    print(f"done: global_step={trainer.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
