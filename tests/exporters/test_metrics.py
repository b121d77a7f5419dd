"""Rolling windows, OpenTelemetry metrics (in memory, OTLP, Cloud Monitoring, Prometheus)
and TensorBoard scalars of the accounting.

Exporters are the real ones, talking to real gRPC servers on loopback
(``fake_metric_services``) or scraped over HTTP; TensorBoard files are read back with
TensorBoard's own ``EventAccumulator``.
"""

from __future__ import annotations

import urllib.request

import pytest
from fake_metric_services import FakeCloudMonitoring, FakeOtlpMetrics
from metric_points import reader_points
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from otlp_fixtures import Timeline
from timeline_cases import worked_example

from goodput import schema
from goodput_processor.account.accounting import account
from goodput_processor.account.windows import account_windows
from goodput_processor.exporters.metric_readers import (
    cloud_monitoring_reader,
    otlp_reader,
    prometheus_reader,
)
from goodput_processor.exporters.metrics import (
    METRIC_NAMES,
    GoodputMetrics,
    JobSnapshot,
    run_dir_source,
    snapshot,
)
from goodput_processor.exporters.tensorboard import TensorBoardWriter, badput_tag
from goodput_processor.read.reader import read_run_dir

MIN = 60 * 10**9
#: Every metric but the MFU pair, which needs the run's FLOPs attributes (test_mfu_gauges),
#: the straggler gauge, which needs several host processes (test_stragglers.py), the
#: warnings gauge, which needs a job with warnings (test_warnings.py), and the over-limit
#: gauge, which needs goodput serve's limits (test_serve_limits.py), and the slice
#: efficiencies, which need an elastic job (test_mgm_native.py).
EXPORTED = set(METRIC_NAMES) - {"goodput.mfu", "goodput.useful_compute",
                                "goodput.straggler.step_time_ratio", "goodput.warnings",
                                "goodput.job.over_limit",
                                "goodput.elastic.stepping_slice_efficiency",
                                "goodput.elastic.available_slice_efficiency"}


def _job(tmp_path, *tls, name="job"):
    for tl in tls:
        tl.write(tmp_path)
    return read_run_dir(tmp_path).jobs[name]


@pytest.fixture
def worked(tmp_path):
    return _job(tmp_path, *worked_example())


# -- rolling windows ---------------------------------------------------------------------

def test_windows_of_worked_example(worked):
    r, (w60, w100, wall) = account_windows(worked, (3600, 6000, 10**6), ideal_step_time_s=120)
    ref = account(worked, ideal_step_time_s=120)
    assert r.buckets_ns == ref.buckets_ns and r.attempts == ref.attempts
    # last 60 min (140..200): steps at 3 min (ideal 2) until 195, then a 5-min save
    assert (w60.start_ns, w60.end_ns, w60.total_ns) == (r.end_ns - 60 * MIN, r.end_ns, 60 * MIN)
    assert w60.buckets_ns["checkpoint_save"] == 5 * MIN
    assert abs(w60.buckets_ns["productive"] - 55 * MIN * 2 / 3) <= 1
    assert abs(w60.buckets_ns["training_slowdown"] - 55 * MIN / 3) <= 1
    # last 100 min: recovery 100..115, restore 115..120, steps 120..195, save
    want = {"infrastructure_recovery": 15, "checkpoint_restore": 5, "checkpoint_save": 5,
            "productive": 50, "training_slowdown": 25, "wasted_progress": 0}
    assert {k: w100.buckets_ns[k] / MIN for k in want} == pytest.approx(want)
    assert w100.goodput == pytest.approx(0.5)
    # a window longer than the job is the whole job
    assert wall.start_ns == r.start_ns and wall.total_ns == r.total_ns
    for k, v in r.buckets_ns.items():
        assert abs(wall.buckets_ns[k] - v) <= 1, k
    for w in (w60, w100, wall):
        assert sum(w.buckets_ns.values()) == w.total_ns
        assert all(v >= 0 for v in w.buckets_ns.values())


def test_windows_reject_bad_input(worked):
    for bad in (0, -5, float("nan"), "60", True):
        with pytest.raises(ValueError, match="rolling window"):
            account_windows(worked, (60, bad))
    with pytest.raises(ValueError, match="rolling window"):
        GoodputMetrics(lambda: [], MeterProvider(), windows_s=(float("inf"),))


# -- OpenTelemetry metrics ---------------------------------------------------------------

def _key(name, **attrs):
    a = {"goodput.job.name": "job"}
    a.update({"goodput." + k.replace("_", "."): v for k, v in attrs.items()})
    return (name, frozenset(a.items()))


