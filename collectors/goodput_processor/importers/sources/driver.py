"""Run sources over their input: files (``goodput import``, ``goodput report`` of a foreign
producer's OTLP JSON directory) and OTLP requests (``goodput serve``).

- :func:`translate_files`: every file through one translator; returns a :class:`SourceRun`.
- :class:`OtlpTranslation`: the translators ``goodput serve`` keeps, one per source; it
  splits a request into this project's own ``ResourceSpans`` (passed on untouched) and the
  goodput spans translated from a foreign producer's.
- :func:`write_spool` (:mod:`.spool`, named here too): emitted ``ResourceSpans`` as spool
  files under ``RUN_DIR/<job>/``.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import io
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from goodput import schema

try:  # optional speed-up, never a dependency (as in goodput_processor.read.reader)
    import orjson

    _loads = orjson.loads
    _BYTES = True  # orjson reads UTF-8 bytes as their text
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads
    _BYTES = False  # json.loads would guess the bytes' encoding

from ..common import Problems, check_readable
from .base import (
    Emitter,
    Source,
    Translator,
    attrs_of,
    first_json,
    logs_of,
    pb_attrs,
    spans_of,
)
from .spool import write_spool

__all__ = ["OtlpTranslation", "SourceRun", "detect_file_source", "match_otlp",
           "translate_files", "translate_otlp", "write_spool"]

_HEAD_BYTES = 64 << 10
#: The first line of an OTLP JSON file read to tell its source, at most.
_LINE_BYTES = 64 << 20
#: Span names (or log bodies) handed to :attr:`Source.matches`, at most.
_NAMES = 8


@dataclass
class SourceRun:
    """What :func:`translate_files` made: ``resource_spans`` (OTLP JSON ``ResourceSpans``
    of goodput spans), ``problems`` (skipped records by reason, with examples),
    ``warnings`` (``{name: count}``: what was inferred, not read), ``records`` (lines,
    spans and log records read)."""

    source: str
    resource_spans: list = field(default_factory=list)
    problems: Problems = field(default_factory=Problems)
    warnings: dict = field(default_factory=dict)
    records: int = 0


def _open(path: str):
    """``path`` (inflated if gzip) as bytes: :func:`_lines` makes its lines."""
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")
    # (an OTLP JSON line of the Collector is some 230 KB: read in 8 KiB pieces, its lines
    # cost 3x what they do in 1 MiB ones)
    return open(path, "rb", buffering=1 << 20)


def _lines(f):
    """``(body, text)`` of each line of binary file ``f``, as a text file in UTF-8 with
    ``errors="replace"`` and universal newlines (``newline=""``) reads them, without the
    line end: ``body`` the line's bytes (None where they are not its text's UTF-8: a lone
    ``\\r`` split it), ``text`` a callable giving its text. The bytes are decoded only
    when asked (an OTLP JSON line is parsed from its bytes)."""
    for raw in f:
        body = raw.rstrip(b"\r\n")
        if b"\r" not in body:
            yield body, body.decode
            continue
        for piece in io.StringIO(raw.decode("utf-8", "replace"), newline=""):
            text = piece.rstrip("\r\n")
            yield None, lambda *_, text=text: text


def _head(path: str) -> bytes:
    with open(path, "rb") as f:
        head = f.read(_HEAD_BYTES)
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(path, "rb") as g:
                head = g.read(_HEAD_BYTES)
        except (OSError, EOFError):
            pass
    return head


def _first_line(path: str) -> bytes:
    """The first line of ``path`` (inflated if gzip), at most :data:`_LINE_BYTES` bytes:
    one OTLP request of the Collector's file exporter can be megabytes."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
            return f.readline(_LINE_BYTES)
    except (OSError, EOFError):
        return b""


def _otlp_first(head: bytes) -> dict | None:
    """The first line of ``head`` as an OTLP JSON request dict, else None."""
    doc = first_json(head)
    if doc is not None and ("resourceSpans" in doc or "resourceLogs" in doc):
        return doc
    return None


def _names(items, key: str) -> list[str]:
    out = []
    for s in items:
        if isinstance(s, dict):
            v = s.get(key)
            if key == "body":
                v = (v or {}).get("stringValue") if isinstance(v, dict) else None
        else:
            v = s.name if key == "name" else (s.body.string_value if s.HasField("body")
                                              else None)
        if isinstance(v, str):
            out.append(v)
        if len(out) >= _NAMES:
            break
    return out


