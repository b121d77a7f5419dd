"""The Hugging Face Trainer instrumentor, on the real ``transformers.Trainer`` on CPU.

Three child processes in all (the instrumentor patches process-global state):
the example ``examples/hf_trainer/train.py`` crashing at step 50 and then
resuming from its last checkpoint (two attempts of one job, inspected by most
tests), and a driver script (``DRIVER`` below) that checks lazy patching, the
callback, claims, a failing hook and uninstrumenting, and prints what it saw as
JSON.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from instr_util import ROOT, child_env, report, run_python, spans

from goodput import schema

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it with PyTorch
pytest.importorskip("sklearn")

EXAMPLE = ROOT / "examples" / "hf_trainer" / "train.py"
CRASH_AT = 50
MAX_STEPS = 60
EVERY = 20  # eval and save interval
# Gradient accumulation 2: a step is one optimizer update of two micro-batches.
EXAMPLE_ARGS = ["--max-steps", MAX_STEPS, "--eval-every", EVERY, "--save-every", EVERY,
                "--batch-size", 16, "--grad-accum", 2]


def _by_attempt(all_spans, name, attempt):
    return sorted((s for s in all_spans if s["name"] == name and s["attempt"] == attempt),
                  key=lambda s: s["start"])


@pytest.fixture(scope="module")
def crash_resume(tmp_path_factory):
    """Attempt 0 crashes at step 50 (checkpoints 20 and 40 saved); attempt 1 resumes to 60."""
    tmp = tmp_path_factory.mktemp("hf")
    run_dir, out_dir = tmp / "runs", tmp / "ckpt"
    env = child_env(GOODPUT_RUN_DIR=str(run_dir), GOODPUT_JOB_NAME="hf-test")
    args = [EXAMPLE, "--output-dir", out_dir, *EXAMPLE_ARGS]
    proc = subprocess.run([sys.executable, *map(str, args), "--crash-at-step", str(CRASH_AT)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0 and f"simulated crash at step {CRASH_AT}" in proc.stderr, (
        proc.stdout[-2000:], proc.stderr[-4000:])
    dirs_after_crash = sorted(p.name for p in out_dir.iterdir())
    run_python(args, env=env)
    return {
        "run_dir": run_dir,
        "dirs_after_crash": dirs_after_crash,
        "dirs_at_end": sorted(p.name for p in out_dir.iterdir()),
        "spans": spans(run_dir),
        "report": report(run_dir),
    }


def test_steps_are_numbered_by_global_step(crash_resume):
    s = crash_resume["spans"]
    first = [x["attrs"][schema.ATTR_STEP] for x in _by_attempt(s, schema.STEP, 0)]
    second = [x["attrs"][schema.ATTR_STEP] for x in _by_attempt(s, schema.STEP, 1)]
    # The crash is raised in on_step_end of step 50, before the goodput callback sees it.
    assert first == list(range(1, CRASH_AT))
    assert second == list(range(2 * EVERY + 1, MAX_STEPS + 1))  # resumed after step 40
    for x in _by_attempt(s, schema.STEP, 0) + _by_attempt(s, schema.STEP, 1):
        assert x["start"] < x["end"]


def test_one_data_loading_span_per_optimizer_update(crash_resume):
    s = crash_resume["spans"]
    for attempt, n_steps, n_loads in ((0, CRASH_AT - 1, CRASH_AT), (1, MAX_STEPS - 40, 20)):
        steps = _by_attempt(s, schema.STEP, attempt)
        loads = _by_attempt(s, schema.DATA_LOADING, attempt)
        assert len(steps) == n_steps
        assert len(loads) == n_loads  # attempt 0 also loaded the batches of step 50
        for load, step in zip(loads, steps, strict=False):
            assert schema.ATTR_BLOCKING not in load["attrs"]  # blocking (the default)
            assert load["start"] <= load["end"] <= step["start"]


def test_evaluation_is_custom_eval_badput_between_steps(crash_resume):
    s = crash_resume["spans"]
    for attempt, eval_steps in ((0, [20, 40]), (1, [60])):
        evals = _by_attempt(s, schema.CUSTOM_BADPUT, attempt)
        assert [e["attrs"][schema.ATTR_BADPUT_TYPE] for e in evals] == ["eval"] * len(eval_steps)
        steps = {x["attrs"][schema.ATTR_STEP]: x for x in _by_attempt(s, schema.STEP, attempt)}
        for e, n in zip(evals, eval_steps, strict=True):
            assert steps[n]["end"] <= e["start"] < e["end"]
            if n + 1 in steps:
                assert e["end"] <= steps[n + 1]["start"]


def test_checkpoint_saves_match_the_directories_written(crash_resume):
    s = crash_resume["spans"]
    first = _by_attempt(s, schema.CHECKPOINT_SAVE, 0)
    second = _by_attempt(s, schema.CHECKPOINT_SAVE, 1)
    assert [f"checkpoint-{x['attrs'][schema.ATTR_CHECKPOINT_STEP]}" for x in first] == (
        crash_resume["dirs_after_crash"]) == ["checkpoint-20", "checkpoint-40"]
    assert [x["attrs"][schema.ATTR_CHECKPOINT_STEP] for x in second] == [60]
    assert crash_resume["dirs_at_end"] == ["checkpoint-20", "checkpoint-40", "checkpoint-60"]
    for x in first + second:
        assert x["attrs"][schema.ATTR_BLOCKING] is True and x["start"] < x["end"]
    steps = {x["attrs"][schema.ATTR_STEP]: x for x in _by_attempt(s, schema.STEP, 0)}
    assert steps[20]["end"] <= first[0]["start"] and first[0]["end"] <= steps[21]["start"]


def test_resume_restores_the_checkpoint_step_and_continues_after_it(crash_resume):
    s = crash_resume["spans"]
    assert _by_attempt(s, schema.CHECKPOINT_RESTORE, 0) == []
    restores = _by_attempt(s, schema.CHECKPOINT_RESTORE, 1)
    # model weights, then optimizer and scheduler, then RNG state: all checkpoint 40
    assert len(restores) >= 2
    assert {r["attrs"][schema.ATTR_CHECKPOINT_STEP] for r in restores} == {40}
    first_step = _by_attempt(s, schema.STEP, 1)[0]
    assert first_step["attrs"][schema.ATTR_STEP] == 41
    assert all(r["end"] <= first_step["start"] for r in restores)


def test_set_up_is_accelerator_init_and_training_prep(crash_resume):
    s = crash_resume["spans"]
    for attempt in (0, 1):
        (acc,) = _by_attempt(s, schema.ACCELERATOR_INIT, attempt)
        preps = _by_attempt(s, schema.TRAINING_PREP, attempt)
        assert len(preps) == 2  # Trainer.__init__, and train() up to on_train_begin
        assert preps[0]["start"] <= acc["start"] <= acc["end"] <= preps[0]["end"]
        assert preps[1]["end"] <= _by_attempt(s, schema.STEP, attempt)[0]["start"]


def test_report_buckets_and_wasted_progress(crash_resume):
    rep = crash_resume["report"]
    bad = rep["badput_s"]
    for bucket in ("checkpoint_save", "checkpoint_restore", "data_loading", "custom:eval",
                   "wasted_progress", "training_prep", "accelerator_init"):
        assert bad[bucket] > 0, bucket
    assert rep["productive_time_s"] > 0
    # interpreter, imports (torch, transformers) and the script before the Trainer's first
    # hook are process start-up; what no span covers after that is next to nothing
    assert bad["process_startup"] > 1.0
    assert bad["other"] < 0.02 * rep["total_time_s"], (bad, rep["total_time_s"])
    a0, a1 = rep["attempts"]
    assert a0["steps_kept"] == 40 and a0["steps_wasted"] == CRASH_AT - 1 - 40
    assert a1["resume_step"] == 40 and a1["steps_kept"] == MAX_STEPS - 40
    assert rep["recorder"]["errors"] == 0


def test_torch_step_hooks_stay_quiet_while_the_trainer_claims_steps(crash_resume):
    if importlib.util.find_spec("goodput_instrumentation.torch") is None:
        pytest.skip("goodput_instrumentation.torch does not exist yet: nothing to double-count")
    # goodput.instrument() in the example enabled the PyTorch instrumentor too (it patches
    # torch on import; a failure there would be counted, and the report test checks that
    # the recorder counted no error). Its optimizer-step and DataLoader hooks must add
    # nothing while the Trainer holds the claims: exactly one step span per update.
    s = crash_resume["spans"]
    for attempt, n in ((0, CRASH_AT - 1), (1, MAX_STEPS - 40)):
        numbers = [x["attrs"][schema.ATTR_STEP] for x in _by_attempt(s, schema.STEP, attempt)]
        assert len(numbers) == len(set(numbers)) == n
    assert len(_by_attempt(s, schema.DATA_LOADING, 1)) == 20


# --- lazy patching, callback, claims, failing hooks, uninstrument: one driver process ---

DRIVER = r'''
import json, sys, time
import goodput
goodput.configure("hf-driver", run_dir=sys.argv[1], handle_signals=False)
import goodput_instrumentation as gi
from goodput_instrumentation import _base
from goodput_instrumentation import transformers as T

out = {}
gi.instrument(frameworks=["transformers"])
import transformers
out["lazy"] = {"trainer_imported": "transformers.trainer" in sys.modules,
               "torch_imported": "torch" in sys.modules, "patched": T._enabled}
from transformers import Trainer, TrainerCallback, TrainingArguments
import torch
torch.set_num_threads(1)
NAMES = list(T._WRAPPERS)
out["patched"] = {n: hasattr(Trainer.__dict__[n], "__wrapped__") for n in NAMES}
originals = {n: Trainer.__dict__[n].__wrapped__ for n in NAMES}

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
    def forward(self, x, labels=None):
        logits = self.lin(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

class Data(torch.utils.data.Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        return {"x": torch.full((4,), float(i % 3)), "labels": torch.tensor(i % 3)}

claims_seen = []
class Probe(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        claims_seen.append({k: type(v).__name__ for k, v in _base._claims.items()})
        if state.global_step == getattr(self, "crash_at", -1):
            raise RuntimeError("crash on purpose")

def make(out_dir, callbacks=None, max_steps=4):
    args = TrainingArguments(output_dir=out_dir, max_steps=max_steps, per_device_train_batch_size=8,
        eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
        report_to="none", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
        logging_steps=100)
    return Trainer(model=Model(), args=args, train_dataset=Data(), eval_dataset=Data(),
                   callbacks=callbacks)

def goodput_callbacks(trainer):
    return sum(isinstance(c, T.GoodputCallback) for c in trainer.callback_handler.callbacks)

tmp = sys.argv[2]
mine = make(tmp + "/a", callbacks=[T.GoodputCallback])          # the class, added by the user
theirs = make(tmp + "/b", callbacks=[T.GoodputCallback()])      # an instance
auto = make(tmp + "/c", callbacks=[Probe()])
out["callbacks"] = [goodput_callbacks(t) for t in (mine, theirs, auto)]
auto.train()
out["callbacks_after_train"] = goodput_callbacks(auto)
out["claims_during_train"] = claims_seen[-1]
out["claims_after_train"] = sorted(_base._claims)

# A crash inside train(): the claims are released all the same.
probe = Probe(); probe.crash_at = 2
crashing = make(tmp + "/d", callbacks=[probe])
try:
    crashing.train()
except RuntimeError as exc:
    out["crash"] = str(exc)
out["claims_after_crash"] = sorted(_base._claims)

# Every hook fails (the recorder lookup raises): counted, and training completes.
errors0 = goodput.get_recorder().stats()["errors"]
real = T.recorder
def broken():
    raise ValueError("hook failure on purpose")
T.recorder = broken
failing = make(tmp + "/e")
result = failing.train(resume_from_checkpoint=None)
failing.train(resume_from_checkpoint=tmp + "/c/checkpoint-2")
T.recorder = real
out["failing_steps"] = result.global_step
out["errors_added"] = goodput.get_recorder().stats()["errors"] - errors0

# Uninstrument: every method is the original again; auto-added callbacks go quiet.
gi.uninstrument(frameworks=["transformers"])
out["restored"] = {n: Trainer.__dict__[n] is originals[n] for n in NAMES}
goodput.flush()
out["t_uninstrumented"] = time.time_ns()
auto.args.max_steps = 6
auto.train(resume_from_checkpoint=tmp + "/c/checkpoint-4")
out["steps_after_uninstrument"] = auto.state.global_step
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf-driver")
    script = tmp / "driver.py"
    script.write_text(DRIVER)
    run_dir = tmp / "runs"
    proc = run_python([script, run_dir, tmp / "out"], env=child_env())
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return {"out": json.loads(line[len("RESULT "):]), "spans": spans(run_dir),
            "report": report(run_dir)}


def test_nothing_is_patched_until_the_trainer_module_is_imported(driver):
    out = driver["out"]
    assert out["lazy"] == {"trainer_imported": False, "torch_imported": False,
                           "patched": False}
    assert all(out["patched"].values()), out["patched"]


def test_the_callback_is_added_once(driver):
    out = driver["out"]
    assert out["callbacks"] == [1, 1, 1]
    assert out["callbacks_after_train"] == 1


def test_steps_and_data_loading_are_claimed_while_train_runs(driver):
    out = driver["out"]
    assert out["claims_during_train"] == {"step": "GoodputCallback",
                                          "data_loading": "GoodputCallback"}
    assert out["claims_after_train"] == []
    assert out["crash"] == "crash on purpose"
    assert out["claims_after_crash"] == []


def test_a_failing_hook_is_counted_not_raised(driver):
    out = driver["out"]
    assert out["failing_steps"] == 4  # training completed
    # init, accelerator, 2 train calls, 4+2 steps (begin/end), saves, evals, restores...
    assert out["errors_added"] >= 10
    (end,) = [s for s in driver["spans"] if s["name"] == schema.JOB_END]
    assert end["attrs"][schema.ATTR_RECORDER_ERRORS] == out["errors_added"]


def test_reseeding_random_does_not_repeat_span_ids(driver):
    assert driver["report"]["skipped"]["duplicate"] == 0
    assert driver["report"]["recorder"]["errors"] == driver["out"]["errors_added"]


def test_uninstrument_restores_the_trainer_and_quiets_added_callbacks(driver):
    out = driver["out"]
    assert all(out["restored"].values()), out["restored"]
    assert out["steps_after_uninstrument"] == 6  # steps 5 and 6 ran ...
    late = [s for s in driver["spans"] if s["name"] in schema.PHASES
            and s["end"] > out["t_uninstrumented"]]
    assert late == []  # ... and recorded nothing


def test_driver_records_steps_of_the_instrumented_runs(driver):
    steps = [s["attrs"][schema.ATTR_STEP] for s in driver["spans"] if s["name"] == schema.STEP]
    # auto.train(): 1..4; crashing.train(): step 1 (step 2 crashed in the probe first)
    assert steps == [1, 2, 3, 4, 1]
    saves = [s["attrs"][schema.ATTR_CHECKPOINT_STEP] for s in driver["spans"]
             if s["name"] == schema.CHECKPOINT_SAVE]
    assert saves == [2, 4]
