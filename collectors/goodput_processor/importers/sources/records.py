"""Foreign records in one plain form: one OTLP span or log record of another tool, whatever
its encoding (OTLP JSON dict, protobuf message), as :class:`ForeignSpan` /
:class:`ForeignLog` (:func:`spans_of`, :func:`logs_of`), with their attributes as
``{key: python value}`` (:func:`attrs_of`, :func:`pb_attrs`). What is read only on first
use (ids, events, links, attributes) costs nothing to a translator that needs none of it.

Times are integer nanoseconds since the Unix epoch.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ForeignLog", "ForeignSpan", "attrs_of", "first_json", "logs_of", "pb_attrs",
           "spans_of", "value_of"]


def value_of(v: Any) -> Any:
    """Python value of an OTLP JSON ``AnyValue`` dict (``{"intValue": "3"}`` -> 3); arrays
    and maps become lists and dicts; None for anything unreadable."""
    if not isinstance(v, dict):
        return None
    for key, val in v.items():
        if key == "stringValue":
            return val if isinstance(val, str) else None
        if key == "intValue":
            try:
                return int(val)
            except (TypeError, ValueError):
                return None
        if key == "doubleValue":
            try:
                return float(val)
            except (TypeError, ValueError):
                return None
        if key == "boolValue":
            return bool(val)
        if key == "arrayValue":
            return [value_of(x) for x in (val or {}).get("values") or ()]
        if key == "kvlistValue":
            return attrs_of((val or {}).get("values"))
        if key == "bytesValue":
            return val
    return None


def attrs_of(kvs) -> dict[str, Any]:
    """``{key: python value}`` of an OTLP JSON attribute list (bad entries left out)."""
    out: dict[str, Any] = {}
    for kv in kvs or ():
        try:
            out[kv["key"]] = value_of(kv.get("value"))
        except (TypeError, KeyError, AttributeError):
            continue
    return out


def _pb_value(v) -> Any:
    which = v.WhichOneof("value")
    if which in ("int_value", "string_value", "bool_value", "double_value"):
        return getattr(v, which)
    if which == "array_value":
        return [_pb_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return pb_attrs(v.kvlist_value.values)
    if which == "bytes_value":
        return v.bytes_value.hex()
    return None


_PB_SCALARS = frozenset(("int_value", "string_value", "bool_value", "double_value"))


def pb_attrs(kvs) -> dict[str, Any]:
    """``{key: python value}`` of a protobuf ``KeyValue`` list."""
    out = {}
    for kv in kvs:
        v = kv.value
        which = v.WhichOneof("value")
        out[kv.key] = getattr(v, which) if which in _PB_SCALARS else _pb_value(v)
    return out


def _int(v, default: int = 0) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def first_json(head: bytes) -> dict | None:
    """The first line of ``head`` (a file's first bytes) as a JSON object, else None: what
    a source's ``sniff`` and the OTLP detection read."""
    line = head.split(b"\n", 1)[0].strip()
    if not line.startswith(b"{"):
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


class ForeignSpan:
    """One OTLP span of a foreign producer.

    ``name``; ``start_ns``/``end_ns``: ns since the epoch; ``error``: status ERROR. Read on
    first use (most translators need few of them): ``attrs``: ``{key: value}`` (or one with
    :meth:`attr`);
    ``trace_id``/``span_id``/``parent_id``: lowercase hex ("" when absent); ``events``:
    ``[(name, time_ns, attrs)]``; ``links``: ``[(trace_id, span_id)]``.
    """

    __slots__ = ("name", "start_ns", "end_ns", "_attrs", "error", "_raw", "_tid", "_sid",
                 "_pid", "_events", "_links")

    def __init__(self, name: str, start_ns: int, end_ns: int, attrs: dict | None = None,
                 trace_id: str = "", span_id: str = "", parent_id: str = "",
                 events: list | None = None, links: list | None = None,
                 error: bool = False, raw=None):
        self.name, self.start_ns, self.end_ns = name, start_ns, end_ns
        self._attrs = attrs if attrs is not None or raw is not None else {}
        self.error, self._raw = error, raw
        if raw is None:
            self._tid, self._sid, self._pid = trace_id, span_id, parent_id
            self._events, self._links = events, links
        else:  # read from ``raw`` on first use
            self._tid = self._sid = self._pid = self._events = self._links = None

    @property
    def attrs(self) -> dict:
        """``{key: python value}`` of the span's attributes (read on first use)."""
        if self._attrs is None:
            r = self._raw
            self._attrs = (attrs_of(r.get("attributes")) if isinstance(r, dict)
                           else pb_attrs(r.attributes))
        return self._attrs

    def attr(self, key: str, default=None):
        """The value of attribute ``key`` (``default`` when absent), without reading the
        others: the cheap way for a translator that needs one or two of them."""
        if self._attrs is not None:
            return self._attrs.get(key, default)
        r = self._raw
        if isinstance(r, dict):
            for kv in r.get("attributes") or ():
                if kv.get("key") == key:
                    v = kv.get("value")
                    x = v.get("intValue") if type(v) is dict else None
                    if x is not None:
                        try:
                            return int(x)
                        except (TypeError, ValueError):
                            return None
                    return value_of(v)
            return default
        for kv in r.attributes:
            if kv.key == key:
                v = kv.value
                which = v.WhichOneof("value")
                return getattr(v, which) if which in _PB_SCALARS else _pb_value(v)
        return default

    def _id(self, json_key: str, pb_field: str) -> str:
        r = self._raw
        if isinstance(r, dict):
            return _hex(r.get(json_key))
        return getattr(r, pb_field).hex()

    @property
    def trace_id(self) -> str:
        if self._tid is None:
            self._tid = self._id("traceId", "trace_id")
        return self._tid

    @property
    def span_id(self) -> str:
        sid = self._sid
        if sid is None:
            r = self._raw
            if type(r) is dict:
                v = r.get("spanId")
                sid = self._sid = v.lower() if type(v) is str and len(v) == 16 else _hex(v)
            else:
                sid = self._sid = r.span_id.hex()
        return sid

    @property
    def parent_id(self) -> str:
        if self._pid is None:
            self._pid = self._id("parentSpanId", "parent_span_id")
        return self._pid

    @property
    def events(self) -> list:
        if self._events is None:
            r = self._raw
            if isinstance(r, dict):
                self._events = [(str(e.get("name", "")), _int(e.get("timeUnixNano")),
                                 attrs_of(e.get("attributes"))) for e in r.get("events") or ()]
            else:
                self._events = [(e.name, int(e.time_unix_nano), pb_attrs(e.attributes))
                                for e in r.events]
        return self._events

    @property
    def links(self) -> list:
        if self._links is None:
            r = self._raw
            if isinstance(r, dict):
                self._links = [(_hex(x.get("traceId")), _hex(x.get("spanId")))
                               for x in r.get("links") or ()]
            else:
                self._links = [(x.trace_id.hex(), x.span_id.hex()) for x in r.links]
        return self._links

    def __repr__(self) -> str:
        return (f"ForeignSpan({self.name!r}, {self.start_ns}, {self.end_ns}, {self.attrs!r}"
                f"{', error' if self.error else ''})")


@dataclass(slots=True)
class ForeignLog:
    """One OTLP log record of a foreign producer: ``time_ns`` (its ``timeUnixNano``, else
    ``observedTimeUnixNano``), ``body`` (str, dict, ... as sent), ``attrs``, ``severity``
    (text, "" when absent), ``trace_id``/``span_id`` (hex, "" when absent)."""

    time_ns: int
    body: Any = None
    attrs: dict = field(default_factory=dict)
    severity: str = ""
    trace_id: str = ""
    span_id: str = ""


def _hex(v) -> str:
    """Lowercase hex of an id given as OTLP JSON hex text, as base64 text (protobuf's own
    JSON mapping, ``json_format.MessageToJson``, writes bytes so) or as protobuf bytes;
    "" when absent or unreadable."""
    if isinstance(v, str):
        if len(v) == 16 or len(v) == 32:  # hex (base64 of 8 or 16 bytes is 12 or 24 long):
            return v.lower()  # a bad digit is the reader's to refuse, as for any span
        if not v:
            return ""
        try:
            raw = base64.b64decode(v, validate=True)
        except (ValueError, binascii.Error):
            return ""
        return raw.hex() if len(raw) in (8, 16) else ""
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    return ""


def spans_of(spans) -> list[ForeignSpan]:
    """:class:`ForeignSpan` of each span of an OTLP ``scopeSpans``'s list: JSON dicts or
    protobuf ``Span`` messages.

    Raises:
        TypeError, KeyError, ValueError, AttributeError: a span is not an OTLP span (the
            caller counts it as malformed).
    """
    out = []
    append, new, cls = out.append, object.__new__, ForeignSpan
    for s in spans:  # (ForeignSpan(..., raw=s), made without the call's arguments)
        f = new(cls)
        f._raw = s
        f._attrs = f._tid = f._sid = f._pid = f._events = f._links = None
        if isinstance(s, dict):
            get = s.get
            name = get("name", "")
            f.name = name if type(name) is str else str(name)
            try:
                f.start_ns = int(get("startTimeUnixNano"))
            except (TypeError, ValueError):
                f.start_ns = 0
            try:
                f.end_ns = int(get("endTimeUnixNano"))
            except (TypeError, ValueError):
                f.end_ns = 0
            st = get("status")
            f.error = bool(st) and st.get("code") in (2, "STATUS_CODE_ERROR")
        else:
            f.name, f.start_ns, f.end_ns = s.name, s.start_time_unix_nano, s.end_time_unix_nano
            f.error = s.status.code == 2
        append(f)
    return out


def logs_of(records) -> list[ForeignLog]:
    """:class:`ForeignLog` of each record of an OTLP ``scopeLogs``'s ``logRecords``: JSON
    dicts or protobuf ``LogRecord`` messages.

    Raises:
        TypeError, KeyError, ValueError, AttributeError: not an OTLP log record.
    """
    out = []
    for r in records:
        if isinstance(r, dict):
            t = _int(r.get("timeUnixNano")) or _int(r.get("observedTimeUnixNano"))
            out.append(ForeignLog(time_ns=t, body=value_of(r.get("body")),
                                  attrs=attrs_of(r.get("attributes")),
                                  severity=str(r.get("severityText") or ""),
                                  trace_id=_hex(r.get("traceId")),
                                  span_id=_hex(r.get("spanId"))))
        else:
            t = int(r.time_unix_nano) or int(r.observed_time_unix_nano)
            out.append(ForeignLog(time_ns=t, body=_pb_value(r.body) if r.HasField("body")
                                  else None, attrs=pb_attrs(r.attributes),
                                  severity=r.severity_text, trace_id=r.trace_id.hex(),
                                  span_id=r.span_id.hex()))
    return out
