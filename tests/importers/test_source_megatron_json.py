"""The ``megatron`` translator's OTLP JSON path (:meth:`MegatronTranslator.spans_json`, what
``goodput import`` and ``goodput report`` of the Collector's files use) gives what its
general path (:meth:`~MegatronTranslator.spans` of :func:`spans_of`) gives: the same
goodput spans, problems (counts and examples), warnings and raised errors, on the real
run's file and on iteration spans of every unusual shape mixed into it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from goodput_processor.importers.common import Problems
from goodput_processor.importers.sources import get_source
from goodput_processor.importers.sources.base import Emitter, attrs_of, spans_of

DATA = Path(__file__).resolve().parents[1] / "data" / "sources" / "megatron"


def _batches(path: Path) -> list[tuple[dict, str, list]]:
    """(resource attributes, scope name, span dicts) of each ``scopeSpans`` of the file."""
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line).get("resourceSpans") or ():
            attrs = attrs_of((rs.get("resource") or {}).get("attributes"))
            for ss in rs.get("scopeSpans") or ():
                out.append((attrs, (ss.get("scope") or {}).get("name") or "", ss["spans"]))
    return out


def _run(batches, fast: bool):
    """Everything the translator made of ``batches``, through one path."""
    src = get_source("megatron")
    em = Emitter(src.imported_from, export_delay_ms=src.export_delay_ms)
    problems = Problems()
    tr = src.translator(em, problems)
    errors = []
    for i, (res, scope, items) in enumerate(batches):
        items = copy.deepcopy(items)
        try:
            if fast:
                tr.spans_json(res, scope, items, f"in:{i}")
            else:
                tr.spans(res, scope, spans_of(items), f"in:{i}")
        except (TypeError, KeyError, ValueError, AttributeError) as e:
            errors.append((i, repr(e)))
    tr.finish()
    return em.take(), dict(problems.counts), problems.examples, dict(tr.warnings), errors


def _iteration(it: int, parent: str, t0: int) -> dict:
    return {"traceId": "02" * 16, "spanId": f"{0xabc000 + it:016x}", "parentSpanId": parent,
            "name": "megatron.train.iteration", "kind": 1,
            "startTimeUnixNano": str(t0 + it * 10**8),
            "endTimeUnixNano": str(t0 + it * 10**8 + 9 * 10**7),
            "attributes": [{"key": "is_goodput_span", "value": {"boolValue": True}},
                           {"key": "megatron.iteration", "value": {"intValue": str(it)}}]}


def _set(key, value):
    def f(s):
        s[key] = value
    return f


def _attrs(value):
    return _set("attributes", value)


def _drop(key):
    def f(s):
        del s[key]
    return f


_IT = {"key": "megatron.iteration", "value": {"intValue": "7"}}
MUTATIONS = {
    "clean": lambda s: None,
    "start 0": _set("startTimeUnixNano", "0"),
    "start after end": _set("startTimeUnixNano", "99999999999999999999"),
    "no start": _drop("startTimeUnixNano"),
    "start an int": lambda s: s.__setitem__("startTimeUnixNano", int(s["startTimeUnixNano"])),
    "start a float": _set("startTimeUnixNano", 1.7e18),
    "start text": _set("startTimeUnixNano", "soon"),
    "id upper case": lambda s: s.__setitem__("spanId", s["spanId"].upper()),
    "id short": _set("spanId", "abc"),
    "id base64": _set("spanId", "AAAAAAAAAAE="),
    "no id": _drop("spanId"),
    "id an int": _set("spanId", 12),
    "no attributes": _drop("attributes"),
    "attributes a dict": _attrs({"megatron.iteration": 3}),
    "attributes a str": _attrs("megatron.iteration"),
    "attribute not a dict first": _attrs(["junk", _IT]),
    "attribute not a dict after": _attrs([_IT, "junk"]),
    "attribute without key": _attrs([{"value": {"intValue": "1"}}, _IT]),
    "iteration a string": _attrs([{"key": "megatron.iteration",
                                   "value": {"stringValue": "7"}}]),
    "iteration negative": _attrs([{"key": "megatron.iteration", "value": {"intValue": "-1"}}]),
    "iteration text": _attrs([{"key": "megatron.iteration", "value": {"intValue": "x"}}]),
    "iteration a number": _attrs([{"key": "megatron.iteration", "value": {"intValue": 7}}]),
    "iteration value a list": _attrs([{"key": "megatron.iteration", "value": [1]}]),
    "iteration twice": _attrs([_IT, {"key": "megatron.iteration",
                                     "value": {"intValue": "8"}}]),
    "iteration low": _attrs([{"key": "megatron.iteration", "value": {"intValue": "0"}}]),
    "status error": _set("status", {"code": 2}),
    "status error text": _set("status", {"code": "STATUS_CODE_ERROR"}),
    "status ok": _set("status", {}),
    "status a str": _set("status", "ERROR"),
    "name an int": _set("name", 12),
    "name a list": _set("name", ["megatron.train.iteration"]),
    "other name": _set("name", "megatron.iteration"),
    "not a span": lambda s: s.clear() or s.update({"name": None}),
}


@pytest.fixture(scope="module")
def real():
    return _batches(DATA / "otlp.jsonl")


def test_real_runs_give_the_same(real):
    for path in (DATA / "otlp.jsonl", DATA / "otlp-default.jsonl"):
        batches = _batches(path)
        assert _run(batches, True) == _run(batches, False)
    assert _run(real, True)[0], "no spans"


@pytest.mark.parametrize("where", ["first", "middle", "after end"])
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_unusual_iteration_spans_give_the_same(real, name, where):
    res, scope, _ = next(b for b in real if any(
        s["name"] == "megatron.train.iteration" for s in b[2]))
    iters = [s for b in real for s in b[2] if s["name"] == "megatron.train.iteration"]
    parent, t0 = iters[-1]["parentSpanId"], int(iters[-1]["endTimeUnixNano"]) + 10**9
    spans = [_iteration(it, parent, t0) for it in range(20, 26)]
    MUTATIONS[name](spans[3])
    if name == "not a span":
        spans[3] = ["megatron.train.iteration"]
    extra = (res, scope, spans)
    if where == "first":  # an incarnation's first spans: its start marker
        batches = [extra] + real
    elif where == "middle":
        k = real.index(next(b for b in real if b[2] and b[2][0]["name"] ==
                            "megatron.train.iteration"))
        batches = real[:k + 1] + [extra] + real[k + 1:]
    else:  # after the incarnation ended (megatron_span_after_end)
        batches = real + [extra]
    fast, slow = _run(batches, True), _run(batches, False)
    assert fast == slow
