"""The incumbent's own test scenarios, recorded through ``goodput.compat.GoodputRecorder`` in
real processes that are really killed, give ``--definitions mgm`` the numbers of the real
``ml-goodput-measurement`` 0.2.3 on the same calls.

The scenarios are the tests of mgm 0.2.3's ``ml_goodput_measurement/tests/goodput_test.py``
(shipped in its wheel) that consist of recorder calls, each written below as that test
writes it, with its fixed ``_TEST_JOB_START_TIME`` as the base of every time (tests that use
``datetime.now()`` as their base get the same fixed base). Not here:
``BadputTest.test_badput_calculator_checkpoint_badput`` (its save statistics are an Orbax
checkpoint-logger entry written straight to the log, not a recorder call; through the
drop-in recorder it is a ``goodput.checkpoint_save`` in the old process, with the restart
up while that save runs: ``tests/compat/test_mgm_scenarios.py``), and ``goodput_elastic_test.py``
(``ElasticGoodputRecorder.record_elastic_*``, also there). With this module's 28
scenarios that have a job start, those are the 31 upstream scenarios with a number, all
through the drop-in recorder in killed processes.
The exclusion tests' ``get_job_goodput_with_exclusions`` query has no ``--definitions mgm``
counterpart: their calls are compared on the whole-job query. The recorder-only tests
without ``record_job_start_time`` have no number on either side (checked as such).

Each scenario runs in child processes (``compat_recorder_child.py``, which imports only
``goodput``), with ``flush_interval_s=0.05``:

- ``single``: no restart; one process, which ends with its last call.
- ``kill``: one process per attempt (a restart is a new process calling
  ``record_job_start_time`` again); a process whose attempt does not end with
  ``record_job_end_time`` is killed (SIGKILL before a restart, SIGTERM at the end of a job
  that has no end) five flush intervals after its last call. Default environment, as a
  plain mgm user runs: no rank variable.
- ``kill-rank``: the same with ``RANK=0`` in the environment (as torchrun and most
  launchers set it).
- ``inproc``: the test as written, the restart by a second ``record_job_start_time`` in
  the same process.
- ``overlap``: as ``kill``, but each restarted process starts while the one before is
  still alive, and records its calls (its ``record_job_start_time`` first) before that one
  is killed: a restart whose old process lingers (the explicit job start begins the
  attempt all the same).

The same calls go through mgm's ``GoodputRecorder`` with an in-memory logger and its
``GoodputCalculator`` (a fresh one per query, over every entry so far). A job without
``job_end_time`` is measured by mgm up to the query's wall-clock *now*: mgm's clock is
frozen at the query time (the latest entry + 2 s, as the incumbent's tests query 2 s after
their last step) and ``--definitions mgm`` gets the same ``now_ns``. Compared with
``tests/definitions/test_definitions_mgm.py``'s checks: goodput %, total, productive, every badput
bucket and custom type, the percentage breakdown, max productive step, disruptions, ideal
step time and step deviation; the interval test's two intervals; the caching test's query
in the middle of the run (while the restarted process is alive); and, for jobs with an
end, the CLI's ``goodput report --definitions mgm --format json``.

Takes about 60 s (some 90 child processes, about 50 waits of five flush intervals).
"""

from __future__ import annotations

import datetime
import json
import os
import random
import signal
import subprocess
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

mgm = pytest.importorskip("ml_goodput_measurement.src.goodput")

from mgm_oracle import MemoryLogs, assert_interval, assert_whole_job  # noqa: E402

from goodput import schema  # noqa: E402
from goodput_processor import cli, read_run_dir  # noqa: E402
from goodput_processor import definitions as gdefs  # noqa: E402
from goodput_processor.read.reader import ReadError  # noqa: E402

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX signals")

CHILD = Path(__file__).resolve().parents[1] / "compat_recorder_child.py"
JOB = "job"
FLUSH_S = 0.05
#: Wait before a kill or a mid-run query (at least two flush intervals): what a real process
#: had flushed by then is on disk.
SETTLE_S = 5 * FLUSH_S
QUERY_DELAY = datetime.timedelta(seconds=2)

