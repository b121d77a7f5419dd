"""Overhead of the Hugging Face Trainer instrumentor: the same tiny training, with and without.

A small MLP on scikit-learn's bundled digits is trained with ``transformers.Trainer``
on the CPU (one thread), ``--steps`` optimizer updates per run, no evaluation
and no checkpoints, so that what differs is the per-step cost: the goodput
callback's ``on_step_begin``/``on_step_end`` (one ``step`` span each) and the
wrapped ``Trainer.get_batch_samples`` (one ``data_loading`` span each), both
going to a real recorder writing its spool. Runs alternate uninstrumented /
instrumented (``--reps`` pairs, the order swapped every other pair); the
per-step time of a run is (last ``on_step_end`` - first ``on_step_begin``) /
(steps - 1), measured by a timing callback present in both. Prints the median
and best per-step time each way, the added cost per step in microseconds and
the ratio. On a busy machine the run-to-run noise of a ~1 ms Trainer step is
larger than the hooks' cost, so it also times the hooks alone: the callback's
``on_step_begin`` + ``on_step_end`` and the ``get_batch_samples`` wrapper around
a no-op, per step, against the same real recorder.

Run it (about a minute)::

    python benchmarks/bench_instr_transformers.py            # --steps 300 --reps 8
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="optimizer updates per run")
    p.add_argument("--reps", type=int, default=8, help="pairs of runs (one each way)")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="bench-hf-")
    import goodput

    goodput.configure("bench-hf", run_dir=f"{tmp}/runs", handle_signals=False)

    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments
    from transformers import logging as hf_logging

    from goodput_instrumentation.transformers import TransformersInstrumentor

    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    digits = load_digits()
    x = torch.as_tensor(digits.data.astype(np.float32) / 16.0)
    y = torch.as_tensor(digits.target, dtype=torch.long)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return len(y)

        def __getitem__(self, i):
            return {"x": x[i], "labels": y[i]}

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
            )

        def forward(self, x, labels=None):
            logits = self.net(x)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            if self.first is None:
                self.first = time.perf_counter_ns()

        def on_step_end(self, a, state, control, **kw):
            self.last = time.perf_counter_ns()

    inst = TransformersInstrumentor()
    data = Data()

    def run(instrumented: bool) -> float:
        if instrumented:
            inst.instrument()  # transformers.trainer is imported: patched at once
            assert inst.patched
        targs = TrainingArguments(
            output_dir=f"{tmp}/out", max_steps=args.steps,
            per_device_train_batch_size=args.batch_size, save_strategy="no",
            eval_strategy="no", logging_strategy="no", report_to="none", use_cpu=True,
            disable_tqdm=True, dataloader_num_workers=0,
        )
        clock = Clock()
        clock.first = clock.last = None
        trainer = Trainer(model=MLP(), args=targs, train_dataset=data, callbacks=[clock])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        if instrumented:
            inst.uninstrument()
        return (clock.last - clock.first) / (args.steps - 1) / 1e3  # µs per step

    run(False)  # warm-up: first-time imports and allocations
    plain, instr = [], []
    for i in range(args.reps):
        order = (False, True) if i % 2 == 0 else (True, False)
        for mode in order:
            (instr if mode else plain).append(run(mode))
    goodput.flush()
    spans = goodput.get_recorder().stats()["spans"]
    hooks_us = hook_cost_us()
    goodput.flush(timeout_s=60)  # the hook timing recorded 50,000 spans

    med_p, med_i = statistics.median(plain), statistics.median(instr)
    best_p, best_i = min(plain), min(instr)
    print(f"transformers Trainer, MLP 64-32-10 on digits, batch {args.batch_size}, "
          f"{args.steps} steps x {args.reps} runs each way, 1 CPU thread")
    print(f"{'':14}{'uninstrumented':>16}{'instrumented':>14}{'added':>10}{'ratio':>8}")
    for label, a, b in (("median µs/step", med_p, med_i), ("best µs/step", best_p, best_i)):
        print(f"{label:14}{a:16.1f}{b:14.1f}{b - a:10.1f}{b / a:8.3f}")
    print(f"hooks alone (callback step begin+end, get_batch_samples wrapper): "
          f"{hooks_us:.2f} µs/step (median of 5 x 5000 steps)")
    print(f"spans exported by the Trainer runs: {spans} (2 per instrumented step plus set-up)")


def hook_cost_us(n: int = 5_000) -> float:
    """Per-step cost of the instrumentor's own code in µs: what a step adds, framework aside."""
    from goodput_instrumentation import transformers as hf

    cb = hf.GoodputCallback()

    class State:
        global_step = 0

    state = State()

    def get_batch_samples(self, it, n, device):
        return [], None

    wrapped = hf._wrap_batches(get_batch_samples)
    hf._batch_hook = True  # as when instrumented: data loading comes from the wrapper
    runs = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _i in range(n):
            get_batch_samples(None, None, 1, None)
        base = time.perf_counter_ns() - t0
        t0 = time.perf_counter_ns()
        for i in range(n):
            wrapped(None, None, 1, None)
            cb.on_step_begin(None, state, None)
            state.global_step = i + 1
            cb.on_step_end(None, state, None)
        runs.append((time.perf_counter_ns() - t0 - base) / n / 1e3)
    hf._batch_hook = False
    return statistics.median(runs)


if __name__ == "__main__":
    main()
