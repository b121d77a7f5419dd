"""Where the recorder's settings come from: arguments, then environment variables.

Environment variables (arguments of :func:`goodput.configure` win over them):

- ``OTEL_SERVICE_NAME`` / ``GOODPUT_JOB_NAME``: the job name.
- ``GOODPUT_RUN_DIR``: the spool directory (default ``./goodput-runs/<job>``).
- ``GOODPUT_PROCESS_INDEX`` (``RANK``, ``JAX_PROCESS_ID``, ``LOCAL_RANK``) and
  ``GOODPUT_PROCESS_COUNT`` (``WORLD_SIZE``, ``JAX_NUM_PROCESSES``); replaced by the
  framework's rank and size once ``torch.distributed`` or JAX is initialised.
- ``GOODPUT_ATTEMPT`` (``TORCHELASTIC_RESTART_COUNT``): the launcher's attempt number
  (without one the processor derives attempts from the processes' start times).
- ``GOODPUT_FLUSH_INTERVAL_S``: spool flush interval in seconds (default 1, 0.01 to 3600).
- ``GOODPUT_SPOOL``: ``0`` turns the local spool off.
- ``GOODPUT_TRACES_EXPORTER``, else ``OTEL_TRACES_EXPORTER``: extra exporters by
  name (``otlp``, ``otlp_proto_http``, ``gcp_trace``, ``gcp_otlp``, ``console``, ...);
  ``none`` or unset means the spool only. See :mod:`goodput.export`.
- ``GOODPUT_TRACE_WINDOW_S`` (default 60) and ``GOODPUT_TRACE_WINDOW_SPANS``
  (default 500): a new trace (window) after this many seconds or child spans.
- ``GOODPUT_SPOOL_SEGMENT_MB`` (default 16): a spool segment closes, and is compacted,
  once its journal holds this many MiB; ``0``: one uncompacted file per attempt.
  ``GOODPUT_SPOOL_SEGMENT_S`` (default 300, at most 86400): ... or once its spans cover
  this many seconds; ``0``: no time limit.
- ``OTEL_SDK_DISABLED``: ``true`` turns recording off.
- ``OTEL_RESOURCE_ATTRIBUTES``: more resource attributes, kept as they are.

Nothing here raises: a value out of its range, of the wrong type or unreadable is logged
once per process (one warning naming the setting, the value and what is used instead) and
replaced by its default, or by the nearest bound of its range where the value itself is a
clear wish (a flush interval of ``1e9`` s: 3600 s). ``docs/recording.md`` lists the ranges.
"""

from __future__ import annotations

import logging
import math
import operator
import os
import socket
import sys
import time
import uuid
from collections.abc import Mapping

from opentelemetry.sdk.resources import Resource

from goodput import schema

_log = logging.getLogger(__name__)

DEFAULT_JOB_NAME = "goodput-job"
DEFAULT_FLUSH_INTERVAL_S = 1.0
#: The flush interval's range (seconds): below it the background thread would spin; above
#: it a killed process's end would read up to an hour early.
FLUSH_INTERVAL_RANGE_S = (0.01, 3600.0)
MAX_JOB_NAME = 200  # characters (a directory name of the default run directory)
_IMPORT_NS = time.time_ns()
_WARNED: set = set()  # (setting, value) pairs already warned about in this process


def bad_setting(setting: str, value, why: str, used) -> None:
    """Log that ``setting`` (a variable or argument name) has the bad ``value`` (``why``),
    and that ``used`` is used instead: once per setting and value in this process."""
    try:
        key = (setting, repr(value)[:200])
    except Exception:  # a value whose repr raises
        key = (setting, type(value).__name__)
    if key in _WARNED:
        return
    _WARNED.add(key)
    _log.warning("goodput: ignoring %s=%s: %s; using %s", setting, key[1], why, used)


