"""An ML run: its name, group and configs as OpenTelemetry resource attributes, and its
own ``MeterProvider`` for ``metrics.record`` and system metrics.

::

    from goodput import diagnostics
    run = diagnostics.run("llama-sweep-3", run_group="sweep", configs="config.yaml")
    ...
    run.end()          # also at interpreter exit; ``with diagnostics.run(...) as run:`` works

See ``docs/diagnostics.md``.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import re
import threading
import time

from goodput import config, schema
from goodput.diagnostics import environment
from goodput.diagnostics import metrics as _metrics
from goodput.diagnostics import metrics_spool as _metrics_spool
from goodput.diagnostics.run_configs import (
    CONFIG_PREFIX,
    MAX_CONFIG_ATTRIBUTES,
    flatten_configs,
    load_configs,
)

_log = logging.getLogger(__name__)

#: RUN_CONFIG span attributes: the whole record as JSON, and which record it is.
ATTR_RUN_CONFIG = "ml.run.config"
ATTR_RUN_CONFIG_KIND = "ml.run.config.kind"  # "run" (at the start) or "devices" (once known)
ATTR_CONFIGS_DROPPED = "ml.run.config.dropped"  # int: user configs not made attributes

_CURRENT: MLRun | None = None
_LOCK = threading.RLock()


def _positive_int(value, name: str) -> int | float | None:
    """A count of FLOPs or devices as an int attribute; a float when it exceeds int64 (the
    FLOPs of one step of a large model can: 6 x 4e11 parameters x 1.6e7 tokens = 3.8e19)."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
    return int(round(value)) if value < 2**63 - 1 else float(value)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "run"


# --- the run ---------------------------------------------------------------------------

