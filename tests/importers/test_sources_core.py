"""The sources layer's own contract, with a small source defined here (the real sources
have their own tests, on their tools' real output): registration by entry point,
``goodput import --from``, ``goodput report`` of a directory of a foreign producer's OTLP
JSON (written by the real OTel SDK's OTLP encoder), the ``--job`` override, malformed
records, and the ``source_records_lost`` warning."""

from __future__ import annotations

import base64
import json
import os
import sys

import pytest
from google.protobuf.json_format import MessageToJson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import goodput_processor.importers.sources as sources
from goodput import schema
from goodput_processor.account.accounting import account
from goodput_processor.cli import main
from goodput_processor.importers.sources import Source, Translator
from goodput_processor.read.reader import read_run_dir
from goodput_processor.results.report_json import job_to_dict

S = 1_000_000_000
T0 = 1_700_000_000 * S


class ToyTranslator(Translator):
    """``toy.iteration`` spans (attribute ``toy.iter``) are steps, ``toy.save`` a blocking
    save, ``toy.end`` a clean end; the process is (``toy.job``, ``toy.run``)."""

    def spans(self, resource, scope, spans, where):
        key = f"{resource['toy.job']}/{resource['toy.run']}"
        self.emit.process(key, job=resource["toy.job"], attempt=int(resource["toy.run"]))
        for s in spans:
            if s.name == "toy.iteration":
                if not isinstance(s.attrs.get("toy.iter"), int):
                    self.problems.add(where, "malformed", "toy.iteration without toy.iter")
                    continue
                self.emit.span(key, schema.STEP, s.start_ns, s.end_ns,
                               {schema.ATTR_STEP: s.attrs["toy.iter"]}, span_id=s.span_id)
            elif s.name == "toy.save":
                self.emit.span(key, schema.CHECKPOINT_SAVE, s.start_ns, s.end_ns,
                               {schema.ATTR_CHECKPOINT_STEP: s.attrs["toy.iter"],
                                schema.ATTR_BLOCKING: True})
            elif s.name == "toy.start":
                self.emit.span(key, schema.JOB_START, s.start_ns, s.start_ns)
            elif s.name == "toy.end":
                self.emit.span(key, schema.JOB_END, s.end_ns, s.end_ns,
                               {schema.ATTR_END_REASON: "exit"})
            else:
                self.warn("toy_unknown_span")


def _matches(resource, scope, names):
    return scope == "toy"


TOY = Source("toy", "toy", frozenset({"traces"}), ToyTranslator, matches=_matches,
             doc="sources/README.md", checked="this test", export_delay_ms=5000)


@pytest.fixture
def toy_registered(monkeypatch):
    """The toy source registered next to the built-in ones (the registry's cache)."""
    monkeypatch.setattr(sources, "_cache", {**sources.all_sources(), "toy": TOY})
    yield TOY
    sources._cache = None


