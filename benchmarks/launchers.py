"""Real launchers, real kills: goodput's attempts and buckets against the driver's truth.

Each case runs a real data-parallel job (gloo, CPU, real OS processes) under a real
launcher, disrupts it the way real jobs are disrupted, relaunches it where a person would,
then runs ``goodput report RUN_DIR --format json`` as a process and compares it with the
truth the driver knows:

======================  =================================================================
case                    what happens
======================  =================================================================
torchrun_kill_worker    ``torchrun --max-restarts 1 --nproc-per-node 2``; SIGKILL rank 1
                        mid-step; the agent stops rank 0 and restarts both (restart count
                        1); the job finishes. 2 attempts x 2 processes.
torchrun_sigterm_agent  SIGTERM the agent mid-step (a preemption: it forwards SIGTERM to
                        the workers and exits), relaunch the same command by hand (restart
                        count 0 again); it resumes and finishes. Also times how long the
                        workers take to die after the SIGTERM, with goodput and without
                        (``train_ddp.py --no-goodput``). 2 x 2.
torchrun_sigkill_agent  SIGKILL the agent; its workers live on in their own session; the
                        driver SIGKILLs them (by pid, from the truth file) 0.3 s later and
                        relaunches by hand. 2 x 2.
torchrun_orphans        SIGKILL the agent and relaunch by hand at once, leaving the orphaned
                        workers running (they train on, writing checkpoints, until they
                        finish). The old attempt must be cut at the relaunch's start, with
                        an ``orphaned_processes`` warning; the relaunch's processes and
                        steps are its own. 2 x 2.
world_size_shrink       ``torchrun --nproc-per-node 2 --max-restarts 0``; SIGKILL rank 0
                        (the primary); the agent gives up; relaunch with
                        ``--nproc-per-node 1``. 2 attempts: 2 and 1 processes, and a
                        ``world_size_changed`` warning.
world_size_grow         the same from 1 rank to 2: 2 attempts of 1 and 2 processes.
mp_spawn                ``torch.multiprocessing.spawn`` with 2 ranks (no ``RANK`` variable);
                        runs to the end. 1 attempt x 2 processes, one spool file each, kept
                        steps = the steps run (not doubled), primary rank 0.
lightning_ddp           Lightning's own DDP launcher (``Trainer(devices=2, strategy="ddp")``
                        started with plain ``python``: it starts rank 1 itself with
                        ``LOCAL_RANK=1``), recorded by ``goodput.instrument()`` alone. 1 x 2.
spawn_kill_after_       ``mp.spawn`` of 1 rank, SIGKILLed a few ms after its
configure               ``goodput.configure()`` (a spawned rank imports torch before it
                        gets there: ~2.5 s after its process start), relaunched by hand.
                        2 attempts x 1 process. (The start marker is back-dated to the
                        process start; ``configure()`` also writes a heartbeat ending at
                        its own time, so the attempt ends within a flush interval.)
torchrun_restart_       torchrun_kill_worker under ``python -m goodput.torchrun`` (its
phases                  agent's events recorded): the recovery phases of the restart, each
                        within 0.5 s of the driver's (:func:`phase_truth`); the first failure
                        is the killed rank, seen as a signal; ``launcher_rendezvous_s``
                        present and within 0.1 s of the agent's own rendezvous event
                        (:func:`compare_launcher_evidence`). 2 x 2.
slow_rank               torchrun, 2 ranks, no restart; rank 1 sleeps 200 ms more in every step
                        from step 31; the ranks meet at an all-reduce marked
                        ``goodput.collective_wait()``: rank 1 must carry > 90 % of
                        training_slowdown. 1 x 2.
======================  =================================================================

The jobs are ``examples/launchers/train_ddp.py`` (explicit marks: ``accelerator_init``
around the process group, ``training_prep``, ``checkpoint_restore``, ``step(n)``,
``checkpoint_save`` on rank 0 every ``ckpt_every`` steps) and
``examples/launchers/train_lightning_ddp.py`` (instrumentors only). Every worker appends
what it saw to a truth file (``O_APPEND``, one ``os.write`` a line, so it is on disk once
written): its OS process start (``/proc/self/stat``), the begin and end of each marked phase
(``time.time()`` just outside the goodput mark), and ``exit`` when its work is done. The
driver adds what only it sees: when it sent each signal, and when each worker died (it polls
``/proc/PID/stat`` every 10 ms from the moment the worker's first truth line appears).

Truth (the documented accounting model, ``docs/accounting.md``, applied to these
observations; times on the one host clock):

- **attempts**: one per launch of workers the driver knows: a ``LAUNCH_TAG`` it set and
  torchrun's restart count. An attempt's processes are the workers that wrote a ``start``
  line; it starts at the earliest of their OS process starts and ends when its last process
  ended, where a process ends at the driver's ``kill`` (SIGKILL sent by the driver), else at
  its ``exit`` line (normal end: the end marker follows from the exit hook), else when the
  driver saw it dead (stopped by its agent's SIGTERM, or by an exception after a peer died).
  An end after the next attempt's start is cut there (orphans). A launcher records nothing
  itself: the time torchrun's agent spends before its workers start (its imports, the
  rendezvous) is before the attempt, so after a kill it is infrastructure recovery.
- **primary**: the lowest rank of the attempt; the buckets are painted on its phases, in
  the documented priority (wasted progress, checkpoint restore, checkpoint save, custom,
  data loading, program startup, accelerator init, training prep, process start-up, step,
  other), clipped to the attempt; a phase with a begin and no end ran until its process
  ended.
- **resume step** of an attempt: the step of its primary's first ``checkpoint_restore``,
  else its first step - 1. A step is **kept** when it is at most the resume step of every
  later attempt. **Wasted progress**: from the end of the last kept step (or of the save of
  the checkpoint resumed from, when later; the first step's start if none is kept) to the
  attempt's end, plus non-kept steps before that. **Infrastructure recovery**: from an
  attempt's end to the next one's start. **Productive** and **training slowdown**: the kept
  step time split by the documented rule (ideal = median kept step time, noise band
  ``max(3 sigma, 5 %)``) on the driver's step times. **Process start-up**: from the
  attempt's start to the primary's first marked phase (interpreter start, imports).
  **Other**: attempt time after that no marked phase covers (rendezvous waits outside
  marks, teardown).
  **Total**: first start to last end.
- **steps**: kept steps (primary) exactly; wasted steps between the number every process
  had surely flushed (begun at least one flush interval + ``flushed_margin``, 0.15 s, before
  it ended) and the number it began, the step in flight included (the most over the
  attempt's processes, as the report counts them).

Unknowable to the driver, so not compared beyond what the model implies: which process
the report calls the last alive at a kill (``end_reason`` is printed, not checked, except
``exit`` for the last attempt); buckets nobody marks (``program_startup``, ``custom:*``)
are truth 0. For Lightning the truth of a hook's time is a callback placed after goodput's
(microseconds later), and of a batch fetch the collate function inside it (the fetch also
indexes the data set: well under a millisecond a batch).

Tolerance. A process ended by a signal leaves no end marker; the processor ends it at its
last flushed span or heartbeat, up to one flush interval before it died, so the end of a
killed attempt (hence wasted progress, infrastructure recovery and other) may be off by up
to ``flush_interval``. On top, ``slack`` (default 0.35 s) covers this busy 2-core machine:
the driver's 10 ms death polls running late, the exit hook and interpreter teardown of a
process that raised after its peer died, process starts read at 10 ms resolution, and
``time.time()`` read a few microseconds outside each mark. Every bucket, productive time
and the total must be within ``flush_interval + slack`` of the truth; kept steps, attempts,
processes per attempt, the cut flag, the warnings and one spool file per OS process must be
exact; except ``first_failure_uncertain``, which hangs on where the kill fell against the
heartbeats: every disruption's first failure is checked against the worker the driver
killed first instead (the report names it, or lists it among the uncertain ones with that
warning).

Run from the repository root (about 2 minutes on a 2-core machine)::

    .venv/bin/python benchmarks/launchers.py                 # every case, summary table
    .venv/bin/python benchmarks/launchers.py --cases mp_spawn,lightning_ddp --keep
    .venv/bin/python benchmarks/launchers.py --cases torchrun_restart_phases --repeat 10

Linux only (``/proc``); needs torch (gloo) and, for ``lightning_ddp``, Lightning.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN_DDP = REPO / "examples" / "launchers" / "train_ddp.py"
TRAIN_LIGHTNING = REPO / "examples" / "launchers" / "train_lightning_ddp.py"
#: Priority of the phases (highest first), docs/accounting.md; "custom" types sort in there.
PRIORITY = ("wasted_progress", "checkpoint_restore", "checkpoint_save", "custom",
            "data_loading", "program_startup", "accelerator_init", "training_prep",
            "process_startup", "step")
_SCRUB_PREFIX = ("GOODPUT_", "OTEL_", "TORCHELASTIC_", "PL_", "JAX_")
_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
          "MASTER_ADDR", "MASTER_PORT", "LAUNCH_TAG")


@dataclass
class Settings:
    """Shared by all cases (seconds)."""

    steps: int = 40
    ckpt_every: int = 20
    step_sleep: float = 0.04
    flush_interval: float = 0.25
    slack: float = 0.35
    flushed_margin: float = 0.15  # a step begun flush_interval + this before a kill is flushed
    timeout: float = 150.0  # per case
    poll: float = 0.01  # death polls

    @property
    def tol(self) -> float:
        return self.flush_interval + self.slack


class CaseError(RuntimeError):
    """The case could not be driven as planned (a timeout, a launcher that failed)."""


@dataclass
class Expect:
    """What a case must come to, besides the truth: processes per attempt, warning codes;
    ``phases``: compare the recovery phases with the driver's (:func:`phase_truth`);
    ``slow_rank``: the rank the driver made slow must carry > 90 % of training_slowdown;
    ``launchers``: pids of launcher processes that write a spool of their own."""

    procs: list[int]
    warnings: set[str] = field(default_factory=set)
    phases: bool = False
    slow_rank: int | None = None
    launchers: set[int] = field(default_factory=set)


# --- the driver ------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    """Children's environment: no stray launcher/goodput settings, checkout on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_SCRUB_PREFIX) and k not in _SCRUB}
    paths = [str(REPO / "src"), str(REPO / "collectors"), str(REPO / "instrumentation")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process, None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2 :].split()
    return rest[0], int(rest[19])


