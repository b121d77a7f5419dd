"""The incumbent's elastic, exclusion and query-time scenarios give the real
``ml-goodput-measurement`` 0.2.3's numbers, through our recorder and through ``goodput
import``.

Scenarios (each the recorder calls of a test of mgm 0.2.3's own suite, shipped in its
wheel, or of MaxText's elastic flow):

- elastic: ``goodput_elastic_test.py`` (``ElasticGoodputCalculatorTest``, the recorder tests
  of ``ElasticGoodputTest``) and a MaxText-shaped elastic event (``elastic_utils``: slice
  down, wait, reinitialisation, the steps repeated from the checkpoint, then a scale-up);
- exclusions: the five ``GoodputExclusionIntegrationTest`` tests, with their intervals, and
  exclusions over the restart program of ``BadputTest``;
- query times: every scenario of ``tests/compat/test_compat_recorder_kills.py`` queried at moments
  inside the run (as mgm's calculator queried then: it has only the entries written so
  far, and a job without end runs to *now*), among them the restarts without a job end
  (``GoodputDisruptionCompleteRestartTest``, ``GoodputDisruptionPartialRestartTest``).

Two paths for each, compared with the real mgm's calculator (its wall clock frozen at the
query time, fed the entries its own recorder wrote for the same calls, up to that time):

- **recorder**: the calls through ``goodput.mgm``'s recorder in real processes
  (``compat_recorder_child.py``; one per attempt, killed with SIGKILL before a restart),
  then ``goodput.mgm``'s calculator with ``definitions="mgm"`` and ``query_time`` (same
  method calls, same return shapes as mgm's);
- **import**: mgm's entries exported as Cloud Logging ``LogEntry`` JSON lines, ``goodput
  import``, then ``goodput report --definitions mgm --at TIME [--exclude START,END]
  --format json``.
"""

from __future__ import annotations

import datetime
import json
import types

import pytest

mgm = pytest.importorskip("ml_goodput_measurement.src.goodput")
mgm_elastic = pytest.importorskip("ml_goodput_measurement.src.goodput_elastic")
mgm_exclusion = pytest.importorskip("ml_goodput_measurement.src.goodput_exclusion")

from mgm_oracle import MemoryLogs  # noqa: E402
from test_compat_recorder_kills import (  # noqa: E402
    _EPOCH,
    _TEST_JOB_START_TIME,
    JOB,
    SCENARIOS,
    SEC,
    UTC,
    Script,
    _sample_program_with_badput,
    run_processes,
    us,
)

from goodput.mgm import goodput as ours_goodput  # noqa: E402
from goodput.mgm import goodput_elastic as ours_elastic  # noqa: E402
from goodput_processor import cli  # noqa: E402

TOL_S = 1e-5  # mgm: float POSIX seconds; ours: integer ns


# --- scenarios -------------------------------------------------------------------------------


def _elastic_calculator_test(r):
    # ElasticGoodputCalculatorTest.test_get_current_productive_and_unproductive_time_elastic
    job_start = datetime.datetime(2026, 5, 28, tzinfo=UTC)
    r.record_job_start_time(job_start)
    t1 = job_start + 10 * SEC
    r.record_elastic_wait_start_time("slice_down", t1)
    t2 = t1 + 10 * SEC
    r.record_elastic_wait_end_time("slice_down", t2)
    t3 = t2 + 10 * SEC
    r.record_elastic_wait_start_time("scale_up", t3)
    t4 = t3 + 15 * SEC
    r.record_elastic_wait_end_time("scale_up", t4)
    t5 = t4 + 10 * SEC
    r.record_elastic_reinit_start_time(t5)
    t6 = t5 + 20 * SEC
    r.record_elastic_reinit_end_time(t6)
    r.record_tpu_init_start_time(t5 + 2 * SEC)
    r.record_tpu_init_end_time(t5 + 7 * SEC)
    r.record_training_preparation_start_time(t5 + 10 * SEC)
    r.record_training_preparation_end_time(t5 + 15 * SEC)
    r.record_step_start_time(0, t6)
    r.record_step_start_time(1, t6 + 10 * SEC)


