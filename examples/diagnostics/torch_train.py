"""ML run diagnostics with PyTorch: run configs, ML metrics, a profile capture and goodput.

A small MLP trained with SGD on scikit-learn's bundled digits (nothing is downloaded), on
the CPU (or a GPU if there is one). The script

- starts an ML run (``goodput.diagnostics.run``) with its configs and the FLOPs figures the
  report needs for MFU, before torch is imported;
- records LOSS, LEARNING_RATE, STEP_TIME, THROUGHPUT and GRADIENT_NORM every
  ``--metrics-every`` steps with ``metrics.record``;
- captures a PyTorch profile (a Chrome trace ``*.pt.trace.json``, CPU and, on a GPU, CUDA
  activity) of ``--profile-steps`` steps from step ``--profile-at`` with ``@profile()`` on a
  function that runs those steps: a ``custom:profile`` badput span;
- with ``--on-demand``, also listens for on-demand captures (``kill -USR2 <pid>`` or
  ``curl -X POST 'http://127.0.0.1:9012/profile?duration_s=5'``);
- prints where the profiles and metrics went, and the goodput report.

From the repository root::

    python examples/diagnostics/torch_train.py --run-dir runs/diag-torch
    # open runs/diag-torch/profiles/<session>/*.pt.trace.json in https://ui.perfetto.dev
    goodput report runs/diag-torch
"""

from __future__ import annotations

import os
import sys
import time
from itertools import pairwise


def main(argv=None) -> int:
    from _common import finish, parse_args, print_on_demand

    args = parse_args(argv, doc=__doc__, framework="torch", lr=0.05)
    from goodput import diagnostics
    from goodput.diagnostics import MetricType, metrics
    from goodput.diagnostics.profile import profile

    sizes = [64, 128, 64, 10]
    # model FLOPs of one step: 2 per multiply-add, x3 for forward + backward
    flops_per_step = 6 * args.batch_size * sum(a * b for a, b in pairwise(sizes))
    run = diagnostics.run(
        args.name,
        run_group="examples",
        configs={"model": {"layers": sizes, "activation": "relu"},
                 "optimizer": {"name": "sgd", "lr": args.lr, "momentum": 0.9},
                 "batch_size": args.batch_size, "steps": args.steps, "seed": args.seed},
        flops_per_step=flops_per_step,
        peak_flops_per_device=100_000_000_000,  # a nominal 100 GFLOP/s CPU core
        device_count=1,
        on_demand_profile=args.on_demand,
        run_dir=args.run_dir,
        flush_interval_s=0.5,
    )


    import goodput

    print_on_demand(args.on_demand)
    with goodput.accelerator_init():
        import torch

        torch.set_num_threads(1)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        torch.zeros(1, device=device)
    with goodput.training_prep():
        from sklearn.datasets import load_digits

        digits = load_digits()
        x_all = torch.tensor(digits.data / 16.0, dtype=torch.float32, device=device)
        y_all = torch.tensor(digits.target, dtype=torch.long, device=device)
        torch.manual_seed(args.seed)
        layers = []
        for fan_in, fan_out in pairwise(sizes):
            layers += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers[:-1]).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        gen = torch.Generator(device=device).manual_seed(args.seed)

    def train_step(n: int):
        with goodput.step(n):
            idx = torch.randint(0, len(x_all), (args.batch_size,), device=device, generator=gen)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x_all[idx]), y_all[idx])
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
            optimizer.step()
            time.sleep(args.step_sleep)
        return loss, gnorm

    # Each call of the decorated function is one capture (the torch profiler records the
    # thread that calls it: here the training thread).
    capture = profile()

    @capture
    def profiled_steps(first: int, count: int):
        for n in range(first, first + count):
            out = train_step(n)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out

    window_start, window_steps = time.perf_counter(), 0
    n, step_before = 1, 0
    while n <= args.steps:
        if n == args.profile_at:
            count = min(args.profile_steps, args.steps - n + 1)
            loss, gnorm = profiled_steps(n, count)
            n += count
            window_steps += count
        else:
            loss, gnorm = train_step(n)
            n += 1
            window_steps += 1
        step, before = n - 1, step_before
        step_before = step
        if step // args.metrics_every > before // args.metrics_every or step == args.steps:
            loss_v, gnorm_v = loss.item(), gnorm.item()
            elapsed = time.perf_counter() - window_start
            step_time = elapsed / window_steps
            metrics.record(MetricType.LOSS, loss_v, step=step)
            metrics.record(MetricType.LEARNING_RATE, optimizer.param_groups[0]["lr"], step=step)
            metrics.record(MetricType.GRADIENT_NORM, gnorm_v, step=step)
            metrics.record(MetricType.STEP_TIME, step_time, step=step)
            metrics.record(MetricType.THROUGHPUT, args.batch_size / step_time, step=step)
            print(f"step {step} loss {loss_v:.4f} grad_norm {gnorm_v:.3f} "
                  f"step_time {step_time * 1000:.1f} ms", flush=True)
            window_start, window_steps = time.perf_counter(), 0

    print(f"device: {device}")
    if capture.session_id:
        print(f"profile session {capture.session_id}: {capture.session_dir}")
        for f in sorted(os.listdir(capture.session_dir)):
            print(f"  {f}   (open in https://ui.perfetto.dev or chrome://tracing)")
    return finish(run, args.run_dir)


if __name__ == "__main__":
    sys.exit(main())
