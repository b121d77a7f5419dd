"""The PyTorch instrumentor against real torch on CPU: spans written, report buckets.

Every training run happens in a child process (the instrumentor patches
process-global state); only the patch/restore check imports torch here, and it
records nothing. The children's scripts are below as strings; each prints
``MARK <name> <time_ns>`` lines so the test can cut its spans into sections.

Run time: about 40-60 s on a 2-core machine (seven Python processes importing torch).
"""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import textwrap

import pytest
from instr_util import ROOT, child_env, report, run_python, spans

from goodput import schema

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="needs torch (pip install torch)"
)

TRAIN = ROOT / "examples" / "pytorch_digits" / "train.py"

_PRELUDE = """
import json, os, sys, time
import goodput
goodput.configure(job_name="torch-test", run_dir=sys.argv[1], flush_interval_s=0.2)
goodput.instrument(["torch"])
import torch
import torch.nn.functional as F
torch.set_num_threads(1)
torch.manual_seed(0)

def mark(name):
    print("MARK", name, time.time_ns(), flush=True)

DATA = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))

def epoch(model, opt, **loader_kwargs):
    loader = torch.utils.data.DataLoader(DATA, batch_size=8, **loader_kwargs)
    for x, y in loader:  # 4 batches, then StopIteration
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return x
"""

BASIC = _PRELUDE + """
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

ck = sys.argv[2]
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

mark("workers0")
x = epoch(model, opt, num_workers=0)           # steps 1-4
mark("workers1")
x = epoch(model, opt, num_workers=1)           # steps 5-8
mark("eval")
model.eval(); model(x); model.train()           # one custom:eval span
mark("compile")
torch.compile(model, backend="eager")(x)
mark("reset")
torch._dynamo.reset()
torch.compile(model, backend="eager")(x)        # callbacks registered again after reset
mark("pg")
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[3],
                        rank=0, world_size=1)
dist.destroy_process_group()
mark("save")
dcp.save({"step": torch.tensor(8), "model": model.state_dict()},
         checkpoint_id=os.path.join(ck, "a"))                     # step 8 (0-d tensor)
dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(ck, "b"))  # own count: 8
fut = dcp.async_save({"global_step": 8, "model": model.state_dict()},
                     checkpoint_id=os.path.join(ck, "c"))         # step 8, + background
fut.result()
dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(ck, "step-00000004"))
time.sleep(0.05)  # the background span's done-callback has run
mark("more")
x = epoch(model, opt)                           # steps 9-12
mark("load")
state = {"step": torch.tensor(0), "model": model.state_dict()}
dcp.load(state, checkpoint_id=os.path.join(ck, "a"))             # restore step 8
assert int(state["step"]) == 8, state
x = epoch(model, opt)                           # steps 9-12 again
mark("fresh_opt")
opt2 = torch.optim.Adam(model.parameters(), lr=0.01)
get_state_dict(model, opt2)      # DCP initialises opt2's state with a zero-lr step: not a step
mark("load_by_id")
dcp.load({"model": model.state_dict()}, checkpoint_id=os.path.join(ck, "step-00000004"))
mark("gan")
gen = torch.nn.Linear(8, 8)
opt_d = torch.optim.SGD(model.parameters(), lr=0.1)
opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
for _ in range(3):                              # steps 5-7: one per iteration, not two
    for o, sign in ((opt_d, 1.0), (opt_g, -1.0)):
        o.zero_grad(); (sign * model(gen(x)).sum()).backward(); o.step()
mark("replaced")
opt3 = torch.optim.SGD(model.parameters(), lr=0.1)  # opt_d still alive, but no longer steps
for _ in range(3):                              # steps 8-10 (the lead moves to opt3)
    opt3.zero_grad(); model(x).sum().backward(); opt3.step()
mark("end")
print("STATS", json.dumps(goodput.get_recorder().stats()), flush=True)
"""