def _elastic_details_test(r):
    # ElasticGoodputCalculatorTest.test_get_job_goodput_details_elastic
    job_start = datetime.datetime(2026, 5, 28, tzinfo=UTC)
    r.record_job_start_time(job_start)
    r.record_elastic_slice_counts(2, 4, 2, job_start)
    t1 = job_start + datetime.timedelta(hours=8)
    r.record_elastic_slice_counts(2, 4, 4, t1)
    t2 = t1 + datetime.timedelta(hours=1)
    r.record_step_start_time(0, t2)
    t3 = t2 + 10 * SEC
    r.record_step_start_time(1, t3)
    r.record_job_end_time(t3 + 10 * SEC)


def _elastic_slice_counts(r):  # ElasticGoodputTest.test_record_elastic_slice_counts
    r.record_elastic_slice_counts(2, 4, 2, datetime.datetime(2026, 5, 28, tzinfo=UTC))


def _maxtext_elastic(r):
    """MaxText's elastic flow (``maxtext/utils/elastic_utils.py``: counts recorded at each
    change; MaxText passes these arguments by keyword, ``test_maxtext_integration.py``
    calls them so, here they go by position through the child process): 4 slices, steps
    0-9 of 10 s, a slice fails in step 10: wait (slice down) 30 s, reinitialisation 40 s
    with TPU init and training preparation inside, steps from 8 (the checkpoint) of 12 s
    on 3 slices, a scale-up after step 15: wait 5 s, reinitialisation 20 s, steps 16-19
    of 10 s, end."""
    t = datetime.datetime(2026, 6, 1, 9, tzinfo=UTC)
    r.record_job_start_time(t)
    r.record_elastic_slice_counts(4, 4, 4, t)
    r.record_tpu_init_start_time(t + SEC)
    r.record_tpu_init_end_time(t + 5 * SEC)
    r.record_training_preparation_start_time(t + 5 * SEC)
    r.record_training_preparation_end_time(t + 15 * SEC)
    t += 15 * SEC
    for step in range(11):
        r.record_step_start_time(step, t)
        t += 10 * SEC
    t -= 4 * SEC  # step 10 fails after 6 s
    r.record_elastic_wait_start_time("elastic_slice_down", t)
    r.record_elastic_slice_counts(0, 4, 3, t)
    t += 30 * SEC
    r.record_elastic_wait_end_time("elastic_slice_down", t)
    r.record_elastic_reinit_start_time(t)
    r.record_elastic_slice_counts(3, 4, 3, t)
    r.record_tpu_init_start_time(t + 2 * SEC)
    r.record_tpu_init_end_time(t + 10 * SEC)
    r.record_training_preparation_start_time(t + 10 * SEC)
    r.record_training_preparation_end_time(t + 35 * SEC)
    t += 40 * SEC
    r.record_elastic_reinit_end_time(t)
    for step in range(8, 16):
        r.record_step_start_time(step, t)
        t += 12 * SEC
    r.record_elastic_wait_start_time("elastic_scale_up", t)
    r.record_elastic_slice_counts(0, 4, 4, t)
    t += 5 * SEC
    r.record_elastic_wait_end_time("elastic_scale_up", t)
    r.record_elastic_reinit_start_time(t)
    t += 20 * SEC
    r.record_elastic_reinit_end_time(t)
    r.record_elastic_slice_counts(4, 4, 4, t)
    for step in range(16, 20):
        r.record_step_start_time(step, t)
        t += 10 * SEC
    r.record_job_end_time(t)


def _build(fn, *args) -> list:
    s = Script()
    fn(s, *args)
    return s.calls


ELASTIC = {
    "ElasticGoodputCalculatorTest.test_get_current_productive_and_unproductive_time_elastic":
        _build(_elastic_calculator_test),
    "ElasticGoodputCalculatorTest.test_get_job_goodput_details_elastic":
        _build(_elastic_details_test),
    "ElasticGoodputTest.test_record_elastic_slice_counts": _build(_elastic_slice_counts),
    "maxtext_elastic_event": _build(_maxtext_elastic),
}