# --- the incumbent's constants (goodput_test.py) -----------------------------------------
UTC = datetime.timezone.utc
_TEST_JOB_START_TIME = datetime.datetime(2024, 1, 1, 1, 0, 0, tzinfo=UTC)
_TEST_PROGRAM_STARTUP_TIME = datetime.timedelta(seconds=5)
_TEST_TPU_INIT_TIME = datetime.timedelta(seconds=1)
_TEST_TRAINING_PREPARATION_TIME = datetime.timedelta(seconds=2)
_TEST_DATA_LOADING_TIME = datetime.timedelta(seconds=2)
_TEST_STEP_START_TIME = _TEST_JOB_START_TIME + _TEST_PROGRAM_STARTUP_TIME
_TEST_TOTAL_STEPS = 5
_TEST_STEP_TIME = datetime.timedelta(seconds=3)
_TEST_JOB_END_TIME = _TEST_STEP_START_TIME + _TEST_STEP_TIME * _TEST_TOTAL_STEPS
_TEST_FIRST_STEP_EXTRA_TIME = datetime.timedelta(seconds=5)
_TEST_ANOMALOUS_STEP_TIME = datetime.timedelta(seconds=30)
_TEST_CUSTOM_BADPUT_TIME = datetime.timedelta(seconds=10)
SEC = datetime.timedelta(seconds=1)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=UTC)


def us(t: datetime.datetime) -> int:
    """``t`` as integer µs since the epoch (exact)."""
    d = t - _EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


# --- scenarios -----------------------------------------------------------------------------


class Script:
    """Records ``GoodputRecorder`` calls (``script.record_...(...)``) in program order, plus
    ``pause()`` (a whole-job query at that point) and ``sleep(s)``."""

    def __init__(self):
        self.calls: list[list] = []

    def __getattr__(self, name):
        if not name.startswith("record_"):
            raise AttributeError(name)
        return lambda *args: self.calls.append([name, *args])

    def pause(self):
        self.calls.append(["pause"])

    def sleep(self, s: float):
        self.calls.append(["sleep", s])


@dataclass
class Scenario:
    """One incumbent test: its calls, how its calculator is made, its interval queries."""

    calls: list
    pathways: bool = False
    intervals: list = field(default_factory=list)  # [(start datetime, end datetime)]

    @property
    def restarts(self) -> int:
        return max(0, sum(c[0] == "record_job_start_time" for c in self.calls) - 1)


def _sample_program(r):  # GoodputTest._mock_sample_program
    r.record_job_start_time(_TEST_JOB_START_TIME)
    step_start_time = _TEST_STEP_START_TIME
    for step in range(_TEST_TOTAL_STEPS):
        r.record_step_start_time(step, step_start_time)
        step_start_time += _TEST_STEP_TIME
    r.record_job_end_time(_TEST_JOB_END_TIME)


def _sample_program_with_badput(r, start_time=_TEST_JOB_START_TIME):
    # GoodputTest._mock_sample_program_with_badput and
    # GoodputExclusionIntegrationTest._mock_sample_program_with_badput
    t = start_time
    delay = SEC
    r.record_job_start_time(t)
    t += delay
    r.record_tpu_init_start_time(t)
    t += _TEST_TPU_INIT_TIME
    r.record_tpu_init_end_time(t)
    t += delay
    r.record_training_preparation_start_time(t)
    t += _TEST_TRAINING_PREPARATION_TIME
    r.record_training_preparation_end_time(t)
    t += delay
    r.record_data_loading_start_time(t)
    t += _TEST_DATA_LOADING_TIME
    r.record_data_loading_end_time(t)
    t += delay
    for step in range(_TEST_TOTAL_STEPS):
        r.record_step_start_time(step, t)
        r.record_data_loading_start_time(t)
        t += _TEST_DATA_LOADING_TIME
        r.record_data_loading_end_time(t)
        if step % 3 == 0:
            r.record_custom_badput_event_start_time(t, "test_sync")
            t += _TEST_CUSTOM_BADPUT_TIME
            r.record_custom_badput_event_end_time(t, "test_sync")
        t += _TEST_STEP_TIME
    r.record_job_end_time(t)


def _startup_badput(r):  # GoodputTest.test_goodput_with_startup_badput
    job_start_time = _TEST_JOB_START_TIME
    r.record_job_start_time(job_start_time)
    step_start_time = job_start_time + _TEST_PROGRAM_STARTUP_TIME
    for step in range(_TEST_TOTAL_STEPS):
        r.record_step_start_time(step, step_start_time)
        step_start_time += _TEST_STEP_TIME
        if step == 0:
            step_start_time += _TEST_FIRST_STEP_EXTRA_TIME
    total = (_TEST_PROGRAM_STARTUP_TIME + _TEST_STEP_TIME * _TEST_TOTAL_STEPS
             + _TEST_FIRST_STEP_EXTRA_TIME)
    r.record_job_end_time(job_start_time + total)


