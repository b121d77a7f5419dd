"""The reader's fast paths give what reading span by span gives, byte for byte.

``read_template`` (spans read from the line's text), ``read_fast.Batch`` (spans lists made
rows a batch at a time) and ``read_io`` (a compacted segment decompressed at once) are each
compared with the plain path (the path turned off) on clean spools in the recorder's layout
and on every kind of damage next to clean lines.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib

import pytest

from goodput import schema
from goodput_processor.read import (
    fast as read_fast,
)
from goodput_processor.read import (
    reader,
)
from goodput_processor.read import (
    spool_io as read_io,
)
from goodput_processor.read import (
    template as read_template,
)
from goodput_processor.read.reader import read_run_dir

TID = "3a14a17c7509b65f474d141d30b7c81b"
T0 = 1_700_000_000_000_000_000
RESOURCE = {"attributes": [
    {"key": "service.name", "value": {"stringValue": "job"}},
    {"key": schema.RES_JOB_NAME, "value": {"stringValue": "job"}},
    {"key": schema.RES_ATTEMPT, "value": {"intValue": "0"}},
    {"key": schema.RES_PROCESS_INDEX, "value": {"intValue": "0"}},
    {"key": schema.RES_SCHEMA_VERSION, "value": {"stringValue": "1.3"}},
]}
_ids = iter(range(1, 1 << 40))


def span(name, start, end, attrs=None, *, sid=None, tid=TID, parent="1b2f83a6c5e3d253", **more):
    """A span as the recorder writes it (key order included)."""
    sp = {"traceId": tid, "spanId": f"{next(_ids) if sid is None else sid:016x}"}
    if parent:
        sp["parentSpanId"] = parent
    sp.update({"name": name, "kind": 1, "startTimeUnixNano": str(start),
               "endTimeUnixNano": str(end)})
    if attrs is not None:
        sp["attributes"] = attrs
    sp.update(more)
    return sp


def step(n, start, end=None, **kw):
    return span(schema.STEP, start, start + 500 if end is None else end,
                [{"key": schema.ATTR_STEP, "value": {"intValue": str(n)}}], **kw)


def opened(name, start, end, n=None, value=True, **kw):
    """A span in flight at a flush (``goodput.open``), a step with its number first."""
    attrs = [] if n is None else [{"key": schema.ATTR_STEP, "value": {"intValue": str(n)}}]
    return span(name, start, end, attrs + [{"key": schema.ATTR_OPEN,
                                           "value": {"boolValue": value}}], **kw)


def window(start, end):
    return span("goodput.window", start, end, [{"key": "goodput.window.index",
                                                "value": {"intValue": "1"}}], parent="",
                links=[{"traceId": "a4" * 16, "spanId": "28" * 8, "attributes": []}])


def line(spans, *, resource=RESOURCE, scope="goodput") -> str:
    """One request line in the recorder's layout (scope spans first, then the resource)."""
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {"name": scope,
                                                                     "version": "0.1.0"},
                                                           "spans": spans}],
                                          "resource": resource}]}, separators=(",", ":"))


def clean(n=40, t=T0, **kw) -> str:
    """A flush's line: steps with data loading between them, the window span last."""
    spans = []
    for i in range(n):
        spans.append(step(i, t + 1000 * i, **kw))
        spans.append(span(schema.DATA_LOADING, t + 1000 * i + 500, t + 1000 * i + 600, **kw))
    return line(spans + [window(t, t + 1000 * n)])


def dump(s) -> str:
    """Everything a SpanSet holds, as text (rows by hash)."""
    out = {"skipped": dict(s.skipped), "examples": s.examples, "strings": s.strings,
           "files": s.files, "file_problems": s.file_problems, "jobs": {}}
    for name, j in s.jobs.items():
        out["jobs"][name] = {
            "skipped": list(j.skipped.items()), "examples": j.examples,
            "versions": sorted(j.schema_versions), "processes": [
                [list(k), p.host, p.process_count, p.schema_version, p.pid, list(p.run.items()),
                 p.data.shape, hashlib.sha256(p.data.tobytes()).hexdigest()]
                for k, p in j.processes.items()]}
    return json.dumps(out, default=str)


def read(path, monkeypatch, fast: bool) -> str:
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(read_template, "scan", lambda lines: [None] * len(lines))
            m.setattr(read_fast.Batch, "add", lambda self, spans, taken=None: False)
            m.setattr(reader, "_dumps", None)  # every resource read, none remembered
        return dump(read_run_dir(path, workers=1, cache=False))


