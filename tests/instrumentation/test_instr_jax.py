"""The JAX instrumentor on real JAX (CPU), plus the JAX + Orbax example end to end.

Most checks run a real JAX program in a child process (instrumentation patches
process-global state) and read the spans it spooled and the report. In-process
tests uninstrument in their teardown and check the originals are back.

Run time here: about 45-60 s on a busy 2-core machine (the crash/restart
example is about 25 s of it).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from goodput import schema

pytest.importorskip("jax")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from instr_util import ROOT, child_env, report, run_python, spans  # noqa: E402

EXAMPLE = ROOT / "examples" / "jax_orbax"

# A small JAX program: accelerator init (jax.distributed.initialize with one
# process, then the first backend use), compilation of a jitted function,
# five annotated steps, an annotation without step_num, a compilation after the
# last step (its span is still being merged when the program prints its stats).
PROGRAM = textwrap.dedent("""
    import json, sys, time
    import goodput
    mode = sys.argv[1]
    goodput.instrument(frameworks=["jax"])
    import goodput_instrumentation.jax as gj
    if mode == "failing":
        def broken(step):
            raise RuntimeError("deliberately broken step hook")
        gj._step_number = broken                       # our helper, not JAX's
        inst = gj.JaxInstrumentor()
        def broken_add(start, end):
            raise RuntimeError("deliberately broken compile listener")
        inst._merger.add = broken_add
    import jax, jax.numpy as jnp
    if mode == "distributed":
        jax.distributed.initialize(coordinator_address="localhost:" + sys.argv[2],
                                   num_processes=1, process_id=0)
    x = jnp.ones((32, 32))
    @jax.jit
    def f(x):
        return jnp.tanh(x @ x.T) * 0.5
    with jax.profiler.TraceAnnotation("not a step"):
        pass
    with jax.profiler.StepTraceAnnotation("setup"):   # no step_num: not a step
        pass
    for n in range(1, 6):
        with jax.profiler.StepTraceAnnotation("train", step_num=n):
            x = f(x)
            time.sleep(0.02)
    x.block_until_ready()
    jnp.cos(x).block_until_ready()   # compiled after the last step: written at exit
    print("RESULT", json.dumps(gj.JaxInstrumentor().compile_stats()))
