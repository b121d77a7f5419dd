"""The span schema: the contract between the training side and the processor.

Every name the two sides share lives here and nowhere else; ``docs/span-schema.md``
documents it for people. The processor (``goodput_processor``) imports this module
(it is dependency-free) and never anything else from the training side.

Times are OpenTelemetry span start/end times (nanoseconds since the Unix epoch).
Integers are used for everything the processor needs, never floats: some
backends (Cloud Trace) turn float attributes into ``%.4f`` strings.
"""

from __future__ import annotations

import os
import re

#: Version of this schema, written as the ``goodput.schema.version`` resource
#: attribute. Bump the major number on any change that an older processor
#: would misread.
SCHEMA_VERSION = "1.3"

#: Instrumentation scope name of the tracer that emits goodput spans.
SCOPE_NAME = "goodput"

# --- span names -------------------------------------------------------------

#: Zero-length marker written (and flushed) the moment an attempt starts.
JOB_START = "goodput.job_start"
#: Zero-length marker written when an attempt ends cleanly (explicit call,
#: interpreter exit, SIGTERM). Absent when the process was killed.
JOB_END = "goodput.job_end"
#: Liveness marker written when a process has had nothing else to export for
#: one flush interval; its end time says the process was alive then.
HEARTBEAT = "goodput.heartbeat"
#: Zero-length marker written when the process learns its rank and the job's size from
#: the framework once it is initialised (``torch.distributed``, JAX distributed), and
#: again if they change: attributes :data:`RES_PROCESS_INDEX` and :data:`RES_PROCESS_COUNT`
#: (ints). It overrides the resource's ``goodput.process.index``/``count``, which were only
#: what the launcher's environment said when ``configure`` ran.
IDENTITY = "goodput.identity"
#: Root span of one trace: a window of one attempt of one process. Every other
#: span is a child of a window; a window covers its children (start of the
#: first to end of the last) and is written when it closes (after
#: ``GOODPUT_TRACE_WINDOW_S`` seconds or ``GOODPUT_TRACE_WINDOW_SPANS`` children,
#: or at the attempt's end). Structure only: the processor ignores it.
WINDOW = "goodput.window"
#: Zero-length record of an ML run's configuration (``goodput.diagnostics``): user
#: configs too large for resource attributes, and software/system configs known only
#: after the framework initialised (device kind and count). Not part of the accounting.
RUN_CONFIG = "goodput.run.config"

ACCELERATOR_INIT = "goodput.accelerator_init"
TRAINING_PREP = "goodput.training_prep"
PROGRAM_STARTUP = "goodput.program_startup"
DATA_LOADING = "goodput.data_loading"
STEP = "goodput.step"
CHECKPOINT_SAVE = "goodput.checkpoint_save"
CHECKPOINT_RESTORE = "goodput.checkpoint_restore"
CUSTOM_BADPUT = "goodput.custom_badput"
#: Elastic training (schema 1.2): waiting for slices after an elastic event (a slice went
#: down, or new slices came up: ``goodput.elastic.event_type``), and re-initialising the
#: training on the new set of slices after that wait (mesh, compilation, restore).
ELASTIC_WAIT = "goodput.elastic_wait"
ELASTIC_REINIT = "goodput.elastic_reinit"
#: Zero-length marker (schema 1.2): the job's slice counts changed (or were read) at this
#: moment: attributes :data:`ATTR_SLICES_ACTIVE`, :data:`ATTR_SLICES_AVAILABLE`,
#: :data:`ATTR_SLICES_TOTAL` (ints). Not a phase: it carries the counts that stepping and
#: available slice efficiency are computed from.
ELASTIC_SLICES = "goodput.elastic_slices"