def _restart(r, restart_from_step, startup_extra=False, steps_after=None):
    """GoodputDisruption{Complete,Partial}RestartTest: steps 0..4, a disruption of 5 s, a
    restart from ``restart_from_step``; no job end (the test queries 2 s after the last
    step start)."""
    job_start_time = _TEST_JOB_START_TIME
    r.record_job_start_time(job_start_time)
    step_start_time = job_start_time + _TEST_PROGRAM_STARTUP_TIME
    for step in range(_TEST_TOTAL_STEPS):
        r.record_step_start_time(step, step_start_time)
        step_start_time += _TEST_STEP_TIME
        if startup_extra and step == 0:
            step_start_time += _TEST_FIRST_STEP_EXTRA_TIME
    job_start_time = step_start_time + datetime.timedelta(seconds=5)
    r.record_job_start_time(job_start_time)
    step_start_time = job_start_time + _TEST_PROGRAM_STARTUP_TIME
    end = _TEST_TOTAL_STEPS if steps_after is None else steps_after
    for step in range(restart_from_step, end):
        r.record_step_start_time(step, step_start_time)
        step_start_time += _TEST_STEP_TIME
        if startup_extra and step == restart_from_step:
            step_start_time += _TEST_FIRST_STEP_EXTRA_TIME


def _anomalous(r, disruptions):  # GoodputPathwaysTest
    job_start_time = _TEST_JOB_START_TIME
    r.record_job_start_time(job_start_time)
    t = job_start_time + _TEST_PROGRAM_STARTUP_TIME
    for step in range(_TEST_TOTAL_STEPS - 3):
        r.record_step_start_time(step, t)
        t += _TEST_STEP_TIME
    r.record_step_start_time(_TEST_TOTAL_STEPS - 3, t)
    t += _TEST_ANOMALOUS_STEP_TIME + _TEST_STEP_TIME
    if disruptions == 1:
        for step in range(_TEST_TOTAL_STEPS - 2, _TEST_TOTAL_STEPS):
            r.record_step_start_time(step, t)
            t += _TEST_STEP_TIME
    else:
        for step in range(_TEST_TOTAL_STEPS - 2, _TEST_TOTAL_STEPS + 2):
            r.record_step_start_time(step, t)
            t += _TEST_STEP_TIME
        r.record_step_start_time(_TEST_TOTAL_STEPS + 2, t)
        t += _TEST_ANOMALOUS_STEP_TIME + _TEST_STEP_TIME
        for step in range(_TEST_TOTAL_STEPS + 3, _TEST_TOTAL_STEPS * 2):
            r.record_step_start_time(step, t)
            t += _TEST_STEP_TIME
    r.record_job_end_time(job_start_time + _TEST_PROGRAM_STARTUP_TIME
                          + _TEST_ANOMALOUS_STEP_TIME * disruptions
                          + _TEST_STEP_TIME * _TEST_TOTAL_STEPS * disruptions)


def _one_phase(r, method, start, end):  # BadputTest.test_{tpu_init,training_prep,...}_recorder
    getattr(r, f"record_{method}_start_time")(start)
    getattr(r, f"record_{method}_end_time")(end)


def _one_phase_now(r, method):  # BadputTest.test_*_recorder_no_timestamps (slept 2 s there)
    getattr(r, f"record_{method}_start_time")(None)
    r.sleep(0.2)
    getattr(r, f"record_{method}_end_time")(None)


def _badput_program(r, *, prep=True, data_loading=True, startup_extra=True,
                    async_loading=False, restart=False):
    """BadputTest's common program: job start, TPU init, training prep, data loading, five
    steps (the first 5 s longer), optionally a restart from step 2 after 5 s of disruption
    with the same phases, job end."""
    job_start_time = _TEST_JOB_START_TIME
    r.record_job_start_time(job_start_time)

    def phases(t0):
        r.record_tpu_init_start_time(t0)
        r.record_tpu_init_end_time(t0 + _TEST_TPU_INIT_TIME)
        t = t0 + _TEST_TPU_INIT_TIME
        if prep:
            r.record_training_preparation_start_time(t)
            r.record_training_preparation_end_time(t + _TEST_TRAINING_PREPARATION_TIME)
            t += _TEST_TRAINING_PREPARATION_TIME
        if data_loading:
            r.record_data_loading_start_time(t)
            r.record_data_loading_end_time(t + _TEST_DATA_LOADING_TIME)
            t += _TEST_DATA_LOADING_TIME
        return t

    step_start_time = phases(job_start_time)
    for step in range(_TEST_TOTAL_STEPS):
        r.record_step_start_time(step, step_start_time)
        if async_loading:
            r.record_data_loading_start_time(step_start_time + _TEST_STEP_TIME)
            r.record_data_loading_end_time(step_start_time + _TEST_STEP_TIME
                                           + _TEST_DATA_LOADING_TIME)
            step_start_time += _TEST_DATA_LOADING_TIME
        step_start_time += _TEST_STEP_TIME
        if startup_extra and step == 0:
            step_start_time += _TEST_FIRST_STEP_EXTRA_TIME
    total = step_start_time - job_start_time
    if restart:
        job_restart_time = step_start_time + datetime.timedelta(seconds=5)
        r.record_job_start_time(job_restart_time)
        step_start_time = phases(job_restart_time)
        for step in range(2, _TEST_TOTAL_STEPS):
            r.record_step_start_time(step, step_start_time)
            step_start_time += _TEST_STEP_TIME
            if step == 2:
                step_start_time += _TEST_FIRST_STEP_EXTRA_TIME
        total = step_start_time - job_start_time
    r.record_job_end_time(job_start_time + total)
    return job_start_time + total


