"""Chaos: kill the real training example at random points, restart it, check the report.

Each trial runs ``examples/pytorch_digits/train.py`` (a real PyTorch process with
goodput's default spool exporter) in a fresh run directory, ends its first
attempt with one fault, restarts it (the restart resumes from the last
checkpoint and finishes) and compares ``goodput report --format json`` with what
the driver itself saw:

- ``sigkill``: ``kill -9`` at a random moment (inside a step, a checkpoint save
  or an evaluation): nothing is written after it (the phase it was in is in the spool as
  a ``goodput.open`` record).
- ``sigterm``: ``kill -TERM`` at a random moment, as a preemption does: goodput installs
  no handler, so the process dies of the signal at once, like a SIGKILL, and leaves no
  end marker.
- ``exception``: ``--raise-at-step N``: an unhandled ``RuntimeError`` inside
  step N; the exit hook writes the end marker (reason ``exception``).

Ground truth per trial (driver clock, the same host clock as the children):

- end of attempt 0 = the moment of ``os.kill`` (``sigkill``, ``sigterm``), or the
  moment the driver read the line ``raising at step N`` that the example prints
  just before it raises (``exception``). The process exits later (traceback,
  exit hooks, interpreter teardown: about a second with torch loaded); that
  teardown is not training and counts as infrastructure recovery;
- true wasted progress = end of attempt 0 - mtime of the newest complete
  checkpoint file (the one the restart resumes from);
- true infrastructure recovery = restart (``Popen`` of attempt 1) - end of attempt 0.

Checks per trial (a failed check is listed in the table, and the exit status is 1):

- ``goodput report`` exits 0 and its JSON parses; two attempts, one disruption;
  the buckets are non-negative and sum to the total; the second attempt reaches
  the final step;
- attempt 0's end reason is ``killed`` (SIGKILL, SIGTERM) / ``exception``;
- everything flushed before the fault is there: attempt 0 has at least every
  step the driver saw finish before ``end - flush interval - slack`` (for
  ``exception``, every step it saw finish);
- wasted progress and infrastructure recovery within the tolerance of the truth.

Tolerance (derived in ``docs/reliability.md``): a SIGKILLed or SIGTERMed attempt
ends at its last flushed span or heartbeat, up to one flush interval before the
kill, so wasted progress reads low and recovery high by up to
``flush_interval + slack``; attempts that write their end marker (the exception)
are off by the slack only. ``slack`` (default 0.5 s) covers a delayed flusher thread or
process start on a busy machine and the gap between a checkpoint's mtime and
the end of its save span.

Run from the repository root (about 15-20 s per trial on a 2-core machine)::

    .venv/bin/python benchmarks/chaos_kills.py --trials 100 --seed 1

POSIX only.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "pytorch_digits" / "train.py"
KINDS = ("sigkill", "sigterm", "exception")
END_REASON = {"sigkill": "killed", "sigterm": "killed", "exception": "exception"}
STEP_RE = re.compile(r"^step (\d+) loss ")
CKPT_RE = re.compile(r"^ckpt-(\d{8})\.pt$")
_JOB_ENV = ("TORCHELASTIC_RESTART_COUNT", "RANK", "WORLD_SIZE", "JAX_PROCESS_ID",
            "JAX_NUM_PROCESSES")  # fmt: skip


@dataclass
class Config:
    """Settings shared by all trials."""

    steps: int = 40
    ckpt_every: int = 10
    eval_every: int = 15
    step_sleep: float = 0.03
    flush_interval: float = 0.5
    slack: float = 0.5
    restart_delay: tuple[float, float] = (0.3, 1.5)
    startup_share: float = 0.2  # of sigkill/sigterm trials: fault during start-up
    startup_delay: tuple[float, float] = (0.3, 3.0)  # s after launch (step 1 comes at ~6 s)
    timeout: float = 120.0

    @property
    def tol_killed(self) -> float:
        """Tolerance for a SIGKILLed attempt (no end marker)."""
        return self.flush_interval + self.slack

    @property
    def tol_marked(self) -> float:
        """Tolerance for an attempt that wrote its end marker (SIGTERM, exception)."""
        return self.slack


@dataclass
class Trial:
    """Plan and outcome of one trial (times: seconds, Unix epoch)."""

    index: int
    kind: str
    fault_step: int  # sigkill/sigterm: kill after seeing step fault_step-1, + delay
    delay_steps: float  # extra wait after that line, in step times
    restart_delay: float
    startup_delay: float | None = None  # set: kill this many s after launch, before step 1
    kill_step_seen: int | None = None  # last step line the driver saw before the fault
    ckpt_step: int | None = None
    truth_end: float | None = None
    truth_wasted_s: float | None = None
    truth_recovery_s: float | None = None
    report_end: float | None = None
    report_wasted_s: float | None = None
    report_recovery_s: float | None = None
    steps_recorded: int | None = None  # attempt 0: steps_kept + steps_wasted
    steps_required: int | None = None  # steps the report must have for attempt 0
    end_reason: str | None = None
    unrecorded: bool = False  # killed before goodput.configure() wrote anything
    skipped: dict[str, int] = field(default_factory=dict)  # report: records skipped, non-zero
    exit_lag_s: float | None = None  # fault -> the driver saw attempt 0's process exit
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def wasted_err(self) -> float | None:
        if self.report_wasted_s is None or self.truth_wasted_s is None:
            return None
        return self.report_wasted_s - self.truth_wasted_s

    @property
    def recovery_err(self) -> float | None:
        if self.report_recovery_s is None or self.truth_recovery_s is None:
            return None
        return self.report_recovery_s - self.truth_recovery_s


def child_env() -> dict[str, str]:
    """The children's environment: no stray goodput/OTel settings; checkout on PYTHONPATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GOODPUT_", "OTEL_")) and k not in _JOB_ENV
    }
    env["PYTHONUNBUFFERED"] = "1"
    paths = [str(REPO / "src"), str(REPO / "collectors")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


class Child:
    """A training process whose output lines are timestamped by a reader thread."""

    def __init__(self, cmd: list[str], env: dict[str, str], log):
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, bufsize=1, env=env,
        )  # fmt: skip
        self._lines: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self._log = log
        self._eof = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put((time.time(), line.rstrip("\n")))
        self._lines.put(None)

    def lines(self, deadline: float):
        """Yield ``(time seen, line)`` until EOF; TimeoutError past ``deadline``."""
        while not self._eof:
            try:
                item = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError("no output from the training before the deadline") from None
            if item is None:
                self._eof = True
                return
            self._log.write(f"{item[0]:.6f} {item[1]}\n")
            yield item

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def plan_trials(n: int, seed: int, cfg: Config, kinds: tuple[str, ...] = KINDS) -> list[Trial]:
    """``n`` trials from ``seed``: kinds in rotation (each at least once when n >= 3),
    fault step, extra delay and restart delay drawn at random."""
    rng = random.Random(seed)
    order = list(kinds)
    trials = []
    for i in range(n):
        if i % len(order) == 0:
            rng.shuffle(order)
        kind = order[i % len(order)]
        trial = Trial(
            index=i,
            kind=kind,
            # After the first checkpoint, and early enough to leave steps to redo.
            fault_step=rng.randint(cfg.ckpt_every + 2, cfg.steps - 2),
            delay_steps=0.0 if kind == "exception" else round(rng.uniform(0.0, 1.5), 3),
            restart_delay=round(rng.uniform(*cfg.restart_delay), 3),
        )
        startup = rng.random() < cfg.startup_share
        if startup and kind != "exception":
            trial.fault_step = 0
            trial.startup_delay = round(rng.uniform(*cfg.startup_delay), 3)
        trials.append(trial)
    return trials


