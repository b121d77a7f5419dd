"""Train a small MLP on scikit-learn's digits with JAX, Optax and Orbax; goodput recorded.

A real (if tiny) JAX CPU training job: a jitted train step inside
``jax.profiler.StepTraceAnnotation``, asynchronous Orbax checkpoints every
``--ckpt-every`` steps, and a restore of the latest checkpoint on start. The
data set ships with scikit-learn, so nothing is downloaded.

Step numbering follows goodput's convention: step ``n`` is the ``n``-th
optimizer update (``step_num=n``), the checkpoint of step ``n`` holds the state
after it, and after restoring checkpoint ``n`` training continues with step
``n + 1``.

How goodput is recorded depends on ``--marks``:

- ``auto`` (default): the only goodput code is ``goodput.instrument()``; the
  JAX and Orbax instrumentors record accelerator init, program startup
  (compilation), steps, checkpoint saves (blocking and background) and restores.
- ``manual``: no instrumentation; the same loop marks the same phases with the
  phase API (``goodput.step_start``, ``goodput.checkpoint_save``, ...).
- ``none``: no goodput code at all; run it under ``opentelemetry-instrument``
  (which enables the instrumentors from their entry points) or untouched.

The run directory and job name come from the environment (``GOODPUT_RUN_DIR``,
``GOODPUT_JOB_NAME``, ``GOODPUT_FLUSH_INTERVAL_S``). From the repository root::

    export GOODPUT_RUN_DIR=runs/jax-digits GOODPUT_JOB_NAME=jax-digits JAX_PLATFORMS=cpu
    python examples/jax_orbax/train.py --ckpt-dir /tmp/ckpt/jax-digits
    python examples/jax_orbax/train.py --ckpt-dir /tmp/ckpt/jax-digits --marks manual
    opentelemetry-instrument python examples/jax_orbax/train.py --marks none \\
        --ckpt-dir /tmp/ckpt/jax-digits
    goodput report runs/jax-digits

Run it again with the same checkpoint directory and it resumes from the latest
checkpoint as the next attempt of the same job. ``crash_restart.py`` next to
this file kills it with SIGKILL and restarts it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt-dir", default="checkpoints/jax-digits", help="Orbax directory")
    p.add_argument("--marks", choices=("auto", "manual", "none"), default="auto",
                   help="goodput.instrument() (auto), phase API markers (manual) or nothing")
    p.add_argument("--steps", type=int, default=200, help="train until this step number")
    p.add_argument("--ckpt-every", type=int, default=25, help="save a checkpoint every N steps")
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate every N steps (0: never); marked with "
                   "goodput.custom_badput('eval') unless --marks none")
    p.add_argument("--step-sleep", type=float, default=0.01,
                   help="extra seconds per step, so that the tiny steps are long enough to measure")
    p.add_argument("--log-every", type=int, default=10, help="print the loss every N steps")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-to-keep", type=int, default=3, help="checkpoints kept by Orbax")
    p.add_argument("--timings", type=Path, default=None,
                   help="write the wall seconds of accelerator init, checkpoint saves and "
                   "restores, timed around the calls by the loop itself, to this JSON file")
    args = p.parse_args(argv)
    for name in ("steps", "ckpt_every", "log_every", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


class Marks:
    """The phase API markers of ``--marks manual``; no-ops (nothing imported) otherwise."""

    def __init__(self, mode: str):
        self.manual = mode == "manual"
        self.eval = mode != "none"
        self._goodput = None
        if mode != "none":
            import goodput

            self._goodput = goodput

        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str, *args, **kwargs):
        """``goodput.<name>(...)`` as a context manager in manual mode, else a no-op;
        either way the block's wall seconds are added to ``timings[name]``."""
        marker = getattr(self._goodput, name)(*args, **kwargs) if self.manual \
            else contextlib.nullcontext()
        with marker:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0

    def step_start(self, n: int) -> None:
        """``goodput.step_start(n)`` in manual mode."""
        if self.manual:
            self._goodput.step_start(n)

    def background_save(self, step: int, start_s: float, end_s: float) -> None:
        """The asynchronous part of a save, back-filled (manual mode)."""
        if self.manual:
            self._goodput.checkpoint_save(step, blocking=False, start=start_s, end=end_s)

    def eval_phase(self):
        """Evaluation is custom badput in both auto and manual mode (no hook sees it)."""
        if not self.eval:
            return contextlib.nullcontext()
        return self._goodput.custom_badput("eval")


