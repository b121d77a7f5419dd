"""Per-step cost of the JAX instrumentor: the same jitted training loop without and with it.

One process, one tiny jitted MLP step (64 -> 128 -> 10, batch 64, SGD) inside
``jax.profiler.StepTraceAnnotation("train", step_num=n)``, on the CPU. Blocks of
``--steps`` steps alternate between uninstrumented (``JaxInstrumentor`` off:
JAX's own annotation) and instrumented (on: our subclass marks each step start
on the recorder, whose background thread builds the spans and writes the spool
meanwhile), starting with a different mode each round; the spans of a block are
written (``goodput.flush``) before the next block starts, outside the timing. The
median over ``--rounds`` rounds is reported.
A second pair measures the annotation alone (enter/exit, no JAX work), which
is the hook's cost with nothing to hide it.

The Orbax instrumentor costs nothing per step (it runs once per checkpoint
save or restore), so it is not in this loop.

    JAX_PLATFORMS=cpu python benchmarks/bench_instr_jax.py [--steps 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(argv=None) -> int:
    """Run the benchmark and print the figures; returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000, help="steps per timed block")
    ap.add_argument("--rounds", type=int, default=7, help="blocks per mode (interleaved)")
    ap.add_argument("--flush-interval", type=float, default=0.05,
                    help="recorder flush interval in seconds (default 0.05: several per block)")
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import goodput
    import goodput_instrumentation.jax as gj

    with tempfile.TemporaryDirectory() as tmp:
        # A short flush interval, so the background thread builds and writes spans
        # during the timed blocks (its GIL time is part of the cost measured).
        goodput.configure("bench-jax", run_dir=tmp, handle_signals=False,
                          flush_interval_s=args.flush_interval)
        inst = gj.JaxInstrumentor()

        key = jax.random.key(0)
        k1, k2, k3 = jax.random.split(key, 3)
        params = {"w1": jax.random.normal(k1, (64, 128)) * 0.1,
                  "w2": jax.random.normal(k2, (128, 10)) * 0.1}
        x = jax.random.normal(k3, (64, 64))
        y = jnp.arange(64) % 10

        def loss_fn(p):
            logits = jnp.tanh(x @ p["w1"]) @ p["w2"]
            return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(64), y])

        @jax.jit
        def step(p):
            g = jax.grad(loss_fn)(p)
            return jax.tree_util.tree_map(lambda a, b: a - 0.01 * b, p, g)

        step(params)["w1"].block_until_ready()  # compile outside the timing
        counter = [0]

        def train_block(n):
            p = params
            t0 = time.perf_counter_ns()
            for _ in range(n):
                counter[0] += 1
                with jax.profiler.StepTraceAnnotation("train", step_num=counter[0]):
                    p = step(p)
            p["w1"].block_until_ready()
            return (time.perf_counter_ns() - t0) / n

        def annotation_block(n):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                counter[0] += 1
                with jax.profiler.StepTraceAnnotation("train", step_num=counter[0]):
                    pass
            return (time.perf_counter_ns() - t0) / n

        results = {("step", False): [], ("step", True): [],
                   ("annotation", False): [], ("annotation", True): []}
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for on in order:
                if on:
                    inst.instrument(skip_dep_check=True)
                    assert inst.patched
                results[("step", on)].append(train_block(args.steps))
                goodput.flush(60)  # write this block's spans before the next block starts
                results[("annotation", on)].append(annotation_block(args.steps))
                goodput.flush(60)
                if on:
                    inst.uninstrument()
        recorded = goodput.get_recorder().stats()["recorded"]
        goodput.shutdown()

    print(f"jax {jax.__version__}, {args.rounds} rounds x {args.steps} steps per mode, "
          f"median of the rounds (per step)")
    print(f"{'loop':<34} {'plain':>10} {'instrumented':>13} {'added':>10} {'ratio':>7}")
    for what, label in (("step", "jitted step in StepTraceAnnotation"),
                        ("annotation", "StepTraceAnnotation alone")):
        off = statistics.median(results[(what, False)]) / 1e3
        on = statistics.median(results[(what, True)]) / 1e3
        print(f"{label:<34} {off:>8.2f}µs {on:>11.2f}µs {on - off:>+8.2f}µs {on / off:>7.3f}")
    print(f"(spans recorded while instrumented: {recorded})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
