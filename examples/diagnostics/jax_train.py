"""ML run diagnostics with JAX: run configs, ML metrics, a profile capture and goodput.

A small MLP trained with Optax on scikit-learn's bundled digits (nothing is downloaded), on
the CPU. The script

- starts an ML run (``goodput.diagnostics.run``) with its configs and the FLOPs figures the
  report needs for MFU, before JAX is imported;
- records LOSS, LEARNING_RATE, STEP_TIME, THROUGHPUT and GRADIENT_NORM every
  ``--metrics-every`` steps with ``metrics.record``;
- captures a JAX profile (XProf ``.xplane.pb``) of ``--profile-steps`` steps from step
  ``--profile-at`` with ``profile()``: a ``custom:profile`` badput span;
- with ``--on-demand``, also listens for on-demand captures (``kill -USR2 <pid>`` or
  ``curl -X POST 'http://127.0.0.1:9012/profile?duration_s=5'``);
- prints where the profiles and metrics went, and the goodput report.

From the repository root::

    JAX_PLATFORMS=cpu python examples/diagnostics/jax_train.py --run-dir runs/diag-jax
    tensorboard --logdir runs/diag-jax/profiles     # with the tensorboard-plugin-profile
    goodput report runs/diag-jax
"""

from __future__ import annotations

import os
import sys
import time
from itertools import pairwise


def main(argv=None) -> int:
    from _common import finish, parse_args, print_on_demand

    args = parse_args(argv, doc=__doc__, framework="jax", lr=0.01)
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
                 "optimizer": {"name": "adam", "lr": args.lr},
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
        import jax

        devices = jax.devices()
    with goodput.training_prep():
        import jax.numpy as jnp
        import numpy as np
        import optax
        from sklearn.datasets import load_digits

        digits = load_digits()
        x_all = (digits.data / 16.0).astype(np.float32)
        y_all = digits.target.astype(np.int32)
        optimizer = optax.adam(args.lr)
        rng = np.random.default_rng(args.seed)

    def init_params(key):
        params = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            key, sub = jax.random.split(key)
            params.append({"w": jax.random.normal(sub, (fan_in, fan_out)) / np.sqrt(fan_in),
                           "b": jnp.zeros((fan_out,))})
        return params

    def loss_fn(params, x, y):
        for layer in params[:-1]:
            x = jax.nn.relu(x @ layer["w"] + layer["b"])
        logits = x @ params[-1]["w"] + params[-1]["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def train_step(state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], x, y)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state}, loss, optax.global_norm(grads)

    def batch():
        idx = rng.integers(0, len(x_all), args.batch_size)
        return x_all[idx], y_all[idx]

    with goodput.program_startup():
        params = init_params(jax.random.key(args.seed))
        state = {"params": params, "opt_state": optimizer.init(params)}
        step_fn = jax.jit(train_step).lower(state, *batch()).compile()

    prof = profile()  # directory: the run's profile_dir; session id shared by all hosts
    window_start, window_steps = time.perf_counter(), 0
    for n in range(1, args.steps + 1):
        if n == args.profile_at:
            prof.start()
        goodput.step_start(n)  # JAX dispatches asynchronously: steps run between starts
        with jax.profiler.StepTraceAnnotation("train", step_num=n):
            state, loss, gnorm = step_fn(state, *batch())
            time.sleep(args.step_sleep)
        window_steps += 1
        if prof.active and n == args.profile_at + args.profile_steps - 1:
            jax.block_until_ready(state)
            prof.stop()
        if n % args.metrics_every == 0 or n == args.steps:
            loss_v, gnorm_v = float(loss), float(gnorm)  # waits for the step
            elapsed = time.perf_counter() - window_start
            step_time = elapsed / window_steps
            metrics.record(MetricType.LOSS, loss_v, step=n)
            metrics.record(MetricType.LEARNING_RATE, args.lr, step=n)
            metrics.record(MetricType.GRADIENT_NORM, gnorm_v, step=n)
            metrics.record(MetricType.STEP_TIME, step_time, step=n)
            metrics.record(MetricType.THROUGHPUT, args.batch_size / step_time, step=n)
            print(f"step {n} loss {loss_v:.4f} grad_norm {gnorm_v:.3f} "
                  f"step_time {step_time * 1000:.1f} ms", flush=True)
            window_start, window_steps = time.perf_counter(), 0
    if prof.active:  # fewer steps than the profile window
        prof.stop()
    jax.block_until_ready(state)

    print(f"devices: {devices}")
    if prof.session_id:
        print(f"profile session {prof.session_id}: {prof.session_dir}")
        for root, _, files in os.walk(prof.session_dir):
            for f in sorted(files):
                print(f"  {os.path.relpath(os.path.join(root, f), prof.session_dir)}")
        print(f"  view: tensorboard --logdir {run.profile_dir}"
              f"  (or: xprof --logdir={run.profile_dir})")
    return finish(run, args.run_dir)


if __name__ == "__main__":
    sys.exit(main())
