"""The Lightning instrumentor on real Lightning 2.x training runs on the CPU.

Two child runs of ``examples/lightning_digits/train.py`` (a crash in step 25,
then a resume from the last checkpoint with ``AsyncCheckpointIO``) are shared by
most tests through a module-scoped fixture; the patching, uninstrument and
hook-failure tests run a few tiny fits in this process and uninstrument after.
Takes about 30-40 s (two child processes importing Lightning, ~5 s each).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest
from instr_util import ROOT, child_env, report, run_python, spans

from goodput import schema

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("lightning", "torch", "sklearn")),
    reason="needs lightning, torch and scikit-learn",
)

EXAMPLE = ROOT / "examples" / "lightning_digits" / "train.py"
MAX_STEPS = 40
CKPT_EVERY = 10
FAIL_AT = 25  # attempt 0 raises in step 25: steps 1-24 done, last checkpoint at 20
RESUME = 20
ARGS = ["--max-steps", MAX_STEPS, "--ckpt-every", CKPT_EVERY, "--val-every", 15,
        "--step-sleep", 0.005, "--load-sleep", 0.001]


def _steps(ss, attempt):
    return [s["attrs"][schema.ATTR_STEP] for s in sorted(ss, key=lambda s: s["start"])
            if s["name"] == schema.STEP and s["attempt"] == attempt]


def _named(ss, name, attempt=None):
    return [s for s in ss if s["name"] == name and (attempt is None or s["attempt"] == attempt)]


@pytest.fixture(scope="module")
def crash_resume(tmp_path_factory):
    """Attempt 0 crashes in step 25; attempt 1 resumes from ``last.ckpt`` (step 20) to 40."""
    work = tmp_path_factory.mktemp("lightning")
    run_dir, ckpt_dir = work / "runs", work / "ckpt"
    env = child_env(GOODPUT_RUN_DIR=str(run_dir), GOODPUT_JOB_NAME="lightning-test",
                    GOODPUT_FLUSH_INTERVAL_S="0.2")
    common = [EXAMPLE, "--ckpt-dir", ckpt_dir, *ARGS]
    crashed = subprocess.run([sys.executable, *map(str, [*common, "--fail-at-step", FAIL_AT])],
                             capture_output=True, text=True, env=env, timeout=300)
    assert crashed.returncode != 0, crashed.stdout + crashed.stderr
    assert f"simulated crash in step {FAIL_AT}" in crashed.stderr, crashed.stderr[-4000:]
    saved = {p.name: _global_step(p) for p in sorted(ckpt_dir.glob("*.ckpt"))}
    run_python([*common, "--resume", "last", "--async-ckpt"], env=env)
    return {"run_dir": run_dir, "ckpt_dir": ckpt_dir, "saved_attempt0": saved,
            "spans": spans(run_dir), "report": report(run_dir)}


def _global_step(path: Path) -> int:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


def test_steps_numbered_like_global_step(crash_resume):
    ss = crash_resume["spans"]
    assert _steps(ss, 0) == list(range(1, FAIL_AT))  # step 25 raised: not recorded
    assert _steps(ss, 1) == list(range(RESUME + 1, MAX_STEPS + 1))
    for s in _named(ss, schema.STEP):
        assert s["end"] > s["start"]


def test_restore_then_next_step(crash_resume):
    ss = crash_resume["spans"]
    assert not _named(ss, schema.CHECKPOINT_RESTORE, 0)
    restores = _named(ss, schema.CHECKPOINT_RESTORE, 1)
    assert restores and {r["attrs"][schema.ATTR_CHECKPOINT_STEP] for r in restores} == {RESUME}
    first_step = min(_named(ss, schema.STEP, 1), key=lambda s: s["start"])
    assert first_step["attrs"][schema.ATTR_STEP] == RESUME + 1
    assert max(r["end"] for r in restores) <= first_step["start"]


def test_checkpoint_saves_match_saved_global_step(crash_resume):
    ss = crash_resume["spans"]
    # attempt 0 wrote step-000010, step-000020 and last.ckpt (twice): files hold those steps
    saved = crash_resume["saved_attempt0"]
    assert saved["step-000010.ckpt"] == 10 and saved["step-000020.ckpt"] == 20
    saves0 = _named(ss, schema.CHECKPOINT_SAVE, 0)
    blocking0 = [s["attrs"][schema.ATTR_CHECKPOINT_STEP] for s in saves0]
    assert sorted(blocking0) == [10, 10, 20, 20]  # every-N checkpoint + last.ckpt
    assert all(s["attrs"][schema.ATTR_BLOCKING] for s in saves0)
    # attempt 1 (AsyncCheckpointIO): a blocking part and a background write per save
    by_kind = {True: [], False: []}
    for s in _named(ss, schema.CHECKPOINT_SAVE, 1):
        by_kind[s["attrs"][schema.ATTR_BLOCKING]].append(s["attrs"][schema.ATTR_CHECKPOINT_STEP])
    assert sorted(by_kind[True]) == sorted(by_kind[False]) == [30, 30, 40, 40]
    ckpt = crash_resume["ckpt_dir"]
    assert _global_step(ckpt / "step-000030.ckpt") == 30
    assert _global_step(ckpt / "step-000040.ckpt") == 40
    # a save after step n starts after the step span of n ends
    ends = {s["attrs"][schema.ATTR_STEP]: s["end"] for s in _named(ss, schema.STEP, 1)}
    for s in _named(ss, schema.CHECKPOINT_SAVE, 1):
        assert s["start"] >= ends[s["attrs"][schema.ATTR_CHECKPOINT_STEP]]


def test_data_loading_between_steps(crash_resume):
    ss = crash_resume["spans"]
    for attempt in (0, 1):
        steps = sorted(_named(ss, schema.STEP, attempt), key=lambda s: s["start"])
        loads = sorted(_named(ss, schema.DATA_LOADING, attempt), key=lambda s: s["start"])
        assert len(loads) >= len(steps)
        # without gradient accumulation each fetch ends where a step begins (or before)
        starts = {s["start"] for s in steps}
        assert sum(d["end"] in starts for d in loads) >= len(steps) - 1
        for d in loads:
            assert not any(s["start"] < d["start"] < s["end"] for s in steps)


def test_eval_and_phases(crash_resume):
    ss = crash_resume["spans"]
    evals = _named(ss, schema.CUSTOM_BADPUT)
    assert evals and all(e["attrs"][schema.ATTR_BADPUT_TYPE] == "eval" for e in evals)
    # validation every 15 batches: after batch 15 in attempt 0; attempt 1 after 30 and at 40ish
    assert len(_named(ss, schema.CUSTOM_BADPUT, 0)) == 1
    assert len(_named(ss, schema.CUSTOM_BADPUT, 1)) >= 1
    for attempt in (0, 1):
        (acc,) = _named(ss, schema.ACCELERATOR_INIT, attempt)
        (prep,) = _named(ss, schema.TRAINING_PREP, attempt)
        first = min(s["start"] for s in _named(ss, schema.STEP, attempt))
        assert acc["end"] <= prep["start"] <= prep["end"] <= first


def test_report_buckets(crash_resume):
    rep = crash_resume["report"]
    bad = rep["badput_s"]
    for bucket in ("checkpoint_save", "custom:eval", "data_loading", "checkpoint_restore",
                   "training_prep", "wasted_progress"):
        assert bad[bucket] > 0, bucket
    a0, a1 = rep["attempts"]
    assert a0["end_reason"] == "exception" and a1["end_reason"] == "exit"
    assert a1["resume_step"] == RESUME
    assert (a0["steps_kept"], a0["steps_wasted"]) == (RESUME, FAIL_AT - 1 - RESUME)
    assert (a1["steps_kept"], a1["steps_wasted"]) == (MAX_STEPS - RESUME, 0)
    assert rep["max_productive_step"] == MAX_STEPS
    assert rep["async_work_s"].get("checkpoint_save", 0) > 0
    assert rep["recorder"]["errors"] == 0


# --- in-process: patching, uninstrument, claims, failing hooks -------------------


class _Tiny:
    """Builds a tiny LightningModule and loaders on random data (no downloads)."""

    @staticmethod
    def module(pl, manual: bool = False):
        import torch

        class Tiny(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(8, 2)
                self.automatic_optimization = not manual

            def training_step(self, batch, batch_idx):
                loss = torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
                if manual:  # one optimizer update every second batch
                    opt = self.optimizers()
                    self.manual_backward(loss)
                    if batch_idx % 2 == 1:
                        opt.step()
                        opt.zero_grad()
                return loss

            def validation_step(self, batch, batch_idx):
                return self.net(batch[0]).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Tiny()

    @staticmethod
    def loader():
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        gen = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(64, 8, generator=gen), torch.randint(0, 2, (64,),
                                                                             generator=gen))
        return DataLoader(data, batch_size=4)


def _trainer(pl, tmp_path, **kw):
    opts = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                enable_model_summary=False, enable_checkpointing=False,
                default_root_dir=str(tmp_path), num_sanity_val_steps=0)
    opts.update(kw)
    return pl.Trainer(**opts)


@pytest.fixture()
def instrumented(tmp_path):
    """Instrument Lightning in this process, record into tmp_path; uninstrument afterwards."""
    import torch

    import goodput
    import goodput_instrumentation
    from goodput_instrumentation.lightning import LightningInstrumentor

    torch.set_num_threads(1)
    import lightning.pytorch as pl

    originals = {name: pl.Trainer.__dict__[name] for name in ("__init__", "save_checkpoint")}
    goodput.configure(job_name="lightning-inproc", run_dir=tmp_path / "runs",
                      handle_signals=False)
    goodput_instrumentation.instrument(["lightning"])
    assert LightningInstrumentor().patched
    yield pl
    goodput_instrumentation.uninstrument(["lightning"])
    goodput.shutdown()
    for name, orig in originals.items():
        assert pl.Trainer.__dict__[name] is orig


def _inproc_spans(tmp_path):
    import goodput

    goodput.flush()
    return spans(tmp_path / "runs")


def test_callback_added_once_and_uninstrument_restores(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
    from lightning.pytorch.plugins.io.async_plugin import AsyncCheckpointIO
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

    import goodput_instrumentation
    from goodput_instrumentation import lightning as gl

    targets = [(pl.Trainer, "__init__"), (pl.Trainer, "save_checkpoint"),
               (_TrainingEpochLoop, "_on_before_fetch"), (_TrainingEpochLoop, "_on_after_fetch"),
               (_CheckpointConnector, "_restore_modules_and_callbacks"),
               (_CheckpointConnector, "restore_training_state"),
               (AsyncCheckpointIO, "save_checkpoint")]
    before = {t: t[0].__dict__[t[1]] for t in targets}
    assert not any(isinstance(c, gl._GoodputHooks) for c in _trainer(pl, tmp_path).callbacks)

    goodput_instrumentation.instrument(["lightning"])
    try:
        for t in targets:
            assert t[0].__dict__[t[1]] is not before[t], t
        trainer = _trainer(pl, tmp_path, enable_checkpointing=True)
        ours = [c for c in trainer.callbacks if isinstance(c, gl._GoodputHooks)]
        assert len(ours) == 1 and trainer.callbacks[0] is ours[0]
        assert isinstance(ours[0], pl.Callback)
        # a user who added the callback already keeps exactly theirs
        mine = gl.callback_class()()
        trainer = _trainer(pl, tmp_path, callbacks=[mine])
        assert [c for c in trainer.callbacks if isinstance(c, gl._GoodputHooks)] == [mine]
        assert gl.GoodputCallback is type(mine)
    finally:
        goodput_instrumentation.uninstrument(["lightning"])
    for t in targets:
        assert t[0].__dict__[t[1]] is before[t], t
    assert not any(isinstance(c, gl._GoodputHooks) for c in _trainer(pl, tmp_path).callbacks)


def test_pytorch_lightning_package_patched_too(tmp_path):
    if importlib.util.find_spec("pytorch_lightning") is None:
        pytest.skip("pytorch_lightning is not installed")
    import goodput_instrumentation
    from goodput_instrumentation import lightning as gl

    goodput_instrumentation.instrument(["lightning"])
    try:
        import pytorch_lightning as ptl  # the post-import hook fires for this name too

        trainer = _trainer(ptl, tmp_path)
        (cb,) = [c for c in trainer.callbacks if isinstance(c, gl._GoodputHooks)]
        assert isinstance(cb, ptl.Callback)
    finally:
        goodput_instrumentation.uninstrument(["lightning"])
    assert not any(isinstance(c, gl._GoodputHooks) for c in _trainer(ptl, tmp_path).callbacks)


def test_manual_optimization_and_accumulation_numbering(instrumented, tmp_path):
    pl = instrumented
    trainer = _trainer(pl, tmp_path, max_steps=5, limit_val_batches=0)
    trainer.fit(_Tiny.module(pl, manual=True), _Tiny.loader())
    assert trainer.global_step == 5
    trainer = _trainer(pl, tmp_path, max_steps=3, accumulate_grad_batches=3, limit_val_batches=0)
    trainer.fit(_Tiny.module(pl), _Tiny.loader())
    ss = _inproc_spans(tmp_path)
    steps = sorted((s for s in ss if s["name"] == schema.STEP), key=lambda s: s["start"])
    assert [s["attrs"][schema.ATTR_STEP] for s in steps] == [1, 2, 3, 4, 5, 1, 2, 3]
    # two fetches per manual step, three per accumulated step: nested inside the step
    loads = [d for d in ss if d["name"] == schema.DATA_LOADING]
    inside = [d for d in loads if any(s["start"] < d["start"] < s["end"] for s in steps)]
    assert len(inside) >= 5 * 1 + 3 * 2


def test_failing_hook_is_counted_not_raised(instrumented, tmp_path, monkeypatch):
    import goodput
    from goodput_instrumentation import lightning as gl

    pl = instrumented

    def broken(self):
        raise ValueError("hook failure on purpose")

    monkeypatch.setattr(gl._GoodputHooks, "_fetch_done", broken)
    errors = goodput.get_recorder().stats()["errors"]
    trainer = _trainer(pl, tmp_path, max_steps=4, limit_val_batches=0)
    trainer.fit(_Tiny.module(pl), _Tiny.loader())
    assert trainer.global_step == 4
    assert goodput.get_recorder().stats()["errors"] >= errors + 4
    ss = _inproc_spans(tmp_path)
    assert [s["attrs"][schema.ATTR_STEP] for s in ss if s["name"] == schema.STEP] == [1, 2, 3, 4]
    assert not [s for s in ss if s["name"] == schema.DATA_LOADING]


def test_framework_errors_propagate_unchanged(instrumented, tmp_path):
    pl = instrumented
    trainer = _trainer(pl, tmp_path)
    with pytest.raises(AttributeError, match="model is attached"):
        trainer.save_checkpoint(tmp_path / "x.ckpt")  # no model: Lightning's own error
    from goodput_instrumentation._base import _claims

    assert "step" not in _claims  # nothing claimed outside a fit


def test_torch_step_hooks_quiet_while_lightning_claims(tmp_path):
    if importlib.util.find_spec("goodput_instrumentation.torch") is None:
        pytest.skip("the PyTorch instrumentor (goodput_instrumentation.torch) does not exist yet")
    import goodput
    import goodput_instrumentation

    goodput.configure(job_name="lightning-torch", run_dir=tmp_path / "runs", handle_signals=False)
    goodput_instrumentation.instrument(["torch", "lightning"])
    try:
        import lightning.pytorch as pl

        trainer = _trainer(pl, tmp_path, max_steps=6, val_check_interval=3,
                           check_val_every_n_epoch=None, limit_val_batches=2)
        trainer.fit(_Tiny.module(pl), _Tiny.loader(), _Tiny.loader())
        time.sleep(0.01)
        ss = _inproc_spans(tmp_path)
    finally:
        goodput_instrumentation.uninstrument(["torch", "lightning"])
        goodput.shutdown()
    steps = [s["attrs"][schema.ATTR_STEP] for s in ss if s["name"] == schema.STEP]
    assert steps == [1, 2, 3, 4, 5, 6]  # once each: the torch optimizer hooks stayed quiet
    loads = sorted((d["start"], d["end"]) for d in ss if d["name"] == schema.DATA_LOADING)
    assert len(loads) == len(set(loads)) <= 6 + 2  # no duplicate fetch spans
    evals = [s for s in ss if s["name"] == schema.CUSTOM_BADPUT]
    assert len(evals) == 2  # Lightning's validation runs, not also torch's eval detection
