"""Checkpoints of plain PyTorch loops: ``torch.save``/``torch.load``, safetensors, accelerate.

Two parts:

- fast unit tests of what counts as training state and which step it holds
  (``goodput_instrumentation._torch_ckpt_state``), in this process, nothing patched;
- real runs: ``examples/plain_torch/train.py`` (no goodput code) under
  ``opentelemetry-instrument``, SIGKILLed mid-training after step 33 and started again
  (it resumes from the checkpoint of step 20), in three checkpoint formats, and under
  ``torchrun --max-restarts 1`` with 2 gloo ranks where rank 1 is SIGKILLed; then
  ``goodput report --format json`` (a process) against the truth the driver knows.

The driver is ``benchmarks/launchers.py`` (imported, not changed): its truth-file watcher,
kills, death polls and truth model (``compute_truth``: the accounting rules of
``docs/accounting.md`` applied to what the script and the driver saw). The script writes
its steps (from the end of one optimizer update to the end of the next; a process's first
step from its first fetch), batch fetches, checkpoint saves and restores (the whole call,
rename and ``load_state_dict`` included) to the truth file; the driver adds the kill and
death times. Tolerance per bucket: one flush interval (0.25 s: a killed attempt ends at its
last flush) + 0.35 s slack (the launchers harness's, for this busy 2-core machine); goodput
within that many seconds of productive time over the total; resume steps, kept steps and
the max productive step exact.

Run time: about 2 minutes on a 2-core machine (each real run starts 2-5 Python processes
that import torch).
"""

from __future__ import annotations

import importlib.util
import io
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from instr_util import ROOT, load_benchmark

from goodput_instrumentation._torch_ckpt_state import (
    as_int,
    inspect_state,
    is_module_state,
    metadata_step,
    name_step,
    safetensors_metadata,
)

torch = pytest.importorskip("torch")

TRAIN = ROOT / "examples" / "plain_torch" / "train.py"
_OTEL = Path(sys.executable).parent / "opentelemetry-instrument"
OTEL = str(_OTEL) if _OTEL.exists() else shutil.which("opentelemetry-instrument")

real_runs = pytest.mark.skipif(
    OTEL is None or not sys.platform.startswith("linux"),
    reason="needs opentelemetry-instrument and Linux (/proc, as benchmarks/launchers.py)",
)


# --- what is training state, and its step -----------------------------------------------------


def _model_and_adamw(updates: int = 3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(updates):
        opt.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
    return model, opt


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


T = torch.Tensor


def test_step_keys_come_first():
    model, opt = _model_and_adamw(3)
    sd, osd = model.state_dict(), opt.state_dict()
    cases = [
        ({"model": sd, "optimizer": osd, "step": 7}, 7),
        ({"model": sd, "optimizer": osd, "global_step": torch.tensor(8)}, 8),
        ({"model": sd, "iteration": 9.0}, 9),
        ({"step": 5, "loss": 0.3}, 5),  # a step alone is enough
        ({"model": sd, "optimizer": osd}, 3),  # AdamW's own count of updates
        (osd, 3),  # an optimizer state dict alone
        # the PyTorch tutorial's dict: the optimizer's update count, not the epoch
        ({"epoch": 1, "model_state_dict": sd, "optimizer_state_dict": osd, "loss": 0.1}, 3),
        ({"epoch": 2, "model": sd}, 2),  # nothing better than the epoch
        # Lightning's layout (global_step; optimizer states in a list)
        ({"global_step": 11, "state_dict": sd, "optimizer_states": [osd]}, 11),
        ({"state_dict": sd, "optimizer_states": [osd]}, 3),
    ]
    for obj, step in cases:
        info = inspect_state(obj, T)
        assert info is not None and info.step == step and not info.weights_only, (obj.keys(), info)
    # the step survives torch.save/torch.load (weights_only, mmap)
    info = inspect_state(_roundtrip({"model": sd, "optimizer": osd}), T)
    assert info.step == 3


def test_weights_only_and_optimizer_without_step():
    model, _ = _model_and_adamw(1)
    sd = model.state_dict()
    for obj in (sd, {"model": sd}, dict(sd), _roundtrip(sd), {k: v for k, v in sd.items()}):
        info = inspect_state(obj, T)
        assert info is not None and info.step is None and info.weights_only, info
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)  # plain SGD keeps no step
    info = inspect_state({"model": sd, "optimizer": sgd.state_dict()}, T)
    assert info is not None and info.step is None and not info.weights_only


