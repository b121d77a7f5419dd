"""Shared by the instrumentation tests: run a real training script, read its spans and report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from goodput import schema

ROOT = Path(__file__).resolve().parents[1]
PATHS = [ROOT / "src", ROOT / "collectors", ROOT / "instrumentation"]

# Settings in the environment that would change what a child records.
_SCRUB = (
    "GOODPUT_ATTEMPT", "GOODPUT_JOB_NAME", "GOODPUT_RUN_DIR", "GOODPUT_PROCESS_INDEX",
    "GOODPUT_PROCESS_COUNT", "OTEL_SERVICE_NAME", "OTEL_TRACES_EXPORTER",
    "TORCHELASTIC_RESTART_COUNT", "RANK", "WORLD_SIZE", "JAX_PROCESS_ID", "JAX_NUM_PROCESSES",
)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child training process: checkout on PYTHONPATH, CPU only."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    paths = [str(p) for p in PATHS]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(extra)
    return env


def run_python(args: list[str], *, env: dict[str, str] | None = None, cwd=None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in a child process; fail with its output if it exits non-zero."""
    proc = subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True,
        env=env or child_env(), cwd=cwd, timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"python {' '.join(map(str, args))} exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}"
        )
    return proc


def load_benchmark(name: str):
    """Import ``benchmarks/<name>.py`` (a harness that is also a command) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def attempt_of_instance(run_dir) -> dict[str, int]:
    """``service.instance.id`` -> the attempt number the processor finds for it."""
    from goodput_processor.model.attempts import build_attempts
    from goodput_processor.read.reader import read_run_dir

    out = {}
    for job in read_run_dir(run_dir).jobs.values():
        for a in build_attempts(job):
            for p in a.processes:
                out[p.instance] = a.attempt
    return out


def spans(run_dir) -> list[dict]:
    """Every span in a run directory's spool: name, start/end ns, attrs (plain values),
    ``attempt`` (the attempt the processor puts its process in). The recorder's
    ``goodput.open`` records of phases in flight are left out."""
    attempts = attempt_of_instance(run_dir)
    out = []
    for path in sorted(Path(run_dir).glob("*.jsonl")):
        if path.name.startswith(schema.METRICS_SPOOL_PREFIX):  # metrics, not spans
            continue
        for line in path.read_text().splitlines():
            try:
                req = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of a killed process
            for rs in req["resourceSpans"]:
                res = {a["key"]: _value(a["value"]) for a in rs["resource"]["attributes"]}
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        if any(a["key"] == schema.ATTR_OPEN for a in s.get("attributes", ())):
                            continue
                        out.append({
                            "name": s["name"],
                            "start": int(s["startTimeUnixNano"]),
                            "end": int(s["endTimeUnixNano"]),
                            "attrs": {a["key"]: _value(a["value"])
                                      for a in s.get("attributes", [])},
                            "attempt": attempts.get(res.get("service.instance.id"),
                                                    res.get("goodput.attempt")),
                        })
    return out


def _value(v: dict):
    (kind, val), = v.items()
    return int(val) if kind == "intValue" else val


def report(run_dir, *args: str) -> dict:
    """The ``goodput report --format json`` of a run directory's only job."""
    proc = run_python(["-m", "goodput_processor.cli", "report", str(run_dir),
                       "--format", "json", *args])
    jobs = json.loads(proc.stdout)["jobs"]
    assert len(jobs) == 1, [j["job"] for j in jobs]
    return jobs[0]
