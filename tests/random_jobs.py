"""Random jobs (Hypothesis strategies) shared by the tests of several stages.

- :func:`jobs`: ``[(resource, OTLP JSON span)]`` of 1-3 attempts of 1-3 processes, with
  overlapping phases, custom badput, checkpoints, steps out of order, heartbeats, end
  markers, exact duplicates and invalid spans (times from ``otlp_fixtures.T0_NS``, ns);
  :func:`otlp_requests` cuts them into OTLP JSON requests, :func:`write_requests` writes
  those as spool files and :func:`feed_store` gives them to a live store.
- :func:`loop_jobs`: a :class:`~goodput_processor.read.rows.JobSpans` of 1-3 attempts of
  1-2 processes whose rows mostly follow one another, as a training loop writes them
  (times from ``T0``, steps of ``MS``).

Used by tests/account/ (properties, fast paths), tests/model/ (incremental), tests/read/
(result cache) and through :mod:`live_polls`.
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from otlp_fixtures import T0_NS, attributes, otlp_span, resource

from goodput import schema
from goodput_processor.read.rows import (
    F_NONBLOCKING,
    F_OPEN,
    K_CHECKPOINT_RESTORE,
    K_CHECKPOINT_SAVE,
    K_CUSTOM_BADPUT,
    K_DATA_LOADING,
    K_HEARTBEAT,
    K_JOB_END,
    K_JOB_START,
    K_PROGRAM_STARTUP,
    K_STEP,
    NCOLS,
    NONE,
    JobSpans,
    ProcessSpans,
)

if TYPE_CHECKING:
    from goodput_processor.serve.store import LiveStore

NS = 1_000_000_000
NOW = T0_NS + 10**6 * NS  # long after every span: attempts without an end are over
PROPS = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

_PLAIN = [schema.ACCELERATOR_INIT, schema.TRAINING_PREP, schema.PROGRAM_STARTUP,
          schema.DATA_LOADING]
_SPAN_KINDS = ["plain", "step", "step", "step", "save", "restore", "custom", "heartbeat", "invalid"]


@st.composite
def jobs(draw):
    """A list of ``(resource, span)``: 1-3 attempts of 1-3 processes, in writing order."""
    out = []
    sid = 0
    t = 0
    for attempt in range(draw(st.integers(1, 3))):
        for process in range(draw(st.integers(1, 3))):
            res = resource("prop", attempt, process, 3)
            trace = f"{attempt + 1:016x}{process + 1:016x}"
            spans = []

            def add(name, start, end, attrs=None, status=None, trace=trace, spans=spans):
                nonlocal sid
                sid += 1
                spans.append(otlp_span(name, T0_NS + start, T0_NS + end, attrs, status,
                                       trace_id=trace, span_id=sid))

            t0 = t + draw(st.integers(0, 5)) * NS
            if draw(st.booleans()):
                add(schema.JOB_START, t0, t0, {schema.ATTR_HEARTBEAT_INTERVAL_MS: 10_000})
            for _ in range(draw(st.integers(1, 10))):
                start = t0 + draw(st.integers(0, 40 * NS))
                end = start + draw(st.integers(0, 8 * NS))
                kind = draw(st.sampled_from(_SPAN_KINDS))
                if kind == "plain":
                    add(draw(st.sampled_from(_PLAIN)), start, end)
                elif kind == "step":  # step numbers in random order, some of several steps
                    attrs = {schema.ATTR_STEP: draw(st.integers(0, 30))}
                    if draw(st.integers(0, 4)) == 0:
                        attrs[schema.ATTR_STEP_COUNT] = draw(st.integers(1, 3))
                    add(schema.STEP, start, end, attrs, draw(st.sampled_from([None, None, 2])))
                elif kind == "save":
                    add(schema.CHECKPOINT_SAVE, start, end, {
                        schema.ATTR_CHECKPOINT_STEP: draw(st.integers(0, 30)),
                        schema.ATTR_BLOCKING: draw(st.booleans())})
                elif kind == "restore":
                    add(schema.CHECKPOINT_RESTORE, start, end,
                        {schema.ATTR_CHECKPOINT_STEP: draw(st.integers(0, 30))})
                elif kind == "custom":
                    add(schema.CUSTOM_BADPUT, start, end, {
                        schema.ATTR_BADPUT_TYPE: draw(st.sampled_from(["eval", "sdc", "x y"])),
                        schema.ATTR_BLOCKING: draw(st.booleans())})
                elif kind == "heartbeat":
                    add(schema.HEARTBEAT, start, end, {schema.ATTR_RECORDER_ERRORS: 0})
                else:  # ends before it starts: counted as invalid_span, the same everywhere
                    add(schema.DATA_LOADING, end + NS, start)
            if draw(st.booleans()):
                end = t0 + draw(st.integers(0, 50 * NS))
                add(schema.JOB_END, end, end, {
                    schema.ATTR_END_REASON: draw(st.sampled_from(schema.END_REASONS))})
            for sp in draw(st.lists(st.sampled_from(spans), max_size=2)):  # exact duplicates
                spans.append(dict(sp))
            out += [(res, sp) for sp in spans]
        t += draw(st.integers(0, 60)) * NS  # attempts may overlap
    return out


def otlp_requests(pairs, rng: random.Random | None) -> list[dict]:
    """OTLP JSON requests of ``pairs``: one request per resource when ``rng`` is None, else
    the pairs shuffled and cut into requests of 1-5 spans, consecutive spans of the same
    resource sharing one ``resourceSpans`` entry."""
    if rng is None:
        groups: dict[str, tuple] = {}
        for res, sp in pairs:
            groups.setdefault(json.dumps(res, sort_keys=True), (res, []))[1].append(sp)
        chunks = [[(res, sp) for sp in spans] for res, spans in groups.values()]
    else:
        pairs = list(pairs)
        rng.shuffle(pairs)
        chunks, i = [], 0
        while i < len(pairs):
            n = rng.randint(1, 5)
            chunks.append(pairs[i : i + n])
            i += n
    reqs = []
    for chunk in chunks:
        rss = []
        for res, sp in chunk:
            if rss and rss[-1][0] is res:
                rss[-1][1].append(sp)
            else:
                rss.append((res, [sp]))
        reqs.append({"resourceSpans": [
            {"resource": {"attributes": attributes(res)},
             "scopeSpans": [{"scope": {"name": schema.SCOPE_NAME}, "spans": spans}]}
            for res, spans in rss]})
    return reqs


def write_requests(run_dir, reqs, nfiles=1, rng=None):
    """``reqs`` (OTLP JSON requests) written as lines of ``nfiles`` spool files
    ``spans-<k>.jsonl`` under ``run_dir`` (made if missing): in turn, or at random with
    ``rng``; a file that got no line is removed. Returns ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    files = [open(run_dir / f"spans-{k}.jsonl", "w") for k in range(nfiles)]  # noqa: SIM115
    try:
        for i, req in enumerate(reqs):
            f = files[rng.randrange(nfiles) if rng else i % nfiles]
            f.write(json.dumps(req, separators=(",", ":")) + "\n")
    finally:
        for f in files:
            f.close()
    for k in range(nfiles):  # a file that got no line is not an arrival order (it is
        path = run_dir / f"spans-{k}.jsonl"  # the empty_spool_file warning's case)
        if not path.stat().st_size:
            path.unlink()
    return run_dir


