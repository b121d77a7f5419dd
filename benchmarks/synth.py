"""Synthetic spool files: a job of N steps with restarts, checkpoints and custom badput.

Writes the same OTLP JSON lines as the recorder (``goodput.spool`` encodes the
attributes), without building SDK span objects, so 10^6 steps take seconds.

    python benchmarks/synth.py OUT_DIR --steps 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import random

from goodput import config, schema
from goodput.spool import encode_attributes

SEC = 1_000_000_000


class _Writer:
    def __init__(self, path, resource):
        self.f = open(path, "w", encoding="utf-8")  # noqa: SIM115
        self.resource = {"attributes": encode_attributes(resource)}
        self.trace = os.urandom(16).hex()
        self.batch: list = []

    def span(self, name, t0, t1, attrs=None):
        span = {
            "traceId": self.trace,
            "spanId": os.urandom(8).hex(),
            "name": name,
            "kind": 1,
            "startTimeUnixNano": str(t0),
            "endTimeUnixNano": str(t1),
            "status": {},
        }
        if attrs:
            span["attributes"] = encode_attributes(attrs)
        self.batch.append(span)
        if len(self.batch) >= 512:
            self.flush()

    def flush(self):
        if self.batch:
            req = {"resourceSpans": [{"resource": self.resource, "scopeSpans": [
                {"scope": {"name": schema.SCOPE_NAME, "version": "0.1.0"}, "spans": self.batch}
            ]}]}
            self.f.write(json.dumps(req, separators=(",", ":")) + "\n")
            self.batch = []

    def close(self):
        self.flush()
        self.f.close()


def write_job(
    out_dir: str,
    steps: int,
    restarts: int = 3,
    ckpt_every: int = 1000,
    eval_every: int = 5000,
    step_s: float = 0.5,
    seed: int = 0,
) -> dict:
    """Write a synthetic job of ``steps`` kept steps to ``out_dir``.

    Returns ``{"attempts": n, "steps_with_redone": m}`` (step spans written, redone included).

    Each attempt restores the last checkpoint, runs until it is killed partway
    (``restarts`` times), redoing the steps after the checkpoint. Step times
    jitter ±5% around ``step_s`` seconds; every ``ckpt_every`` steps a 2 s
    blocking save; every ``eval_every`` steps a 5 s ``eval``.
    """
    rng = random.Random(seed)
    os.makedirs(out_dir, exist_ok=True)
    t = 1_700_000_000 * SEC
    step_ns = int(step_s * SEC)
    kill_at = sorted(rng.randrange(steps // 10, steps) for _ in range(restarts))
    done = 0  # last checkpointed step
    attempt = 0
    spans = 0
    while True:
        res = {schema.RES_SERVICE_NAME: "synth", schema.RES_JOB_NAME: "synth",
               schema.RES_ATTEMPT: attempt, schema.RES_PROCESS_INDEX: 0,
               schema.RES_PROCESS_COUNT: 1, schema.RES_SCHEMA_VERSION: schema.SCHEMA_VERSION}
        w = _Writer(config.spool_path(out_dir, 0, attempt, f"synth{attempt:04d}"), res)
        w.span(schema.JOB_START, t, t, {schema.ATTR_HEARTBEAT_INTERVAL_MS: 1000})
        w.span(schema.ACCELERATOR_INIT, t, t + 5 * SEC)
        t += 5 * SEC
        w.span(schema.TRAINING_PREP, t, t + 10 * SEC)
        t += 10 * SEC
        if done:
            w.span(schema.CHECKPOINT_RESTORE, t, t + 3 * SEC, {schema.ATTR_CHECKPOINT_STEP: done})
            t += 3 * SEC
        w.span(schema.PROGRAM_STARTUP, t, t + 20 * SEC)
        t += 20 * SEC
        stop = kill_at[attempt] if attempt < len(kill_at) else steps
        n = done + 1
        while n <= stop:
            d = int(step_ns * rng.uniform(0.95, 1.05))
            w.span(schema.DATA_LOADING, t, t + step_ns // 50)
            t += step_ns // 50
            w.span(schema.STEP, t, t + d, {schema.ATTR_STEP: n})
            t += d
            spans += 2
            if n % ckpt_every == 0:
                w.span(schema.CHECKPOINT_SAVE, t, t + 2 * SEC,
                       {schema.ATTR_CHECKPOINT_STEP: n, schema.ATTR_BLOCKING: True})
                t += 2 * SEC
                done = n
            if n % eval_every == 0:
                w.span(schema.CUSTOM_BADPUT, t, t + 5 * SEC, {schema.ATTR_BADPUT_TYPE: "eval"})
                t += 5 * SEC
            n += 1
        if stop == steps:
            w.span(schema.JOB_END, t, t, {schema.ATTR_END_REASON: "exit"})
            w.close()
            break
        w.close()  # killed: no end marker
        t += 60 * SEC  # infrastructure recovery
        attempt += 1
    return {"attempts": attempt + 1, "steps_with_redone": spans // 2}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    info = write_job(args.out_dir, args.steps, restarts=args.restarts, seed=args.seed)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