def train_cmd(cfg: Config, run_dir: Path, ckpt_dir: Path, job: str) -> list[str]:
    return [
        sys.executable, str(TRAIN),
        "--run-dir", str(run_dir), "--ckpt-dir", str(ckpt_dir), "--job-name", job,
        "--steps", str(cfg.steps), "--ckpt-every", str(cfg.ckpt_every),
        "--eval-every", str(cfg.eval_every), "--step-sleep", str(cfg.step_sleep),
        "--log-every", "1", "--flush-interval", str(cfg.flush_interval),
    ]  # fmt: skip


def newest_checkpoint(ckpt_dir: Path) -> tuple[int, float] | None:
    found = [
        (int(m.group(1)), p.stat().st_mtime)
        for p in ckpt_dir.iterdir()
        if (m := CKPT_RE.match(p.name))
    ]
    return max(found) if found else None


def report_json(run_dir: Path) -> tuple[int, str, dict | None]:
    """Run ``goodput report RUN_DIR --format json``: (exit status, stderr, parsed or None)."""
    cmd = [sys.executable, "-m", "goodput_processor.cli", "report", str(run_dir),
           "--format", "json"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), check=False,
                         timeout=120)  # fmt: skip
    try:
        parsed = json.loads(res.stdout) if res.returncode == 0 else None
    except ValueError:
        parsed = None
    return res.returncode, res.stderr[-2000:], parsed