def test_gauges_from_job_spans(worked):
    reader = InMemoryMetricReader()
    gm = GoodputMetrics(lambda: [worked], MeterProvider(metric_readers=[reader]),
                        windows_s=(3600, 6000), ideal_step_time_s=120)
    pts, units = reader_points(reader)
    assert set(units) == EXPORTED
    assert {n: u for n, u in units.items()} == {n: METRIC_NAMES[n][0] for n in EXPORTED}
    r = account(worked, ideal_step_time_s=120)
    assert pts[_key("goodput.goodput")] == pytest.approx(0.5)
    assert pts[_key("goodput.productive_time")] == pytest.approx(100 * 60)
    assert pts[_key("goodput.elapsed_time")] == pytest.approx(200 * 60)
    assert pts[_key("goodput.disruptions")] == 1
    assert pts[_key("goodput.max_productive_step")] == 75
    assert pts[_key("goodput.ideal_step_time")] == pytest.approx(120)
    assert pts[_key("goodput.anomalous_steps")] == 25
    for bucket, sec in r.badput_s.items():
        assert pts[_key("goodput.badput_time", badput_bucket=bucket)] == pytest.approx(sec)
    assert pts[_key("goodput.badput_time", badput_bucket="wasted_progress")] == 40 * 60
    # kept steps: 25 at 2 min (deviation 0) and 25 at 3 min (deviation +60 s)
    assert pts[_key("goodput.step_time_deviation", statistic="p50")] == pytest.approx(30)
    assert pts[_key("goodput.step_time_deviation", statistic="p90")] == pytest.approx(60)
    assert pts[_key("goodput.step_time_deviation", statistic="max")] == pytest.approx(60)
    assert pts[_key("goodput.window.goodput", window=6000)] == pytest.approx(0.5)
    assert pts[_key("goodput.window.goodput", window=3600)] == pytest.approx(110 / 180)
    assert pts[_key("goodput.window.productive_time", window=6000)] == pytest.approx(50 * 60)
    assert pts[_key("goodput.window.badput_time", window=6000,
                    badput_bucket="infrastructure_recovery")] == pytest.approx(15 * 60)
    assert gm.errors == 0


def test_source_called_once_per_collection_and_errors_keep_last(worked):
    calls = []
    fail = []

    def source():
        calls.append(1)
        if fail:
            raise RuntimeError("live state unavailable")
        return [snapshot(worked, (60,))]

    reader = InMemoryMetricReader()
    gm = GoodputMetrics(source, MeterProvider(metric_readers=[reader]), min_refresh_s=0)
    first, _ = reader_points(reader)
    assert len(calls) == 1  # 12 gauges, one call
    fail.append(1)
    again, _ = reader_points(reader)
    assert gm.errors == 1 and again == first  # the last good values, reported again


def test_plain_results_and_bad_items(worked):
    reader = InMemoryMetricReader()
    items = [account(worked)]
    gm = GoodputMetrics(lambda: items, MeterProvider(metric_readers=[reader]), min_refresh_s=0)
    pts, _ = reader_points(reader)
    assert pts[_key("goodput.goodput")] == pytest.approx(account(worked).goodput)
    assert not [k for k in pts if k[0].startswith("goodput.window.")]  # no windows given
    items.append("not a job")
    reader_points(reader)
    assert gm.errors == 1


def test_run_dir_source_multiple_jobs(tmp_path):
    Timeline(job="a").job_start(0).steps(1, 10, 0, 1.0).job_end(10).write(tmp_path / "a")
    Timeline(job="b").job_start(0).steps(1, 5, 0, 1.0).span("data_loading", 5, 10)\
        .job_end(10).write(tmp_path / "b")
    reader = InMemoryMetricReader()
    GoodputMetrics(run_dir_source(tmp_path, windows_s=(5,)), MeterProvider(metric_readers=[reader]))
    pts, _ = reader_points(reader)
    g = {dict(k[1])["goodput.job.name"]: v for k, v in pts.items() if k[0] == "goodput.goodput"}
    assert g == {"a": pytest.approx(1.0), "b": pytest.approx(0.5)}
    wb = {dict(k[1])["goodput.job.name"]: v for k, v in pts.items()
          if k[0] == "goodput.window.goodput"}
    assert wb == {"a": pytest.approx(1.0), "b": pytest.approx(0.0)}  # last 5 s of b: loading


def test_otlp_export_to_loopback_collector(worked):
    with FakeOtlpMetrics() as fake:
        reader = otlp_reader(fake.address, interval_s=3600, insecure=True)
        provider = MeterProvider(metric_readers=[reader])
        GoodputMetrics(lambda: [JobSnapshot(*account_windows(worked, (3600,), 120))], provider)
        assert provider.force_flush(10_000)
        assert fake.wait_for(lambda reqs: len(reqs) >= 1)
        provider.shutdown()
    pts = fake.points()
    names = {n for n, _, _ in pts}
    assert names == EXPORTED
    got = {(n, a.get("goodput.badput.bucket"), a.get("goodput.window")): v for n, a, v in pts}
    assert got[("goodput.goodput", None, None)] == pytest.approx(0.5)
    assert got[("goodput.badput_time", "infrastructure_recovery", None)] == pytest.approx(900)
    assert got[("goodput.window.goodput", None, 3600)] == pytest.approx(110 / 180)
    assert all(a["goodput.job.name"] == "job" for _, a, _ in pts)