class MLRun:
    """One ML run (use :func:`run` to make one).

    Attributes:
        name, run_group: as given (``run_group`` may be None).
        configs: the user configs (dict), complete.
        resource_attributes: the run's OpenTelemetry resource attributes (dict): name,
            group, MFU inputs, software/system configs, flattened user configs.
        meter_provider: the run's own SDK ``MeterProvider`` (not the global one); pass it
            to other instrumentations to put their metrics next to the run's.
        recorder: the goodput :class:`~goodput.recorder.Recorder` the run's spans go to.
        job_name, attempt, process_index, process_count: as the recorder resolved them.
        run_dir: the recorder's spool directory (None when the spool is off).
        profile_dir: where profiles go (default ``<run_dir>/profiles``).
        session_prefix: ``"<name>-a<attempt>"`` (unsafe characters replaced by ``_``),
            the start of the profiler's session ids.
        all_processes: whether every process records metrics (else only process 0).
        metrics: the :class:`~goodput.diagnostics.metrics.RunMetrics` behind
            ``metrics.record``; system: the :class:`~goodput.diagnostics.system.SystemMetrics`
            or None.
    """

    def __init__(self, name: str, run_group, configs: dict, resource_attributes: dict,
                 recorder, owns_recorder: bool, meter_provider, all_processes: bool,
                 profile_dir: str, attempt: int):
        self.name = name
        self.run_group = run_group
        self.configs = configs
        self.resource_attributes = resource_attributes
        self.recorder = recorder
        self.meter_provider = meter_provider
        self.all_processes = all_processes
        self.job_name = recorder.job_name
        self.process_index = recorder.process_index
        self.process_count = recorder.process_count
        self.run_dir = recorder.run_dir
        self.attempt = attempt
        self.profile_dir = profile_dir
        self.session_prefix = f"{_safe(name)}-a{attempt}"
        self.system = None
        self.metrics: _metrics.RunMetrics | None = None
        self._owns_recorder = owns_recorder
        self._ended = False
        self._devices: dict = {}
        self._devices_written = False
        self._device_lock = threading.Lock()
        self._probe: threading.Thread | None = None
        self._ondemand = None

    # --- RUN_CONFIG records ---------------------------------------------------------

    def _recorder_open(self) -> bool:
        from goodput import api

        return api.current_recorder() is self.recorder and self.recorder.attempt is not None

    def _write_record(self, attrs: dict) -> None:
        if not self._recorder_open():
            _log.debug("goodput.diagnostics: recorder closed; run config record not written")
            return
        now = time.time_ns()
        self.recorder.record(schema.RUN_CONFIG, now, now, attrs)

    def _write_run_record(self, dropped: int) -> None:
        attrs_only = {k: v for k, v in self.resource_attributes.items()
                      if not k.startswith(CONFIG_PREFIX)}
        doc = {
            "run": {"name": self.name, "group": self.run_group, "job": self.job_name,
                    "attempt": self.attempt, "process_index": self.process_index,
                    "process_count": self.process_count},
            "attributes": attrs_only,
        }
        if self.process_index == 0 or self.all_processes:
            doc["configs"] = self.configs
        span = {ATTR_RUN_CONFIG_KIND: "run",
                ATTR_RUN_CONFIG: json.dumps(doc, default=str, sort_keys=True)}
        if dropped:
            span[ATTR_CONFIGS_DROPPED] = dropped
        if not self._owns_recorder:  # not on the resource: carry them here
            span.update(self.resource_attributes)
        else:
            span[schema.RES_RUN_NAME] = self.name
            if self.run_group is not None:
                span[schema.RES_RUN_GROUP] = self.run_group
        self._write_record(span)

    def _first_record(self) -> None:
        """At the first ``metrics.record``: ask for the devices on a background thread."""
        t = threading.Thread(target=self._probe_devices, name="goodput-diagnostics-devices",
                             daemon=True)
        self._probe = t
        t.start()

    def _probe_devices(self) -> None:
        try:
            info = environment.devices()
        except Exception as exc:  # environment.devices never raises; belt and braces
            _log.debug("goodput.diagnostics: device probe failed: %s", exc)
            return
        with self._device_lock:
            if self._devices_written or not info:
                return
            self._devices = info
            self._devices_written = True
            self._write_record({ATTR_RUN_CONFIG_KIND: "devices", **info,
                                ATTR_RUN_CONFIG: json.dumps(info, sort_keys=True)})

    @property
    def devices(self) -> dict:
        """Device facts found so far (``ml.device.kind``, ``ml.device.count``,
        ``ml.device.local_count``, ``ml.framework``, ...); ``{}`` until known."""
        return dict(self._devices)

    # --- lifecycle --------------------------------------------------------------------

    def stats(self) -> dict:
        """``metrics.record`` counters (see :meth:`RunMetrics.stats`) plus
        ``system_errors`` (failures in system metric callbacks)."""
        out = self.metrics.stats() if self.metrics is not None else {}
        out["system_errors"] = self.system.errors if self.system is not None else 0
        return out

    def end(self, timeout_s: float = 5.0) -> None:
        """End the run: write the device record, flush and shut the meter provider down
        (at most ``timeout_s`` seconds), release NVML, and, if :func:`run` configured the
        goodput recorder, end the attempt too (``goodput.shutdown()``).

        Called at interpreter exit; safe to call twice; never raises.
        """
        self._end(timeout_s, None)

    def _end(self, timeout_s: float, reason) -> None:
        global _CURRENT
        with _LOCK:
            if self._ended:
                return
            self._ended = True
            if _CURRENT is self:
                _CURRENT = None
            if _metrics._ACTIVE is self.metrics:
                _metrics._ACTIVE = None
        atexit.unregister(self.end)
        deadline = time.monotonic() + timeout_s
        try:
            self._finish(deadline, reason)
        except Exception as exc:  # never raise out of end()
            _log.warning("goodput.diagnostics: ending run %s: %s", self.name, exc)

    def _finish(self, deadline: float, reason) -> None:
        if self._ondemand is not None:
            disable = getattr(self._ondemand, "disable", None)
            if callable(disable):
                try:
                    disable(self)
                except Exception as exc:
                    _log.warning("goodput.diagnostics: on-demand profiling stop failed: %s",
                                 exc)
        if self._probe is not None and self._probe.is_alive():
            self._probe.join(max(0.0, min(2.0, deadline - time.monotonic())))
        if not self._devices_written:
            self._probe_devices()

        provider = self.meter_provider

        def stop():
            try:
                left_ms = max(1.0, (deadline - time.monotonic()) * 1000)
                provider.force_flush(timeout_millis=left_ms)
                provider.shutdown(timeout_millis=max(1.0, (deadline - time.monotonic()) * 1000))
            except Exception as exc:
                _log.warning("goodput.diagnostics: metric export at run end failed: %s", exc)

        t = threading.Thread(target=stop, name="goodput-diagnostics-end", daemon=True)
        t.start()
        t.join(max(0.1, deadline - time.monotonic()))
        if t.is_alive():
            _log.warning("goodput.diagnostics: metric exporters did not finish in time; "
                         "the last points may be lost")
        if self.system is not None:
            self.system.close()
        if self._owns_recorder:
            from goodput import api

            if api.current_recorder() is self.recorder:
                if reason is not None:
                    self.recorder.job_end(reason=reason)
                api.shutdown()

    def __enter__(self) -> MLRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        failed = exc_type is not None and issubclass(exc_type, Exception)
        self._end(5.0, "exception" if failed else None)

    def __repr__(self) -> str:
        return (f"MLRun(name={self.name!r}, run_group={self.run_group!r}, "
                f"job={self.job_name!r}, attempt={self.attempt}, "
                f"process={self.process_index}/{self.process_count})")