def _tpu_init_then_steps(r, unknown=datetime.timedelta(0)):
    # BadputTest.test_badput_calculator_tpu_initialization / _unknown_badput
    job_start_time = _TEST_JOB_START_TIME
    r.record_job_start_time(job_start_time)
    r.record_tpu_init_start_time(job_start_time)
    r.record_tpu_init_end_time(job_start_time + _TEST_TPU_INIT_TIME)
    t = job_start_time + _TEST_TPU_INIT_TIME + _TEST_PROGRAM_STARTUP_TIME
    for step in range(_TEST_TOTAL_STEPS):
        r.record_step_start_time(step, t)
        t += _TEST_STEP_TIME
    r.record_job_end_time(job_start_time + _TEST_TPU_INIT_TIME + _TEST_PROGRAM_STARTUP_TIME
                          + _TEST_STEP_TIME * _TEST_TOTAL_STEPS + unknown)


def _step_deviation(r):  # BadputTest.test_get_step_deviation (seeded)
    rng = random.Random(20240101)
    job_start_time = _TEST_JOB_START_TIME
    r.record_job_start_time(job_start_time)
    starts = [job_start_time]
    for _ in range(1, 100):
        starts.append(starts[-1] + datetime.timedelta(seconds=rng.randint(1, 600)))
    for step, t in enumerate(starts):
        r.record_step_start_time(step, t)
    r.record_job_end_time(starts[-1] + datetime.timedelta(seconds=10))


def _custom_sync(r):  # BadputTest.test_badput_calculator_custom_sync_badput
    job_start_time = _TEST_JOB_START_TIME
    r.record_job_start_time(job_start_time)
    r.record_tpu_init_start_time(job_start_time)
    r.record_tpu_init_end_time(job_start_time + _TEST_TPU_INIT_TIME)
    t = job_start_time + _TEST_TPU_INIT_TIME + _TEST_PROGRAM_STARTUP_TIME
    for step in range(_TEST_TOTAL_STEPS):
        r.record_step_start_time(step, t)
        t += _TEST_STEP_TIME
    eval_time = datetime.timedelta(seconds=5)
    r.record_custom_badput_event_start_time(t, "eval_step")
    r.record_custom_badput_event_end_time(t + eval_time, "eval_step")
    t += eval_time
    for step in range(_TEST_TOTAL_STEPS, _TEST_TOTAL_STEPS * 2):
        r.record_step_start_time(step, t)
        t += _TEST_STEP_TIME
    r.record_job_end_time(job_start_time + _TEST_TPU_INIT_TIME + _TEST_PROGRAM_STARTUP_TIME
                          + _TEST_STEP_TIME * _TEST_TOTAL_STEPS * 2 + eval_time)


def _disruption_and_caching(r):  # BadputTest.test_goodput_with_disruption_and_caching
    job_start_time = _TEST_JOB_START_TIME
    r.record_job_start_time(job_start_time)
    t = job_start_time
    for step in range(_TEST_TOTAL_STEPS):
        r.record_step_start_time(step, t)
        t += _TEST_STEP_TIME
    disruption_time = datetime.timedelta(seconds=5)
    job_start_time = t + disruption_time
    r.record_job_start_time(job_start_time)
    r.pause()  # "Query after restart but before any steps"
    t = job_start_time
    restart_step = _TEST_TOTAL_STEPS - 2
    for step in range(restart_step, _TEST_TOTAL_STEPS):
        r.record_step_start_time(step, t)
        t += _TEST_STEP_TIME
    total = (_TEST_STEP_TIME * _TEST_TOTAL_STEPS + disruption_time
             + (restart_step - 1) * _TEST_STEP_TIME)
    r.record_job_end_time(_TEST_JOB_START_TIME + total)


