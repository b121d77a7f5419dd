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
  encoding (OTLP JSON dict or protobuf message): :func:`spans_of`, :func:`logs_of`
  (defined in :mod:`.records`).
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

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from goodput import schema

from ..common import Problems
from .records import (
    ForeignLog,
    ForeignSpan,
    attrs_of,
    first_json,
    logs_of,
    pb_attrs,
    spans_of,
    value_of,
)

__all__ = ["ForeignLog", "ForeignSpan", "EmittedSpans", "Emitter", "Source", "SpanColumns",
           "Translator", "attrs_of", "first_json", "logs_of", "pb_attrs", "spans_of", "value_of"]

#: Spans per emitted ``scopeSpans`` list (as the recorder's journal lines).
SPANS_PER_LIST = 512


# --- the emitter --------------------------------------------------------------------------

def _kv(key: str, value) -> dict:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _digest(text: str, nbytes: int) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=nbytes).hexdigest()


class SpanColumns:
    """Spans of one name read in bulk (a template scan of a Collector's OTLP JSON line), as
    columns: ``start``, ``end`` (int64 ns), ``value`` (int64: the one int attribute read of
    each, e.g. ``megatron.iteration``), ``sid`` (int64: ``int(spanId, 16)`` less 2**64 past
    2**63; the text: 16 lowercase hex digits); ``span(i)`` gives span ``i``'s OTLP JSON
    dict, as a parse of its line gives it (every span's is the same but for these fields).
    As goodput spans (:meth:`as_spans`, :meth:`Emitter.kept_columns`): ``name``, ``attr``
    (the attribute ``value + add`` is written as) and ``error`` (one status for all)."""

    __slots__ = ("start", "end", "value", "sid", "error", "span", "name", "attr", "add")

    def __init__(self, start, end, value, sid, span=None):
        self.start, self.end, self.value, self.sid, self.span = start, end, value, sid, span
        self.name, self.attr, self.add, self.error = "", "", 0, False

    def __len__(self) -> int:
        return len(self.start)

    def as_spans(self, name: str, attr: str, add: int = 0,
                 error: bool = False) -> SpanColumns:
        """These columns as goodput spans ``name`` with ``{attr: value + add}``, status
        ERROR where ``error``."""
        out = SpanColumns(self.start, self.end, self.value, self.sid)
        out.name, out.attr, out.add, out.error = name, attr, add, error
        return out

    def tuples(self) -> list[tuple]:
        """The goodput spans as :meth:`Emitter.span_kept` keeps them."""
        name, attr, add, error = self.name, self.attr, self.add, self.error
        return [(name, s, e, {attr: v + add}, f"{i & 0xFFFF_FFFF_FFFF_FFFF:016x}", error)
                for s, e, v, i in zip(self.start.tolist(), self.end.tolist(),
                                      self.value.tolist(), self.sid.tolist(), strict=True)]


