"""Foreign producers' OTLP in ``goodput serve``: their spans and log records read through
the sources (:mod:`goodput_processor.importers.sources`, ``docs/sources/README.md``).

:class:`ForeignIntake` is a part of :class:`~goodput_processor.serve.store.LiveStore`. It
keeps the store's one :class:`~goodput_processor.importers.sources.driver.
OtlpTranslation` (a translator per source, kept across requests, used under the store's
lock) and takes in what the sources make of a request:

- Traces: a request whose spans are all of this project's own scope (``goodput``) goes
  the way it always went, with one check per ``ScopeSpans`` (:func:`own_only_pb`,
  :func:`own_only_json`). Otherwise its ``ResourceSpans`` are split into the own ones
  (passed on untouched; those no source takes are counted ``skipped.unknown`` as before)
  and the goodput spans the sources made of the others. A ``ResourceSpans`` a source
  takes may also hold this project's own scope (one SDK exporting both, e.g. the
  recorder beside nemo-lens): those ``ScopeSpans`` are passed on as own too.
- Logs (``LogsService/Export``, ``POST /v1/logs``): the ``ResourceLogs`` go to the
  sources; records no source takes are counted in ``stats["log_records_ignored"]`` and
  the request is answered as taken in.

The goodput spans a source made are taken in exactly as if a client had POSTed them as
OTLP JSON: written to the write-ahead log (so a replay gives the same jobs without
translating again) and read by the JSON path, under the same admission (jobs, rate) and
limits. They are taken in before the request's own spans: when they are refused
(retryable), nothing of the request is taken in, and the client's retry is translated
again (the emitted span ids are deterministic, so what was taken twice counts once).

What the translators found is never raised and never stops serve: records they skipped
(``OtlpTranslation.problems``) are ``stats["source_skipped"]`` (and, by reason, in
:meth:`ForeignIntake.sources_summary`), their named warnings (``Translator.warnings``) per
source and, where one request's translation made the spans of one job only, per job.
Neither changes the accounting: the job's report equals ``goodput report`` of the same
translated spans. Both are the store's counters since it started (a replay of the
write-ahead log does not translate, so it does not count them again).
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from opentelemetry.proto.trace.v1 import trace_pb2

from goodput import schema

from ..importers.sources.driver import OtlpTranslation
from ..read.emitted import ingest_emitted
from ..read.reader import job_name
from .encode import json_line

__all__ = ["ForeignIntake", "own_only_json", "own_only_pb"]

_OWN = schema.SCOPE_NAME


def own_only_pb(resource_spans) -> bool:
    """Whether every span of protobuf ``ResourceSpans`` ``resource_spans`` is of this
    project's own scope (no source to ask)."""
    for rs in resource_spans:
        for ss in rs.scope_spans:
            if ss.scope.name != _OWN and len(ss.spans):
                return False
    return True


def own_only_json(resource_spans) -> bool:
    """:func:`own_only_pb` of OTLP JSON ``ResourceSpans`` dicts (parts that are not OTLP
    structure are left to the reader, which counts them as malformed)."""
    if not isinstance(resource_spans, list):
        return True
    for rs in resource_spans:
        scopes = rs.get("scopeSpans") if isinstance(rs, dict) else None
        for ss in scopes if isinstance(scopes, list) else ():
            if not isinstance(ss, dict) or not ss.get("spans"):
                continue
            scope = ss.get("scope")
            if not isinstance(scope, dict) or scope.get("name") != _OWN:
                return False
    return True


def _own_part(rs, pb: bool):
    """The ``ResourceSpans`` of this project's own ``ScopeSpans`` in ``rs`` (one a source
    took), or None when it has none."""
    if pb:
        keep = [ss for ss in rs.scope_spans if ss.scope.name == _OWN and len(ss.spans)]
        if not keep:
            return None
        out = trace_pb2.ResourceSpans(schema_url=rs.schema_url)
        out.resource.CopyFrom(rs.resource)
        out.scope_spans.extend(keep)
        return out
    keep = [ss for ss in rs.get("scopeSpans") or ()
            if isinstance(ss, dict) and (ss.get("scope") or {}).get("name") == _OWN
            and ss.get("spans")]
    return {**rs, "scopeSpans": keep} if keep else None


def _is_pb(items) -> bool:
    return all(not isinstance(it, dict) and hasattr(it, "resource") for it in items)


def _dicts(v) -> bool:
    """None, or a list of dicts."""
    return v is None or isinstance(v, list) and all(isinstance(x, dict) for x in v)