def test_cloud_monitoring_export_to_loopback_service(worked):
    with FakeCloudMonitoring() as fake:
        reader = cloud_monitoring_reader("my-project", interval_s=3600, client=fake.client())
        provider = MeterProvider(metric_readers=[reader])
        GoodputMetrics(lambda: [worked], provider, windows_s=(6000,), ideal_step_time_s=120)
        assert provider.force_flush(10_000)
        assert fake.wait_for(lambda reqs: len(reqs) >= 1)
        provider.shutdown()
    assert all(r.name == "projects/my-project" for r in fake.requests)
    types = {d.metric_descriptor.type for d in fake.descriptors}
    assert types == {f"workload.googleapis.com/{n}" for n in EXPORTED}
    series = {(t, tuple(sorted(lab.items()))): v for t, lab, v in fake.series()}
    key = ("workload.googleapis.com/goodput.badput_time",
           (("goodput_badput_bucket", "wasted_progress"), ("goodput_job_name", "job")))
    assert series[key] == pytest.approx(2400)
    key = ("workload.googleapis.com/goodput.window.goodput",
           (("goodput_job_name", "job"), ("goodput_window", "6000")))
    assert series[key] == pytest.approx(0.5)
    key = ("workload.googleapis.com/goodput.disruptions", (("goodput_job_name", "job"),))
    assert series[key] == 1


def test_prometheus_scrape(worked):
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    reader, server = prometheus_reader(port=0, registry=registry)
    try:
        GoodputMetrics(lambda: [worked], MeterProvider(metric_readers=[reader]),
                       windows_s=(3600,), ideal_step_time_s=120)
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        server.shutdown()
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k.startswith("goodput_")}
            samples[(s.name, tuple(sorted(labels.items())))] = s.value
    assert samples[("goodput_goodput", (("goodput_job_name", "job"),))] == 0.5
    assert samples[("goodput_badput_time_seconds",
                    (("goodput_badput_bucket", "training_slowdown"),
                     ("goodput_job_name", "job")))] == pytest.approx(1500)
    assert samples[("goodput_window_goodput",
                    (("goodput_job_name", "job"), ("goodput_window", "3600")))] == \
        pytest.approx(110 / 180)


# -- TensorBoard -------------------------------------------------------------------------

def _read_tb(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return {tag: [(e.step, float(e.tensor_proto.float_val[0])) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


def test_tensorboard_tags_read_back(tmp_path):
    a0, a1 = worked_example()
    a1.custom("Eval", 195, 195.5)
    job = _job(tmp_path / "run", a0, a1)
    r = account(job, ideal_step_time_s=120)
    w = TensorBoardWriter(tmp_path / "tb")
    n = w.write(r)
    w.write(r)  # again: goodput/badput repeated, step deviations not
    w.close()
    tags = _read_tb(tmp_path / "tb")
    assert tags["goodput/goodput"] == [(75, pytest.approx(100 * r.goodput))] * 2
    for bucket in schema.BADPUT_BUCKETS:
        assert f"badput/{bucket}" in tags
    assert tags["badput/wasted_progress"][0] == (75, pytest.approx(100 * 40 / 200))
    assert badput_tag("custom:Eval") == "badput/custom_badput_events/eval"
    assert "badput/custom_badput_events/eval" in tags
    dev = tags["step_deviation"]
    assert [s for s, _ in dev] == list(range(26, 51)) + list(range(51, 76))
    assert dev[0] == (26, pytest.approx(0)) and dev[-1] == (75, pytest.approx(60))
    assert n == 1 + len(r.badput_s) + 50


def test_mfu_gauges(tmp_path):
    attrs = {schema.RES_FLOPS_PER_STEP: 4 * 10**12, schema.RES_PEAK_FLOPS: 10**12,
             schema.RES_DEVICE_COUNT: 8}
    Timeline(**attrs).job_start(0).steps(1, 10, 0, 1).job_end(10).write(tmp_path)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    GoodputMetrics(run_dir_source(tmp_path), meter_provider=provider)
    points = {m.name: m.data.data_points[0].value
              for rm in reader.get_metrics_data().resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics
              if m.name in ("goodput.mfu", "goodput.useful_compute")}
    assert points == {"goodput.mfu": pytest.approx(0.5),
                      "goodput.useful_compute": pytest.approx(0.5)}
    provider.shutdown()