FAULTS = _PRELUDE + """
import torch.distributed.checkpoint as dcp
from goodput_instrumentation import _base
import goodput_instrumentation.torch as gt

ck = sys.argv[2]
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
epoch(model, opt)                               # steps 1-4
mark("claimed")
owner = object()
_base.claim("step", owner); _base.claim("data_loading", owner)
epoch(model, opt)                               # nothing recorded
_base.release("step", owner); _base.release("data_loading", owner)
mark("released")
epoch(model, opt)                               # steps 5-8 (claimed updates not counted)
mark("broken")
def boom():
    raise RuntimeError("deliberately broken recorder lookup")
gt.recorder = boom                              # every hook body of ours now fails
epoch(model, opt)
dcp.save({"step": 99, "model": model.state_dict()}, checkpoint_id=os.path.join(ck, "x"))
model.eval(); model.train()
mark("end")
print("STATS", json.dumps(goodput.get_recorder().stats()), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_script(tmp_path, name: str, text: str, *extra: str):
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(text))
    run_dir, ckpt = tmp_path / f"run-{name}", tmp_path / f"ckpt-{name}"
    proc = run_python([script, run_dir, ckpt, *extra], timeout=240)
    marks = {}
    stats = None
    for line in proc.stdout.splitlines():
        if line.startswith("MARK "):
            _, mark, t = line.split()
            marks[mark] = int(t)
        elif line.startswith("STATS "):
            stats = json.loads(line[len("STATS "):])
    return run_dir, marks, stats


def _between(all_spans, marks, first: str, last: str, name: str | None = None):
    lo, hi = marks[first], marks[last]
    return sorted(
        (s for s in all_spans if lo <= s["end"] <= hi and (name is None or s["name"] == name)),
        key=lambda s: s["start"],
    )


def _steps(section) -> list[int]:
    return [s["attrs"][schema.ATTR_STEP] for s in section if s["name"] == schema.STEP]


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    """The BASIC script's spans and section marks."""
    tmp = tmp_path_factory.mktemp("torch-basic")
    run_dir, marks, stats = _run_script(tmp, "basic", BASIC, str(_free_port()))
    return spans(run_dir), marks, stats, run_dir


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """The FAULTS script's spans, marks, recorder stats and report."""
    tmp = tmp_path_factory.mktemp("torch-faults")
    run_dir, marks, stats = _run_script(tmp, "faults", FAULTS)
    return spans(run_dir), marks, stats, run_dir


@pytest.mark.parametrize("section", [("workers0", "workers1"), ("workers1", "eval")])
def test_steps_and_data_loading(basic, section):
    """One step per optimizer update, contiguous, numbered on; one fetch span per batch."""
    all_spans, marks, _, _ = basic
    steps = _between(all_spans, marks, *section, schema.STEP)
    fetches = _between(all_spans, marks, *section, schema.DATA_LOADING)
    first = 1 if section[0] == "workers0" else 5
    assert _steps(steps) == list(range(first, first + 4))
    assert len(fetches) == 4  # the StopIteration call that ends the epoch is not a span
    for prev, cur in zip(steps, steps[1:], strict=False):
        assert cur["start"] == prev["end"]  # step n runs from update n-1 to update n
    if first == 1:  # the first step of the process starts at its first fetch
        assert steps[0]["start"] == fetches[0]["start"]
    for fetch, step in zip(fetches, steps, strict=True):  # each fetch inside its step
        assert step["start"] <= fetch["start"] <= fetch["end"] <= step["end"]
        assert fetch["attrs"].get(schema.ATTR_BLOCKING, True) is True


def test_eval_from_train_mode(basic):
    """model.eval() ... model.train() after training started: one custom:eval span."""
    all_spans, marks, _, _ = basic
    evals = [s for s in all_spans if s["name"] == schema.CUSTOM_BADPUT]
    assert len(evals) == 1
    assert evals[0]["attrs"][schema.ATTR_BADPUT_TYPE] == "eval"
    assert marks["eval"] <= evals[0]["start"] <= evals[0]["end"] <= marks["compile"]


