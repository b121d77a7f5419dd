"""A SIGKILL loses nothing recorded: issue 36's acceptance, with the default settings.

Each trial runs ``examples/plain_torch/train.py`` (a plain PyTorch MLP, no goodput code,
``torch.save`` every 50 of 200 steps) under ``opentelemetry-instrument`` with nothing set
but ``OTEL_SERVICE_NAME`` (so the default flush interval, 1 s, and the default run
directory ``./goodput-runs/<job>``), SIGKILLs it at a random moment after step 120 ended
(up to one step time later, on top of the truth watcher's 10 ms poll), starts the same
command again after a random 0.3-1.5 s (it resumes from the checkpoint of step 100 and
finishes) and compares ``goodput report --format json`` with the driver's truth:

- lost steps (the killed attempt's ``steps_wasted``): exactly the steps after 100 that the
  truth file says ended before the kill;
- ``wasted_progress`` and ``infrastructure_recovery``: within 0.2 s of the truth model of
  ``benchmarks/launchers.py`` (``compute_truth``: the accounting rules applied to the
  script's own step, fetch, save and restore times, the kill time and the restarted
  process's start).

The driver is ``benchmarks/launchers.py``'s (imported, not changed): truth-file watcher,
kills, death polls, truth model. The same run directory is also reported with the spool
tails (``*.tail``) left out: what the journal alone gives, i.e. the recorder before the
tail, whose killed attempt ended at its last flush.

Run from the repository root (about 25 s per trial on a 2-core machine)::

    python benchmarks/kill_tail.py --trials 10 --seed 1 [--json out.json] [--keep]

Linux only (``/proc``); needs torch.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "plain_torch" / "train.py"
_OTEL = Path(sys.executable).parent / "opentelemetry-instrument"
OTEL = str(_OTEL) if _OTEL.exists() else shutil.which("opentelemetry-instrument")
TOL_S = 0.2
STEPS, CKPT_EVERY, KILL_AFTER, RESUME = 200, 50, 120, 100


def _launchers():
    """``benchmarks/launchers.py`` as a module."""
    mod = sys.modules.get("launchers")
    if mod is None:
        spec = importlib.util.spec_from_file_location("launchers", REPO / "benchmarks"
                                                      / "launchers.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["launchers"] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
    return mod


lh = _launchers()


@dataclass
class Trial:
    """One trial's plan and outcome (times in seconds)."""

    index: int
    delay_steps: float  # after step KILL_AFTER's end was seen, in step times
    restart_delay: float
    truth_lost: int | None = None
    truth_wasted_s: float | None = None
    truth_recovery_s: float | None = None
    lost: int | None = None
    wasted_s: float | None = None
    recovery_s: float | None = None
    journal_lost: int | None = None  # the same run directory, spool tails left out
    journal_wasted_s: float | None = None
    journal_recovery_s: float | None = None
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0