def test_not_training_state():
    model, opt = _model_and_adamw(1)
    for obj in (
        torch.randn(3),  # a lone tensor
        [torch.randn(3), torch.randn(2)],  # a list of tensors
        (torch.randn(3),),
        model,  # torch.save(model): an exported model, no optimizer state, no step
        {"embeddings": torch.randn(4, 3), "labels": torch.arange(4)},  # tensors, no model
        {"img_001.png": torch.randn(2)},
        {"config": {"lr": 0.1}, "history": [1, 2, 3]},
        {"step": True},  # a bool is no step
        {"step": "7"},  # nor is a string (only safetensors metadata holds strings)
        "text", 5, None, {},
    ):
        assert inspect_state(obj, T) is None, obj


def test_as_int_and_metadata():
    assert [as_int(v) for v in (3, 3.0, torch.tensor(4), torch.tensor(5.0))] == [3, 3, 4, 5]
    assert [as_int(v, strings=True) for v in ("6", " 7 ")] == [6, 7]
    assert [as_int(v) for v in (True, 2.5, -1.0, "6", torch.ones(2), None)] == [None] * 6
    assert [as_int(v, strings=True) for v in ("x", "", "-3")] == [None] * 3
    assert metadata_step({"step": "150", "format": "pt"}) == 150
    assert metadata_step({"epoch": "2"}) == 2
    assert metadata_step({"format": "pt"}) is None and metadata_step(None) is None


@pytest.mark.parametrize("path, step", [
    ("ckpt/ckpt-00000150.pt", 150),
    ("ckpt/ckpt-00000150.pt.tmp", 150),
    ("step_150.pt", 150),
    ("step150.pt", 150),
    ("150.pt", 150),
    ("epoch=2-step=150.ckpt", 150),
    ("runs/checkpoint-150/optimizer.pt", 150),
    ("runs/step_150/model.safetensors", 150),
    ("checkpoints/checkpoint_3", 3),
    ("model.pt", None),
    ("resnet50.pth", None),
    ("resnet50-0676ba61.pth", None),
    ("llama-7b.bin", None),
    ("sd-v1.5.safetensors", None),
    ("model_v2.pt", None),
    ("model-00001-of-00002.safetensors", None),
    ("runs/2024-01-05/model.pt", None),  # a date in the directory is no step
    ("runs/exp3/model.pt", None),
    (None, None),
])
def test_name_step(path, step):
    assert name_step(path) == step


def test_safetensors_files(tmp_path):
    from safetensors.torch import load_file, save_file

    model, _ = _model_and_adamw(1)
    save_file(model.state_dict(), tmp_path / "w.safetensors", metadata={"step": "12"})
    loaded = load_file(tmp_path / "w.safetensors")  # a plain dict: no _metadata
    assert is_module_state(loaded, T)
    assert metadata_step(safetensors_metadata(tmp_path / "w.safetensors")) == 12
    save_file({"a": torch.randn(2)}, tmp_path / "x.safetensors")
    assert not is_module_state(load_file(tmp_path / "x.safetensors"), T)
    assert safetensors_metadata(tmp_path / "x.safetensors") is None


