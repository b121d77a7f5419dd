"""Run NVIDIA's ft_launcher for real, SIGKILL a worker mid-run, and check the merged report.

What it does (``run_live``), on the CPU with gloo, 2 workers on this host:

1. ``python -m nvidia_resiliency_ext.fault_tolerance.launcher --standalone
   --nproc-per-node=2 --max-restarts=2 --ft-enable-nic-healthcheck False
   --monitor-interval 0.1 examples/launchers/train_ddp.py ...`` with the NVRx venv's Python
   (``venv.sh``: nvidia-resiliency-ext 0.7.0, torch 2.13.0 CPU from the main environment).
   The workers record with this project's own recorder (``goodput.configure()`` from
   ``GOODPUT_JOB_NAME`` / ``GOODPUT_RUN_DIR``; ``accelerator_init``, ``training_prep``,
   ``checkpoint_restore``, ``step(n)``, ``checkpoint_save`` every 20 steps) and append
   their fsync'd truth (``O_APPEND``, one ``os.write`` a line) to ``truth.jsonl``.
2. When rank 1 has ended step 33 the driver SIGKILLs it (by pid); ft_launcher detects the
   failure (cycle 1), stops rank 0, rendezvouses and restarts both workers, which restore
   the checkpoint of step 20 and train to step 40. Case ``nvrx_kill_twice`` (``--case``)
   also SIGKILLs rank 0 of the restart after its step 28 (cycle 2, before its next save:
   restored from step 20 again; the restart's phases end where its own wasted region
   starts, :func:`phase_truth_windows`).
3. The launcher's output (``L0.log``: its ``nvrx`` logger's cycle events and torchelastic's
   ``failed (exitcode: -9)`` line) goes through ``goodput_processor``'s ``nvrx`` source
   into the same job (``translate_files(..., job=CASE)``); the launcher's spool file is put
   beside the workers' spool.
4. ``goodput report RUN_DIR --format json`` against the driver's truth
   (``benchmarks/launchers.py``: ``compute_truth``, ``phase_truth``, ``compare``):
   attempts, processes, kept steps, max step exactly; checkpoint save and restore, wasted
   progress and infrastructure recovery within 0.5 s; each recovery phase within 0.5 s;
   the first failure is the killed rank, by a signal (the launcher's event); each restart's
   ``launcher_rendezvous_s`` is the NVRx rendezvous of its cycle (within 1 ms).

Run from the repository root with the main environment (about 60-90 s on a loaded 2-core
machine)::

    python tests/data/sources/nvrx/regenerate.py            # drive, check, keep the data
    python tests/data/sources/nvrx/regenerate.py --no-save  # drive and check only

It keeps, next to this script (``nvrx_kill_twice/`` for that case): ``ft_launcher.log``
(the launcher's output), ``truth.jsonl`` (the workers' truth lines), ``driver.json`` (the
driver's kills, the death times it saw, the launcher's pid, the settings) and
``workers.tar.gz`` (the workers' spool as written: ``*.jsonl``, and the killed workers'
``*.tail``).

    python tests/data/sources/nvrx/regenerate.py --case nvrx_kill_twice

CPU shims: none in NVRx (the launcher runs as shipped; it logs that NVML is missing and GPU
health checks are off). ``--ft-enable-nic-healthcheck False`` because the machine has no
NIC to check. The wheel is cp312-only and has no compiled code it needs here: ``venv.sh``
unpacks it into a 3.11 venv (pins and timings there).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
CASE = "nvrx_kill_worker"
#: The cases: the workers the driver SIGKILLs, in order: (rank, after the end of this step,
#: in the attempt of this restart count). Checkpoints every 20 steps, 40 steps.
PLANS: dict[str, list[tuple[int, int, int]]] = {
    CASE: [(1, 33, 0)],  # restored from step 20, finishes
    "nvrx_kill_twice": [(1, 33, 0), (0, 28, 1)],  # killed again before its next save
}
#: The NVRx environment's Python (venv.sh builds it).
_VENV = os.environ.get("NVRX_VENV", str(Path(__file__).resolve().parents[4] / ".venvs" / "nvrx"))
NVRX_PYTHON = os.environ.get("NVRX_PYTHON", str(Path(_VENV) / "bin" / "python"))
#: The acceptance bound (s) on the named figures and the recovery phases (issue 37).
TOL = 0.5
FIGURES = ("checkpoint_save", "checkpoint_restore", "wasted_progress",
           "infrastructure_recovery")


def harness():
    """``benchmarks/launchers.py`` as a module (the driver, the truth model, compare)."""
    spec = importlib.util.spec_from_file_location("launchers",
                                                  REPO / "benchmarks" / "launchers.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["launchers"] = mod
    spec.loader.exec_module(mod)
    return mod


def nvrx_missing(python: str = NVRX_PYTHON) -> str | None:
    """Why ft_launcher cannot run here (None: it can)."""
    if not Path(python).exists():
        return f"no NVRx environment at {python} (tests/data/sources/nvrx/venv.sh builds it)"
    res = subprocess.run([python, "-c", "import nvidia_resiliency_ext.fault_tolerance."
                          "launcher, torch, goodput"], capture_output=True, text=True,
                         timeout=180, check=False)
    if res.returncode:
        return f"{python} cannot import ft_launcher: {res.stderr.strip()[-300:]}"
    return None


def import_launcher_log(log: Path, run_dir: Path, job: str, agent_pid: int):
    """The ``nvrx`` source over ``log`` into ``job``; its spool file moved into ``run_dir``
    as ``spans-p00000-a0000-<agent pid>-nvrx.jsonl``. Returns the SourceRun."""
    from goodput_processor.importers.sources import get_source, translate_files, write_spool

    run = translate_files(get_source("nvrx"), [log], job=job)
    with tempfile.TemporaryDirectory() as tmp:
        write_spool(run.resource_spans, tmp)
        (f,) = Path(tmp).glob("*/spans-*.jsonl")
        shutil.move(str(f), run_dir / f"spans-p00000-a0000-{agent_pid}-nvrx.jsonl")
    return run


def report_json(lh, run_dir: Path) -> dict:
    """``goodput report RUN_DIR --format json``, run as a process (as the harness does)."""
    cmd = [sys.executable, "-m", "goodput_processor.cli", "report", str(run_dir),
           "--format", "json"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=lh.child_env(),
                         timeout=300, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"goodput report exited {res.returncode}: {res.stderr[-2000:]}")
    return json.loads(res.stdout)


def cycle_events(log: Path) -> dict[tuple[int, str], float]:
    """(cycle, event) -> its first time in the log (s since the epoch, the log's UTC)."""
    from goodput_processor.importers.sources.nvrx import CYCLE_RE, _utc_ns

    seen: dict[tuple[int, str], float] = {}
    for line in log.read_text(errors="replace").splitlines():
        if m := CYCLE_RE.search(line):
            seen.setdefault((int(m["cycle"]), m["event"]), _utc_ns(m["time"]) / 1e9)
    return seen


def cycle_rendezvous(log: Path) -> dict[int, float]:
    """cycle -> seconds from ``rendezvous_started`` to ``rendezvous_completed`` (the log's
    own UTC times, read here without the source)."""
    from goodput_processor.importers.sources.nvrx import CYCLE_RE, _utc_ns

    seen: dict[tuple[int, str], int] = {}
    for line in log.read_text(errors="replace").splitlines():
        if m := CYCLE_RE.search(line):
            seen.setdefault((int(m["cycle"]), m["event"]), _utc_ns(m["time"]))
    return {c: (seen[(c, "rendezvous_completed")] - t) / 1e9
            for (c, ev), t in seen.items() if ev == "rendezvous_started"
            and (c, "rendezvous_completed") in seen}


def phase_truth_windows(phase_truth, truth) -> list[dict]:
    """``phase_truth(truth)`` (the harness's) with the window rule of docs/accounting.md
    ("Each disruption owns a window") for a next attempt that was itself thrown away (it
    kept no step: killed before its next save): its phases end where its own wasted region
    starts (its primary's first step), not at its end, which the harness takes."""
    out = phase_truth(truth)
    for ph, r in zip(out, truth.attempts[1:], strict=True):
        if r.kept:
            continue
        prim = r.procs[0]
        steps = [t0 for n, t0, _, _ in prim.spans if n == "step" and r.start <= t0 < r.end]
        if not steps:
            continue
        first = min([t0 for _, t0, _, _ in prim.spans] + [r.end])
        ph["rendezvous_init"] = min(steps) - first - ph["restore"]
    return out


def compare_recovery(lh, out, truth, rep: dict, expect) -> None:
    """``lh.compare_recovery`` against :func:`phase_truth_windows` (the harness's truth
    function swapped for the call, and put back)."""
    harness_truth = lh.phase_truth
    lh.phase_truth = lambda t: phase_truth_windows(harness_truth, t)
    try:
        lh.compare_recovery(out, truth, rep, expect)
    finally:
        lh.phase_truth = harness_truth


def check(lh, out, truth, rep: dict, log: Path) -> None:
    """The checks of issue 37 beyond ``compare``: the named figures within TOL, and the
    recovery evidence from the NVRx events."""
    fail = out.failures.append
    job = rep["jobs"][0]
    for name in FIGURES:
        t, r = truth.buckets.get(name, 0.0), job["badput_s"].get(name, 0.0)
        if abs(r - t) > TOL:
            fail(f"{name}: report {r:.3f} s, truth {t:.3f} s (bound {TOL})")
    rec = job.get("recovery") or []
    plan = PLANS[out.case]
    if len(rec) != len(plan):
        fail(f"{len(rec)} recovery records, expected {len(plan)}")
        return
    events, rdzv = cycle_events(log), cycle_rendezvous(log)
    kills = sorted(k.t for k in out.kills if k.what == "worker")
    for i, (r, (rank, _, _)) in enumerate(zip(rec, plan, strict=True)):
        c = i + 1  # the cycle of the i-th failure
        ff = r["first_failure"]
        if (ff["process"], ff["how"], ff["evidence"]) != (rank, "signal", "observed"):
            fail(f"recovery {i}: first failure {ff['process']} {ff['how']} {ff['evidence']}: "
                 f"expected rank {rank}, signal, observed (the launcher's worker_failed)")
        ev = r.get("evidence", {})
        want, got = rdzv.get(c), ev.get("launcher_rendezvous_s")
        out.notes[f"nvrx_rendezvous_{c}_s"] = want if want is not None else float("nan")
        if want is None or got is None or abs(got - want) > 0.001:
            fail(f"recovery {i}: launcher_rendezvous_s {got}, NVRx's rendezvous of cycle "
                 f"{c} {want}")
        if i < len(kills) and (c, "failure_detected") in events:
            out.notes[f"nvrx_failure_detected_{c}_after_kill_s"] = (
                events[(c, "failure_detected")] - kills[i])
        if (c, "worker_terminated") in events:
            out.notes[f"nvrx_worker_terminated_{c}_minus_truth_end_s"] = (
                events[(c, "worker_terminated")] - truth.attempts[i].end)
        if "launcher_detected_after_s" not in ev:
            fail(f"recovery {i}: no launcher_detected_after_s: worker_failed not matched")
        else:
            out.notes[f"launcher_detected_after_{c}_s"] = ev["launcher_detected_after_s"]


def run_live(workdir: Path, python: str = NVRX_PYTHON, case: str = CASE):
    """Drive ``case`` (a key of :data:`PLANS`) in ``workdir``; returns ``(lh, outcome,
    driver, truth, report)``."""
    lh = harness()
    s = lh.Settings()
    d = lh.Driver(case, Path(workdir), s)
    out = lh.Outcome(case, base=d.base)
    truth = rep = None
    t0 = time.monotonic()
    try:
        agent = d.launch("L0", [python, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher",
                                "--standalone", "--nproc-per-node=2", "--max-restarts=2",
                                "--ft-enable-nic-healthcheck", "False",
                                "--monitor-interval", "0.1", *d.ddp_args()])
        for rank, step, restart in PLANS[case]:
            ev = d.wait_step_end("L0", rank, step, restart)
            d.sleep_steps(0.5)
            d.kill(ev["pid"], signal.SIGKILL)
        d.wait_launch("L0")
        d.notes["agent_pid"] = agent.pid
        log = d.base / "L0.log"
        run = import_launcher_log(log, d.run_dir, case, agent.pid)
        if run.warnings or len(run.problems):
            out.failures.append(f"nvrx source: warnings {run.warnings}, problems "
                                f"{len(run.problems)}")
        procs = lh.processes(list(d.watcher.events), d.kills, dict(d.watcher.dead_at))
        truth = lh.compute_truth(procs, s.flush_interval, margin=s.flushed_margin)
        rep = d.report()
        expect = lh.Expect([2] * (len(PLANS[case]) + 1), phases=True, launchers={agent.pid})
        lh.compare(out, truth, rep, procs, d.run_dir, s, expect)
        out.kills = d.kills
        if len(rep.get("jobs", [])) == 1:
            lh.compare_first_failures(out, truth, rep)
            compare_recovery(lh, out, truth, rep, expect)
            check(lh, out, truth, rep, log)
    except lh.CaseError as exc:
        out.failures.append(f"driver: {exc}")
    finally:
        d.cleanup()
        out.notes = {**d.notes, **out.notes}
        out.wall_s = time.monotonic() - t0
    return lh, out, d, truth, rep


def data_dir(case: str) -> Path:
    """Where ``case``'s data is kept: this directory for :data:`CASE`, else a folder of it."""
    return HERE if case == CASE else HERE / case


def save(d, dest: Path | None = None) -> None:
    """Keep the run's data next to this script (see the module docstring)."""
    dest = dest or data_dir(d.case)
    dest.mkdir(exist_ok=True)
    shutil.copy(d.base / "L0.log", dest / "ft_launcher.log")
    shutil.copy(d.truth_path, dest / "truth.jsonl")
    (dest / "driver.json").write_text(json.dumps({
        "case": d.case, "agent_pid": int(d.notes["agent_pid"]),
        "kills": [vars(k) for k in d.kills],
        "dead_at": {str(k): v for k, v in d.watcher.dead_at.items()},
        "settings": vars(d.s)}, indent=1) + "\n")
    with tarfile.open(dest / "workers.tar.gz", "w:gz") as tar:
        for f in sorted(d.run_dir.glob("spans-*")):
            if f.suffix in (".jsonl", ".tail") and not f.name.endswith("-nvrx.jsonl"):
                tar.add(f, arcname=f.name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-save", action="store_true", help="check only, keep no data")
    p.add_argument("--workdir", default=None, help="keep the run here (default: a temp dir)")
    p.add_argument("--case", default=CASE, choices=sorted(PLANS),
                   help=f"which kills (default {CASE}: one)")
    args = p.parse_args(argv)
    sys.path[:0] = [str(REPO / "src"), str(REPO / "collectors")]
    if why := nvrx_missing():
        print(why, file=sys.stderr)
        return 2
    work = Path(args.workdir or tempfile.mkdtemp(prefix="nvrx-live-"))
    lh, out, d, truth, rep = run_live(work, case=args.case)
    print(lh.summarize([out], lh.Settings()))
    print(json.dumps({k: round(v, 4) for k, v in out.notes.items()}))
    for name in ("attempts", *FIGURES):
        if name == "attempts" and rep:
            print("attempts", len(rep["jobs"][0]["attempts"]), "truth", len(truth.attempts))
        elif rep:
            print(name, round(rep["jobs"][0]["badput_s"].get(name, 0.0), 4), "truth",
                  round(truth.buckets.get(name, 0.0), 4))
    if out.failures:
        print("FAILED:\n  " + "\n  ".join(out.failures))
        return 1
    if not args.no_save:
        save(d)
        print(f"kept the data in {data_dir(args.case)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