class DefaultDriver(lh.Driver):
    """The launchers driver, launching with nothing set but ``OTEL_SERVICE_NAME``: the run
    directory is the default ``./goodput-runs/<job>`` under the case's directory."""

    def __init__(self, case: str, workdir: Path, s):
        super().__init__(case, workdir, s)
        self.run_dir = self.base / "goodput-runs" / case

    def launch(self, tag, cmd, **env):
        full = lh.child_env(OTEL_SERVICE_NAME=self.case, LAUNCH_TAG=tag, **env)
        with open(self.base / f"{tag}.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=full, cwd=self.base)
        self.launches[tag] = proc
        return proc


def settings(step_sleep: float = 0.04):
    """The launchers settings of these runs (the flush interval is the recorder's default)."""
    return lh.Settings(steps=STEPS, ckpt_every=CKPT_EVERY, step_sleep=step_sleep,
                       flush_interval=1.0, timeout=300.0)


def _report(run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "goodput_processor.cli", "report", str(run_dir), "--format",
           "json", "--no-cache"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=lh.child_env(), timeout=120,
                         check=False)
    if res.returncode != 0:
        raise lh.CaseError(f"goodput report exited {res.returncode}: {res.stderr[-2000:]}")
    return json.loads(res.stdout)


def _figures(rep: dict) -> tuple[int, float, float]:
    (job,) = rep["jobs"]
    if len(job["attempts"]) != 2:
        raise lh.CaseError(f"{len(job['attempts'])} attempts in the report, expected 2")
    return (job["attempts"][0]["steps_wasted"], job["badput_s"]["wasted_progress"],
            job["badput_s"]["infrastructure_recovery"])


def run_trial(trial: Trial, workdir: Path, s, keep: bool = False) -> Trial:
    """Kill, restart, report; fills in ``trial`` (``failures`` lists what is off)."""
    t_begin = time.monotonic()
    d = DefaultDriver(f"kill{trial.index:02d}", workdir, s)
    try:
        cmd = [OTEL, sys.executable, str(TRAIN), "--ckpt-dir", str(d.ckpt_dir), "--steps",
               str(STEPS), "--ckpt-every", str(CKPT_EVERY), "--step-sleep", str(s.step_sleep),
               "--truth", str(d.truth_path)]
        d.launch("L0", cmd)
        ev = d.wait_step_end("L0", 0, KILL_AFTER)
        d.sleep_steps(trial.delay_steps)
        killed_at = d.kill(ev["pid"], signal.SIGKILL)
        d.wait_launch("L0", expect_rc=None)
        time.sleep(trial.restart_delay)
        d.launch("L1", cmd)  # the same command: it resumes from the checkpoint of step 100
        d.wait_launch("L1")
        procs = lh.processes(list(d.watcher.events), d.kills, dict(d.watcher.dead_at))
        truth = lh.compute_truth(procs, 0.0, margin=0.0)
        if [a.resume for a in truth.attempts] != [0, RESUME]:
            raise lh.CaseError(f"resumed from {[a.resume for a in truth.attempts]}")
        first = truth.attempts[0].procs[0]
        trial.truth_lost = sum(1 for name, _, t1, step in first.spans if name == "step"
                               and step > RESUME and t1 is not None and t1 <= killed_at)
        trial.truth_wasted_s = truth.buckets["wasted_progress"]
        trial.truth_recovery_s = truth.buckets["infrastructure_recovery"]
        trial.lost, trial.wasted_s, trial.recovery_s = _figures(_report(d.run_dir))
        journal_only = d.base / "journal-only"
        shutil.copytree(d.run_dir, journal_only,
                        ignore=shutil.ignore_patterns("*.tail", ".goodput-cache"))
        (trial.journal_lost, trial.journal_wasted_s,
         trial.journal_recovery_s) = _figures(_report(journal_only))
        _check(trial)
    except (lh.CaseError, ValueError, KeyError) as exc:
        trial.failures.append(f"driver: {exc}")
    finally:
        d.cleanup()
        if not keep and not trial.failures:
            shutil.rmtree(d.base, ignore_errors=True)
    trial.wall_s = time.monotonic() - t_begin
    return trial


def _check(t: Trial) -> None:
    if t.lost != t.truth_lost:
        t.failures.append(f"lost steps {t.lost}, truth {t.truth_lost}")
    for what, got, want in (("wasted_progress", t.wasted_s, t.truth_wasted_s),
                            ("infrastructure_recovery", t.recovery_s, t.truth_recovery_s)):
        if abs(got - want) > TOL_S:
            t.failures.append(f"{what} {got:.3f} s, truth {want:.3f} s (tolerance {TOL_S} s)")


def plan(n: int, seed: int) -> list[Trial]:
    """``n`` trials: kill delay U(0, 1) step times, restart delay U(0.3, 1.5) s."""
    rng = random.Random(seed)
    return [Trial(i, round(rng.uniform(0.0, 1.0), 3), round(rng.uniform(0.3, 1.5), 3))
            for i in range(n)]


def table(trials: list[Trial]) -> str:
    """The per-trial table (errors are report - truth, seconds) and the worst errors."""
    rows = ["| trial | lost (truth) | wasted truth s | err | journal-only err | recovery truth "
            "s | err | journal-only err | journal-only lost | ok |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for t in trials:
        if t.wasted_s is None:
            rows.append(f"| {t.index} | - | - | - | - | - | - | - | - | FAIL: {t.failures} |")
            continue
        rows.append(
            f"| {t.index} | {t.lost} ({t.truth_lost}) | {t.truth_wasted_s:.3f} | "
            f"{t.wasted_s - t.truth_wasted_s:+.3f} | "
            f"{t.journal_wasted_s - t.truth_wasted_s:+.3f} | {t.truth_recovery_s:.3f} | "
            f"{t.recovery_s - t.truth_recovery_s:+.3f} | "
            f"{t.journal_recovery_s - t.truth_recovery_s:+.3f} | {t.journal_lost} | "
            f"{'yes' if not t.failures else 'NO: ' + '; '.join(t.failures)} |")
    done = [t for t in trials if t.wasted_s is not None]
    if done:
        def worst(f):
            return max(abs(f(t)) for t in done)
        rows.append("")
        rows.append(
            f"max |err| with the tail: wasted {worst(lambda t: t.wasted_s - t.truth_wasted_s):.3f}"
            f" s, recovery {worst(lambda t: t.recovery_s - t.truth_recovery_s):.3f} s, lost "
            f"steps exact in {sum(t.lost == t.truth_lost for t in done)}/{len(done)}; journal "
            f"only: wasted {worst(lambda t: t.journal_wasted_s - t.truth_wasted_s):.3f} s, "
            f"recovery {worst(lambda t: t.journal_recovery_s - t.truth_recovery_s):.3f} s, "
            f"lost steps exact in {sum(t.journal_lost == t.truth_lost for t in done)}/"
            f"{len(done)}; median wall {statistics.median(t.wall_s for t in done):.1f} s")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--step-sleep", type=float, default=0.04)
    p.add_argument("--workdir", type=Path, default=None, help="default: a new temp dir")
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    p.add_argument("--json", type=Path, default=None, help="also write the trials as JSON")
    args = p.parse_args(argv)
    if OTEL is None:
        p.error("opentelemetry-instrument not found")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: cleanup runs
    s = settings(args.step_sleep)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="goodput-kill-tail-"))
    trials = []
    for t in plan(args.trials, args.seed):
        run_trial(t, workdir, s, args.keep)
        print(f"trial {t.index}: {t.wall_s:.1f} s {'ok' if not t.failures else t.failures}",
              flush=True)
        trials.append(t)
    print()
    print(table(trials))
    if args.json:
        args.json.write_text(json.dumps([asdict(t) for t in trials], indent=1))
    return 1 if any(t.failures for t in trials) else 0


if __name__ == "__main__":
    sys.exit(main())