def test_inspection_is_cheap_and_copies_nothing(tmp_path):
    """A torch.load'ed (mmap) checkpoint of 2,000 parameters: inspected in well under a
    millisecond, and no tensor operation but the 0-d step's ``item()`` runs."""
    from torch.overrides import TorchFunctionMode

    params = {f"layer{i}.weight": torch.randn(64, 64) for i in range(2000)}
    state = {"model": params, "optimizer": {
        "state": {i: {"step": torch.tensor(40.0), "exp_avg": torch.zeros(64, 64)}
                  for i in range(2000)},
        "param_groups": [{"lr": 0.1, "params": list(range(2000))}]}}
    torch.save(state, tmp_path / "big.pt")
    loaded = torch.load(tmp_path / "big.pt", mmap=True)

    class Calls(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with Calls() as calls:
        info = inspect_state(loaded, T)
    assert info.step == 40
    assert set(calls.names) <= {"item", "__get__", "dim", "ndim"}, set(calls.names)
    assert calls.names.count("item") <= 16
    best = min(_timed(lambda: inspect_state(loaded, T)) for _ in range(20))
    assert best < 1e-3, best


def _timed(func) -> float:
    t0 = time.perf_counter()
    func()
    return time.perf_counter() - t0


# --- real runs against the driver's truth ---------------------------------------------------

if OTEL is not None and sys.platform.startswith("linux"):
    lh = load_benchmark("launchers")
    S = lh.Settings(steps=40, ckpt_every=20, step_sleep=0.04, flush_interval=0.25, slack=0.35)
#: Killed half a step after this step ended: 13 steps after the checkpoint of step 20.
KILL_STEP = 33
#: Compared bucket by bucket (s); "other" is every bucket the script does not mark.
CHECKED = ("productive", "training_slowdown", "data_loading", "checkpoint_save",
           "checkpoint_restore", "wasted_progress", "infrastructure_recovery",
           "accelerator_init", "other", "total")
UNMARKED = ("other", "process_startup", "program_startup", "training_prep")


def _driver(case: str, workdir: Path):
    class OtelDriver(lh.Driver):
        """The launchers driver, launching with ``OTEL_SERVICE_NAME`` (no goodput settings
        but the run directory and flush interval)."""

        def launch(self, tag, cmd, **env):
            import subprocess

            full = lh.child_env(OTEL_SERVICE_NAME=self.case, GOODPUT_RUN_DIR=str(self.run_dir),
                                GOODPUT_FLUSH_INTERVAL_S=str(self.s.flush_interval),
                                LAUNCH_TAG=tag, **env)
            with open(self.base / f"{tag}.log", "wb") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=full, cwd=self.base)
            self.launches[tag] = proc
            return proc

    return OtelDriver(case, workdir, S)


def _script(d, fmt: str) -> list[str]:
    return [str(TRAIN), "--ckpt-dir", str(d.ckpt_dir), "--format", fmt, "--steps", str(S.steps),
            "--ckpt-every", str(S.ckpt_every), "--step-sleep", str(S.step_sleep),
            "--truth", str(d.truth_path)]