def _exclusion_basic(r):  # GoodputExclusionIntegrationTest (calls; base fixed as there)
    job_start_time = datetime.datetime(2025, 1, 1, 10, 0, 0, tzinfo=UTC)
    r.record_job_start_time(job_start_time)
    step_start = job_start_time + 10 * SEC
    r.record_step_start_time(0, step_start)
    step_start += 10 * SEC
    r.record_step_start_time(1, step_start)
    r.record_job_end_time(step_start + 10 * SEC)


def _exclusion_badput_event(r):
    job_start_time = datetime.datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    r.record_job_start_time(job_start_time)
    r.record_tpu_init_start_time(job_start_time)
    tpu_end = job_start_time + 10 * SEC
    r.record_tpu_init_end_time(tpu_end)
    step_start = tpu_end + 10 * SEC
    r.record_step_start_time(0, step_start)
    r.record_job_end_time(step_start + 5 * SEC)


def _exclusion_disruption(r):
    job_start_time = datetime.datetime(2025, 1, 1, 16, 0, 0, tzinfo=UTC)
    r.record_job_start_time(job_start_time)
    r.record_step_start_time(0, job_start_time)
    restart_time = job_start_time + 20 * SEC
    r.record_job_start_time(restart_time)
    r.record_step_start_time(0, restart_time)
    r.record_job_end_time(job_start_time + 30 * SEC)


def _exclusion_training_prep(r):
    job_start_time = datetime.datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    r.record_job_start_time(job_start_time)
    r.record_training_preparation_start_time(job_start_time)
    r.record_training_preparation_end_time(job_start_time + 10 * SEC)
    r.record_step_start_time(0, job_start_time + 20 * SEC)
    r.record_job_end_time(job_start_time + 25 * SEC)


def _build(fn, *args, **kwargs) -> list:
    s = Script()
    fn(s, *args, **kwargs)
    return s.calls


def _interval_query_scenario() -> Scenario:
    """BadputTest.test_goodput_badput_with_interval_query: the restart program, queried
    over (start - 1 µs, job end] and (start - 1 µs, end of attempt 0's last step]."""
    s = Script()
    job_end = _badput_program(s, restart=True)
    # intermediate_job_end_time: where step 4 of the first attempt ends
    intermediate = (_TEST_JOB_START_TIME + _TEST_TPU_INIT_TIME + _TEST_TRAINING_PREPARATION_TIME
                    + _TEST_DATA_LOADING_TIME + _TEST_FIRST_STEP_EXTRA_TIME
                    + _TEST_STEP_TIME * _TEST_TOTAL_STEPS)
    before = _TEST_JOB_START_TIME - datetime.timedelta(microseconds=1)
    return Scenario(s.calls, intervals=[(before, job_end), (before, intermediate)])


