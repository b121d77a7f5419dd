"""Regenerate ``otlp.jsonl`` and ``truth.jsonl`` (``per_step`` span groups) and
``otlp-default.jsonl`` and ``truth-default.jsonl`` (Megatron's ``default`` span groups):
Megatron-LM main's telemetry on CPU, a SIGKILL mid-run and a restart from the checkpoint.

Pins (the environment ``venv.sh`` builds; Python 3.11, torch 2.13.0 CPU from the main
environment):

- Megatron-LM main at :data:`MEGATRON_LM_COMMIT` (2026-08-22; the spans came with PR
  #6438), its ``megatron/`` tree on the path;
- nemo-lens 0.1.0 (PyPI; declares Python >= 3.13, its one line of 3.12 syntax patched by
  ``venv.sh``), opentelemetry-sdk 1.45.2.

The CPU shims (``cpu_shims.py``): ``typing.override`` and a ``triton`` stub, needed at
import. What is real and what is not: ``megatron_loop.py``'s docstring.

The run: ``megatron_loop.py`` (12 iterations, a checkpoint every 4, an evaluation every 6,
0.15 s a step) as a real OS process, SIGKILLed by this driver once the loop's truth shows
step :data:`KILL_AFTER` done (then 0.1 s), and started again at once with
``SLURM_RESTART_COUNT=1`` (a new ``nemo.lens.run_uuid``, the same ``job_uuid``); it
resumes from the checkpoint of step 4 and runs to 12. Both processes append to one OTLP
JSON lines file, as a Collector's file exporter would. The spans leave through nemo-lens's
BatchSpanProcessor with ``OTEL_BSP_SCHEDULE_DELAY`` = :data:`BSP_DELAY_MS`.

``truth.jsonl``: the loop's events (``start``, ``restore``, ``step``, ``eval``, ``save``,
``end``; seconds since the epoch), each fsync'd before it went on, and the driver's
(``"by": "driver"``: ``spawn``, ``kill``, ``exit``), fsync'd too.

Run: ``.venvs/megatron/bin/python tests/data/sources/megatron/regenerate.py``
(about 40 s a run on a loaded 2-core machine).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The Megatron-LM main commit the loop was checked against.
MEGATRON_LM_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
NEMO_LENS_VERSION = "0.1.0"
#: The loop is killed once its truth shows this step done (+0.1 s).
KILL_AFTER = 7
#: nemo-lens's BatchSpanProcessor delay in the run (``OTEL_BSP_SCHEDULE_DELAY``, ms).
BSP_DELAY_MS = 200
SLURM_JOB_ID = "737001"
LOOP_ARGS = ("--train-iters", "12", "--save-interval", "4", "--eval-interval", "6",
             "--step-s", "0.15")


def _record(path: Path, **kw) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"by": "driver", **kw}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _steps_done(truth: Path, pid: int) -> int:
    n = 0
    try:
        with open(truth, encoding="utf-8") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("ev") == "step" and r.get("pid") == pid:
                    n = max(n, r["step"])
    except FileNotFoundError:
        pass
    return n


def loop_env(restart: int, extra: dict | None = None, span_groups: str = "per_step") -> dict:
    """The environment of the loop's process number ``restart`` (0, 1, ...)."""
    env = dict(os.environ)
    env.update(MEGATRON_OTEL_ENABLED="1", MEGATRON_OTEL_SPAN_GROUPS=span_groups,
               MEGATRON_OTEL_METRICS_ENABLED="0", SLURM_JOB_ID=SLURM_JOB_ID,
               SLURM_RESTART_COUNT=str(restart), OTEL_BSP_SCHEDULE_DELAY=str(BSP_DELAY_MS),
               PYTHONWARNINGS="ignore")
    env.update(extra or {})
    return env