#: Schema 1.3: a process waiting in a collective (an all-reduce, a barrier) for its peers,
#: from the moment it reached the collective to the collective's end; recorded inside a
#: step (``goodput.collective_wait()``). Not a phase of the accounting (the step span covers
#: it and the buckets do not change): the processor reads it to tell which host made a slow
#: step slow, the host that reached the collective last (docs/accounting.md, "Badput
#: attributed to hosts"). ``goodput.blocking`` and ``goodput.open`` as on phases.
COLLECTIVE_WAIT = "goodput.collective_wait"
#: Schema 1.3: an event of the launcher, written by the launcher's own process (resource
#: :data:`RES_PROCESS_ROLE` = ``launcher``), e.g. torchelastic's agent started a worker,
#: saw one fail, finished a rendezvous (``python -m goodput.torchrun``). Zero length, or
#: covering the launcher's operation (a rendezvous: from its start to its end). Attributes
#: :data:`ATTR_LAUNCHER_EVENT` (str), :data:`ATTR_LAUNCHER_WORKER_PID`,
#: :data:`ATTR_LAUNCHER_EXIT_CODE`, :data:`ATTR_LAUNCHER_RESTART_COUNT`,
#: :data:`ATTR_LAUNCHER_GLOBAL_RANK` (ints, each when known). Not a phase.
LAUNCHER_EVENT = "goodput.launcher_event"

#: Phase spans (each covers a stretch of wall-clock time of one process).
PHASES = (
    ACCELERATOR_INIT,
    TRAINING_PREP,
    PROGRAM_STARTUP,
    DATA_LOADING,
    STEP,
    CHECKPOINT_SAVE,
    CHECKPOINT_RESTORE,
    CUSTOM_BADPUT,
)
#: Phase spans of elastic training (schema 1.2), accounted like the phases above.
ELASTIC_PHASES = (ELASTIC_WAIT, ELASTIC_REINIT)
#: Spans that only give traces their shape or carry run information: the processor
#: reads past them (no time accounting, not counted as unknown).
STRUCTURE = (WINDOW, RUN_CONFIG)
#: Markers (lifecycle of an attempt of one process, and trace structure).
MARKERS = (JOB_START, JOB_END, HEARTBEAT, IDENTITY, ELASTIC_SLICES) + STRUCTURE
#: Evidence spans of schema 1.3 that cover no bucket: a collective wait (inside a step) and a
#: launcher's event.
EVIDENCE = (COLLECTIVE_WAIT, LAUNCHER_EVENT)
#: Every span name of this schema.
SPAN_NAMES = PHASES + ELASTIC_PHASES + MARKERS + EVIDENCE

# --- span attributes --------------------------------------------------------

ATTR_STEP = "goodput.step"  # int: training step number (STEP)
#: int on STEP, default 1: the span covers this many consecutive steps ending at
#: ``goodput.step``. Only importers of logs that know progress at checkpoint granularity
#: (``goodput import --from resiliency``) write it; the recorder never does.
ATTR_STEP_COUNT = "goodput.step.count"
ATTR_CHECKPOINT_STEP = "goodput.checkpoint.step"  # int: step of the checkpoint saved / restored
ATTR_BLOCKING = "goodput.blocking"  # bool: False = async work overlapping training, not badput
ATTR_BADPUT_TYPE = "goodput.badput.type"  # str: CUSTOM_BADPUT type, e.g. "eval", "sdc_check"
#: str on ELASTIC_WAIT: what the job waits for, as the recorder was told, e.g.
#: ``elastic_slice_down`` or ``elastic_scale_up`` (a type containing ``scale_up`` is a
#: scale-up, any other a slice-down; see ELASTIC_BUCKETS)
ATTR_ELASTIC_EVENT_TYPE = "goodput.elastic.event_type"
#: ints on ELASTIC_SLICES: slices stepping (running the training), available (healthy), and
#: in the job (total)
ATTR_SLICES_ACTIVE = "goodput.elastic.slices.active"
ATTR_SLICES_AVAILABLE = "goodput.elastic.slices.available"
ATTR_SLICES_TOTAL = "goodput.elastic.slices.total"
#: on LAUNCHER_EVENT (schema 1.3): the event's name (str: torchelastic's, e.g.
#: ``torchelastic.worker.status.START``, or ``torchelastic.worker.failed`` when the agent saw
#: a worker fail), the worker's pid, its exit code (negative: killed by that signal, as
#: torchelastic reports it), the launcher's restart count and the worker's global rank (ints)
ATTR_LAUNCHER_EVENT = "goodput.launcher.event"
ATTR_LAUNCHER_WORKER_PID = "goodput.launcher.worker_pid"
ATTR_LAUNCHER_EXIT_CODE = "goodput.launcher.exit_code"
ATTR_LAUNCHER_RESTART_COUNT = "goodput.launcher.restart_count"
ATTR_LAUNCHER_GLOBAL_RANK = "goodput.launcher.global_rank"
ATTR_END_REASON = "goodput.end.reason"  # str on JOB_END: one of END_REASONS
ATTR_HEARTBEAT_INTERVAL_MS = "goodput.heartbeat.interval_ms"  # int on JOB_START
ATTR_RECORDER_ERRORS = "goodput.recorder.errors"  # int on JOB_END/HEARTBEAT: failures so far
ATTR_RECORDER_DROPPED = "goodput.recorder.dropped"  # int on JOB_END/HEARTBEAT: records lost so far
#: bool on a phase span, true: the phase was still running when this record was written
#: (at a flush); the span's end is the time of that flush, the last moment the process was
#: seen inside the phase. The recorder writes one per flush interval for each phase in
#: flight, so a process killed inside a phase leaves the phase's start in the spool. The
#: processor drops such records when the phase's own (complete) span with the same start
#: arrives, and otherwise keeps the latest one: the phase ran until then.
ATTR_OPEN = "goodput.open"

