"""Per-step cost of the Lightning instrumentor: the same tiny fit without and with it.

One process runs the same Lightning fit (a 64->10 linear model on random data,
batch 32, CPU, one thread; no validation or checkpoints, so only the per-step
hooks count: the callback's batch hooks, the fetch hooks and two recorded
spans per step) alternately uninstrumented and instrumented, ``--repeat``
times each. A timing callback present in both modes takes the time from the
start of batch ``--warmup`` to the end of the last batch; the per-step time of
each mode is the median over the repetitions (best-of is printed too).

    python benchmarks/bench_instr_lightning.py [--steps 300] [--repeat 9]

Prints both per-step times, the added cost per step in microseconds and the ratio.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps per fit")
    ap.add_argument("--warmup", type=int, default=20, help="steps not timed at the start")
    ap.add_argument("--repeat", type=int, default=9, help="fits per mode (interleaved)")
    args = ap.parse_args(argv)

    import goodput
    import goodput_instrumentation

    for name in ("lightning.pytorch", "lightning.pytorch.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)

    class Timing(pl.Callback):
        def __init__(self, warmup: int):
            self.warmup, self.t0, self.t1, self.n = warmup, None, None, 0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == self.warmup and self.t0 is None:
                self.t0 = time.perf_counter_ns()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.t1 = time.perf_counter_ns()

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(64, 10)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32 * 64, 64, generator=gen),
                         torch.randint(0, 10, (32 * 64,), generator=gen))
    loader = DataLoader(data, batch_size=32, shuffle=True, generator=gen)
    timed = args.steps - args.warmup

    def fit() -> float:
        timing = Timing(args.warmup)
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_steps=args.steps, logger=False,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            limit_val_batches=0, callbacks=[timing],
        )
        trainer.fit(Tiny(), loader)
        return (timing.t1 - timing.t0) / timed / 1e3  # µs per step

    results: dict[str, list[float]] = {"plain": [], "instrumented": []}
    with tempfile.TemporaryDirectory() as tmp:
        goodput.configure("bench-lightning", run_dir=tmp, handle_signals=False)
        fit()  # warm-up of both code paths' imports and allocator
        for _ in range(args.repeat):
            results["plain"].append(fit())
            goodput_instrumentation.instrument(["lightning"])
            try:
                results["instrumented"].append(fit())
            finally:
                goodput_instrumentation.uninstrument(["lightning"])
        stats = goodput.get_recorder().stats()
        goodput.shutdown()

    plain = statistics.median(results["plain"])
    inst = statistics.median(results["instrumented"])
    print(f"steps per fit: {args.steps} ({timed} timed), repetitions: {args.repeat}")
    for name, vals in results.items():
        print(f"{name:>13}: median {statistics.median(vals):8.1f} µs/step, "
              f"best {min(vals):8.1f} µs/step")
    print(f"added cost: {inst - plain:+.1f} µs/step (median), "
          f"{min(results['instrumented']) - min(results['plain']):+.1f} µs/step (best)")
    print(f"ratio instrumented/plain: {inst / plain:.3f}")
    print(f"recorder errors: {stats['errors']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
