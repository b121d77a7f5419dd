"""ML metrics of a run (``metrics.record``) on the OpenTelemetry metrics SDK.

::

    from goodput.diagnostics import MetricType, metrics
    metrics.record(MetricType.LOSS, 0.123, step=10)
    metrics.record("tokens_seen", 1.2e9, step=10, unit="{token}")

Each metric name is an OpenTelemetry gauge (``ml.loss``, ``ml.tokens_seen``, ...) of
the active run's :class:`~opentelemetry.sdk.metrics.MeterProvider`; the gauge
``ml.step`` holds the step of the latest record that gave one. A gauge exports the
*latest* value at each export (every ``metric_export_interval_s``, default 10 s):
its time axis is wall-clock time, and ``ml.step`` says which step the values belong
to. Record a value that must not be missed (an evaluation score) no more often than
the export interval, or read the step-indexed history from your own logs.

The hot path stores the value in a dict (no SDK call, no lock, no I/O); the export
thread reads it. Values that are not Python ``int``/``float`` (NumPy scalars, JAX or
PyTorch arrays) are converted there, off the training thread, so recording a device
array never waits for the device. Nothing raises into the training loop: a bad name,
value or step is counted (:meth:`RunMetrics.stats`) and logged once per kind.
Non-finite values (NaN, +/-inf) are not exported as gauge values (backends such as
Cloud Monitoring reject them); each one adds 1 to the counter ``ml.metrics.nonfinite``
(attribute ``ml.metric.name``) and the first per metric logs a warning.

This module also holds the readers named by ``OTEL_METRICS_EXPORTER``; the default local
*metrics spool* is :mod:`goodput.diagnostics.metrics_spool`.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
from enum import Enum

from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics.export import (
    MetricReader,
    PeriodicExportingMetricReader,
)

from goodput.links import install_hint

_log = logging.getLogger(__name__)

#: Instrumentation scope of the ``ml.*`` metrics.
SCOPE_NAME = "goodput.diagnostics"
#: Gauge holding the step of the latest record that gave one.
STEP_METRIC = "ml.step"
#: Counter of non-finite values recorded (attribute :data:`ATTR_METRIC_NAME`).
NONFINITE_METRIC = "ml.metrics.nonfinite"
ATTR_METRIC_NAME = "ml.metric.name"
#: Most distinct metric names one run accepts (protects backends from a name per step).
MAX_METRICS = 1000
#: Default seconds between exports.
DEFAULT_EXPORT_INTERVAL_S = 10.0


class MetricType(str, Enum):
    """Predefined ML metrics (the names of Google Cloud ML Diagnostics' ``MetricType``).

    Each value is the OpenTelemetry metric name; :attr:`unit` is its UCUM unit.
    ``metrics.record("loss", ...)`` and ``metrics.record(MetricType.LOSS, ...)`` are the same.
    """

    #: learning rate (unit ``1``)
    LEARNING_RATE = "ml.learning_rate"
    #: training loss (``1``)
    LOSS = "ml.loss"
    #: global gradient norm (``1``)
    GRADIENT_NORM = "ml.gradient_norm"
    #: number of model parameters (``{parameter}``)
    TOTAL_WEIGHTS = "ml.total_weights"
    #: seconds per training step (``s``)
    STEP_TIME = "ml.step_time"
    #: tokens per second (``{token}/s``); for samples use your own name and unit
    THROUGHPUT = "ml.throughput"
    #: seconds (``s``), e.g. per request or per batch
    LATENCY = "ml.latency"
    #: achieved TFLOP per second (``{TFLOP}/s``)
    TFLOPS = "ml.tflops"
    #: model FLOPs utilisation, a fraction 0..1 (``1``)
    MFU = "ml.mfu"

    @property
    def unit(self) -> str:
        """The UCUM unit of this metric."""
        return _UNITS[self]

    @property
    def description(self) -> str:
        """One line saying what the metric is."""
        return _DESCRIPTIONS[self]

    def __str__(self) -> str:
        return self.value


_UNITS = {
    MetricType.LEARNING_RATE: "1",
    MetricType.LOSS: "1",
    MetricType.GRADIENT_NORM: "1",
    MetricType.TOTAL_WEIGHTS: "{parameter}",
    MetricType.STEP_TIME: "s",
    MetricType.THROUGHPUT: "{token}/s",
    MetricType.LATENCY: "s",
    MetricType.TFLOPS: "{TFLOP}/s",
    MetricType.MFU: "1",
}
_DESCRIPTIONS = {
    MetricType.LEARNING_RATE: "Learning rate.",
    MetricType.LOSS: "Training loss.",
    MetricType.GRADIENT_NORM: "Global norm of the gradients.",
    MetricType.TOTAL_WEIGHTS: "Number of model parameters.",
    MetricType.STEP_TIME: "Duration of one training step.",
    MetricType.THROUGHPUT: "Tokens processed per second.",
    MetricType.LATENCY: "Latency.",
    MetricType.TFLOPS: "Achieved TFLOP per second.",
    MetricType.MFU: "Model FLOPs utilisation (0..1).",
}
_BY_NAME = {m.value: m for m in MetricType}
_BAD_CHARS = re.compile(r"[^a-z0-9_.\-/]+")


def metric_name(name) -> str | None:
    """The OpenTelemetry name for ``name`` (a :class:`MetricType` or a str), or None if bad.

    User names are lower-cased (instrument names are case-insensitive), characters
    other than ``a-z 0-9 _ . - /`` become ``_``, and ``ml.`` is prefixed unless present:
    ``"Tokens Seen"`` -> ``"ml.tokens_seen"``, ``"loss"`` -> ``"ml.loss"``. The reserved
    names ``ml.step`` and ``ml.metrics.*`` and names over 255 characters are refused.
    """
    if isinstance(name, MetricType):
        return name.value
    if not isinstance(name, str):
        return None
    s = _BAD_CHARS.sub("_", name.strip().lower()).strip("_")
    if not s:
        return None
    if not s.startswith("ml."):
        s = "ml." + s
    if len(s) <= 3 or len(s) > 255 or s == STEP_METRIC or s.startswith("ml.metrics."):
        return None
    if not s[3].isalpha() and s[3] != "_":  # an instrument name starts with a letter
        s = "ml._" + s[3:]
    return s


def _step_of(step):
    if isinstance(step, bool):
        return None
    if isinstance(step, int):
        return step if step >= 0 else None
    try:  # NumPy integers
        import operator

        value = operator.index(step)
    except TypeError:
        return None
    return value if value >= 0 else None


class RunMetrics:
    """The ``ml.*`` gauges of one run on ``meter_provider`` (used by :func:`record`).

    Args:
        meter_provider: the run's SDK ``MeterProvider``.
        enabled: whether :meth:`record` keeps anything (False on processes other than
            0 unless the run records from all processes).
        on_first_record: called once (on the training thread) at the first record.
    """

    def __init__(self, meter_provider, enabled: bool = True, on_first_record=None):
        from goodput import __version__

        self.enabled = enabled
        self._meter = meter_provider.get_meter(SCOPE_NAME, __version__)
        self._lock = threading.Lock()  # instrument creation only
        self._latest: dict[str, object] = {}  # metric name -> latest value (raw)
        self._slots: dict = {}  # name as given -> metric name
        self._units: dict[str, str] = {}
        self._step: int | None = None
        self._on_first = on_first_record
        self._counts = {"recorded": 0, "bad_name": 0, "bad_value": 0, "bad_step": 0,
                        "nonfinite": 0, "too_many": 0, "unit_conflict": 0, "errors": 0}
        self._warned: set = set()
        self._nonfinite = self._meter.create_counter(
            NONFINITE_METRIC, unit="{value}",
            description="Non-finite (NaN or infinite) values recorded, not exported.")
        self._meter.create_observable_gauge(
            STEP_METRIC, callbacks=[self._observe_step], unit="{step}",
            description="Training step of the latest ml.* record that gave a step.")

    # --- hot path -------------------------------------------------------------------

    def record(self, name, value, step=None, unit: str | None = None) -> None:
        """Keep ``value`` as the latest of metric ``name`` (and ``step`` as ``ml.step``).

        Never raises and never blocks; see the module docstring for what is refused.
        """
        if not self.enabled:
            return
        try:
            if self._on_first is not None:
                cb, self._on_first = self._on_first, None
                cb()
            kind = type(value)
            if kind is float:
                if not math.isfinite(value):
                    self._on_nonfinite(metric_name(name) or repr(name), value, step)
                    return
            elif kind is not int and (kind is bool or kind is str or value is None):
                self._bad("bad_value", repr(name), f"{name}: value {value!r} is not a number")
                return
            key = self._slots.get(name) if isinstance(name, str) else None
            if key is None or (unit is not None and self._units.get(key) != unit):
                key = self._new_slot(name, unit)
            if not key:
                self._bad("bad_name", repr(name), f"metric name {name!r} is not usable")
                return
            self._latest[key] = value
            if step is not None:
                s = step if type(step) is int and step >= 0 else _step_of(step)
                if s is None:
                    self._bad("bad_step", key, f"{key}: step {step!r} is not an int >= 0")
                else:
                    self._step = s
            self._counts["recorded"] += 1
        except Exception as exc:  # never into the training loop
            self._bad("errors", "record", f"record({name!r}) failed: {exc}")

    # --- instruments ------------------------------------------------------------------

    def _new_slot(self, name, unit):
        key = metric_name(name)
        if key is None:
            if isinstance(name, str) and len(self._slots) < 2 * MAX_METRICS:
                self._slots[name] = ""  # remembered as bad
            return None
        with self._lock:
            if key in self._units:
                if unit is not None and unit != self._units[key]:
                    self._bad("unit_conflict", key,
                              f"{key}: unit {unit!r} ignored, it was created with "
                              f"{self._units[key]!r}")
                if isinstance(name, str):
                    self._slots[name] = key
                return key
            if len(self._units) >= MAX_METRICS:
                self._bad("too_many", "too_many", f"more than {MAX_METRICS} metric names: "
                          f"{key} and later new names are dropped")
                return None
            predefined = _BY_NAME.get(key)
            if predefined is not None:
                if unit is not None and unit != predefined.unit:
                    self._bad("unit_conflict", key,
                              f"{key}: unit {unit!r} ignored, its unit is {predefined.unit!r}")
                unit, desc = predefined.unit, predefined.description
            else:
                unit, desc = unit or "1", f"User-defined metric {key}."
            self._meter.create_observable_gauge(
                key, callbacks=[self._callback(key)], unit=str(unit), description=desc)
            self._units[key] = str(unit)
            if isinstance(name, str):
                self._slots[name] = key
            return key

    def _callback(self, key: str):
        def observe(_options):
            value = self._latest.get(key)
            if value is None:
                return []
            if type(value) is not float:
                try:
                    number = float(value)
                except Exception as exc:
                    if self._latest.get(key) is value:
                        self._latest.pop(key, None)
                    self._bad("bad_value", key, f"{key}: cannot convert {type(value).__name__} "
                              f"to a number: {exc}")
                    return []
                if not math.isfinite(number):
                    if self._latest.get(key) is value:
                        self._latest.pop(key, None)
                    self._on_nonfinite(key, number, None)
                    return []
                value = number
            return [Observation(value)]

        return observe

    def _observe_step(self, _options):
        step = self._step
        return [] if step is None else [Observation(step)]

    # --- failures ---------------------------------------------------------------------

    def _on_nonfinite(self, key: str, value: float, step) -> None:
        self._counts["nonfinite"] += 1
        try:
            self._nonfinite.add(1, {ATTR_METRIC_NAME: key})
        except Exception:
            pass
        if ("nonfinite", key) not in self._warned:
            self._warned.add(("nonfinite", key))
            _log.warning("goodput.diagnostics: %s is %s%s; non-finite values are not "
                         "exported, they are counted in %s", key, value,
                         "" if step is None else f" at step {step}", NONFINITE_METRIC)

    def _bad(self, kind: str, key: str, message: str) -> None:
        self._counts[kind] += 1
        if (kind, key) not in self._warned and len(self._warned) < 100:
            self._warned.add((kind, key))
            _log.warning("goodput.diagnostics: %s (logged once)", message)

    def stats(self) -> dict:
        """Counters: ``recorded``, ``bad_name``, ``bad_value``, ``bad_step``, ``nonfinite``,
        ``too_many`` (names over :data:`MAX_METRICS`), ``unit_conflict``, ``errors``;
        plus ``metrics`` (the metric names created)."""
        return {**self._counts, "metrics": sorted(self._units)}


#: The active run's metrics (set by :mod:`goodput.diagnostics.run`).
_ACTIVE: RunMetrics | None = None
_NO_RUN = {"count": 0}


def record(name, value, step: int | None = None, *, unit: str | None = None) -> None:
    """Record ``value`` of metric ``name`` at training step ``step`` in the active run.

    Args:
        name: a :class:`MetricType` or any name (``"tokens_seen"`` becomes
            ``ml.tokens_seen``; see :func:`metric_name`).
        value: a number: Python ``int``/``float``, a NumPy scalar, or a 0-d JAX/PyTorch
            array (converted on the export thread, never here). NaN and infinities are
            counted, not exported.
        step: the training step (int >= 0) the value belongs to; sets the ``ml.step`` gauge.
        unit: UCUM unit of a user-defined metric (default ``"1"``), used when the metric is
            first recorded; predefined metrics have fixed units.

    Only process 0 records unless the run was made with ``all_processes=True``.
    Never raises and never blocks: without an active run (:func:`goodput.diagnostics.run`)
    the call is counted and logged once.
    """
    m = _ACTIVE
    if m is None:
        _NO_RUN["count"] += 1
        if _NO_RUN["count"] == 1:
            _log.warning("goodput.diagnostics: metrics.record() with no active run: call "
                         "goodput.diagnostics.run(...) first (logged once)")
        return
    m.record(name, value, step, unit)


# --- readers ---------------------------------------------------------------------------

def export_interval_s(explicit: float | None) -> float:
    """Seconds between exports: ``explicit``, else ``OTEL_METRIC_EXPORT_INTERVAL`` (ms),
    else :data:`DEFAULT_EXPORT_INTERVAL_S`.

    Raises:
        ValueError: ``explicit`` is not a finite number > 0 (a bad environment value is
            logged and the default used).
    """
    if explicit is None:
        raw = os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
        if not raw:
            return DEFAULT_EXPORT_INTERVAL_S
        try:
            ms = float(raw)
            if not (math.isfinite(ms) and ms > 0):
                raise ValueError
        except ValueError:
            _log.warning("goodput: ignoring OTEL_METRIC_EXPORT_INTERVAL=%r: not a number of "
                         "milliseconds > 0", raw)
            return DEFAULT_EXPORT_INTERVAL_S
        return ms / 1000.0
    if (isinstance(explicit, bool) or not isinstance(explicit, (int, float))
            or not math.isfinite(explicit) or explicit <= 0):
        raise ValueError(f"metric_export_interval_s must be a number of seconds > 0, "
                         f"got {explicit!r}")
    return float(explicit)


def _entry_point(name: str):
    from importlib.metadata import entry_points

    for ep in entry_points(group="opentelemetry_metrics_exporter"):
        if ep.name == name:
            return ep
    return None


def make_reader(name: str, interval_s: float) -> MetricReader:
    """The reader for exporter ``name`` (an ``opentelemetry_metrics_exporter`` entry point:
    ``otlp``, ``otlp_proto_grpc``, ``otlp_proto_http``, ``console``, ``prometheus``,
    ``gcp_monitoring``, ...). ``otlp`` follows ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`` /
    ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc`` or ``http/protobuf``). An exporter is put
    behind a ``PeriodicExportingMetricReader`` every ``interval_s``; an entry point that
    is itself a reader (``prometheus``) is used as it is.

    Raises:
        ValueError: unknown name, package not installed, or the constructor failed.
    """
    if name == "otlp":
        protocol = (os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
                    or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip()
        name = "otlp_proto_http" if protocol.startswith("http") else "otlp_proto_grpc"
    ep = _entry_point(name)
    if ep is None:
        raise ValueError(f"unknown metrics exporter {name!r} (OTEL_METRICS_EXPORTER)")
    try:
        factory = ep.load()
        made = factory()
    except ImportError as exc:
        raise ValueError(f"metrics exporter {name!r} is not installed ({exc}); "
                         f"{install_hint('otlp')}, or the exporter's package") from exc
    except Exception as exc:
        raise ValueError(f"cannot create metrics exporter {name!r}: {exc}") from exc
    if isinstance(made, MetricReader):
        return made
    return PeriodicExportingMetricReader(made, export_interval_millis=interval_s * 1000.0)


def readers_from_env(interval_s: float) -> list[MetricReader]:
    """Readers named by ``OTEL_METRICS_EXPORTER`` (comma-separated; unset, empty or
    ``none``: none). A name that cannot be made is logged and skipped."""
    raw = os.environ.get("OTEL_METRICS_EXPORTER", "")
    out = []
    for name in (p.strip() for p in raw.split(",")):
        if not name or name == "none":
            continue
        try:
            out.append(make_reader(name, interval_s))
        except ValueError as exc:
            _log.warning("goodput: OTEL_METRICS_EXPORTER: %s", exc)
    return out
