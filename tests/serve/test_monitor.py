"""The in-process GoodputMonitor, with a real recorder writing a real spool in this process,
real metric readers and TensorBoard files read back with TensorBoard's reader."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import goodput
from goodput_processor.account.run_dir import report_run_dir
from goodput_processor.serve.monitor import GoodputMonitor


def _gauges(reader) -> dict:
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    out[(m.name, tuple(sorted(p.attributes.items())))] = p.value
    return out


def _wait(pred, timeout_s=20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


@pytest.fixture
def recorder(tmp_path):
    run = tmp_path / "run"
    goodput.configure("mon-job", run_dir=run, flush_interval_s=0.05, handle_signals=False,
                      start_time=time.time())
    yield run
    goodput.shutdown()


def _train(steps: int, first: int = 0, step_s: float = 0.002):
    for n in range(first, first + steps):
        with goodput.step(n):
            time.sleep(step_s)
        if n % 10 == 9:
            with goodput.data_loading():
                time.sleep(step_s)


def test_monitor_publishes_what_report_computes(recorder, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    mon = GoodputMonitor(recorder, interval_s=0.05, meter_provider=provider,
                         tensorboard_dir=tmp_path / "tb", windows_s=(1,))
    with goodput.training_prep():
        time.sleep(0.01)
    mon.start()
    _train(30)
    assert _wait(lambda: mon.cycles >= 2 and mon.snapshots)  # live while training
    _train(30, first=30)
    goodput.shutdown()  # the attempt ends: job_end written
    assert mon.stop(timeout_s=10)
    assert mon.errors == 0
    (want,) = report_run_dir(recorder)
    got = _gauges(reader)
    job = (("goodput.job.name", "mon-job"),)
    assert got[("goodput.goodput", job)] == pytest.approx(want.goodput, abs=1e-12)
    assert got[("goodput.elapsed_time", job)] == pytest.approx(want.total_time_s)
    assert got[("goodput.max_productive_step", job)] == 59
    for bucket, sec in want.badput_s.items():
        key = ("goodput.badput_time", (("goodput.badput.bucket", bucket),) + job)
        assert got[key] == pytest.approx(sec, abs=1e-9)
    assert want.badput_s["data_loading"] > 0 and want.badput_s["training_prep"] > 0
    w = got[("goodput.window.goodput", (("goodput.job.name", "mon-job"), ("goodput.window", 1)))]
    assert 0 <= w <= 1
    acc = EventAccumulator(str(tmp_path / "tb" / "goodput" / "mon-job"),
                           size_guidance={"tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["tensors"])
    assert {"goodput/goodput", "badput/data_loading", "step_deviation"} <= tags
    last = acc.Tensors("goodput/goodput")[-1]
    assert last.step == 59
    assert last.tensor_proto.float_val[0] == pytest.approx(100 * want.goodput, rel=1e-6)
    steps = [e.step for e in acc.Tensors("step_deviation")]
    assert steps == sorted(set(steps)) and steps[-1] == 59  # each step written once


def test_context_manager_with_own_readers(recorder):
    reader = InMemoryMetricReader()
    with GoodputMonitor(recorder, interval_s=0.05, metric_readers=[reader]) as mon:
        _train(10)
        assert _wait(lambda: mon.cycles >= 1)
        got = _gauges(reader)
        assert ("goodput.goodput", (("goodput.job.name", "mon-job"),)) in got
    assert mon._thread is None and mon.errors == 0


def test_never_raises_into_training(tmp_path, caplog):
    missing = tmp_path / "nothing-here"
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    mon = GoodputMonitor(missing, interval_s=0.02, tensorboard_dir=blocker)
    mon.start()
    mon.start()  # twice: logged, not raised
    assert _wait(lambda: mon.errors >= 2)
    assert mon.run_once() is False
    assert mon.stop(timeout_s=5)  # the final cycle fails too, counted, not raised
    assert mon.cycles == 0 and mon.errors >= 3
    assert "nothing-here" in caplog.text


def test_tensorboard_failure_is_counted(recorder, tmp_path):
    blocker = tmp_path / "tbfile"
    blocker.write_text("x")
    mon = GoodputMonitor(recorder, interval_s=3600, tensorboard_dir=blocker)
    _train(3)
    goodput.flush()
    assert mon.run_once() is False
    assert mon.errors == 1 and mon.cycles == 1 and mon.snapshots  # metrics still updated
    assert mon.stop(timeout_s=5, final=False)


def test_stop_without_start_and_long_interval(recorder):
    mon = GoodputMonitor(recorder, interval_s=3600)
    assert mon.stop(timeout_s=5)  # never started: only the final cycle
    assert mon.cycles == 1
    mon = GoodputMonitor(recorder, interval_s=3600).start()
    assert mon.stop(timeout_s=5)  # wakes the sleeping thread at once
    assert mon.cycles == 1


@pytest.mark.parametrize("kw, match", [
    ({"interval_s": 0}, "interval_s"),
    ({"interval_s": float("nan")}, "interval_s"),
    ({"windows_s": (60, -1)}, "rolling window"),
    ({"ideal_step_time_s": -1.0}, "ideal_step_time_s"),
    ({"meter_provider": MeterProvider(), "metric_readers": [InMemoryMetricReader()]},
     "either"),
])
def test_bad_arguments(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        GoodputMonitor(tmp_path, **kw)