def _compare(truth, job) -> tuple[dict, list[str]]:
    """(report - truth per bucket and for goodput, failures)."""
    fails = []
    got = {"productive": job["productive_time_s"], **job["badput_s"], "total": job["total_time_s"]}
    got["other"] = sum(got.get(k, 0.0) for k in UNMARKED)
    want = dict(truth.buckets)
    want["other"] = sum(want.get(k, 0.0) for k in UNMARKED)
    errors = {k: got.get(k, 0.0) - want.get(k, 0.0) for k in CHECKED}
    for k, e in errors.items():
        if abs(e) > S.tol:
            fails.append(f"{k}: report {got.get(k, 0.0):.3f} s, truth {want.get(k, 0.0):.3f} s")
    g_truth = want["productive"] / want["total"]
    errors["goodput"] = job["productive_time_s"] / job["total_time_s"] - g_truth
    if abs(errors["goodput"]) > S.tol / want["total"]:
        fails.append(f"goodput {job['goodput']:.4f}, truth {g_truth:.4f}")
    if abs(job["goodput"] - job["productive_time_s"] / job["total_time_s"]) > 1e-6:
        fails.append("goodput is not productive / total")
    if job["max_productive_step"] != truth.max_step:
        fails.append(f"max productive step {job['max_productive_step']}, truth {truth.max_step}")
    atts = job["attempts"]
    if len(atts) != len(truth.attempts):
        return errors, [*fails, f"{len(atts)} attempts, truth {len(truth.attempts)}"]
    for i, (ta, ra) in enumerate(zip(truth.attempts, atts, strict=True)):
        for key, value in (("resume_step", ta.resume), ("steps_kept", ta.steps_kept),
                           ("processes", len(ta.procs))):
            if ra[key] != value:
                fails.append(f"attempt {i}: {key} {ra[key]}, truth {value}")
        lo, hi = ta.steps_wasted
        if not lo <= ra["steps_wasted"] <= hi:
            fails.append(f"attempt {i}: steps_wasted {ra['steps_wasted']}, truth {lo}..{hi}")
    if atts[-1]["end_reason"] != "exit":
        fails.append(f"last attempt ends {atts[-1]['end_reason']!r}")
    # first_failure_uncertain depends on the kill's timing against the heartbeats: _finish
    # judges it against the driver's kills (benchmarks/launchers.py)
    warned = [w for w in job["warnings"] if w["code"] != "first_failure_uncertain"]
    if warned:
        fails.append(f"warnings {warned}")
    return errors, fails


def _finish(d, name: str) -> dict:
    procs = lh.processes(list(d.watcher.events), d.kills, dict(d.watcher.dead_at))
    truth = lh.compute_truth(procs, S.flush_interval, margin=S.flushed_margin)
    job = d.report()["jobs"]
    assert len(job) == 1, job
    job = job[0]
    errors, fails = _compare(truth, job)
    out = lh.Outcome(name, kills=d.kills)
    lh.compare_first_failures(out, truth, {"jobs": [job]})
    fails += out.failures
    print(f"\n{name}: report - truth (s), tolerance {S.tol:.2f} s")
    for k in (*CHECKED, "goodput"):
        t = truth.buckets.get(k) if k not in ("other", "goodput") else None
        print(f"  {k:<24} {errors[k]:+.4f}" + (f"   (truth {t:.3f})" if t is not None else ""))
    print(f"  max productive step {job['max_productive_step']} (truth {truth.max_step}); "
          f"resume {[a['resume_step'] for a in job['attempts']]}; kept "
          f"{[a['steps_kept'] for a in job['attempts']]} (truth "
          f"{[a.steps_kept for a in truth.attempts]}); goodput {job['goodput']:.4f}")
    assert not fails, "\n".join(fails)
    assert truth.max_step == S.steps and [a.resume for a in truth.attempts] == [0, 20]
    return job


def _kill_and_restart(tmp_path: Path, case: str, fmt: str) -> dict:
    d = _driver(case, tmp_path)
    try:
        cmd = [OTEL, sys.executable, *_script(d, fmt)]
        d.launch("L0", cmd)
        ev = d.wait_step_end("L0", 0, KILL_STEP)
        d.sleep_steps(0.5)
        d.kill(ev["pid"], signal.SIGKILL)
        d.wait_launch("L0", expect_rc=None)
        time.sleep(0.3)
        d.launch("L1", cmd)  # the same command: it resumes from the checkpoint of step 20
        d.wait_launch("L1")
        return _finish(d, case)
    finally:
        d.cleanup()


@real_runs
def test_torch_save_load_killed_and_restarted(tmp_path):
    job = _kill_and_restart(tmp_path, "plain-torch", "torch")
    assert job["badput_s"]["checkpoint_save"] > 0 and job["badput_s"]["checkpoint_restore"] > 0


@real_runs
@pytest.mark.skipif(importlib.util.find_spec("safetensors") is None, reason="needs safetensors")
def test_safetensors_killed_and_restarted(tmp_path):
    _kill_and_restart(tmp_path, "plain-safetensors", "safetensors")


