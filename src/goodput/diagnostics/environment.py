"""What an ML run runs on, read without touching any framework.

Everything here comes from environment variables, ``importlib.metadata`` and the
standard library, so it is safe before the user's own distributed initialisation
(``jax.distributed.initialize``, ``torch.distributed.init_process_group``). The
devices themselves (:func:`devices`) are asked only of a framework that is already
imported *and* initialised, or of NVML (not a framework).

Attribute names follow the OpenTelemetry semantic conventions where they exist
(``k8s.pod.name``, ``process.runtime.version``, ...) and use ``ml.*`` otherwise;
``docs/diagnostics.md`` lists them all.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from importlib import metadata

_log = logging.getLogger(__name__)

#: Distributions whose versions are recorded (``ml.software.<name>``), when installed.
PACKAGES = (
    "jax",
    "jaxlib",
    "libtpu",
    "libtpu-nightly",
    "flax",
    "optax",
    "orbax-checkpoint",
    "torch",
    "torch-xla",
    "lightning",
    "pytorch-lightning",
    "transformers",
    "accelerate",
    "deepspeed",
    "megatron-core",
    "tensorflow",
    "keras",
)

#: Environment variables copied as they are (truncated to 256 bytes): name -> attribute.
XLA_VARIABLES = {
    "XLA_FLAGS": "ml.xla_flags",
    "LIBTPU_INIT_ARGS": "ml.libtpu_init_args",
}

#: TPU slice facts set by GKE / Cloud TPU VMs: variable -> attribute (ints where numeric).
TPU_VARIABLES = {
    "TPU_ACCELERATOR_TYPE": "ml.tpu.accelerator_type",  # e.g. "v5p-128"
    "TPU_TOPOLOGY": "ml.tpu.topology",  # e.g. "4x4x4"
    "TPU_WORKER_ID": "ml.tpu.worker_id",
    "MEGASCALE_NUM_SLICES": "ml.slice.count",
    "MEGASCALE_SLICE_ID": "ml.slice.id",
}

#: Kubernetes: variable -> attribute. ``k8s.pod.name`` falls back to ``HOSTNAME``.
K8S_VARIABLES = {
    "POD_NAME": "k8s.pod.name",
    "POD_NAMESPACE": "k8s.namespace.name",
    "NODE_NAME": "k8s.node.name",
    "CONTAINER_NAME": "k8s.container.name",
    "JOB_NAME": "k8s.job.name",
    # Indexed Jobs (Kubernetes sets it) and JobSet (its labels, usually passed as env)
    "JOB_COMPLETION_INDEX": "ml.k8s.job.completion_index",
    "JOBSET_NAME": "ml.k8s.jobset.name",
    "REPLICATED_JOB_NAME": "ml.k8s.jobset.replicated_job.name",
    "JOB_INDEX": "ml.k8s.jobset.job_index",
    "JOB_GLOBAL_INDEX": "ml.k8s.jobset.job_global_index",
    # LeaderWorkerSet (set by LWS itself)
    "LWS_LEADER_ADDRESS": "ml.k8s.lws.leader_address",
    "LWS_GROUP_SIZE": "ml.k8s.lws.group_size",
    "LWS_WORKER_INDEX": "ml.k8s.lws.worker_index",
}

#: Slurm: variable -> attribute (ints where numeric).
SLURM_VARIABLES = {
    "SLURM_JOB_ID": "ml.slurm.job.id",
    "SLURM_JOB_NAME": "ml.slurm.job.name",
    "SLURM_ARRAY_JOB_ID": "ml.slurm.array.job_id",
    "SLURM_ARRAY_TASK_ID": "ml.slurm.array.task_id",
    "SLURM_CLUSTER_NAME": "ml.slurm.cluster",
    "SLURM_JOB_PARTITION": "ml.slurm.partition",
    "SLURM_NNODES": "ml.slurm.nnodes",
    "SLURM_NTASKS": "ml.slurm.ntasks",
    "SLURM_NODEID": "ml.slurm.node.id",
    "SLURM_PROCID": "ml.slurm.proc.id",
    "SLURM_LOCALID": "ml.slurm.local.id",
    "SLURM_RESTART_COUNT": "ml.slurm.restart_count",
}

#: Variables written as ints when they parse as one (others are strings).
_NUMERIC = frozenset({
    "JOB_COMPLETION_INDEX", "JOB_INDEX", "JOB_GLOBAL_INDEX", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX",
    "SLURM_ARRAY_TASK_ID", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_NODEID", "SLURM_PROCID",
    "SLURM_LOCALID", "SLURM_RESTART_COUNT",
})

#: Where a pod finds its namespace (read only when Kubernetes is detected).
K8S_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

#: Longest attribute value written, in UTF-8 bytes (Cloud Trace keeps 256).
MAX_VALUE_BYTES = 256

#: Variables naming this process's rank on its host; a non-zero one means another
#: process of the host reports the host's system metrics.
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")


def truncate(value: str, limit: int = MAX_VALUE_BYTES) -> str:
    """``value`` cut to at most ``limit`` UTF-8 bytes, on a character boundary."""
    raw = value.encode("utf-8")
    if len(raw) <= limit:
        return value
    return raw[:limit].decode("utf-8", "ignore")


def _int_or_str(raw: str):
    try:
        return int(raw)
    except ValueError:
        return truncate(raw)


def software_versions(packages=PACKAGES) -> dict:
    """``{"ml.software.<name>": version}`` of the installed ``packages``.

    Read from the distributions' metadata: nothing is imported. ``<name>`` is the
    distribution name with ``-`` replaced by ``_`` (``ml.software.orbax_checkpoint``).
    """
    out = {}
    for name in packages:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        except Exception as exc:  # a broken installation must not stop the run
            _log.debug("goodput: cannot read the version of %s: %s", name, exc)
            continue
        out["ml.software." + name.replace("-", "_")] = version
    return out


def runtime() -> dict:
    """The Python runtime (``process.runtime.*`` semantic conventions)."""
    return {
        "process.runtime.name": sys.implementation.name,
        "process.runtime.version": platform.python_version(),
    }


def xla() -> dict:
    """``XLA_FLAGS`` / ``LIBTPU_INIT_ARGS`` and TPU slice variables, where set."""
    env = os.environ
    out = {attr: truncate(env[var]) for var, attr in XLA_VARIABLES.items() if env.get(var)}
    for var, attr in TPU_VARIABLES.items():
        if env.get(var):
            out[attr] = _int_or_str(env[var])
    return out


def _k8s_namespace() -> str | None:
    try:
        with open(K8S_NAMESPACE_FILE, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def orchestrator() -> dict:
    """The orchestrator, from environment variables.

    ``ml.orchestrator`` is ``"slurm"`` (``SLURM_JOB_ID`` set), ``"kubernetes"``
    (``KUBERNETES_SERVICE_HOST`` set) or ``"none"``; plus the variables of
    :data:`SLURM_VARIABLES` or :data:`K8S_VARIABLES` that are set. On Kubernetes the
    pod name falls back to ``HOSTNAME`` and the namespace to the service account's
    namespace file.
    """
    env = os.environ
    if env.get("SLURM_JOB_ID"):
        out = {"ml.orchestrator": "slurm"}
        for var, attr in SLURM_VARIABLES.items():
            if env.get(var):
                out[attr] = _int_or_str(env[var]) if var in _NUMERIC else truncate(env[var])
        return out
    if env.get("KUBERNETES_SERVICE_HOST"):
        out = {"ml.orchestrator": "kubernetes"}
        for var, attr in K8S_VARIABLES.items():
            if env.get(var):
                out[attr] = _int_or_str(env[var]) if var in _NUMERIC else truncate(env[var])
        if "k8s.pod.name" not in out and env.get("HOSTNAME"):
            out["k8s.pod.name"] = truncate(env["HOSTNAME"])
        if "k8s.namespace.name" not in out:
            ns = _k8s_namespace()
            if ns:
                out["k8s.namespace.name"] = truncate(ns)
        return out
    return {"ml.orchestrator": "none"}


def collect() -> dict:
    """All automatically collected software and system configs (see the helpers above).

    Cheap (environment variables and package metadata) and framework-free.
    """
    return {**runtime(), **software_versions(), **xla(), **orchestrator()}


def is_local_leader() -> bool:
    """False when a local-rank variable (:data:`LOCAL_RANK_VARIABLES`) says this process
    is not the first of its host; True otherwise (also when none is set)."""
    for var in LOCAL_RANK_VARIABLES:
        raw = os.environ.get(var, "").strip()
        if raw:
            try:
                return int(raw) == 0
            except ValueError:
                continue
    return True


# --- devices (lazily, never initialising a framework) ----------------------------------

def _jax_devices() -> dict | None:
    if "jax" not in sys.modules:
        return None
    bridge = sys.modules.get("jax._src.xla_bridge")
    check = getattr(bridge, "backends_are_initialized", None)
    if check is None or not check():
        return None  # not initialised: asking now could break jax.distributed start-up
    import jax

    devices = jax.devices()
    out = {
        "ml.framework": "jax",
        "ml.device.count": len(devices),
        "ml.device.local_count": jax.local_device_count(),
    }
    if devices:
        out["ml.device.kind"] = str(getattr(devices[0], "device_kind", "")) or devices[0].platform
        out["ml.device.platform"] = str(devices[0].platform)
    return out


def _torch_devices() -> dict | None:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    n = cuda.device_count()
    out = {"ml.framework": "torch", "ml.device.local_count": n, "ml.device.platform": "gpu"}
    if n:
        out["ml.device.kind"] = str(cuda.get_device_name(0))
    return out


def _nvml_devices() -> dict | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no library, no driver: no NVIDIA GPU to describe
        return None
    try:
        n = pynvml.nvmlDeviceGetCount()
        out = {"ml.device.local_count": n, "ml.device.platform": "gpu"}
        if n:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
            out["ml.device.kind"] = name.decode() if isinstance(name, bytes) else str(name)
        return out if n else None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def devices() -> dict:
    """Device kind and count, from whatever is safe to ask right now.

    JAX only if it is imported and its backends are initialised (then
    ``ml.device.count`` is the job's global count); PyTorch only if CUDA is
    initialised; else NVML (local NVIDIA GPUs). Returns ``{}`` when nothing is known.
    Each source's failure is logged at debug level and the next one tried; never raises.
    """
    for source in (_jax_devices, _torch_devices, _nvml_devices):
        try:
            out = source()
        except Exception as exc:
            _log.debug("goodput: %s failed: %s", source.__name__, exc)
            continue
        if out:
            out.setdefault("ml.device.source", source.__name__.strip("_").split("_")[0])
            return out
    return {}