def test_compile_is_program_startup(basic):
    """torch.compile(backend="eager"): program_startup spans, also after _dynamo.reset()."""
    all_spans, marks, _, _ = basic
    before = _between(all_spans, marks, "compile", "reset", schema.PROGRAM_STARTUP)
    after = _between(all_spans, marks, "reset", "pg", schema.PROGRAM_STARTUP)
    assert before and after
    assert all(s["end"] > s["start"] for s in before + after)
    assert not _between(all_spans, marks, "compile", "pg", schema.STEP)


def test_init_process_group_is_accelerator_init(basic):
    """init_process_group (gloo, world size 1, loopback): one accelerator_init span."""
    all_spans, marks, _, _ = basic
    inits = [s for s in all_spans if s["name"] == schema.ACCELERATOR_INIT]
    assert len(inits) == 1
    assert marks["pg"] <= inits[0]["start"] < inits[0]["end"] <= marks["save"]


def test_dcp_saves(basic):
    """save/async_save: blocking spans with the state dict's (or the own) step; async adds
    a non-blocking span for the background write, after the blocking part."""
    all_spans, marks, _, _ = basic
    saves = _between(all_spans, marks, "save", "more", schema.CHECKPOINT_SAVE)
    blocking = [s for s in saves if s["attrs"][schema.ATTR_BLOCKING] is True]
    background = [s for s in saves if s["attrs"][schema.ATTR_BLOCKING] is False]
    assert [s["attrs"][schema.ATTR_CHECKPOINT_STEP] for s in blocking] == [8, 8, 8, 8]
    assert len(background) == 1
    assert background[0]["attrs"][schema.ATTR_CHECKPOINT_STEP] == 8
    assert background[0]["start"] == blocking[2]["end"]  # starts where async_save returned
    assert background[0]["end"] >= background[0]["start"]


def test_dcp_load_resumes_numbering(basic):
    """load: a restore span with the loaded step; the next step is restored + 1."""
    all_spans, marks, _, _ = basic
    assert _steps(_between(all_spans, marks, "more", "load")) == [9, 10, 11, 12]
    restores = _between(all_spans, marks, "load", "fresh_opt", schema.CHECKPOINT_RESTORE)
    assert len(restores) == 1
    assert restores[0]["attrs"][schema.ATTR_CHECKPOINT_STEP] == 8
    after = _between(all_spans, marks, "load", "fresh_opt", schema.STEP)
    assert _steps(after) == [9, 10, 11, 12]
    assert after[0]["start"] >= restores[0]["end"]  # timed from its own first fetch


def test_dcp_fake_step_and_step_from_id(basic):
    """DCP's zero-lr optimizer-state initialisation is no step; a load with no step entry
    takes the step from the checkpoint id (``step-00000004``)."""
    all_spans, marks, _, _ = basic
    assert not _between(all_spans, marks, "fresh_opt", "load_by_id", schema.STEP)
    restores = _between(all_spans, marks, "load_by_id", "gan", schema.CHECKPOINT_RESTORE)
    assert [r["attrs"][schema.ATTR_CHECKPOINT_STEP] for r in restores] == [4]


def test_several_optimizers(basic):
    """Two optimizers per iteration: one step per iteration; a replaced lead optimizer
    (still alive, no longer stepping): its successor takes over, no update lost."""
    all_spans, marks, stats, _ = basic
    assert _steps(_between(all_spans, marks, "gan", "replaced")) == [5, 6, 7]
    replaced = _between(all_spans, marks, "replaced", "end")
    assert _steps(replaced) == [8, 9, 10]  # its first update ends a step too
    for prev, cur in zip(replaced, replaced[1:], strict=False):
        assert cur["start"] == prev["end"]
    assert stats["errors"] == 0


def test_report_buckets(basic):
    """The report of the BASIC run: every instrumented phase has time, no recorder errors."""
    _, _, _, run_dir = basic
    job = report(run_dir)
    badput = job["badput_s"]
    assert job["productive_time_s"] > 0
    for bucket in ("data_loading", "checkpoint_save", "checkpoint_restore", "custom:eval"):
        assert badput[bucket] > 0, bucket
    assert job["async_work_s"]["checkpoint_save"] > 0  # the async_save background write
    assert job["recorder"]["errors"] == 0
    # Dynamo saves and restores the global `random` state around a compilation:
    # span ids must not come from it, or ids drawn while compiling repeat.
    assert job["skipped"]["duplicate"] == 0
    assert badput["program_startup"] > 0
    assert badput["accelerator_init"] > 0


