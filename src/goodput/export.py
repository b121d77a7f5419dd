"""Trace exporters besides the local spool, chosen by name (see ``docs/exporting.md``).

Names, from ``configure(traces_exporter=...)``, else ``GOODPUT_TRACES_EXPORTER``, else
``OTEL_TRACES_EXPORTER`` (comma-separated; ``none`` or empty = the spool only):

- ``otlp`` / ``otlp_proto_grpc``: OTLP over gRPC (``pip install 'goodput-otel[otlp]'``);
- ``otlp_proto_http``: OTLP over HTTP with a protobuf body (same extra);
- ``gcp_trace``: Cloud Trace API v2 ``BatchWriteSpans`` (``goodput-otel[gcp]``), with the
  goodput resource attributes as span labels (:func:`cloud_trace_exporter`);
- ``gcp_otlp``: OTLP/HTTP to Google's telemetry endpoint with Google credentials and the
  ``gcp`` resource detector (:func:`gcp_otlp_exporter`);
- any other ``opentelemetry_traces_exporter`` entry point (``console``, ...).

All of them read the standard ``OTEL_EXPORTER_OTLP_*`` / ``OTEL_EXPORTER_GCP_TRACE_*``
variables in the exporter libraries themselves. An exporter object may carry a dict
``goodput_resource_attributes``: the recorder adds it to every attempt's resource.
"""

from __future__ import annotations

import logging
import os

from goodput import config
from goodput.links import install_hint

_log = logging.getLogger(__name__)

#: Resource attributes copied onto every span as Cloud Trace labels by ``gcp_trace``
#: (a regular expression matched at the start of each key), unless
#: ``OTEL_EXPORTER_GCP_TRACE_RESOURCE_REGEX`` says otherwise.
DEFAULT_RESOURCE_REGEX = r"goodput\.|service\.name$|host\.name$|ml\.run\.|k8s\.pod\.name$"
#: Google's OTLP endpoint for traces (the Telemetry API).
GCP_OTLP_ENDPOINT = "https://telemetry.googleapis.com/v1/traces"
#: OAuth scope the ``gcp_otlp`` exporter asks Application Default Credentials for.
GCP_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
#: Attribute name an exporter object may carry (a dict) to extend the resource.
RESOURCE_ATTRIBUTES_ATTR = "goodput_resource_attributes"

#: Attribute :func:`from_config` sets on each exporter it makes: the name it was made from.
EXPORTER_NAME_ATTR = "goodput_exporter_name"

_EXTRA = {"otlp": "otlp", "otlp_proto_grpc": "otlp", "otlp_proto_http": "otlp",
          "gcp_trace": "gcp", "gcp_otlp": "gcp"}


def _otlp_grpc():
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _otlp_http():
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


_BUILTIN = {
    "otlp": _otlp_grpc,
    "otlp_proto_grpc": _otlp_grpc,
    "otlp_proto_http": _otlp_http,
    "gcp_trace": lambda: cloud_trace_exporter(),
    "gcp_otlp": lambda: gcp_otlp_exporter(),
}


def selected_names(explicit=None) -> tuple[list[str], str]:
    """The exporter names asked for, and where they came from (for messages).

    Args:
        explicit: a name, a comma-separated string or a list of names; None = from the
            environment (``GOODPUT_TRACES_EXPORTER``, else ``OTEL_TRACES_EXPORTER``).

    Returns:
        ``(names, source)``; ``none`` and empty names are left out.
    """
    if explicit is not None:
        raw, source = explicit, "traces_exporter"
    elif os.environ.get("GOODPUT_TRACES_EXPORTER", "").strip():
        raw, source = os.environ["GOODPUT_TRACES_EXPORTER"], "GOODPUT_TRACES_EXPORTER"
    else:
        raw, source = os.environ.get("OTEL_TRACES_EXPORTER", ""), "OTEL_TRACES_EXPORTER"
    parts = raw.split(",") if isinstance(raw, str) else list(raw)
    names = []
    for p in parts:
        if not isinstance(p, str):
            raise ValueError(f"{source}: exporter names must be strings, got {p!r}")
        p = p.strip()
        if p and p != "none":
            names.append(p)
    return names, source


