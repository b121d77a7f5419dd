"""Cloud Monitoring: ``goodput.mgm``'s monitor sends the series the real
``ml-goodput-measurement`` 0.2.3 sends for the same job.

Both sides send to their own loopback ``google.monitoring.v3.MetricService``
(``fake_metric_services.FakeCloudMonitoring``, real gRPC, the real request types):

- the incumbent: its own upload code (``monitoring._upload_goodput_metrics_to_gcm``,
  ``_send_step_deviation_metric_to_gcp``, ``_upload_interval_goodput_metrics_to_gcm``)
  through its ``GCPMetrics`` (with the fake's client), fed the details of its own
  ``ElasticGoodputCalculator`` over the entries its recorder wrote;
- ours: ``goodput.mgm.monitoring_elastic.ElasticGoodputMonitor``, started and stopped as
  MaxText does (its final upload), over the spool our recorder wrote in real processes.

The job is the MaxText-shaped elastic scenario of ``test_mgm_scenarios.py`` (a slice-down
with its steps repeated, a scale-up, reinitialisations, slice counts), so the series
include elastic badput, disruptions and slice efficiency. Compared: the request's project,
and per series the metric type, metric labels, monitored resource type and labels, value
type and value.
"""

from __future__ import annotations

import datetime

import pytest

monitoring = pytest.importorskip("ml_goodput_measurement.src.monitoring")
pytest.importorskip("google.cloud.monitoring_v3")

from fake_metric_services import FakeCloudMonitoring  # noqa: E402
from test_mgm_scenarios import (  # noqa: E402
    ELASTIC,
    JOB,
    SEC,
    last_time,
    mgm_log,
    oracle,  # noqa: F401 - fixture
    recorded,
)

from goodput.mgm import goodput as ours_goodput  # noqa: E402
from goodput.mgm import goodput_utils, monitoring_elastic  # noqa: E402
from goodput_processor.exporters.workload import WorkloadOptions, WorkloadSender, interval_series  # noqa: E402

CALLS = ELASTIC["maxtext_elastic_event"]
OPTIONS = dict(project_id="my-project", location="us-east5-b", replica_id="3",
               acc_type="TPU-v5p", cluster_name="cluster-a")
WINDOW_S = 10**8  # a rolling window that holds the whole job, whenever it is computed


def _series(fake) -> list[tuple]:
    """Every series received: ``(type, labels, resource type, resource labels, value
    type, value)``, sorted."""
    out = []
    for req in fake.requests:
        assert req.name == f"projects/{OPTIONS['project_id']}"
        for ts in req.time_series:
            (point,) = ts.points
            kind = "double_value" if "double_value" in point.value else "int64_value"
            out.append((ts.metric.type, tuple(sorted(ts.metric.labels.items())),
                        ts.resource.type, tuple(sorted(ts.resource.labels.items())), kind,
                        getattr(point.value, kind)))
    return sorted(out, key=lambda s: s[:5])


def _same(ours: list[tuple], theirs: list[tuple]) -> None:
    assert [s[:5] for s in ours] == [s[:5] for s in theirs]
    for o, t in zip(ours, theirs, strict=True):
        assert o[5] == pytest.approx(t[5], rel=1e-6, abs=1e-5), o[:2]


def _theirs(entries, at, oracle_make, fake) -> None:
    """The incumbent's own uploads for the job, to ``fake``."""
    sender = monitoring.GCPMetrics.__new__(monitoring.GCPMetrics)
    sender.project_id = OPTIONS["project_id"]
    sender.project_name = f"projects/{OPTIONS['project_id']}"
    sender.client = fake.client()
    config = {"gcp_options": monitoring.GCPOptions(**OPTIONS), "job_name": JOB,
              "include_slice_efficiency": True}
    calc = oracle_make(entries, at, elastic=True)
    calc.get_job_goodput(include_badput_breakdown=True)
    monitoring._upload_goodput_metrics_to_gcm(sender, calc.get_job_goodput_details(), config)
    monitoring._send_step_deviation_metric_to_gcp(sender, calc.get_step_deviation(), config)
    now = datetime.datetime.now(datetime.timezone.utc)
    details = calc.get_interval_metric_details(now - datetime.timedelta(seconds=WINDOW_S), now)
    monitoring._upload_interval_goodput_metrics_to_gcm(sender, details, config)


