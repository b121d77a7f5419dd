"""What issue 16 adds to this project's own model, with hand-computed numbers: elastic
buckets and slice efficiency (report, JSON, metrics), exclusions (``goodput report
--exclude``), reports as of a moment (``--at``), and the in-process monitor writing the
incumbent's Cloud Monitoring series (``workload=``) to a loopback MetricService.
"""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from otlp_fixtures import T0_NS, Timeline

from goodput import schema
from goodput_processor import cli, read_run_dir
from goodput_processor.account.accounting import account
from goodput_processor.exporters.metrics import GoodputMetrics

NS = 1_000_000_000


def elastic_job() -> Timeline:
    """Seconds: 4 slices; steps 1-5 of 10 s from 0; step 6 starts at 50, a slice goes down at
    56 (wait until 86, slice down), reinitialisation 86-126 with TPU init 88-96, training
    preparation 96-120 and the restore of checkpoint 5 at 100-110 inside; steps 6-10 of 10 s
    from 126; end 176. Slice counts (stepping, available, total): (4, 4, 4) at 0,
    (0, 3, 4) at 56, (3, 3, 4) at 86."""
    t = Timeline()
    t.job_start(0)

    def slices(when, active, available, total=4):
        t.span(schema.ELASTIC_SLICES, when, when, {
            schema.ATTR_SLICES_ACTIVE: active, schema.ATTR_SLICES_AVAILABLE: available,
            schema.ATTR_SLICES_TOTAL: total})

    slices(0, 4, 4)
    t.steps(1, 5, 0, 10)
    t.step(6, 50, 126)  # step_start(6) at 50, closed by the next step_start
    t.span(schema.ELASTIC_WAIT, 56, 86, {schema.ATTR_ELASTIC_EVENT_TYPE: "elastic_slice_down"})
    slices(56, 0, 3)
    t.span(schema.ELASTIC_REINIT, 86, 126)
    slices(86, 3, 3)
    t.span("accelerator_init", 88, 96).span("training_prep", 96, 120).restore(100, 110, 5)
    t.steps(6, 10, 126, 10)
    return t.job_end(176, reason="explicit")


