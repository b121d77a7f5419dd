"""Issue 36 part 8: the recorder never raises into the training script.

Every setting, from the environment or from an argument, is validated: a bad value gets one
warning naming it and what is used instead. No public recording function or context manager
lets an exception reach its caller, whatever its arguments. Proved with Hypothesis over
argument values and types and environment values, in real processes
(``tests/never_raises_child.py``), plus the acceptance cases: ``GOODPUT_FLUSH_INTERVAL_S`` in
{0, -1, abc, 1e9} with ``goodput.step`` given a string, None, a float and a tensor.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import goodput
from goodput import config, schema

CHILD = Path(__file__).resolve().parents[1] / "never_raises_child.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None

# Every variable goodput.config reads (GOODPUT_TRACES_EXPORTER and OTEL_TRACES_EXPORTER
# from a list: a real exporter name would try to reach a collector).
ENV_VARS = ("GOODPUT_FLUSH_INTERVAL_S", "GOODPUT_SPOOL", "GOODPUT_PROCESS_INDEX", "RANK",
            "JAX_PROCESS_ID", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE",
            "GOODPUT_PROCESS_COUNT", "WORLD_SIZE", "JAX_NUM_PROCESSES", "GOODPUT_ATTEMPT",
            "TORCHELASTIC_RESTART_COUNT", "GOODPUT_TRACE_WINDOW_S",
            "GOODPUT_TRACE_WINDOW_SPANS", "GOODPUT_SPOOL_SEGMENT_MB", "GOODPUT_JOB_NAME",
            "OTEL_SERVICE_NAME", "OTEL_SDK_DISABLED", "OTEL_RESOURCE_ATTRIBUTES",
            "GOODPUT_RUN_DIR")
_SPECIAL = ["0", "-1", "abc", "1e9", "1e-9", "nan", "inf", "-inf", "", " ", "1", "3", "0.5",
            "true", "false", "maybe", "3.5", "99999999999999999999999", "-0", "1_000", "0x10"]
_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=6)
env_values = st.one_of(st.sampled_from(_SPECIAL), _text,
                       st.floats(allow_nan=True).map(repr),
                       st.integers(-10**20, 10**20).map(str))


def _safe_dir(value: str) -> str:
    """A relative directory inside the child's working directory."""
    return "d_" + "".join(c if c.isalnum() else "_" for c in value)[:20]


