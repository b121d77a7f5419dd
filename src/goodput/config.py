"""Where the recorder's settings come from: arguments, then environment variables.

Environment variables (arguments of :func:`goodput.configure` win over them):

- ``OTEL_SERVICE_NAME`` / ``GOODPUT_JOB_NAME``: the job name.
- ``GOODPUT_RUN_DIR``: the spool directory (default ``./goodput-runs/<job>``).
- ``GOODPUT_PROCESS_INDEX`` (``RANK``, ``JAX_PROCESS_ID``, ``LOCAL_RANK``) and
  ``GOODPUT_PROCESS_COUNT`` (``WORLD_SIZE``, ``JAX_NUM_PROCESSES``); replaced by the
  framework's rank and size once ``torch.distributed`` or JAX is initialised.
- ``GOODPUT_ATTEMPT`` (``TORCHELASTIC_RESTART_COUNT``): the launcher's attempt number
  (without one the processor derives attempts from the processes' start times).
- ``GOODPUT_FLUSH_INTERVAL_S``: spool flush interval in seconds (default 1).
- ``GOODPUT_SPOOL``: ``0`` turns the local spool off.
- ``GOODPUT_TRACES_EXPORTER``, else ``OTEL_TRACES_EXPORTER``: extra exporters by
  name (``otlp``, ``otlp_proto_http``, ``gcp_trace``, ``gcp_otlp``, ``console``, ...);
  ``none`` or unset means the spool only. See :mod:`goodput.export`.
- ``GOODPUT_TRACE_WINDOW_S`` (default 60) and ``GOODPUT_TRACE_WINDOW_SPANS``
  (default 500): a new trace (window) after this many seconds or child spans.
- ``GOODPUT_SPOOL_SEGMENT_MB`` (default 16): a spool segment closes, and is compacted,
  once its journal holds this many MiB; ``0``: one uncompacted file per attempt.
- ``OTEL_RESOURCE_ATTRIBUTES``: more resource attributes, kept as they are.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import uuid

from opentelemetry.sdk.resources import Resource

from goodput import schema

_log = logging.getLogger(__name__)

DEFAULT_JOB_NAME = "goodput-job"
DEFAULT_FLUSH_INTERVAL_S = 1.0
_IMPORT_NS = time.time_ns()


def _env_int(*names: str) -> int | None:
    for name in names:
        raw = os.environ.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            return int(raw)
        except ValueError:
            _log.warning("goodput: ignoring %s=%r: not an integer", name, raw)
    return None


def job_name(explicit: str | None) -> str:
    """The job name: ``OTEL_SERVICE_NAME``, else ``GOODPUT_JOB_NAME``, else ``explicit``."""
    return (
        os.environ.get("OTEL_SERVICE_NAME")
        or os.environ.get("GOODPUT_JOB_NAME")
        or explicit
        or DEFAULT_JOB_NAME
    )


def process_index(explicit: int | None) -> tuple[int, str]:
    """Rank of this host process (``>= 0``) as the environment says it, and its source.

    ``explicit``, else ``GOODPUT_PROCESS_INDEX``, ``RANK``, ``JAX_PROCESS_ID`` (``"env"``),
    else the launcher's local rank ``LOCAL_RANK`` (``"local"``: Lightning's own DDP
    launcher sets no ``RANK``; combined with ``GROUP_RANK``/``NODE_RANK`` and
    ``LOCAL_WORLD_SIZE`` when all are set, which makes it global: ``"env"``), else 0
    (``"default"``: ``torch.multiprocessing.spawn`` sets nothing). The recorder replaces
    it by the framework's rank once ``torch.distributed`` or JAX is initialised.
    """
    if explicit is not None:
        return int(explicit), "argument"
    value = _env_int("GOODPUT_PROCESS_INDEX", "RANK", "JAX_PROCESS_ID")
    if value is not None and value >= 0:
        return value, "env"
    local = _env_int("LOCAL_RANK")
    if local is not None and local >= 0:
        node, size = _env_int("GROUP_RANK", "NODE_RANK"), _env_int("LOCAL_WORLD_SIZE")
        if node is not None and node >= 0 and size is not None and size > local:
            return node * size + local, "env"
        return local, "local"
    return 0, "default"


def framework_identity() -> tuple[int, int] | None:
    """``(rank, world size)`` from ``torch.distributed`` or JAX once initialised, else None.

    Looks only at modules the program already imported (never imports a framework, never
    calls ``jax.process_index()``, which would break ``jax.distributed.initialize``).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return int(dist.get_rank()), int(dist.get_world_size())
        except Exception:  # a group being torn down: try again at the next flush
            pass
    jd = sys.modules.get("jax._src.distributed")
    state = getattr(jd, "global_state", None) if jd is not None else None
    if state is not None and getattr(state, "client", None) is not None:
        rank, size = getattr(state, "process_id", None), getattr(state, "num_processes", None)
        if isinstance(rank, int) and isinstance(size, int) and 0 <= rank < size:
            return rank, size
    return None


