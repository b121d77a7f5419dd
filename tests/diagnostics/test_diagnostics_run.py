"""goodput.diagnostics: ML runs, configs, metrics.record and system metrics, with the real
OpenTelemetry SDK (in-memory readers, the local spools, an OTLP loopback receiver)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)

import goodput
from goodput import api, schema
from goodput.diagnostics import ConfigError, MetricType, current_run, metrics
from goodput.diagnostics import run as diag_run

ROOT = Path(__file__).resolve().parents[2]
run_mod = sys.modules["goodput.diagnostics.run"]
env_mod = sys.modules["goodput.diagnostics.environment"]

ALL_UNITS = {
    "ml.learning_rate": "1", "ml.loss": "1", "ml.gradient_norm": "1",
    "ml.total_weights": "{parameter}", "ml.step_time": "s", "ml.throughput": "{token}/s",
    "ml.latency": "s", "ml.tflops": "{TFLOP}/s", "ml.mfu": "1",
}


# --- helpers ---------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def clean(monkeypatch):
    """No recorder or run before and after each test; no orchestrator in the environment."""
    for var in ("OTEL_METRICS_EXPORTER", "OTEL_METRIC_EXPORT_INTERVAL", "LOCAL_RANK",
                "OTEL_SERVICE_NAME", "GOODPUT_JOB_NAME", "GOODPUT_RUN_DIR", "GOODPUT_ATTEMPT",
                "RANK", "WORLD_SIZE", "GOODPUT_PROCESS_INDEX", "GOODPUT_PROCESS_COUNT",
                "TORCHELASTIC_RESTART_COUNT", "XLA_FLAGS", "LIBTPU_INIT_ARGS"):
        monkeypatch.delenv(var, raising=False)
    for var in list(os.environ):
        if var.startswith(("SLURM_", "KUBERNETES_", "LWS_", "JOBSET_", "TPU_", "MEGASCALE_")):
            monkeypatch.delenv(var)
    assert api._RECORDER is None and current_run() is None
    yield
    r = current_run()
    if r is not None:
        r.end()
    goodput.shutdown()


def start(tmp_path, name="run-a", **kw):
    """A run with its own recorder (fast flushes) and an in-memory metric reader."""
    reader = kw.pop("reader", None) or InMemoryMetricReader()
    kw.setdefault("metric_readers", [reader])
    kw.setdefault("system_metrics", False)
    r = diag_run(name, run_dir=tmp_path / "run", flush_interval_s=0.05, handle_signals=False,
                 start_time=time.time(), **kw)
    return r, reader


def spans(run_dir) -> list[dict]:
    """Spans of the span spool files (not the metrics spool), with resource attributes."""
    out = []
    for path in sorted(Path(run_dir).glob("spans-*.jsonl")):
        for line in path.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                res = {a["key"]: _val(a["value"]) for a in rs["resource"]["attributes"]}
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        attrs = {a["key"]: _val(a["value"]) for a in span.get("attributes", [])}
                        out.append({**span, "attrs": attrs, "res": res})
    return out


def _val(v: dict):
    (kind, value), = v.items()
    return int(value) if kind == "intValue" else value


def points(reader) -> dict:
    """``{metric name: [(attributes, value, unit, resource attributes), ...]}``."""
    out: dict = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    out.setdefault(m.name, []).append(
                        (dict(p.attributes), p.value, m.unit, dict(rm.resource.attributes)))
    return out


def run_config_spans(run_dir, kind=None) -> list[dict]:
    found = [s for s in spans(run_dir) if s["name"] == schema.RUN_CONFIG]
    return [s for s in found if kind is None or s["attrs"]["ml.run.config.kind"] == kind]


def python(code: str, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "JAX_PLATFORMS": "cpu", **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=full, cwd=str(ROOT))


# --- the run and its attributes -----------------------------------------------------------

def test_run_attributes_on_spans_and_metric_resource(tmp_path):
    r, reader = start(tmp_path, run_group="sweep", configs={"lr": 3e-4, "model": {"layers": 4}},
                      flops_per_step=6e12, peak_flops_per_device=9.89e14, device_count=8)
    assert current_run() is r and r.recorder is api._RECORDER
    assert (r.name, r.run_group, r.job_name, r.attempt) == ("run-a", "sweep", "run-a", 0)
    assert (r.process_index, r.process_count) == (0, 1)
    assert r.profile_dir == os.path.join(str(tmp_path / "run"), "profiles")
    assert r.session_prefix == "run-a-a0"
    metrics.record(MetricType.LOSS, 0.5, step=3)
    goodput.flush()
    res = spans(tmp_path / "run")[0]["res"]
    assert res["ml.run.name"] == "run-a" and res["ml.run.group"] == "sweep"
    assert res["ml.config.lr"] == 3e-4 and res["ml.config.model.layers"] == 4
    assert res[schema.RES_FLOPS_PER_STEP] == 6_000_000_000_000
    assert res[schema.RES_PEAK_FLOPS] == 989_000_000_000_000
    assert res[schema.RES_DEVICE_COUNT] == 8
    assert res["ml.orchestrator"] == "none"
    assert res["process.runtime.version"] == ".".join(map(str, sys.version_info[:3]))
    assert res["ml.software.jax"] and res["ml.software.torch"]
    (cfg,) = run_config_spans(tmp_path / "run", "run")
    doc = json.loads(cfg["attrs"]["ml.run.config"])
    assert doc["configs"] == {"lr": 3e-4, "model": {"layers": 4}}
    assert doc["run"] == {"name": "run-a", "group": "sweep", "job": "run-a", "attempt": 0,
                          "process_index": 0, "process_count": 1}
    assert cfg["startTimeUnixNano"] == cfg["endTimeUnixNano"]
    # the metric resource is the spans' resource (same process instance), run attributes too
    (_, value, unit, mres), = points(reader)["ml.loss"]
    assert (value, unit) == (0.5, "1")
    for key in ("service.instance.id", "goodput.job.name", "goodput.attempt",
                "goodput.process.index", "ml.run.name", "ml.config.lr", "ml.flops_per_step"):
        assert mres[key] == res[key], key
    r.end()
    assert current_run() is None and api._RECORDER is None  # the run owned the recorder
    assert schema.JOB_END in [s["name"] for s in spans(tmp_path / "run")]


def test_configs_from_yaml_and_json_files(tmp_path):
    y = tmp_path / "config.yaml"
    y.write_text("lr: 0.001\nmodel:\n  name: llama\n  layers: [1, 2]\n")
    assert run_mod.load_configs(y) == {"lr": 0.001, "model": {"name": "llama", "layers": [1, 2]}}
    j = tmp_path / "config.json"
    j.write_text(json.dumps({"batch": 32, "opt": {"name": "adam"}}))
    r, _ = start(tmp_path, configs=str(j))
    assert r.configs == {"batch": 32, "opt": {"name": "adam"}}
    assert r.resource_attributes["ml.config.opt.name"] == "adam"
    r.end()
    r, _ = start(tmp_path, configs=y)
    assert r.resource_attributes["ml.config.model.layers"] == "[1, 2]"  # lists: JSON
    assert r.resource_attributes["ml.config.model.name"] == "llama"
    r.end()
    other = tmp_path / "config.cfg"  # unknown suffix: JSON, else YAML
    other.write_text("a: 1\n")
    assert run_mod.load_configs(other) == {"a": 1}


@pytest.mark.parametrize("name,content,match", [
    ("missing.yaml", None, "cannot be read"),
    ("bad.yaml", "a: [1, 2\n", "not valid YAML"),
    ("bad.json", "{\"a\": ", "not valid JSON"),
    ("list.yaml", "- 1\n- 2\n", "holds a list, not a mapping"),
    ("scalar.json", "3", "holds a int, not a mapping"),
    ("empty.yaml", "", "is empty"),
])
def test_bad_config_files_name_the_file(tmp_path, name, content, match):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=match) as info:
        start(tmp_path, configs=path)
    assert str(path) in str(info.value)
    assert api._RECORDER is None and current_run() is None  # nothing configured


def test_bad_arguments(tmp_path):
    with pytest.raises(ConfigError, match="mapping or the path"):
        start(tmp_path, configs=[1, 2])
    for kw in ({"flops_per_step": -1}, {"device_count": 0}, {"peak_flops_per_device": "x"},
               {"metric_export_interval_s": 0}):
        with pytest.raises(ValueError):
            start(tmp_path, **kw)
    with pytest.raises(ValueError, match="non-empty"):
        start(tmp_path, name=" ")
    assert api._RECORDER is None


def test_long_configs_truncated_in_attributes_complete_in_record(tmp_path):
    configs = {f"k{i:03d}": i for i in range(100)}
    configs["k000"] = "é" * 300  # 600 UTF-8 bytes
    r, _ = start(tmp_path, configs=configs)
    flat = {k: v for k, v in r.resource_attributes.items() if k.startswith("ml.config.")}
    assert len(flat) == 64 and "ml.config.k063" in flat and "ml.config.k064" not in flat
    assert flat["ml.config.k000"] == "é" * 128 and len(flat["ml.config.k000"].encode()) == 256
    goodput.flush()
    (cfg,) = run_config_spans(tmp_path / "run", "run")
    assert cfg["attrs"]["ml.run.config.dropped"] == 36
    assert json.loads(cfg["attrs"]["ml.run.config"])["configs"] == configs
    assert len([k for k in cfg["res"] if k.startswith("ml.config.")]) == 64


def test_kubernetes_detection(monkeypatch, tmp_path):
    ns = tmp_path / "namespace"
    ns.write_text("ml-team\n")
    monkeypatch.setattr(env_mod, "K8S_NAMESPACE_FILE", str(ns))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("HOSTNAME", "train-workers-0-3-abcde")
    monkeypatch.setenv("JOBSET_NAME", "train")
    monkeypatch.setenv("REPLICATED_JOB_NAME", "workers")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "3")
    monkeypatch.setenv("LWS_WORKER_INDEX", "2")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5p-128")
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "2")
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x " + "y" * 400)
    attrs = env_mod.collect()
    assert attrs["ml.orchestrator"] == "kubernetes"
    assert attrs["k8s.pod.name"] == "train-workers-0-3-abcde"
    assert attrs["k8s.namespace.name"] == "ml-team"
    assert attrs["ml.k8s.jobset.name"] == "train"
    assert attrs["ml.k8s.jobset.replicated_job.name"] == "workers"
    assert attrs["ml.k8s.job.completion_index"] == 3 and attrs["ml.k8s.lws.worker_index"] == 2
    assert attrs["ml.tpu.accelerator_type"] == "v5p-128" and attrs["ml.slice.count"] == 2
    assert attrs["ml.xla_flags"].startswith("--xla_dump_to") and len(attrs["ml.xla_flags"]) == 256
    monkeypatch.setenv("POD_NAME", "explicit-pod")
    monkeypatch.setenv("POD_NAMESPACE", "other-ns")
    attrs = env_mod.collect()
    assert attrs["k8s.pod.name"] == "explicit-pod" and attrs["k8s.namespace.name"] == "other-ns"
    r, _ = start(tmp_path)  # and onto the resource
    goodput.flush()
    assert spans(tmp_path / "run")[0]["res"]["k8s.pod.name"] == "explicit-pod"


def test_slurm_detection(monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # Slurm wins (Slinky)
    for var, value in {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "llama", "SLURM_NODEID": "1",
                       "SLURM_PROCID": "9", "SLURM_NNODES": "4", "SLURM_NTASKS": "32",
                       "SLURM_LOCALID": "1"}.items():
        monkeypatch.setenv(var, value)
    attrs = env_mod.collect()
    assert attrs["ml.orchestrator"] == "slurm"
    assert attrs["ml.slurm.job.id"] == "4242" and attrs["ml.slurm.job.name"] == "llama"
    assert (attrs["ml.slurm.node.id"], attrs["ml.slurm.proc.id"], attrs["ml.slurm.nnodes"],
            attrs["ml.slurm.ntasks"]) == (1, 9, 4, 32)
    assert "k8s.pod.name" not in attrs
    assert env_mod.is_local_leader() is False  # SLURM_LOCALID=1
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert env_mod.orchestrator() == {"ml.orchestrator": "none"}


def test_no_framework_imported_and_jax_backend_left_alone(tmp_path):
    p = python(f"""
        import sys
        from goodput import diagnostics
        from goodput.diagnostics import metrics
        r = diagnostics.run("nofw", run_dir={str(tmp_path / 'a')!r}, handle_signals=False,
                            metric_export_interval_s=0.05)
        metrics.record("loss", 1.0, step=1)
        r.end()
        bad = [m for m in ("jax", "jaxlib", "torch", "tensorflow", "lightning", "transformers",
                           "orbax", "flax", "keras", "yaml")
               if m in sys.modules]
        assert not bad, bad
        assert r.resource_attributes["ml.software.jax"]
        print("ok")
    """)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
    # jax imported by the user but not initialised: still not initialised after the run;
    # once the user initialised it, the run end writes the devices record from JAX
    p = python(f"""
        import jax
        from jax._src import xla_bridge
        from goodput import diagnostics
        from goodput.diagnostics import metrics
        r = diagnostics.run("jaxrun", run_dir={str(tmp_path / 'b')!r}, handle_signals=False)
        metrics.record("loss", 1.0, step=1)
        import time; time.sleep(0.3)
        assert not xla_bridge.backends_are_initialized()
        assert r.devices == {{}}, r.devices
        jax.devices()      # the user's initialisation
        r.end()
        print(r.devices)
    """)
    assert p.returncode == 0, p.stderr
    (dev,) = run_config_spans(tmp_path / "b", "devices")
    assert dev["attrs"]["ml.framework"] == "jax" and dev["attrs"]["ml.device.source"] == "jax"
    assert dev["attrs"]["ml.device.kind"] == "cpu" and dev["attrs"]["ml.device.count"] >= 1
    assert json.loads(dev["attrs"]["ml.run.config"])["ml.device.platform"] == "cpu"


def test_import_is_lazy():
    p = python("""
        import sys
        import goodput
        assert "goodput.diagnostics" not in sys.modules
        import goodput.diagnostics
        bad = [m for m in ("yaml", "pynvml", "goodput.diagnostics.system",
                           "goodput.diagnostics.profile") if m in sys.modules]
        assert not bad, bad
        print("ok")
    """)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr


def test_existing_recorder_is_kept(tmp_path, caplog):
    rec = goodput.configure("outer-job", run_dir=tmp_path / "run", flush_interval_s=0.05,
                            handle_signals=False, start_time=time.time())
    with caplog.at_level(logging.INFO, logger="goodput.diagnostics.run"):
        r = diag_run("inner-run", configs={"lr": 0.1}, metric_readers=[InMemoryMetricReader()],
                     system_metrics=False, run_dir=tmp_path / "elsewhere")
    assert api._RECORDER is rec and r.recorder is rec and r.job_name == "outer-job"
    assert "already configured" in caplog.text and "run_dir" in caplog.text
    goodput.flush()
    got = spans(tmp_path / "run")
    assert [s["name"] for s in got].count(schema.JOB_START) == 1
    assert schema.JOB_END not in [s["name"] for s in got]  # the attempt was not ended
    (cfg,) = run_config_spans(tmp_path / "run", "run")
    assert "ml.run.name" not in cfg["res"]  # not on the resource ...
    assert cfg["attrs"]["ml.run.name"] == "inner-run"  # ... but on the record
    assert cfg["attrs"]["ml.config.lr"] == 0.1
    r.end()
    assert api._RECORDER is rec  # not ours to end
    assert not (tmp_path / "elsewhere").exists()


def test_context_manager_and_exception(tmp_path):
    with pytest.raises(RuntimeError):
        with start(tmp_path)[0] as r:
            assert current_run() is r
            raise RuntimeError("boom")
    assert current_run() is None and api._RECORDER is None
    end = [s for s in spans(tmp_path / "run") if s["name"] == schema.JOB_END]
    assert end[0]["attrs"][schema.ATTR_END_REASON] == "exception"


def test_second_run_ends_the_first(tmp_path):
    r1, _ = start(tmp_path, name="one")
    r2 = diag_run("two", metric_readers=[InMemoryMetricReader()], system_metrics=False,
                  run_dir=tmp_path / "run2", handle_signals=False)
    assert current_run() is r2 and r1._ended
    r2.end()
    r2.end()  # twice is fine


# --- metrics.record ---------------------------------------------------------------------

def test_every_metric_type_with_its_unit(tmp_path):
    r, reader = start(tmp_path)
    for i, m in enumerate(MetricType):
        metrics.record(m, float(i) + 0.5, step=7)
    got = points(reader)
    assert {m.value: m.unit for m in MetricType} == ALL_UNITS
    for i, m in enumerate(MetricType):
        (_, value, unit, _), = got[m.value]
        assert (value, unit) == (i + 0.5, ALL_UNITS[m.value])
    assert got["ml.step"][0][1:3] == (7, "{step}")
    assert str(MetricType.LOSS) == "ml.loss" and MetricType.MFU.description


def test_user_defined_names_and_step_gauge(tmp_path):
    import numpy as np

    r, reader = start(tmp_path)
    metrics.record("tokens_seen", 10, step=1, unit="{token}")
    metrics.record("Eval Accuracy", 0.75, step=np.int64(2))
    metrics.record("loss", np.float32(0.25))  # the predefined ml.loss
    metrics.record("ml.custom/rate", 3)
    got = points(reader)
    assert got["ml.tokens_seen"][0][1:3] == (10, "{token}")
    assert got["ml.eval_accuracy"][0][1:3] == (0.75, "1")
    assert got["ml.loss"][0][1] == 0.25
    assert got["ml.custom/rate"][0][1] == 3
    assert got["ml.step"][0][1] == 2
    metrics.record("tokens_seen", 20, step=5)
    metrics.record("tokens_seen", 30, step=6)  # only the latest per export
    got = points(reader)
    assert got["ml.tokens_seen"][0][1] == 30 and got["ml.step"][0][1] == 6
    assert metrics.metric_name("Tokens Seen!") == "ml.tokens_seen"
    assert metrics.metric_name("7up") == "ml._7up"
    for bad in ("step", "ml.step", "ml.metrics.x", "", "   ", 3, None, "x" * 300):
        assert metrics.metric_name(bad) is None, bad
    assert r.stats()["recorded"] == 6


def test_bad_values_never_raise(tmp_path, caplog):
    class Exploding:
        def __float__(self):
            raise RuntimeError("device array deleted")

    r, reader = start(tmp_path)
    with caplog.at_level(logging.WARNING, logger="goodput.diagnostics.metrics"):
        metrics.record("loss", 1.0, step=1)
        metrics.record("loss", float("nan"), step=2)
        metrics.record("loss", float("inf"))
        metrics.record("loss", float("nan"))
        metrics.record("loss", "0.3")
        metrics.record("loss", None)
        metrics.record("loss", True)
        metrics.record("grad", 2.0, step=-1)
        metrics.record("grad", 2.0, step="x")
        metrics.record(3, 1.0)
        metrics.record("step", 1.0)
        metrics.record("weird", Exploding())
        metrics.record(MetricType.LOSS, 0.9, unit="s")  # predefined unit kept
        got = points(reader)
    st = r.stats()
    assert (st["nonfinite"], st["bad_value"], st["bad_step"], st["bad_name"]) == (3, 4, 2, 2)
    assert st["unit_conflict"] == 1
    assert got["ml.loss"][0][1:3] == (0.9, "1")  # the last finite value
    assert "ml.weird" not in got  # conversion failed on the export thread: dropped
    nonfinite = {a["ml.metric.name"]: v for a, v, _, _ in got["ml.metrics.nonfinite"]}
    assert nonfinite == {"ml.loss": 3}
    assert got["ml.step"][0][1] == 1  # neither bad steps nor dropped values move it
    assert caplog.text.count("ml.loss is nan at step 2") == 1  # logged once


def test_record_without_a_run_is_harmless(caplog):
    with caplog.at_level(logging.WARNING):
        metrics.record("loss", 1.0)
        metrics.record("loss", 2.0)
    assert caplog.text.count("no active run") <= 1


def test_only_process_zero_records_unless_all_processes(tmp_path):
    r, reader = start(tmp_path, process_index=1, process_count=2)
    metrics.record("loss", 1.0, step=1)
    assert "ml.loss" not in points(reader) and "ml.step" not in points(reader)
    r.end()
    r, reader = start(tmp_path, process_index=1, process_count=2, all_processes=True)
    metrics.record("loss", 1.0, step=1)
    (_, value, _, res), = points(reader)["ml.loss"]
    assert value == 1.0 and res["goodput.process.index"] == 1


def test_metrics_spool_is_otlp_json_and_report_still_works(tmp_path):
    from google.protobuf import json_format
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    r, _ = start(tmp_path, metric_readers=[], metric_export_interval_s=0.05,
                 system_metrics=True, configs={"lr": 0.1})
    for n in range(5):
        with goodput.step(n):
            metrics.record(MetricType.LOSS, 1.0 / (n + 1), step=n)
            metrics.record("throughput_samples", 100 + n, unit="{sample}/s")
            time.sleep(0.02)
    metrics.record("loss", float("nan"))
    r.end()
    files = sorted(p.name for p in (tmp_path / "run").iterdir()  # (and the spans' .gz)
                   if p.name.endswith(".jsonl"))
    assert [f.split("-")[:3] for f in files] == [["metrics", "p00000", "a0000"],
                                                 ["spans", "p00000", "a0000"]]
    assert files[0] == f"metrics-p00000-a0000-{os.getpid()}.jsonl"
    names = set()
    for line in (tmp_path / "run" / files[0]).read_text().splitlines():
        req = json_format.Parse(line, ExportMetricsServiceRequest())  # strict OTLP JSON
        for rm in req.resource_metrics:
            res = {kv.key for kv in rm.resource.attributes}
            assert {"ml.run.name", "goodput.job.name", "ml.config.lr"} <= res
            names |= {m.name for sm in rm.scope_metrics for m in sm.metrics}
    assert {"ml.loss", "ml.step", "ml.throughput_samples", "ml.metrics.nonfinite",
            "system.cpu.utilization", "process.memory.usage"} <= names
    # `goodput report RUN_DIR` (a real subprocess) reads past the metrics spool
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                        str(ROOT / "collectors")])}
    p = subprocess.run([sys.executable, "-m", "goodput_processor.cli", "report",
                        str(tmp_path / "run"), "--format", "json"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    (job,) = json.loads(p.stdout)["jobs"]
    assert job["run"]["ml.run.name"] == "run-a"


def test_otlp_loopback_via_environment(tmp_path, monkeypatch):
    from fake_metric_services import FakeOtlpMetrics

    with FakeOtlpMetrics() as fake:
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp,nonexistent")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"http://{fake.address}")
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600000")  # only at the end
        r = diag_run("otlp-run", run_group="g", run_dir=tmp_path / "run", handle_signals=False,
                     system_metrics=False)
        metrics.record(MetricType.STEP_TIME, 0.25, step=4)
        r.end()
        assert fake.wait_for(lambda reqs: len(reqs) >= 1)
    got = {n: v for n, _, v in fake.points()}
    assert got["ml.step_time"] == 0.25 and got["ml.step"] == 4
    res = {kv.key: kv.value.string_value
           for kv in fake.requests[0].resource_metrics[0].resource.attributes}
    assert res["ml.run.name"] == "otlp-run" and res["ml.run.group"] == "g"
    assert res["service.name"] == "otlp-run"
    assert (tmp_path / "run" / f"metrics-p00000-a0000-{os.getpid()}.jsonl").exists()  # spool


def test_export_interval_from_environment(monkeypatch):
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "2500")
    assert metrics.export_interval_s(None) == 2.5
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "soon")
    assert metrics.export_interval_s(None) == metrics.DEFAULT_EXPORT_INTERVAL_S
    assert metrics.export_interval_s(0.5) == 0.5
    for bad in (0, -1, float("nan"), True, "1"):
        with pytest.raises(ValueError):
            metrics.export_interval_s(bad)


def test_end_is_bounded_with_a_stuck_exporter(tmp_path):
    class Stuck(MetricExporter):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def export(self, metrics_data, timeout_millis=10_000, **kw):
            self.calls += 1
            time.sleep(30)
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis=10_000):
            return True

        def shutdown(self, timeout_millis=30_000, **kw):
            pass

    stuck = Stuck()
    reader = PeriodicExportingMetricReader(stuck, export_interval_millis=3_600_000)
    r, _ = start(tmp_path, reader=reader, metric_readers=[reader])
    metrics.record("loss", 1.0)
    t0 = time.monotonic()
    r.end(timeout_s=0.5)
    # bounded: it did not wait for the 30 s export (a wide margin on a shared machine)
    assert time.monotonic() - t0 < 15 and stuck.calls >= 1
    assert api._RECORDER is None


def test_on_demand_profile_is_enabled_and_disabled(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("goodput.diagnostics.ondemand")
    fake.enable = lambda run: calls.append(("enable", run))
    fake.disable = lambda run: calls.append(("disable", run))
    monkeypatch.setitem(sys.modules, "goodput.diagnostics.ondemand", fake)
    r, _ = start(tmp_path, on_demand_profile=True)
    r.end()
    assert calls == [("enable", r), ("disable", r)]


def test_on_demand_profile_with_the_real_module(tmp_path):
    try:
        from goodput.diagnostics import ondemand  # written separately
    except ImportError:
        pytest.skip("goodput.diagnostics.ondemand not available")
    assert callable(ondemand.enable)


# --- system metrics -----------------------------------------------------------------------

def test_host_metrics_and_no_gpu_here(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        r, reader = start(tmp_path, system_metrics=True)
        time.sleep(0.05)
        got = points(reader)
    assert 0.0 <= got["system.cpu.utilization"][0][1] <= 1.0
    assert got["system.cpu.utilization"][0][2] == "1"
    (attrs, used, unit, _), = got["system.memory.usage"]
    (_, total, _, _), = got["system.memory.limit"]
    assert attrs == {"system.memory.state": "used"} and unit == "By" and 0 < used <= total
    assert 0 < got["system.memory.utilization"][0][1] <= 1
    assert got["process.memory.usage"][0][1] > 10_000_000  # RSS of a Python process
    if not _nvml_gpus():
        assert r.system.gpus == 0 and not [n for n in got if n.startswith("hw.")]
    assert r.stats()["system_errors"] == 0
    assert not [rec for rec in caplog.records if rec.name.startswith("goodput.diagnostics")]


def test_system_metrics_only_on_local_rank_zero(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    r, reader = start(tmp_path, system_metrics=True)
    assert r.system is None and "system.cpu.utilization" not in points(reader)


class _FakeNvml(types.ModuleType):
    """Two fake GPUs; the second one's power reading fails."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self):
        super().__init__("pynvml")
        self.shutdowns = 0

    def nvmlInit(self):  # noqa: N802 - NVML's names
        pass

    def nvmlShutdown(self):  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return i

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return f"GPU-{h}"

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return b"NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return types.SimpleNamespace(gpu=40 + h, memory=10)

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return types.SimpleNamespace(used=(h + 1) * 2**30, total=8 * 2**30, free=0)

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802
        if h == 1:
            raise self.NVMLError("not supported")
        return 350_500

    def nvmlDeviceGetTemperature(self, h, sensor):  # noqa: N802
        return 60 + h


