"""The reader's scan policy (``read.spans.ScanPolicy``): the text scan of ``read.template``
is used where it takes (nearly) every span of the lines, skipped after lines where it took
few, and the rows are the same whichever chunks it scanned.

Lines are in the recorder's layout: a flush's journal line (every span a form: the scan
takes all of it), and a compacted batch window's line whose leading run of forms is cut
early by a heartbeat (two attributes: no form), most of its spans left to the parse.
"""

from __future__ import annotations

import hashlib
import json

from goodput import schema
from goodput_processor.read import fast as read_fast
from goodput_processor.read import reader
from goodput_processor.read import spans as read_spans
from goodput_processor.read import template as read_template
from goodput_processor.read.reader import read_run_dir
from goodput_processor.read.spans import ScanPolicy

TID = "5c0ffee15c0ffee15c0ffee15c0ffee1"
T0 = 1_700_000_000_000_000_000
RESOURCE = {"attributes": [
    {"key": "service.name", "value": {"stringValue": "job"}},
    {"key": schema.RES_JOB_NAME, "value": {"stringValue": "job"}},
    {"key": schema.RES_ATTEMPT, "value": {"intValue": "0"}},
    {"key": schema.RES_PROCESS_INDEX, "value": {"intValue": "0"}},
    {"key": schema.RES_SCHEMA_VERSION, "value": {"stringValue": "1.3"}},
]}
_ids = iter(range(1, 1 << 40))


def span(name, start, end, attrs=None):
    """A span as the recorder writes it (key order included)."""
    sp = {"traceId": TID, "spanId": f"{next(_ids):016x}", "parentSpanId": "1b2f83a6c5e3d253",
          "name": name, "kind": 1, "startTimeUnixNano": str(start), "endTimeUnixNano": str(end)}
    if attrs is not None:
        sp["attributes"] = attrs
    return sp


def steps(first, n, t):
    """``n`` steps from number ``first``, each after a data-loading phase, from ``t``."""
    out = []
    for i in range(n):
        at = t + 1000 * i
        out.append(span(schema.DATA_LOADING, at, at + 100))
        out.append(span(schema.STEP, at + 100, at + 1000, [
            {"key": schema.ATTR_STEP, "value": {"intValue": str(first + i)}}]))
    return out


def heartbeat(t):
    return span(schema.HEARTBEAT, t, t + 1000, [
        {"key": schema.ATTR_RECORDER_ERRORS, "value": {"intValue": "0"}},
        {"key": schema.ATTR_RECORDER_DROPPED, "value": {"intValue": "0"}}])


def line(spans) -> bytes:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"scope": {
        "name": "goodput", "version": "0.1.0"}, "spans": spans}], "resource": RESOURCE}]},
        separators=(",", ":")).encode() + b"\n"


def journal_line(k):
    """A flush's line: all forms."""
    return line(steps(10 * k, 2, T0 + 10**6 * k))


def window_line(k):
    """A batch window's line, cut after its first step by a heartbeat."""
    t = T0 + 10**6 * k
    return line(steps(10 * k, 1, t) + [heartbeat(t)] + steps(10 * k + 1, 8, t + 1000))


def test_the_scan_is_kept_where_it_takes_every_span_and_skipped_where_it_takes_few():
    policy = ScanPolicy()
    lines = [journal_line(k) for k in range(4)]
    policy.saw(lines, read_template.scan(lines))
    assert policy.skip == 0 and policy.wanted()
    lines = [window_line(k) for k in range(4)]
    found = read_template.scan(lines)
    assert [f[1].n for f in found] == [2] * 4  # the leading run: data loading and a step
    policy.saw(lines, found)
    assert [policy.wanted() for _ in range(ScanPolicy.SKIP + 1)] == (
        [False] * ScanPolicy.SKIP + [True])  # then a probe
    policy.saw(lines, [None] * 4)  # no line taken
    assert policy.skip == ScanPolicy.SKIP
    policy.reset()
    assert policy.wanted()


def dump(s) -> str:
    """Everything a SpanSet holds, as text (rows by hash)."""
    out = {"skipped": dict(s.skipped), "examples": s.examples, "strings": s.strings,
           "files": s.files, "file_problems": s.file_problems, "jobs": {}}
    for name, j in s.jobs.items():
        out["jobs"][name] = {"skipped": list(j.skipped.items()), "processes": [
            [list(k), p.data.shape, hashlib.sha256(p.data.tobytes()).hexdigest()]
            for k, p in j.processes.items()]}
    return json.dumps(out, default=str)


def test_the_rows_are_the_same_whichever_chunks_are_scanned(tmp_path, monkeypatch):
    # files of one chunk each: windows (the scan is dropped), then journals (a probe
    # takes it up again), then both
    for i in range(3 * ScanPolicy.SKIP):
        kind = i // ScanPolicy.SKIP
        ks = range(4 * i, 4 * i + 4)
        text = b"".join(window_line(k) if kind == 0 or kind == 2 and k % 2 else journal_line(k)
                        for k in ks)
        (tmp_path / f"spans-p00000-a0000.s{i:04d}.jsonl").write_bytes(text)
    calls = []
    scan = read_template.scan

    def counted(lines):
        calls.append(len(lines))
        return scan(lines)

    def read(*patches):
        with monkeypatch.context() as m:
            m.setattr(read_template, "scan", counted)
            for obj, name, value in patches:
                m.setattr(obj, name, value)
            calls.clear()
            return dump(read_run_dir(tmp_path, workers=1, cache=False)), len(calls)

    got, scanned = read()
    files = 3 * ScanPolicy.SKIP
    assert 2 < scanned < files  # some chunks scanned, some not
    always, every = read((ScanPolicy, "MIN_TAKEN", 0.0))
    assert every == files and always == got
    plain, none = read((read_spans.SCAN_POLICY, "wanted", lambda: False),
                       (read_fast.Batch, "add", lambda self, spans, taken=None: False),
                       (reader, "_dumps", None))  # span by span, every resource read
    assert none == 0 and plain == got
    assert '"job"' in got and '"duplicate"' not in got