#: on CUSTOM_BADPUT spans of type PROFILE_BADPUT_TYPE (profile capture sessions):
ATTR_PROFILE_SESSION = "goodput.profile.session_id"  # str, the same on every host
ATTR_PROFILE_DIR = "goodput.profile.dir"  # str: where the profiler wrote
ATTR_PROFILE_TRIGGER = "goodput.profile.trigger"  # str: "programmatic" or "on_demand"
#: Custom badput type of profile capture (``custom:profile`` in the report).
PROFILE_BADPUT_TYPE = "profile"

ATTR_WINDOW_INDEX = "goodput.window.index"  # int on WINDOW: 0, 1, ... within the attempt
ATTR_WINDOW_SPANS = "goodput.window.spans"  # int on WINDOW: number of its child spans

#: ``sigterm`` is only written by recorders older than schema 1.1 (which delayed SIGTERM
#: with a Python handler); a process ended by a signal now leaves no end marker.
END_REASONS = ("explicit", "exit", "sigterm", "exception", "restart")

# --- resource attributes ----------------------------------------------------

# OpenTelemetry semantic conventions, used as they are:
RES_SERVICE_NAME = "service.name"  # the job name (OTEL_SERVICE_NAME wins)
RES_SERVICE_INSTANCE_ID = "service.instance.id"  # unique per process and attempt
RES_HOST_NAME = "host.name"
RES_PROCESS_PID = "process.pid"
# This project's own:
RES_JOB_NAME = "goodput.job.name"  # str: the job; the processor groups by it
RES_ATTEMPT = "goodput.attempt"  # int >= 0: restart count of the job
RES_PROCESS_INDEX = "goodput.process.index"  # int: rank of the host process in the job
RES_PROCESS_COUNT = "goodput.process.count"  # int: number of host processes
#: str: where ``goodput.process.index`` came from: ``argument`` (configure), ``env`` (a
#: global rank variable: GOODPUT_PROCESS_INDEX, RANK, JAX_PROCESS_ID), ``local`` (a
#: launcher's local rank, LOCAL_RANK, unique on one host only) or ``default`` (nothing
#: said: 0), or ``framework`` (``torch.distributed``'s or JAX's rank: known at
#: ``configure``, or learned later, when the spans from then on carry a resource with it,
#: the same ``service.instance.id``, and a ``goodput.identity`` marker says it). Only
#: ``argument``/``env`` (or a ``goodput.identity`` marker) make the index a process slot the
#: processor can rely on (see docs/accounting.md).
RES_PROCESS_INDEX_SOURCE = "goodput.process.index.source"
INDEX_SOURCES = ("argument", "env", "local", "default", "framework")
#: int: when this OS process started, ns since the Unix epoch (``/proc/self/stat``; 10 ms
#: resolution). With ``process.pid`` and ``host.name`` it identifies the OS process.
RES_PROCESS_START = "goodput.process.start_time_unix_nano"
#: str: where ``goodput.attempt`` came from: ``env`` (GOODPUT_ATTEMPT or torchrun's
#: TORCHELASTIC_RESTART_COUNT: the same on every rank of one launch) or ``process`` (no
#: variable: 0 for this OS process's first attempt, +1 for each later ``job_start`` in it).
#: The processor derives the job's attempts from evidence either way (docs/accounting.md).
RES_ATTEMPT_SOURCE = "goodput.attempt.source"
ATTEMPT_SOURCES = ("env", "process")
RES_SCHEMA_VERSION = "goodput.schema.version"  # str: SCHEMA_VERSION
#: str on spans written by ``goodput import``: the format they were converted from
#: (one of IMPORT_SOURCES). Absent on spans the recorder wrote.
RES_IMPORTED_FROM = "goodput.imported_from"
IMPORT_SOURCES = ("ml-goodput-measurement", "resiliency")
#: int (ms), on spans a source translated from another tool's telemetry (``goodput import
#: --from``, ``goodput serve``): how long that tool may hold records before it exports them
#: (its batch delay); a process killed loses up to that much of its last records.
RES_SOURCE_EXPORT_DELAY = "goodput.source.export_delay_ms"