def process_count(explicit: int | None) -> int:
    """Number of host processes of the job (``>= 1``)."""
    if explicit is not None:
        return int(explicit)
    value = _env_int("GOODPUT_PROCESS_COUNT", "WORLD_SIZE", "JAX_NUM_PROCESSES")
    return value if value is not None and value >= 1 else 1


def run_dir(explicit, job: str) -> str:
    """The spool directory: ``explicit``, ``GOODPUT_RUN_DIR``, or ``./goodput-runs/<job>``."""
    if explicit is not None:
        return os.fspath(explicit)
    env = os.environ.get("GOODPUT_RUN_DIR")
    if env:
        return env
    return schema.default_run_dir(job)


def flush_interval_s(explicit: float | None) -> float:
    """Spool flush interval in seconds (> 0)."""
    if explicit is None:
        raw = os.environ.get("GOODPUT_FLUSH_INTERVAL_S")
        try:
            explicit = float(raw) if raw else DEFAULT_FLUSH_INTERVAL_S
        except ValueError:
            _log.warning("goodput: ignoring GOODPUT_FLUSH_INTERVAL_S=%r", raw)
            explicit = DEFAULT_FLUSH_INTERVAL_S
    if not explicit > 0:
        raise ValueError(f"flush_interval_s must be > 0 seconds, got {explicit!r}")
    return float(explicit)


DEFAULT_TRACE_WINDOW_S = 60.0
DEFAULT_TRACE_WINDOW_SPANS = 500


def _positive(explicit, env: str, default, kind):
    """``explicit``, else the variable ``env``, else ``default``, as ``kind`` (> 0)."""
    if explicit is None:
        raw = os.environ.get(env, "").strip()
        try:
            explicit = kind(raw) if raw else default
        except ValueError:
            _log.warning("goodput: ignoring %s=%r: not a number", env, raw)
            explicit = default
        if not explicit > 0:
            _log.warning("goodput: ignoring %s=%r: not > 0", env, raw)
            explicit = default
    if isinstance(explicit, bool) or not isinstance(explicit, (int, float)) or not explicit > 0:
        raise ValueError(f"{env.lower().removeprefix('goodput_')} must be > 0, got {explicit!r}")
    return kind(explicit)


def trace_window_s(explicit: float | None) -> float:
    """Longest span of time one trace (window) covers, in seconds (> 0; default 60)."""
    return _positive(explicit, "GOODPUT_TRACE_WINDOW_S", DEFAULT_TRACE_WINDOW_S, float)


def trace_window_spans(explicit: int | None) -> int:
    """Most child spans in one trace (window) (>= 1; default 500; Cloud Trace keeps 1000)."""
    return _positive(explicit, "GOODPUT_TRACE_WINDOW_SPANS", DEFAULT_TRACE_WINDOW_SPANS, int)


