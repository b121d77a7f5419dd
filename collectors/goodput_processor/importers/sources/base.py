"""What every foreign-telemetry source shares: its records in one plain form, a translator,
and the emitter that turns what it finds into this project's own spans.

A *source* reads the telemetry another tool already emits (NVIDIA one-logger's spans,
torchtitan's JSON lines, torchft's OTLP log records, a launcher's log lines, ...) and
produces goodput spans of ``docs/span-schema.md`` (``goodput.step``,
``goodput.checkpoint_save``, ...), as OTLP JSON ``ResourceSpans`` dicts, one resource per
OS process incarnation. The accounting never sees the foreign vocabulary: ``goodput
report``, ``goodput serve`` and ``goodput import`` take the emitted spans down the one code
path the project's own recorder's spans take.

The pieces:

- :class:`ForeignSpan` / :class:`ForeignLog`: one OTLP span or log record, whatever its
  encoding (OTLP JSON dict or protobuf message): :func:`spans_of`, :func:`logs_of`.
- :class:`Translator`: the per-stream state of one source (subclassed by each source);
  fed with :meth:`~Translator.spans`, :meth:`~Translator.logs` or
  :meth:`~Translator.line`, closed with :meth:`~Translator.finish`.
- :class:`Emitter`: what a translator writes into: :meth:`~Emitter.process` names an OS
  process incarnation (job, rank, attempt hint, identity) and :meth:`~Emitter.span` adds
  one goodput span to it; :meth:`~Emitter.take` hands over what was added since the last
  take.
- :class:`Source`: a source's registration (name, what it reads, how it is recognised,
  its translator class); see :mod:`goodput_processor.importers.sources`.

Times are integer nanoseconds since the Unix epoch everywhere.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from goodput import schema

from ..common import Problems

__all__ = ["ForeignLog", "ForeignSpan", "Emitter", "Source", "Translator", "attrs_of",
           "first_json",
           "logs_of", "pb_attrs", "spans_of", "value_of"]

#: Spans per emitted ``scopeSpans`` list (as the recorder's journal lines).
SPANS_PER_LIST = 512


# --- foreign records in one plain form ----------------------------------------------------

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
        else:
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
        if self._sid is None:
            self._sid = self._id("spanId", "span_id")
        return self._sid

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
    for s in spans:
        if isinstance(s, dict):
            st = s.get("status")
            out.append(ForeignSpan(
                str(s.get("name", "")), _int(s.get("startTimeUnixNano")),
                _int(s.get("endTimeUnixNano")), None,
                error=bool(st) and st.get("code") in (2, "STATUS_CODE_ERROR"), raw=s))
        else:
            out.append(ForeignSpan(s.name, s.start_time_unix_nano, s.end_time_unix_nano,
                                   None, error=s.status.code == 2, raw=s))
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


# --- the emitter --------------------------------------------------------------------------

def _kv(key: str, value) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _digest(text: str, nbytes: int) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=nbytes).hexdigest()


class _Proc:
    __slots__ = ("key", "job", "resource", "trace_id", "spans", "start_ns", "fixed")

    def __init__(self, key: str, job: str, attrs: dict, start_ns: int | None):
        self.key, self.job, self.resource = key, job, attrs
        self.trace_id = _digest("trace\0" + key, 16)
        self.spans: list[dict] = []
        self.start_ns = start_ns
        self.fixed = False  # the resource was handed out: it never changes after that


class Emitter:
    """Collects the goodput spans a translator makes, grouped by OS process incarnation.

    ``imported_from`` is written as the ``goodput.imported_from`` resource attribute (the
    source's :attr:`Source.imported_from`); ``job``: the job name of every process (``goodput
    import --job``), overriding what the translator names; ``export_delay_ms``: the tool's
    export delay (:attr:`Source.export_delay_ms`), written as
    ``goodput.source.export_delay_ms``. Span ids are deterministic: the foreign span's
    own id when the translator passes it, else a hash of (process key, name, start, end,
    step), so a record received twice (a resent export, a file read again) gives one span,
    which the processor keeps once.
    """

    def __init__(self, imported_from: str, *, job: str | None = None,
                 export_delay_ms: int | None = None):
        self.imported_from = imported_from
        #: ``--job NAME``: every process is written into this job, whatever the source says
        self.job = job
        #: the source tool's export delay (``goodput.source.export_delay_ms``), if any
        self.export_delay_ms = export_delay_ms
        self._procs: dict[str, _Proc] = {}

    def has(self, key: str) -> bool:
        """Whether process ``key`` was named with :meth:`process`."""
        return key in self._procs

    def process(self, key: str, *, job: str, rank: int = 0, count: int | None = None,
                attempt: int = 0, host: str | None = None, pid: int | None = None,
                start_ns: int | None = None, role: str | None = None,
                extra: dict | None = None) -> str:
        """Name one OS process incarnation (idempotent for the same ``key``); returns ``key``.

        Args:
            key: unique text for this incarnation within the input (e.g. ``run_uuid`` +
                rank, or file path + restart number); it becomes ``service.instance.id``
                (hashed).
            job: the job name (``goodput.job.name``, ``service.name``).
            rank: ``goodput.process.index``; count: ``goodput.process.count`` (None: 1).
            attempt: ``goodput.attempt``, a hint (the processor derives attempts from
                evidence); host, pid: ``host.name``, ``process.pid`` when known.
            start_ns: when the OS process started (``goodput.process.start_time_unix_nano``);
                None: the start of its first span.
            role: ``launcher`` for a launcher's own process (``goodput.launcher_event``).
            extra: other resource attributes kept as they are (e.g. ``ml.run.name``).
        """
        if key in self._procs:
            return key
        job = self.job or job
        attrs: dict[str, Any] = {
            schema.RES_SERVICE_NAME: job, schema.RES_JOB_NAME: job,
            schema.RES_SERVICE_INSTANCE_ID: _digest("proc\0" + key, 16),
            schema.RES_ATTEMPT: int(attempt), schema.RES_ATTEMPT_SOURCE: "env",
            schema.RES_PROCESS_INDEX: int(rank),
            schema.RES_PROCESS_INDEX_SOURCE: "env",
            schema.RES_PROCESS_COUNT: int(count) if count else 1,
            schema.RES_SCHEMA_VERSION: schema.SCHEMA_VERSION,
            schema.RES_IMPORTED_FROM: self.imported_from,
        }
        if host is not None:
            attrs[schema.RES_HOST_NAME] = str(host)
        if pid is not None:
            attrs[schema.RES_PROCESS_PID] = int(pid)
        if role is not None:
            attrs[schema.RES_PROCESS_ROLE] = role
        if self.export_delay_ms:
            attrs[schema.RES_SOURCE_EXPORT_DELAY] = int(self.export_delay_ms)
        for k, v in (extra or {}).items():
            if isinstance(v, (bool, int, str)):
                attrs.setdefault(k, v)
        self._procs[key] = _Proc(key, job, attrs, start_ns)
        return key

    def span(self, key: str, name: str, start_ns: int, end_ns: int,
             attrs: dict | None = None, *, span_id: str | None = None,
             error: bool = False) -> None:
        """Add one goodput span (``name``: a ``goodput.schema`` span name) to process
        ``key``. ``attrs``: ``{key: bool | int | str}`` (e.g. ``{schema.ATTR_STEP: 12}``).

        Raises:
            KeyError: ``key`` was never named with :meth:`process`.
        """
        p = self._procs[key]
        if type(start_ns) is not int or type(end_ns) is not int:
            start_ns, end_ns = int(start_ns), int(end_ns)
        if end_ns < start_ns:
            end_ns = start_ns
        if p.start_ns is None:
            p.start_ns = start_ns
        if attrs is None:
            attrs = {}
        if not span_id:
            step = attrs.get(schema.ATTR_STEP, attrs.get(schema.ATTR_CHECKPOINT_STEP, ""))
            span_id = _digest(f"{key}\0{name}\0{start_ns}\0{end_ns}\0{step}", 8)
        s = {"traceId": p.trace_id, "spanId": span_id, "name": name, "kind": 1,
             "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(end_ns),
             "attributes": [_kv(k, v) for k, v in attrs.items()] if attrs else []}
        if error:
            s["status"] = {"code": 2}
        p.spans.append(s)

    def spans_then_alive(self, key: str, start_ns: int, spans, last_seen_ns: int,
                         ended: bool = False) -> None:
        """Add ``spans`` (``(name, start_ns, end_ns, attrs, error)`` tuples) to process
        ``key``, then, when the process was seen after the last of them (and from
        ``start_ns``) and did not end, a heartbeat at ``last_seen_ns``: its last sign of
        life, where the processor ends a killed attempt."""
        last = start_ns
        for name, start, end, attrs, error in spans:
            self.span(key, name, start, end, attrs, error=error)
            last = max(last, end)
        if last_seen_ns > last and not ended:
            self.span(key, schema.HEARTBEAT, last_seen_ns, last_seen_ns)

    def forget(self, job: str) -> None:
        """Drop the processes of ``job`` (``goodput serve`` retired it); a later record of
        it names its process again."""
        for key in [k for k, p in self._procs.items() if p.job == job]:
            del self._procs[key]

    def take(self) -> list[dict]:
        """The OTLP JSON ``ResourceSpans`` of the spans added since the last take (one per
        process with new spans, up to :data:`SPANS_PER_LIST` spans per ``scopeSpans``)."""
        out = []
        for p in self._procs.values():
            if not p.spans:
                continue
            if not p.fixed:
                if p.start_ns is not None:
                    p.resource[schema.RES_PROCESS_START] = int(p.start_ns)
                p.fixed = True
            spans, p.spans = p.spans, []
            out.append({"resource": {"attributes": [_kv(k, v) for k, v in p.resource.items()]},
                        "scopeSpans": [{"scope": {"name": schema.SCOPE_NAME},
                                        "spans": spans[i:i + SPANS_PER_LIST]}
                                       for i in range(0, len(spans), SPANS_PER_LIST)]})
        return out


# --- translators and sources -------------------------------------------------------------

class Translator:
    """The state of one source over one stream of input (every file of one ``goodput
    import``, or everything ``goodput serve`` receives from that source).

    Subclasses override the methods for what their source reads; the defaults ignore the
    input. They never raise on bad input: a record that cannot be read is counted in
    :attr:`problems` (``Problems.add(where, reason, detail)``, reasons such as
    ``malformed``, ``truncated``, ``unknown_record``) and skipped. What they infer rather
    than read (a lost end, an attempt told from a gap) is named in :attr:`warnings`
    (``{name: count}``), which the import summary and the report show.
    """

    def __init__(self, emitter: Emitter, problems: Problems | None = None):
        self.emit = emitter
        self.problems = problems if problems is not None else Problems()
        self.warnings: dict[str, int] = {}

    def warn(self, name: str, n: int = 1) -> None:
        """Count ``n`` occurrences of the named warning ``name``."""
        self.warnings[name] = self.warnings.get(name, 0) + n

    def spans(self, resource: dict, scope: str, spans: list[ForeignSpan], where: str) -> None:
        """Take the spans of one ``ResourceSpans``/``ScopeSpans`` (``resource``: its
        attributes; ``where``: names the input in problems, e.g. ``"file:12"``)."""

    def logs(self, resource: dict, scope: str, records: list[ForeignLog], where: str) -> None:
        """Take the log records of one ``ResourceLogs``/``ScopeLogs``."""

    def line(self, text: str, where: str) -> None:
        """Take one line of a text or JSON-lines file (without its newline)."""

    def start_file(self, path: str) -> None:
        """A new input file begins (file sources: per-file state, e.g. the rank)."""

    def finish(self) -> None:
        """The input has ended (import: every file read): close what is still open."""

    def forget(self, job: str) -> None:
        """``goodput serve`` retired ``job`` (idle for ``--retention``): drop what is kept for
        it, so a long-lived translator's state follows the jobs it serves. Subclasses that
        keep per-job state drop it too (and call this)."""
        self.emit.forget(job)


@dataclass(frozen=True)
class Source:
    """A registered source of foreign telemetry.

    Attributes:
        name: the ``goodput import --from`` value, e.g. ``"torchtitan"``.
        imported_from: the ``goodput.imported_from`` value written on its spans.
        reads: what it reads: a subset of ``{"traces", "logs", "lines"}`` (OTLP spans,
            OTLP log records, lines of files).
        translator: ``translator(emitter, problems) -> Translator``.
        matches: for OTLP input, ``matches(resource_attrs, scope_name, names) -> bool``:
            whether a ``ResourceSpans``/``ResourceLogs`` is this source's (``names``: its
            first span names or log record bodies). None: never taken from OTLP.
        sniff: for files, ``sniff(head) -> bool`` on a file's first 64 KiB (bytes), for
            ``--from`` detection. None: never detected.
        doc: the docs page (relative to ``docs/``), e.g. ``"sources/torchtitan.md"``.
        checked: the versions the source was checked against, e.g. ``"torchtitan 0.3.0"``.
        export_delay_ms: how long the tool holds records before it exports them (its batch
            delay; 0: it writes each record at once), for the ``source_records_lost``
            warning.
    """

    name: str
    imported_from: str
    reads: frozenset
    translator: Callable[[Emitter, Problems], Translator]
    matches: Callable[[dict, str, Iterable[str]], bool] | None = None
    sniff: Callable[[bytes], bool] | None = None
    doc: str = ""
    checked: str = ""
    export_delay_ms: int = 0
