"""``goodput serve``: the goodput processor as a live service.

An OTLP receiver (gRPC and HTTP, :mod:`.receiver`) and spool tailers (:mod:`.tail`) feed
one :class:`LiveStore` (:mod:`.store`) that keeps every job's spans in compact columns
and runs the same accounting as ``goodput report`` when results are asked for::

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