def same(path, monkeypatch):
    fast = read(path, monkeypatch, True)
    assert fast == read(path, monkeypatch, False)
    return fast


def test_recorder_layout_is_read_from_the_text(tmp_path, monkeypatch):
    text = "\n".join(clean(t=T0 + 10**6 * i) for i in range(5)) + "\n"
    (tmp_path / "spans-p00000-a0000.jsonl").write_text(text)
    lines = [x.encode() + b"\n" for x in text.splitlines()]
    found = read_template.scan(lines)
    assert all(f is not None and f[1].n == 80 for f in found)  # all but the window
    for raw, (skeleton, _) in zip(lines, found, strict=True):
        full = json.loads(raw)["resourceSpans"][0]["scopeSpans"][0]["spans"]
        assert json.loads(skeleton)["resourceSpans"][0]["scopeSpans"][0]["spans"] == full[80:]
    with monkeypatch.context() as m:  # clean: no span read one by one
        m.setattr(reader._Reader, "_spans_slow", lambda *a: pytest.fail("slow path"))
        s = read_run_dir(tmp_path, workers=1, cache=False)
    assert len(s.jobs["job"].processes[(0, 0, "")].data) == 400
    same(tmp_path, monkeypatch)


def test_the_last_spans_of_a_flush_are_read_from_the_text(tmp_path, monkeypatch):
    t = T0
    journal = line([step(1, t), span(schema.DATA_LOADING, t + 500, t + 600),
                    opened(schema.STEP, t + 600, t + 900, 2)])  # a journal line: all forms
    compacted = line([step(3, t + 1000), opened(schema.STEP, t + 1500, t + 1900, 4),
                      window(t, t + 2000)])  # a compacted window: the open span, then it
    lines = [journal.encode() + b"\n", compacted.encode() + b"\n"]
    found = read_template.scan(lines)
    assert [f[1].n for f in found] == [3, 2]
    for raw, (skeleton, _) in zip(lines, found, strict=True):
        full = json.loads(raw)["resourceSpans"][0]["scopeSpans"][0]["spans"]
        left = json.loads(skeleton)["resourceSpans"][0]["scopeSpans"][0]["spans"]
        assert left == full[len(full) - len(left):] and len(left) == len(full) - (
            3 if raw is lines[0] else 2)
    (tmp_path / "spans-p00000-a0000.jsonl").write_bytes(b"".join(lines))
    with monkeypatch.context() as m:  # clean: no span read one by one
        m.setattr(reader._Reader, "_spans_slow", lambda *a: pytest.fail("slow path"))
        read_run_dir(tmp_path, workers=1, cache=False)
    got = same(tmp_path, monkeypatch)
    assert '"unknown"' not in got


def test_a_resource_like_the_last_one_is_not_read_again(tmp_path, monkeypatch):
    def on(host, pid):
        return {"attributes": RESOURCE["attributes"] + [
            {"key": "host.name", "value": {"stringValue": host}},
            {"key": "process.pid", "value": {"intValue": pid}}]}

    hosts = [("a", "1"), ("a", "1"), ("b", "2"), ("a", "1"), ("a", "1")]
    text = "".join(line([step(i, T0 + 10 * i)], resource=on(*h)) + "\n"
                   for i, h in enumerate(hosts))
    (tmp_path / "spans-p00000-a0000.jsonl").write_text(text)
    calls, plain = [], reader._Reader.resource_attrs
    with monkeypatch.context() as m:
        m.setattr(reader._Reader, "resource_attrs",
                  lambda self, attrs: calls.append(attrs["host.name"]) or plain(self, attrs))
        proc = read_run_dir(tmp_path, workers=1, cache=False).jobs["job"].processes[(0, 0, "")]
    assert calls == ["a", "b", "a"]  # each line's resource is the same text as the last?
    assert (proc.host, proc.pid) == ("a", 1)
    same(tmp_path, monkeypatch)


