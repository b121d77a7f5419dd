"""goodput serve writes ml-goodput-measurement's Cloud Monitoring series for every job it
tracks (``--workload-project``), to a loopback ``google.monitoring.v3.MetricService``
(real gRPC, the real request types): the same series the in-process monitor and
``goodput.mgm``'s monitor write, with mgm's numbers."""

from __future__ import annotations

import json

import pytest
from otlp_fixtures import Timeline

pytest.importorskip("google.cloud.monitoring_v3")
pytest.importorskip("grpc")

from fake_metric_services import FakeCloudMonitoring  # noqa: E402

from goodput_processor.cli import main  # noqa: E402
from goodput_processor.definitions.mgm import account_mgm  # noqa: E402
from goodput_processor.exporters.workload import WorkloadOptions  # noqa: E402
from goodput_processor.serve import LiveStore  # noqa: E402
from goodput_processor.serve.gcm import WorkloadPublisher  # noqa: E402


def _store(tmp_path):
    store = LiveStore(min_interval_s=0)
    for job, slow in (("llm-a", 1), ("llm-b", 2)):
        a0 = Timeline(job=job).job_start(0).steps(0, 20, start=2, step_time=slow).write(
            tmp_path / job)
        a1 = (Timeline(job=job, attempt=1).job_start(60).restore(60, 62, step=10)
              .steps(10, 30, start=62, step_time=slow).job_end(110).write(tmp_path / job))
        for path in (a0, a1):
            for line in path.read_bytes().splitlines():
                store.ingest_json(json.loads(line), ("test", 1))
    return store


def test_every_job_gets_the_incumbents_series(tmp_path):
    store = _store(tmp_path)
    opts = WorkloadOptions("proj", "us-central2-b", "0", "TPU-v5p", None)
    with FakeCloudMonitoring() as fake:
        pub = WorkloadPublisher(store, opts, windows_s=(60,), client=fake.client())
        n = pub.publish_once()
        series = fake.resource_series()
    assert n == len(series) > 0 and pub.errors == 0 and pub.sender.errors == 0
    for job in ("llm-a", "llm-b"):
        m = account_mgm(store.snapshot(job))
        got = {(t.rsplit("/", 1)[1], labels.get("badput_source") or labels.get(
            "goodput_source")): v for t, labels, res, v in series
            if res["workload_id"] == job}
        assert got[("goodput_time", "TOTAL")] == pytest.approx(m.productive_time_s)
        assert got[("total_elapsed_time", None)] == pytest.approx(m.total_time_s)
        assert got[("disruptions", None)] == m.disruptions == 1
        assert ("interval_goodput", "TOTAL") in got
    assert all(t.startswith("compute.googleapis.com/workload/") for t, _, _, _ in series)
    assert {(r["location"], r["replica_id"]) for _, _, r, _ in series} == {
        ("us-central2-b", "0")}
    assert {labels.get("accelerator_type") for t, labels, _, _ in series
            if t.endswith("/goodput_time")} == {"TPU-v5p"}


def test_cli_needs_a_location_with_a_project(tmp_path):
    assert main(["serve", "--grpc-port", "off", "--http-port", "0", "--wal-dir", "off",
                 "--workload-project", "proj"]) == 2


def test_cli_needs_an_accelerator_type_with_a_project(tmp_path, capsys):
    """Without the accelerator_type label every series would be left out: a usage error
    that names the option, not a service that writes nothing."""
    assert main(["serve", "--grpc-port", "off", "--http-port", "0", "--wal-dir", "off",
                 "--workload-project", "proj", "--workload-location", "us-central2-b"]) == 2
    assert "--workload-accelerator-type" in capsys.readouterr().err