def _as_int(value) -> int | None:
    """``value`` as an int (ints, numpy/torch integers, integral floats and decimal strings),
    else None; never a bool."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    try:
        return int(operator.index(value))
    except Exception:
        pass
    try:
        f = float(value)
    except Exception:
        return None
    return int(f) if math.isfinite(f) and f.is_integer() else None


def _as_float(value) -> float | None:
    """``value`` as a finite float (numbers and number strings), else None; never a bool."""
    if isinstance(value, bool):
        return None
    try:
        f = float(value.strip() if isinstance(value, str) else value)
    except Exception:
        return None
    return f if math.isfinite(f) else None


def _env(name: str) -> str | None:
    raw = os.environ.get(name)
    return None if raw is None or raw.strip() == "" else raw


def _env_int(*names: str, minimum: int = 0, then: str = "the next source") -> int | None:
    """The first of the variables ``names`` that is set and an integer ``>= minimum``; one
    that is set to something else is warned about (``then``: what is used instead)."""
    for i, name in enumerate(names):
        raw = _env(name)
        if raw is None:
            continue
        value = _as_int(raw)
        if value is not None and value >= minimum:
            return value
        rest = [n for n in names[i + 1 :] if _env(n) is not None]
        bad_setting(name, raw, f"not an integer >= {minimum}", rest[0] if rest else then)
    return None


def job_name(explicit: str | None) -> str:
    """The job name: ``OTEL_SERVICE_NAME``, else ``GOODPUT_JOB_NAME``, else ``explicit``,
    else ``goodput-job``. A name that is not a non-empty string is warned about and the
    next one used; one longer than 200 characters is cut to 200."""
    for setting, value in (("OTEL_SERVICE_NAME", os.environ.get("OTEL_SERVICE_NAME")),
                           ("GOODPUT_JOB_NAME", os.environ.get("GOODPUT_JOB_NAME")),
                           ("job_name", explicit)):
        if value is None or (setting != "job_name" and value == ""):
            continue
        if not isinstance(value, str) or not value.strip():
            bad_setting(setting, value, "not a non-empty string", "the next source, else "
                        f"{DEFAULT_JOB_NAME!r}")
            continue
        if len(value) > MAX_JOB_NAME:
            bad_setting(setting, value, f"longer than {MAX_JOB_NAME} characters",
                        f"its first {MAX_JOB_NAME}")
            value = value[:MAX_JOB_NAME]
        return value
    return DEFAULT_JOB_NAME


def process_index(explicit: int | None) -> tuple[int, str]:
    """Rank of this host process (``>= 0``) as the environment says it, and its source.

    ``explicit``, else ``GOODPUT_PROCESS_INDEX``, ``RANK``, ``JAX_PROCESS_ID`` (``"env"``),
    else the launcher's local rank ``LOCAL_RANK`` (``"local"``: Lightning's own DDP
    launcher sets no ``RANK``; combined with ``GROUP_RANK``/``NODE_RANK`` and
    ``LOCAL_WORLD_SIZE`` when all are set, which makes it global: ``"env"``), else 0
    (``"default"``: ``torch.multiprocessing.spawn`` sets nothing). The recorder replaces
    it by the framework's rank once ``torch.distributed`` or JAX is initialised. A value
    that is not an integer >= 0 is warned about and the next source used.
    """
    if explicit is not None:
        value = _as_int(explicit)
        if value is not None and value >= 0:
            return value, "argument"
        bad_setting("process_index", explicit, "not an integer >= 0", "the environment's")
    value = _env_int("GOODPUT_PROCESS_INDEX", "RANK", "JAX_PROCESS_ID",
                     then="LOCAL_RANK, else 0")
    if value is not None:
        return value, "env"
    local = _env_int("LOCAL_RANK", then="0")
    if local is not None:
        node = _env_int("GROUP_RANK", "NODE_RANK", then="LOCAL_RANK alone")
        size = _env_int("LOCAL_WORLD_SIZE", minimum=1, then="LOCAL_RANK alone")
        if node is not None and size is not None and size > local:
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
                rank, size = int(dist.get_rank()), int(dist.get_world_size())
                if 0 <= rank < size:
                    return rank, size
        except Exception:  # a group being torn down: try again at the next flush
            pass
    jd = sys.modules.get("jax._src.distributed")
    state = getattr(jd, "global_state", None) if jd is not None else None
    if state is not None and getattr(state, "client", None) is not None:
        rank, size = getattr(state, "process_id", None), getattr(state, "num_processes", None)
        if isinstance(rank, int) and isinstance(size, int) and 0 <= rank < size:
            return rank, size
    return None


def process_count(explicit: int | None, index: int = 0) -> int:
    """Number of host processes of the job (``>= 1``): ``explicit``, else
    ``GOODPUT_PROCESS_COUNT``, ``WORLD_SIZE``, ``JAX_NUM_PROCESSES``, else ``index + 1``.
    A value that is not an integer >= 1 is warned about; one not above the process's
    ``index`` is raised to ``index + 1``, with a warning."""
    value = None
    if explicit is not None:
        value = _as_int(explicit)
        if value is None or value < 1:
            bad_setting("process_count", explicit, "not an integer >= 1", "the environment's")
            value = None
    if value is None:
        value = _env_int("GOODPUT_PROCESS_COUNT", "WORLD_SIZE", "JAX_NUM_PROCESSES",
                         minimum=1, then="1")
    if value is None:  # nothing said: at least the processes up to this one
        return max(1, index + 1)
    if value <= index:
        bad_setting("process_count", value, f"not above the process index {index}",
                    index + 1)
        value = index + 1
    return value


def run_dir(explicit, job: str) -> str:
    """The spool directory: ``explicit``, ``GOODPUT_RUN_DIR``, or ``./goodput-runs/<job>``.
    An ``explicit`` that is not a non-empty path (str, bytes, ``os.PathLike``) is warned
    about and the next one used."""
    if explicit is not None:
        try:
            path = os.fsdecode(os.fspath(explicit))
        except Exception:
            path = ""
        if path.strip():
            return path
        bad_setting("run_dir", explicit, "not a non-empty path", "GOODPUT_RUN_DIR, else "
                    "./goodput-runs/<job>")
    env = _env("GOODPUT_RUN_DIR")
    if env is not None:
        return env
    return schema.default_run_dir(job)


def _bounded(setting: str, value, default: float, low: float, high: float) -> float:
    """``value`` as a float in ``[low, high]``: the nearest bound if outside it; ``default``
    if it is no finite number or not > 0 (each with one warning)."""
    f = _as_float(value)
    if f is None or not f > 0:
        bad_setting(setting, value, "not a finite number > 0", f"the default {default:g}")
        return default
    if f < low:
        bad_setting(setting, value, f"below {low:g}", f"{low:g}")
        return low
    if f > high:
        bad_setting(setting, value, f"above {high:g}", f"{high:g}")
        return high
    return f


def flush_interval_s(explicit: float | None) -> float:
    """Spool flush interval in seconds: ``explicit``, else ``GOODPUT_FLUSH_INTERVAL_S``,
    else 1; within ``FLUSH_INTERVAL_RANGE_S`` (0.01 to 3600 s). A value that is no finite
    number > 0 gets the default, one outside the range its nearest bound, with a warning."""
    low, high = FLUSH_INTERVAL_RANGE_S
    if explicit is not None:
        return _bounded("flush_interval_s", explicit, DEFAULT_FLUSH_INTERVAL_S, low, high)
    raw = _env("GOODPUT_FLUSH_INTERVAL_S")
    if raw is None:
        return DEFAULT_FLUSH_INTERVAL_S
    return _bounded("GOODPUT_FLUSH_INTERVAL_S", raw, DEFAULT_FLUSH_INTERVAL_S, low, high)


DEFAULT_TRACE_WINDOW_S = 60.0
DEFAULT_TRACE_WINDOW_SPANS = 500
MAX_TRACE_WINDOW_S = 86_400.0
MAX_TRACE_WINDOW_SPANS = 1_000_000


def trace_window_s(explicit: float | None) -> float:
    """Longest span of time one trace (window) covers, in seconds: ``explicit``, else
    ``GOODPUT_TRACE_WINDOW_S``, else 60; at most one day (a bad value: warned, default)."""
    setting, value = ("trace_window_s", explicit) if explicit is not None else (
        "GOODPUT_TRACE_WINDOW_S", _env("GOODPUT_TRACE_WINDOW_S"))
    if value is None:
        return DEFAULT_TRACE_WINDOW_S
    return _bounded(setting, value, DEFAULT_TRACE_WINDOW_S, 1e-3, MAX_TRACE_WINDOW_S)


def trace_window_spans(explicit: int | None) -> int:
    """Most child spans in one trace (window): ``explicit``, else
    ``GOODPUT_TRACE_WINDOW_SPANS``, else 500 (1 to 10^6; Cloud Trace keeps 1000 a trace).
    A value that is not an integer >= 1 is warned about and the default used."""
    setting, value = ("trace_window_spans", explicit) if explicit is not None else (
        "GOODPUT_TRACE_WINDOW_SPANS", _env("GOODPUT_TRACE_WINDOW_SPANS"))
    if value is None:
        return DEFAULT_TRACE_WINDOW_SPANS
    n = _as_int(value)
    if n is None or n < 1:
        bad_setting(setting, value, "not an integer >= 1",
                    f"the default {DEFAULT_TRACE_WINDOW_SPANS}")
        return DEFAULT_TRACE_WINDOW_SPANS
    if n > MAX_TRACE_WINDOW_SPANS:
        bad_setting(setting, value, f"above {MAX_TRACE_WINDOW_SPANS}", MAX_TRACE_WINDOW_SPANS)
        return MAX_TRACE_WINDOW_SPANS
    return n


def sdk_disabled() -> bool:
    """Whether ``OTEL_SDK_DISABLED=true`` turns the OpenTelemetry SDK off (then its tracers
    record nothing, so neither does goodput: :class:`~goodput.recorder.Recorder` says so).
    Another value than ``true``/``false`` is warned about and read as ``false``, as the
    SDK reads it."""
    raw = os.environ.get("OTEL_SDK_DISABLED", "").strip().lower()
    if raw not in ("", "true", "false"):
        bad_setting("OTEL_SDK_DISABLED", os.environ["OTEL_SDK_DISABLED"],
                    "neither true nor false", "false (recording on)")
    return raw == "true"


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def spool_enabled(explicit: bool | None) -> bool:
    """Whether to write the local spool (default yes; ``GOODPUT_SPOOL=0`` turns it off).

    ``explicit``: a bool (or 0/1, or one of the strings below); ``GOODPUT_SPOOL``: one of
    ``1 true yes on`` / ``0 false no off`` (any case). Anything else is warned about and
    the spool is on."""
    if explicit is not None:
        if isinstance(explicit, bool):
            return explicit
        if isinstance(explicit, int) and explicit in (0, 1):
            return bool(explicit)
        if isinstance(explicit, str) and explicit.strip().lower() in _TRUE + _FALSE:
            return explicit.strip().lower() in _TRUE
        bad_setting("spool", explicit, "not a bool", "GOODPUT_SPOOL, else on")
    raw = _env("GOODPUT_SPOOL")
    if raw is None:
        return True
    value = raw.strip().lower()
    if value in _TRUE + _FALSE:
        return value in _TRUE
    bad_setting("GOODPUT_SPOOL", raw, "not one of 1/true/yes/on, 0/false/no/off",
                "the default: on")
    return True


DEFAULT_SPOOL_SEGMENT_MB = 16


def spool_segment_bytes() -> int | None:
    """Journal bytes after which a spool segment closes and is compacted
    (``GOODPUT_SPOOL_SEGMENT_MB``, default 16 MiB, at most 2^20 MiB); None (``0``): never.
    A value that is no finite number >= 0 is warned about and the default used."""
    raw = _env("GOODPUT_SPOOL_SEGMENT_MB")
    if raw is None:
        return DEFAULT_SPOOL_SEGMENT_MB << 20
    mb = _as_float(raw)
    if mb is None or mb < 0:
        bad_setting("GOODPUT_SPOOL_SEGMENT_MB", raw, "not a finite number >= 0",
                    f"the default {DEFAULT_SPOOL_SEGMENT_MB}")
        mb = DEFAULT_SPOOL_SEGMENT_MB
    elif mb > 1 << 20:
        bad_setting("GOODPUT_SPOOL_SEGMENT_MB", raw, "above 1048576 (1 TiB)", "1048576")
        mb = 1 << 20
    return int(mb * (1 << 20)) or None


DEFAULT_SPOOL_SEGMENT_S = 300.0


def spool_segment_ns() -> int | None:
    """Span time (ns) after which a spool segment closes and is compacted
    (``GOODPUT_SPOOL_SEGMENT_S``, default 300 s, 1 to 86400); None (``0``): no time limit."""
    raw = _env("GOODPUT_SPOOL_SEGMENT_S")
    if raw is not None and _as_float(raw) == 0:
        return None
    s = DEFAULT_SPOOL_SEGMENT_S if raw is None else _bounded(
        "GOODPUT_SPOOL_SEGMENT_S", raw, DEFAULT_SPOOL_SEGMENT_S, 1.0, 86_400.0)
    return int(s * 1e9)


_RESOURCE_TYPES = (bool, int, float, str)


def resource_attributes(explicit) -> dict:
    """``explicit`` resource attributes (a mapping of str to a bool, int, float or str, or
    a sequence of one of those) as a dict; a value of another type, a key that is not a
    string, or ``explicit`` not being a mapping is warned about and left out."""
    if explicit is None:
        return {}
    if not isinstance(explicit, Mapping):
        bad_setting("resource_attributes", explicit, "not a mapping", "none")
        return {}
    out = {}
    try:
        items = list(explicit.items())
    except Exception as exc:
        bad_setting("resource_attributes", explicit, f"unreadable ({exc})", "none")
        return {}
    for key, value in items:
        ok = isinstance(key, str) and key != ""
        if ok and not isinstance(value, _RESOURCE_TYPES):
            ok = (isinstance(value, (list, tuple)) and len({type(v) for v in value}) <= 1
                  and all(isinstance(v, _RESOURCE_TYPES) for v in value))
        if ok and isinstance(value, float) and not math.isfinite(value):
            ok = False
        if ok:
            out[key] = value
        else:
            bad_setting(f"resource_attributes[{key!r}]", value,
                        "not a string key with a bool, int, float or str value (or a "
                        "sequence of one of those)", "nothing (left out)")
    return out


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
    value = _env_int("GOODPUT_ATTEMPT", "TORCHELASTIC_RESTART_COUNT",
                     then="the processes' start times")
    if value is not None:
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
