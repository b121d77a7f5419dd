"""Overhead of the PyTorch instrumentor per training step, measured side by side.

The same tiny training loops run uninstrumented and instrumented in ONE
process, repetitions alternating (off, on, off, on, ...), so that machine load
affects both alike. Each repetition times a whole loop; the figure per mode is
the median (and the best) of the per-step times of its repetitions.
Instrumented, every step goes through the optimizer pre/post hooks and the
DataLoader ``__next__`` wrapper and records two spans (``goodput.step`` and
``goodput.data_loading``) to a real recorder writing a spool in a temporary
directory.

Two loops:

- ``minimal``: one scalar parameter, batches of one number: almost nothing but
  the framework's own per-step overhead, so the added cost is most visible.
- ``mlp``: a 2-layer MLP (64-128-10) on batches of 64, closer to a real (if
  tiny) CPU step.

Run::

    python benchmarks/bench_instr_torch.py            # about 30-60 s
    python benchmarks/bench_instr_torch.py --steps 500 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def _loop(kind: str, steps: int):
    import torch

    torch.manual_seed(0)
    if kind == "minimal":
        data = torch.utils.data.TensorDataset(torch.randn(steps, 1), torch.randn(steps, 1))
        model = torch.nn.Linear(1, 1, bias=False)
        batch = 1
    else:
        data = torch.utils.data.TensorDataset(
            torch.randn(steps * 64, 64), torch.randint(0, 10, (steps * 64,))
        )
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
        )
        batch = 64
    loader = torch.utils.data.DataLoader(data, batch_size=batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.MSELoss() if kind == "minimal" else torch.nn.CrossEntropyLoss()

    def run() -> float:
        """Seconds per step of one pass over the loader."""
        t0 = time.perf_counter()
        n = 0
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
            n += 1
        return (time.perf_counter() - t0) / n

    return run


def main(argv: list[str] | None = None) -> int:
    """Run both loops both ways and print per-step times, added cost and ratio."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000, help="steps per repetition")
    p.add_argument("--reps", type=int, default=7, help="repetitions per mode (alternating)")
    args = p.parse_args(argv)

    import goodput
    import goodput_instrumentation

    tmp = tempfile.mkdtemp(prefix="bench-instr-torch-")
    goodput.configure(job_name="bench-instr-torch", run_dir=tmp)
    import torch

    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {args.steps} steps x {args.reps} repetitions per mode")
    print(f"{'loop':<8} {'mode':<13} {'median/step':>12} {'best/step':>12}")
    for kind in ("minimal", "mlp"):
        run = _loop(kind, args.steps)
        run()  # warm-up (allocator, first-call paths), uninstrumented
        times: dict[str, list[float]] = {"uninstrumented": [], "instrumented": []}
        for _ in range(args.reps):
            for mode in ("uninstrumented", "instrumented"):
                if mode == "instrumented":
                    goodput_instrumentation.instrument(["torch"])
                try:
                    times[mode].append(run())
                finally:
                    if mode == "instrumented":
                        goodput_instrumentation.uninstrument(["torch"])
                goodput.flush()  # write the spans outside the timed loop
        med = {m: statistics.median(v) for m, v in times.items()}
        best = {m: min(v) for m, v in times.items()}
        for mode in times:
            print(f"{kind:<8} {mode:<13} {med[mode] * 1e6:>10.1f}us {best[mode] * 1e6:>10.1f}us")
        added = (med["instrumented"] - med["uninstrumented"]) * 1e6
        added_best = (best["instrumented"] - best["uninstrumented"]) * 1e6
        ratio = med["instrumented"] / med["uninstrumented"]
        print(
            f"{kind:<8} added per step: {added:+.1f} us (median), {added_best:+.1f} us (best); "
            f"ratio {ratio:.3f}"
        )
    # The hook bodies alone (no framework around them): a steadier figure.
    from goodput_instrumentation.torch import TorchInstrumentor

    goodput_instrumentation.instrument(["torch"])
    inst = TorchInstrumentor()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    n = 20_000
    best_hook = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            inst._on_pre_step(opt, (), {})
            inst._on_post_step(opt, (), {})
            inst._on_fetch(time.time_ns(), None)
        best_hook = min(best_hook, (time.perf_counter() - t0) / n)
        goodput.flush(timeout_s=60)
    goodput_instrumentation.uninstrument(["torch"])
    print(f"hook bodies alone (pre + post + fetch, 2 spans): {best_hook * 1e6:.2f} us per step")
    stats = goodput.get_recorder().stats()
    print(f"recorder: {stats['spans']} spans written, {stats['errors']} errors (spool {tmp})")
    goodput.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