def _entry_points() -> dict:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group="opentelemetry_traces_exporter")}


def make(name: str, source: str = "traces_exporter"):
    """Build the exporter called ``name``.

    Raises:
        ValueError: ``name`` is neither built in nor an installed entry point, its package
            is not installed (the message says which extra to install), or its
            constructor failed; the message names ``source`` and ``name``.
    """
    factory = _BUILTIN.get(name)
    if factory is None:
        ep = _entry_points().get(name)
        if ep is None:
            known = ", ".join(sorted(set(_BUILTIN) | set(_entry_points())))
            raise ValueError(f"{source}: unknown traces exporter {name!r} (known: {known})")
        factory = ep.load()
    try:
        return factory()
    except ImportError as exc:
        extra = _EXTRA.get(name, name)
        raise ValueError(f"{source}: traces exporter {name!r} is not installed ({exc}); "
                         f"{install_hint(extra)}") from exc
    except Exception as exc:  # an exporter's constructor can fail in many ways (no credentials)
        raise ValueError(f"{source}: cannot create traces exporter {name!r}: {exc}") from exc


def from_config(explicit=None) -> list:
    """Exporters from ``explicit`` or the environment (see :func:`selected_names`).

    A bad name given as an argument raises; one from an environment variable is logged
    (naming the variable and the value) and skipped, so the spool still works.

    Raises:
        ValueError: ``explicit`` names an unknown or uninstalled exporter, or one that
            cannot be created.
    """
    names, source = selected_names(explicit)
    exporters = []
    for name in names:
        try:
            exporter = make(name, source)
        except ValueError as exc:
            if explicit is not None:
                raise
            _log.warning("goodput: %s", exc)
            continue
        try:
            setattr(exporter, EXPORTER_NAME_ATTR, name)
        except (AttributeError, TypeError):  # an exporter with __slots__: keyed by its class
            pass
        exporters.append(exporter)
    return exporters


def exporter_key(exporter) -> str:
    """How an exporter is named in messages and in the spool's ``.offset`` sidecar files:
    the name it was made from (``otlp``, ...), else its class name."""
    name = getattr(exporter, EXPORTER_NAME_ATTR, None)
    return name if isinstance(name, str) and name else type(exporter).__name__


def resource_attributes(exporters) -> dict:
    """Union of the ``goodput_resource_attributes`` dicts the exporters carry."""
    out: dict = {}
    for e in exporters:
        extra = getattr(e, RESOURCE_ATTRIBUTES_ATTR, None)
        if isinstance(extra, dict):
            out.update(extra)
    return out


def cloud_trace_exporter(project_id: str | None = None, client=None,
                         resource_regex: str | None = None):
    """A Cloud Trace (API v2) exporter that labels spans with the goodput resource.

    Args:
        project_id: Google Cloud project; default ``OTEL_EXPORTER_GCP_TRACE_PROJECT_ID``,
            else the project of Application Default Credentials.
        client: a ``google.cloud.trace_v2.TraceServiceClient`` (default: the exporter's
            own, to ``cloudtrace.googleapis.com``).
        resource_regex: resource keys to copy onto spans as labels; default
            ``OTEL_EXPORTER_GCP_TRACE_RESOURCE_REGEX``, else :data:`DEFAULT_RESOURCE_REGEX`.

    Raises:
        ImportError: the ``gcp`` extra is not installed.
        google.auth.exceptions.DefaultCredentialsError: no project and no credentials.
    """
    import warnings

    from opentelemetry.exporter.cloud_trace import CloudTraceSpanExporter

    regex = (resource_regex or os.environ.get("OTEL_EXPORTER_GCP_TRACE_RESOURCE_REGEX")
             or DEFAULT_RESOURCE_REGEX)
    with warnings.catch_warnings():  # upstream deprecation; docs/exporting.md explains
        warnings.simplefilter("ignore", DeprecationWarning)
        return CloudTraceSpanExporter(project_id=project_id, client=client,
                                      resource_regex=regex)