def sdk_disabled() -> bool:
    """Whether ``OTEL_SDK_DISABLED=true`` turns the OpenTelemetry SDK off (then its tracers
    record nothing, so neither does goodput: :class:`~goodput.recorder.Recorder` says so)."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def spool_enabled(explicit: bool | None) -> bool:
    """Whether to write the local spool (default yes; ``GOODPUT_SPOOL=0`` turns it off)."""
    if explicit is not None:
        return bool(explicit)
    return os.environ.get("GOODPUT_SPOOL", "1").strip().lower() not in ("0", "false", "no", "off")


DEFAULT_SPOOL_SEGMENT_MB = 16


def spool_segment_bytes() -> int | None:
    """Journal bytes after which a spool segment closes and is compacted
    (``GOODPUT_SPOOL_SEGMENT_MB``, default 16 MiB); None (``0``): never."""
    raw = os.environ.get("GOODPUT_SPOOL_SEGMENT_MB", "").strip()
    try:
        mb = float(raw) if raw else DEFAULT_SPOOL_SEGMENT_MB
    except ValueError:
        mb = -1.0
    if not mb >= 0:
        _log.warning("goodput: ignoring GOODPUT_SPOOL_SEGMENT_MB=%r: not a number >= 0", raw)
        mb = DEFAULT_SPOOL_SEGMENT_MB
    return int(mb * (1 << 20)) or None


def spool_path(directory: str, index: int, attempt: int, instance: str) -> str:
    """File of one OS process's attempt:
    ``DIR/spans-p<index:05d>-a<attempt:04d>-<pid>-<instance[:8]>.jsonl``.

    ``instance`` is the attempt's ``service.instance.id``: no two processes share a file,
    whatever launched them (the index and attempt are only what the environment said).
    """
    return os.path.join(directory,
                        f"spans-p{index:05d}-a{attempt:04d}-{os.getpid()}-{instance[:8]}.jsonl")


def attempt_hint() -> tuple[int, str]:
    """The attempt number the launcher gives, and its source (``schema.ATTEMPT_SOURCES``).

    ``GOODPUT_ATTEMPT``, else torchrun's ``TORCHELASTIC_RESTART_COUNT`` (``"env"``: the
    same on every rank of one launch); else 0 (``"process"``: the processor derives the
    attempt from the processes' start times). Never read from the run directory: processes
    starting together would race on it.
    """
    value = _env_int("GOODPUT_ATTEMPT", "TORCHELASTIC_RESTART_COUNT")
    if value is not None and value >= 0:
        return value, "env"
    return 0, "process"


def make_resource(job: str, attempt: int, index: int, count: int, extra=None, *,
                  attempt_source: str = "process", index_source: str = "default") -> Resource:
    """The resource of one process's attempt (see ``docs/span-schema.md``).

    ``extra`` (e.g. ``gcp.project_id`` from :mod:`goodput.export`) and
    ``OTEL_RESOURCE_ATTRIBUTES`` are merged in; ours win on conflicts.
    """
    attrs = {
        schema.RES_SERVICE_NAME: job,
        schema.RES_SERVICE_INSTANCE_ID: uuid.uuid4().hex,
        schema.RES_HOST_NAME: socket.gethostname(),
        schema.RES_PROCESS_PID: os.getpid(),
        schema.RES_PROCESS_START: process_start_ns(),
        schema.RES_JOB_NAME: job,
        schema.RES_ATTEMPT: attempt,
        schema.RES_ATTEMPT_SOURCE: attempt_source,
        schema.RES_PROCESS_INDEX: index,
        schema.RES_PROCESS_INDEX_SOURCE: index_source,
        schema.RES_PROCESS_COUNT: count,
        schema.RES_SCHEMA_VERSION: schema.SCHEMA_VERSION,
    }
    return Resource.create({**(extra or {}), **attrs})


_START_CACHE: dict[int, int] = {}


def process_start_ns() -> int:
    """Wall-clock start of this OS process in ns since the epoch (10 ms resolution).

    Read from ``/proc/self/stat`` (Linux) once per process (the same value every call);
    elsewhere, or if that fails, the time the ``goodput`` package was imported.
    """
    pid = os.getpid()
    cached = _START_CACHE.get(pid)
    if cached is None:
        cached = _START_CACHE[pid] = _read_process_start_ns()
    return cached


def _read_process_start_ns() -> int:
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            stat = f.read()
        start_ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        ticks = os.sysconf("SC_CLK_TCK")
        age_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - start_ticks * 1_000_000_000 // ticks
        start = time.time_ns() - age_ns
        if 0 <= _IMPORT_NS - start < 86_400 * 1_000_000_000:
            return start
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    return _IMPORT_NS
