"""Lightning's own DDP launcher on the CPU, recorded by goodput's instrumentors only.

``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` started with plain ``python``:
Lightning starts rank 1 itself (the same command line, with ``LOCAL_RANK=1``, and no
``RANK``); goodput learns the ranks from ``torch.distributed`` once the group is up::

    export GOODPUT_JOB_NAME=lddp GOODPUT_RUN_DIR=runs/lddp GOODPUT_FLUSH_INTERVAL_S=0.25
    python examples/launchers/train_lightning_ddp.py --truth truth.jsonl --max-steps 40
    goodput report runs/lddp

The goodput lines are ``goodput.configure()`` and ``goodput.instrument()`` at the top: the
Lightning instrumentor records accelerator init (``setup`` -> ``on_fit_start``), training
prep (``on_fit_start`` -> ``on_train_start``), data loading (each batch fetch) and the steps;
the PyTorch one ``init_process_group`` (accelerator init).

With ``--truth FILE`` each process appends what it saw to ``FILE`` in the format of
``train_ddp.py`` (one JSON object a line, ``O_APPEND``): ``start`` (the OS process's start),
``begin``/``end`` of ``accelerator_init`` (around ``init_process_group``, and from
``setup`` to ``on_fit_start``), ``training_prep``, ``data_loading`` (the batch collation,
which is all a fetch does here) and ``step`` (``on_train_batch_start`` -> ``_end``, numbered
as goodput numbers them: the ``global_step`` after the step), and ``exit``. A callback
placed after goodput's sees each hook a few microseconds after it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import goodput  # noqa: E402

goodput.configure()  # job name, spool directory and flush interval from GOODPUT_*
goodput.instrument()  # before Lightning is imported

from train_ddp import Truth, process_start  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--truth", default=None)
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--step-sleep", type=float, default=0.03)
    p.add_argument("--load-sleep", type=float, default=0.003)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("LOCAL_RANK", "0"))  # Lightning's launcher sets only this
    truth = Truth(args.truth, rank, 2)
    truth.emit("start", t=process_start(), t_run=time.time())

    import lightning.pytorch as pl
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    init = dist.init_process_group  # goodput's wrapper (the PyTorch instrumentor)

    def init_process_group(*a, **kw):
        with truth.marked(contextlib.nullcontext(), "accelerator_init"):
            return init(*a, **kw)

    dist.init_process_group = init_process_group

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(32, 32)

        def training_step(self, batch, batch_idx):
            time.sleep(args.step_sleep)
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class TruthCallback(pl.Callback):
        def setup(self, trainer, pl_module, stage):
            truth.base["rank"] = trainer.global_rank
            truth.emit("begin", name="accelerator_init")

        def on_fit_start(self, trainer, pl_module):
            truth.emit("end", name="accelerator_init")
            truth.emit("begin", name="training_prep")

        def on_train_start(self, trainer, pl_module):
            truth.emit("end", name="training_prep")

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            truth.emit("begin", name="step", step=trainer.global_step + 1)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            truth.emit("end", name="step", step=trainer.global_step)

    def collate(items):
        truth.emit("begin", name="data_loading")
        time.sleep(args.load_sleep)
        out = torch.stack([x for (x,) in items])
        truth.emit("end", name="data_loading")
        return (out,)

    data = TensorDataset(torch.randn(4096, 32, generator=torch.Generator().manual_seed(0)))
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=args.max_steps,
        callbacks=[TruthCallback()], logger=False, enable_checkpointing=False,
        limit_val_batches=0, num_sanity_val_steps=0, enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), DataLoader(data, batch_size=16, collate_fn=collate))
    truth.emit("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
