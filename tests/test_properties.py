"""Properties of the accounting over random timelines (Hypothesis, seeded and bounded).

Random jobs of several attempts and processes, with overlapping phases, custom badput types,
blocking and non-blocking checkpoints, steps out of order, heartbeats, end markers, exact
duplicates and invalid spans, are written as OTLP JSON lines. Checked:

- buckets are never negative and sum exactly (ns) to the total; goodput is within [0, 1];
- the result does not depend on the order in which spans arrive: the same spans shuffled
  across lines and files give the same report;
- the live service (:class:`goodput_processor.serve.store.LiveStore`) fed batch by batch,
  through each of its public ingest methods (spool lines, OTLP JSON dicts, protobuf
  requests), gives the same answer as one batch and as ``goodput report`` on the files.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from otlp_fixtures import T0_NS, attributes, otlp_span, resource

from goodput import schema
from goodput_processor import read_run_dir, report_run_dir, to_json_dict
from goodput_processor.account.accounting import resume_step
from goodput_processor.cli import main
from goodput_processor.read.reader import RunDirError
from goodput_processor.serve.store import LiveStore

NS = 1_000_000_000
NOW = T0_NS + 10**6 * NS  # long after every span: attempts without an end are over
PROPS = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

_PLAIN = [schema.ACCELERATOR_INIT, schema.TRAINING_PREP, schema.PROGRAM_STARTUP,
          schema.DATA_LOADING]
_KINDS = ["plain", "step", "step", "step", "save", "restore", "custom", "heartbeat", "invalid"]


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
                kind = draw(st.sampled_from(_KINDS))
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


def _lines(pairs, rng: random.Random | None) -> list[dict]:
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


def _write(run_dir, reqs, nfiles=1, rng=None):
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


def _doc(results) -> dict:
    """The JSON report without skip examples (they name files or requests)."""
    doc = to_json_dict(results)
    for j in doc["jobs"]:
        j.pop("skipped_examples")
    return doc


def _valid(pairs) -> bool:
    """Whether any span is readable (else ``goodput report`` refuses the directory)."""
    return any(int(sp["endTimeUnixNano"]) >= int(sp["startTimeUnixNano"]) for _, sp in pairs)


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


def _feed(store: LiveStore, reqs, rng: random.Random) -> None:
    """Feed ``reqs`` to ``store``, each through a randomly chosen public ingest method."""
    for i, req in enumerate(reqs):
        how = rng.randrange(3)
        if how == 0:
            store.ingest_line(json.dumps(req).encode() + b"\n", ("batch", i))
        elif how == 1:
            store.ingest_json(req, ("batch", i))
        else:
            store.ingest_request(_pb(req), "batch")


@PROPS
@given(pairs=jobs(), ideal=st.sampled_from([None, 0.5, 3.0]))
def test_buckets_nonnegative_sum_to_total_goodput_in_unit_interval(tmp_path_factory, pairs,
                                                                   ideal):
    d = _write(tmp_path_factory.mktemp("inv"), _lines(pairs, None))
    if not _valid(pairs):
        with pytest.raises(RunDirError, match="holds no goodput spans.*invalid_span"):
            report_run_dir(d, now_ns=NOW)
        return
    (r,) = report_run_dir(d, ideal_step_time_s=ideal, now_ns=NOW)
    assert all(v >= 0 for v in r.buckets_ns.values()), r.buckets_ns
    assert sum(r.buckets_ns.values()) == r.total_ns >= 0
    assert 0.0 <= r.goodput <= 1.0
    for a in r.attempts:
        assert a.end_ns >= a.start_ns
    assert r.step_time.count >= 0


@PROPS
@given(pairs=jobs(), seed=st.integers(0, 2**32 - 1), nfiles=st.integers(1, 4))
def test_result_does_not_depend_on_arrival_order(tmp_path_factory, pairs, seed, nfiles):
    base = tmp_path_factory.mktemp("order")
    if not _valid(pairs):
        return  # refused whatever the order (see the test above)
    rng = random.Random(seed)
    canonical = _doc(report_run_dir(_write(base / "a", _lines(pairs, None)), now_ns=NOW))
    shuffled = _write(base / "b", _lines(pairs, rng), nfiles, rng)
    assert _doc(report_run_dir(shuffled, now_ns=NOW)) == canonical


@PROPS
@given(pairs=jobs(), seed=st.integers(0, 2**32 - 1))
def test_live_batches_equal_one_batch_and_report(tmp_path_factory, pairs, seed):
    rng = random.Random(seed)
    reqs = _lines(pairs, None)
    if _valid(pairs):
        reported = _doc(report_run_dir(_write(tmp_path_factory.mktemp("live"), reqs),
                                       now_ns=NOW))
    else:  # the live service shows the job, empty, with the same skips
        store = LiveStore(min_interval_s=0)
        _feed(store, reqs, rng)
        (r,) = store.results(now_ns=NOW)
        assert r.total_ns == 0 and r.skipped["invalid_span"] == len(pairs)
        return
    one = LiveStore(min_interval_s=0)
    one.ingest_json({"resourceSpans": [rs for r in reqs for rs in r["resourceSpans"]]},
                    ("one", 1))
    assert _doc(one.results(now_ns=NOW)) == reported
    batched = LiveStore(min_interval_s=0)
    _feed(batched, _lines(pairs, rng), rng)
    assert _doc(batched.results(now_ns=NOW)) == reported
    # results asked for between batches do not change the final answer
    again = LiveStore(min_interval_s=0)
    shuffled = _lines(pairs, rng)
    for k in range(0, len(shuffled), 3):
        _feed(again, shuffled[k : k + 3], rng)
        (r,) = again.results(now_ns=NOW)
        assert sum(r.buckets_ns.values()) == r.total_ns
    assert _doc(again.results(now_ns=NOW)) == reported


def test_cli_report_equals_live_on_the_same_files(tmp_path, capsys):
    """``goodput report --format json`` (the real CLI) on files = LiveStore on their lines."""
    rng = random.Random(8)
    res = [resource("cli", a, p, 2) for a in range(2) for p in range(2)]
    pairs, sid = [], 0
    for k, r in enumerate(res):
        trace = f"{k + 1:032x}"
        t0 = T0_NS + (k // 2) * 100 * NS
        for n in range(20):
            sid += 1
            pairs.append((r, otlp_span(schema.STEP, t0 + n * NS, t0 + (n + 1) * NS,
                                       {schema.ATTR_STEP: n + (k // 2) * 10}, trace_id=trace,
                                       span_id=sid)))
        sid += 1
        pairs.append((r, otlp_span(schema.JOB_END, t0 + 20 * NS, t0 + 20 * NS,
                                   {schema.ATTR_END_REASON: "exit"}, trace_id=trace,
                                   span_id=sid)))
    reqs = _lines(pairs, rng)
    d = _write(tmp_path / "run", reqs, 3, rng)
    assert main(["report", str(d), "--format", "json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    for j in cli["jobs"]:
        j.pop("skipped_examples")
    store = LiveStore(min_interval_s=0)
    _feed(store, reqs, rng)
    live = _doc(store.results())
    assert cli == live
    assert live["jobs"][0]["step_time"]["count"] > 0


def test_resume_step_does_not_depend_on_order_of_simultaneous_steps(tmp_path):
    """Found by test_result_does_not_depend_on_arrival_order: two step spans starting at the
    same instant; the resume step was taken from whichever came first in the file."""
    res = resource("tie", 0, 0, 1)
    spans = [otlp_span(schema.STEP, T0_NS + NS, T0_NS + 2 * NS, {schema.ATTR_STEP: n},
                       trace_id="1" * 32, span_id=n + 1) for n in (5, 4)]
    got = set()
    for order in (spans, spans[::-1]):
        d = _write(tmp_path / f"o{len(got)}{order[0]['spanId']}",
                   _lines([(res, sp) for sp in order], None))
        data = read_run_dir(d).jobs["tie"].processes[(0, 0, "")].data
        got.add(resume_step(np.asarray(data)))
    assert got == {3}


def test_step_times_do_not_depend_on_order_of_steps_starting_together(tmp_path):
    """Found by test_result_does_not_depend_on_arrival_order: two spans of step 0 starting
    at the same instant (ends 1 s and 2 s); the step time depended on which came first."""
    res = resource("tie", 0, 0, 1)
    spans = [otlp_span(schema.STEP, T0_NS, T0_NS + k * NS, {schema.ATTR_STEP: 0},
                       trace_id="1" * 32, span_id=k) for k in (1, 2)]
    spans.append(otlp_span(schema.JOB_END, T0_NS + 3 * NS, T0_NS + 3 * NS,
                           {schema.ATTR_END_REASON: "exit"}, trace_id="1" * 32, span_id=9))
    docs = []
    for i, order in enumerate((spans, [spans[1], spans[0], spans[2]])):
        d = _write(tmp_path / str(i), _lines([(res, sp) for sp in order], None))
        docs.append(_doc(report_run_dir(d, now_ns=NOW)))
    assert docs[0] == docs[1]