# ML run (``goodput.diagnostics``), read by the processor for MFU:
RES_RUN_NAME = "ml.run.name"  # str
RES_RUN_GROUP = "ml.run.group"  # str
#: int (a float beyond int64): model FLOPs of one training step, all devices together
RES_FLOPS_PER_STEP = "ml.flops_per_step"
RES_PEAK_FLOPS = "ml.device.peak_flops"  # int (float beyond int64): peak FLOP/s of one device
RES_DEVICE_COUNT = "ml.device.count"  # int: devices of the job

# Launchers and schedulers (schema 1.3), read by the processor for the recovery phases and
# ETTR (docs/accounting.md, "Recovery phases"; docs/definitions.md, "ETTR"):
#: str: ``worker`` (absent = worker: a training process) or ``launcher`` (a launcher's own
#: process that records only LAUNCHER_EVENT spans; it is no process of any attempt)
RES_PROCESS_ROLE = "goodput.process.role"
PROCESS_ROLES = ("worker", "launcher")
#: str: the recording API this process's attempts were started through, when not this
#: package's own (absent): ``ml-goodput-measurement`` (``goodput.mgm``'s recorders, where
#: each ``goodput.job_start`` is an explicit ``record_job_start_time`` call: the
#: incumbent's attempt boundary; docs/accounting.md, "Structure: attempts and processes
#: from evidence")
RES_RECORDER_API = "goodput.recorder.api"
RECORDER_APIS = ("ml-goodput-measurement",)
#: ints, ns since the Unix epoch, of the Kubernetes pod this process runs in, when the job
#: reports them (from the pod's status: ``metadata.creationTimestamp``, the
#: ``PodScheduled`` condition's ``lastTransitionTime``, the container's
#: ``state.running.startedAt``): created (the job asked for it: queued from then on),
#: scheduled (bound to a node: the allocation), container started
RES_K8S_POD_CREATED = "goodput.k8s.pod.created_time_unix_nano"
RES_K8S_POD_SCHEDULED = "goodput.k8s.pod.scheduled_time_unix_nano"
RES_K8S_POD_STARTED = "goodput.k8s.pod.started_time_unix_nano"

# --- where spans are written --------------------------------------------------

#: Parent of the default run directories (``./goodput-runs/<job>``).
DEFAULT_RUN_ROOT = "goodput-runs"
#: Files in a run directory whose names start with this hold OTLP JSON *metrics*
#: (``goodput.diagnostics``), not spans: span readers skip them.
METRICS_SPOOL_PREFIX = "metrics-"

# --- the tail of an attempt's spool (docs/span-schema.md, "The tail") -------------
# ``BASE.tail`` beside the journal ``BASE.jsonl``: a fixed-size file the recorder maps into
# memory. The training thread writes each record there as it records it (a phase's end, a
# phase's start, a step start), so a SIGKILL loses none; the background thread writes how
# far the journal has got. The processor turns the records the journal lacks into the
# spans the journal would have held. Little-endian ``struct`` layouts:

TAIL_SUFFIX = ".tail"
TAIL_MAGIC = b"GPTAIL\x00\x01"
#: At 0: magic, format version, record size, ring records, blob bytes, template bytes (per
#: copy), flags (TAIL_LOCKED), span id base, trace id (16 raw bytes). 64 bytes.
TAIL_HEAD = "<8sIIIIIIQ16s8x"
TAIL_VERSION = 1
TAIL_LOCKED = 1  # the writer holds an exclusive flock on the file while it lives
#: Two copies (at TAIL_STATE_AT), written in turn, valid when the first field (a
#: generation) equals the last: generation, journal holds every record up to this
#: sequence number, the step in flight then (number, start ns, 1 if any), generation.
TAIL_STATE = "<QQqqQQ"
TAIL_STATE_AT = (64, 112)
#: Two copies of the line template (the journal's text before a line's spans, NUL, the
#: text after them: the attempt's resource): generation, length, crc32 at
#: TAIL_TEMPLATE_AT[i]; the text at TAIL_DATA_AT + i * template bytes.
TAIL_TEMPLATE = "<QII"
TAIL_TEMPLATE_AT = (160, 176)
TAIL_DATA_AT = 256
#: A ring record (the ring follows the templates: record ``seq`` at slot ``seq % ring
#: records``; then the blob ring): a word (kind in bits 0-7, flags 8-15, name id 16-31: 1 +
#: index in TAIL_NAMES, 0: in the blob; blob length 32-47, blob offset 48-63), value (step
#: or checkpoint step), start ns, end ns, seq (written last: a record is whole when its
#: seq is). A phase's start may leave value and end 0; a record without a value, value.
#: A blob is the seq (8 bytes) then JSON ``{"n": name, "a": attributes, "e": error}``
#: (the keys present that the record needs).
TAIL_RECORD = "<QqqqQ"
TAIL_BEGIN, TAIL_END, TAIL_STEP_START = 1, 2, 3
TAIL_F_STEP, TAIL_F_CKPT_STEP, TAIL_F_BLOCKING, TAIL_F_ASYNC, TAIL_F_BLOB = 1, 2, 4, 8, 16
#: Span names by id (append only: old tails keep their meaning).
TAIL_NAMES = (JOB_START, JOB_END, HEARTBEAT, IDENTITY, WINDOW, RUN_CONFIG, ACCELERATOR_INIT,
              TRAINING_PREP, PROGRAM_STARTUP, DATA_LOADING, STEP, CHECKPOINT_SAVE,
              CHECKPOINT_RESTORE, CUSTOM_BADPUT, ELASTIC_WAIT, ELASTIC_REINIT, ELASTIC_SLICES,
              COLLECTIVE_WAIT, LAUNCHER_EVENT)


def default_run_dir(job: str) -> str:
    """The default run directory of ``job``: ``goodput-runs/<job>`` with unsafe characters
    replaced by ``_`` (``GOODPUT_RUN_DIR`` overrides it on the training side)."""
    return os.path.join(DEFAULT_RUN_ROOT, re.sub(r"[^A-Za-z0-9._-]+", "_", job))

# --- accounting buckets (the processor's output vocabulary) -----------------

PRODUCTIVE = "productive"
#: Badput buckets in report order; ``custom:<type>`` buckets come after
#: ``training_slowdown`` and before ``other``. ``process_startup`` is the time from an
#: attempt's start (its OS process start) to the first phase its primary process recorded:
#: interpreter start, imports, and whatever ran before the first marker.
BADPUT_BUCKETS = (
    "process_startup",
    "accelerator_init",
    "training_prep",
    "program_startup",
    "data_loading",
    "checkpoint_save",
    "checkpoint_restore",
    "wasted_progress",
    "infrastructure_recovery",
    "training_slowdown",
    "other",
)
CUSTOM_PREFIX = "custom:"
#: Elastic badput buckets (schema 1.2), in report order after ``infrastructure_recovery``;
#: present in a job's result only when it has ELASTIC_WAIT or ELASTIC_REINIT spans.
ELASTIC_BUCKETS = ("elastic_slice_down", "elastic_scale_up", "elastic_reinitialization")


def elastic_wait_bucket(event_type: str | None) -> str:
    """Bucket of an ELASTIC_WAIT span: ``elastic_scale_up`` when its event type contains
    ``scale_up`` (any case), else ``elastic_slice_down`` (the rule of ml-goodput-measurement
    0.2.3's ``ElasticGoodputCalculator``)."""
    return ELASTIC_BUCKETS[1] if "scale_up" in (event_type or "").lower() else ELASTIC_BUCKETS[0]


def custom_bucket(badput_type: str) -> str:
    """Bucket name for a custom badput type, e.g. ``custom_bucket("eval") == "custom:eval"``."""
    return CUSTOM_PREFIX + badput_type