def gcp_otlp_exporter(project_id: str | None = None, credentials=None,
                      endpoint: str | None = None, detect: bool = True):
    """OTLP/HTTP (protobuf) to Google's telemetry endpoint, authorised with Google credentials.

    Every request carries ``Authorization: Bearer <token>`` (refreshed by ``google-auth``)
    and ``x-goog-user-project: <project>``. The returned exporter carries
    ``goodput_resource_attributes``: ``gcp.project_id`` plus what the ``gcp`` resource
    detector finds (platform, zone, instance; nothing off Google Cloud).

    Args:
        project_id: default ``GOOGLE_CLOUD_PROJECT``, else the credentials' project.
        credentials: ``google.auth`` credentials; default Application Default Credentials
            with the ``cloud-platform`` scope.
        endpoint: default ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else
            :data:`GCP_OTLP_ENDPOINT`.
        detect: run the ``gcp`` resource detector (one metadata-server query, bounded by
            its own 2 s connect / 5 s read timeouts).

    Raises:
        ImportError: the ``gcp`` or ``otlp`` extra is not installed.
        ValueError: no project id could be found.
        google.auth.exceptions.DefaultCredentialsError: no credentials.
    """
    import google.auth
    from google.auth.transport.requests import AuthorizedSession
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    project_id = project_id or os.environ.get("GOOGLE_CLOUD_PROJECT")
    if credentials is None:
        credentials, found = google.auth.default(scopes=[GCP_SCOPE])
        project_id = project_id or found
    project_id = project_id or getattr(credentials, "quota_project_id", None)
    if not project_id:
        raise ValueError("gcp_otlp: no Google Cloud project id (set GOOGLE_CLOUD_PROJECT)")
    endpoint = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or GCP_OTLP_ENDPOINT
    exporter = OTLPSpanExporter(endpoint=endpoint, session=AuthorizedSession(credentials),
                                headers={"x-goog-user-project": project_id})
    attrs = {}
    if detect:
        try:
            from opentelemetry.resourcedetector.gcp_resource_detector import (
                GoogleCloudResourceDetector,
            )

            attrs.update(GoogleCloudResourceDetector().detect().attributes)
        except Exception as exc:  # detection is best effort
            _log.warning("goodput: gcp resource detection failed: %s", exc)
    attrs["gcp.project_id"] = project_id
    setattr(exporter, RESOURCE_ATTRIBUTES_ATTR, attrs)
    return exporter


def given(exporters) -> list:
    """``exporters`` (``SpanExporter`` objects, or one) as a list; anything else warned
    about (once, naming the setting ``exporters``) and left out. Never raises."""
    if exporters is None:
        return []
    try:
        items = list(exporters)
    except TypeError:
        items = [exporters]  # one exporter rather than a list of them
    out = []
    for e in items:
        if callable(getattr(e, "export", None)):
            out.append(e)
        else:
            config.bad_setting("exporters", e, "not a SpanExporter (no export method)",
                               "the others")
    return out


def named(names) -> list:
    """The exporters ``names`` (or the environment) asks for (:func:`from_config`);
    a name that cannot be made is warned about and left out: the spool still works. Never
    raises."""
    try:
        return from_config(names)
    except Exception as exc:
        if names is None:  # from the environment: from_config warns itself, never raises
            config.bad_setting("GOODPUT_TRACES_EXPORTER", None, str(exc), "the spool only")
            return []
    parts = names.split(",") if isinstance(names, str) else names
    if not isinstance(parts, (list, tuple)):
        config.bad_setting("traces_exporter", names, "not a name or a list of names",
                           "the spool only")
        return []
    out = []
    for name in parts:
        try:
            out += from_config([name])
        except Exception as exc:
            config.bad_setting("traces_exporter", name, str(exc), "the others")
    return out