def _pb_value(v: dict) -> common_pb2.AnyValue:
    if "intValue" in v:
        return common_pb2.AnyValue(int_value=int(v["intValue"]))
    if "boolValue" in v:
        return common_pb2.AnyValue(bool_value=v["boolValue"])
    if "doubleValue" in v:
        return common_pb2.AnyValue(double_value=v["doubleValue"])
    return common_pb2.AnyValue(string_value=v["stringValue"])


def _pb(req: dict) -> trace_service_pb2.ExportTraceServiceRequest:
    """The protobuf form of an OTLP JSON request (as an OTLP exporter would send it)."""
    out = trace_service_pb2.ExportTraceServiceRequest()
    for rs in req["resourceSpans"]:
        prs = out.resource_spans.add()
        for a in rs["resource"]["attributes"]:
            prs.resource.attributes.add(key=a["key"], value=_pb_value(a["value"]))
        for ss in rs["scopeSpans"]:
            pss = prs.scope_spans.add()
            pss.scope.name = ss["scope"]["name"]
            for sp in ss["spans"]:
                pss.spans.append(trace_pb2.Span(
                    trace_id=bytes.fromhex(sp["traceId"]), span_id=bytes.fromhex(sp["spanId"]),
                    name=sp["name"], start_time_unix_nano=int(sp["startTimeUnixNano"]),
                    end_time_unix_nano=int(sp["endTimeUnixNano"]),
                    attributes=[common_pb2.KeyValue(key=a["key"], value=_pb_value(a["value"]))
                                for a in sp["attributes"]],
                    status=trace_pb2.Status(code=sp["status"].get("code", 0))))
    return out