#: incumbent test (``Class.test``) -> its scenario
SCENARIOS: dict[str, Scenario] = {
    "GoodputTest.test_goodput_recorder": Scenario(_build(_sample_program)),
    "GoodputTest.test_goodput_recorder_badput": Scenario(_build(_sample_program_with_badput)),
    "GoodputTest.test_goodput_calculator": Scenario(_build(_sample_program)),
    "GoodputTest.test_goodput_with_startup_badput": Scenario(_build(_startup_badput)),
    "GoodputDisruptionCompleteRestartTest.test_goodput_calculator": Scenario(
        _build(_restart, 0, steps_after=_TEST_TOTAL_STEPS - 2)),
    "GoodputDisruptionPartialRestartTest.test_goodput_calculator": Scenario(
        _build(_restart, 2)),
    "GoodputDisruptionPartialRestartTest.test_goodput_with_startup_badput": Scenario(
        _build(_restart, 2, startup_extra=True)),
    "GoodputPathwaysTest.test_goodput_with_anomalous_steps_single_disruption": Scenario(
        _build(_anomalous, 1), pathways=True),
    "GoodputPathwaysTest.test_goodput_with_anomalous_steps_multiple_disruptions": Scenario(
        _build(_anomalous, 2), pathways=True),
    "BadputTest.test_tpu_init_recorder": Scenario(_build(
        _one_phase, "tpu_init", _TEST_JOB_START_TIME,
        _TEST_JOB_START_TIME + _TEST_TPU_INIT_TIME)),
    "BadputTest.test_training_prep_recorder": Scenario(_build(
        _one_phase, "training_preparation", _TEST_JOB_START_TIME + _TEST_TPU_INIT_TIME,
        _TEST_JOB_START_TIME + _TEST_TPU_INIT_TIME + _TEST_TRAINING_PREPARATION_TIME)),
    "BadputTest.test_training_prep_recorder_no_timestamps": Scenario(_build(
        _one_phase_now, "training_preparation")),
    "BadputTest.test_data_loading_recorder": Scenario(_build(
        _one_phase, "data_loading",
        _TEST_JOB_START_TIME + _TEST_TPU_INIT_TIME + _TEST_TRAINING_PREPARATION_TIME,
        _TEST_JOB_START_TIME + _TEST_TPU_INIT_TIME + _TEST_TRAINING_PREPARATION_TIME
        + _TEST_DATA_LOADING_TIME)),
    "BadputTest.test_data_loading_recorder_no_timestamps": Scenario(_build(
        _one_phase_now, "data_loading")),
    "BadputTest.test_badput_calculator_tpu_initialization": Scenario(
        _build(_tpu_init_then_steps)),
    "BadputTest.test_badput_calculator_training_preparation": Scenario(_build(
        _badput_program, data_loading=False, startup_extra=False)),
    "BadputTest.test_badput_calculator_sync_data_loading": Scenario(_build(
        _badput_program, startup_extra=False)),
    "BadputTest.test_badput_calculator_async_data_loading": Scenario(_build(
        _badput_program, startup_extra=False, async_loading=True)),
    "BadputTest.test_badput_calculator_program_startup": Scenario(_build(_badput_program)),
    "BadputTest.test_badput_calculator_program_startup_with_disruptions": Scenario(
        _build(_badput_program, restart=True)),
    "BadputTest.test_badput_calculator_wasted_progress_and_disruptions": Scenario(
        _build(_badput_program, restart=True)),
    "BadputTest.test_badput_calculator_unknown_badput": Scenario(
        _build(_tpu_init_then_steps, unknown=5 * SEC)),
    "BadputTest.test_goodput_badput_with_interval_query": _interval_query_scenario(),
    "BadputTest.test_get_step_deviation": Scenario(_build(_step_deviation)),
    "BadputTest.test_badput_calculator_custom_sync_badput": Scenario(_build(_custom_sync)),
    "BadputTest.test_goodput_with_disruption_and_caching": Scenario(
        _build(_disruption_and_caching)),
    "BadputTest.test_badput_calculator_infrastructure_badput_from_disruption": Scenario(
        _build(_badput_program, restart=True)),
    "GoodputStepDeviationConcurrencyTest.test_concurrent_goodput_and_step_deviation": Scenario(
        _build(_sample_program)),
    "GoodputExclusionIntegrationTest.test_basic_exclusion_reduces_productive_time": Scenario(
        _build(_exclusion_basic)),
    "GoodputExclusionIntegrationTest.test_exclusion_masking_badput_event": Scenario(
        _build(_exclusion_badput_event)),
    "GoodputExclusionIntegrationTest.test_exclusion_with_multiple_steps_and_badput": Scenario(
        _build(_sample_program_with_badput, datetime.datetime(2025, 1, 1, 14, tzinfo=UTC))),
    "GoodputExclusionIntegrationTest.test_exclusion_during_disruption_recovery": Scenario(
        _build(_exclusion_disruption)),
    "GoodputExclusionIntegrationTest.test_exclusion_masking_training_prep": Scenario(
        _build(_exclusion_training_prep)),
}
#: The incumbent tests whose calls include no record_job_start_time: mgm has no number for
#: them (total job time 0) and neither do we (nothing is recorded outside an attempt).
NO_JOB = {name for name, sc in SCENARIOS.items()
          if not any(c[0] == "record_job_start_time" for c in sc.calls)}

def _cases():
    for name, sc in SCENARIOS.items():
        modes = ("kill", "kill-rank", "inproc", "overlap") if sc.restarts else ("single",)
        for mode in modes:
            yield pytest.param(name, mode, id=f"{name}-{mode}")


# --- running the calls ---------------------------------------------------------------------


def _processes(calls: list, mode: str) -> list[list]:
    """The calls of each OS process: one per attempt (``kill*``) or one in all."""
    if mode not in ("kill", "kill-rank", "overlap"):
        return [calls]
    out: list[list] = []
    for c in calls:
        if c[0] == "record_job_start_time" or not out:
            if not out or any(x[0] == "record_job_start_time" for x in out[-1]):
                out.append([])
        out[-1].append(c)
    return out


def _wire(calls: list) -> list:
    """Calls with datetimes as µs since the epoch (the child's format)."""
    return [[us(a) if isinstance(a, datetime.datetime) else a for a in c] for c in calls]