@real_runs
@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="needs accelerate")
def test_accelerate_killed_and_restarted(tmp_path):
    _kill_and_restart(tmp_path, "plain-accelerate", "accelerate")


@real_runs
def test_torchrun_two_ranks_worker_killed(tmp_path):
    """``torchrun --max-restarts 1`` with 2 gloo ranks under ``opentelemetry-instrument``
    (``--no-python``): rank 1 SIGKILLed after step 33, torchrun restarts both ranks, they
    resume from step 20 and finish."""
    d = _driver("plain-torchrun", tmp_path)
    try:
        d.launch("L0", d.torchrun(2, 1, ["--no-python", OTEL, sys.executable,
                                         *_script(d, "torch")]))
        ev = d.wait_step_end("L0", 1, KILL_STEP)
        d.sleep_steps(0.5)
        d.kill(ev["pid"], signal.SIGKILL)
        d.wait_launch("L0")
        job = _finish(d, "plain-torchrun")
    finally:
        d.cleanup()
    assert [a["processes"] for a in job["attempts"]] == [2, 2]


# --- the hooks in a real process: what is recorded, and what is not ---------------------------

_PRELUDE = """
import io, json, os, sys, threading, time
import goodput
goodput.configure(job_name="ckpt-test", run_dir=sys.argv[1], flush_interval_s=0.2)
goodput.instrument(FRAMEWORKS)
import torch
import torch.nn.functional as F
torch.set_num_threads(1)
torch.manual_seed(0)
ck = sys.argv[2]
P = lambda name: os.path.join(ck, name)

def mark(name):
    print("MARK", name, time.time_ns(), flush=True)

DATA = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
LOADER = torch.utils.data.DataLoader(DATA, batch_size=8)

def epoch(model, opt, loader=LOADER, backward=None):
    for x, y in loader:  # 4 batches: 4 steps
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        (backward or (lambda l: l.backward()))(loss)
        opt.step()
"""

