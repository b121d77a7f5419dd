"""Write OTLP JSON lines spool files for tests, in the format the training side writes.

``write_spool`` takes a resource dict and span tuples; ``Timeline`` builds the tuples from
times in seconds (or any unit, e.g. ``unit=60`` for minutes) relative to ``T0_NS``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

from goodput import schema

#: Default time origin of a Timeline (ns since the epoch).
T0_NS = 1_700_000_000_000_000_000
_span_ids = itertools.count(1)


def any_value(value, *, int_as_number: bool = False) -> dict:
    """OTLP JSON ``AnyValue`` of a Python value (int64 as a decimal string by default)."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": value if int_as_number else str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def attributes(attrs: dict, *, int_as_number: bool = False) -> list[dict]:
    """OTLP JSON ``KeyValue`` list of a dict."""
    return [
        {"key": k, "value": any_value(v, int_as_number=int_as_number)} for k, v in attrs.items()
    ]


def resource(job="job", attempt=0, process=0, count=1, host=None, version="1", **extra) -> dict:
    """Resource attributes of one process of one attempt (None values are left out)."""
    res = {
        schema.RES_SERVICE_NAME: job,
        schema.RES_JOB_NAME: job,
        schema.RES_ATTEMPT: attempt,
        schema.RES_PROCESS_INDEX: process,
        schema.RES_PROCESS_COUNT: count,
        schema.RES_SCHEMA_VERSION: version,
        schema.RES_HOST_NAME: host or f"host{process}",
        **extra,
    }
    return {k: v for k, v in res.items() if v is not None}


def otlp_span(name, start_ns, end_ns, attrs=None, status_code=None, *, trace_id="", span_id=None,
              int_as_number=False) -> dict:
    """One OTLP JSON span; ``span_id`` (int) defaults to a fresh sequential id."""
    sid = next(_span_ids) if span_id is None else span_id
    tnum = (lambda v: v) if int_as_number else str
    return {
        "traceId": trace_id or "0" * 31 + "1",
        "spanId": f"{sid:016x}",
        "name": name,
        "kind": 1,
        "startTimeUnixNano": tnum(int(start_ns)),
        "endTimeUnixNano": tnum(int(end_ns)),
        "attributes": attributes(attrs or {}, int_as_number=int_as_number),
        "status": {} if status_code is None else {"code": status_code},
    }


def request_line(res: dict, spans: list[dict], *, scope=schema.SCOPE_NAME, int_as_number=False):
    """One ExportTraceServiceRequest as a compact JSON string (no newline)."""
    req = {
        "resourceSpans": [
            {
                "resource": {"attributes": attributes(res, int_as_number=int_as_number)},
                "scopeSpans": [{"scope": {"name": scope, "version": "0.1.0"}, "spans": spans}],
            }
        ]
    }
    return json.dumps(req, separators=(",", ":"))