def _env(mode: str) -> dict:
    drop = ("GOODPUT_", "OTEL_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "JAX_", "GROUP_RANK",
            "NODE_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    if mode == "kill-rank":
        env["RANK"] = "0"
    return env


def run_processes(calls: list, mode: str, run_dir: Path, on_pause) -> None:
    """Run ``calls`` in real child processes, as ``mode`` says (module docstring); kill the
    ones whose attempt has no job end after ``SETTLE_S``. ``on_pause(k)`` runs at the
    ``k``-th pause while the process waits."""
    pauses = 0
    procs = _processes(calls, mode)
    prev = None  # (overlap) the process before, alive until this one has recorded

    def end_prev():
        nonlocal prev
        if prev is not None:
            time.sleep(SETTLE_S)  # what this one recorded is on disk, the old one alive
            prev.send_signal(signal.SIGKILL)
            assert prev.wait(10) == -signal.SIGKILL
            prev = None

    for i, part in enumerate(procs):
        ended = part[-1][0] == "record_job_end_time"
        plan = {"calls": _wire(part), "end": "exit" if ended else "hang"}
        p = subprocess.Popen(
            [sys.executable, str(CHILD), str(run_dir), JOB, str(FLUSH_S)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(mode))
        try:
            p.stdin.write(json.dumps(plan) + "\n")
            p.stdin.flush()
            while True:
                line = p.stdout.readline().strip()
                end_prev()
                if line == "PAUSED":
                    time.sleep(SETTLE_S)
                    on_pause(pauses)
                    pauses += 1
                    p.stdin.write("\n")
                    p.stdin.flush()
                    continue
                if line == "READY":
                    if mode == "overlap" and i + 1 < len(procs):
                        prev, p = p, None  # killed once the next one has recorded
                        break
                    time.sleep(SETTLE_S)  # what a real process flushed is on disk
                    sig = signal.SIGKILL if i + 1 < len(procs) else signal.SIGTERM
                    p.send_signal(sig)
                    assert p.wait(10) == -sig
                else:
                    assert line == "" and p.wait(10) == 0, f"child failed: {line!r}"
                break
        except BaseException:
            if prev is not None and prev.poll() is None:
                prev.kill()
                prev.wait()
            raise
        finally:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


class WriteLogs:
    """mgm's recorder writes here (like the ``MockCloudLogger`` of its tests)."""

    def __init__(self):
        self.entries: list[dict] = []

    def write_cloud_logging_entry(self, entry):
        if mgm.get_timestamp_from_log_entry(entry) is not None:
            self.entries.append(dict(entry))


def mgm_entries(calls: list) -> tuple[list[dict], list[int]]:
    """The calls through mgm's ``GoodputRecorder``: its log entries, and how many there
    were at each pause."""
    logs = WriteLogs()
    rec = mgm.GoodputRecorder(JOB, "log", True, logs)
    at_pause = []
    for method, *args in calls:
        if method == "pause":
            at_pause.append(len(logs.entries))
        elif method != "sleep":
            getattr(rec, method)(*args)
    return logs.entries, at_pause


def entries_end(entries: list[dict]) -> datetime.datetime:
    """The query time: 2 s after the latest entry."""
    ts = max(mgm.get_timestamp_from_log_entry(e) for e in entries)
    return _EPOCH + datetime.timedelta(microseconds=round(ts.timestamp() * 1e6)) + QUERY_DELAY


class _FrozenClock:
    """mgm's ``datetime`` module with ``datetime.now()`` returning ``at``."""

    def __init__(self):
        clock = self

        class Frozen(datetime.datetime):
            @classmethod
            def now(cls, tz=None):
                if clock.at is None:  # not frozen (mgm's recorder, for calls without time)
                    return datetime.datetime.now(tz)
                return clock.at.astimezone(tz) if tz is not None else clock.at.replace(
                    tzinfo=None)

        self.at = None
        self.module = types.SimpleNamespace(
            datetime=Frozen, timezone=datetime.timezone, timedelta=datetime.timedelta,
            date=datetime.date)


@pytest.fixture
def mgm_at(tmp_path, monkeypatch):
    """``make(entries, at, pathways)`` -> a real mgm 0.2.3 ``GoodputCalculator`` over
    ``entries``, whose wall clock reads ``at`` from then on."""
    clock = _FrozenClock()
    monkeypatch.setattr(mgm, "datetime", clock.module)
    count = iter(range(10**6))

    def make(entries, at, pathways=False):
        clock.at = at
        logs = MemoryLogs(entries, mgm.get_timestamp_from_log_entry)
        cache = tmp_path / f"mgm-cache-{next(count)}"
        return mgm.GoodputCalculator(JOB, "log", logs, pathways, cache_dir=str(cache))

    return make


def ours(run_dir: Path, at: datetime.datetime):
    """``--definitions mgm`` of the job in ``run_dir`` at *now* = ``at``."""
    (r,) = gdefs.report(run_dir, "mgm", now_ns=us(at) * 1000)
    return r


def compare_whole(run_dir: Path, make, entries: list, at, pathways=False) -> bool:
    """Ours == mgm's ``get_job_goodput`` at ``at``; False where both have no number."""
    calc = make(entries, at, pathways)
    try:
        result = calc.get_job_goodput(True)
    except ValueError as e:
        r = ours(run_dir, at)
        assert isinstance(r, gdefs.NoResult), f"mgm raised {e!r}, we gave {r}"
        return False
    r = ours(run_dir, at)
    assert not isinstance(r, gdefs.NoResult), f"mgm answered {result}, we: {r.reason}"
    assert_whole_job(r, calc, result)
    return True


# --- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "mode"), list(_cases()))
def test_incumbent_scenario(name, mode, tmp_path, mgm_at, capsys):
    sc = SCENARIOS[name]
    entries, at_pause = mgm_entries(sc.calls)
    run_dir = tmp_path / "run"
    mid = []

    def on_pause(k):  # the job is running: its spool so far vs mgm's entries so far
        part = entries[: at_pause[k]]
        mid.append(compare_whole(run_dir, mgm_at, part, entries_end(part), sc.pathways))

    run_processes(sc.calls, mode, run_dir, on_pause)
    assert len(mid) == len(at_pause) and all(mid)

    if name in NO_JOB:
        # mgm: "Total job time is zero"; ours: phases outside an attempt are not recorded
        with pytest.raises(ValueError, match="Total job time is zero"):
            mgm_at(entries, entries_end(entries)).get_job_goodput(True)
        with pytest.raises(ReadError):
            read_run_dir(run_dir)
        return

    at = entries_end(entries)
    assert compare_whole(run_dir, mgm_at, entries, at, sc.pathways)
    job = read_run_dir(run_dir).jobs[JOB]
    for start, end in sc.intervals:
        assert assert_interval(job, lambda e: mgm_at(e, at), entries, us(start) * 1000,
                               us(end) * 1000)

    if sc.calls[-1][0] == "record_job_end_time":
        # The CLI (which has no --now; a job end makes it irrelevant) prints the same.
        capsys.readouterr()
        assert cli.main(["report", str(run_dir), "--definitions", "mgm",
                         "--format", "json"]) == 0
        (printed,) = json.loads(capsys.readouterr().out)["jobs"]
        assert printed == json.loads(json.dumps(ours(run_dir, at).to_json_dict()))


def test_scenarios_cover_the_incumbent_tests():
    """Every test of mgm's goodput_test.py is here, but the one that is not expressible."""
    import ml_goodput_measurement

    path = Path(ml_goodput_measurement.__file__).parent / "tests" / "goodput_test.py"
    if not path.exists():
        pytest.skip("mgm's tests are not in this installation")
    names, cls = set(), None
    for line in path.read_text().splitlines():
        if line.startswith("class "):
            cls = line[6:].split("(")[0]
        elif line.startswith("  def test_"):
            names.add(f"{cls}.{line[6:].split('(')[0]}")
    assert names - set(SCENARIOS) == {"BadputTest.test_badput_calculator_checkpoint_badput"}
    assert set(SCENARIOS) <= names


def test_kills_are_real(tmp_path):
    """The killed processes left their in-flight step in the spool (``goodput.open``) and
    no end marker; a second record_job_start_time in one process ends the first attempt
    with reason ``restart``."""
    calls = SCENARIOS["GoodputDisruptionPartialRestartTest.test_goodput_calculator"].calls

    def spans(d):
        out = []
        for f in sorted(d.glob("*.jsonl")):
            for line in f.read_text().splitlines():
                for rs in json.loads(line)["resourceSpans"]:
                    for ss in rs["scopeSpans"]:
                        out += [(sp["name"], {a["key"]: next(iter(a["value"].values()))
                                              for a in sp.get("attributes", ())})
                                for sp in ss["spans"]]
        return out

    run_processes(calls, "kill-rank", tmp_path / "k", None)
    files = list((tmp_path / "k").glob("*.jsonl"))
    assert len({f.name.split("-")[3] for f in files}) == 2  # two OS processes (pids)
    killed = spans(tmp_path / "k")
    open_steps = [int(a[schema.ATTR_STEP]) for n, a in killed
                  if n == schema.STEP and a.get(schema.ATTR_OPEN) is True]
    assert open_steps == [4, 4]  # the step in flight at each kill
    assert not [n for n, _ in killed if n == schema.JOB_END]

    run_processes(calls, "inproc", tmp_path / "i", None)
    assert [a[schema.ATTR_END_REASON] for n, a in spans(tmp_path / "i")
            if n == schema.JOB_END] == ["restart"]