class _Proc:
    __slots__ = ("key", "job", "resource", "trace_id", "spans", "start_ns", "fixed",
                 "columns")

    def __init__(self, key: str, job: str, attrs: dict, start_ns: int | None):
        self.key, self.job, self.resource = key, job, attrs
        self.trace_id = _digest("trace\0" + key, 16)
        self.spans: list[tuple] = []  # see EmittedSpans
        self.start_ns = start_ns
        self.fixed = False  # the resource was handed out: it never changes after that
        self.columns = False  # spans holds a SpanColumns (Emitter.kept_columns)


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
             attrs: dict | None = None, span_id: str | None = None,
             error: bool = False) -> None:
        """Add one goodput span (``name``: a ``goodput.schema`` span name) to process
        ``key``. ``attrs``: ``{key: bool | int | str}`` (e.g. ``{schema.ATTR_STEP: 12}``);
        ``span_id``: 16 hex digits (None: see the class); ``error``: status ERROR.

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
        if not span_id:
            step = (attrs.get(schema.ATTR_STEP, attrs.get(schema.ATTR_CHECKPOINT_STEP, ""))
                    if attrs else "")
            span_id = _digest(f"{key}\0{name}\0{start_ns}\0{end_ns}\0{step}", 8)
        # kept as a tuple (the OTLP JSON dict is made only when asked: take()); the
        # attributes copied, as a translator may reuse its dict
        p.spans.append((name, start_ns, end_ns, attrs.copy() if attrs else None, span_id,
                        error))

    def span_kept(self, key: str, name: str, start_ns: int, end_ns: int, attrs: dict | None,
                  span_id: str, error: bool = False) -> None:
        """:meth:`span` for a translator's hot path, where the caller has made sure that
        ``start_ns <= end_ns`` are ints and ``span_id`` is given: ``attrs`` is kept as it is
        (not copied: a dict the caller made for this span and never changes after).

        Raises:
            KeyError: ``key`` was never named with :meth:`process`.
        """
        p = self._procs[key]
        if p.start_ns is None:
            p.start_ns = start_ns
        p.spans.append((name, start_ns, end_ns, attrs, span_id, error))

    def kept_list(self, key: str, start_ns: int) -> list:
        """The list of process ``key``'s spans that :meth:`span_kept` appends to, for a
        translator's hot path to append ``(name, start_ns, end_ns, attrs, span_id, error)``
        tuples to itself, on :meth:`span_kept`'s terms, until the next take; ``start_ns``:
        the start of the first span it will append (the process's start if none yet).

        Raises:
            KeyError: ``key`` was never named with :meth:`process`.
        """
        p = self._procs[key]
        if p.start_ns is None:
            p.start_ns = start_ns
        return p.spans

    def kept_columns(self, key: str, columns: SpanColumns) -> None:
        """:meth:`span_kept` of each of ``columns``' spans (:meth:`SpanColumns.as_spans`:
        ``start <= end`` each), kept as the columns, in their place among process ``key``'s
        spans (:class:`EmittedSpans`).

        Raises:
            KeyError: ``key`` was never named with :meth:`process`.
        """
        if not len(columns):
            return
        p = self._procs[key]
        if p.start_ns is None:
            p.start_ns = int(columns.start[0])
        p.spans.append(columns)
        p.columns = True

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
        return [b.resource_spans() for b in self.take_batches()]

    def take_batches(self) -> list[EmittedSpans]:
        """:meth:`take`'s spans as :class:`EmittedSpans`, one per process with new spans,
        before they are made OTLP JSON: a reader can make its rows of them straight
        (:mod:`goodput_processor.read.emitted`), and each gives its OTLP JSON on demand."""
        out = []
        for p in self._procs.values():
            if not p.spans:
                continue
            if not p.fixed:
                if p.start_ns is not None:
                    p.resource[schema.RES_PROCESS_START] = int(p.start_ns)
                p.fixed = True
            spans, p.spans = p.spans, []
            out.append(EmittedSpans(p.job, p.resource, p.trace_id, spans, p.columns))
            p.columns = False
        return out


class EmittedSpans:
    """The goodput spans an :class:`Emitter` made for one process since its last take.

    ``job``: the process's job; ``resource``: its resource attributes ``{key: bool | int |
    str}`` (fixed once taken: never changed after); ``trace_id``: 32 hex digits;
    ``spans``: ``(name, start_ns, end_ns, attrs or None, span_id (16 hex digits), error)``
    tuples, and where ``columns``, also :class:`SpanColumns` (spans in bulk, in their place;
    :meth:`tuples` gives every span as a tuple). :meth:`resource_spans` is the same as OTLP
    JSON.
    """

    __slots__ = ("job", "resource", "trace_id", "spans", "columns")

    def __init__(self, job: str, resource: dict, trace_id: str, spans: list,
                 columns: bool = False):
        self.job, self.resource, self.trace_id, self.spans = job, resource, trace_id, spans
        self.columns = columns

    def __len__(self) -> int:
        if not self.columns:
            return len(self.spans)
        return sum(1 if type(s) is tuple else len(s) for s in self.spans)

    def tuples(self) -> list[tuple]:
        """Every span as a ``(name, start_ns, end_ns, attrs, span_id, error)`` tuple."""
        if not self.columns:
            return self.spans
        out: list[tuple] = []
        for s in self.spans:
            if type(s) is tuple:
                out.append(s)
            else:
                out.extend(s.tuples())
        return out

    def resource_spans(self) -> dict:
        """The OTLP JSON ``ResourceSpans`` dict (up to :data:`SPANS_PER_LIST` spans per
        ``scopeSpans``)."""
        tid, out = self.trace_id, []
        for name, start, end, attrs, span_id, error in self.tuples():
            s = {"traceId": tid, "spanId": span_id, "name": name, "kind": 1,
                 "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
                 "attributes": [_kv(k, v) for k, v in attrs.items()] if attrs else []}
            if error:
                s["status"] = {"code": 2}
            out.append(s)
        return {"resource": {"attributes": [_kv(k, v) for k, v in self.resource.items()]},
                "scopeSpans": [{"scope": {"name": schema.SCOPE_NAME},
                                "spans": out[i:i + SPANS_PER_LIST]}
                               for i in range(0, len(out), SPANS_PER_LIST)]}


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