def _bad_lines() -> dict[str, str]:
    t = T0 + 5 * 10**9
    good = [step(7, t), span(schema.DATA_LOADING, t + 500, t + 600)]

    def mid(*bad, first=False):  # the spans between clean ones (the last is never taken)
        after = [step(9, t + 900), span(schema.DATA_LOADING, t + 950, t + 990),
                 window(t, t + 999)]
        return line(([] if first else good) + list(bad) + after)

    c = clean(4, t=t + 10**6)
    return {
        "uppercase_hex": mid(step(8, t + 700, sid=0xABCDEF0123456789)),
        "span_id_past_2_63": mid(step(8, t + 700, sid=0xF000000000000001)),
        "time_20_digits": mid(step(8, "0" + str(t + 700), t + 800)),
        "time_past_int64": mid(step(8, 9999999999999999999, 9999999999999999999)),
        "time_2_63": mid(step(8, 1 << 63, 1 << 63)),
        "time_2_63_less_1": mid(step(8, (1 << 63) - 1, (1 << 63) - 1)),
        "end_before_start": mid(step(8, t + 700, t + 600)),
        "bad_trace": mid(step(8, t, tid="z" * 32), step(9, t)),
        "short_trace": mid(step(8, t + 700, tid="ab" * 15)),
        "bad_parent": mid(step(8, t + 700, parent="x" * 16)),
        "step_plus": mid(span(schema.STEP, t, t + 1, [{"key": schema.ATTR_STEP,
                                                     "value": {"intValue": "+5"}}])),
        "step_number": mid(span(schema.STEP, t, t + 1, [{"key": schema.ATTR_STEP,
                                                       "value": {"intValue": 5}}])),
        "step_huge": mid(step("99999999999999999999", t + 700)),
        "step_2_63": mid(step(str(1 << 63), t + 700)),
        "step_twice": mid(span(schema.STEP, t, t + 1, [
            {"key": schema.ATTR_STEP, "value": {"intValue": "5"}},
            {"key": schema.ATTR_STEP, "value": {"intValue": "6"}}])),
        "open_and_error": mid(step(8, t, **{"status": {"code": 2}}),
                              step(10, t, **{"status": {"code": "STATUS_CODE_ERROR"}}),
                              step(11, t, **{"status": {"code": 1}}), span(
            schema.STEP, t, t + 1, [{"key": schema.ATTR_STEP, "value": {"intValue": "9"}},
                                    {"key": schema.ATTR_OPEN, "value": {"boolValue": True}}])),
        "custom_badput": mid(span(schema.CUSTOM_BADPUT, t, t + 9, [
            {"key": schema.ATTR_BADPUT_TYPE, "value": {"stringValue": "eval"}}])),
        "unknown_name": mid(span("goodput.bogus", t, t + 1)),
        "window_first": mid(window(t, t + 9), first=True),
        "two_traces": mid(step(8, t + 700, tid="cd" * 16)),
        "kind_2": mid(dict(step(8, t + 700), kind=2)),
        "root_span": mid(step(8, t + 700, parent="")),
        "same_span_id": mid(dict(good[0])),
        "extra_key": mid(dict(step(8, t + 700), droppedAttributesCount=0)),
        "empty_spans": line([]),
        "other_scope": line(good + [window(t, t + 9)], scope="other"),
        "scope_with_cut": line(good, scope="a},{b"),
        "unsupported_schema": line(good, resource={"attributes": [
            {"key": "service.name", "value": {"stringValue": "job"}},
            {"key": schema.RES_SCHEMA_VERSION, "value": {"stringValue": "9.0"}}]}),
        "backslash": line(good, resource={"attributes": [
            {"key": "service.name", "value": {"stringValue": "j\\ob"}}]}),
        "spans_again": c.replace(']}],"resource"', '],"spans":[' + json.dumps(
            step(3, t), separators=(",", ":")) + ']}],"resource"', 1),
        "scope_again": c.replace(']}],"resource"', '],"scope":{"name":"x"}}],"resource"', 1),
        "pretty": json.dumps(json.loads(c), indent=1).replace("\n", " "),
        "torn_in_spans": c[: len(c) // 2],
        "torn_in_resource": c[:-20],
        "invalid_after": c[:-3] + ",}]}",
        "nan_resource": c.replace('"stringValue":"1.3"', '"doubleValue":NaN'),
        "open_last": line(good + [opened(schema.STEP, t + 700, t + 800, 8)]),
        "open_then_forms": line(good + [opened(schema.STEP, t + 700, t + 800, 8)] + good[:1]),
        "open_mid": mid(opened(schema.STEP, t + 700, t + 800, 8)),
        "open_no_step": mid(opened(schema.STEP, t + 700, t + 800)),
        "open_false": line(good + [opened(schema.STEP, t + 700, t + 800, 8, value=False)]),
        "open_checkpoint": line(good + [opened(schema.CHECKPOINT_SAVE, t + 700, t + 800)]),
        "open_heartbeat": line(good + [opened(schema.HEARTBEAT, t + 700, t + 800)]),
        "open_bad_last": line(good + [opened(schema.STEP, "0" + str(t + 700), t + 800, 8)]),
        "open_end_before_start": line(good + [opened(schema.STEP, t + 700, t + 600, 8)]),
        "one_form": line(good[:1]),
        "one_form_one_attribute": line(good[:1], resource={"attributes": [
            {"key": "service.name", "value": {"stringValue": "job"}}]}),
        "forms_then_scope": json.dumps({"resourceSpans": [{"scopeSpans": [
            {"scope": {"name": "goodput", "version": "0.1.0"}, "spans": good},
            {"scope": {"name": "goodput", "version": "0.1.0"}, "spans": [step(5, t)]}],
            "resource": RESOURCE}]}, separators=(",", ":")),
        "forms_then_spans_again": line(good).replace(']}],"resource"', '],"spans":[' + json.dumps(
            step(3, t), separators=(",", ":")) + ']}],"resource"', 1),
        "second_resource": json.dumps({"resourceSpans": json.loads(c)["resourceSpans"]
                                       + json.loads(line(good))["resourceSpans"]},
                                      separators=(",", ":")),
    }


@pytest.mark.parametrize("name", sorted(_bad_lines()))
def test_damage_next_to_clean_lines(tmp_path, monkeypatch, name):
    bad = _bad_lines()[name]
    text = clean(t=T0) + "\n" + bad + "\n" + clean(t=T0 + 10**9) + "\n"
    if name.startswith("torn"):
        text = clean(t=T0) + "\n" + bad  # last line, no newline
    (tmp_path / "spans-p00000-a0000.jsonl").write_text(text)
    same(tmp_path, monkeypatch)


def test_every_damage_in_one_file_and_gzip(tmp_path, monkeypatch):
    bad = [b for k, b in sorted(_bad_lines().items()) if not k.startswith("torn")]
    text = "\n".join(x for b in bad for x in (clean(t=T0), b)) + "\n"
    (tmp_path / "spans-p00000-a0000.jsonl").write_text(text)
    (tmp_path / "spans-p00000-a0001.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    got = same(tmp_path, monkeypatch)
    for reason in ("invalid_span", "malformed", "duplicate", "unknown", "unsupported_schema"):
        assert f'"{reason}"' in got


def _gz_variants(text: bytes) -> dict[str, bytes]:
    whole = gzip.compress(text)
    half = len(text) // 2
    return {"whole": whole, "two_members": gzip.compress(text[:half]) + gzip.compress(
        text[half:]), "zero_padding": whole + b"\0" * 10, "trailing_garbage": whole + b"xyz",
        "truncated": whole[: len(whole) * 2 // 3], "bad_crc": whole[:-8] + b"\0\0\0\0"
        + whole[-4:], "empty": b"", "not_gzip": text, "raw_deflate_header": zlib.compress(text)}


def test_compacted_segments_are_inflated_by_zlib_ng():
    """zlib-ng is a dependency (``pyproject.toml``): the reader's inflate is its."""
    from zlib_ng import zlib_ng

    assert read_io._inflate is zlib_ng


@pytest.mark.parametrize("inflate", ["zlib_ng", "zlib"])
@pytest.mark.parametrize("name", sorted(_gz_variants(b"")))
def test_compacted_segment_read_at_once_or_as_before(tmp_path, monkeypatch, name, inflate):
    """Every damage of a compacted segment gives what gzip.open gives, line for line and
    error for error, with zlib-ng's inflate and with the standard library's."""
    if inflate == "zlib":
        monkeypatch.setattr(read_io, "_inflate", zlib)
    text = "\n".join(clean(t=T0 + 10**9 * i) for i in range(30)).encode() + b"\n"
    (tmp_path / "spans-p00000-a0000.jsonl.gz").write_bytes(_gz_variants(text)[name])
    with monkeypatch.context() as m:
        m.setattr(read_io, "_gunzip_whole", lambda path: None)  # gzip.open, as before
        try:
            before = dump(read_run_dir(tmp_path, workers=1, cache=False))
        except reader.ReadError as e:
            before = repr(e)
    try:
        after = dump(read_run_dir(tmp_path, workers=1, cache=False))
    except reader.ReadError as e:
        after = repr(e)
    assert after == before