def current_run() -> MLRun | None:
    """The active :class:`MLRun`, or None."""
    return _CURRENT


def _recorder_resource(rec, attrs: dict, attempt: int):
    from opentelemetry.sdk.resources import Resource

    res = rec.resource
    if not isinstance(res, Resource):  # no attempt open yet (configure(start=False))
        res = config.make_resource(rec.job_name, attempt, rec.process_index, rec.process_count,
                                   attrs)
    return Resource(attrs).merge(res)  # the recorder's (schema) attributes win


def run(
    name: str,
    *,
    run_group: str | None = None,
    configs=None,
    flops_per_step: float | None = None,
    peak_flops_per_device: float | None = None,
    device_count: int | None = None,
    system_metrics: bool = True,
    metric_readers=None,
    metric_export_interval_s: float | None = None,
    all_processes: bool = False,
    on_demand_profile: bool = False,
    profile_dir=None,
    **configure_kwargs,
) -> MLRun:
    """Start an ML run: name, group and configs on every goodput span and metric.

    Call it first thing, before the framework's distributed initialisation: it touches
    no framework (device kind and count are read later, see ``docs/diagnostics.md``).
    A run that is still active is ended first.

    Args:
        name: the run's name (``ml.run.name``); also the goodput job name when this call
            configures the recorder (``OTEL_SERVICE_NAME``/``GOODPUT_JOB_NAME`` win).
        run_group: groups runs of one experiment (``ml.run.group``).
        configs: user configs: a mapping, or the path of a YAML or JSON file holding one.
            Flattened into at most 64 ``ml.config.<dotted.key>`` resource attributes
            (values cut at 256 bytes); complete in the ``goodput.run.config`` record.
        flops_per_step: model FLOPs of one training step over all devices
            (``ml.flops_per_step``), for MFU.
        peak_flops_per_device: peak FLOP/s of one device (``ml.device.peak_flops``).
        device_count: devices of the job (``ml.device.count``).
        system_metrics: host CPU/memory (psutil) and NVIDIA GPU (NVML) metrics, from one
            process per host (local rank 0).
        metric_readers: OpenTelemetry ``MetricReader`` objects; default: those named by
            ``OTEL_METRICS_EXPORTER`` (``otlp``, ``console``, ``prometheus``, ...; unset:
            none). The local metrics spool is added whenever the goodput spool is on.
        metric_export_interval_s: seconds between exports (default
            ``OTEL_METRIC_EXPORT_INTERVAL`` ms, else 10).
        all_processes: every process records ``metrics.record`` values (default: only
            process 0 does).
        on_demand_profile: start on-demand profile capture
            (:func:`goodput.diagnostics.ondemand.enable`, see ``docs/profiling.md``).
        profile_dir: where profiles go (default ``<run_dir>/profiles``).
        **configure_kwargs: passed to :func:`goodput.configure` (``run_dir``,
            ``process_index``, ``flush_interval_s``, ...) when no recorder is configured
            yet; otherwise ignored with a warning (the existing recorder and its attempt
            are kept, and the run's attributes go into the run config record only).

    Returns:
        The :class:`MLRun`, also :func:`current_run`.

    Raises:
        ConfigError: ``configs`` cannot be loaded (the message names the file).
        ValueError: a bad name, FLOPs, device count or export interval, or a bad
            ``goodput.configure`` argument.
    """
    global _CURRENT
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"run name must be a non-empty string, got {name!r}")
    if run_group is not None and not isinstance(run_group, str):
        raise ValueError(f"run_group must be a string, got {run_group!r}")
    user_configs = load_configs(configs)
    flops = _positive_int(flops_per_step, "flops_per_step")
    peak = _positive_int(peak_flops_per_device, "peak_flops_per_device")
    count = _positive_int(device_count, "device_count")
    if (flops is None) != (peak is None) or (flops is not None and count is None):
        _log.warning("goodput.diagnostics: MFU needs flops_per_step, peak_flops_per_device "
                     "and device_count together; the report will show no MFU")
    interval_s = _metrics.export_interval_s(metric_export_interval_s)

    old = _CURRENT
    if old is not None:
        _log.info("goodput.diagnostics: run %s still active: ending it", old.name)
        old.end()

    attrs: dict = {schema.RES_RUN_NAME: name}
    if run_group is not None:
        attrs[schema.RES_RUN_GROUP] = run_group
    for key, value in ((schema.RES_FLOPS_PER_STEP, flops), (schema.RES_PEAK_FLOPS, peak),
                       (schema.RES_DEVICE_COUNT, count)):
        if value is not None:
            attrs[key] = value
    attrs.update(environment.collect())
    flat, dropped = flatten_configs(user_configs)
    attrs.update(flat)
    if dropped:
        _log.info("goodput.diagnostics: %d configs beyond the first %d are only in the "
                  "%s record", dropped, MAX_CONFIG_ATTRIBUTES, schema.RUN_CONFIG)

    from goodput import api

    rec = api.current_recorder()
    owns = rec is None
    if owns:
        kwargs = dict(configure_kwargs)
        extra = dict(kwargs.pop("resource_attributes", None) or {})
        rec = api.configure(kwargs.pop("job_name", name),
                            resource_attributes={**extra, **attrs}, **kwargs)
    else:
        if configure_kwargs:
            _log.warning("goodput.diagnostics: goodput is already configured; ignoring %s",
                         ", ".join(sorted(configure_kwargs)))
        _log.info("goodput.diagnostics: goodput is already configured (job %s): the run's "
                  "attributes go into the %s record, not onto the span resource",
                  rec.job_name, schema.RUN_CONFIG)
    attempt = rec.attempt
    if attempt is None:
        attempt = config.attempt_hint()[0]

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    if metric_readers is not None:
        readers = list(metric_readers)
    else:
        readers = _metrics.readers_from_env(interval_s)
    if rec.run_dir is not None:
        exporter = _metrics_spool.SpoolMetricExporter(
            _metrics_spool.spool_path(rec.run_dir, rec.process_index, attempt))
        readers.append(PeriodicExportingMetricReader(
            exporter, export_interval_millis=interval_s * 1000.0))
    provider = MeterProvider(metric_readers=readers,
                             resource=_recorder_resource(rec, attrs, attempt),
                             shutdown_on_exit=False)
    if profile_dir is None:
        base = rec.run_dir if rec.run_dir is not None else config.run_dir(None, rec.job_name)
        profile_dir = os.path.join(base, "profiles")
    r = MLRun(name, run_group, user_configs, attrs, rec, owns, provider, bool(all_processes),
              os.fspath(profile_dir), attempt)
    enabled = bool(all_processes) or rec.process_index == 0
    r.metrics = _metrics.RunMetrics(provider, enabled=enabled, on_first_record=r._first_record)
    if system_metrics:
        if environment.is_local_leader():
            from goodput.diagnostics.system import SystemMetrics

            r.system = SystemMetrics(provider)
        else:
            _log.debug("goodput.diagnostics: not local rank 0: no system metrics here")
    r._write_run_record(dropped)
    with _LOCK:
        _CURRENT = r
        _metrics._ACTIVE = r.metrics
    atexit.register(r.end)
    if on_demand_profile:
        _enable_ondemand(r)
    return r


def _enable_ondemand(r: MLRun) -> None:
    try:
        from goodput.diagnostics import ondemand
    except ImportError as exc:  # the module, or something it needs, is missing
        _log.warning("goodput.diagnostics: on-demand profiling is not available: %s", exc)
        return
    try:
        ondemand.enable(r)
    except Exception as exc:  # profiling must not stop the training
        _log.warning("goodput.diagnostics: on-demand profiling not started: %s", exc)
        return
    r._ondemand = ondemand