def match_otlp(resource: dict, scope: str, names: Iterable[str]) -> Source | None:
    """The source whose :attr:`~Source.matches` takes a ``ResourceSpans``/``ResourceLogs``
    with these resource attributes, scope name and first span names (or log bodies); None
    for this project's own scope and for what no source takes."""
    if scope == schema.SCOPE_NAME:
        return None
    from . import all_sources

    names = list(names)
    for src in all_sources().values():
        if src.matches is not None:
            try:
                if src.matches(resource, scope, names):
                    return src
            except Exception:  # noqa: BLE001 - a source's test never stops the processor
                continue
    return None


def detect_file_source(path: str) -> str | None:
    """The name of the source that recognises file ``path`` (its first 64 KiB), else None.

    An OTLP JSON file (the Collector's file exporter) is told by its first line's
    resources (up to 64 MiB of it);
    anything else by each source's :attr:`~Source.sniff`.

    Raises:
        InputError: the file cannot be read.
    """
    from . import all_sources

    check_readable(path)
    head = _head(path)
    doc = _otlp_first(_first_line(path)) if head.lstrip()[:1] == b"{" else None
    if doc is not None:
        for key, inner, leaf, nkey in (("resourceSpans", "scopeSpans", "spans", "name"),
                                       ("resourceLogs", "scopeLogs", "logRecords", "body")):
            for rs in doc.get(key) or ():
                attrs = attrs_of((rs.get("resource") or {}).get("attributes"))
                for ss in rs.get(inner) or ():
                    scope = (ss.get("scope") or {}).get("name") or ""
                    src = match_otlp(attrs, scope, _names(ss.get(leaf) or (), nkey))
                    if src is not None:
                        return src.name
        return None
    for src in all_sources().values():
        if src.sniff is not None:
            try:
                if src.sniff(head):
                    return src.name
            except Exception:  # noqa: BLE001
                continue
    return None


#: What a template scan puts in a line's first spans list for the spans it took out
#: (``translate_files``' ``scan``): an object no line can hold (its key is NUL, written
#: with a backslash; a line scanned holds none).
TAKEN = b'{"\\u0000":0}'
_TAKEN = {"\0": 0}


def _taken_list(doc) -> bool:
    """Whether ``doc``'s first resource's first scope's spans list begins with
    :data:`TAKEN` (so the spans taken out of the line were there)."""
    try:
        items = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
        return type(items) is list and bool(items) and items[0] == _TAKEN
    except (TypeError, KeyError, IndexError):
        return False


def _feed_otlp(tr: Translator, src: Source, doc: dict, where: str,
               problems: Problems, taken=None) -> int | None:
    """Feed the parts of OTLP JSON request ``doc`` that ``src`` takes to ``tr``; returns
    the spans and log records read. ``taken``: the :class:`~.base.SpanColumns` that
    :data:`TAKEN` stands for (:func:`_taken_list`), given to ``tr.spans_taken`` with the
    rest of that list; where it declines, None, and nothing was fed."""
    n = 0
    for key, inner, leaf in (("resourceSpans", "scopeSpans", "spans"),
                             ("resourceLogs", "scopeLogs", "logRecords")):
        for rs in doc.get(key) or ():
            attrs = attrs_of((rs.get("resource") or {}).get("attributes"))
            for ss in rs.get(inner) or ():
                scope = (ss.get("scope") or {}).get("name") or ""
                items = ss.get(leaf) or []
                count = len(items)
                try:
                    if taken is not None:  # the first list: its spans taken, then the rest
                        got, taken = taken, None
                        count += len(got) - 1
                        if not tr.spans_taken(attrs, scope, got, items[1:], where):
                            return None
                    elif leaf == "spans":
                        raw = getattr(tr, "spans_json", None)  # OTLP JSON dicts as they are
                        if raw is not None:
                            raw(attrs, scope, items, where)
                        else:
                            tr.spans(attrs, scope, spans_of(items), where)
                    else:
                        tr.logs(attrs, scope, logs_of(items), where)
                except (TypeError, KeyError, ValueError, AttributeError) as e:
                    problems.add(where, "malformed", f"bad OTLP structure ({e!r})", count)
                n += count
    return n