def feed_store(store: LiveStore, reqs, rng: random.Random) -> None:
    """Feed ``reqs`` to ``store``, each through a randomly chosen public ingest method."""
    for i, req in enumerate(reqs):
        how = rng.randrange(3)
        if how == 0:
            store.ingest_line(json.dumps(req).encode() + b"\n", ("batch", i))
        elif how == 1:
            store.ingest_json(req, ("batch", i))
        else:
            store.ingest_request(_pb(req), "batch")


T0 = 1_700_000_000 * 10**9
MS = 1_000_000


_LOOP_KINDS = [K_STEP] * 6 + [K_DATA_LOADING] * 3 + [K_CHECKPOINT_SAVE, K_CHECKPOINT_RESTORE,
                                                  K_CUSTOM_BADPUT, K_PROGRAM_STARTUP,
                                                  K_HEARTBEAT]


@st.composite
def loop_jobs(draw) -> JobSpans:
    """1-3 attempts of 1-2 processes; each process's phases mostly back to back."""
    job = JobSpans("fast", strings=["eval", "sdc", "killed"])
    t, sid = T0, 0
    step = 0
    for attempt in range(draw(st.integers(1, 3))):
        resume = draw(st.integers(0, max(step, 0)))
        for process in range(draw(st.integers(1, 2))):
            rows = []
            at = t + draw(st.integers(0, 3)) * MS
            rows.append((at, at, K_JOB_START, 10_000, NONE, 0, -1))
            at += draw(st.integers(0, 50)) * MS
            s = resume
            for _ in range(draw(st.integers(0, 25))):
                kind = draw(st.sampled_from(_LOOP_KINDS))
                length = draw(st.integers(0, 40)) * MS
                start = at - (draw(st.integers(0, 30)) * MS if draw(st.integers(0, 9)) == 0
                              else 0)  # now and then an overlap with what came before
                flags = F_NONBLOCKING if draw(st.integers(0, 7)) == 0 else 0
                if draw(st.integers(0, 8)) == 0:
                    flags |= F_OPEN
                ival, aux, sidx = NONE, NONE, -1
                if kind == K_STEP:
                    s += 1
                    ival = s
                    if draw(st.integers(0, 6)) == 0:
                        aux = draw(st.integers(1, 3))
                elif kind in (K_CHECKPOINT_SAVE, K_CHECKPOINT_RESTORE):
                    ival = draw(st.integers(0, max(s, 0)))
                elif kind == K_CUSTOM_BADPUT:
                    sidx = draw(st.integers(0, 1))
                rows.append((start, start + length, kind, ival, aux, flags, sidx))
                if flags & F_OPEN and draw(st.booleans()):  # completed later as well
                    rows.append((start, start + length + 5 * MS, kind, ival, aux,
                                 flags & ~F_OPEN, sidx))
                at = max(at, start + length) + draw(st.integers(0, 5)) * MS
            if draw(st.booleans()):
                rows.append((at, at, K_JOB_END, NONE, NONE, 0, 2))
            step = max(step, s)
            data = np.zeros((len(rows), NCOLS), np.int64)
            for i, r in enumerate(rows):
                sid += 1
                data[i, :7] = r
                data[i, 7], data[i, 8] = attempt, sid
            order = draw(st.permutations(range(len(rows))))
            job.processes[(attempt, process, "")] = ProcessSpans(
                "fast", attempt, process, host=f"h{process}", process_count=2,
                data=data[list(order)])
        t = at + draw(st.integers(1, 100)) * MS
    return job
