"""Host and GPU metrics of a run, as OpenTelemetry asynchronous instruments.

Names, units and instrument kinds follow the OpenTelemetry semantic conventions
(``system.*``, ``process.*``, ``hw.*``); the callbacks run on the metric export
thread, at each export, never on the training thread.

Host (``psutil``; if it is missing: one warning, no host metrics):

- ``system.cpu.utilization`` (gauge, ``1``): all logical CPUs together, 0..1.
- ``system.memory.usage`` (up-down counter, ``By``), ``system.memory.state`` = ``used``:
  total minus available (``MemAvailable`` on Linux).
- ``system.memory.limit`` (up-down counter, ``By``): total host memory.
- ``system.memory.utilization`` (gauge, ``1``), ``system.memory.state`` = ``used``: the
  same over the total.
- ``process.memory.usage`` (up-down counter, ``By``): resident set size of this process.

NVIDIA GPUs (NVML via ``nvidia-ml-py``; no library, driver or GPU: one debug log, none of
these), each with ``hw.id`` (GPU UUID), ``hw.type`` = ``gpu``, ``hw.name`` (``gpu<index>``),
``hw.model``, ``hw.vendor`` = ``NVIDIA``:

- ``hw.gpu.utilization`` (gauge, ``1``, ``hw.gpu.task`` = ``general``).
- ``hw.gpu.memory.usage`` / ``hw.gpu.memory.limit`` (up-down counters, ``By``).
- ``hw.gpu.memory.utilization`` (gauge, ``1``).
- ``hw.power`` (gauge, ``W``) and ``hw.temperature`` (gauge, ``Cel``).

An NVML or psutil error inside a callback is swallowed, counted in
:attr:`SystemMetrics.errors` and logged once at debug level; that point is left out.
"""

from __future__ import annotations

import logging

from opentelemetry.metrics import Observation

from goodput.links import install_hint

_log = logging.getLogger(__name__)

#: Instrumentation scope of the system metrics.
SCOPE_NAME = "goodput.diagnostics.system"


