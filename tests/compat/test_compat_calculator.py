"""``goodput_processor.compat.GoodputCalculator``: the incumbent's query API on our run dirs.

A training script records with the incumbent's recorder API (``goodput.GoodputRecorder``,
real recorder, real spool files); an analysis script written for ml-goodput-measurement,
with only its import changed, runs in a separate process and prints the numbers.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from incumbent_loop import drive, record_run, sec

import goodput
from goodput_processor import account_interval, read_run_dir, report_run_dir
from goodput_processor.compat import BadputType, GoodputCalculator, MetricType

NS = 1_000_000_000
FAR_FUTURE = 2**62


class EntrySink:
    """Stands in for the incumbent's Cloud Logging client: keeps the entries its recorder
    writes and serves them to its calculator (like the ``MockCloudLogger`` of its tests)."""

    def __init__(self):
        self.entries = []

    def write_cloud_logging_entry(self, entry):
        self.entries.append(entry)

    def flush(self):
        pass

    def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
        from ml_goodput_measurement.src.goodput_utils import get_timestamp_from_log_entry

        out = [(i, get_timestamp_from_log_entry(e), e) for i, e in enumerate(self.entries)]
        out = [x for x in out if (start_time is None or x[1] > start_time)
               and (end_time is None or x[1] <= end_time)]
        return [e for *_, e in out], ((out[-1][1], str(out[-1][0])) if out else (None, None))


@pytest.mark.parametrize("restart_from", [None, 6])
def test_same_script_same_numbers_as_the_incumbent(tmp_path, restart_from):
    """One recording script, run against the real ml-goodput-measurement 0.2.3 recorder and
    against ours: our calculator with ``definitions="mgm"`` returns what the real
    calculator returns, call for call."""
    mgm = pytest.importorskip("ml_goodput_measurement.src.goodput")
    sink = EntrySink()
    drive(mgm.GoodputRecorder("mgm-run", "log", True, cloud_logger=sink),
          restart_from=restart_from)
    theirs = mgm.GoodputCalculator("mgm-run", "log", cloud_logger=sink,
                                   cache_dir=str(tmp_path / "cache"))
    drive(goodput.GoodputRecorder("mgm-run", logging_enabled=True, run_dir=tmp_path / "run",
                                  handle_signals=False), restart_from=restart_from)
    goodput.shutdown()
    ours = GoodputCalculator("mgm-run", run_dir=tmp_path / "run", definitions="mgm")

    def same(a, b):
        if isinstance(a, dict):
            named = {getattr(k, "name", k): v for k, v in a.items()}
            assert set(named) <= {getattr(k, "name", k) for k in b}
            for k, v in b.items():
                same(named.get(getattr(k, "name", k), 0.0), v)
        elif isinstance(a, tuple):
            assert len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                same(x, y)
        else:
            assert a == pytest.approx(b, rel=1e-6, abs=1e-4), (a, b)

    same(theirs.get_job_goodput(include_badput_breakdown=True),
         ours.get_job_goodput(include_badput_breakdown=True))
    assert theirs.get_step_deviation().keys() == ours.get_step_deviation().keys()
    same(theirs.get_step_deviation(), ours.get_step_deviation())
    same(theirs.get_job_goodput_interval(sec(8), sec(26)),
         ours.get_job_goodput_interval(sec(8), sec(26)))


def test_goodput_and_breakdown_in_the_incumbents_shapes(tmp_path):
    end = record_run(tmp_path / "run")
    assert end == 31
    calc = GoodputCalculator(job_name="mgm-run", logger_name="goodput_mgm-run",
                             run_dir=tmp_path / "run", definitions="goodput")
    good, badput, last_step = calc.get_job_goodput(include_badput_breakdown=True)
    # productive: 10 kept steps of net 2 s (the eval is taken out of step 5) = 20 s of 31;
    # step 0's 3 extra seconds are training slowdown (no program-startup span was recorded)
    assert good == pytest.approx(100 * 20 / 31)
    assert last_step == 9
    pct = {k: pytest.approx(100 * v / 31) for k, v in {
        BadputType.TPU_INITIALIZATION: 1, BadputType.TRAINING_PREP: 2,
        BadputType.PROGRAM_STARTUP: 0, BadputType.DATA_LOADING_SYNC: 1,
        BadputType.DATA_LOADING_ASYNC: 0, BadputType.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME: 0,
        BadputType.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME: 0,
        BadputType.WASTED_PROGRESS_FROM_DISRUPTION: 0,
        BadputType.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION: 0,
        BadputType.TRAINING_SLOWDOWN: 3, BadputType.OTHER: 1}.items()}
    pct[BadputType.CUSTOM_BADPUT_EVENTS] = {"EVAL_STEP": pytest.approx(100 * 3 / 31)}
    assert badput == pct
    assert good + sum(v for k, v in badput.items()
                      if k not in (BadputType.CUSTOM_BADPUT_EVENTS,
                                   BadputType.DATA_LOADING_ASYNC)) + sum(
        badput[BadputType.CUSTOM_BADPUT_EVENTS].values()) == pytest.approx(100)
    assert calc.get_job_goodput() == (pytest.approx(good), {}, 9)

    dev = calc.get_step_deviation()
    assert dev == {0: pytest.approx(3.0), **{s: pytest.approx(0.0) for s in range(1, 10)}}
    assert calc.get_step_deviation(configured_ideal_step_time=1.5)[4] == pytest.approx(0.5)

    details = calc.get_job_goodput_details()
    assert details[MetricType.TOTAL_ELAPSED_TIME.value] == pytest.approx(31)
    assert details[MetricType.BADPUT_TIME.value][BadputType.TRAINING_PREP] == pytest.approx(2)
    assert details[MetricType.IDEAL_STEP_TIME.value] == pytest.approx(2)
    assert details[MetricType.DISRUPTION_COUNT.value] == 0


def test_interval_query_equals_the_accounting_of_that_interval(tmp_path):
    record_run(tmp_path / "run")
    calc = GoodputCalculator("mgm-run", run_dir=tmp_path / "run", definitions="goodput")
    good, badput, last, total, disruptions = calc.get_job_goodput_interval(sec(10), sec(25))
    _, iv = account_interval(read_run_dir(tmp_path / "run").jobs["mgm-run"],
                             round(sec(10).timestamp() * NS), round(sec(25).timestamp() * NS))
    assert total == pytest.approx(15) and disruptions == 0
    assert good == pytest.approx(100 * iv.goodput)
    # steps 1..5 net 2 s each (10 s), the eval 3 s, step 6 from 23 s to 25 s (2 s)
    assert good == pytest.approx(100 * 12 / 15)
    assert badput[BadputType.CUSTOM_BADPUT_EVENTS] == {"EVAL_STEP": pytest.approx(20.0)}
    assert last == 6  # the last step started before the interval's end
    naive = sec(10).replace(tzinfo=None)  # naive datetimes are UTC, as for the incumbent
    assert calc.get_job_goodput_interval(naive, sec(25))[0] == pytest.approx(good)
    with pytest.raises(ValueError, match="does not overlap"):
        calc.get_job_goodput_interval(sec(-100), sec(-50))
    out = calc.get_interval_metric_details(sec(-100), sec(-50))
    assert out == {"interval_goodput": {}, "interval_badput": {}, "interval_size": 50}


def test_queries_read_incrementally_and_errors_name_the_job(tmp_path):
    calc = GoodputCalculator("mgm-run", run_dir=tmp_path / "run", definitions="goodput")
    with pytest.raises(ValueError, match="no spans of job 'mgm-run'"):
        calc.get_job_goodput()
    record_run(tmp_path / "run", steps=4)
    assert calc.get_job_goodput()[2] == 3
    # a second attempt appears in the run dir: the same calculator sees it
    rec = goodput.GoodputRecorder(job_name="mgm-run", logging_enabled=True,
                                  run_dir=tmp_path / "run", handle_signals=False)
    rec.record_job_start_time(sec(100))
    rec.record_step_start_time(4, sec(101))
    rec.record_step_start_time(5, sec(103))
    rec.record_job_end_time(sec(105))
    goodput.shutdown()
    (expected,) = report_run_dir(tmp_path / "run", now_ns=FAR_FUTURE)
    good, _, last = calc.get_job_goodput()
    assert last == 5 and good == pytest.approx(100 * expected.goodput)
    assert calc.get_job_goodput_details()["disruption_count"] == 1
    with pytest.raises(ValueError, match="definitions"):
        GoodputCalculator("x", definitions="nope")


ANALYSIS_SCRIPT = """
from goodput_processor.compat import GoodputCalculator, BadputType  # was: ml_goodput_measurement