def _t(h, m, s, day=1, month=1, year=2025):
    return datetime.datetime(year, month, day, h, m, s, tzinfo=UTC)


#: incumbent test -> (its calls from test_compat_recorder_kills, its exclusion queries)
EXCLUSIONS = {
    "test_basic_exclusion_reduces_productive_time": (
        "GoodputExclusionIntegrationTest.test_basic_exclusion_reduces_productive_time",
        [[(_t(10, 0, 10), _t(10, 0, 15))]]),
    "test_exclusion_masking_badput_event": (
        "GoodputExclusionIntegrationTest.test_exclusion_masking_badput_event",
        [[(_t(12, 0, 0), _t(12, 0, 10))]]),
    "test_exclusion_with_multiple_steps_and_badput": (
        "GoodputExclusionIntegrationTest.test_exclusion_with_multiple_steps_and_badput",
        [[(_t(14, 0, 11), _t(14, 0, 21))]]),  # the first test_sync event
    "test_exclusion_during_disruption_recovery": (
        "GoodputExclusionIntegrationTest.test_exclusion_during_disruption_recovery",
        [[], [(_t(16, 0, 0), _t(16, 0, 20))]]),
    "test_exclusion_masking_training_prep": (
        "GoodputExclusionIntegrationTest.test_exclusion_masking_training_prep",
        [[(_t(12, 0, 5), _t(12, 0, 15))]]),
    # over steps, data loading, a restart and its recovery (two intervals, overlapping)
    "restart_program": ("BadputTest.test_badput_calculator_program_startup_with_disruptions", [
        [(_TEST_JOB_START_TIME + 3 * SEC, _TEST_JOB_START_TIME + 12 * SEC),
         (_TEST_JOB_START_TIME + 10 * SEC, _TEST_JOB_START_TIME + 14 * SEC),
         (_TEST_JOB_START_TIME + 30 * SEC, _TEST_JOB_START_TIME + 40 * SEC)]]),
}


# --- mgm, the oracle -------------------------------------------------------------------------


class _Clock:
    """``datetime`` for mgm's modules, whose ``now()`` reads :attr:`at` (None: the real one)."""

    def __init__(self):
        clock = self

        class Frozen(datetime.datetime):
            @classmethod
            def now(cls, tz=None):
                if clock.at is None:
                    return datetime.datetime.now(tz)
                return clock.at.astimezone(tz) if tz is not None else clock.at.replace(
                    tzinfo=None)

        self.at = None
        self.module = types.SimpleNamespace(datetime=Frozen, timezone=datetime.timezone,
                                            timedelta=datetime.timedelta, date=datetime.date)


class _Log:
    def __init__(self):
        self.entries: list[dict] = []

    def write_cloud_logging_entry(self, entry):
        self.entries.append(dict(entry))


def mgm_log(calls) -> list[dict]:
    """The entries mgm's own (elastic) recorder writes for ``calls``."""
    log = _Log()
    rec = mgm_elastic.ElasticGoodputRecorder(JOB, "log", True, log)
    for method, *args in calls:
        if method not in ("pause", "sleep"):
            getattr(rec, method)(*args)
    return log.entries


@pytest.fixture
def oracle(tmp_path, monkeypatch):
    """``make(entries, at, elastic)``: a real mgm 0.2.3 calculator over the entries written
    up to ``at``, its clock frozen at ``at``."""
    clock = _Clock()
    for module in (mgm, mgm_exclusion):
        monkeypatch.setattr(module, "datetime", clock.module)
    count = iter(range(10**6))

    def make(entries, at, elastic=False):
        clock.at = at
        ts = mgm.get_timestamp_from_log_entry
        logs = MemoryLogs([e for e in entries if ts(e) <= at], ts)
        cls = mgm_elastic.ElasticGoodputCalculator if elastic else mgm.GoodputCalculator
        return cls(JOB, "log", logs, cache_dir=str(tmp_path / f"cache-{next(count)}"))

    return make


def last_time(entries) -> datetime.datetime:
    ts = max(mgm.get_timestamp_from_log_entry(e) for e in entries)
    return _EPOCH + datetime.timedelta(microseconds=round(ts.timestamp() * 1e6))