HOOKS = _PRELUDE.replace("FRAMEWORKS", '["torch"]') + """
from goodput_instrumentation import _base
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = torch.optim.AdamW(model.parameters())
epoch(model, opt)                                                  # steps 1-4
mark("save")
torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 4}, P("a.pt"))
torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, P("b.pt"))  # AdamW: 4
torch.save(model.state_dict(), P("ckpt_000006.pt"))                # weights: 6, from the name
torch.save(model.state_dict(), P("weights.pt"))                    # weights: own count 4
torch.save(model.state_dict(), io.BytesIO())                       # in memory: own count 4
with open(P("f.pt"), "wb") as f:
    torch.save({"model": model.state_dict(), "epoch": 1}, f)       # an open file; epoch 1
mark("not")
torch.save(torch.randn(3), P("t_5.pt"))                            # a tensor
torch.save([torch.randn(3)], P("l_5.pt"))                          # a list of tensors
torch.save(model, P("model_5.pt"))                                 # an exported model
torch.save({"emb": torch.randn(2, 2)}, P("emb_5.pt"))              # tensors, no model
for name in ("t_5.pt", "l_5.pt", "model_5.pt", "emb_5.pt", "weights.pt"):
    torch.load(P(name), weights_only=False)                        # none is a restore
mark("load")
state = torch.load(P("a.pt"))                                      # restore of step 4
model.load_state_dict(state["model"]); opt.load_state_dict(state["optimizer"])
epoch(model, opt)                                                  # steps 5-8
mark("load_name")
model.load_state_dict(torch.load(P("ckpt_000006.pt"), mmap=True))  # restore of step 6
epoch(model, opt)                                                  # steps 7-10
mark("manual")
with goodput.checkpoint_save(step=10):                             # the marker's span only
    torch.save({"model": model.state_dict(), "step": 10}, P("m.pt"))
with goodput.checkpoint_restore(step=10):
    torch.load(P("m.pt"))
mark("thread")
th = threading.Thread(target=torch.save, args=({"step": 10, "model": model.state_dict()},
                                               P("bg.pt")))
th.start(); th.join()                                              # off the training thread
mark("claim")
owner = object()
_base.claim("checkpoint", owner)
torch.save({"step": 10, "model": model.state_dict()}, P("c.pt")); torch.load(P("c.pt"))
_base.release("checkpoint", owner)
mark("faults")
class Odd(dict):
    def get(self, *args):
        raise RuntimeError("a dict that breaks inspection")
torch.save(Odd(step=1), P("odd.pt"))                               # saved; error counted
assert os.path.exists(P("odd.pt"))
try:
    torch.save({"step": 10, "model": model.state_dict()}, P("missing/x.pt"))
except RuntimeError as exc:                                        # torch's own error, as is
    print("RAISED", type(exc).__name__, flush=True)
mark("safetensors")
from safetensors.torch import load_file, load_model, save_file, save_model
save_model(model, P("m.safetensors"), metadata={"step": "10"})    # one span (not two)
save_file(model.state_dict(), P("w.safetensors"))                  # weights: own count 10
save_file({"a": torch.randn(2)}, P("x_3.safetensors"))             # not a model, no step
load_file(P("w.safetensors")); load_file(P("x_3.safetensors"))     # no restore
load_model(model, P("m.safetensors"))                              # restore of step 10
mark("accelerate")
from accelerate import Accelerator
acc = Accelerator(cpu=True)
m2, o2, l2 = acc.prepare(model, torch.optim.AdamW(model.parameters()), LOADER)
epoch(m2, o2, l2, acc.backward)                                    # steps 11-14; AdamW: 4
acc.save_state(P("acc"))                                           # one span, step 4
acc.load_state(P("acc"))                                           # restore of step 4
epoch(m2, o2, l2, acc.backward)                                    # steps 5-8
mark("end")
print("STATS", json.dumps(goodput.get_recorder().stats()), flush=True)
"""


def _run_script(tmp_path: Path, name: str, text: str):
    import json
    import textwrap

    from instr_util import run_python, spans

    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(text))
    run_dir, ck = tmp_path / f"run-{name}", tmp_path / f"ckpt-{name}"
    ck.mkdir()
    proc = run_python([script, run_dir, ck], timeout=240)
    marks, stats, lines = {}, None, []
    for line in proc.stdout.splitlines():
        if line.startswith("MARK "):
            _, mark, t = line.split()
            marks[mark] = int(t)
        elif line.startswith("STATS "):
            stats = json.loads(line[len("STATS "):])
        else:
            lines.append(line)
    return spans(run_dir), marks, stats, lines, run_dir


def _ckpts(all_spans, marks, first: str, last: str) -> list[tuple]:
    """(kind, step, blocking) of the checkpoint spans that end between two marks."""
    from goodput import schema

    lo, hi = marks[first], marks[last]
    kinds = {schema.CHECKPOINT_SAVE: "save", schema.CHECKPOINT_RESTORE: "restore"}
    return [(kinds[s["name"]], s["attrs"].get(schema.ATTR_CHECKPOINT_STEP),
             s["attrs"].get(schema.ATTR_BLOCKING, True))
            for s in sorted(all_spans, key=lambda s: s["start"])
            if s["name"] in kinds and lo <= s["end"] <= hi]


def _step_numbers(all_spans, marks, first: str, last: str) -> list[int]:
    from goodput import schema

    lo, hi = marks[first], marks[last]
    return [s["attrs"][schema.ATTR_STEP] for s in sorted(all_spans, key=lambda s: s["start"])
            if s["name"] == schema.STEP and lo <= s["end"] <= hi]


@pytest.fixture(scope="module")
def hooks(tmp_path_factory):
    pytest.importorskip("safetensors")
    pytest.importorskip("accelerate")
    return _run_script(tmp_path_factory.mktemp("ckpt-hooks"), "hooks", HOOKS)