def run_scenario(work: Path, python: str = sys.executable, *, otlp_file: Path | None = None,
                 extra_env: dict | list | None = None, span_groups: str = "per_step",
                 timeout_s: float = 300.0) -> dict:
    """Run the loop, SIGKILL it after step :data:`KILL_AFTER`, run it again to the end.

    ``otlp_file``: the spans' OTLP JSON lines file (None: nemo-lens's own OTLP exporter,
    configured by ``OTEL_EXPORTER_OTLP_*`` in ``extra_env``: one dict for both processes, or
    a list of one per process); ``span_groups``: ``MEGATRON_OTEL_SPAN_GROUPS``. Returns
    ``{"truth": path, "otlp": path or None, "rc": [rc of each process]}``.

    Raises:
        RuntimeError: the loop did not reach the kill point or did not finish in time.
    """
    work.mkdir(parents=True, exist_ok=True)
    truth, ckpt = work / "truth.jsonl", work / "ckpt.pt"
    for p in (truth, ckpt) + ((otlp_file,) if otlp_file else ()):
        if p.exists():
            p.unlink()
    cmd = [python, str(HERE / "megatron_loop.py"), "--truth", str(truth), "--ckpt", str(ckpt),
           *LOOP_ARGS] + (["--otlp-file", str(otlp_file)] if otlp_file else ["--otlp-endpoint"])
    rcs = []
    for restart in (0, 1):
        _record(truth, ev="spawn", t=time.time(), restart=restart)
        env = extra_env[restart] if isinstance(extra_env, list) else extra_env
        proc = subprocess.Popen(cmd, env=loop_env(restart, env, span_groups), cwd=work,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + timeout_s
        if restart == 0:
            while _steps_done(truth, proc.pid) < KILL_AFTER:
                if proc.poll() is not None or time.time() > deadline:
                    proc.kill()
                    err = proc.stderr.read().decode()[-2000:]
                    raise RuntimeError(f"the loop did not reach step {KILL_AFTER}: {err}")
                time.sleep(0.01)
            time.sleep(0.1)
            os.kill(proc.pid, signal.SIGKILL)
            _record(truth, ev="kill", t=time.time(), pid=proc.pid)
        try:
            _, err = proc.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired as e:
            proc.kill()
            raise RuntimeError("the loop did not finish") from e
        rcs.append(proc.returncode)
        _record(truth, ev="exit", t=time.time(), pid=proc.pid, rc=proc.returncode)
        if restart == 1 and proc.returncode != 0:
            raise RuntimeError("the restarted loop failed: " + err.decode()[-2000:])
    return {"truth": truth, "otlp": otlp_file, "rc": rcs}


def expected(truth: Path) -> dict:
    """The figures the report must show, from ``truth.jsonl`` (seconds).

    ``attempts``, ``kept_steps``, ``max_step``, ``checkpoint_save_s`` (every save),
    ``checkpoint_restore_s``, ``wasted_progress_s`` (from the end of the save of the
    restored step, or the last kept step, to the kill), ``infrastructure_recovery_s``
    (from the kill to the restarted process's program start), ``kill_t``.
    """
    recs = [json.loads(x) for x in truth.read_text().splitlines() if x.strip()]
    loop = [r for r in recs if r.get("by") != "driver"]
    pids = []
    for r in loop:
        if r["pid"] not in pids:
            pids.append(r["pid"])
    kill = next(r for r in recs if r.get("ev") == "kill")
    first, second = pids[0], pids[1]
    restored = next(r["step"] for r in loop if r["pid"] == second and r["ev"] == "restore")
    steps1 = [r for r in loop if r["pid"] == first and r["ev"] == "step"]
    steps2 = [r for r in loop if r["pid"] == second and r["ev"] == "step"]
    kept1 = [r for r in steps1 if r["step"] <= restored]
    save_end = max([r["end"] for r in loop if r["pid"] == first and r["ev"] == "save"
                    and r["step"] == restored] + [r["end"] for r in kept1[-1:]])
    start2 = next(r["t"] for r in loop if r["pid"] == second and r["ev"] == "start")
    return {
        "attempts": len(pids),
        "kept_steps": len(kept1) + len(steps2),
        "max_step": max(r["step"] for r in steps1 + steps2),
        "checkpoint_save_s": sum(r["end"] - r["start"] for r in loop if r["ev"] == "save"),
        "checkpoint_restore_s": sum(r["end"] - r["start"] for r in loop
                                    if r["ev"] == "restore"),
        "wasted_progress_s": kill["t"] - save_end,
        "infrastructure_recovery_s": start2 - kill["t"],
        "kill_t": kill["t"],
    }


def report_figures(job: dict) -> dict:
    """The same figures from one job of ``goodput report --format json``."""
    b = job["badput_s"]
    return {
        "attempts": len(job["attempts"]),
        "kept_steps": sum(a["steps_kept"] for a in job["attempts"]),
        "max_step": job["max_productive_step"],
        "checkpoint_save_s": b["checkpoint_save"],
        "checkpoint_restore_s": b["checkpoint_restore"],
        "wasted_progress_s": b["wasted_progress"],
        "infrastructure_recovery_s": b["infrastructure_recovery"],
    }


def main() -> None:
    """Both runs: ``per_step`` span groups (``otlp.jsonl``, ``truth.jsonl``) and Megatron's
    ``default`` ones (``otlp-default.jsonl``, ``truth-default.jsonl``)."""
    for groups, suffix in (("per_step", ""), ("default", "-default")):
        work = HERE / "_work"
        out = run_scenario(work, otlp_file=HERE / f"otlp{suffix}.jsonl", span_groups=groups)
        os.replace(out["truth"], HERE / f"truth{suffix}.jsonl")
        for p in work.iterdir():
            p.unlink()
        work.rmdir()
        print(groups, json.dumps(expected(HERE / f"truth{suffix}.jsonl"), indent=1))


if __name__ == "__main__":
    main()