def run_trial(trial: Trial, cfg: Config, workdir: Path) -> Trial:
    """Run one trial in ``workdir/trial-<i>``; fills in the outcome and ``failures``."""
    t_begin = time.monotonic()
    job = f"chaos-{trial.index:03d}"
    base = workdir / f"trial-{trial.index:03d}"
    run_dir, ckpt_dir = base / "run", base / "ckpt"
    shutil.rmtree(base, ignore_errors=True)
    run_dir.mkdir(parents=True)
    ckpt_dir.mkdir(parents=True)
    env = child_env()
    cmd = train_cmd(cfg, run_dir, ckpt_dir, job)
    deadline = time.monotonic() + cfg.timeout
    children: list[Child] = []
    with open(base / "driver.log", "w") as log:
        try:
            _attempts(trial, cfg, cmd, env, ckpt_dir, deadline, children, log)
        except (TimeoutError, RuntimeError) as exc:
            trial.failures.append(f"driver: {exc}")
        finally:
            for child in children:
                child.stop()
    if not trial.failures:
        _check_report(trial, cfg, run_dir)
    trial.wall_s = time.monotonic() - t_begin
    return trial


def _attempts(trial, cfg, cmd, env, ckpt_dir, deadline, children, log) -> None:
    extra = ["--raise-at-step", str(trial.fault_step)] if trial.kind == "exception" else []
    first = Child(cmd + extra, env, log)
    children.append(first)
    seen: dict[int, float] = {}  # step -> when its line was seen
    fault_time = None
    sig = signal.SIGKILL if trial.kind == "sigkill" else signal.SIGTERM
    if trial.startup_delay is not None:  # during start-up (imports, data, model, warm-up)
        try:
            for t, line in first.lines(min(deadline, time.monotonic() + trial.startup_delay)):
                if m := STEP_RE.match(line):
                    seen[int(m.group(1))] = t
        except TimeoutError:
            pass
        if seen:
            raise RuntimeError("plan missed: step 1 came before the start-up fault")
        fault_time = time.time()
        os.kill(first.proc.pid, sig)
    for t, line in first.lines(deadline):
        if trial.kind == "exception" and line.startswith("raising at step "):
            fault_time = t
            break
        m = STEP_RE.match(line)
        if not m:
            continue
        n = int(m.group(1))
        seen[n] = t
        if trial.kind != "exception" and n == trial.fault_step - 1:
            recent = sorted(seen.items())[-6:]
            per_step = (recent[-1][1] - recent[0][1]) / max(1, len(recent) - 1)
            time.sleep(trial.delay_steps * per_step)
            fault_time = time.time()
            os.kill(first.proc.pid, sig)
            break
    for t, line in first.lines(deadline):  # drain what it wrote before dying
        if (m := STEP_RE.match(line)) and (fault_time is None or t <= fault_time):
            seen[int(m.group(1))] = t
    status = first.proc.wait()
    trial.exit_lag_s = time.time() - fault_time if fault_time is not None else None
    if fault_time is None or status == 0:
        raise RuntimeError(f"attempt 0 was not disrupted (exit status {status})")
    trial.kill_step_seen = max((s for s, t in seen.items() if t <= fault_time), default=0)
    if trial.kind != "exception":  # a signal: nothing is written after it
        cutoff = fault_time - cfg.flush_interval - cfg.slack
        trial.steps_required = max((s for s, t in seen.items() if t <= cutoff), default=0)
    else:
        trial.steps_required = trial.kill_step_seen
    ckpt = newest_checkpoint(ckpt_dir)
    trial.truth_end = fault_time
    # A start-up fault in the first ~0.3 s (interpreter start, ``import goodput``) comes
    # before the recorder exists: nothing is written, and the restart is attempt 0.
    trial.unrecorded = not any(f.stat().st_size for f in (ckpt_dir.parent / "run").iterdir())
    if trial.startup_delay is not None:
        # No step, no checkpoint: nothing to throw away (attempt 1 starts from scratch).
        if ckpt is not None or trial.kill_step_seen:
            raise RuntimeError("plan missed: the start-up fault came after training began")
        trial.truth_wasted_s = 0.0
    elif ckpt is None:
        raise RuntimeError("no checkpoint before the fault")
    else:
        trial.ckpt_step, mtime = ckpt
        trial.truth_wasted_s = fault_time - mtime

    time.sleep(trial.restart_delay)
    restart_time = time.time()
    second = Child(cmd, env, log)
    children.append(second)
    for _ in second.lines(deadline):
        pass
    if second.proc.wait() != 0:
        raise RuntimeError(f"the restarted training failed ({second.proc.returncode})")
    trial.truth_recovery_s = restart_time - fault_time


