"""ML run diagnostics on OpenTelemetry: runs, configs, ML metrics, system metrics, profiles.

The OpenTelemetry counterpart of Google Cloud ML Diagnostics' SDK::

    from goodput import diagnostics
    from goodput.diagnostics import MetricType, metrics

    run = diagnostics.run("llama-sweep-3", run_group="sweep", configs="config.yaml")
    for step in range(steps):
        ...
        metrics.record(MetricType.LOSS, loss, step=step)
    run.end()                      # also at interpreter exit

``import goodput`` does not import this package. Importing it loads the run and metric
modules (the OpenTelemetry metrics SDK, nothing else); psutil, NVML, PyYAML and the
profiler are imported only when used, and no framework ever is. See
``docs/diagnostics.md`` and, for profile capture, ``docs/profiling.md``.
"""

from __future__ import annotations

import importlib

from goodput.diagnostics import metrics
from goodput.diagnostics.metrics import MetricType, record

# Bound after the submodule import on purpose: ``diagnostics.run`` is the function,
# the module stays reachable as ``sys.modules["goodput.diagnostics.run"]``.
from goodput.diagnostics.run import MLRun, current_run, run
from goodput.diagnostics.run_configs import ConfigError

#: Modules (the profiler, written separately) whose public names are also offered here,
#: imported on first use.
_LAZY = ("profile", "ondemand")

__all__ = ["ConfigError", "MLRun", "MetricType", "current_run", "metrics", "record", "run"]


def __getattr__(name: str):
    if name in ("environment", "system", *_LAZY):
        return importlib.import_module(f"{__name__}.{name}")
    if not name.startswith("_"):
        try:
            mod = importlib.import_module(f"{__name__}.profile")
        except ImportError:
            mod = None
        if mod is not None and name in getattr(mod, "__all__", ()):
            return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
