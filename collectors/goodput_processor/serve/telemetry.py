"""``goodput serve``'s own telemetry: what it took in, refused and holds, as OTel metrics.

Published next to the goodput metrics by the same meter provider, whose resource has
``service.name`` = ``goodput-serve`` (:data:`SERVICE_NAME`). As Prometheus scrapes them:

========================================  =============================================
``goodput_serve_requests_total``          requests taken in (OTLP and spool lines)
``goodput_serve_spans_total``             spans in them, of any scope
``goodput_serve_refused_total``           refused requests, by ``goodput_serve_reason``
``goodput_serve_jobs``                    jobs tracked
``goodput_serve_wal_size_bytes``          bytes in the write-ahead log's segments
``goodput_serve_replay_duration_seconds`` seconds the last start spent replaying it
``goodput_serve_inflight_bytes``          request bytes held in memory now
========================================  =============================================

Foreign producers (:mod:`goodput_processor.serve.foreign`): ``goodput_serve_log_records_total``
(OTLP log records received), ``goodput_serve_log_records_ignored_total`` (of them, those no
source takes), ``goodput_serve_source_skipped_total`` (foreign records the sources skipped)
and ``goodput_serve_spans_translated_total`` (goodput spans the sources made).
"""

from __future__ import annotations

from opentelemetry.metrics import CallbackOptions, Observation

__all__ = ["SERVICE_NAME", "add_serve_instruments"]

#: ``service.name`` of serve's meter provider.
SERVICE_NAME = "goodput-serve"
ATTR_REASON = "goodput.serve.reason"


def add_serve_instruments(meter, store, budget=lambda: None) -> None:
    """Create serve's instruments on ``meter`` (an OTel ``Meter``), reading ``store`` (a
    :class:`~goodput_processor.serve.store.LiveStore`) and ``budget()`` (the receivers'
    :class:`~goodput_processor.serve.limits.ByteBudget`, or None) at each collection."""

    def stat(key):
        return lambda options: [Observation(store.stats.get(key, 0))]

    def refused(options: CallbackOptions):
        return [Observation(n, {ATTR_REASON: k[len("refused_"):]})
                for k, n in sorted(store.stats.items()) if k.startswith("refused_")]

    def skipped(options: CallbackOptions):  # records no job owns (.malformed.ServeSkips)
        return [Observation(n, {ATTR_REASON: k[len("skipped_"):]})
                for k, n in sorted(store.stats.items()) if k.startswith("skipped_")]

    def wal_size(options):
        return [] if store.wal is None else [Observation(store.wal.size_bytes())]

    def replay(options):
        r = store.replayed
        return [] if r is None else [Observation(r.seconds)]

    def inflight(options):
        b = budget()
        return [] if b is None else [Observation(b.used)]

    meter.create_observable_counter("goodput.serve.requests", [stat("requests")], "{request}",
                                    "Requests taken in (OTLP requests and spool lines)")
    meter.create_observable_counter("goodput.serve.spans", [stat("spans")], "{span}",
                                    "Spans in the OTLP requests taken in, of any scope")
    meter.create_observable_counter("goodput.serve.refused", [refused], "{request}",
                                    "Requests refused, by reason")
    meter.create_observable_counter("goodput.serve.skipped", [skipped], "{record}",
                                    "Records no job owns that serve skipped, by reason")
    for name, key, unit, text in (
            ("log_records", "log_records", "{record}", "OTLP log records received"),
            ("log_records.ignored", "log_records_ignored", "{record}",
             "OTLP log records no source takes"),
            ("source.skipped", "source_skipped", "{record}",
             "Foreign records the sources skipped (malformed)"),
            ("spans.translated", "spans_translated", "{span}",
             "Goodput spans the sources made of foreign records")):
        meter.create_observable_counter("goodput.serve." + name, [stat(key)], unit, text)
    meter.create_observable_gauge("goodput.serve.jobs",
                                  [lambda options: [Observation(len(store.jobs()))]], "{job}",
                                  "Jobs tracked")
    meter.create_observable_gauge("goodput.serve.wal.size", [wal_size], "By",
                                  "Bytes in the write-ahead log's segments")
    meter.create_observable_gauge("goodput.serve.replay.duration", [replay], "s",
                                  "Seconds the last start spent replaying the write-ahead log")
    meter.create_observable_gauge("goodput.serve.inflight", [inflight], "By",
                                  "Request bytes held in memory now")
