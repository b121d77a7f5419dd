"""``goodput serve``: the goodput processor as a live service, the last stage of the pipeline.

Contract:

- Takes: OTLP ``ExportTraceServiceRequest`` and ``ExportLogsServiceRequest`` over gRPC
  (:mod:`.grpc_receiver`) and HTTP (:mod:`.http`; what both share: :mod:`.receiver`),
  spool lines of tailed run directories (:mod:`.tail`), and at start its own write-ahead
  log (:mod:`.wal`).
- Keeps: every job's spans in compact columns in one :class:`LiveStore` (:mod:`.store`;
  taking spans in: :mod:`.intake`; results on demand: :mod:`.live_results`).
- Gives: per job the :class:`~goodput_processor.results.job.JobResult` of the same
  accounting as ``goodput report``, when asked for; the JSON and HTML report over HTTP;
  the metrics through the exporters; the final report of a retired job. In a training
  process, :class:`~goodput_processor.serve.monitor.GoodputMonitor` runs the same tailer
  and store over its own run directory and publishes through the exporters.
- May import the earlier stages (the ``layers`` contract in ``pyproject.toml``: exporters,
  html, definitions, account, results, analysis, model, read, importers.sources),
  :mod:`goodput_processor.terminal` (the subcommand's ``UsageError``) and, of the training
  side, only ``goodput.schema`` and ``goodput.links``. Must not import the CLI
  (:mod:`goodput_processor.cli`) or ``importers.command``: the CLI imports
  :mod:`.command` to register the subcommand, never the other way round.

Use::

    from goodput_processor.serve import GoodputServer

    server = GoodputServer(grpc_port=0, http_port=0, spool_dirs=["goodput-runs/my-job"])
    print(server.addresses())            # {"grpc": "127.0.0.1:...", "http": "http://..."}
    results = server.store.results()     # list[JobResult], as goodput report gives
    final = server.stop(timeout_s=10)

Needs ``grpcio`` and ``opentelemetry-proto`` (the ``serve`` extra). See ``docs/serve.md``.
"""

from __future__ import annotations

import importlib

# Imported on first use, so that ``goodput report`` (which registers the ``serve``
# subcommand) neither pays for nor needs grpcio.
_EXPORTS = {
    "DEFAULT_MAX_MESSAGE_BYTES": ".receiver",
    "GrpcReceiver": ".grpc_receiver",
    "HttpReceiver": ".http",
    "GoodputServer": ".server",
    "LiveStore": ".store",
    "SpoolTailer": ".tail",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