@contextlib.contextmanager
def no_gc():
    """The cyclic garbage collector off for a bulk translation (restored after): the dicts
    a translation makes hold no cycles, refcounting frees them, and the collector's passes
    over a heap that grows by millions of them cost more than the translation itself (the
    megatron source on 100,000 spans: 16 -> 12 us a span; ``goodput report`` of its
    directory 22 -> 10 us a span)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def translate_files(source: Source, paths, progress=None, *,
                    job: str | None = None, batches: bool = False,
                    sink=None, scan=None) -> SourceRun:
    """Run ``source`` over ``paths`` (in order) with one translator; returns what it made.

    A file is read as lines (``.gz`` is inflated). For a source that reads OTLP
    (``traces``/``logs``), a line that is an OTLP JSON request is handed over whole (the
    Collector's file exporter writes one request per line); other lines go to
    :meth:`Translator.line`. ``progress(n_bytes)`` is called as files are read. ``job``:
    write every process into this job (``goodput import --job``). ``batches``: the run's
    ``resource_spans`` are :class:`~.base.EmittedSpans` (one per process, read into rows
    straight by :func:`goodput_processor.read.emitted.ingest_emitted`), not OTLP JSON.
    ``sink``: called with the :class:`~.base.EmittedSpans` made of each OTLP JSON line
    (a list, maybe empty) as soon as it is read, so that they are not all held at once;
    ``resource_spans`` then holds only what the end of the input made (as ``batches``).
    ``scan``: for a translator with ``spans_taken`` (and ``template_names``: the span names
    and the int attribute it takes), ``scan(line, template_names)`` takes the leading spans
    of an OTLP JSON line's first spans list out of its text: None, or ``(skeleton,
    columns)``, the line with those spans replaced by :data:`TAKEN` and the spans as
    :class:`~.base.SpanColumns` (``goodput_processor.read.foreign_template.scan``); the
    translator gets the same spans, whichever way they come.

    Raises:
        InputError: a file is missing or unreadable.
    """
    with no_gc():
        return _translate_files(source, paths, progress, job, batches or sink is not None,
                                sink, scan)


def _scanned(tr: Translator, src: Source, scan, names, body: bytes, where: str,
             problems: Problems) -> int | None:
    """:func:`_feed_otlp` of OTLP JSON line ``body`` through ``scan`` (see
    :func:`translate_files`); None where it cannot be (nothing fed: parse the line)."""
    got = scan(body, names)
    if got is None:
        return None
    skeleton, taken = got
    try:
        doc = _loads(skeleton)
    except ValueError:
        return None  # (the whole line is parsed, for its own error)
    if not _taken_list(doc):
        return None
    return _feed_otlp(tr, src, doc, where, problems, taken)


def _translate_files(source: Source, paths, progress, job, batches=False,
                     sink=None, scan=None) -> SourceRun:
    run = SourceRun(source.name)
    emitter = Emitter(source.imported_from, job=job, export_delay_ms=source.export_delay_ms)
    tr = source.translator(emitter, run.problems)
    otlp = bool(source.reads & {"traces", "logs"})
    names = getattr(tr, "template_names", None) if _BYTES and scan is not None else None
    for path in paths:
        path = os.fspath(path)
        size = check_readable(path)
        tr.start_file(path)
        with _open(path) as f:
            for lineno, (body, text) in enumerate(_lines(f), 1):
                where = f"{path}:{lineno}"
                if body is None:
                    body = text("utf-8", "replace").encode("utf-8", "surrogatepass")
                if otlp and body[:1] == b"{" and (b'"resourceSpans"' in body
                                                  or b'"resourceLogs"' in body):
                    fed = None if names is None else _scanned(
                        tr, source, scan, names, body, where, run.problems)
                    if fed is not None:
                        run.records += fed
                        if sink is not None:
                            sink(emitter.take_batches())
                        continue
                    doc = None
                    if _BYTES:  # invalid UTF-8 is refused: read as its text, below
                        try:
                            doc = _loads(body)
                        except ValueError:
                            pass
                    if doc is None:
                        try:
                            doc = _loads(text("utf-8", "replace"))
                        except ValueError as e:
                            run.problems.add(where, "malformed", f"not JSON ({e})")
                            continue
                    if not isinstance(doc, dict):
                        run.problems.add(where, "malformed", "not a JSON object")
                        continue
                    run.records += _feed_otlp(tr, source, doc, where, run.problems)
                    del doc
                    if sink is not None:
                        sink(emitter.take_batches())
                else:
                    line = text("utf-8", "replace")
                    if line.strip():
                        run.records += 1
                        tr.line(line, where)
        if progress is not None:
            progress(size)
    tr.finish()
    run.resource_spans = emitter.take_batches() if batches else emitter.take()
    run.warnings = dict(tr.warnings)
    return run


def translate_otlp(source: Source, doc: dict, where: str = "input") -> SourceRun:
    """Run ``source`` over one OTLP JSON request ``doc`` alone (a fresh translator,
    finished at its end): for tests and one-shot conversions."""
    run = SourceRun(source.name)
    emitter = Emitter(source.imported_from, export_delay_ms=source.export_delay_ms)
    tr = source.translator(emitter, run.problems)
    run.records = _feed_otlp(tr, source, doc, where, run.problems)
    tr.finish()
    run.resource_spans = emitter.take()
    run.warnings = dict(tr.warnings)
    return run


class OtlpTranslation:
    """The sources' state in a long-lived receiver (``goodput serve``): one translator per
    source, kept across requests (a step told from two consecutive records needs the one
    before). Not thread-safe: the caller holds its lock.

    ``problems`` and ``warnings`` (per source name) accumulate what the translators found.
    """

    def __init__(self) -> None:
        self._tr: dict[str, tuple[Emitter, Translator]] = {}
        self.problems = Problems()
        self.warnings: dict[str, dict] = {}
        #: Log records no source took.
        self.ignored = 0

    def _translator(self, src: Source) -> tuple[Emitter, Translator]:
        got = self._tr.get(src.name)
        if got is None:
            em = Emitter(src.imported_from, export_delay_ms=src.export_delay_ms)
            got = self._tr[src.name] = (em, src.translator(em, self.problems))
            self.warnings[src.name] = got[1].warnings
        return got

    def traces(self, resource_spans, where: str, *,
               batches: bool = False) -> tuple[list, list]:
        """Split ``resource_spans`` (OTLP JSON dicts or protobuf ``ResourceSpans``) into
        ``(own, translated)``: the ones no source takes, untouched (this project's spans,
        and foreign ones the reader counts as unknown), and the goodput ``ResourceSpans``
        (JSON dicts; ``batches``: :class:`~.base.EmittedSpans`) the sources made of the
        others."""
        own, used = [], set()
        for rs in resource_spans:
            pb = not isinstance(rs, dict)
            if pb:
                attrs = pb_attrs(rs.resource.attributes)
                scopes = [(ss.scope.name, ss.spans) for ss in rs.scope_spans]
            else:
                attrs = attrs_of((rs.get("resource") or {}).get("attributes"))
                scopes = [((ss.get("scope") or {}).get("name") or "", ss.get("spans") or [])
                          for ss in rs.get("scopeSpans") or ()]
            taken = False
            for scope, spans in scopes:
                src = match_otlp(attrs, scope, _names(spans, "name"))
                if src is None:
                    continue
                taken = True
                em, tr = self._translator(src)
                used.add(src.name)
                try:
                    tr.spans(attrs, scope, spans_of(spans), where)
                except (TypeError, KeyError, ValueError, AttributeError) as e:
                    self.problems.add(where, "malformed", f"bad OTLP span ({e!r})", len(spans))
            if not taken:
                own.append(rs)
        return own, self._take(used, batches)

    def logs(self, resource_logs, where: str, *, batches: bool = False) -> list:
        """The goodput ``ResourceSpans`` (JSON dicts; ``batches``:
        :class:`~.base.EmittedSpans`) made of ``resource_logs`` (OTLP JSON dicts or
        protobuf ``ResourceLogs``); records no source takes are dropped (counted in
        :attr:`ignored`)."""
        used = set()
        for rl in resource_logs:
            if isinstance(rl, dict):
                attrs = attrs_of((rl.get("resource") or {}).get("attributes"))
                scopes = [((sl.get("scope") or {}).get("name") or "",
                           sl.get("logRecords") or []) for sl in rl.get("scopeLogs") or ()]
            else:
                attrs = pb_attrs(rl.resource.attributes)
                scopes = [(sl.scope.name, sl.log_records) for sl in rl.scope_logs]
            for scope, records in scopes:
                src = match_otlp(attrs, scope, _names(records, "body"))
                if src is None:
                    self.ignored += len(records)
                    continue
                em, tr = self._translator(src)
                used.add(src.name)
                try:
                    tr.logs(attrs, scope, logs_of(records), where)
                except (TypeError, KeyError, ValueError, AttributeError) as e:
                    self.problems.add(where, "malformed", f"bad OTLP log record ({e!r})",
                                      len(records))
        return self._take(used, batches)

    def forget(self, job: str) -> None:
        """``goodput serve`` retired ``job``: every translator drops what it kept for it."""
        for _em, tr in self._tr.values():
            try:
                tr.forget(job)
            except Exception:  # noqa: BLE001 - a source's bookkeeping never stops serve
                continue

    def _take(self, used, batches: bool = False) -> list:
        out = []
        for name in sorted(used):
            em = self._tr[name][0]
            out.extend(em.take_batches() if batches else em.take())
        return out