def test_claims_respected(faults):
    """While another owner claims step and data_loading, the hooks record nothing."""
    all_spans, marks, _, _ = faults
    assert not _between(all_spans, marks, "claimed", "released", schema.STEP)
    assert not _between(all_spans, marks, "claimed", "released", schema.DATA_LOADING)
    after = _between(all_spans, marks, "released", "broken", schema.STEP)
    assert _steps(after) == [5, 6, 7, 8]
    assert after[0]["start"] >= marks["released"]  # not stretched back over the claim


def test_failing_hook_is_counted_not_raised(faults):
    """A hook body that raises: training and the DCP save still complete; errors counted."""
    all_spans, marks, stats, run_dir = faults
    assert "end" in marks  # the script ran to the end
    assert not _between(all_spans, marks, "broken", "end", schema.STEP)
    # 4 fetches + 4 updates + the save + the eval: each failed hook call is counted
    assert stats["errors"] >= 10
    assert report(run_dir)["recorder"]["errors"] >= 10


def test_uninstrument_restores_everything():
    """In-process: patches and hooks appear with instrument() and are gone after uninstrument."""
    import torch
    import torch._dynamo
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.distributed.distributed_c10d as c10d
    import torch.optim.optimizer as optim
    from torch._dynamo.callback import callback_handler
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    import goodput_instrumentation
    from goodput_instrumentation.torch import TorchInstrumentor

    def snapshot():
        return {
            "next": _BaseDataLoaderIter.__dict__["__next__"],
            "train": torch.nn.Module.__dict__["train"],
            "ipg": dist.init_process_group,
            "c10d_ipg": c10d.init_process_group,
            "reset": torch._dynamo.reset,
            "save": dcp.save,
            "async_save": dcp.async_save,
            "load": dcp.load,
            "pre": dict(optim._global_optimizer_pre_hooks),
            "post": dict(optim._global_optimizer_post_hooks),
            "start_cbs": list(callback_handler.start_callbacks),
            "end_cbs": list(callback_handler.end_callbacks),
        }

    before = snapshot()
    inst = TorchInstrumentor()
    assert not inst.is_instrumented_by_opentelemetry
    try:
        goodput_instrumentation.instrument(["torch"])
        assert inst.patched
        during = snapshot()
        for key in ("next", "train", "ipg", "c10d_ipg", "reset", "save", "async_save", "load"):
            assert during[key] is not before[key], key
        assert len(during["pre"]) == len(before["pre"]) + 1
        assert len(during["post"]) == len(before["post"]) + 1
        assert len(during["start_cbs"]) == len(before["start_cbs"]) + 1
    finally:
        goodput_instrumentation.uninstrument(["torch"])
    after = snapshot()
    assert not inst.patched
    for key, value in before.items():
        assert after[key] == value if isinstance(value, dict | list) else after[key] is value, key


def test_nothing_patched_at_import():
    """Importing the instrumentor module (and torch) patches nothing."""
    code = (
        "import torch, torch.optim.optimizer as o\n"
        "from torch.utils.data.dataloader import _BaseDataLoaderIter as B\n"
        "n = B.__next__\n"
        "import goodput_instrumentation.torch\n"
        "assert B.__next__ is n and not o._global_optimizer_post_hooks\n"
    )
    run_python(["-c", code])


# --- the digits example: manual markers vs automatic instrumentation ----------------


def _digits(tmp_path, marks: str, steps: int):
    run_dir, ckpt = tmp_path / f"run-{marks}", tmp_path / f"ckpt-{marks}"
    run_python([
        TRAIN, "--marks", marks, "--ckpt-format", "dcp", "--run-dir", run_dir,
        "--ckpt-dir", ckpt, "--job-name", f"digits-{marks}", "--steps", str(steps),
        "--ckpt-every", "20", "--eval-every", "30", "--step-sleep", "0.01",
        "--log-every", "100", "--flush-interval", "0.2",
    ], timeout=240)  # fmt: skip
    return run_dir