class Watcher(threading.Thread):
    """Tails the truth file and notes when each worker it names dies (``/proc`` polls)."""

    def __init__(self, path: Path, poll: float):
        super().__init__(daemon=True, name="truth-watcher")
        self.path, self.poll = path, poll
        self.events: list[dict] = []
        self.ticks: dict[int, int] = {}  # pid -> its start time (ticks), against pid reuse
        self.dead_at: dict[int, float] = {}
        self.cond = threading.Condition()
        self._halt = threading.Event()

    def run(self) -> None:
        offset, tail = 0, b""
        while not self._halt.is_set():
            new = []
            try:
                with open(self.path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                offset += len(chunk)
                *lines, tail = (tail + chunk).split(b"\n")
                new = [json.loads(line) for line in lines if line.strip()]
            except FileNotFoundError:
                pass
            now = time.time()
            for ev in new:
                ev["seen"] = now
                pid = ev["pid"]
                if pid not in self.ticks:
                    st = _proc_stat(pid)
                    self.ticks[pid] = st[1] if st else -1
                    if st is None or st[0] in "ZXx":
                        self.dead_at[pid] = now
            for pid, ticks in self.ticks.items():
                if pid in self.dead_at:
                    continue
                st = _proc_stat(pid)
                if st is None or st[0] in "ZXx" or st[1] != ticks:
                    self.dead_at[pid] = now
            with self.cond:
                self.events.extend(new)
                self.cond.notify_all()
            self._halt.wait(self.poll)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def wait(self, pred: Callable[[], object], timeout: float, what: str):
        """Wait until ``pred()`` is truthy; returns it. CaseError after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = pred()
                if got:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CaseError(f"timed out waiting for {what}")
                self.cond.wait(min(left, 0.05))


@dataclass
class Kill:
    pid: int
    sig: int
    t: float
    what: str  # "worker" or "agent"


class Driver:
    """One case: its directories, launches, signals and the truth file's watcher."""

    def __init__(self, case: str, workdir: Path, s: Settings):
        self.case, self.s = case, s
        self.base = workdir / case
        shutil.rmtree(self.base, ignore_errors=True)
        self.run_dir, self.ckpt_dir = self.base / "run", self.base / "ckpt"
        self.run_dir.mkdir(parents=True)
        self.ckpt_dir.mkdir()
        self.truth_path = self.base / "truth.jsonl"
        self.watcher = Watcher(self.truth_path, s.poll)
        self.watcher.start()
        self.launches: dict[str, subprocess.Popen] = {}
        self.watchers: list[Watcher] = [self.watcher]
        self.kills: list[Kill] = []
        self.notes: dict[str, float] = {}
        self.deadline = time.monotonic() + s.timeout

    # launching -------------------------------------------------------------------------

    def ddp_args(self, steps: int | None = None, truth: bool = True) -> list[str]:
        args = [str(TRAIN_DDP), "--ckpt-dir", str(self.ckpt_dir), "--steps",
                str(steps or self.s.steps), "--ckpt-every", str(self.s.ckpt_every),
                "--step-sleep", str(self.s.step_sleep)]
        return args + (["--truth", str(self.truth_path)] if truth else [])

    def torchrun(self, nproc: int, max_restarts: int, args: list[str],
                 module: str = "torch.distributed.run") -> list[str]:
        return [sys.executable, "-m", module, "--standalone",
                "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts),
                "--monitor-interval", "0.1", *args]

    def launch(self, tag: str, cmd: list[str], **env: str) -> subprocess.Popen:
        """Start a launcher (its output goes to ``<tag>.log``); its workers get LAUNCH_TAG."""
        full = child_env(GOODPUT_JOB_NAME=self.case, GOODPUT_RUN_DIR=str(self.run_dir),
                         GOODPUT_FLUSH_INTERVAL_S=str(self.s.flush_interval),
                         LAUNCH_TAG=tag, **env)
        with open(self.base / f"{tag}.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=full, cwd=self.base)
        self.launches[tag] = proc
        return proc

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def wait_event(self, what: str, **match) -> dict:
        """The first truth line whose fields equal ``match`` (waits for it)."""
        def find():
            return next((e for e in self.watcher.events
                         if all(e.get(k) == v for k, v in match.items())), None)
        return self.watcher.wait(find, self.left(), what)

    def wait_step_end(self, tag: str, rank: int, step: int, restart: int = 0) -> dict:
        return self.wait_event(f"{tag} rank {rank} to end step {step}", launch=tag,
                               restart=restart, rank=rank, ev="end", name="step", step=step)

    def pids(self, tag: str | None = None) -> list[int]:
        return sorted({e["pid"] for e in list(self.watcher.events)
                       if tag is None or e["launch"] == tag})

    def wait_dead(self, pids: list[int], what: str) -> float:
        """Wait until every one of ``pids`` is dead; the time the last was seen dead."""
        dead = self.watcher.dead_at
        self.watcher.wait(lambda: all(p in dead for p in pids), self.left(), what)
        return max(dead[p] for p in pids)

    def wait_launch(self, tag: str, expect_rc: int | None = 0) -> int:
        """Wait for a launcher and all its workers to end; CaseError on an unexpected status."""
        proc = self.launches[tag]
        try:
            rc = proc.wait(self.left())
        except subprocess.TimeoutExpired:
            raise CaseError(f"launch {tag} did not end in time") from None
        self.wait_dead(self.pids(tag), f"the workers of {tag} to end")
        if expect_rc is not None and rc != expect_rc:
            log = (self.base / f"{tag}.log").read_text(errors="replace")[-3000:]
            raise CaseError(f"launch {tag} exited {rc}, expected {expect_rc}:\n{log}")
        return rc

    def kill(self, pid: int, sig: int, what: str = "worker") -> float:
        t = time.time()
        os.kill(pid, sig)
        self.kills.append(Kill(pid, sig, t, what))
        return t

    def sleep_steps(self, n: float) -> None:
        time.sleep(n * self.s.step_sleep)

    def cleanup(self) -> None:
        """SIGKILL whatever this case started that still runs (by pid), stop the watcher."""
        for proc in self.launches.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for w in self.watchers:
            w.stop()
            for pid, ticks in w.ticks.items():
                st = _proc_stat(pid)
                if st is not None and st[1] == ticks and st[0] not in "ZXx":
                    os.kill(pid, signal.SIGKILL)

    def report(self) -> dict:
        """``goodput report RUN_DIR --format json``, run as a process."""
        cmd = [sys.executable, "-m", "goodput_processor.cli", "report", str(self.run_dir),
               "--format", "json"]
        res = subprocess.run(cmd, capture_output=True, text=True, env=child_env(),
                             timeout=120, check=False)
        if res.returncode != 0:
            raise CaseError(f"goodput report exited {res.returncode}: {res.stderr[-2000:]}")
        return json.loads(res.stdout)


# --- the truth -------------------------------------------------------------------------


@dataclass
class Proc:
    """One worker as the truth file and the driver saw it."""

    pid: int
    rank: int
    world: int
    launch: str
    restart: int
    start: float
    end: float
    how: str  # "killed" (by the driver), "exit" (its work done), "died" (seen dead)
    spans: list[tuple[str, float, float | None, int | None]] = field(default_factory=list)


@dataclass
class TruthAttempt:
    key: tuple[str, int]
    start: float
    end: float
    cut: bool
    procs: list[Proc]
    resume: int | None = None
    steps_kept: int = 0
    steps_wasted: tuple[int, int] = (0, 0)  # (surely flushed, started)
    kept: list[tuple[float, float, float]] = field(default_factory=list)  # start, end, net


@dataclass
class Truth:
    attempts: list[TruthAttempt]
    buckets: dict[str, float]  # productive, every badput bucket, total
    max_step: int | None
    ideal: float | None = None  # the ideal step time and noise band the truth used
    tol: float | None = None


def processes(events: list[dict], kills: list[Kill], dead_at: dict[int, float]) -> list[Proc]:
    """The workers of a case from its truth lines, the driver's kills and death times."""
    by_pid: dict[int, list[dict]] = {}
    for e in events:
        by_pid.setdefault(e["pid"], []).append(e)
    killed = {k.pid: k.t for k in kills if k.sig == signal.SIGKILL and k.what == "worker"}
    out = []
    for pid, evs in by_pid.items():
        starts = [e for e in evs if e["ev"] == "start"]
        if not starts:
            continue
        exits = [e["t"] for e in evs if e["ev"] == "exit"]
        if pid in killed:
            end, how = killed[pid], "killed"
        elif exits:
            end, how = exits[0], "exit"
        elif pid in dead_at:
            end, how = dead_at[pid], "died"
        else:
            end, how = max(e["t"] for e in evs), "running?"
        p = Proc(pid, evs[-1]["rank"], evs[-1]["world"], evs[0]["launch"], evs[0]["restart"],
                 starts[0]["t"], end, how)
        open_: dict[tuple, list[float]] = {}
        for e in evs:
            key = (e.get("name"), e.get("step"))
            if e["ev"] == "begin":
                open_.setdefault(key, []).append(e["t"])
            elif e["ev"] == "end" and open_.get(key):
                p.spans.append((key[0], open_[key].pop(0), e["t"], key[1]))
        for (name, step), t0s in open_.items():
            p.spans.extend((name, t0, None, step) for t0 in t0s)
        p.spans.sort(key=lambda s: s[1])
        out.append(p)
    return out


def _group(procs: list[Proc]) -> list[TruthAttempt]:
    groups: dict[tuple[str, int], list[Proc]] = {}
    for p in procs:
        groups.setdefault((p.launch, p.restart), []).append(p)
    attempts = [TruthAttempt(key, min(p.start for p in g), max(p.end for p in g), False,
                             sorted(g, key=lambda p: p.rank)) for key, g in groups.items()]
    attempts.sort(key=lambda a: a.start)
    for a, nxt in itertools.pairwise(attempts):
        if a.end > nxt.start:
            a.end, a.cut = nxt.start, True
    return attempts


def _resume(p: Proc) -> int | None:
    for name, delta in (("checkpoint_restore", 0), ("step", 1)):
        got = [s for s in p.spans if s[0] == name and s[3] is not None]
        if got:
            return min(got, key=lambda s: (s[1], s[3]))[3] - delta
    return None


def _paint(a0: float, a1: float, ivals: list[tuple[float, float, int]]):
    """Elementary segments of [a0, a1] and the top (lowest) level covering each (None: other)."""
    bounds = sorted({a0, a1, *(t for s, e, _ in ivals for t in (s, e))})
    segs = []
    for lo, hi in itertools.pairwise(bounds):
        levels = [lv for s, e, lv in ivals if s <= lo and e >= hi]
        segs.append((lo, hi, min(levels) if levels else None))
    return segs


def compute_truth(procs: list[Proc], flush: float,
                  ideal: float | None = None, margin: float = 0.15) -> Truth:
    """The buckets and structure the accounting model gives for these observations."""
    attempts = _group(procs)
    customs = sorted({s[0] for p in procs for s in p.spans if s[0].startswith("custom:")})
    names = [n for n in PRIORITY if n != "custom"]
    names[3:3] = customs
    level = {n: i for i, n in enumerate(names)}
    sums = dict.fromkeys(names, 0.0)
    sums["other"] = 0.0
    resume = [_resume(a.procs[0]) for a in attempts]
    for a, r in zip(attempts, resume, strict=True):
        a.resume = r
    kept_times: list[float] = []
    recovery = 0.0
    max_step = None
    for i, a in enumerate(attempts):
        later = [r for r in resume[i + 1 :] if r is not None]
        bound = min(later) if later else None
        has_next = i + 1 < len(attempts)
        prim = a.procs[0]
        ivals, steps = [], []
        for name, t0, t1, step in prim.spans:
            s, e = min(max(t0, a.start), a.end), min(max(prim.end if t1 is None else t1,
                                                          a.start), a.end)
            if name == "step":
                if e > s:
                    steps.append((s, e, step, bound is None or step <= bound))
            elif e > s and name in level:
                ivals.append((s, e, level[name]))
        ivals += [(s, e, level["step"]) for s, e, _, _ in steps]
        first = min([s for s, _, _ in ivals] + [a.end])  # process start-up: before it
        if first > a.start:
            ivals.append((a.start, first, level["process_startup"]))
        if has_next and steps:
            kept = [st for st in steps if st[3]]
            ws = max(st[1] for st in kept) if kept else min(st[0] for st in steps)
            if kept and bound is not None:
                saves = [min(max(t1 if t1 is not None else prim.end, a.start), a.end)
                         for n, _, t1, st in prim.spans if n == "checkpoint_save" and st == bound]
                ws = max([ws, *saves])
            if ws < a.end:
                ivals.append((ws, a.end, level["wasted_progress"]))
        net = [0.0] * len(steps)
        for lo, hi, lv in _paint(a.start, a.end, ivals):
            if lv is None:
                sums["other"] += hi - lo
            elif lv == level["step"]:
                j = next(j for j, st in enumerate(steps) if st[0] <= lo and st[1] >= hi)
                net[j] += hi - lo
            else:
                sums[names[lv]] += hi - lo
        for st, t in zip(steps, net, strict=True):
            if st[3]:
                kept_times.append(t)
                a.kept.append((st[0], st[1], t))
                max_step = st[2] if max_step is None else max(max_step, st[2])
            else:
                sums["wasted_progress"] += t
        a.steps_kept = sum(st[3] for st in steps)
        if bound is not None:
            lo_n = hi_n = 0
            for p in a.procs:
                started = {step for n, t0, _, step in p.spans
                           if n == "step" and step > bound and a.start <= t0 < min(a.end, p.end)}
                sure = {step for n, t0, _, step in p.spans if n == "step" and step > bound
                        and a.start <= t0 < min(a.end, p.end - flush - margin)}
                lo_n, hi_n = max(lo_n, len(sure)), max(hi_n, len(started))
            a.steps_wasted = (lo_n, hi_n)
        if has_next:
            recovery += attempts[i + 1].start - a.end
    slowdown, t_ideal, tol = 0.0, None, None
    if kept_times:
        t_ideal = ideal if ideal is not None else statistics.median(kept_times)
        tol = max(1e-6, 0.05 * t_ideal)
        if len(kept_times) >= 2:
            diffs = [abs(c - b) for b, c in itertools.pairwise(kept_times)]
            tol = max(tol, 3 * statistics.median(diffs) / (math.sqrt(2) * 0.6745))
        slowdown = sum(t - t_ideal for t in kept_times if t > t_ideal + tol)
    buckets = {"productive": sum(kept_times) - slowdown, "training_slowdown": slowdown,
               "infrastructure_recovery": recovery, "program_startup": 0.0}
    buckets.update({n: v for n, v in sums.items() if n != "step"})
    buckets["total"] = attempts[-1].end - attempts[0].start if attempts else 0.0
    return Truth(attempts, buckets, max_step, t_ideal, tol)


# --- recovery phases and host attribution ------------------------------------------------

#: Recovery phases (goodput_processor.analysis.recovery.PHASES) and the most each may differ
#: from the driver's measurement (s): the brief of issue 18.
PHASES = ("detection", "termination", "rescheduling", "startup", "rendezvous_init", "restore",
          "recompilation_warmup")
PHASE_TOL = 0.5


def phase_truth(truth: Truth) -> list[dict[str, float]]:
    """Per disruption, the recovery phases as the driver measured them (seconds).

    The documented rule (docs/accounting.md, "Recovery phases") on the driver's times: last
    progress = the latest step end of the failed attempt's workers; first failure = the
    earliest end of its workers (the driver's SIGKILL, an exit line, or the moment the driver
    saw it dead); its end; the next attempt's start (the earliest OS process start); its
    primary's first marked phase; its first kept step; its restore spans in between; and the
    warm-up: its leading kept steps slower than max(ideal, its median step time) by more than
    the noise band, each by its time above that level (nothing marks compilation here).
    """
    out = []
    for a, r in itertools.pairwise(truth.attempts):
        last = max((t1 for p in a.procs for n, _, t1, _ in p.spans
                    if n == "step" and t1 is not None and t1 <= a.end), default=None)
        fail = min(p.end for p in a.procs)
        fail = min(max(fail, last if last is not None else fail), a.end)
        prim = r.procs[0]
        first = min([t0 for _, t0, _, _ in prim.spans] + [r.end])
        t_fk = r.kept[0][0] if r.kept else r.end
        restore = sum(max(0.0, min(t1 if t1 is not None else prim.end, t_fk) - max(t0, first))
                      for n, t0, t1, _ in prim.spans if n == "checkpoint_restore")
        warm = 0.0
        if r.kept and truth.ideal is not None:
            level = max(truth.ideal, statistics.median(t for _, _, t in r.kept))
            for _, _, t in r.kept:
                if t <= level + truth.tol:
                    break
                warm += t - level
        out.append({"detection": None if last is None else fail - last,
                    "termination": a.end - fail, "rescheduling": r.start - a.end,
                    "startup": first - r.start, "rendezvous_init": t_fk - first - restore,
                    "restore": restore, "recompilation_warmup": warm})
    return out


def compare_first_failures(out: Outcome, truth: Truth, rep: dict) -> None:
    """Each disruption's first failure against the driver's kills: where the driver killed a
    worker of the failed attempt, the first it killed failed first. The report must name it,
    or, with a ``first_failure_uncertain`` warning, count it among the processes it says may
    have failed first; the warning must come with such a record (and the reverse)."""
    fail = out.failures.append
    job = rep["jobs"][0]
    recs = job.get("recovery", [])
    uncertain = {w["attempt"] for w in job.get("warnings", [])
                 if w["code"] == "first_failure_uncertain"}
    if uncertain != {r["attempt"] for r in recs if r["first_failure"]["uncertain_among"]}:
        fail(f"first_failure_uncertain warnings for attempts {sorted(uncertain)} do not match "
             "the recovery records that list other candidates")
    kills = sorted((k.t, k.pid) for k in out.kills if k.what == "worker")
    for i, rec in enumerate(recs[:len(truth.attempts) - 1]):
        rank = {p.pid: p.rank for p in truth.attempts[i].procs}
        first = next((rank[pid] for _, pid in kills if pid in rank), None)
        if first is None:
            continue
        ff = rec["first_failure"]
        named = {ff["process"], *ff["uncertain_among"]}
        out.structure.append(f"recovery {i}: first failure {ff['process']}, uncertain among "
                             f"{ff['uncertain_among']}; the driver killed rank {first} first")
        if first not in named:
            fail(f"recovery {i}: the report says process {ff['process']} failed first"
                 f"{' (or ' + str(ff['uncertain_among']) + ')' if ff['uncertain_among'] else ''}"
                 f", the driver killed rank {first} first")


def compare_recovery(out: Outcome, truth: Truth, rep: dict, expect: Expect) -> None:
    """Recovery phases against :func:`phase_truth` (each within :data:`PHASE_TOL`), the
    first failure against the driver's kills, and the slow rank's share of the slowdown."""
    fail = out.failures.append
    job = rep["jobs"][0]
    if expect.phases:
        want = phase_truth(truth)
        got = job.get("recovery", [])
        if len(got) != len(want):
            fail(f"{len(got)} recovery records, truth {len(want)} disruptions")
            return
        killed = {k.pid for k in out.kills if k.what == "worker" and k.sig == signal.SIGKILL}
        for i, (tw, rw) in enumerate(zip(want, got, strict=True)):
            for name in PHASES:
                t, r = tw[name], rw["phases_s"][name]
                out.phases[f"{i}.{name}"] = (t, r)
                if (t is None) != (r is None) or (t is not None and abs(r - t) > PHASE_TOL):
                    fail(f"recovery {i} {name}: report {r}, truth {t} (tolerance {PHASE_TOL})")
            ff = rw["first_failure"]
            pids = {p.pid for p in truth.attempts[i].procs if p.pid in killed}
            if expect.launchers and pids and ff["how"] != "signal":
                fail(f"recovery {i}: first failure {ff['how']!r}, the launcher saw SIGKILL")
        # the phases break the buckets down: rescheduling is infrastructure_recovery, and
        # process_startup is the first attempt's start-up plus the restarts' startup phases
        if abs(sum(x["phases_s"]["rescheduling"] for x in got)
               - job["badput_s"]["infrastructure_recovery"]) > 1e-6:
            fail("the rescheduling phases do not add up to infrastructure_recovery")
        a0 = truth.attempts[0]
        first0 = min([t0 for _, t0, _, _ in a0.procs[0].spans] + [a0.end]) - a0.start
        rest = job["badput_s"]["process_startup"] - sum(x["phases_s"]["startup"] for x in got)
        out.notes["first_attempt_startup_err_s"] = rest - first0
        if abs(rest - first0) > PHASE_TOL:
            fail(f"process_startup - startup phases = {rest:.3f} s, the first attempt's "
                 f"start-up was {first0:.3f} s")
        for i, (tw, rw) in enumerate(zip(want, got, strict=True)):
            t = sum(v for v in tw.values() if v is not None)
            r = sum(v for v in rw["phases_s"].values() if v is not None)
            out.notes[f"recovery_{i}_total_err_s"] = r - t
            if abs(r - t) > PHASE_TOL:
                fail(f"recovery {i}: phases add up to {r:.3f} s, truth {t:.3f} s")
    if expect.slow_rank is not None:
        slowdown = job["badput_s"]["training_slowdown"]
        mine = sum(h["slowdown_s"] for h in job["host_badput"]
                   if h["process"] == expect.slow_rank)
        out.notes["slow_rank_share"] = mine / slowdown if slowdown else 0.0
        out.notes["slowdown_s"] = slowdown
        if not slowdown or mine / slowdown <= 0.9:
            fail(f"rank {expect.slow_rank} carries {mine:.3f} s of {slowdown:.3f} s "
                 "training_slowdown (<= 90 %)")


#: The most the report's ``launcher_rendezvous_s`` may differ from the agent's own
#: ``torchelastic.worker.status.RENDEZVOUS`` event (s): issue 36.
RENDEZVOUS_TOL = 0.1


def agent_rendezvous(run_dir: Path) -> dict[int, tuple[float, int]]:
    """The agent's rendezvous events read straight from the launcher's spool (not through
    the processor): restart count -> (duration s, end ns since the epoch)."""
    out: dict[int, tuple[float, int]] = {}
    for path in sorted(run_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                req = json.loads(line)
            except ValueError:
                continue  # a torn last line
            for rs in req.get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    for sp in ss.get("spans", []):
                        attrs = {a["key"]: next(iter(a["value"].values()))
                                 for a in sp.get("attributes", [])}
                        if (attrs.get("goodput.launcher.event")
                                != "torchelastic.worker.status.RENDEZVOUS"):
                            continue
                        t0, t1 = int(sp["startTimeUnixNano"]), int(sp["endTimeUnixNano"])
                        restart = int(attrs.get("goodput.launcher.restart_count", -1))
                        out[restart] = ((t1 - t0) / 1e9, t1)
    return out


def compare_launcher_evidence(out: Outcome, rep: dict, run_dir: Path) -> None:
    """Each restart's ``launcher_rendezvous_s`` against the agent's rendezvous event of that
    restart (:func:`agent_rendezvous`): present, within :data:`RENDEZVOUS_TOL`. Notes how
    far the event's end lies after the next attempt's recorded start (the OS process start,
    read in 10 ms ticks: it can lie after it)."""
    job = rep["jobs"][0]
    events = agent_rendezvous(run_dir)
    for i, rec in enumerate(job.get("recovery", [])):
        want = events.get(i + 1)
        got = rec.get("evidence", {}).get("launcher_rendezvous_s")
        if want is None:
            out.failures.append(f"recovery {i}: the agent recorded no rendezvous for restart "
                                f"{i + 1}")
            continue
        start = job["attempts"][i + 1]["start_unix_ns"]
        out.notes[f"agent_rendezvous_{i}_s"] = want[0]
        out.notes[f"agent_rendezvous_{i}_end_after_start_ms"] = (want[1] - start) / 1e6
        if got is None:
            out.failures.append(f"recovery {i}: no launcher_rendezvous_s; the agent's "
                                f"rendezvous took {want[0]:.3f} s")
            continue
        out.notes[f"launcher_rendezvous_{i}_err_s"] = got - want[0]
        if abs(got - want[0]) > RENDEZVOUS_TOL:
            out.failures.append(f"recovery {i}: launcher_rendezvous_s {got:.3f}, the agent's "
                                f"rendezvous {want[0]:.3f} s (tolerance {RENDEZVOUS_TOL})")


# --- comparing -------------------------------------------------------------------------


@dataclass
class Outcome:
    """One case: what was compared, the errors (report - truth, seconds) and failures."""

    case: str
    failures: list[str] = field(default_factory=list)
    errors: dict[str, float] = field(default_factory=dict)
    truth: dict[str, float] = field(default_factory=dict)
    reported: dict[str, float] = field(default_factory=dict)
    structure: list[str] = field(default_factory=list)  # per attempt, one line
    warnings: list[str] = field(default_factory=list)
    notes: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    base: Path | None = None
    phases: dict[str, tuple] = field(default_factory=dict)  # "i.phase" -> (truth, report)
    kills: list = field(default_factory=list)

    @property
    def max_err(self) -> float:
        return max((abs(v) for v in self.errors.values()), default=float("nan"))


def compare(out: Outcome, truth: Truth, rep: dict, procs: list[Proc], run_dir: Path,
            s: Settings, expect: Expect) -> None:
    """Fill ``out`` from the report ``rep`` against ``truth``; failures go to out.failures."""
    fail = out.failures.append
    jobs = rep.get("jobs", [])
    if len(jobs) != 1:
        fail(f"expected 1 job in the report, got {len(jobs)}")
        return
    job = jobs[0]
    got = {"productive": job["productive_time_s"], **job["badput_s"],
           "total": job["total_time_s"]}
    for name in sorted(set(got) | set(truth.buckets)):
        t, r = truth.buckets.get(name, 0.0), got.get(name, 0.0)
        out.truth[name], out.reported[name], out.errors[name] = t, r, r - t
        if abs(r - t) > s.tol:
            fail(f"{name}: report {r:.3f} s, truth {t:.3f} s (off by {r - t:+.3f}, "
                 f"tolerance {s.tol:.2f})")
    out.warnings = [f"{w['code']}: {w['message']}" for w in job.get("warnings", [])]
    # first_failure_uncertain depends on the kill's timing against the heartbeats: it is
    # judged against the driver's kills by compare_first_failures, not expected
    codes = {w["code"] for w in job.get("warnings", [])} - {"first_failure_uncertain"}
    if codes != expect.warnings:
        fail(f"warnings {sorted(codes)}, expected {sorted(expect.warnings)}")
    if [len(a.procs) for a in truth.attempts] != expect.procs:
        fail(f"plan missed: the truth has processes {[len(a.procs) for a in truth.attempts]} "
             f"per attempt, the case needs {expect.procs}")
    atts = job["attempts"]
    for i, ta in enumerate(truth.attempts):
        ra = atts[i] if i < len(atts) else None
        line = (f"a{i}: truth procs {len(ta.procs)} kept {ta.steps_kept} wasted "
                f"{ta.steps_wasted[0]}-{ta.steps_wasted[1]} resume {ta.resume} cut {ta.cut}")
        if ra is not None:
            line += (f" | report procs {ra['processes']} kept {ra['steps_kept']} wasted "
                     f"{ra['steps_wasted']} resume {ra['resume_step']} cut {ra['cut']} "
                     f"end {ra['end_reason']} start {ra['start_unix_ns'] / 1e9 - ta.start:+.3f}"
                     f" end {ra['end_unix_ns'] / 1e9 - ta.end:+.3f}")
        out.structure.append(line)
    if len(atts) != len(truth.attempts):
        fail(f"{len(atts)} attempts in the report, truth {len(truth.attempts)}")
        return
    for i, (ta, ra) in enumerate(zip(truth.attempts, atts, strict=True)):
        want = {"processes": len(ta.procs), "steps_kept": ta.steps_kept, "cut": ta.cut,
                "primary_process": 0, "declared_processes": ta.procs[0].world,
                "resume_step": ta.resume}
        for k, v in want.items():
            if ra[k] != v:
                fail(f"attempt {i}: {k} {ra[k]!r}, truth {v!r}")
        lo, hi = ta.steps_wasted
        if not lo <= ra["steps_wasted"] <= hi:
            fail(f"attempt {i}: steps_wasted {ra['steps_wasted']}, truth {lo}..{hi}")
        if abs(ra["start_unix_ns"] / 1e9 - ta.start) > s.slack:
            fail(f"attempt {i}: starts {ra['start_unix_ns'] / 1e9 - ta.start:+.3f} s off")
        if not -s.tol <= ra["end_unix_ns"] / 1e9 - ta.end <= s.slack:
            fail(f"attempt {i}: ends {ra['end_unix_ns'] / 1e9 - ta.end:+.3f} s off")
    if atts[-1]["end_reason"] != "exit":
        fail(f"last attempt ends with {atts[-1]['end_reason']!r}, expected 'exit'")
    if job["max_productive_step"] != truth.max_step:
        fail(f"max productive step {job['max_productive_step']}, truth {truth.max_step}")
    if job["step_time"]["count"] != sum(a.steps_kept for a in truth.attempts):
        fail(f"step_time.count {job['step_time']['count']}, truth "
             f"{sum(a.steps_kept for a in truth.attempts)} (kept steps of the primaries)")
    files = sorted(p.name for p in run_dir.glob("spans-*.jsonl"))
    pids = sorted(p.pid for p in procs)
    file_pids = sorted(int(f.split("-")[3]) for f in files
                       if int(f.split("-")[3]) not in expect.launchers)
    if file_pids != pids:
        fail(f"spool files {files} for worker pids {pids}: expected one file per process")


# --- the cases -------------------------------------------------------------------------

#: Kill after this step's end (+ half a step): 13 steps after the checkpoint of step 20.
KILL_STEP = 33
#: The orphans' job and the relaunch's: the relaunch trains on past the orphans' last step,
#: so it has steps of its own however far the orphans got before it restored.
ORPHAN_STEPS, RELAUNCH_STEPS = 150, 200


def case_torchrun_kill_worker(d: Driver) -> Expect:
    d.launch("L0", d.torchrun(2, 1, d.ddp_args()))
    ev = d.wait_step_end("L0", 1, KILL_STEP)
    d.sleep_steps(0.5)
    d.kill(ev["pid"], signal.SIGKILL)
    d.wait_launch("L0")
    return Expect([2, 2])


def _sigterm_lag(d: Driver, tag: str, goodput: bool) -> float:
    """SIGTERM the agent of launch ``tag`` mid-step; seconds until its workers are dead."""
    if goodput:
        args, w = d.ddp_args(), d.watcher
    else:  # the same job without goodput; its truth lines in a file of their own
        path = d.base / "plain-truth.jsonl"
        args = [*d.ddp_args(truth=False), "--no-goodput", "--truth", str(path)]
        w = Watcher(path, d.s.poll)
        w.start()
        d.watchers.append(w)
    agent = d.launch(tag, d.torchrun(2, 0, args))

    def step_end():
        return next((e for e in w.events if e["rank"] == 0 and e["ev"] == "end"
                     and e.get("name") == "step" and e.get("step") == KILL_STEP), None)

    w.wait(step_end, d.left(), f"{tag} rank 0 to end step {KILL_STEP}")
    d.sleep_steps(0.5)
    t = d.kill(agent.pid, signal.SIGTERM, "agent")
    pids = sorted({e["pid"] for e in w.events if e["launch"] == tag})
    w.wait(lambda: all(p in w.dead_at for p in pids), d.left(), f"the workers of {tag} to die")
    lag = max(w.dead_at[p] for p in pids) - t
    agent.wait(d.left())
    return lag


def case_torchrun_sigterm_agent(d: Driver) -> Expect:
    d.notes["sigterm_exit_s_plain"] = _sigterm_lag(d, "plain", goodput=False)
    shutil.rmtree(d.ckpt_dir)  # the goodput run starts from scratch
    d.ckpt_dir.mkdir()
    d.notes["sigterm_exit_s"] = _sigterm_lag(d, "L0", goodput=True)
    d.launch("L1", d.torchrun(2, 0, d.ddp_args()))  # the same command, by hand
    d.wait_launch("L1")
    return Expect([2, 2])


def case_torchrun_sigkill_agent(d: Driver) -> Expect:
    agent = d.launch("L0", d.torchrun(2, 0, d.ddp_args()))
    d.wait_step_end("L0", 0, 25)
    d.sleep_steps(0.5)
    d.kill(agent.pid, signal.SIGKILL, "agent")
    agent.wait(d.left())
    time.sleep(0.3)  # the orphans train on meanwhile
    workers = d.pids("L0")
    alive = [p for p in workers if p not in d.watcher.dead_at]
    d.notes["orphans_alive"] = len(alive)
    for pid in alive:
        d.kill(pid, signal.SIGKILL)
    d.wait_dead(workers, "the orphans to die")
    time.sleep(0.3)
    d.launch("L1", d.torchrun(2, 0, d.ddp_args()))
    d.wait_launch("L1")
    return Expect([2, 2])


def case_torchrun_orphans(d: Driver) -> Expect:
    agent = d.launch("L0", d.torchrun(2, 0, d.ddp_args(ORPHAN_STEPS)))
    d.wait_step_end("L0", 0, 15)
    d.sleep_steps(0.5)
    d.kill(agent.pid, signal.SIGKILL, "agent")
    agent.wait(d.left())
    time.sleep(0.3)
    workers = d.pids("L0")
    d.notes["orphans_alive"] = sum(p not in d.watcher.dead_at for p in workers)
    d.launch("L1", d.torchrun(2, 0, d.ddp_args(RELAUNCH_STEPS)))  # orphans left running
    d.wait_launch("L1")
    d.wait_dead(workers, "the orphans to finish")
    ends = [e for e in d.watcher.events if e["launch"] == "L0" and e["ev"] == "exit"]
    d.notes["orphans_finished"] = len(ends)
    d.notes["orphans_end_after_relaunch_s"] = (
        max(d.watcher.dead_at[p] for p in workers)
        - min(e["t"] for e in d.watcher.events if e["launch"] == "L1" and e["ev"] == "start"))
    return Expect([2, 2], {"orphaned_processes"})


def _resize(d: Driver, before: int, after: int) -> Expect:
    d.launch("L0", d.torchrun(before, 0, d.ddp_args()))
    ev = d.wait_step_end("L0", 0, KILL_STEP)
    d.sleep_steps(0.5)
    d.kill(ev["pid"], signal.SIGKILL)  # the primary; the agent stops the others, gives up
    d.wait_launch("L0", expect_rc=None)
    time.sleep(0.3)
    d.launch("L1", d.torchrun(after, 0, d.ddp_args()))
    d.wait_launch("L1")
    return Expect([before, after], {"world_size_changed"})


def case_world_size_shrink(d: Driver) -> Expect:
    return _resize(d, 2, 1)


def case_world_size_grow(d: Driver) -> Expect:
    return _resize(d, 1, 2)


def case_mp_spawn(d: Driver) -> Expect:
    d.launch("L0", [sys.executable, *d.ddp_args(), "--spawn", "2"])
    d.wait_launch("L0")
    return Expect([2])


def case_spawn_kill_after_configure(d: Driver) -> Expect:
    """A spawned rank (it unpickles its target, importing torch, before ``configure()``)
    SIGKILLed right after ``configure()``, before the first background flush."""
    cmd = [sys.executable, *d.ddp_args(), "--spawn", "1"]
    d.launch("L0", cmd)
    ev = d.wait_event("L0 to configure goodput", launch="L0", ev="start")
    t = d.kill(ev["pid"], signal.SIGKILL)
    d.notes["configure_after_process_start_s"] = ev["t_run"] - ev["t"]
    d.notes["kill_after_configure_s"] = t - ev["t_run"]
    d.wait_launch("L0", expect_rc=None)
    time.sleep(0.3)
    d.launch("L1", cmd)
    d.wait_launch("L1")
    return Expect([1, 1])


def case_lightning_ddp(d: Driver) -> Expect:
    d.launch("L0", [sys.executable, str(TRAIN_LIGHTNING), "--truth", str(d.truth_path),
                    "--max-steps", str(d.s.steps), "--step-sleep", str(d.s.step_sleep)])
    d.wait_launch("L0")
    return Expect([2])


def case_torchrun_restart_phases(d: Driver) -> Expect:
    """torchrun_kill_worker under ``python -m goodput.torchrun`` (torchelastic's events
    recorded): the recovery phases against the driver's, the failure seen as a signal."""
    agent = d.launch("L0", d.torchrun(2, 1, d.ddp_args(), module="goodput.torchrun"))
    ev = d.wait_step_end("L0", 1, KILL_STEP)
    d.sleep_steps(0.5)
    d.kill(ev["pid"], signal.SIGKILL)
    d.wait_launch("L0")
    return Expect([2, 2], phases=True, launchers={agent.pid})


#: The slow rank, its extra sleep per step (s) and the step it starts from.
SLOW_RANK, SLOW_EXTRA, SLOW_FROM = 1, 0.2, 31


def case_slow_rank(d: Driver) -> Expect:
    """torchrun, 2 ranks; from step 31 rank 1 sleeps 200 ms more in each step; the ranks meet
    at an all-reduce marked ``goodput.collective_wait()``: > 90 % of training_slowdown goes to
    rank 1."""
    d.launch("L0", d.torchrun(2, 0, [*d.ddp_args(), "--slow-rank", str(SLOW_RANK),
                                     "--slow-extra", str(SLOW_EXTRA), "--slow-from-step",
                                     str(SLOW_FROM), "--collective-wait"]))
    d.wait_launch("L0")
    return Expect([2], slow_rank=SLOW_RANK)


CASES: dict[str, Callable[[Driver], Expect]] = {
    "torchrun_kill_worker": case_torchrun_kill_worker,
    "torchrun_sigterm_agent": case_torchrun_sigterm_agent,
    "torchrun_sigkill_agent": case_torchrun_sigkill_agent,
    "torchrun_orphans": case_torchrun_orphans,
    "world_size_shrink": case_world_size_shrink,
    "world_size_grow": case_world_size_grow,
    "mp_spawn": case_mp_spawn,
    "lightning_ddp": case_lightning_ddp,
    "spawn_kill_after_configure": case_spawn_kill_after_configure,
    "torchrun_restart_phases": case_torchrun_restart_phases,
    "slow_rank": case_slow_rank,
}


def run_case(name: str, workdir: Path, s: Settings | None = None) -> Outcome:
    """Drive case ``name`` in ``workdir/name`` and compare the report with the truth."""
    s = s or Settings()
    t0 = time.monotonic()
    d = Driver(name, workdir, s)
    out = Outcome(name, base=d.base)
    try:
        expect = CASES[name](d)
        procs = processes(list(d.watcher.events), d.kills, dict(d.watcher.dead_at))
        truth = compute_truth(procs, s.flush_interval, margin=s.flushed_margin)
        rep = d.report()
        compare(out, truth, rep, procs, d.run_dir, s, expect)
        out.kills = d.kills
        if len(jobs := rep.get("jobs", [])) == 1 and jobs[0].get("recovery"):
            compare_first_failures(out, truth, rep)
        if expect.phases or expect.slow_rank is not None:
            compare_recovery(out, truth, rep, expect)
        if expect.launchers and len(rep.get("jobs", [])) == 1:
            compare_launcher_evidence(out, rep, d.run_dir)
    except CaseError as exc:
        out.failures.append(f"driver: {exc}")
    finally:
        d.cleanup()
        out.notes = {**d.notes, **out.notes}
        out.wall_s = time.monotonic() - t0
    return out


BUCKET_COLUMNS = ("productive", "training_slowdown", "process_startup", "accelerator_init",
                  "training_prep",
                  "data_loading", "checkpoint_save", "checkpoint_restore", "wasted_progress",
                  "infrastructure_recovery", "other", "total")
_SHORT = {"productive": "prod", "training_slowdown": "slow", "process_startup": "start",
          "accelerator_init": "accel",
          "training_prep": "prep", "data_loading": "data", "checkpoint_save": "save",
          "checkpoint_restore": "rest", "wasted_progress": "wasted",
          "infrastructure_recovery": "recov", "other": "other", "total": "total"}


def summarize(outcomes: list[Outcome], s: Settings) -> str:
    """Per case: truth of each bucket and the report's error (s), structure, verdict."""
    head = f"{'case':<23}" + "".join(f"{_SHORT[b]:>15}" for b in BUCKET_COLUMNS)
    lines = ["bucket: truth s / report - truth s", head]
    for o in outcomes:
        cells = "".join(
            f"{o.truth[b]:>7.3f}/{o.errors[b]:+7.3f}" if b in o.errors else f"{'-':>15}"
            for b in BUCKET_COLUMNS)
        lines.append(f"{o.case:<23}{cells}")
    lines.append("")
    for o in outcomes:
        verdict = "ok" if not o.failures else "FAIL: " + "; ".join(o.failures)
        lines.append(f"{o.case}: {o.wall_s:.1f} s, max |err| {o.max_err:.3f} s, {verdict}")
        lines += [f"    {x}" for x in o.structure]
        lines += [f"    warning {w}" for w in o.warnings]
        lines += [f"    {k} = {v:.3f}" for k, v in o.notes.items()]
        lines += [f"    phase {k}: truth {'-' if t is None else f'{t:.3f}'} report "
                  f"{'-' if r is None else f'{r:.3f}'}"
                  + ("" if t is None or r is None else f" ({r - t:+.3f})")
                  for k, (t, r) in o.phases.items()]
    lines.append(f"\ntolerance per bucket: flush interval {s.flush_interval} s + slack "
                 f"{s.slack} s = {s.tol:.2f} s")
    return "\n".join(lines)


def rendezvous_figures(outcomes: list[Outcome]) -> str:
    """One line over the restarts with launcher evidence: how many had
    ``launcher_rendezvous_s``, its largest error against the agent's event, and how many
    of the agent's events ended after the next attempt's recorded start (empty: none)."""
    errs = [v for o in outcomes for k, v in o.notes.items()
            if k.startswith("launcher_rendezvous_") and k.endswith("_err_s")]
    agent = [k for o in outcomes for k in o.notes if k.startswith("agent_rendezvous_")
             and k.endswith("_s") and not k.endswith("_ms")]
    if not agent:
        return ""
    late = [v for o in outcomes for k, v in o.notes.items() if k.endswith("_end_after_start_ms")]
    return (f"launcher_rendezvous_s present in {len(errs)} of {len(agent)} restarts, max "
            f"|report - agent| {max((abs(e) for e in errs), default=float('nan')):.6f} s; "
            f"the agent's rendezvous ended after the next attempt's recorded start in "
            f"{sum(v > 0 for v in late)} of {len(late)} (latest "
            f"{max(late, default=float('nan')):+.1f} ms)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of "
                   + ", ".join(CASES))
    p.add_argument("--flush-interval", type=float, default=Settings.flush_interval)
    p.add_argument("--slack", type=float, default=Settings.slack)
    p.add_argument("--workdir", type=Path, default=None, help="default: a new temp dir")
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    p.add_argument("--json", type=Path, default=None, help="also write the outcomes as JSON")
    p.add_argument("--repeat", type=int, default=1, help="run the cases this many times "
                   "(e.g. 10 real torchrun restarts: --cases torchrun_restart_phases "
                   "--repeat 10)")
    args = p.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    if bad := [c for c in names if c not in CASES]:
        p.error(f"unknown cases {bad}; known: {', '.join(CASES)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: cleanup runs
    s = Settings(flush_interval=args.flush_interval, slack=args.slack)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="goodput-launchers-"))
    outcomes = []
    for k in range(max(args.repeat, 1)):
        where = workdir / f"run{k}" if args.repeat > 1 else workdir
        for name in names:
            o = run_case(name, where, s)
            print(f"{name:<23} {o.wall_s:5.1f} s  max |err| {o.max_err:.3f} s  "
                  f"{'ok' if not o.failures else 'FAIL'}", flush=True)
            outcomes.append(o)
            if not args.keep and not o.failures:
                shutil.rmtree(where / name, ignore_errors=True)
    print()
    print(summarize(outcomes, s))
    if rdzv := rendezvous_figures(outcomes):
        print("\n" + rdzv)
    if args.json:
        rows = [{"case": o.case, "failures": o.failures, "errors": o.errors, "truth": o.truth,
                 "reported": o.reported, "structure": o.structure, "warnings": o.warnings,
                 "notes": o.notes, "wall_s": o.wall_s} for o in outcomes]
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    failed = [o.case for o in outcomes if o.failures]
    print(f"\n{len(outcomes)} cases, {len(failed)} failed {failed or ''}; "
          f"{'kept under ' + str(workdir) if failed or args.keep else 'nothing kept'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