def _otlp_json(path, job, runs, malformed=False):
    """Spans of the toy tool, recorded with the real OTel SDK, written as the Collector's
    file exporter writes them (one ExportTraceServiceRequest per line)."""
    lines = []
    for run, (t0, steps, save_at, clean) in enumerate(runs):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"toy.job": job, "toy.run": run}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("toy")
        tracer.start_span("toy.start", start_time=t0).end(end_time=t0)
        t = t0 + S
        for i in steps:
            sp = tracer.start_span("toy.iteration", start_time=t,
                                   attributes={} if malformed and i == steps[0]
                                   else {"toy.iter": i})
            sp.end(end_time=t + S)
            t += S
            if i == save_at:
                tracer.start_span("toy.save", start_time=t, attributes={"toy.iter": i}).end(
                    end_time=t + S // 2)
                t += S // 2
        if clean:
            tracer.start_span("toy.end", start_time=t).end(end_time=t)
        provider.force_flush()
        doc = json.loads(MessageToJson(encode_spans(exporter.get_finished_spans())))
        if run == 0:  # the OTLP JSON encoding (the Collector's): ids as hex, not base64
            for rs in doc["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        for k in ("traceId", "spanId", "parentSpanId"):
                            if sp.get(k):
                                sp[k] = base64.b64decode(sp[k]).hex()
        lines.append(json.dumps(doc))  # run 1 keeps protobuf's JSON mapping: base64 ids
    path.write_text("\n".join(lines) + "\n")
    return path


def _truth_runs():
    # attempt 0: steps 1-6, save after 4, killed; attempt 1 at +20 s: steps 5-9, clean end
    return [(T0, list(range(1, 7)), 4, False), (T0 + 20 * S, list(range(5, 10)), None, True)]


def test_report_reads_a_foreign_otlp_directory_as_import_does(tmp_path, toy_registered):
    src = tmp_path / "collector"
    src.mkdir()
    _otlp_json(src / "traces.json", "toyjob", _truth_runs())
    direct = read_run_dir(src)
    assert main(["import", str(src / "traces.json"), "--to", str(tmp_path / "runs"),
                 "--format", "json"]) == 0
    imported = read_run_dir(tmp_path / "runs" / "toyjob")
    a, b = account(direct.jobs["toyjob"]), account(imported.jobs["toyjob"])
    da, db = job_to_dict(a), job_to_dict(b)
    assert da == db
    assert a.buckets_ns["checkpoint_save"] == S // 2
    assert a.buckets_ns["productive"] == (4 + 5) * S  # steps 1-4 kept, then 5-9
    assert a.buckets_ns["wasted_progress"] == 2 * S  # steps 5, 6 of attempt 0
    codes = [w.code for w in a.warnings]
    assert codes.count("source_records_lost") == 1  # attempt 0 only: attempt 1 ended
    lost = next(w for w in a.warnings if w.code == "source_records_lost")
    assert "5 s" in lost.message and lost.attempt == 0


def test_import_detects_the_source_and_job_override(tmp_path, toy_registered, capsys):
    path = _otlp_json(tmp_path / "t.json", "toyjob", _truth_runs())
    assert main(["import", str(path), "--to", str(tmp_path / "runs"), "--job", "renamed",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "toy" and list(doc["jobs"]) == ["renamed"]
    assert doc["jobs"]["renamed"]["processes"] == 2 and doc["jobs"]["renamed"]["spans"] == 15
    assert doc["next"] == [f"goodput report {tmp_path / 'runs' / 'renamed'}"]


def test_malformed_records_are_skipped_and_counted(tmp_path, toy_registered, capsys):
    path = _otlp_json(tmp_path / "t.json", "toyjob", _truth_runs(), malformed=True)
    with path.open("a") as f:
        f.write('{"resourceSpans": [ not json\n')
    assert main(["import", str(path), "--from", "toy", "--to", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "problems: 3 (malformed 3)" in out
    assert f"{path}:3: malformed: not JSON" in out


def test_unknown_source_lists_the_sources(tmp_path, capsys):
    path = tmp_path / "x.log"
    path.write_text("nothing anyone wrote\n")
    assert main(["import", str(path), "--from", "nosuch", "--to", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown source 'nosuch'" in err and "mgm, resiliency" in err
    assert main(["import", str(path), "--to", str(tmp_path)]) == 2
    assert "no source recognises it" in capsys.readouterr().err


def test_a_third_party_source_registers_by_entry_point(tmp_path, monkeypatch):
    """A distribution that declares ``goodput_processor.sources`` entry points is found by
    importlib.metadata on sys.path, as an installed plugin is."""
    pkg = tmp_path / "site"
    (pkg / "toy_plugin").mkdir(parents=True)
    (pkg / "toy_plugin" / "__init__.py").write_text(
        "from goodput_processor.importers.sources import Source, Translator\n"
        "SOURCE = Source('toyplugin', 'toyplugin', frozenset({'lines'}), Translator,\n"
        "                sniff=lambda head: head.startswith(b'TOYPLUGIN'))\n"
        "BROKEN = 42\n")
    dist = pkg / "toy_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[goodput_processor.sources]\ntoyplugin = toy_plugin:SOURCE\n"
        "notasource = toy_plugin:BROKEN\nmissing = toy_plugin_absent:SOURCE\n")
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.setattr(sources, "_cache", None)
    try:
        found = sources.all_sources()
        assert found["toyplugin"].name == "toyplugin"
        assert "notasource" not in found and "missing" not in found
        log = tmp_path / "a.log"
        log.write_text("TOYPLUGIN v1\n")
        assert sources.detect_file_source(str(log)) == "toyplugin"
    finally:
        sources._cache = None
        sys.modules.pop("toy_plugin", None)


def test_import_beside_another_spool_keeps_it(tmp_path, toy_registered, capsys):
    """A source's files go beside the workers' own spool (a launcher's log imported into
    its workers' job); a second import of the same source is refused, and --overwrite
    replaces that source's files only."""
    path = _otlp_json(tmp_path / "t.json", "toyjob", _truth_runs())
    job_dir = tmp_path / "runs" / "toyjob"
    job_dir.mkdir(parents=True)
    workers = job_dir / "spans-p00000-a0000-4242-abcdef12.jsonl"
    workers.write_text("{}\n")
    args = ["import", str(path), "--to", str(tmp_path / "runs"), "--format", "json"]
    assert main(args) == 0
    capsys.readouterr()
    mine = sorted(p.name for p in job_dir.glob("spans-*-toy-*.jsonl"))
    assert len(mine) == 2 and workers.read_text() == "{}\n"
    assert main(args) == 2
    assert "already holds spans imported from toy" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert sorted(p.name for p in job_dir.glob("spans-*-toy-*.jsonl")) == mine
    assert workers.read_text() == "{}\n"


def test_a_quiet_foreign_directory_is_cached(tmp_path, toy_registered, monkeypatch):
    """The second report of a finished foreign directory reads the columnar cache the first
    wrote, instead of translating again, and gives the same spans."""
    src = tmp_path / "collector"
    src.mkdir()
    path = _otlp_json(src / "traces.json", "toyjob", _truth_runs())
    old = path.stat().st_mtime - 120  # a finished run: quiet for two minutes
    os.utime(path, (old, old))
    first = read_run_dir(src, cache=True)
    assert (src / ".goodput-cache" / "index.json").is_file()
    def no_translation(*_a, **_k):
        raise AssertionError("translated again")

    monkeypatch.setattr(sources, "translate_files", no_translation)
    second = read_run_dir(src, cache=True)
    assert job_to_dict(account(second.jobs["toyjob"])) == job_to_dict(
        account(first.jobs["toyjob"]))
    from goodput_processor.read import result_cache

    file_stats, _params, _kept = result_cache.lookup(src, {"definitions": "goodput"})
    assert [f[0] for f in file_stats] == ["traces.json"]  # the report's result is kept too