""")


def _run_program(tmp_path: Path, mode: str, *extra: str):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    run_dir = tmp_path / "run"
    proc = run_python([script, mode, *extra], env=child_env(
        GOODPUT_RUN_DIR=str(run_dir), GOODPUT_JOB_NAME="jax-prog",
        GOODPUT_FLUSH_INTERVAL_S="0.2"))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return run_dir, json.loads(line.removeprefix("RESULT "))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _by_name(sp: list[dict], name: str) -> list[dict]:
    return sorted((s for s in sp if s["name"] == name), key=lambda s: s["start"])


def test_compile_steps_and_accelerator_init(tmp_path):
    run_dir, stats = _run_program(tmp_path, "distributed", str(_free_port()))
    sp = spans(run_dir)

    steps = _by_name(sp, schema.STEP)
    assert [s["attrs"][schema.ATTR_STEP] for s in steps] == [1, 2, 3, 4, 5]
    for a, b in zip(steps, steps[1:], strict=False):
        assert a["end"] == b["start"]  # step time = interval between step starts

    startup = _by_name(sp, schema.PROGRAM_STARTUP)
    assert startup, "compile events gave no program_startup span"
    assert stats["events"] >= 3 and len(startup) == stats["spans"] + 1
    assert startup[-1]["start"] > steps[-1]["start"]  # flushed at interpreter exit
    # The first step jit-compiles f: a program_startup span lies inside step 1.
    assert any(steps[0]["start"] <= s["start"] < steps[0]["end"] for s in startup)

    init = _by_name(sp, schema.ACCELERATOR_INIT)
    assert len(init) == 2  # jax.distributed.initialize, then the first backend use
    assert init[0]["end"] <= init[1]["start"]
    # Accelerator init is cut out of program startup (no overlap).
    for i in init:
        assert all(s["end"] <= i["start"] or s["start"] >= i["end"] for s in startup)

    job = report(run_dir)
    assert job["badput_s"]["program_startup"] > 0
    assert job["badput_s"]["accelerator_init"] > 0
    assert job["attempts"][0]["steps_kept"] == 5
    assert job["recorder"]["errors"] == 0


def test_failing_hooks_are_counted_not_raised(tmp_path):
    run_dir, stats = _run_program(tmp_path, "failing")  # exits 0: training completed
    sp = spans(run_dir)
    assert not _by_name(sp, schema.STEP)
    assert not _by_name(sp, schema.PROGRAM_STARTUP)
    job = report(run_dir)
    # 5 broken step starts + at least 3 compile events of f, each counted.
    assert job["recorder"]["errors"] >= 8
    assert stats["events"] == 0


def test_nothing_patched_at_import_and_uninstrument_restores(tmp_path):
    import jax
    import jax.distributed
    import jax.monitoring
    import jax.profiler
    from jax._src import monitoring as jmon
    from jax._src import xla_bridge

    import goodput

    originals = (jax.profiler.StepTraceAnnotation, jax.distributed.initialize,
                 xla_bridge.backends)
    listeners = (list(jmon._event_time_span_listeners),
                 list(jmon._event_duration_secs_listeners))

    import goodput_instrumentation.jax as gj

    # Importing our module patches nothing.
    assert (jax.profiler.StepTraceAnnotation, jax.distributed.initialize,
            xla_bridge.backends) == originals
    assert (jmon._event_time_span_listeners, jmon._event_duration_secs_listeners) == \
        (listeners[0], listeners[1])

    goodput.configure(job_name="jax-inproc", run_dir=tmp_path / "run", flush_interval_s=5)
    inst = gj.JaxInstrumentor()
    try:
        inst.instrument(skip_dep_check=True)
        assert inst.patched  # jax already imported: patched at once
        assert jax.profiler.StepTraceAnnotation is not originals[0]
        assert issubclass(jax.profiler.StepTraceAnnotation, originals[0])
        assert jax.distributed.initialize is not originals[1]
        assert len(jmon._event_time_span_listeners) == len(listeners[0]) + 1
    finally:
        inst.uninstrument()
        goodput.shutdown()
    assert jax.profiler.StepTraceAnnotation is originals[0]
    assert jax.distributed.initialize is originals[1]
    assert xla_bridge.backends is originals[2]
    assert jmon._event_time_span_listeners == listeners[0]
    assert jmon._event_duration_secs_listeners == listeners[1]
    assert not inst.patched


# --- the example: manual markers vs automatic, and opentelemetry-instrument ----------

EXAMPLE_ARGS = ["--ckpt-every", "10", "--step-sleep", "0.02", "--log-every", "10"]


def _example(run_dir: Path, ckpt_dir: Path, marks: str, steps: int, otel: bool = False):
    env = child_env(GOODPUT_RUN_DIR=str(run_dir), GOODPUT_JOB_NAME="jax-digits",
                    GOODPUT_FLUSH_INTERVAL_S="0.5")
    cmd = [EXAMPLE / "train.py", "--ckpt-dir", ckpt_dir, "--marks", marks,
           "--steps", str(steps), "--timings", run_dir.with_suffix(".timings.json"),
           *EXAMPLE_ARGS]
    if otel:
        launcher = Path(sys.executable).with_name("opentelemetry-instrument")
        cmd = ["-c", "import sys, subprocess; sys.exit(subprocess.call(sys.argv[1:]))",
               launcher, sys.executable, *cmd]
    return run_python(cmd, env=env)


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """One run under opentelemetry-instrument (no goodput code) to step 20, then the same
    resumed job to step 50 twice from copies of its checkpoints: auto and manual marks."""
    base = tmp_path_factory.mktemp("jax-example")
    ckpt = base / "ckpt-otel"
    _example(base / "run-otel", ckpt, "none", 20, otel=True)
    out = {"otel": base / "run-otel"}
    for marks in ("auto", "manual"):
        shutil.copytree(ckpt, base / f"ckpt-{marks}")
        _example(base / f"run-{marks}", base / f"ckpt-{marks}", marks, 50)
        out[marks] = base / f"run-{marks}"
    return out


def test_opentelemetry_instrument_records_without_goodput_code(example_runs):
    sp = spans(example_runs["otel"])
    steps = _by_name(sp, schema.STEP)
    assert [s["attrs"][schema.ATTR_STEP] for s in steps] == list(range(1, 21))
    saves = _by_name(sp, schema.CHECKPOINT_SAVE)
    blocking = sorted(s["attrs"][schema.ATTR_CHECKPOINT_STEP] for s in saves
                      if s["attrs"][schema.ATTR_BLOCKING])
    background = sorted(s["attrs"][schema.ATTR_CHECKPOINT_STEP] for s in saves
                        if not s["attrs"][schema.ATTR_BLOCKING])
    assert blocking == background == [10, 20]
    job = report(example_runs["otel"])
    assert job["badput_s"]["program_startup"] > 0
    assert job["badput_s"]["checkpoint_save"] > 0
    assert job["async_work_s"]["checkpoint_save"] > 0
    assert job["recorder"]["errors"] == 0


# Manual markers and automatic hooks see the same training run (same arguments,
# same restored checkpoint) in two processes, so the buckets differ by what each
# method covers and by run-to-run noise on a shared CPU:
# - step spans start at the same line (goodput.step_start(n) right before the
#   StepTraceAnnotation): step counts and kept steps are equal; productive time
#   (~30 x 25 ms) agrees within 25% or 0.2 s (scheduling noise).
# - program_startup is XLA compile time (seconds on CPU), which varies up to ~2x
#   between two runs on a loaded 2-core machine (seen: 3.9 s vs 6.7 s); the manual
#   marker also spans the Python between compilations. Agreement within a factor 2.
# - checkpoint save/restore and accelerator init take 5-70 ms each, but file I/O and
#   thread start-up of two runs on the loaded machine differ by up to 5x (seen: save
#   0.14 vs 0.71 s), so each run is held to what its own loop timed around the same
#   calls (``--timings``): the manual markers wrap exactly those blocks, the hooks time
#   from inside the calls (a difference of well under 1 ms). Within 25% or 50 ms; but
#   the hooks' accelerator init is the backend's start-up alone, part of what the loop
#   times around jax.devices() (seen: 18 of 100 ms), so at most that.
def _close(a: float, b: float, rel: float, abs_s: float) -> bool:
    return abs(a - b) <= max(rel * max(a, b), abs_s)


def test_manual_markers_and_automatic_hooks_agree(example_runs):
    auto, manual = report(example_runs["auto"]), report(example_runs["manual"])
    for job in (auto, manual):
        (att,) = job["attempts"]
        assert att["resume_step"] == 20 and att["steps_kept"] == 30
        assert job["step_time"]["count"] == 30
        assert job["async_work_s"]["checkpoint_save"] > 0
        assert job["recorder"]["errors"] == 0
    a, m = auto["badput_s"], manual["badput_s"]
    rows = [("productive", auto["productive_time_s"], manual["productive_time_s"])]
    rows += [(b, a[b], m[b]) for b in ("program_startup", "checkpoint_save",
                                       "checkpoint_restore", "accelerator_init")]
    rows.append(("async checkpoint_save", auto["async_work_s"]["checkpoint_save"],
                 manual["async_work_s"]["checkpoint_save"]))
    print("\nbucket                      auto s   manual s")
    for name, x, y in rows:
        print(f"{name:<24} {x:>9.4f} {y:>9.4f}")
    assert _close(auto["productive_time_s"], manual["productive_time_s"], 0.25, 0.2)
    assert 0.5 <= a["program_startup"] / m["program_startup"] <= 2.0
    for marks, got in (("auto", a), ("manual", m)):
        timed = json.loads(example_runs[marks].with_suffix(".timings.json").read_text())
        for bucket in ("checkpoint_save", "checkpoint_restore", "accelerator_init"):
            print(f"{marks:<7}{bucket:<19} {got[bucket]:>9.4f} s, timed {timed[bucket]:.4f} s")
            assert got[bucket] > 0, (marks, bucket)
            if marks == "auto" and bucket == "accelerator_init":  # (part of the call)
                assert got[bucket] <= timed[bucket] + 0.05, (got[bucket], timed[bucket])
                continue
            assert _close(got[bucket], timed[bucket], 0.25, 0.05), \
                (marks, bucket, got[bucket], timed[bucket])
    # Same checkpoint steps, blocking and background, both ways.
    for run in (example_runs["auto"], example_runs["manual"]):
        saves = _by_name(spans(run), schema.CHECKPOINT_SAVE)
        for blocking in (True, False):
            got = sorted(s["attrs"][schema.ATTR_CHECKPOINT_STEP] for s in saves
                         if s["attrs"][schema.ATTR_BLOCKING] is blocking)
            assert got == [30, 40, 50], (run, blocking, got)
        (restore,) = _by_name(spans(run), schema.CHECKPOINT_RESTORE)
        assert restore["attrs"][schema.ATTR_CHECKPOINT_STEP] == 20


# --- crash and restart, SIGKILL ------------------------------------------------------

FLUSH_INTERVAL_S = 0.5
# A SIGKILLed attempt ends at its last record (the spool tail keeps what the journal
# had not flushed), not at its last flush; 0.5 s covers a child start delayed on a
# busy machine and the pipe delay of the "checkpoint saved" line.
TOLERANCE_S = 0.5


@pytest.mark.skipif(os.name != "posix", reason="needs SIGKILL")
def test_crash_restart_example(tmp_path):
    truth_file = tmp_path / "truth.json"
    env = child_env()
    run_python([EXAMPLE / "crash_restart.py", "--workdir", tmp_path, "--truth-file", truth_file,
                "--steps", "120", "--ckpt-every", "30", "--step-sleep", "0.03",
                "--log-every", "5", "--kill-at-step", "85", "--restart-delay", "2",
                "--flush-interval", str(FLUSH_INTERVAL_S), "--timeout", "200"],
               env=env, timeout=260)
    truth = json.loads(truth_file.read_text())
    job = report(truth["run_dir"])
    a0, a1 = job["attempts"]
    assert a0["end_reason"] == "killed"
    assert a1["resume_step"] == truth["last_checkpoint_step"] == 60
    assert a0["steps_kept"] == 60
    # Steps 61..kill_step ran; those of the last flush interval before the kill are lost.
    assert 0 < a0["steps_wasted"] <= truth["kill_step"] - 60 + 5
    assert a0["steps_kept"] + a1["steps_kept"] == 120
    b = job["badput_s"]
    assert b["wasted_progress"] > 0
    assert abs(b["wasted_progress"] - truth["wasted_progress_s"]) <= TOLERANCE_S
    assert abs(b["infrastructure_recovery"] - truth["infrastructure_recovery_s"]) <= TOLERANCE_S
    assert b["program_startup"] > 0 and b["checkpoint_save"] > 0
    assert b["checkpoint_restore"] > 0
    assert job["async_work_s"]["checkpoint_save"] > 0
    assert job["recorder"]["errors"] == 0
    # the restart broken into phases (issue 18): at least startup, initialisation,
    # restore and recompilation show, and the rescheduling phase is the recovery bucket
    (rec,) = job["recovery"]
    ph = rec["phases_s"]
    for name in ("startup", "rendezvous_init", "restore", "recompilation_warmup"):
        assert ph[name] is not None and ph[name] > 0, (name, ph)
    # one process: no rendezvous took place, the phase is shown as what it is (issue 36)
    assert rec["phase_labels"] == {"rendezvous_init": "initialization"}
    assert ph["rescheduling"] == pytest.approx(b["infrastructure_recovery"])
    assert rec["first_failure"]["how"] == "missing_heartbeat"  # SIGKILL, no launcher events
