"""No span makes the accounting assert or raise (Hypothesis, over the whole int range).

Span start and end anywhere in [0, 2**64) ns, any schema span name, any attribute values
(ints of any size, strings, bools, floats), on process identities that collide or not: the
report of the spool (``goodput report`` in this process) and of ``goodput serve``'s store
give a result whose buckets sum to the total, or a documented refusal (a spool that holds
no usable span). Out-of-range spans are counted as ``invalid_span``, never raised.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otlp_fixtures import otlp_span, request_line, resource

from goodput import schema
from goodput_processor import report_run_dir, to_json
from goodput_processor.cli import main
from goodput_processor.read.reader import RunDirError, SpoolFormatError
from goodput_processor.serve import LiveStore

SETTINGS = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
EDGES = (0, 1, 2**53 - 1, 2**53, 2**54, 2**62, 2**63 - 1, 2**63, 2**64 - 1)
TIMES = st.one_of(st.sampled_from(EDGES), st.integers(0, 2**64 - 1),
                  st.integers(1_700_000_000 * 10**9, 1_700_000_100 * 10**9))
KEYS = (schema.ATTR_STEP, schema.ATTR_STEP_COUNT, schema.ATTR_CHECKPOINT_STEP,
        schema.ATTR_BLOCKING, schema.ATTR_OPEN, schema.ATTR_BADPUT_TYPE,
        schema.ATTR_END_REASON, schema.ATTR_HEARTBEAT_INTERVAL_MS, schema.RES_PROCESS_INDEX,
        schema.RES_PROCESS_COUNT)
VALUES = st.one_of(st.integers(-(2**64), 2**64), st.booleans(), st.text(max_size=8),
                   st.floats(allow_nan=True, allow_infinity=True))
SPAN = st.tuples(st.sampled_from(schema.SPAN_NAMES), TIMES, TIMES,
                 st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4))
PROCESS = st.fixed_dictionaries({
    "attempt": st.integers(0, 2), "index": st.integers(0, 2),
    "identity": st.sampled_from([None, ("i1", 10, 1_700_000_000 * 10**9),
                                 ("i2", 11, 1_700_000_050 * 10**9)]),
    "spans": st.lists(SPAN, min_size=1, max_size=12)})


def _lines(procs) -> list[str]:
    lines, sid = [], 1
    for p in procs:
        extra = {}
        if p["identity"]:
            inst, pid, start = p["identity"]
            extra = {schema.RES_SERVICE_INSTANCE_ID: inst, schema.RES_PROCESS_PID: pid,
                     schema.RES_PROCESS_START: start, schema.RES_PROCESS_INDEX_SOURCE: "default"}
        res = resource(attempt=p["attempt"], process=p["index"], version="1.1", **extra)
        spans = []
        for name, start, end, attrs in p["spans"]:
            span = otlp_span(name, 0, 0, attrs, span_id=sid)
            span["startTimeUnixNano"], span["endTimeUnixNano"] = str(start), str(end)
            spans.append(span)
            sid += 1
        lines.append(request_line(res, spans))
    return lines


def _check(results) -> None:
    for r in results:
        assert sum(r.buckets_ns.values()) == r.total_ns
        assert all(v >= 0 for v in r.buckets_ns.values()), r.buckets_ns
        json.loads(to_json([r]))


@SETTINGS
@given(procs=st.lists(PROCESS, min_size=1, max_size=3))
def test_any_span_gives_a_result_or_a_counted_rejection(tmp_path_factory, procs):
    d = tmp_path_factory.mktemp("hostile")
    (d / "spans.jsonl").write_text("\n".join(_lines(procs)) + "\n")
    try:
        results = report_run_dir(d, now_ns=2**63 - 1)
    except RunDirError as e:  # documented: nothing usable at all
        assert "holds no goodput spans" in str(e)
    except SpoolFormatError as e:  # documented: no span, and a line that is not JSON (a
        assert "not an OTLP JSON lines file" in str(e)  # float attribute written Infinity)
    else:
        _check(results)
    store = LiveStore()
    for i, line in enumerate(_lines(procs)):
        store.ingest_line(line.encode(), ("test", str(i)))
    _check(store.results(now_ns=2**63 - 1))


@pytest.mark.parametrize("start, end", [(0, 2**54 + 1), (0, 2**63 - 1), (2**53, 2**62)])
def test_a_step_of_2_54_ns_or_more_is_accounted_exactly(tmp_path, capsys, start, end):
    """The span that crashed the accounting (AssertionError: a float sum of step time)."""
    spans = [otlp_span(schema.JOB_START, start, start),
             otlp_span(schema.STEP, start, end, {schema.ATTR_STEP: 1}),
             otlp_span(schema.JOB_END, end, end, {schema.ATTR_END_REASON: "exit"})]
    (tmp_path / "spans.jsonl").write_text(request_line(resource(), spans) + "\n")
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["step_time"]["count"] == 1
    assert job["productive_time_s"] == pytest.approx((end - start) / 1e9)