def write_spool(path, resource: dict, spans: list[tuple], *, spans_per_line: int = 512,
                int_as_number: bool = False, mode: str = "w") -> Path:
    """Write ``spans`` as OTLP JSON lines to ``path`` (a file); return the path.

    Each span is ``(name, start_ns, end_ns[, attrs: dict[, status_code: int]])`` or an
    already-built span dict; ``spans_per_line`` spans go into one request line. The trace
    id is derived from the resource (one trace per attempt and process).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    trace = hashlib.sha256(repr(sorted(resource.items())).encode()).hexdigest()[:32]
    built = [
        s if isinstance(s, dict) else otlp_span(*s, trace_id=trace, int_as_number=int_as_number)
        for s in spans
    ]
    with open(path, mode) as f:
        for i in range(0, len(built), spans_per_line):
            chunk = built[i : i + spans_per_line]
            f.write(request_line(resource, chunk, int_as_number=int_as_number) + "\n")
    return path


class Timeline:
    """Spans of one process of one attempt, with times in ``unit`` seconds after ``t0_ns``.

    >>> tl = Timeline(attempt=0, unit=60)      # minutes
    >>> tl.job_start(0); tl.restore(0, 5, step=25); tl.steps(26, 50, start=5, step_time=2)
    """

    def __init__(self, job="job", attempt=0, process=0, count=1, unit=1.0, t0_ns=T0_NS, **res):
        self.resource = resource(job, attempt, process, count, **res)
        self.attempt, self.process = attempt, process
        self.unit, self.t0_ns = unit, t0_ns
        self.spans: list[tuple] = []

    def ns(self, t) -> int:
        """Absolute ns of time ``t`` (in units)."""
        return self.t0_ns + round(t * self.unit * 1_000_000_000)

    def span(self, name, start, end, attrs=None, status_code=None) -> Timeline:
        """Add a span; ``name`` may be short (``"data_loading"``) or full."""
        full = name if name.startswith("goodput.") else "goodput." + name
        self.spans.append((full, self.ns(start), self.ns(end), attrs or {}, status_code))
        return self

    def job_start(self, t, interval_ms=None) -> Timeline:
        attrs = {} if interval_ms is None else {schema.ATTR_HEARTBEAT_INTERVAL_MS: interval_ms}
        return self.span(schema.JOB_START, t, t, attrs)

    def job_end(self, t, reason="exit", errors=None, dropped=None) -> Timeline:
        attrs = {schema.ATTR_END_REASON: reason}
        if errors is not None:
            attrs[schema.ATTR_RECORDER_ERRORS] = errors
        if dropped is not None:
            attrs[schema.ATTR_RECORDER_DROPPED] = dropped
        return self.span(schema.JOB_END, t, t, attrs)

    def heartbeat(self, start, end, errors=None, dropped=None) -> Timeline:
        attrs = {}
        if errors is not None:
            attrs[schema.ATTR_RECORDER_ERRORS] = errors
        if dropped is not None:
            attrs[schema.ATTR_RECORDER_DROPPED] = dropped
        return self.span(schema.HEARTBEAT, start, end, attrs)

    def restore(self, start, end, step) -> Timeline:
        return self.span(schema.CHECKPOINT_RESTORE, start, end, {schema.ATTR_CHECKPOINT_STEP: step})

    def save(self, start, end, step, blocking=True) -> Timeline:
        attrs = {schema.ATTR_CHECKPOINT_STEP: step, schema.ATTR_BLOCKING: blocking}
        return self.span(schema.CHECKPOINT_SAVE, start, end, attrs)

    def custom(self, badput_type, start, end, blocking=True) -> Timeline:
        attrs = {schema.ATTR_BADPUT_TYPE: badput_type, schema.ATTR_BLOCKING: blocking}
        return self.span(schema.CUSTOM_BADPUT, start, end, attrs)

    def step(self, n, start, end, count=None) -> Timeline:
        """Step ``n``; ``count`` > 1: the span covers steps ``n-count+1..n`` (imported logs)."""
        attrs = {schema.ATTR_STEP: n}
        if count is not None:
            attrs[schema.ATTR_STEP_COUNT] = count
        return self.span(schema.STEP, start, end, attrs)

    def steps(self, first, last, start, step_time) -> Timeline:
        """Steps ``first..last`` back to back from ``start``, ``step_time`` each."""
        for i, n in enumerate(range(first, last + 1)):
            self.step(n, start + i * step_time, start + (i + 1) * step_time)
        return self

    def os_process(self, pid, start, *, instance=None, attempt_source="process",
                   index_source="env") -> Timeline:
        """Give the resource an OS process identity, as the recorder (schema 1.1) writes it:
        ``pid``, its start time ``start`` (units), a ``service.instance.id`` (default
        derived from pid, start and attempt) and the sources of attempt and index."""
        self.resource.update({
            schema.RES_SERVICE_INSTANCE_ID: instance or f"i{pid}-{start}-{self.attempt}",
            schema.RES_PROCESS_PID: pid,
            schema.RES_PROCESS_START: self.ns(start),
            schema.RES_ATTEMPT_SOURCE: attempt_source,
            schema.RES_PROCESS_INDEX_SOURCE: index_source,
            schema.RES_SCHEMA_VERSION: "1.1",
        })
        return self

    def identity(self, t, rank, size) -> Timeline:
        """The framework's rank and world size became known at ``t``."""
        return self.span(schema.IDENTITY, t, t, {schema.RES_PROCESS_INDEX: rank,
                                                 schema.RES_PROCESS_COUNT: size})

    def open(self, name, start, seen, attrs=None) -> Timeline:
        """A ``goodput.open`` record: phase ``name`` started at ``start``, in flight at
        ``seen``."""
        return self.span(name, start, seen, {**(attrs or {}), schema.ATTR_OPEN: True})

    def write(self, run_dir, **kw) -> Path:
        """Write to ``run_dir/spans-p<process>-a<attempt>[-<instance>].jsonl`` (kw: see
        write_spool)."""
        inst = self.resource.get(schema.RES_SERVICE_INSTANCE_ID)
        name = f"spans-p{self.process:05d}-a{self.attempt:04d}{'-' + inst if inst else ''}.jsonl"
        return write_spool(Path(run_dir) / name, self.resource, self.spans, **kw)