def test_gpu_metrics_with_a_fake_nvml(tmp_path, monkeypatch):
    nvml = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    r, reader = start(tmp_path, system_metrics=True)
    assert r.system.gpus == 2
    got = points(reader)
    util = {a["hw.id"]: (v, a) for a, v, _, _ in got["hw.gpu.utilization"]}
    assert util["GPU-0"][0] == pytest.approx(0.40) and util["GPU-1"][0] == pytest.approx(0.41)
    assert util["GPU-0"][1] == {"hw.id": "GPU-0", "hw.type": "gpu", "hw.vendor": "NVIDIA",
                                "hw.name": "gpu0", "hw.model": "NVIDIA H200",
                                "hw.gpu.task": "general"}
    mem = {a["hw.id"]: (v, u) for a, v, u, _ in got["hw.gpu.memory.usage"]}
    assert mem["GPU-1"] == (2 * 2**30, "By")
    assert {a["hw.id"]: v for a, v, _, _ in got["hw.gpu.memory.limit"]}["GPU-0"] == 8 * 2**30
    assert {a["hw.id"]: v for a, v, _, _ in got["hw.gpu.memory.utilization"]}["GPU-1"] == 0.25
    power = {a["hw.id"]: (v, u) for a, v, u, _ in got["hw.power"]}
    assert power == {"GPU-0": (350.5, "W")}  # GPU-1's failure is left out and counted
    temp = {a["hw.id"]: (v, u) for a, v, u, _ in got["hw.temperature"]}
    assert temp == {"GPU-0": (60, "Cel"), "GPU-1": (61, "Cel")}
    assert r.stats()["system_errors"] == 1
    r.end()
    assert nvml.shutdowns >= 1