def _run_child(tmp_path: Path, program: dict, env: dict | None = None,
               timeout: float = 60) -> tuple[dict, str]:
    """Run the child in ``tmp_path`` with ``env`` added to a clean environment; it must exit
    0 and print its end line. Returns (that line's JSON, stderr)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    prog = tmp_path / "program.json"
    prog.write_text(json.dumps(program))
    base = {k: v for k, v in os.environ.items()
            if k not in ENV_VARS and not k.startswith(("GOODPUT_", "OTEL_"))}
    out = subprocess.run([sys.executable, str(CHILD), str(prog)], cwd=tmp_path,
                         env={**base, **(env or {})}, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, (env, program, out.stderr[-3000:])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    ends = [ln for ln in out.stdout.splitlines() if ln.startswith('{"end"')]
    assert ends, out.stdout[-2000:]
    return json.loads(ends[-1]), out.stderr


def _ignoring_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("goodput: ignoring ")]


# --- environment values, real processes --------------------------------------------------


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(env=st.dictionaries(st.sampled_from(ENV_VARS), env_values, max_size=6),
       flush=env_values)
def test_any_environment_runs_to_the_end_and_records(tmp_path_factory, env, flush) -> None:
    """Whatever the variables hold, the script ends normally, its plain steps are recorded,
    and each bad value is warned about once; a bad flush interval is named."""
    env = dict(env, GOODPUT_FLUSH_INTERVAL_S=flush)
    if "GOODPUT_RUN_DIR" in env:
        env["GOODPUT_RUN_DIR"] = _safe_dir(env["GOODPUT_RUN_DIR"])
    program = {"configure": {}, "calls": [["step", [0], {}, "with"],
                                          ["step", ["abc"], {}, "with"]]}
    got, stderr = _run_child(tmp_path_factory.mktemp("env"), program, env)
    assert got["stats"]["recorded"] >= 7  # step 0, steps 1000-1004, the save
    lines = _ignoring_lines(stderr)
    assert len(lines) == len(set(lines)), lines  # one warning per setting and value
    try:
        value = float(flush.strip()) if flush.strip() else None
    except ValueError:
        value = math.nan
    named = [ln for ln in lines if "GOODPUT_FLUSH_INTERVAL_S" in ln]
    if value is None or 0.01 <= value <= 3600:
        assert not named, lines
    else:
        assert len(named) == 1, lines


# --- argument values and types, real processes -------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                     st.floats(allow_nan=True, allow_infinity=True), _text,
                     st.sampled_from([0, 1, 3, 1.0, 2.5, 1e300, -0.0, "3", "", "x" * 300]))
_arrays = st.one_of(st.integers(-3, 2**40), st.floats(allow_nan=True),
                    st.lists(st.integers(0, 3), max_size=3)).map(lambda x: {"__np__": x})
values = st.one_of(_scalars, _arrays, st.just({"__obj__": 0}),
                   st.lists(_scalars, max_size=3),
                   st.dictionaries(st.text(max_size=3), _scalars, max_size=2))
_uses = st.sampled_from(["with", "decorate", "begin_finish", "call"])
_times = st.fixed_dictionaries({}, optional={"start": values, "end": values})


_NO_ARGS = st.just([])


def _phase_call(name: str, args=_NO_ARGS, kwargs=_times):
    return st.tuples(st.just(name), args, kwargs, _uses).map(list)


calls = st.one_of(
    _phase_call("step", st.lists(values, max_size=1)),
    _phase_call("checkpoint_save", st.lists(values, max_size=1),
                st.fixed_dictionaries({}, optional={"blocking": values, "start": values})),
    _phase_call("checkpoint_restore", st.lists(values, max_size=1)),
    _phase_call("custom_badput", st.lists(values, min_size=1, max_size=1),
                st.fixed_dictionaries({}, optional={"blocking": values, "end": values})),
    _phase_call("data_loading", st.just([]),
                st.fixed_dictionaries({}, optional={"blocking": values})),
    *[_phase_call(n, st.lists(values, max_size=1)) for n in
      ("training_prep", "program_startup", "accelerator_init", "collective_wait")],
    st.tuples(st.just("step_start"), st.lists(values, min_size=1, max_size=1),
              st.fixed_dictionaries({}, optional={"at": values}), st.just("call")).map(list),
    st.tuples(st.sampled_from(["job_start", "job_end"]), st.just([]),
              st.fixed_dictionaries({}, optional={"at": values}), st.just("call")).map(list),
    st.tuples(st.just("flush"), st.just([]),
              st.fixed_dictionaries({}, optional={"timeout_s": st.one_of(
                  values, st.floats(0, 0.5))}), st.just("call")).map(list),
)
_exporter_names = st.sampled_from([None, "none", "zipkn", ["zipkn", 3], 5, ""])
configure_kwargs = st.fixed_dictionaries({}, optional={
    "job_name": values, "process_index": values, "process_count": values,
    "flush_interval_s": values, "spool": values, "trace_window_s": values,
    "trace_window_spans": values, "resource_attributes": values, "start_time": values,
    "start": values, "traces_exporter": _exporter_names, "exporters": values,
    "handle_signals": values})


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(kwargs=configure_kwargs, run_dir=st.one_of(st.none(), _text.map(_safe_dir), values),
       program=st.lists(calls, max_size=8))
def test_any_arguments_never_raise(tmp_path_factory, kwargs, run_dir, program) -> None:
    """configure() and every phase function, context manager, decorator and lifecycle call
    with arguments of any value and type: the script runs to its end."""
    if isinstance(run_dir, str) and not run_dir.startswith("d_"):
        run_dir = _safe_dir(run_dir)  # never a path outside the child's directory
    elif isinstance(run_dir, list):
        run_dir = None
    if run_dir is not None:
        kwargs = dict(kwargs, run_dir=run_dir)
    _run_child(tmp_path_factory.mktemp("args"), {"configure": kwargs, "calls": program})


# --- the same, in this process (many more examples) -------------------------------------


def _decode(v):
    if isinstance(v, dict) and "__np__" in v:
        import numpy as np

        return np.asarray(v["__np__"])
    if isinstance(v, dict) and "__obj__" in v:
        return object()
    return v


@pytest.fixture(scope="module")
def configured(tmp_path_factory):
    rec = goodput.configure("never-raises", run_dir=tmp_path_factory.mktemp("in-process"),
                            flush_interval_s=0.05)
    yield rec
    goodput.shutdown()


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=st.lists(calls.filter(lambda c: c[0] not in ("job_start", "job_end")),
                        max_size=6))
def test_phase_functions_never_raise_in_process(configured, program) -> None:
    for name, args, kw, use in program:
        got = getattr(goodput, name)(*map(_decode, args),
                                     **{k: _decode(v) for k, v in kw.items()})
        if use == "with":
            with got:
                pass
        elif use == "decorate" and callable(got):
            assert got(lambda: 7)() == 7
        elif use == "begin_finish" and hasattr(got, "begin"):
            got.begin()
            got.finish()


def test_an_exception_in_the_block_still_reaches_the_caller(configured) -> None:
    """Never raising is about goodput's own errors: the user's exception goes through."""
    with pytest.raises(KeyError):
        with goodput.step("not a number"):
            raise KeyError("mine")
    with pytest.raises(KeyError):
        goodput.training_prep()(lambda: {}["x"])()


def test_instrument_with_a_bad_name_or_option_warns_and_instruments_nothing(caplog) -> None:
    with caplog.at_level("WARNING", logger="goodput"):
        assert goodput.instrument(["torch", "tensorflow"]) == []
        assert goodput.instrument(["torch"], detect_evals=True) == []
        goodput.uninstrument(["mxnet"])
    assert "unknown ['tensorflow']" in caplog.text
    assert "unknown option(s) ['detect_evals']" in caplog.text
    assert "goodput.uninstrument(['mxnet']) failed" in caplog.text


# --- settings: one warning, naming the setting and what is used --------------------------


@pytest.mark.parametrize(("raw", "used", "why"), [
    ("0", 1.0, "not a finite number > 0; using the default 1"),
    ("-1", 1.0, "not a finite number > 0; using the default 1"),
    ("abc", 1.0, "not a finite number > 0; using the default 1"),
    ("1e9", 3600.0, "above 3600; using 3600"),
    ("0.001", 0.01, "below 0.01; using 0.01"),
])
def test_flush_interval_setting(monkeypatch, caplog, raw, used, why) -> None:
    monkeypatch.setenv("GOODPUT_FLUSH_INTERVAL_S", raw)
    config._WARNED.clear()
    with caplog.at_level("WARNING", logger="goodput"):
        assert config.flush_interval_s(None) == used
        assert config.flush_interval_s(None) == used  # warned once
    assert [r.getMessage() for r in caplog.records] == [
        f"goodput: ignoring GOODPUT_FLUSH_INTERVAL_S={raw!r}: {why}"]


def test_each_setting_read_from_the_environment_is_validated(monkeypatch, caplog) -> None:
    bad = {"GOODPUT_SPOOL": "maybe", "RANK": "-3", "GOODPUT_ATTEMPT": "-2",
           "WORLD_SIZE": "0", "GOODPUT_TRACE_WINDOW_S": "inf",
           "GOODPUT_TRACE_WINDOW_SPANS": "1.5", "GOODPUT_SPOOL_SEGMENT_MB": "inf",
           "OTEL_SDK_DISABLED": "yes please", "GOODPUT_JOB_NAME": "   "}
    for k, v in bad.items():
        monkeypatch.setenv(k, v)
    config._WARNED.clear()
    with caplog.at_level("WARNING", logger="goodput"):
        assert config.spool_enabled(None) is True
        assert config.process_index(None) == (0, "default")
        assert config.attempt_hint() == (0, "process")
        assert config.process_count(None) == 1
        assert config.trace_window_s(None) == config.DEFAULT_TRACE_WINDOW_S
        assert config.trace_window_spans(None) == config.DEFAULT_TRACE_WINDOW_SPANS
        assert config.spool_segment_bytes() == config.DEFAULT_SPOOL_SEGMENT_MB << 20
        assert config.sdk_disabled() is False
        assert config.job_name(None) == config.DEFAULT_JOB_NAME
    text = caplog.text
    for k, v in bad.items():
        assert text.count(f"ignoring {k}={v!r}") == 1, (k, text)


# --- the acceptance cases ------------------------------------------------------------------


def _spool_steps(run_dir: Path) -> list[int]:
    steps = []
    for f in sorted(run_dir.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        attrs = {a["key"]: a["value"] for a in s.get("attributes", [])}
                        if s["name"] == schema.STEP and schema.ATTR_OPEN not in attrs:
                            steps.append(int(attrs[schema.ATTR_STEP]["intValue"]))
    return sorted(steps)


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
@pytest.mark.parametrize("flush", ["0", "-1", "abc", "1e9"])
def test_acceptance_flush_interval_and_odd_steps(tmp_path, flush) -> None:
    """GOODPUT_FLUSH_INTERVAL_S in {0, -1, abc, 1e9} and goodput.step given a string, None,
    a float and a tensor: the script runs to its end; each step is recorded (an integral
    float, a 0-d integer tensor, None: the next number) or dropped with a warning."""
    steps = [["step", [x], {}, "with"] for x in
             ("abc", None, 5.0, 2.5, {"__torch__": 7}, {"__torch__": [1, 2]},
              {"__torch__": 9.0}, {"__torch__": -4})]
    program = {"configure": {"job_name": "acceptance", "run_dir": "run"}, "calls": steps,
               "torch": True}
    got, stderr = _run_child(tmp_path, program, {"GOODPUT_FLUSH_INTERVAL_S": flush},
                             timeout=120)
    assert got["end"]
    # None after a fresh configure: step 0; 5.0 -> 5; tensor(7) -> 7; tensor(9.) -> 9
    assert _spool_steps(tmp_path / "run") == [0, 5, 7, 9, 1000, 1001, 1002, 1003, 1004]
    dropped = [ln for ln in stderr.splitlines() if "is not a step number" in ln]
    assert len(dropped) == 4, stderr  # 'abc', 2.5, tensor([1, 2]), tensor(-4)
    named = [ln for ln in _ignoring_lines(stderr) if "GOODPUT_FLUSH_INTERVAL_S" in ln]
    assert len(named) == 1, stderr
    assert Counter(_ignoring_lines(stderr)).most_common(1)[0][1] == 1


def test_the_step_limit_literal_is_max_step():
    """phases.py writes api.MAX_STEP as a literal on the hot path: the two agree."""
    import inspect

    from goodput import api, phases
    assert api.MAX_STEP == 0x8000000000000000
    assert "0x8000000000000000" in inspect.getsource(phases)