class BackgroundSaves:
    """Manual mode: remembers the save in flight so Orbax's post-finalization callback
    can back-fill its background span (Orbax runs one save at a time per manager)."""

    def __init__(self, marks: Marks):
        self.marks = marks
        self.pending: tuple[int, float] | None = None

    def started(self, step: int) -> None:
        """The blocking part of the save of ``step`` just returned."""
        self.pending = (step, time.time())

    def finalized(self) -> None:
        """Orbax's ``post_finalization_callback`` (background thread)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            self.marks.background_save(pending[0], pending[1], time.time())


def main(argv: list[str] | None = None) -> int:
    """Train (or resume) the digits job; returns the process exit status."""
    args = parse_args(argv)
    if args.marks == "auto":
        import goodput

        goodput.instrument()  # the one line: everything else is recorded by the hooks
    marks = Marks(args.marks)

    import jax

    with marks.phase("accelerator_init"):
        devices = jax.devices()  # the first device query initialises the backend
    print(f"devices: {devices}", flush=True)

    with marks.phase("training_prep"):
        import jax.numpy as jnp
        import numpy as np
        import optax
        import orbax.checkpoint as ocp
        from sklearn.datasets import load_digits

        digits = load_digits()
        x_all = (digits.data / 16.0).astype(np.float32)
        y_all = digits.target.astype(np.int32)
        n_val = len(x_all) // 5
        x_val, y_val = x_all[:n_val], y_all[:n_val]
        x_train, y_train = x_all[n_val:], y_all[n_val:]
        batches_per_epoch = len(x_train) // args.batch_size
        optimizer = optax.adam(args.lr)
        saves = BackgroundSaves(marks)
        async_options = ocp.AsyncOptions(post_finalization_callback=saves.finalized) \
            if marks.manual else None
        manager = ocp.CheckpointManager(
            Path(args.ckpt_dir).absolute(),
            options=ocp.CheckpointManagerOptions(
                max_to_keep=args.max_to_keep,
                enable_async_checkpointing=True,
                async_options=async_options,
            ),
        )

    def batch(n: int):
        """The batch of step ``n`` (1-based): the same after a restart as without one."""
        epoch, i = divmod(n - 1, batches_per_epoch)
        order = np.random.default_rng(args.seed + epoch).permutation(len(x_train))
        idx = order[i * args.batch_size:(i + 1) * args.batch_size]
        return x_train[idx], y_train[idx]

    def init_params(key):
        sizes = [64, 128, 64, 10]
        params = []
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            key, sub = jax.random.split(key)
            params.append({"w": jax.random.normal(sub, (fan_in, fan_out)) / np.sqrt(fan_in),
                           "b": jnp.zeros((fan_out,))})
        return params

    def logits_fn(params, x):
        for layer in params[:-1]:
            x = jax.nn.relu(x @ layer["w"] + layer["b"])
        return x @ params[-1]["w"] + params[-1]["b"]

    def loss_fn(params, x, y):
        logits = logits_fn(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def train_step(state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], x, y)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates),
                "opt_state": opt_state}, loss

    @jax.jit
    def accuracy(params, x, y):
        return (logits_fn(params, x).argmax(-1) == y).mean()

    with marks.phase("program_startup"):
        params = init_params(jax.random.key(args.seed))
        state = {"params": params, "opt_state": optimizer.init(params)}
        x0, y0 = batch(1)
        step_fn = jax.jit(train_step).lower(state, x0, y0).compile()

    start = 0
    latest = manager.latest_step()
    if latest is not None:
        with marks.phase("checkpoint_restore", step=latest):
            state = manager.restore(latest, args=ocp.args.StandardRestore(state))
        start = latest
        print(f"restored checkpoint step {start}", flush=True)
    if start >= args.steps:
        print(f"nothing to do: already at step {start}", flush=True)

    for n in range(start + 1, args.steps + 1):
        marks.step_start(n)
        with jax.profiler.StepTraceAnnotation("train", step_num=n):
            x, y = batch(n)
            state, loss = step_fn(state, x, y)
            if args.step_sleep > 0:
                time.sleep(args.step_sleep)
        if n % args.log_every == 0 or n == args.steps:
            print(f"step {n} loss {float(loss):.4f}", flush=True)
        if n % args.ckpt_every == 0 or n == args.steps:
            with marks.phase("checkpoint_save", step=n):
                manager.save(n, args=ocp.args.StandardSave(state))
            saves.started(n)
            print(f"checkpoint saved step {n}", flush=True)
        if args.eval_every and n % args.eval_every == 0:
            with marks.eval_phase():
                acc = float(accuracy(state["params"], x_val, y_val))
            print(f"eval step {n} accuracy {acc:.3f}", flush=True)

    manager.wait_until_finished()
    manager.close()
    if args.timings is not None:
        args.timings.write_text(json.dumps(marks.timings, indent=1))
    print(f"done: step {args.steps}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