def test_saves_of_training_state(hooks):
    all_spans, marks, *_ = hooks
    assert _ckpts(all_spans, marks, "save", "not") == [
        ("save", 4, True), ("save", 4, True), ("save", 6, True), ("save", 4, True),
        ("save", 4, True), ("save", 1, True)]


def test_not_checkpoints_are_not_recorded(hooks):
    all_spans, marks, *_ = hooks
    assert _ckpts(all_spans, marks, "not", "load") == []


def test_restores_continue_the_numbering(hooks):
    all_spans, marks, *_ = hooks
    assert _ckpts(all_spans, marks, "load", "load_name") == [("restore", 4, True)]
    assert _step_numbers(all_spans, marks, "load", "load_name") == [5, 6, 7, 8]
    assert _ckpts(all_spans, marks, "load_name", "manual") == [("restore", 6, True)]
    assert _step_numbers(all_spans, marks, "load_name", "manual") == [7, 8, 9, 10]


def test_marker_thread_claim(hooks):
    """A checkpoint marked with the phase API is recorded once (the marker's span); a save
    on another thread than the training loop's is not blocking; a ``checkpoint`` claim
    silences the hooks."""
    all_spans, marks, *_ = hooks
    assert _ckpts(all_spans, marks, "manual", "thread") == [
        ("save", 10, True), ("restore", 10, True)]
    assert _ckpts(all_spans, marks, "thread", "claim") == [("save", 10, False)]
    assert _ckpts(all_spans, marks, "claim", "faults") == []


def test_faults_are_counted_not_raised(hooks):
    """A dict whose inspection raises is saved all the same (error counted); a save that
    fails raises torch's own error and is recorded with error status."""
    all_spans, marks, stats, lines, _ = hooks
    assert "RAISED RuntimeError" in lines
    assert stats["errors"] == 1
    failed = [s for s in all_spans if marks["faults"] <= s["end"] <= marks["safetensors"]]
    assert [s["attrs"].get("goodput.checkpoint.step") for s in failed] == [10]


def test_safetensors(hooks):
    all_spans, marks, *_ = hooks
    assert _ckpts(all_spans, marks, "safetensors", "accelerate") == [
        ("save", 10, True), ("save", 10, True), ("restore", 10, True)]


def test_accelerate(hooks):
    all_spans, marks, *_ = hooks
    assert _ckpts(all_spans, marks, "accelerate", "end") == [
        ("save", 4, True), ("restore", 4, True)]
    assert _step_numbers(all_spans, marks, "accelerate", "end") == [11, 12, 13, 14, 5, 6, 7, 8]


FRAMEWORKS = _PRELUDE.replace("FRAMEWORKS", '["torch", "lightning", "transformers"]') + """
import logging, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
import lightning.pytorch as pl

class Lit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 2)
    def training_step(self, batch, i):
        x, y = batch
        return F.cross_entropy(self.lin(x), y)
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())

def trainer(max_steps):
    every = pl.callbacks.ModelCheckpoint(dirpath=P("pl"), every_n_train_steps=2, save_top_k=-1)
    return pl.Trainer(max_steps=max_steps, callbacks=[every], logger=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      accelerator="cpu", devices=1)

mark("lightning")
trainer(4).fit(Lit(), LOADER)                                       # Lightning's saves: 2, 4
mark("lightning_resume")
t = trainer(6)
t.fit(Lit(), LOADER, ckpt_path=P("pl/epoch=0-step=4.ckpt"))         # restore 4, save 6
mark("lightning_after")
t.save_checkpoint(P("final.ckpt"))                                  # after fit: Lightning's
torch.load(P("final.ckpt"), weights_only=False)                     # a plain torch.load: ours
mark("hf")
from transformers import Trainer, TrainingArguments

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 2)
    def forward(self, x, labels=None):
        logits = self.lin(x)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}

class Data(torch.utils.data.Dataset):
    def __len__(self): return 32
    def __getitem__(self, i):
        return {"x": DATA[i][0], "labels": DATA[i][1]}

def hf(max_steps):
    args = TrainingArguments(output_dir=P("hf"), max_steps=max_steps, save_strategy="steps",
        save_steps=2, per_device_train_batch_size=8, report_to="none", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, logging_steps=100)
    return Trainer(model=Model(), args=args, train_dataset=Data())

hf(4).train()                                                       # HF's saves: 2, 4
mark("hf_resume")
h = hf(6)
h.train(resume_from_checkpoint=P("hf/checkpoint-4"))                # HF's restore 4, save 6
mark("hf_after")
h.save_model(P("hf_final"))                                         # not HF's: ours (weights)
mark("end")
print("STATS", json.dumps(goodput.get_recorder().stats()), flush=True)
"""