def _check_report(trial: Trial, cfg: Config, run_dir: Path) -> None:
    fail = trial.failures.append
    status, err, rep = report_json(run_dir)
    if rep is None:
        fail(f"report crashed or printed bad JSON (exit {status}): {err.strip()[-300:]}")
        return
    jobs = rep.get("jobs", [])
    if len(jobs) != 1:
        fail(f"expected one job, got {len(jobs)}")
        return
    job = jobs[0]
    atts = job["attempts"]
    if not trial.unrecorded and (len(atts) != 2 or job["disruptions"] != 1):
        fail(f"expected 2 attempts / 1 disruption, got {len(atts)} / {job['disruptions']}")
        return
    if trial.unrecorded:  # by design: a process that recorded nothing is not an attempt
        if len(atts) != 1 or job["disruptions"] != 0:
            fail(f"unrecorded first attempt, yet {len(atts)} attempts in the report")
        return
    a0 = atts[0]
    trial.end_reason = a0["end_reason"]
    trial.report_end = a0["end_unix_ns"] / 1e9
    trial.steps_recorded = a0["steps_kept"] + a0["steps_wasted"]
    trial.report_wasted_s = job["badput_s"]["wasted_progress"]
    trial.report_recovery_s = job["badput_s"]["infrastructure_recovery"]
    trial.skipped = {k: v for k, v in job.get("skipped", {}).items() if v}
    if a0["end_reason"] != END_REASON[trial.kind]:
        fail(f"end reason {a0['end_reason']!r}, expected {END_REASON[trial.kind]!r}")
    if trial.startup_delay is not None and trial.steps_recorded:
        fail(f"start-up fault, yet attempt 0 has {trial.steps_recorded} steps")
    if trial.steps_recorded < (trial.steps_required or 0):
        fail(f"attempt 0 has {trial.steps_recorded} steps, flushed before the fault: "
             f">= {trial.steps_required}")  # fmt: skip
    buckets = {"productive": job["productive_time_s"], **job["badput_s"]}
    if any(v < 0 for v in buckets.values()):
        fail(f"negative bucket: {buckets}")
    if abs(sum(buckets.values()) - job["total_time_s"]) > 1e-6:
        fail("buckets do not sum to the total")
    if job["max_productive_step"] != cfg.steps:
        fail(f"max productive step {job['max_productive_step']} != {cfg.steps}")
    tol = cfg.tol_marked if trial.kind == "exception" else cfg.tol_killed
    for name, err_s in (("wasted_progress", trial.wasted_err),
                        ("infrastructure_recovery", trial.recovery_err)):  # fmt: skip
        if err_s is None or abs(err_s) > tol:
            fail(f"{name} off by {err_s:+.3f} s (tolerance {tol} s)")


