"""The instrumentor machinery shared by every framework: lazy patching, guards, claims."""

from __future__ import annotations

import importlib
import sys
import time

import pytest
from instr_util import child_env, run_python

import goodput
import goodput_instrumentation
from goodput import schema
from goodput_instrumentation import _base

FAKE_FW = '''
calls = []
def train_step(x):
    calls.append(x)
    return x + 1
'''


class FakeInstrumentor(_base.GoodputInstrumentor):
    """Records a step around ``fakefw.train_step``; fails on purpose when x is negative."""

    modules = ("fakefw",)
    requirements = ("opentelemetry-api >= 1.0",)

    def _patch(self, module):
        self._patches = _base.Patches()
        original = module.train_step
        self._n = 0

        @_base.guard
        def after(x, t0):
            if x < 0:
                raise ValueError("hook failure on purpose")
            self._n += 1
            _base.recorder().record(schema.STEP, t0, time.time_ns(), {schema.ATTR_STEP: self._n})

        def train_step(x):
            t0 = time.time_ns()
            out = original(x)
            after(x, t0)
            return out

        self._patches.set(module, "train_step", train_step)

    def _unpatch(self):
        if hasattr(self, "_patches"):
            self._patches.undo()


class TooNewInstrumentor(FakeInstrumentor):
    _instance = None  # BaseInstrumentor keeps one instance per class
    requirements = ("opentelemetry-api >= 999",)


@pytest.fixture
def fakefw(tmp_path, monkeypatch):
    (tmp_path / "fakefw.py").write_text(FAKE_FW)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fakefw", None)
    rec = goodput.configure("base", run_dir=tmp_path / "run", handle_signals=False,
                            start_time=time.time())
    yield rec
    for cls in (FakeInstrumentor, TooNewInstrumentor):
        if cls().is_instrumented_by_opentelemetry:
            cls().uninstrument()
    goodput.shutdown()
    sys.modules.pop("fakefw", None)


def test_patches_only_when_the_framework_is_imported_and_uninstrument_restores(fakefw):
    inst = FakeInstrumentor()
    inst.instrument()
    assert "fakefw" not in sys.modules and not inst.patched
    fw = importlib.import_module("fakefw")
    assert inst.patched
    original = fw.train_step.__closure__ is not None  # our wrapper is a closure
    assert original
    assert fw.train_step(1) == 2 and fw.calls == [1]
    inst.uninstrument()
    assert not inst.patched
    assert fw.train_step.__closure__ is None and fw.train_step.__module__ == "fakefw"
    assert fw.train_step(2) == 3


def test_already_imported_module_is_patched_at_once_and_reinstrument_works(fakefw):
    fw = importlib.import_module("fakefw")
    inst = FakeInstrumentor()
    inst.instrument()
    assert inst.patched
    inst.uninstrument()
    inst.instrument()  # the wrapt hook stays registered; the module is patched again
    assert inst.patched and fw.train_step.__closure__ is not None


def test_a_failing_hook_is_counted_never_raised(fakefw):
    rec = fakefw
    FakeInstrumentor().instrument()
    fw = importlib.import_module("fakefw")
    before = rec.stats()["errors"]
    assert fw.train_step(-5) == -4  # the training code still gets its result
    assert fw.train_step(-6) == -5
    assert rec.stats()["errors"] == before + 2


def test_version_mismatch_skips_patching_with_a_warning(fakefw, caplog):
    inst = TooNewInstrumentor()
    inst.instrument()
    with caplog.at_level("WARNING", logger="goodput.instrumentation"):
        fw = importlib.import_module("fakefw")
    assert not inst.patched and fw.train_step.__closure__ is None
    assert "needs opentelemetry-api >= 999" in caplog.text


def test_claims_are_per_owner():
    a, b = object(), object()
    _base.claim("step", a)
    try:
        assert _base.claimed_by_other("step", b) and not _base.claimed_by_other("step", a)
        _base.release("step", b)  # not the holder: no effect
        assert _base.claimed_by_other("step", b)
    finally:
        _base.release("step", a)
    assert not _base.claimed_by_other("step", b)


def test_unknown_framework_name_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown \['tensorflow'\]; choose from"):
        goodput_instrumentation.instrument(["torch", "tensorflow"])
    with pytest.raises(ValueError, match="choose from"):
        goodput_instrumentation.uninstrument(["mxnet"])


def test_instrument_imports_no_framework(tmp_path):
    code = (
        "import sys, goodput\n"
        "print(sorted(goodput.instrument()))\n"
        "print([m for m in ('torch', 'jax', 'orbax', 'lightning', 'pytorch_lightning',"
        " 'transformers') if m in sys.modules])\n"
    )
    out = run_python(["-c", code], env=child_env(GOODPUT_RUN_DIR=str(tmp_path))).stdout
    assert out.splitlines() == [
        "['jax', 'lightning', 'orbax', 'torch', 'transformers']",
        "[]",
    ]


def test_entry_points_name_every_instrumentor():
    from importlib.metadata import entry_points

    eps = {e.name: e.value for e in entry_points(group="opentelemetry_instrumentor")}
    for name, target in goodput_instrumentation.INSTRUMENTORS.items():
        assert eps.get(name) == target


def test_unknown_option_is_a_clear_error_and_instruments_nothing(caplog):
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['detect_evals'\]; these take"):
        goodput_instrumentation.instrument(["torch"], detect_evals=False)
    with caplog.at_level("WARNING", logger="goodput"):  # goodput.instrument never raises
        assert goodput.instrument(["torch"], detect_evals=False) == []
    assert "unknown option(s) ['detect_evals']; these take" in caplog.text
    from goodput_instrumentation.torch import TorchInstrumentor

    assert not TorchInstrumentor().is_instrumented_by_opentelemetry
