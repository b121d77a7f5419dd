"""The Orbax instrumentor on real Orbax checkpoints (CPU, temporary directories).

Saves and restores run in a child process (instrumentation patches
process-global state); the spans it spooled and the report are checked. One
in-process test checks the pairing of background writes with their saves and
that uninstrument restores ``CheckpointManager.__init__`` and removes the
listener. About 10-15 s.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from goodput import schema

pytest.importorskip("orbax.checkpoint")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from instr_util import child_env, report, run_python, spans  # noqa: E402

PROGRAM = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import goodput
    mode, ckpt = sys.argv[1], Path(sys.argv[2])
    goodput.instrument(frameworks=["orbax"])   # Orbax alone, without the JAX instrumentor
    if mode == "failing":
        import goodput_instrumentation.orbax as go
        def broken(self, entry):
            raise RuntimeError("deliberately broken save hook")
        go.OrbaxInstrumentor._on_save = broken         # our method, not Orbax's
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    class UserLogger(ocp.logging.AbstractLogger):
        entries = []
        def log_entry(self, entry, *args, **kwargs):
            self.entries.append(entry["event_type"])

    state = {"w": jnp.arange(1000.0), "b": jnp.ones((10, 10))}
    user = UserLogger()
    mngr = ocp.CheckpointManager(
        ckpt / "async", options=ocp.CheckpointManagerOptions(max_to_keep=2), logger=user)
    for step in (1, 2):
        mngr.save(step, args=ocp.args.StandardSave(state))
        time.sleep(0.2)
    mngr.wait_until_finished()
    sync = ocp.CheckpointManager(ckpt / "sync", options=ocp.CheckpointManagerOptions(
        enable_async_checkpointing=False))
    sync.save(5, args=ocp.args.StandardSave(state))
    restored = mngr.restore(2, args=ocp.args.StandardRestore(state))
    assert float(restored["w"][-1]) == 999.0
    mngr.close(); sync.close()
    print("RESULT", json.dumps(user.entries))
""")


def _run(tmp_path: Path, mode: str):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    run_dir = tmp_path / "run"
    proc = run_python([script, mode, tmp_path / "ckpt"], env=child_env(
        GOODPUT_RUN_DIR=str(run_dir), GOODPUT_JOB_NAME="orbax-prog",
        GOODPUT_FLUSH_INTERVAL_S="0.2"))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return run_dir, json.loads(line.removeprefix("RESULT "))


def _saves(sp, blocking: bool) -> list[dict]:
    return sorted((s for s in sp if s["name"] == schema.CHECKPOINT_SAVE
                   and s["attrs"][schema.ATTR_BLOCKING] is blocking),
                  key=lambda s: s["start"])


def test_async_and_sync_saves_and_restore(tmp_path):
    run_dir, user_entries = _run(tmp_path, "ok")
    # The user's logger= still gets every entry (ours is put in front of it).
    assert user_entries == ["save", "save", "restore"]
    sp = spans(run_dir)
    blocking, background = _saves(sp, True), _saves(sp, False)
    step = schema.ATTR_CHECKPOINT_STEP
    assert [s["attrs"][step] for s in blocking] == [1, 2, 5]
    assert [s["attrs"][step] for s in background] == [1, 2]  # the sync save has none
    for fg, bg in zip(blocking, background, strict=False):
        assert bg["start"] == fg["end"]  # the background write follows the blocking part
        assert bg["end"] > bg["start"]
    (restore,) = [s for s in sp if s["name"] == schema.CHECKPOINT_RESTORE]
    assert restore["attrs"][step] == 2 and restore["end"] > restore["start"]

    job = report(run_dir)
    assert job["badput_s"]["checkpoint_save"] > 0
    assert job["badput_s"]["checkpoint_restore"] > 0
    assert job["async_work_s"]["checkpoint_save"] > 0
    assert job["recorder"]["errors"] == 0


def test_failing_hook_is_counted_not_raised(tmp_path):
    run_dir, user_entries = _run(tmp_path, "failing")  # saves and restore still work
    assert user_entries == ["save", "save", "restore"]
    sp = spans(run_dir)
    assert not _saves(sp, True) and not _saves(sp, False)
    assert [s["attrs"][schema.ATTR_CHECKPOINT_STEP] for s in sp
            if s["name"] == schema.CHECKPOINT_RESTORE] == [2]
    assert report(run_dir)["recorder"]["errors"] == 3  # one per save


def test_pairing_and_uninstrument(tmp_path):
    import jax.monitoring
    import orbax.checkpoint as ocp
    from jax._src import monitoring as jmon

    import goodput
    import goodput_instrumentation.orbax as go

    init = ocp.CheckpointManager.__init__
    listeners = list(jmon._event_duration_secs_listeners)
    goodput.configure(job_name="orbax-inproc", run_dir=tmp_path / "run", flush_interval_s=5)
    inst = go.OrbaxInstrumentor()
    try:
        inst.instrument(skip_dep_check=True)
        assert ocp.CheckpointManager.__init__ is not init
        assert len(jmon._event_duration_secs_listeners) == len(listeners) + 1
        t = time.time()

        def entry(step, start):
            return {"event_type": "save", "step": step, "synchronous": False,
                    "checkpoint_manager_blocking_start_time": start,
                    "checkpoint_manager_blocking_duration_secs": 0.01}

        # Usual order: the save's entry, then its commit event.
        inst._on_entry(entry(10, t - 1))
        jax.monitoring.record_event_duration_secs(go.ASYNC_DONE_EVENT, 0.05)
        # A write so fast that its commit event comes before the save's entry.
        jax.monitoring.record_event_duration_secs(go.ASYNC_DONE_EVENT, 0.001)
        inst._on_entry(entry(20, t - 0.5))
        # Restore entries give the restored step.
        inst._on_entry({"event_type": "restore", "step": 20,
                        "checkpoint_manager_start_time": t,
                        "checkpoint_manager_duration_secs": 0.02})
        inst._on_entry("not a dict")  # ignored
    finally:
        inst.uninstrument()
        goodput.shutdown()
    assert ocp.CheckpointManager.__init__ is init
    assert jmon._event_duration_secs_listeners == listeners

    sp = spans(tmp_path / "run")
    bg = {s["attrs"][schema.ATTR_CHECKPOINT_STEP]: s for s in _saves(sp, False)}
    fg = {s["attrs"][schema.ATTR_CHECKPOINT_STEP]: s for s in _saves(sp, True)}
    assert sorted(bg) == sorted(fg) == [10, 20]
    assert bg[10]["start"] == fg[10]["end"] < bg[10]["end"]
    assert bg[20]["start"] == fg[20]["end"] <= bg[20]["end"]
    (restore,) = [s for s in sp if s["name"] == schema.CHECKPOINT_RESTORE]
    assert restore["attrs"][schema.ATTR_CHECKPOINT_STEP] == 20
    assert restore["end"] - restore["start"] == pytest.approx(20_000_000, abs=1000)