def test_the_incumbents_series_from_the_monitor(tmp_path, oracle):  # noqa: F811
    entries = mgm_log(CALLS)
    at = last_time(entries) + 2 * SEC
    run_dir = recorded(CALLS, tmp_path)
    with FakeCloudMonitoring() as theirs, FakeCloudMonitoring() as ours:
        _theirs(entries, at, oracle, theirs)
        monitor = monitoring_elastic.ElasticGoodputMonitor(
            job_name=JOB, logger_name=f"goodput_{JOB}", tensorboard_dir=str(tmp_path / "tb"),
            upload_interval=3600, monitoring_enabled=True, include_badput_breakdown=True,
            include_step_deviation=True, include_slice_efficiency=True,
            gcp_options=goodput_utils.GCPOptions(**OPTIONS), run_dir=run_dir,
            gcp_client=ours.client())
        monitor.start_goodput_uploader()
        monitor.start_step_deviation_uploader()
        monitor.start_goodput_interval_uploader(WINDOW_S)  # rolling window of one size
        monitor.stop_goodput_uploader()
        monitor.stop_step_deviation_uploader()
        monitor.stop_rolling_window_goodput_uploader()
        assert monitor.errors == 0
        assert len(ours.requests) == len(theirs.requests) == 3
        mine, incumbent = _series(ours), _series(theirs)
    _same(mine, incumbent)
    types = {s[0].rsplit("/", 1)[1] for s in incumbent}
    assert types == {"goodput_time", "badput_time", "disruptions", "max_productive_steps",
                     "step_time_deviation", "total_elapsed_time", "performance",
                     "interval_goodput", "interval_badput", "stepping_slice_efficiency",
                     "available_slice_efficiency"}
    sources = {dict(s[1]).get("badput_source") for s in incumbent}
    assert {"ELASTIC_SLICE_DOWN", "ELASTIC_SCALE_UP", "ELASTIC_REINITIALIZATION",
            "WASTED_PROGRESS_FROM_DISRUPTION"} <= sources
    assert {s[2] for s in incumbent} == {"compute.googleapis.com/Workload"}
    assert {s[3] for s in incumbent} == {(("location", "us-east5-b"), ("replica_id", "3"),
                                          ("workload_id", JOB))}