def test_elastic_buckets_and_slice_efficiency(tmp_path, capsys):
    elastic_job().write(tmp_path)
    r = account(read_run_dir(tmp_path).jobs["job"])
    s = {k: v for k, v in r.badput_s.items() if v}
    # step 6 before the wait (50-56) was thrown away: training resumed from checkpoint 5;
    # the restore (priority over the reinitialisation) is its own bucket
    assert s == pytest.approx({"wasted_progress": 6, "elastic_slice_down": 30,
                               "elastic_reinitialization": 30, "checkpoint_restore": 10})
    assert r.productive_time_s == pytest.approx(100) and r.total_time_s == 176
    assert list(r.badput_s).index("elastic_slice_down") == list(r.badput_s).index(
        "infrastructure_recovery") + 1  # report order
    assert r.slice_efficiency.stepping == pytest.approx((4 * 56 + 0 * 30 + 3 * 90) / 4 / 176)
    assert r.slice_efficiency.available == pytest.approx((4 * 56 + 3 * 120) / 4 / 176)
    assert cli.main(["report", str(tmp_path), "--format", "json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["slice_efficiency"] == pytest.approx(
        {"stepping": r.slice_efficiency.stepping, "available": r.slice_efficiency.available})
    assert job["badput_s"]["elastic_scale_up"] == 0
    assert cli.main(["report", str(tmp_path)]) == 0
    assert "slice efficiency: stepping" in capsys.readouterr().out

    reader = InMemoryMetricReader()
    GoodputMetrics(lambda: [r], MeterProvider(metric_readers=[reader]))
    points = {m.name: m.data.data_points for rm in reader.get_metrics_data().resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics}
    (p,) = points["goodput.elastic.stepping_slice_efficiency"]
    assert p.value == pytest.approx(r.slice_efficiency.stepping)
    buckets = {pt.attributes["goodput.badput.bucket"]: pt.value
               for pt in points["goodput.badput_time"]}
    assert buckets["elastic_reinitialization"] == pytest.approx(30)


def test_a_job_without_elastic_spans_has_no_elastic_buckets(tmp_path):
    t = Timeline()
    t.job_start(0).steps(1, 3, 0, 10).job_end(30)
    t.write(tmp_path)
    r = account(read_run_dir(tmp_path).jobs["job"])
    assert not set(schema.ELASTIC_BUCKETS) & set(r.badput_s)
    assert r.slice_efficiency is None


def excluded_job(tmp_path):
    """Steps 1-4 of 10 s from 0, a blocking save 40-50, steps 5-10 of 10 s, end 110."""
    t = Timeline()
    t.job_start(0).steps(1, 4, 0, 10).save(40, 50, 4).steps(5, 10, 50, 10).job_end(110)
    t.write(tmp_path)


def _iso(t: float) -> str:
    return str((T0_NS + round(t * NS)) / NS)


def test_exclusions_take_their_instants_out(tmp_path, capsys):
    excluded_job(tmp_path)
    args = ["report", str(tmp_path), "--format", "json", "--exclude", f"{_iso(35)},{_iso(45)}",
            "--exclude", f"{_iso(-10)},{_iso(-5)}"]  # before the job: nothing
    assert cli.main(args) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    # 5 s of step 4 and 5 s of the save leave the total and their buckets
    assert job["total_time_s"] == pytest.approx(100) and job["excluded_time_s"] == 10
    assert job["productive_time_s"] == pytest.approx(95)
    assert job["badput_s"]["checkpoint_save"] == pytest.approx(5)
    assert job["goodput"] == pytest.approx(0.95)
    # overlapping intervals are merged, and clipped to the job
    assert cli.main(args[:4] + ["--exclude", f"{_iso(30)},{_iso(38)}", "--exclude",
                                f"{_iso(35)},{_iso(200)}"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["excluded_time_s"] == pytest.approx(80) and job["total_time_s"] == 30
    assert job["productive_time_s"] == pytest.approx(30)


def test_report_as_of_a_moment(tmp_path, capsys):
    excluded_job(tmp_path)
    assert cli.main(["report", str(tmp_path), "--format", "json", "--at", _iso(35)]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    # at 35 s: steps 1-3 done, step 4 in flight, the job running
    assert job["total_time_s"] == pytest.approx(35)
    assert job["productive_time_s"] == pytest.approx(35)
    assert [a["end_reason"] for a in job["attempts"]] == ["running"]
    assert job["step_time"]["count"] == 4
    assert cli.main(["report", str(tmp_path), "--format", "json", "--at", _iso(45)]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["badput_s"]["checkpoint_save"] == pytest.approx(5)  # the save, in flight
    assert cli.main(["report", str(tmp_path), "--format", "json", "--at", _iso(500)]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["total_time_s"] == pytest.approx(110)  # after its end: the whole job


@pytest.mark.parametrize(("args", "message"), [
    (["--at", "yesterday"], "--at must be a time"),
    (["--exclude", "5"], "--exclude must be START,END"),
    (["--exclude", "10,5"], "END is not after START"),
    (["--exclude", "2026-01-01T00:00:00,soon"], "--exclude END must be a time"),
    (["--definitions", "resiliency", "--ideal-step-time", "1", "--exclude", "1,2"],
     "not defined for --definitions resiliency"),
])
def test_bad_times_are_named(tmp_path, capsys, args, message):
    excluded_job(tmp_path)
    assert cli.main(["report", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err


def test_iso_times_without_a_zone_are_utc(tmp_path, capsys):
    from goodput_processor.cli import parse_time_ns

    assert parse_time_ns("1970-01-01T00:00:01", "x") == NS
    assert parse_time_ns("1970-01-01T01:00:01+01:00", "x") == NS
    assert parse_time_ns("1.5", "x") == 1_500_000_000 and parse_time_ns("2", "x") == 2 * NS


def test_native_monitor_writes_the_incumbents_series(tmp_path):
    """``goodput_processor.serve.monitor.GoodputMonitor(workload=...)``: each cycle, the
    incumbent's cumulative and rolling-window series of every job (mgm's numbers by
    default), to a loopback Cloud Monitoring."""
    pytest.importorskip("google.cloud.monitoring_v3")
    from fake_metric_services import FakeCloudMonitoring

    from goodput_processor.definitions.mgm import account_mgm
    from goodput_processor.exporters.workload import WorkloadOptions
    from goodput_processor.serve.monitor import GoodputMonitor

    elastic_job().write(tmp_path / "run")
    opts = WorkloadOptions("proj", "europe-west4-a", "0", "TPU-v6e", None, True)
    with FakeCloudMonitoring() as fake:
        mon = GoodputMonitor(tmp_path / "run", windows_s=(60,), workload=opts,
                             workload_client=fake.client())
        assert mon.run_once() and mon.errors == 0
        series = fake.series()
    m = account_mgm(read_run_dir(tmp_path / "run").jobs["job"])
    got = {(t.rsplit("/", 1)[1], labels.get("badput_source") or labels.get("goodput_source")):
           v for t, labels, v in series}
    assert got[("goodput_time", "TOTAL")] == pytest.approx(m.productive_time_s)
    assert got[("badput_time", "ELASTIC_SLICE_DOWN")] == pytest.approx(30)
    assert got[("stepping_slice_efficiency", None)] == pytest.approx(m.slice_efficiency[0])
    assert ("interval_goodput", "TOTAL") in got
    assert {labels.get("rolling_window_size") for t, labels, _ in series
            if t.endswith("interval_goodput")} == {"60"}
    with pytest.raises(ValueError, match="workload_definitions"):
        GoodputMonitor(tmp_path / "run", workload=opts, workload_definitions="other")
    with pytest.raises(ValueError, match="acc_type"):  # every series would be left out
        GoodputMonitor(tmp_path / "run", workload=WorkloadOptions("proj", "europe-west4-a"))
