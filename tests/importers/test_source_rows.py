"""The sources' spans read into rows straight (:mod:`goodput_processor.read.emitted`) give
what reading their OTLP JSON gives: the same rows, strings, trace ids, skips and process
attributes, on the kept real output of every tool under ``tests/data/sources/`` and on
spans that are not clean (which go the OTLP JSON way); and the files' lines read as bytes
(:func:`~goodput_processor.importers.sources.driver._lines`) are the lines a text file in
UTF-8 with ``errors="replace"`` and universal newlines gives."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from goodput import schema
from goodput_processor.importers.sources import detect_file_source, get_source, translate_files
from goodput_processor.importers.sources.base import Emitter
from goodput_processor.importers.sources.driver import _lines
from goodput_processor.read.emitted import ingest_emitted
from goodput_processor.read.reader import _Reader

DATA = Path(__file__).resolve().parents[1] / "data" / "sources"
FILES = sorted(p for p in DATA.rglob("*") if p.is_file() and p.suffix in (
    ".jsonl", ".json", ".log", ".gz") and not p.name.startswith(("driver", "truth"))
    and not p.name.endswith(".tar.gz"))


def _state(reader: _Reader) -> dict:
    """Everything a report reads of ``reader``."""
    return {"strings": list(reader.strings), "trace_ids": dict(reader._trace_ids),
            "skipped": dict(reader.skipped),
            "jobs": {name: (dict(job.skipped), dict(job.over_limit), {
                key: (p._buf.tobytes(), p.host, p.pid, p.process_start_ns, p.process_count,
                      dict(p.run), p.schema_version, p.attempt_source, p.index_source)
                for key, p in job.processes.items()}) for name, job in reader.jobs.items()}}


def _both(batches, **limits) -> tuple[dict, dict]:
    """(rows straight, rows of the OTLP JSON) of the same batches."""
    straight, via_json = _Reader(**limits), _Reader(**limits)
    for b in batches:
        ingest_emitted(straight, b, ("test", "rows"))
        via_json._request({"resourceSpans": [b.resource_spans()]}, ("test", "json"))
    return _state(straight), _state(via_json)


def test_kept_outputs_cover_every_tool():
    found = {detect_file_source(str(p)) for p in FILES}
    assert {"megatron", "onelogger", "torchft", "torchtitan", "megatron-log",
            "maxtext-log", "nvrx"} <= found


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DATA)))
def test_real_output_rows_equal_the_otlp_json_rows(path):
    name = detect_file_source(str(path))
    if name is None:
        pytest.skip(f"no source takes {path.name}")
    run = translate_files(get_source(name), [path], batches=True)
    assert run.resource_spans, f"{path}: no spans"
    a, b = _both(run.resource_spans)
    assert a == b
    assert a["jobs"]
    # and the OTLP JSON the batches give is what translate_files gives without batches
    again = translate_files(get_source(name), [path])
    assert [x.resource_spans() for x in run.resource_spans] == again.resource_spans


def _unclean() -> list:
    em = Emitter("test")
    em.process("p", job="j", rank=0, pid=7, extra={"ml.run.name": "r"})
    em.process("q", job="j", rank=1)
    good = {schema.ATTR_STEP: 3}
    em.span("p", schema.STEP, 10, 20, good)
    em.span("p", schema.CUSTOM_BADPUT, 20, 30, {schema.ATTR_BADPUT_TYPE: "eval"})
    em.span("p", schema.CUSTOM_BADPUT, 30, 40, {schema.ATTR_BADPUT_TYPE: "sdc"})
    em.span("p", schema.CHECKPOINT_SAVE, 40, 50, {schema.ATTR_BLOCKING: False,
                                                  schema.ATTR_CHECKPOINT_STEP: 3},
            error=True)
    em.span("p", "goodput.not_a_kind", 50, 60)
    em.span("p", schema.STRUCTURE[0], 50, 60)
    em.span("p", schema.STEP, 60, 70, {schema.ATTR_STEP: 4}, span_id="FFFFFFFFFFFFFFFF")
    em.span("q", schema.STEP, 10, 20, good, span_id="zzzzzzzzzzzzzzzz")  # not hex
    em.span("q", schema.STEP, 20, 30, {schema.ATTR_STEP: True})  # a bool in an int slot
    em.span("q", schema.STEP, 30, 40, {schema.ATTR_STEP: 1 << 63})  # out of int64
    em.span("q", schema.STEP, 40, 50, {schema.ATTR_STEP: 5, schema.ATTR_BLOCKING: "false"})
    em.span("q", schema.STEP, -5, 50, {schema.ATTR_STEP: 6})  # a negative time
    return em.take_batches()


@pytest.mark.parametrize("limits", [{}, {"max_string": 2, "max_custom_types": 1}])
def test_spans_not_clean_give_what_their_otlp_json_gives(limits):
    batches = _unclean()
    a, b = _both(batches, **limits)
    assert a == b
    procs = a["jobs"]["j"][2]
    assert len(procs) == 2
    if limits:
        assert a["jobs"]["j"][1].get("custom_types") == 1  # "sdc" over the limit


@pytest.mark.parametrize("gz", [False, True])
def test_lines_as_a_text_file_reads_them(tmp_path, gz):
    data = (b'{"resourceSpans":[]}\r\nplain \xe2\x82 torn utf-8\nlone\rcarriage\r\n'
            b'\xff\xfe{"a": 1}\n\n  \nend without newline\r')
    path = tmp_path / ("f.gz" if gz else "f")
    path.write_bytes(gzip.compress(data) if gz else data)
    opener = (lambda: gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="")
              ) if gz else (lambda: open(path, encoding="utf-8", errors="replace", newline=""))
    with opener() as f:
        want = [line.rstrip("\r\n") for line in f]
    with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
        got = [(body, text("utf-8", "replace")) for body, text in _lines(f)]
    assert [t for _, t in got] == want
    for body, t in got:
        assert body is None or body.decode("utf-8", "replace") == t
