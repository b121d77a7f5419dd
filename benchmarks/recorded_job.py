"""A job of N steps written by the real recorder, on a simulated clock, in seconds.

The recorder (``goodput.recorder.Recorder``, whichever version ``PYTHONPATH`` points
at) records the job of ``benchmarks/synth.py``: 3 restarts that redo the steps after
the last checkpoint, a data-loading phase before every step, a 2 s blocking checkpoint
save every 1,000 steps and a 5 s ``eval`` every 5,000, steps of ``--step-s`` (0.5 s,
jitter +-5 %), of which a share ``--slow-share`` (none by default) takes twice as
long. With ``--hosts H`` (1 by default) each attempt is H processes in step, each with its
own recorder and its own ``host.name``: a step ends at its all-reduce when the last host
(drawn each step; a slow step is slow on it alone) reaches it, and the others record a
``goodput.collective_wait`` from their arrival (90 to 99 % of a normal step) to then.
The clock the recorder reads is simulated, and its flush runs exactly as the
background thread runs it (``_drain_and_write(heartbeat=True)`` under its lock) at
every flush interval (1 s, the default) of simulated time: the phases in flight at a
flush get their ``goodput.open`` record, a flush with nothing to write a heartbeat, so
the spool is what a real job of that length leaves. Each attempt is its own OS process;
a killed one ends with ``os._exit`` (no end marker, nothing after its last flush), the
last one with ``Recorder.shutdown``.

    python benchmarks/recorded_job.py OUT_DIR --steps 1000000
    PYTHONPATH=/tmp/old/src python benchmarks/recorded_job.py OUT_DIR   # another version

**Shapes** (``--shape``, :data:`SHAPES`; the shared builder of ``bench_live.py``,
``bench_report.py``, ``bench_growth.py`` and ``bench_store_memory.py``, which take
``--restarts`` and ``--shape`` through :func:`add_job_options`): ``own`` is the job above
(restarts drawn at random steps in the last 90 %); ``incumbent`` is the job shape of the
outside measurement of issue 40 (ml-goodput-measurement's: 1 s steps, a checkpoint every
100 steps, an ``eval`` every 500, the restarts evenly spaced: with 200 restarts at 10^6
steps, a kill about every 5,000 steps, each redoing the steps since its last checkpoint).

    python benchmarks/recorded_job.py OUT_DIR --steps 1000000 --restarts 200 --shape incumbent

Uses only ``Recorder(...)``, ``job_start``, ``phase_begin``/``phase_end``, ``record``,
``shutdown`` and the background thread's ``_drain_and_write``, which every version of
the recorder since schema 1.1 has.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

SEC = 1_000_000_000

#: shape name -> step seconds, checkpoint and evaluation periods (steps), how restarts fall
SHAPES = {
    "own": {"step_s": 0.5, "ckpt_every": 1000, "eval_every": 5000, "kills": "random"},
    "incumbent": {"step_s": 1.0, "ckpt_every": 100, "eval_every": 500, "kills": "even"},
}
#: the restart counts of issue 40's benchmarks (``--restarts`` takes any)
RESTARTS = (3, 200, 2000)


def kill_steps(steps: int, restarts: int, shape: str = "own", seed: int = 0) -> list[int]:
    """The steps after which each of ``restarts`` attempts is killed, ascending.

    ``own``: drawn at random (``random.Random(seed)``) in ``[steps // 10, steps)``, as this
    module always drew them; ``incumbent`` (``kills="even"``): every ``steps / (restarts +
    1)`` steps, plus half a checkpoint interval (each restart redoes the steps since the
    last checkpoint: 0 to ``ckpt_every - 1`` of them).

    Raises:
        ValueError: ``restarts`` < 0, or an unknown ``shape``.
    """
    if restarts < 0:
        raise ValueError(f"restarts must be at least 0, got {restarts}")
    sh = SHAPES[shape]
    if sh["kills"] == "random":
        rng = random.Random(seed)
        return sorted(rng.randrange(steps // 10, steps) for _ in range(restarts))
    half = sh["ckpt_every"] // 2
    return [min(steps - 1, steps * (i + 1) // (restarts + 1) + half) for i in range(restarts)]


def job_name(steps: int, restarts: int = 3, shape: str = "own") -> str:
    """A directory name for the job: ``N``, ``N-restartsR`` (R != 3), ``-incumbent``."""
    return (f"{steps}" + (f"-restarts{restarts}" if restarts != 3 else "")
            + (f"-{shape}" if shape != "own" else ""))


def add_job_options(ap, many: bool = True) -> None:
    """Add ``--restarts`` (several with ``many``: one job each) and ``--shape`` to ``ap``."""
    if many:
        ap.add_argument("--restarts", type=int, nargs="+", default=[3], metavar="R",
                        help="restarts of the job; several: one job each, side by side "
                        f"(default 3; issue 40 measures {', '.join(map(str, RESTARTS))})")
    else:
        ap.add_argument("--restarts", type=int, default=3, help="restarts (default 3)")
    ap.add_argument("--shape", choices=list(SHAPES), default="own",
                    help="own: 0.5 s steps, a checkpoint every 1,000, an eval every 5,000, "
                    "random restarts; incumbent: 1 s steps, a checkpoint every 100, an eval "
                    "every 500, evenly spaced restarts (default own)")


def state_of(steps: int, restarts: int = 3, shape: str = "own", seed: int = 0,
             slow_share: float = 0.0, hosts: int = 1, step_s: float | None = None,
             running: bool = False) -> dict:
    """The state :func:`run_attempt` starts the job's first attempt from.

    ``step_s`` overrides the shape's step time; with ``running`` the last attempt is
    killed too, right after its last flush (``steps`` is one more than it reaches): the
    job is still running, as ``bench_live.py`` needs it.
    """
    kill_at = kill_steps(steps, restarts, shape, seed)
    sh = SHAPES[shape]
    return {"kill_at": kill_at + ([steps] if running else []),
            "steps": steps + (1 if running else 0),
            "step_s": sh["step_s"] if step_s is None else step_s, "seed": seed,
            "t": 1_700_000_000 * SEC, "done": 0, "slow_share": slow_share, "hosts": hosts,
            "ckpt_every": sh["ckpt_every"], "eval_every": sh["eval_every"]}


class _Clock:
    """Stands in for the ``time`` module in ``goodput.recorder``: ``time_ns`` is simulated."""

    def __init__(self, t: int):
        self.t = t

    def time_ns(self) -> int:
        return self.t

    def __getattr__(self, name):
        return getattr(time, name)


class _Entry:
    """A phase in flight, as ``goodput.phases.Phase`` gives it to ``phase_begin``."""

    __slots__ = ("name", "_t0", "attrs")

    def __init__(self, name, t0, attrs):
        self.name, self._t0, self.attrs = name, t0, attrs


def run_attempt(out_dir: str, attempt: int, state: dict) -> dict:
    """Record one attempt in this process; returns the state the next attempt starts from."""
    from goodput import config, recorder, schema

    rng = random.Random(state["seed"] * 1000 + attempt)
    slow = state.get("slow_share", 0.0)
    slow_rng = random.Random(state["seed"] * 1000 + attempt + 7)  # the same steps otherwise
    t = state["t"]
    clock = _Clock(t)
    recorder.time = clock  # the recorder's clock reads (its thread does not run: see below)
    config.process_start_ns = lambda: state["t"]
    hosts = state.get("hosts", 1)
    if hosts > 1:  # one OS process records them all: each its own host, as on a pod
        from opentelemetry.sdk.resources import Resource

        make = config.make_resource
        config.make_resource = lambda job, att, index, *a, **kw: make(
            job, att, index, *a, **kw).merge(Resource({schema.RES_HOST_NAME: f"host{index}"}))
    recs = [recorder.Recorder(job_name="recorded", run_dir=out_dir, process_index=i,
                              process_count=hosts, flush_interval_s=1.0)
            for i in range(hosts)]
    for rec in recs:
        rec._run = lambda: None  # no background thread: flushes on the simulated clock
    interval = SEC
    nxt = [t - t % interval + interval]

    def advance(to: int) -> None:
        while nxt[0] <= to:
            clock.t = nxt[0]
            for rec in recs:
                with rec._lock:
                    rec._drain_and_write(heartbeat=True)
            nxt[0] += interval

    def phases(spans):
        """Record ``spans`` ``(host, name, start, end, attrs)``, begun and ended in time
        order across the hosts (a span ending at the same time as another begins ends
        first; an inner span begins after and ends before its outer one)."""
        ev = []
        for i, (h, name, a, b, attrs) in enumerate(spans):
            e = _Entry(name, a, attrs)
            ev += [(a, 1, i, h, e, None), (b, 0 if b > a else 2, -i, h, e, (name, a, b, attrs))]
        for at, _o, _i, h, e, rec_args in sorted(ev, key=lambda x: x[:3]):
            advance(at)
            if rec_args is None:
                recs[h].phase_begin(e)
            else:
                recs[h].phase_end(e)
                recs[h].record(*rec_args)

    def phase(name, a, b, attrs=None):
        phases([(h, name, a, b, attrs) for h in range(hosts)])
        return b

    for rec in recs:
        rec.job_start(t)
    t = phase(schema.ACCELERATOR_INIT, t, t + 5 * SEC)
    t = phase(schema.TRAINING_PREP, t, t + 10 * SEC)
    done = state["done"]
    if done:
        t = phase(schema.CHECKPOINT_RESTORE, t, t + 3 * SEC, {schema.ATTR_CHECKPOINT_STEP: done})
    t = phase(schema.PROGRAM_STARTUP, t, t + 20 * SEC)
    kill_at = state["kill_at"]
    stop = kill_at[attempt] if attempt < len(kill_at) else state["steps"]
    step_ns = int(state["step_s"] * SEC)
    for n in range(done + 1, stop + 1):
        t = phase(schema.DATA_LOADING, t, t + step_ns // 50)
        dur = base = step_ns * rng.uniform(0.95, 1.05)
        if slow and slow_rng.random() < slow:
            dur *= 2  # (with several hosts: on the last to arrive alone)
        if hosts == 1:
            t = phase(schema.STEP, t, t + int(dur), {schema.ATTR_STEP: n})
        else:  # one host (drawn) takes ``dur``, the others reach the all-reduce earlier
            last = rng.randrange(hosts)
            ready = [t + int(dur if h == last else base * rng.uniform(0.9, 0.99))
                     for h in range(hosts)]
            end = t + int(dur)
            phases([(h, schema.STEP, t, end, {schema.ATTR_STEP: n}) for h in range(hosts)]
                   + [(h, schema.COLLECTIVE_WAIT, ready[h], end, None)
                      for h in range(hosts) if ready[h] < end])
            t = end
        if n % state.get("ckpt_every", 1000) == 0:
            t = phase(schema.CHECKPOINT_SAVE, t, t + 2 * SEC,
                      {schema.ATTR_CHECKPOINT_STEP: n, schema.ATTR_BLOCKING: True})
            done = n
        if n % state.get("eval_every", 5000) == 0:
            t = phase(schema.CUSTOM_BADPUT, t, t + 5 * SEC, {schema.ATTR_BADPUT_TYPE: "eval"})
    if stop == state["steps"]:
        advance(t)
        clock.t = t
        for rec in recs:
            rec.shutdown()
        return {**state, "t": t, "done": done, "finished": True}
    advance(t)  # killed right after this flush: what came later is lost
    return {**state, "t": t + 60 * SEC, "done": done, "finished": False}


def write_job(out_dir: str, steps: int, restarts: int = 3, step_s: float | None = None,
              seed: int = 0, env=None, slow_share: float = 0.0, hosts: int = 1,
              shape: str = "own", running: bool = False) -> dict:
    """Record the job of ``shape`` (:data:`SHAPES`) into ``out_dir``, one child process
    per attempt; ``step_s`` overrides the shape's step seconds; ``slow_share`` (a
    fraction, 0 to 1) of its steps take twice as long; ``hosts`` processes (each its own
    recorder and spool files) run each attempt in step, a step ending at the all-reduce
    when the last host reaches it (the others record a collective wait); with
    ``running`` the last attempt is killed after its last flush (:func:`state_of`).

    Returns ``{"attempts": n, "seconds": wall time of the recording}``.
    """
    os.makedirs(out_dir, exist_ok=True)
    state = state_of(steps, restarts, shape, seed, slow_share, hosts, step_s, running)
    t0 = time.perf_counter()
    attempt = 0
    while True:
        out = subprocess.run(
            [sys.executable, __file__, out_dir, "--child", str(attempt),
             "--state", json.dumps(state)], check=True, capture_output=True, text=True, env=env)
        state = json.loads(out.stdout.strip().splitlines()[-1])
        if state["finished"] or attempt == len(state["kill_at"]) - 1 and running:
            break
        attempt += 1
    return {"attempts": attempt + 1, "seconds": time.perf_counter() - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--steps", type=int, default=10_000)
    add_job_options(ap, many=False)
    ap.add_argument("--step-s", type=float, default=None,
                    help="step seconds (default the shape's: own 0.5, incumbent 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slow-share", type=float, default=0.0,
                    help="fraction of steps (0 to 1) that take twice as long (default 0)")
    ap.add_argument("--hosts", type=int, default=1,
                    help="processes per attempt, each with its own recorder (default 1)")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        state = run_attempt(args.out_dir, args.child, json.loads(args.state))
        print(json.dumps(state), flush=True)
        if not state["finished"]:
            os._exit(0)  # a kill: no exit hook, no end marker
        return 0
    if not 0.0 <= args.slow_share <= 1.0:
        ap.error(f"--slow-share must be a fraction from 0 to 1, got {args.slow_share}")
    if args.hosts < 1:
        ap.error(f"--hosts must be at least 1, got {args.hosts}")
    info = write_job(args.out_dir, args.steps, args.restarts, args.step_s, args.seed,
                     slow_share=args.slow_share, hosts=args.hosts, shape=args.shape)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
