"""The template scan of the Collector's OTLP JSON lines
(:mod:`goodput_processor.read.foreign_template`, with the ``megatron`` translator's
:meth:`~goodput_processor.importers.sources.megatron_json.CollectorJson.spans_taken`: what
``goodput report`` of a foreign directory uses) gives what parsing every line gives: the
same goodput spans, problems (counts and examples), warnings and records read, and the same
rows in the reader, on the real run's file and on lines of iteration spans of many shapes:
written as ``orjson`` or ``json.dumps`` writes them, step numbers crossing a power of ten,
one span of another shape first, amid or last in a line, lines the scan must leave whole
(a backslash, a duplicate key, a list of another resource), an incarnation's first line and
lines after its end."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from goodput_processor.importers.sources import get_source, translate_files
from goodput_processor.read.emitted import ingest_emitted
from goodput_processor.read.foreign_template import scan
from goodput_processor.read.reader import _Reader

DATA = Path(__file__).resolve().parents[1] / "data" / "sources" / "megatron"
_REAL = (DATA / "otlp.jsonl").read_text().splitlines()


def _resource(run: str = "9a0b7d2e-0000-4000-8000-000000000001", iters: int = 400) -> dict:
    """The real run's resource, as another incarnation (``run``) of ``iters`` iterations."""
    res = copy.deepcopy(json.loads(_REAL[0])["resourceSpans"][0]["resource"])
    for kv in res["attributes"]:
        if kv["key"] == "nemo.lens.run_uuid":
            kv["value"] = {"stringValue": run}
        if kv["key"] == "megatron.train_iters":
            kv["value"] = {"intValue": str(iters)}
    return res


def _iteration(it: int, t0: int = 1_800_000_000 * 10**9) -> dict:
    return {"traceId": "fc250da73acb51d3604a3f933b92a28c", "spanId": f"{0x5d41a2e9 + it:016x}",
            "parentSpanId": "a05d00eaddd159b3", "name": "megatron.train.iteration", "kind": 1,
            "startTimeUnixNano": str(t0 + it * 10**8),
            "endTimeUnixNano": str(t0 + it * 10**8 + 9 * 10**7),
            "attributes": [{"key": "is_goodput_span", "value": {"boolValue": True}},
                           {"key": "megatron.iteration", "value": {"intValue": str(it)}},
                           {"key": "megatron.skipped", "value": {"boolValue": False}}],
            "status": {}, "flags": 256}


def _line(spans: list, res: dict, spaced: bool = False) -> str:
    doc = {"resourceSpans": [{"resource": res, "scopeSpans": [
        {"scope": {"name": "nemo.lens"}, "spans": spans}]}]}
    return json.dumps(doc) if spaced else json.dumps(doc, separators=(",", ":"))


def _startup(t0: int = 1_800_000_000 * 10**9 - 10**9) -> dict:
    return {"traceId": "fc250da73acb51d3604a3f933b92a28c", "spanId": "0a556f09186e8f15",
            "parentSpanId": "72beefb637720f8d", "name": "megatron.startup.model_init",
            "kind": 1, "startTimeUnixNano": str(t0), "endTimeUnixNano": str(t0 + 10**8),
            "attributes": [], "status": {}}


def _set(key, value):
    def f(s):
        s[key] = value
    return f


def _iter_value(value):
    def f(s):
        s["attributes"][1]["value"] = value
    return f


#: One span of another shape (or value) than the line's first.
MUTATIONS = {
    "clean": lambda s: None,
    "skipped": lambda s: s["attributes"][2]["value"].update(boolValue=True),
    "other name": _set("name", "megatron.iteration"),
    "not read": _set("name", "megatron.train.forward"),
    "start after end": _set("startTimeUnixNano", "1900000000000000000"),
    "start 0": _set("startTimeUnixNano", "0000000000000000000"),
    "start past 2**63": _set("startTimeUnixNano", "9300000000000000000"),
    "start an int": lambda s: s.__setitem__("startTimeUnixNano", int(s["startTimeUnixNano"])),
    "id upper case": lambda s: s.__setitem__("spanId", s["spanId"].upper()),
    "id short": _set("spanId", "abc"),
    "no id": lambda s: s.pop("spanId"),
    "iteration text": _iter_value({"intValue": "x"}),
    "iteration a number": _iter_value({"intValue": 7}),
    "iteration 19 digits": _iter_value({"intValue": "1000000000000000000"}),
    "iteration low": _iter_value({"intValue": "0"}),
    "status error": _set("status", {"code": 2}),
    "status a str": _set("status", "ERROR"),
    "trace id with a space": _set("traceId", "fc250da73acb51d3604a3f93 b92a28c"),
    "extra key": _set("droppedAttributesCount", 0),
    "not a span": lambda s: s.clear(),
}