def summarize(trials: list[Trial], cfg: Config) -> str:
    """The per-trial table, per-kind maxima and the overall verdict."""
    out = [
        f"{'#':>3} {'kind':<9} {'fault':>5} {'seen':>4} {'ckpt':>4} {'req':>4} {'rec':>4} "
        f"{'wasted':>7} {'err':>7} {'recov':>6} {'err':>7} {'end':<9} ok"
    ]
    for t in trials:
        out.append(
            f"{t.index:>3} {t.kind:<9} {_fault(t):>5} {_n(t.kill_step_seen):>4} "
            f"{_n(t.ckpt_step):>4} {_n(t.steps_required):>4} {_n(t.steps_recorded):>4} "
            f"{_f(t.truth_wasted_s, 7, 3)} {_f(t.wasted_err, 7, 3, True)} "
            f"{_f(t.truth_recovery_s, 6, 2)} {_f(t.recovery_err, 7, 3, True)} "
            f"{t.end_reason or '-':<9} {'NO: ' + '; '.join(t.failures) if t.failures else 'yes'}"
            f"{' (killed before the recorder started: no attempt 0)' if t.unrecorded else ''}"
        )
    out.append("")
    out.append(f"tolerance: sigkill/sigterm {cfg.tol_killed:.2f} s (flush {cfg.flush_interval} "
               f"+ slack {cfg.slack}), exception {cfg.tol_marked:.2f} s (slack)")  # fmt: skip
    out.append(f"{'kind':<9} {'n':>3} {'fail':>4} {'wasted err min/med/max':>26} "
               f"{'recovery err min/med/max':>28} {'max |err|':>9}")  # fmt: skip
    for kind in (*KINDS, "all"):
        sel = [t for t in trials if kind in ("all", t.kind)]
        if not sel:
            continue
        we = [t.wasted_err for t in sel if t.wasted_err is not None]
        re_ = [t.recovery_err for t in sel if t.recovery_err is not None]
        mx = max((abs(x) for x in we + re_), default=float("nan"))
        out.append(
            f"{kind:<9} {len(sel):>3} {sum(bool(t.failures) for t in sel):>4} "
            f"{_mmm(we):>26} {_mmm(re_):>28} {mx:>9.3f}"
        )
    skipped: dict[str, int] = {}
    for t in trials:
        for k, v in t.skipped.items():
            skipped[k] = skipped.get(k, 0) + v
    out.append(f"records the report skipped, all trials: {skipped or 'none'}")
    for kind in KINDS:
        lags = [t.exit_lag_s for t in trials if t.kind == kind and t.exit_lag_s is not None]
        if lags:
            out.append(f"{kind}: fault -> process exit seen by the driver, median "
                       f"{statistics.median(lags):.3f} s, max {max(lags):.3f} s")  # fmt: skip
    return "\n".join(out)


def _fault(t: Trial) -> str:
    """Where the fault was planned: ``s<N>`` (in step N) or ``@<s>`` (s after launch)."""
    return f"@{t.startup_delay:.1f}" if t.startup_delay is not None else f"s{t.fault_step}"


def _n(v) -> str:
    return "-" if v is None else str(v)


def _f(v, w, p, sign=False) -> str:
    if v is None:
        return "-".rjust(w)
    return f"{v:+{w}.{p}f}" if sign else f"{v:{w}.{p}f}"


def _mmm(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{min(xs):+.3f}/{statistics.median(xs):+.3f}/{max(xs):+.3f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of "
                   + ", ".join(KINDS))  # fmt: skip
    p.add_argument("--steps", type=int, default=Config.steps)
    p.add_argument("--ckpt-every", type=int, default=Config.ckpt_every)
    p.add_argument("--step-sleep", type=float, default=Config.step_sleep)
    p.add_argument("--flush-interval", type=float, default=Config.flush_interval)
    p.add_argument("--slack", type=float, default=Config.slack)
    p.add_argument("--workdir", type=Path, default=None, help="default: a new temp dir")
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    p.add_argument("--json", type=Path, default=None, help="also write every trial as JSON")
    args = p.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        p.error(f"--kinds {args.kinds!r}: expected a subset of {', '.join(KINDS)}")
    args.kinds = kinds
    if args.trials < 1:
        p.error(f"--trials {args.trials}: must be >= 1")
    if args.steps < args.ckpt_every + 4:
        p.error(f"--steps {args.steps}: must be >= --ckpt-every + 4 ({args.ckpt_every + 4})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (timeout, kill): unwind, so that run_trial stops its training processes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cfg = Config(steps=args.steps, ckpt_every=args.ckpt_every, step_sleep=args.step_sleep,
                 flush_interval=args.flush_interval, slack=args.slack)  # fmt: skip
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="goodput-chaos-"))
    trials = plan_trials(args.trials, args.seed, cfg, args.kinds)
    t0 = time.monotonic()
    for t in trials:
        run_trial(t, cfg, workdir)
        print(f"trial {t.index:>3} {t.kind:<9} fault at {_fault(t):>5} "
              f"{t.wall_s:5.1f} s {'ok' if not t.failures else 'FAIL: ' + '; '.join(t.failures)}",
              flush=True)  # fmt: skip
        if not args.keep and not t.failures:
            shutil.rmtree(workdir / f"trial-{t.index:03d}", ignore_errors=True)
    print()
    print(summarize(trials, cfg))
    failed = sum(bool(t.failures) for t in trials)
    print(f"\n{len(trials)} trials (seed {args.seed}), {failed} failed, "
          f"{time.monotonic() - t0:.0f} s; failed trials kept under {workdir}")  # fmt: skip
    if args.json:
        rows = [asdict(t) | {"wasted_err": t.wasted_err, "recovery_err": t.recovery_err}
                for t in trials]  # fmt: skip
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