@pytest.fixture(scope="module")
def digits_reports(tmp_path_factory):
    """The digits example run twice per mode (60 steps, then resumed to 90): both reports."""
    tmp = tmp_path_factory.mktemp("digits")
    out = {}
    for marks in ("manual", "auto"):
        _digits(tmp, marks, 60)
        out[marks] = report(_digits(tmp, marks, 90))
    return out


def test_digits_auto_matches_manual(digits_reports):
    """Same training run, marked by hand or recorded automatically: same steps and restore,
    and the step, data-loading, checkpoint and eval time agree within a tolerance.

    Tolerances: the two runs are separate processes on a shared machine, and the
    automatic spans are narrower by construction: a checkpoint_save span covers the
    ``dcp.save`` call only (the manual marker also covers ``get_state_dict`` and
    pruning old checkpoints, which auto charges to the next step), data_loading
    covers ``DataLoader.__next__`` only (manual also covers ``iter()`` at each epoch
    and ``.to(device)``), and eval covers ``model.eval()``..``model.train()``.
    Step time (productive + slowdown, ~10 ms a step from the sleep) must agree
    within 25% of the manual figure; the millisecond-sized phases only need to be
    present in both and within a factor of 4 (absolute slack 20 ms). Training
    prep, accelerator init and the warm-up are marked by hand only; auto leaves
    them in ``other``.
    """
    manual, auto = digits_reports["manual"], digits_reports["auto"]
    for job in (manual, auto):
        assert [a["resume_step"] for a in job["attempts"]] == [0, 60]
        assert [a["steps_kept"] for a in job["attempts"]] == [60, 30]
        assert [a["steps_wasted"] for a in job["attempts"]] == [0, 0]
        assert job["max_productive_step"] == 90
        assert job["recorder"]["errors"] == 0
    def step_time(job):
        return job["productive_time_s"] + job["badput_s"]["training_slowdown"]

    assert step_time(auto) == pytest.approx(step_time(manual), rel=0.25)
    for bucket in ("data_loading", "checkpoint_save", "checkpoint_restore", "custom:eval"):
        m, a = manual["badput_s"][bucket], auto["badput_s"][bucket]
        assert m > 0 and a > 0, bucket
        assert m / 4 - 0.02 <= a <= 4 * m + 0.02, (bucket, m, a)
    for bucket in ("training_prep", "accelerator_init", "program_startup"):
        assert manual["badput_s"][bucket] > 0 and auto["badput_s"][bucket] == 0


def test_digits_under_opentelemetry_instrument(tmp_path):
    """``opentelemetry-instrument python train.py --marks none``: no goodput code in the
    script, yet a report with steps, data loading, checkpoints and eval."""
    otel = ROOT / ".venv" / "bin" / "opentelemetry-instrument"
    if not otel.exists():
        otel_path = __import__("shutil").which("opentelemetry-instrument")
        if otel_path is None:
            pytest.skip("opentelemetry-instrument not installed")
        otel = otel_path
    run_dir = tmp_path / "run-otel"
    env = child_env(GOODPUT_RUN_DIR=str(run_dir), GOODPUT_JOB_NAME="digits-otel",
                    GOODPUT_FLUSH_INTERVAL_S="0.2")
    import subprocess

    proc = subprocess.run(
        [str(otel), sys.executable, str(TRAIN), "--marks", "none", "--ckpt-dir",
         str(tmp_path / "ckpt"), "--steps", "40", "--ckpt-every", "20", "--eval-every", "20",
         "--step-sleep", "0", "--log-every", "100"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    job = report(run_dir)
    assert job["max_productive_step"] == 40
    assert [a["steps_kept"] for a in job["attempts"]] == [40]
    for bucket in ("data_loading", "checkpoint_save", "custom:eval"):
        assert job["badput_s"][bucket] > 0, bucket