def test_labels_and_values_of_a_plain_job(tmp_path, oracle):  # noqa: F811
    """A job without elastic events, through the plain calculator; no cluster name (the
    label is then absent, as the incumbent leaves it out) and sub-second rounding of the
    window size label."""
    from test_compat_recorder_kills import SCENARIOS

    calls = SCENARIOS["BadputTest.test_badput_calculator_custom_sync_badput"].calls
    entries = mgm_log(calls)
    at = last_time(entries) + 2 * SEC
    run_dir = recorded(calls, tmp_path)
    opts = {**OPTIONS, "cluster_name": None}
    with FakeCloudMonitoring() as theirs, FakeCloudMonitoring() as ours:
        sender = monitoring.GCPMetrics.__new__(monitoring.GCPMetrics)
        sender.project_id, sender.client = opts["project_id"], theirs.client()
        sender.project_name = f"projects/{opts['project_id']}"
        config = {"gcp_options": monitoring.GCPOptions(**opts), "job_name": JOB}
        calc = oracle(entries, at)
        calc.get_job_goodput(include_badput_breakdown=True)
        monitoring._upload_goodput_metrics_to_gcm(sender, calc.get_job_goodput_details(),
                                                  config)
        start, end = at - 40 * SEC, at - 2.5 * SEC
        monitoring._upload_interval_goodput_metrics_to_gcm(
            sender, calc.get_interval_metric_details(start, end), config)

        from goodput.mgm.monitoring import GoodputMonitor

        monitor = GoodputMonitor(JOB, f"goodput_{JOB}", str(tmp_path / "tb"), 3600, True,
                                 include_badput_breakdown=True,
                                 gcp_options=goodput_utils.GCPOptions(**opts),
                                 run_dir=run_dir, gcp_client=ours.client())
        monitor.stop_goodput_uploader()  # never started: one final upload, bounded
        mine = ours_goodput.GoodputCalculator(JOB, run_dir=run_dir, definitions="mgm")
        sender_ours = WorkloadSender(opts["project_id"], ours.client())
        d = mine.get_interval_metric_details(start, end)
        named = {k: ({getattr(a, "name", a): b for a, b in v.items()} if isinstance(v, dict)
                     else v) for k, v in d.items()}
        assert sender_ours.send(interval_series(JOB, named, WorkloadOptions(
            opts["project_id"], opts["location"], opts["replica_id"], opts["acc_type"])))
        assert len(ours.requests) == len(theirs.requests) == 2
        _same(_series(ours), _series(theirs))
    labels = {k for s in _series(theirs) for k, _ in s[1]}
    assert "cluster_name" not in labels and "rolling_window_size" in labels
    assert {dict(s[1]).get("rolling_window_size") for s in _series(theirs)} >= {"37"}


def test_no_project_no_series_and_the_job_is_not_held(tmp_path):
    """Off Google Cloud, without a project: the monitor writes TensorBoard only, and its
    stop returns within its timeout even when the run directory does not exist."""
    from goodput.mgm.monitoring import GoodputMonitor

    monitor = GoodputMonitor("nojob", "goodput_nojob", str(tmp_path / "tb"), 0.05, True,
                             gcp_options=goodput_utils.GCPOptions(),
                             run_dir=tmp_path / "missing", final_flush_timeout_seconds=5)
    assert monitor._sender is None
    assert not monitor._gcp_options.enable_gcp_goodput_metrics
    monitor.start_goodput_uploader()
    monitor.stop_goodput_uploader()
    assert monitor.errors >= 1  # each cycle logged "no spans", none raised


def test_a_hung_upload_does_not_hold_up_the_job(tmp_path):
    """Cloud Monitoring stops answering (a MetricService whose CreateTimeSeries blocks):
    ``stop_goodput_uploader`` still returns, after ``final_flush_timeout_seconds``,
    abandoning the stuck final upload on its daemon thread."""
    import threading

    from test_compat_recorder_kills import SCENARIOS

    from goodput.mgm.monitoring import GoodputMonitor

    calls = SCENARIOS["GoodputTest.test_goodput_calculator"].calls
    run_dir = recorded(calls, tmp_path)
    release = threading.Event()
    with FakeCloudMonitoring() as fake:
        original = fake._record

        def blocking(req):
            original(req)
            release.wait(60)  # the server holds the request: the client waits

        fake._record = blocking
        monitor = GoodputMonitor(JOB, f"goodput_{JOB}", str(tmp_path / "tb"), 3600, True,
                                 gcp_options=goodput_utils.GCPOptions(**OPTIONS),
                                 final_flush_timeout_seconds=1, run_dir=run_dir,
                                 gcp_client=fake.client())
        monitor.start_goodput_uploader()
        uploader = monitor._uploaders["goodput"]
        monitor.stop_goodput_uploader()  # returns although the upload is stuck
        assert fake.wait_for(lambda reqs: len(reqs) == 1, 10)
        assert uploader.alive()  # abandoned, not waited for
        release.set()
        uploader._thread.join(30)
        assert not uploader.alive()
    # the TensorBoard part of that final cycle was written before the upload
    from test_maxtext_integration import _last_points

    assert "goodput/goodput" in _last_points(tmp_path / "tb" / "goodput")