goodput_calculator = GoodputCalculator(job_name="mgm-run", logger_name="goodput_mgm-run")
goodput, badput_breakdown, last_step = goodput_calculator.get_job_goodput(
    include_badput_breakdown=True)
print(f"Last step recorded: {last_step}")
print(f"Goodput: {goodput:.2f}%")
print(f"Badput due to TPU initialization: {badput_breakdown[BadputType.TPU_INITIALIZATION]:.2f}%")
print(f"Badput due to training preparation: {badput_breakdown[BadputType.TRAINING_PREP]:.2f}%")
print(f"Badput due to program startup: {badput_breakdown[BadputType.PROGRAM_STARTUP]:.2f}%")
print(f"Badput due to data loading: {badput_breakdown[BadputType.DATA_LOADING_SYNC]:.2f}%")
print(f"Badput due to step evaluation: "
      f"{badput_breakdown[BadputType.CUSTOM_BADPUT_EVENTS].get('EVAL_STEP', 0.0):.2f}%")
print(f"Badput due to SDC checks: "
      f"{badput_breakdown[BadputType.CUSTOM_BADPUT_EVENTS].get('SDC_CHECK', 0.0):.2f}%")
print(f"Badput from unknown source: {badput_breakdown[BadputType.OTHER]:.2f}%")
"""


def test_an_incumbent_analysis_script_runs_unchanged_but_for_its_import(tmp_path):
    """The README's analysis snippet, in its own process, finding the run dir by default
    (``goodput-runs/<job>`` under the working directory, where the recorder writes), prints
    what the same snippet prints on the real ml-goodput-measurement 0.2.3 (the calculator's
    default definitions are the incumbent's)."""
    mgm = pytest.importorskip("ml_goodput_measurement.src.goodput")
    record_run(tmp_path / "goodput-runs" / "mgm-run")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(ANALYSIS_SCRIPT)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    sink = EntrySink()
    drive(mgm.GoodputRecorder("mgm-run", "log", True, cloud_logger=sink))
    theirs = mgm.GoodputCalculator("mgm-run", "log", cloud_logger=sink,
                                   cache_dir=str(tmp_path / "cache"))
    _, b, last = theirs.get_job_goodput(include_badput_breakdown=True)
    good = theirs.get_job_goodput()[0]
    custom = b[mgm.BadputType.CUSTOM_BADPUT_EVENTS]
    assert out.splitlines() == [
        f"Last step recorded: {last}",
        f"Goodput: {good:.2f}%",
        f"Badput due to TPU initialization: {b[mgm.BadputType.TPU_INITIALIZATION]:.2f}%",
        f"Badput due to training preparation: {b[mgm.BadputType.TRAINING_PREP]:.2f}%",
        f"Badput due to program startup: {b[mgm.BadputType.PROGRAM_STARTUP]:.2f}%",
        f"Badput due to data loading: {b[mgm.BadputType.DATA_LOADING_SYNC]:.2f}%",
        f"Badput due to step evaluation: {custom.get('EVAL_STEP', 0.0):.2f}%",
        f"Badput due to SDC checks: {custom.get('SDC_CHECK', 0.0):.2f}%",
        f"Badput from unknown source: {b[mgm.BadputType.OTHER]:.2f}%",
    ]