def _nvml_gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


@pytest.mark.skipif(not _nvml_gpus(), reason="no NVML library or no NVIDIA GPU")
def test_gpu_metrics_for_real(tmp_path):
    r, reader = start(tmp_path, system_metrics=True)
    n = _nvml_gpus()
    assert r.system.gpus == n
    got = points(reader)
    for name in ("hw.gpu.utilization", "hw.gpu.memory.usage", "hw.gpu.memory.limit",
                 "hw.gpu.memory.utilization", "hw.temperature"):
        assert len(got[name]) == n, name
    assert all(0 <= v <= 1 for _, v, _, _ in got["hw.gpu.utilization"])
    assert all(v > 2**30 for _, v, _, _ in got["hw.gpu.memory.limit"])
    assert all(0 < v < 120 for _, v, _, _ in got["hw.temperature"])
    assert all(a["hw.id"].startswith("GPU-") for a, _, _, _ in got["hw.gpu.utilization"])
    assert all(0 < v < 2000 for _, v, _, _ in got.get("hw.power", []))
    metrics.record("loss", 1.0)
    r.end()
    (dev,) = run_config_spans(tmp_path / "run", "devices")
    if dev["attrs"]["ml.device.source"] == "nvml":  # JAX/torch answer first when initialised
        assert dev["attrs"]["ml.device.local_count"] == n
        assert dev["attrs"]["ml.device.kind"].startswith("NVIDIA")


def test_device_probe_asks_only_initialised_frameworks(monkeypatch):
    monkeypatch.delitem(sys.modules, "jax", raising=False)  # as if JAX were not imported
    monkeypatch.setitem(sys.modules, "pynvml", None)  # and NVML missing: import fails
    cuda = types.SimpleNamespace(initialized=False, is_initialized=lambda: cuda.initialized,
                                 device_count=lambda: 4, get_device_name=lambda i: "NVIDIA H100")
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert env_mod.devices() == {}
    cuda.initialized = True
    assert env_mod.devices() == {"ml.framework": "torch", "ml.device.local_count": 4,
                                 "ml.device.platform": "gpu", "ml.device.kind": "NVIDIA H100",
                                 "ml.device.source": "torch"}
    cuda.device_count = lambda: 1 / 0  # a failing source is skipped, never raised
    assert env_mod.devices() == {}