# --- comparing ---------------------------------------------------------------------------------


def _key(k):
    return getattr(k, "name", k)


def same(a, b, path="") -> None:
    """``a`` (ours) equals ``b`` (mgm): dicts by key name (same keys), tuples item by item,
    numbers within ``TOL_S`` (relative 1e-6)."""
    if isinstance(b, dict):
        assert isinstance(a, dict), path
        na, nb = {_key(k): v for k, v in a.items()}, {_key(k): v for k, v in b.items()}
        assert set(na) == set(nb), f"{path}: keys {sorted(na)} != mgm's {sorted(nb)}"
        for k, v in nb.items():
            same(na[k], v, f"{path}.{k}")
    elif isinstance(b, (tuple, list)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == pytest.approx(b, rel=1e-6, abs=TOL_S), f"{path}: {a!r} != mgm's {b!r}"


def answers(calc, exclusions=None):
    """What a calculator answers: whole-job goodput, details, step deviation (or the
    exception type of each), or the exclusion query."""
    out = {}
    if exclusions is not None:
        try:
            out["exclusions"] = calc.get_job_goodput_with_exclusions(exclusions, True)
        except ValueError:
            out["exclusions"] = ValueError
        return out
    try:
        out["goodput"] = calc.get_job_goodput(True)
    except ValueError:
        out["goodput"] = ValueError
        return out
    out["details"] = calc.get_job_goodput_details()
    try:
        out["deviation"] = calc.get_step_deviation()
    except ValueError:
        out["deviation"] = ValueError
    return out


def same_answers(ours, theirs) -> None:
    assert ours.keys() == theirs.keys()
    for k, v in theirs.items():
        if v is ValueError:
            assert ours[k] is ValueError, f"{k}: mgm raised ValueError, we answered {ours[k]}"
        else:
            assert ours[k] is not ValueError, f"{k}: mgm answered {v}, we raised"
            same(ours[k], v, k)


def same_report(doc: dict, theirs: dict, exclusions=None) -> None:
    """``goodput report --definitions mgm --format json`` (one job) vs mgm's answers."""
    if exclusions is not None:
        good, breakdown, max_step, excluded = theirs["exclusions"]
        same(doc["goodput_percent"], good)
        same(doc["badput_percent"], breakdown)
        assert doc["max_productive_step"] == max_step
        same(doc["excluded_time_s"], excluded)
        return
    good, breakdown, max_step = theirs["goodput"]
    same(doc["goodput_percent"], good, "goodput")
    same(doc["badput_percent"], breakdown, "breakdown")
    assert doc["max_productive_step"] == max_step
    d = theirs["details"]
    same(doc["total_time_s"], d["total_elapsed_time"], "total")
    same(doc["productive_time_s"], d["goodput_time"][mgm.GoodputType.TOTAL], "productive")
    seconds = {_key(k): v for k, v in d["badput_time"].items()}
    custom = seconds.pop("CUSTOM_BADPUT_EVENTS", None)
    assert set(seconds) <= set(doc["badput_s"])
    for k, v in doc["badput_s"].items():
        same(v, seconds.get(k, 0.0), f"badput_s.{k}")
    same(doc["custom_badput_s"], custom or {}, "custom")
    assert doc["disruptions"] == d["disruption_count"]
    if "stepping_slice_efficiency" in d:
        same(doc["slice_efficiency"], {"stepping": d["stepping_slice_efficiency"],
                                       "available": d["available_slice_efficiency"]})
    if theirs["deviation"] is ValueError:
        assert doc["step_deviation_s"] == {}
    else:
        same({int(k): v for k, v in doc["step_deviation_s"].items()}, theirs["deviation"])


# --- the two paths ---------------------------------------------------------------------------


def iso(t: datetime.datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def imported(entries, tmp_path, capsys) -> str:
    """``goodput import`` of ``entries`` exported as Cloud Logging LogEntry JSON lines; the
    job's run directory."""
    export = tmp_path / "export.jsonl"
    with open(export, "w") as f:
        for e in entries:
            ts = mgm.get_timestamp_from_log_entry(e)
            f.write(json.dumps({"jsonPayload": e, "timestamp": iso(ts),
                                "logName": "projects/p/logs/goodput_job"}) + "\n")
    capsys.readouterr()
    assert cli.main(["import", str(export), "--to", str(tmp_path / "runs")]) == 0
    return str(tmp_path / "runs" / JOB)


def report(run_dir, at, capsys, exclusions=None):
    """``goodput report --definitions mgm --at AT [--exclude ...] --format json`` -> the job
    dict, or the reason it has no number."""
    args = ["report", run_dir, "--definitions", "mgm", "--at", iso(at), "--format", "json"]
    for a, b in exclusions or ():
        args += ["--exclude", f"{iso(a)},{iso(b)}"]
    capsys.readouterr()
    assert cli.main(args) == 0
    (doc,) = json.loads(capsys.readouterr().out)["jobs"]
    return doc


def recorded(calls, tmp_path) -> str:
    """The calls through our recorder in real processes (one per attempt, killed)."""
    run_dir = tmp_path / "rec"
    run_processes(calls, "kill", run_dir, lambda k: None)
    return str(run_dir)


def ours_calc(run_dir, at, elastic=False):
    cls = ours_elastic.ElasticGoodputCalculator if elastic else ours_goodput.GoodputCalculator
    return cls(JOB, f"goodput_{JOB}", run_dir=run_dir, definitions="mgm", query_time=at)


# --- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ELASTIC))
def test_elastic(name, tmp_path, oracle, capsys):
    calls = ELASTIC[name]
    entries = mgm_log(calls)
    at = last_time(entries) + 2 * SEC
    theirs = answers(oracle(entries, at, elastic=True))
    if not any(c[0] == "record_job_start_time" for c in calls):
        assert theirs == {"goodput": ValueError}  # no job: neither side has a number
        return
    run_dir = recorded(calls, tmp_path)
    same_answers(answers(ours_calc(run_dir, at, elastic=True)), theirs)
    same_report(report(imported(entries, tmp_path, capsys), at, capsys), theirs)
    # the base calculator leaves the elastic entries out (their time is OTHER): so do we
    same_answers(answers(ours_calc(run_dir, at)), answers(oracle(entries, at)))
    # rolling-window details (interval metrics) with the slice efficiency
    start = at - 90 * SEC
    same(ours_calc(run_dir, at, True).get_interval_metric_details(start, at),
         oracle(entries, at, True).get_interval_metric_details(start, at), "interval")


def test_elastic_numbers_are_the_incumbents_tests(tmp_path, oracle):
    """The figures mgm's own elastic tests assert, from our calculator."""
    name = "ElasticGoodputCalculatorTest.test_get_current_productive_and_unproductive_time_elastic"
    run_dir = recorded(ELASTIC[name], tmp_path)
    at = datetime.datetime(2026, 5, 28, tzinfo=UTC) + 95 * SEC
    details = ours_calc(run_dir, at, True).get_job_goodput_details()
    bt = ours_goodput.BadputType
    assert details["badput_time"][bt.ELASTIC_SLICE_DOWN] == pytest.approx(10.0)
    assert details["badput_time"][bt.ELASTIC_SCALE_UP] == pytest.approx(15.0)
    assert details["badput_time"][bt.ELASTIC_REINITIALIZATION] == pytest.approx(20.0)
    assert details["badput_time"][bt.TPU_INITIALIZATION] == 0.0
    assert details["badput_time"][bt.TRAINING_PREP] == 0.0
    name = "ElasticGoodputCalculatorTest.test_get_job_goodput_details_elastic"
    d = ours_calc(recorded(ELASTIC[name], tmp_path / "d"), None, True).get_job_goodput_details()
    assert d["stepping_slice_efficiency"] == pytest.approx(0.5)
    assert d["available_slice_efficiency"] == pytest.approx(
        (28800.0 * 0.5 + 3620.0 * 1.0) / 32420.0)


@pytest.mark.parametrize("name", list(EXCLUSIONS))
def test_exclusions(name, tmp_path, oracle, capsys):
    scenario, queries = EXCLUSIONS[name]
    calls = SCENARIOS[scenario].calls
    entries = mgm_log(calls)
    at = last_time(entries) + 2 * SEC
    run_dir = recorded(calls, tmp_path)
    run = imported(entries, tmp_path, capsys)
    for exclusions in queries:
        theirs = answers(oracle(entries, at), exclusions)
        same_answers(answers(ours_calc(run_dir, at), exclusions), theirs)
        same_report(report(run, at, capsys, exclusions), theirs, exclusions)


def test_exclusion_figures_of_the_incumbents_tests(tmp_path):
    """The figures mgm's exclusion tests assert (``goodput_test.py``), from ours."""
    def query(name, exclusions):
        scenario, _ = EXCLUSIONS[name]
        run_dir = recorded(SCENARIOS[scenario].calls, tmp_path / name)
        return ours_calc(run_dir, None).get_job_goodput_with_exclusions(exclusions, True)

    bt = ours_goodput.BadputType
    good, breakdown, _, excluded = query("test_basic_exclusion_reduces_productive_time",
                                         EXCLUSIONS["test_basic_exclusion_reduces_productive_"
                                                    "time"][1][0])
    assert (excluded, good, breakdown[bt.OTHER]) == (5.0, pytest.approx(60.0),
                                                      pytest.approx(40.0))
    _, breakdown, _, excluded = query("test_exclusion_masking_training_prep",
                                      EXCLUSIONS["test_exclusion_masking_training_prep"][1][0])
    assert excluded == 5.0 and breakdown[bt.TRAINING_PREP] == pytest.approx(25, abs=0.1)


def _query_times(entries) -> list[datetime.datetime]:
    """Moments to query at: a third and two thirds into the log, just after its last
    entry, and 2 s later (as mgm's tests query)."""
    first = mgm.get_timestamp_from_log_entry(entries[0])
    last = last_time(entries)
    span = last - first
    return [first + span / 3, first + 2 * span / 3, last + datetime.timedelta(microseconds=1),
            last + 2 * SEC]


QUERY_SCENARIOS = [n for n, sc in SCENARIOS.items()
                   if any(c[0] == "record_job_start_time" for c in sc.calls)
                   and sc.restarts]


@pytest.mark.parametrize("name", QUERY_SCENARIOS)
def test_query_times(name, tmp_path, oracle, capsys):
    """Jobs with restarts, queried while they ran (recorder) and from their log (import)."""
    calls = SCENARIOS[name].calls
    entries = mgm_log(calls)
    run_dir = recorded(calls, tmp_path)
    run = imported(entries, tmp_path, capsys)
    for at in _query_times(entries):
        theirs = answers(oracle(entries, at))
        same_answers(answers(ours_calc(run_dir, at)), theirs)
        if theirs["goodput"] is ValueError:
            doc = report(run, at, capsys)
            assert "error" in doc, f"mgm has no number at {at}, we printed {doc}"
        else:
            same_report(report(run, at, capsys), theirs)


@pytest.mark.parametrize("name", [n for n, sc in SCENARIOS.items()
                                  if any(c[0] == "record_job_start_time" for c in sc.calls)
                                  and not sc.restarts])
def test_query_times_by_import(name, tmp_path, oracle, capsys):
    """Every other scenario of mgm's suite, from its log at each query time."""
    entries = mgm_log(SCENARIOS[name].calls)
    run = imported(entries, tmp_path, capsys)
    for at in _query_times(entries):
        theirs = answers(oracle(entries, at))
        if theirs["goodput"] is ValueError:
            assert "error" in report(run, at, capsys)
        else:
            same_report(report(run, at, capsys), theirs)


def test_the_restarts_that_end_without_a_job_end():
    """The two scenarios whose job never records an end are among those queried."""
    assert {"GoodputDisruptionCompleteRestartTest.test_goodput_calculator",
            "GoodputDisruptionPartialRestartTest.test_goodput_with_startup_badput"} <= set(
                QUERY_SCENARIOS)
    for n in ("GoodputDisruptionCompleteRestartTest.test_goodput_calculator",
              "GoodputDisruptionPartialRestartTest.test_goodput_with_startup_badput"):
        assert SCENARIOS[n].calls[-1][0] != "record_job_end_time"


def test_sample_program_scenario_is_the_one_excluded_over(tmp_path):
    """The exclusion interval of test_exclusion_with_multiple_steps_and_badput is the first
    test_sync event of the program (as the incumbent's test finds it from the log)."""
    s = Script()
    _sample_program_with_badput(s, _t(14, 0, 0))
    starts = [c[1] for c in s.calls if c[0] == "record_custom_badput_event_start_time"]
    ends = [c[1] for c in s.calls if c[0] == "record_custom_badput_event_end_time"]
    assert (starts[0], ends[0]) == EXCLUSIONS["test_exclusion_with_multiple_steps_and_badput"][
        1][0][0]
    assert us(ends[0]) - us(starts[0]) == 10_000_000


def _checkpoint_badput_calls() -> tuple[list, int]:
    """BadputTest.test_badput_calculator_checkpoint_badput (its base time fixed): TPU init,
    training preparation, data loading, steps 0-4 (the first 5 s longer), a restart 5 s
    later from step 2 with the same phases; no job end. Also returns where the Orbax save
    statistics entry goes (after step 4)."""
    s = Script()
    t = _TEST_JOB_START_TIME
    s.record_job_start_time(t)
    s.record_tpu_init_start_time(t)
    s.record_tpu_init_end_time(t + SEC)
    s.record_training_preparation_start_time(t + SEC)
    s.record_training_preparation_end_time(t + 3 * SEC)
    s.record_data_loading_start_time(t + 3 * SEC)
    s.record_data_loading_end_time(t + 5 * SEC)
    step_t = t + 5 * SEC
    for step in range(5):
        s.record_step_start_time(step, step_t)
        step_t += 3 * SEC + (5 * SEC if step == 0 else 0 * SEC)
    where = len(s.calls)
    restart = step_t + 5 * SEC
    s.record_job_start_time(restart)
    step_t = restart + 5 * SEC
    for step in range(2, 5):
        s.record_step_start_time(step, step_t)
        step_t += 3 * SEC + (5 * SEC if step == 2 else 0 * SEC)
    return s.calls, where


def _save_statistics() -> dict:
    """BadputTest's MockSaveStepStatistics as ``asdict()`` gives it (a 6 s blocking save)."""
    return {
        "step": 1, "event_type": "save", "directory": "gs://bucket/path",
        "wait_for_prev_start_time": 10.0, "wait_for_prev_duration_secs": 1.0,
        "checkpointer_blocking_start_time": 12.0, "checkpointer_blocking_duration_secs": 2.0,
        "get_old_steps_start_time": 13.0, "get_old_steps_duration_secs": 3.0,
        "checkpoint_manager_blocking_start_time": 10.0,
        "checkpoint_manager_blocking_duration_secs": 6.0, "reached_preemption": True,
        "preemption_received_at": 10.0, "synchronous": True}


def test_checkpoint_badput_by_import(tmp_path, oracle, capsys):
    """BadputTest.test_badput_calculator_checkpoint_badput: its Orbax save statistics are
    written straight to the log (no recorder call), so this one goes through ``goodput
    import`` only (its times, 10 s after the epoch, included)."""
    calls, where = _checkpoint_badput_calls()
    entries = mgm_log(calls[:where])
    entries.append(_save_statistics())  # the test's MockSaveStepStatistics
    entries += mgm_log(calls[where:])  # the statistics entry names no job: it is the job's
    at = last_time(entries) + 2 * SEC
    theirs = answers(oracle(entries, at))
    saves = {k.name: v for k, v in theirs["details"]["badput_time"].items()}
    assert saves["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"] == 6.0
    same_report(report(imported(entries, tmp_path, capsys), at, capsys), theirs)


def _overlapping_restart(run_dir, old_calls, new_calls) -> None:
    """``old_calls`` in one process, which pauses inside them (at ``["pause"]``); while it
    is alive, ``new_calls`` in a second process (the restart, whose first call is
    ``record_job_start_time``); then the first process finishes its calls and is killed
    (SIGKILL), and after it the second (SIGTERM), each a settle time after its last call.
    As a real restart can go: the new process is up while the old one still writes."""
    import signal
    import subprocess
    import sys
    import time

    from test_compat_recorder_kills import CHILD, FLUSH_S, SETTLE_S, _env, _wire

    def start(calls):
        p = subprocess.Popen([sys.executable, str(CHILD), str(run_dir), JOB, str(FLUSH_S)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=_env("kill"))
        p.stdin.write(json.dumps({"calls": _wire(calls), "end": "hang"}) + "\n")
        p.stdin.flush()
        return p

    def expect(p, token):
        line = p.stdout.readline().strip()
        assert line == token, f"child said {line!r}, not {token}"

    old = new = None
    try:
        old = start(old_calls)
        expect(old, "PAUSED")
        time.sleep(SETTLE_S)  # the old process's phase in flight is on disk
        new = start(new_calls)
        expect(new, "READY")  # the restart recorded its start and steps, old still alive
        old.stdin.write("\n")
        old.stdin.flush()
        expect(old, "READY")
        time.sleep(SETTLE_S)
        old.send_signal(signal.SIGKILL)
        assert old.wait(10) == -signal.SIGKILL
        time.sleep(SETTLE_S)
        new.send_signal(signal.SIGTERM)
        assert new.wait(10) == -signal.SIGTERM
    finally:
        for p in (old, new):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_checkpoint_badput_by_the_recorder_with_the_old_process_alive(tmp_path, oracle,
                                                                      capsys):
    """BadputTest.test_badput_calculator_checkpoint_badput through the drop-in recorder in
    real processes: the first attempt's process saves the checkpoint of step 1 for 6 s
    (``goodput.checkpoint_save``, the recorder's counterpart of the test's Orbax save
    statistics) from the end of its step 4; the restarted process records its
    ``record_job_start_time`` 1 s before that save ends, while the old process is alive,
    and is up before the old one is killed. The explicit job start begins the second
    attempt (``docs/migration.md``): the calculator, its details and step deviation, and
    ``goodput report --definitions mgm`` give the incumbent's numbers (its wasted progress
    and disruption included), as ``goodput import`` of its log does."""
    calls, where = _checkpoint_badput_calls()
    save_start = _TEST_JOB_START_TIME + 25 * SEC  # where attempt 0's step 4 ends
    assert calls[where][0] == "record_job_start_time" and calls[where][1] == save_start + 5 * SEC
    old_calls = calls[:where] + [["checkpoint_save_start", 1, save_start], ["pause"],
                                 ["checkpoint_save_end", save_start + 6 * SEC]]
    run_dir = tmp_path / "rec"
    _overlapping_restart(run_dir, old_calls, calls[where:])

    entries = mgm_log(calls[:where])
    entries.append(_save_statistics())  # only its duration counts
    entries += mgm_log(calls[where:])
    at = last_time(entries) + 2 * SEC
    theirs = answers(oracle(entries, at))
    badput = {k.name: v for k, v in theirs["details"]["badput_time"].items()}
    assert badput["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"] == 6.0
    assert badput["WASTED_PROGRESS_FROM_DISRUPTION"] > 0
    assert theirs["details"]["disruption_count"] == 1
    same_answers(answers(ours_calc(str(run_dir), at)), theirs)
    same_report(report(str(run_dir), at, capsys), theirs)
    # Queried without a time, the old process's real-clock heartbeats are in: the restart
    # is still one (a job without end then runs to its last sign of life, so only OTHER
    # and the percentages differ from mgm's at its query time).
    mine = ours_calc(str(run_dir), None).get_job_goodput_details()
    assert mine["disruption_count"] == 1
    seconds = {k.name: v for k, v in mine["badput_time"].items() if k.name != "OTHER"}
    same(seconds, {k: v for k, v in badput.items() if k != "OTHER"}, "badput_time")
    # the same job in this project's model: two attempts, one disruption
    from goodput_processor import report_run_dir

    (native,) = report_run_dir(run_dir, now_ns=us(at) * 1000)
    assert len(native.attempts) == 2