@pytest.fixture(scope="module")
def frameworks(tmp_path_factory):
    for name in ("lightning", "transformers", "safetensors"):
        pytest.importorskip(name)
    return _run_script(tmp_path_factory.mktemp("ckpt-frameworks"), "frameworks", FRAMEWORKS)


def test_lightning_checkpoints_recorded_once(frameworks):
    """Lightning's own instrumentor records its saves and restore; the ``torch.save`` /
    ``torch.load`` inside them (and ``save_checkpoint`` after the fit) add nothing."""
    all_spans, marks, stats, *_ = frameworks
    assert _ckpts(all_spans, marks, "lightning", "lightning_resume") == [
        ("save", 2, True), ("save", 4, True)]
    restores_saves = _ckpts(all_spans, marks, "lightning_resume", "lightning_after")
    assert sorted(set(restores_saves)) == [("restore", 4, True), ("save", 6, True)]
    assert restores_saves.count(("save", 6, True)) == 1
    assert _ckpts(all_spans, marks, "lightning_after", "hf") == [
        ("save", 6, True), ("restore", 6, True)]
    assert stats["errors"] == 0


def test_hf_trainer_checkpoints_recorded_once(frameworks):
    """The HF instrumentor records ``_save_checkpoint`` and the restores; the
    ``torch.save`` of the optimizer and the safetensors model file inside add nothing;
    ``save_model`` after training (not recorded by HF) is one save of ours."""
    all_spans, marks, *_ = frameworks
    assert _ckpts(all_spans, marks, "hf", "hf_resume") == [("save", 2, True), ("save", 4, True)]
    resumed = _ckpts(all_spans, marks, "hf_resume", "hf_after")
    assert set(resumed) == {("restore", 4, True), ("save", 6, True)}
    assert resumed.count(("save", 6, True)) == 1
    assert len(_ckpts(all_spans, marks, "hf_after", "end")) == 1


def test_uninstrument_restores_the_checkpoint_functions():
    """torch.save/load (and torch.serialization's), the safetensors functions and
    Accelerator.save_state/load_state are wrapped once instrumented and are the originals
    again after uninstrument."""
    from instr_util import run_python

    pytest.importorskip("safetensors")
    pytest.importorskip("accelerate")
    code = (
        "import torch, torch.serialization as ser, safetensors.torch as st\n"
        "from accelerate import Accelerator as A\n"
        "def snap():\n"
        "    return [torch.save, torch.load, ser.save, ser.load, st.save_file, st.load_file,\n"
        "            st.save_model, st.load_model, A.__dict__['save_state'],\n"
        "            A.__dict__['load_state']]\n"
        "before = snap()\n"
        "import goodput_instrumentation as gi\n"
        "gi.instrument(['torch'])\n"
        "during = snap()\n"
        "assert all(d is not b and d.__wrapped__ is b for d, b in zip(during, before)), during\n"
        "assert torch.save is ser.save and torch.load is ser.load\n"
        "gi.uninstrument(['torch'])\n"
        "assert all(a is b for a, b in zip(snap(), before))\n"
    )
    run_python(["-c", code])