class SystemMetrics:
    """Registers the host (and GPU) instruments on ``meter_provider``.

    Args:
        meter_provider: the run's ``MeterProvider``.
        host: register the ``psutil`` host metrics.
        gpu: register the NVML GPU metrics (when NVML and a GPU are there).

    Attributes:
        gpus: number of GPUs found (0 without NVML).
        errors: failures inside callbacks so far.
    """

    def __init__(self, meter_provider, host: bool = True, gpu: bool = True):
        from goodput import __version__

        self.errors = 0
        self.gpus = 0
        self._logged = False
        self._psutil = None
        self._process = None
        self._nvml = None
        self._handles: list = []
        meter = meter_provider.get_meter(SCOPE_NAME, __version__)
        if host:
            self._init_host(meter)
        if gpu:
            self._init_gpu(meter)

    # --- host ---------------------------------------------------------------------------

    def _init_host(self, meter) -> None:
        try:
            import psutil
        except ImportError:
            _log.warning("goodput.diagnostics: psutil is not installed: no host metrics "
                         "(%s)", install_hint("diagnostics"))
            return
        self._psutil = psutil
        self._process = psutil.Process()
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement
        meter.create_observable_gauge(
            "system.cpu.utilization", [self._cpu], unit="1",
            description="CPU utilisation of the host, all logical CPUs together (0..1).")
        meter.create_observable_up_down_counter(
            "system.memory.usage", [self._memory_usage], unit="By",
            description="Host memory in use (total minus available), state=used.")
        meter.create_observable_up_down_counter(
            "system.memory.limit", [self._memory_limit], unit="By",
            description="Total host memory.")
        meter.create_observable_gauge(
            "system.memory.utilization", [self._memory_utilization], unit="1",
            description="Fraction of host memory in use.")
        meter.create_observable_up_down_counter(
            "process.memory.usage", [self._rss], unit="By",
            description="Resident set size of the training process.")

    def _guard(self, fn):
        try:
            return fn()
        except Exception as exc:
            self.errors += 1
            if not self._logged:
                self._logged = True
                _log.debug("goodput.diagnostics: system metric failed: %s", exc)
            return []

    def _cpu(self, _options):
        return self._guard(lambda: [Observation(self._psutil.cpu_percent(interval=None) / 100)])

    def _memory_usage(self, _options):
        def read():
            vm = self._psutil.virtual_memory()
            return [Observation(int(vm.total - vm.available), {"system.memory.state": "used"})]

        return self._guard(read)

    def _memory_limit(self, _options):
        return self._guard(lambda: [Observation(int(self._psutil.virtual_memory().total))])

    def _memory_utilization(self, _options):
        def read():
            vm = self._psutil.virtual_memory()
            return [Observation((vm.total - vm.available) / vm.total,
                                {"system.memory.state": "used"})]

        return self._guard(read)

    def _rss(self, _options):
        return self._guard(lambda: [Observation(int(self._process.memory_info().rss))])

    # --- GPUs ---------------------------------------------------------------------------

    def _init_gpu(self, meter) -> None:
        try:
            import pynvml
        except ImportError:
            _log.debug("goodput.diagnostics: nvidia-ml-py is not installed: no GPU metrics")
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            _log.debug("goodput.diagnostics: NVML unavailable (%s): no GPU metrics", exc)
            return
        try:
            count = pynvml.nvmlDeviceGetCount()
            handles = []
            for i in range(count):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                handles.append((h, self._gpu_attrs(pynvml, h, i)))
        except Exception as exc:
            _log.debug("goodput.diagnostics: NVML device query failed (%s): no GPU metrics",
                       exc)
            self._shutdown_nvml(pynvml)
            return
        if not handles:
            _log.debug("goodput.diagnostics: NVML found no GPU")
            self._shutdown_nvml(pynvml)
            return
        self._nvml, self._handles, self.gpus = pynvml, handles, len(handles)
        meter.create_observable_gauge(
            "hw.gpu.utilization", [self._gpu_util], unit="1",
            description="Fraction of time the GPU was busy (NVML utilization.gpu).")
        meter.create_observable_up_down_counter(
            "hw.gpu.memory.usage", [self._gpu_mem("used")], unit="By",
            description="GPU memory used.")
        meter.create_observable_up_down_counter(
            "hw.gpu.memory.limit", [self._gpu_mem("total")], unit="By",
            description="Size of the GPU memory.")
        meter.create_observable_gauge(
            "hw.gpu.memory.utilization", [self._gpu_mem_util], unit="1",
            description="Fraction of GPU memory used.")
        meter.create_observable_gauge(
            "hw.power", [self._gpu_power], unit="W",
            description="Instantaneous power drawn by the GPU.")
        meter.create_observable_gauge(
            "hw.temperature", [self._gpu_temp], unit="Cel",
            description="GPU temperature.")

    @staticmethod
    def _gpu_attrs(nvml, handle, index: int) -> dict:
        def text(v):
            return v.decode() if isinstance(v, bytes) else str(v)

        attrs = {"hw.type": "gpu", "hw.vendor": "NVIDIA", "hw.name": f"gpu{index}"}
        try:
            attrs["hw.id"] = text(nvml.nvmlDeviceGetUUID(handle))
        except Exception:
            attrs["hw.id"] = f"gpu{index}"
        try:
            attrs["hw.model"] = text(nvml.nvmlDeviceGetName(handle))
        except Exception:
            pass
        return attrs

    def _per_gpu(self, read):
        out = []
        for handle, attrs in self._handles:
            try:
                value, extra = read(handle)
            except Exception as exc:
                self.errors += 1
                if not self._logged:
                    self._logged = True
                    _log.debug("goodput.diagnostics: NVML call failed for %s: %s",
                               attrs.get("hw.name"), exc)
                continue
            out.append(Observation(value, {**attrs, **extra} if extra else attrs))
        return out

    def _gpu_util(self, _options):
        nvml = self._nvml
        return self._per_gpu(lambda h: (nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100,
                                        {"hw.gpu.task": "general"}))

    def _gpu_mem(self, field: str):
        def observe(_options):
            nvml = self._nvml
            return self._per_gpu(lambda h: (int(getattr(nvml.nvmlDeviceGetMemoryInfo(h), field)),
                                            None))

        return observe

    def _gpu_mem_util(self, _options):
        nvml = self._nvml

        def read(h):
            m = nvml.nvmlDeviceGetMemoryInfo(h)
            return m.used / m.total, None

        return self._per_gpu(read)

    def _gpu_power(self, _options):
        nvml = self._nvml
        return self._per_gpu(lambda h: (nvml.nvmlDeviceGetPowerUsage(h) / 1000.0, None))

    def _gpu_temp(self, _options):
        nvml = self._nvml
        return self._per_gpu(lambda h: (
            nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU), None))

    # --- end ----------------------------------------------------------------------------

    @staticmethod
    def _shutdown_nvml(nvml) -> None:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass

    def close(self) -> None:
        """Release NVML (after the meter provider's last export). Safe to call twice."""
        nvml, self._nvml, self._handles = self._nvml, None, []
        if nvml is not None:
            self._shutdown_nvml(nvml)