def _json_ok(item, logs: bool) -> bool:
    """Whether OTLP JSON ``ResourceSpans`` (or ``ResourceLogs``) ``item`` has the structure
    the sources read: objects and lists where OTLP has them (the records themselves are
    checked by the sources)."""
    inner, leaf = ("scopeLogs", "logRecords") if logs else ("scopeSpans", "spans")
    if not isinstance(item, dict):
        return False
    res = item.get("resource")
    if res is not None and not (isinstance(res, dict) and _dicts(res.get("attributes"))):
        return False
    scopes = item.get(inner)
    if not _dicts(scopes):
        return False
    for ss in scopes or ():
        scope = ss.get("scope")
        if scope is not None and not isinstance(scope, dict) or not _dicts(ss.get(leaf)):
            return False
    return True


def _where(where) -> str:
    return where if isinstance(where, str) else ":".join(map(str, where))


class ForeignIntake:
    """The sources' side of a :class:`~goodput_processor.serve.store.LiveStore` (a base
    class of it: it uses the store's ``_lock``, ``stats``, ``wal``, ``_admit``,
    ``_log_lines`` and ``_reader``). See the module docstring."""

    def _init_sources(self) -> None:
        #: The sources' translators, one per source (used under the store's lock).
        self.foreign = OtlpTranslation()
        #: job -> {"<source>.<warning>": count} (warnings of translations that made spans
        #: of this job only).
        self._source_job_warnings: dict[str, Counter] = {}

    # --- translating ---------------------------------------------------------------

    def _warning_totals(self) -> Counter:
        return Counter({f"{src}.{name}": n for src, w in self.foreign.warnings.items()
                        for name, n in w.items()})

    def _translate(self, logs: bool, items: list, where: str) -> tuple[list, list]:
        """Under the lock: run the sources over ``items`` (``ResourceLogs`` when ``logs``,
        else ``ResourceSpans``; protobuf messages or OTLP JSON dicts) -> ``(own,
        translated)`` (``own``: the ``ResourceSpans`` no source takes; none for logs). A
        JSON item whose structure is not OTLP is never handed to a source: passed on as own
        (spans: the reader counts it as malformed) or counted as skipped (logs). Counts
        what the translators skipped and warned."""
        tr, before = self.foreign, self._warning_totals()
        bad = [] if not items or not isinstance(items[0], dict) and _is_pb(items) else [
            it for it in items if not _json_ok(it, logs)]
        if bad:
            items = [it for it in items if all(it is not b for b in bad)]
            if logs:
                tr.problems.add(where, "malformed", f"{len(bad)} ResourceLogs not OTLP",
                                len(bad))
        try:
            own, out = (([], tr.logs(items, where, batches=True)) if logs
                        else tr.traces(items, where, batches=True))
        except Exception as e:  # noqa: BLE001 - a source never stops serve
            tr.problems.add(where, "malformed", f"the sources failed on it ({e!r})")
            own, out = ([] if logs else list(items)), []
        if bad and not logs:
            own += bad
        self.stats["source_skipped"] = len(tr.problems)
        delta = self._warning_totals() - before
        if delta and out:
            jobs = {job_name(b.resource) for b in out}
            if len(jobs) == 1:
                self._source_job_warnings.setdefault(jobs.pop(), Counter()).update(delta)
        return own, out

    def _foreign_spans(self, resource_spans, where, pb: bool):
        """Translate the foreign ``ResourceSpans`` of a request and take in what the sources
        made of them (:meth:`_take_translated`); returns the request of the own ones (a
        protobuf-like namespace, or an OTLP JSON dict).

        Raises:
            Refused: the store is not ready, or refused the translated spans.
        """
        items = list(resource_spans)
        with self._lock:
            self._admit({})  # not while replaying: the client sends it again
            own, translated = self._translate(False, items, _where(where))
            kept = {id(rs) for rs in own}
            for rs in items:
                if id(rs) in kept:
                    continue
                part = _own_part(rs, pb)  # (counted as own spans, below)
                if part is not None:
                    own.append(part)
                self.stats["spans"] += sum(
                    len(ss.spans) if pb else len(ss.get("spans") or ())
                    for ss in (rs.scope_spans if pb else rs.get("scopeSpans") or ())
                    if (ss.scope.name if pb else (ss.get("scope") or {}).get("name")) != _OWN)
        self._take_translated(translated, where)
        return SimpleNamespace(resource_spans=own) if pb else {"resourceSpans": own}

    def _take_translated(self, translated: list, where) -> None:
        """Take in the goodput spans a source made (``translated``: its
        :class:`~goodput_processor.importers.sources.base.EmittedSpans`) as a client's OTLP
        JSON request: admitted, logged as the OTLP JSON they are, read into rows straight
        (:func:`~goodput_processor.read.emitted.ingest_emitted`: the rows the log's line
        gives on replay); not counted as a request of its own.

        Raises:
            Refused: over a limit, or the write-ahead log cannot write them.
        """
        if not translated:
            return
        groups: dict[str, tuple[list, int]] = {}  # job -> (batches, spans), as split_json
        for b in translated:
            name = job_name(b.resource)  # as json_job_name of its OTLP JSON
            got, n = groups.get(name) or ([], 0)
            got.append(b)
            groups[name] = (got, n + len(b))
        lines = ({n: json_line([b.resource_spans() for b in bs])
                  for n, (bs, _) in groups.items()} if self.wal else {})
        where = where if isinstance(where, tuple) else (where,)
        with self._lock:
            self._admit(groups)
            self._log_lines(groups, lines, lambda bs: self._take_emitted(bs, where))
            self.stats["spans_translated"] += sum(n for _, n in groups.values())

    def _take_emitted(self, batches: list, where: tuple) -> None:
        """Under the lock: read one job's translated spans into the store's reader."""
        for b in batches:
            try:
                ingest_emitted(self._reader, b, where)
            except (TypeError, AttributeError, KeyError, ValueError, OverflowError) as e:
                self._reader._skip(None, "malformed", where, f"bad OTLP structure ({e!r})")

    # --- logs ------------------------------------------------------------------------

    def ingest_logs(self, req, source: str = "otlp") -> int:
        """Take in a protobuf ``ExportLogsServiceRequest`` through the sources; returns its
        number of log records.

        Raises:
            Refused: not ready, over a limit, or the write-ahead log cannot write the
                spans made of it.
        """
        return self._ingest_logs(list(req.resource_logs), source, None)

    def ingest_logs_json(self, req: dict, where: tuple) -> int:
        """Take in one OTLP JSON ``ExportLogsServiceRequest`` (a dict) through the sources;
        returns its number of log records.

        Raises:
            ValueError: ``req`` is not a dict with a ``resourceLogs`` list.
            Refused: as :meth:`ingest_logs`.
        """
        if not isinstance(req, dict) or not isinstance(req.get("resourceLogs"), list):
            got = f"{type(req).__name__}" + (f" with keys {sorted(req)[:5]}"
                                             if isinstance(req, dict) else "")
            raise ValueError(f"expected a JSON object with a \"resourceLogs\" list (an OTLP "
                             f"ExportLogsServiceRequest), got {got}")
        return self._ingest_logs(req["resourceLogs"], where[0], where)

    def _ingest_logs(self, items: list, source: str, where) -> int:
        tr = self.foreign
        with self._lock:
            self._admit({})
            self.stats["requests"] += 1
            where = where or (source, f"request {self.stats['requests']}")
            text, ignored = _where(where), tr.ignored
            n = sum(_records(rl) for rl in items)
            _, translated = self._translate(True, items, text)
            self.stats["log_records"] += n
            self.stats["log_records_ignored"] += tr.ignored - ignored
        self._take_translated(translated, where)
        return n

    # --- what the sources found ---------------------------------------------------

    def sources_summary(self) -> dict:
        """What the sources found since the store started: ``{"skipped": {reason: n},
        "skipped_examples": [...], "warnings": {source: {name: n}}, "job_warnings": {job:
        {"<source>.<name>": n}}, "log_records_ignored": n, "spans_translated": n}``
        (empty dict while no foreign record was seen)."""
        with self._lock:
            tr = self.foreign
            if not (tr.warnings or tr.problems.counts or tr.ignored):
                return {}
            return {"skipped": dict(tr.problems.counts),
                    "skipped_examples": list(tr.problems.examples),
                    "warnings": {s: dict(w) for s, w in tr.warnings.items()},
                    "job_warnings": {j: dict(c) for j, c in
                                     sorted(self._source_job_warnings.items())},
                    "log_records_ignored": self.stats["log_records_ignored"],
                    "spans_translated": self.stats["spans_translated"]}


def _records(rl) -> int:
    """Log records in one ``ResourceLogs`` (protobuf or JSON; 0 when unreadable)."""
    try:
        if isinstance(rl, dict):
            return sum(len(sl.get("logRecords") or ()) for sl in rl.get("scopeLogs") or ())
        return sum(len(sl.log_records) for sl in rl.scope_logs)
    except (AttributeError, TypeError):
        return 0
