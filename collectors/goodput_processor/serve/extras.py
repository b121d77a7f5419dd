"""The optional packages ``goodput serve`` needs for the flags it was given, checked at start.

Each need is a module, the extra that brings it, and the flag that asks for it (None: every
serve). :func:`require` imports each needed module once and, when any is missing, raises one
:class:`~goodput_processor.cli.UsageError` that names every missing extra, why, and the install
line of all of them: a short error at start, never a traceback from deep in a request or a
metric export later.
"""

from __future__ import annotations

import importlib

from goodput.links import install_hint

__all__ = ["NEEDS", "missing", "require"]

#: ``(extra, module, distribution, flag attribute or None)``: the module ``flag`` needs.
NEEDS: tuple[tuple[str, str, str, str | None], ...] = (
    ("serve", "grpc", "grpcio", None),
    ("serve", "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
     "opentelemetry-proto", None),
    ("serve", "google.rpc.status_pb2", "googleapis-common-protos", None),
    ("serve", "prometheus_client", "prometheus-client", None),
    ("serve", "opentelemetry.exporter.prometheus", "opentelemetry-exporter-prometheus", None),
    ("serve", "yaml", "pyyaml", "config"),
    ("otlp", "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
     "opentelemetry-exporter-otlp", "otlp_metrics_endpoint"),
    ("gcp", "google.cloud.monitoring_v3", "google-cloud-monitoring", "workload_project"),
)


def missing(args) -> list[tuple[str, str, str | None, str]]:
    """``(extra, distribution, flag or None, error)`` for each needed module that does not
    import, given the parsed ``args`` of ``goodput serve``."""
    out = []
    for extra, module, dist, attr in NEEDS:
        if attr is not None and not getattr(args, attr, None):
            continue
        try:
            importlib.import_module(module)
        except ImportError as e:
            flag = None if attr is None else "--" + attr.replace("_", "-")
            out.append((extra, dist, flag, str(e)))
    return out


def require(args) -> None:
    """Raise UsageError when a package that ``args`` need is missing (module docstring)."""
    gone = missing(args)
    if not gone:
        return
    from ..terminal import UsageError

    extras: list[str] = []
    parts = []
    for extra, dist, flag, err in gone:
        if extra not in extras:
            extras.append(extra)
        why = f" for {flag}" if flag else ""
        parts.append(f"the {extra} extra{why} ({dist}: {err})")
    raise UsageError(f"goodput serve needs {', '.join(parts)}: "
                     f"{install_hint(','.join(extras))}")
