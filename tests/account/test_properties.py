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
from hypothesis import given
from hypothesis import strategies as st
from otlp_fixtures import T0_NS, otlp_span, resource
from random_jobs import NOW, NS, PROPS, feed_store, jobs, otlp_requests, write_requests

from goodput import schema
from goodput_processor import read_run_dir, report_run_dir, to_json_dict
from goodput_processor.account.accounting import resume_step
from goodput_processor.cli import main
from goodput_processor.read.reader import RunDirError
from goodput_processor.serve.store import LiveStore


def _doc(results) -> dict:
    """The JSON report without skip examples (they name files or requests)."""
    doc = to_json_dict(results)
    for j in doc["jobs"]:
        j.pop("skipped_examples")
    return doc


def _valid(pairs) -> bool:
    """Whether any span is readable (else ``goodput report`` refuses the directory)."""
    return any(int(sp["endTimeUnixNano"]) >= int(sp["startTimeUnixNano"]) for _, sp in pairs)


@PROPS
@given(pairs=jobs(), ideal=st.sampled_from([None, 0.5, 3.0]))
def test_buckets_nonnegative_sum_to_total_goodput_in_unit_interval(tmp_path_factory, pairs,
                                                                   ideal):
    d = write_requests(tmp_path_factory.mktemp("inv"), otlp_requests(pairs, None))
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
    canonical = _doc(report_run_dir(write_requests(base / "a", otlp_requests(pairs, None)),
                                    now_ns=NOW))
    shuffled = write_requests(base / "b", otlp_requests(pairs, rng), nfiles, rng)
    assert _doc(report_run_dir(shuffled, now_ns=NOW)) == canonical


@PROPS
@given(pairs=jobs(), seed=st.integers(0, 2**32 - 1))
def test_live_batches_equal_one_batch_and_report(tmp_path_factory, pairs, seed):
    rng = random.Random(seed)
    reqs = otlp_requests(pairs, None)
    if _valid(pairs):
        reported = _doc(report_run_dir(write_requests(tmp_path_factory.mktemp("live"), reqs),
                                       now_ns=NOW))
    else:  # the live service shows the job, empty, with the same skips
        store = LiveStore(min_interval_s=0)
        feed_store(store, reqs, rng)
        (r,) = store.results(now_ns=NOW)
        assert r.total_ns == 0 and r.skipped["invalid_span"] == len(pairs)
        return
    one = LiveStore(min_interval_s=0)
    one.ingest_json({"resourceSpans": [rs for r in reqs for rs in r["resourceSpans"]]},
                    ("one", 1))
    assert _doc(one.results(now_ns=NOW)) == reported
    batched = LiveStore(min_interval_s=0)
    feed_store(batched, otlp_requests(pairs, rng), rng)
    assert _doc(batched.results(now_ns=NOW)) == reported
    # results asked for between batches do not change the final answer
    again = LiveStore(min_interval_s=0)
    shuffled = otlp_requests(pairs, rng)
    for k in range(0, len(shuffled), 3):
        feed_store(again, shuffled[k : k + 3], rng)
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
    reqs = otlp_requests(pairs, rng)
    d = write_requests(tmp_path / "run", reqs, 3, rng)
    assert main(["report", str(d), "--format", "json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    for j in cli["jobs"]:
        j.pop("skipped_examples")
    store = LiveStore(min_interval_s=0)
    feed_store(store, reqs, rng)
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
        d = write_requests(tmp_path / f"o{len(got)}{order[0]['spanId']}",
                   otlp_requests([(res, sp) for sp in order], None))
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
        d = write_requests(tmp_path / str(i), otlp_requests([(res, sp) for sp in order], None))
        docs.append(_doc(report_run_dir(d, now_ns=NOW)))
    assert docs[0] == docs[1]
