"""What ``goodput serve`` refuses as not OTLP, and where it counts what no job owns.

**A request is checked whole before anything of it is stored.** :func:`check_traces_json`
walks the structure of an OTLP/JSON ``ExportTraceServiceRequest`` that the processor
reads (``resourceSpans`` -> ``resource`` -> ``attributes`` -> ``scopeSpans`` ->
``scope`` -> ``spans``) and raises :class:`ValueError` at the first value of the wrong
type: ``{"resourceSpans": 5}``, a resource that is a list, a span that is not an object,
an attribute without a string ``key``, an ``intValue`` that is not an integer. The
receivers answer it ``400`` (HTTP) and count it ``refused_malformed``; nothing of the
request reaches a job, the write-ahead log or the sources (all or nothing). The protobuf
paths need no such check: a message that parses has the types of the schema, and one
that does not parse is refused (``400`` / ``INVALID_ARGUMENT``) by the receivers.

The members of a span object must have their OTLP/JSON types too (ids and name strings,
times integers or decimal strings, lists of attributes, events and links): a span whose
``"spanId"`` is a number or whose ``"attributes"`` is ``5`` makes the request not OTLP.
What those members say is the span's own: a span whose id is not hex or that ends before it
starts is skipped and counted as ``invalid_span`` in its job, the same way ``goodput
report`` counts it when it reads that job's write-ahead log or spool
(``tests/serve/test_serve_malformed.py`` compares the two).

**Skips that no job owns stay serve's.** A spool or log line that is not OTLP JSON before
any line of its file named a job cannot be told to a job. :class:`ServeSkips` counts such
records in the store's ``stats`` (``skipped_<reason>``, exported as
``goodput_serve_skipped_total{goodput_serve_reason}``) and keeps the first
:data:`MAX_EXAMPLES` examples for the operator (the service's log, at debug level): never
in a job's report, where one client's address or another job's file path would show.
"""

from __future__ import annotations

import logging
from collections import Counter

__all__ = ["MAX_EXAMPLES", "ServeSkips", "check_traces_json"]

_log = logging.getLogger("goodput_processor.serve")

#: Examples kept of records no job owns.
MAX_EXAMPLES = 20


def check_traces_json(req) -> None:
    """Check that ``req`` (parsed JSON) is an OTLP/JSON ``ExportTraceServiceRequest`` down
    to its span objects (see the module docstring); ``null`` stands for an absent field.

    Raises:
        ValueError: the first value of a wrong type, named by its path, e.g.
            ``resourceSpans[0].resource: expected an object, got list``.
    """
    if not isinstance(req, dict) or "resourceSpans" not in req:
        got = type(req).__name__ + (f" with keys {sorted(req)[:5]}" if isinstance(req, dict)
                                    else "")
        raise ValueError(f"expected a JSON object with \"resourceSpans\" (an OTLP "
                         f"ExportTraceServiceRequest), got {got}")
    for i, rs in enumerate(_list(req["resourceSpans"], "resourceSpans")):
        where = f"resourceSpans[{i}]"
        _object(rs, where)
        res = rs.get("resource")
        if res is not None:
            _object(res, where + ".resource")
            _attributes(res.get("attributes"), where + ".resource.attributes")
        for key in ("scopeSpans", "instrumentationLibrarySpans"):
            for j, ss in enumerate(_list(rs.get(key), f"{where}.{key}")):
                at = f"{where}.{key}[{j}]"
                _object(ss, at)
                for skey in ("scope", "instrumentationLibrary"):
                    scope = ss.get(skey)
                    if scope is not None:
                        _object(scope, f"{at}.{skey}")
                        name = scope.get("name")
                        if name is not None and not isinstance(name, str):
                            raise ValueError(f"{at}.{skey}.name: expected a string, got "
                                             f"{type(name).__name__}")
                for k, span in enumerate(_list(ss.get("spans"), at + ".spans")):
                    if not isinstance(span, dict):
                        _object(span, f"{at}.spans[{k}]")
                    _span(span, f"{at}.spans[{k}]")