def _run(path: Path, scanned: bool):
    """(OTLP JSON made, problems, examples, warnings, records, reader rows) of ``path``,
    and the spans that came as columns."""
    reader, columns = _Reader(), []

    def ingest(batches):
        for b in batches:
            columns.extend(len(s) for s in b.spans if type(s) is not tuple)
            ingest_emitted(reader, b, ("test", "rows"))

    src = get_source("megatron")
    run = translate_files(src, [path], sink=ingest, scan=scan if scanned else None)
    ingest(run.resource_spans)
    # the OTLP JSON of the same spans (what goodput import writes)
    whole = translate_files(src, [path], scan=scan if scanned else None).resource_spans
    rows = {name: {k: p._buf.tobytes() for k, p in job.processes.items()}
            for name, job in reader.jobs.items()}
    return (whole, dict(run.problems.counts), run.problems.examples, run.warnings,
            run.records, rows, dict(reader.skipped), dict(reader._trace_ids)), columns


def _same(tmp_path: Path, lines: list[str]) -> tuple:
    """The result of both ways (equal), and the spans the scan's way took as columns."""
    path = tmp_path / "traces.json"
    path.write_text("\n".join(lines) + "\n")
    (fast, columns), (slow, none) = _run(path, True), _run(path, False)
    assert fast == slow
    assert not none
    return fast, columns


def _iterations(lo: int, hi: int) -> list[dict]:
    return [_iteration(it) for it in range(lo, hi)]


def test_real_runs_give_the_same(tmp_path):
    for name in ("otlp.jsonl", "otlp-default.jsonl"):
        _same(tmp_path, (DATA / name).read_text().splitlines())  # (no line of iterations)


@pytest.mark.parametrize("spaced", [False, True], ids=["compact", "spaced"])
def test_lines_of_iterations_are_taken_and_give_the_same(tmp_path, spaced):
    res = _resource()
    lines = [_line([_startup(), *_iterations(0, 5)], res, spaced)]  # its first: parsed
    lines += [_line(_iterations(lo, lo + 45), res, spaced) for lo in (5, 50, 95)]
    lines += [_line(_iterations(140, 400), res, spaced)]
    taken = [scan(x.encode(), get_source("megatron").translator.template_names)
             for x in lines]
    assert taken[0] is None  # (a startup span first)
    assert [len(t[1]) for t in taken[1:]] == [45, 45, 45, 260]  # 9 -> 10, 99 -> 100 inside
    (whole, _, _, warnings, records, rows, _, _), columns = _same(tmp_path, lines)
    assert columns == [45, 45, 45, 260]
    assert records == 401 and rows
    steps = [s for rs in whole for ss in rs["scopeSpans"] for s in ss["spans"]
             if s["name"] == "goodput.step"]
    assert len(steps) == 400
    assert warnings == {"megatron_open_spans_lost": 1}  # (no megatron.train root came)


@pytest.mark.parametrize("at", [0, 20, 44])
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_span_of_another_shape_gives_the_same(tmp_path, name, at):
    res = _resource()
    spans = _iterations(50, 95)
    MUTATIONS[name](spans[at])
    lines = [_line([_startup(), *_iterations(0, 50)], res), _line(spans, res),
             _line(_iterations(95, 120), res)]
    _, columns = _same(tmp_path, lines)
    assert columns[-1] == 25


def test_lines_the_scan_leaves_whole_give_the_same(tmp_path):
    res = _resource()
    other = _resource("9a0b7d2e-0000-4000-8000-000000000002")
    head = _line([_startup(), *_iterations(0, 5)], res)
    body = _line(_iterations(5, 30), res)
    with_slash = body.replace('"is_goodput_span"', '"is_goodput\\\\span"', 1)
    twice = body[:-3] + ',"spans":[]}]}]}'  # the list cut from is replaced by the last
    res_twice = '{"resourceSpans":[' + body[len('{"resourceSpans":['):-2] + "," + \
        _line(_iterations(30, 40), other)[len('{"resourceSpans":['):]
    lines = [head, with_slash, twice, body, res_twice, body[:500], "{not json",
             _line(_iterations(40, 60), other), _line(_iterations(60, 70), other)]
    _same(tmp_path, lines)


@pytest.mark.parametrize("where", ["first", "after end"])
def test_an_incarnations_first_line_and_lines_after_its_end_give_the_same(tmp_path, where):
    res = _resource(iters=30)
    lines = [_line(_iterations(0, 10), res), _line(_iterations(10, 30), res)]
    if where == "after end":
        lines += [_line(_iterations(30, 40), res)]  # megatron_span_after_end
    _same(tmp_path, lines)