_SPAN_STRINGS = ("traceId", "spanId", "parentSpanId", "name", "traceState")
_SPAN_TIMES = ("startTimeUnixNano", "endTimeUnixNano")


def _span(span: dict, where: str) -> None:
    """The members of a span object have their OTLP/JSON types: ids and name strings (a
    string that is not hex is a bad span, counted ``invalid_span``, not a bad request),
    times integers or decimal strings, ``attributes``/``events``/``links`` lists,
    ``status`` an object."""
    for key in _SPAN_STRINGS:
        x = span.get(key)
        if x is not None and not isinstance(x, str):
            raise ValueError(f"{where}.{key}: expected a string, got {type(x).__name__}")
    for key in _SPAN_TIMES:
        x = span.get(key)
        if x is not None and not (type(x) is int or (isinstance(x, str) and x.isdigit())):
            raise ValueError(f"{where}.{key}: expected an integer or a decimal string, "
                             f"got {x!r:.40}")
    attrs = span.get("attributes")
    if attrs:
        _attributes(attrs, where + ".attributes")
    for key in ("events", "links"):
        for i, e in enumerate(_list(span.get(key), f"{where}.{key}")):
            _object(e, f"{where}.{key}[{i}]")
    x = span.get("status")
    if x is not None:
        _object(x, where + ".status")


def _object(v, where: str) -> None:
    if not isinstance(v, dict):
        raise ValueError(f"{where}: expected an object, got {type(v).__name__}")


def _list(v, where: str) -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        raise ValueError(f"{where}: expected a list, got {type(v).__name__}")
    return v


def _attributes(attrs, where: str) -> None:
    """Resource attributes: a list of ``{"key": str, "value": AnyValue}``."""
    for i, a in enumerate(_list(attrs, where)):
        at = f"{where}[{i}]"
        _object(a, at)
        if not isinstance(a.get("key"), str):
            raise ValueError(f"{at}.key: expected a string, got {type(a.get('key')).__name__}")
        value = a.get("value")
        if value is not None:
            _object(value, at + ".value")
            _any_value(value, at + ".value")


def _any_value(v: dict, where: str) -> None:
    """The scalar members of an ``AnyValue`` the processor reads have their JSON types
    (an int64 may be a decimal string, a double a string such as ``"NaN"``)."""
    x = v.get("stringValue")
    if x is not None and not isinstance(x, str):
        raise ValueError(f"{where}.stringValue: expected a string, got {type(x).__name__}")
    x = v.get("boolValue")
    if x is not None and not isinstance(x, bool):
        raise ValueError(f"{where}.boolValue: expected true or false, got {type(x).__name__}")
    for key, convert in (("intValue", int), ("doubleValue", float)):
        x = v.get(key)
        if x is None:
            continue
        ok = isinstance(x, (int, float)) and not isinstance(x, bool)
        if not ok and isinstance(x, str):
            try:
                convert(x)
                ok = True
            except ValueError:
                ok = False
        if not ok:
            raise ValueError(f"{where}.{key}: expected a number, got {x!r:.40}")


class ServeSkips:
    """Records no job owns, counted in ``stats`` (a Counter, the store's) as
    ``skipped_<reason>``, with the first :data:`MAX_EXAMPLES` examples in
    :attr:`examples` (``"where: why"`` strings, for the operator only)."""

    def __init__(self, stats: Counter):
        self.stats = stats
        self.examples: list[str] = []

    def skip(self, reason: str, where: tuple, why: str, n: int = 1) -> None:
        """Count ``n`` records skipped for ``reason``; the caller holds the store's lock."""
        self.stats["skipped_" + reason] += n
        text = ":".join(map(str, where)) + ": " + why
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(text)
        _log.debug("goodput serve: skipped %d record(s) owned by no job: %s", n, text)

    def counts(self) -> dict[str, int]:
        """``{reason: n}`` of the records skipped so far."""
        return {k[len("skipped_"):]: n for k, n in self.stats.items()
                if k.startswith("skipped_") and n}
