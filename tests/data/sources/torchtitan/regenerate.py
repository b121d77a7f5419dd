"""Run torchtitan 0.3.0's own trainer on CPU, SIGKILL it mid-run, let torchrun restart it
from its checkpoint, and keep its structured logs (the test data of the ``torchtitan``
source) beside the driver's own truth.

Usage (in the tool's environment, see ``venv.sh``)::

    .venvs/torchtitan/bin/python tests/data/sources/torchtitan/regenerate.py \
        --workdir /tmp/tt-run --restart torchrun --out tests/data/sources/torchtitan

(60 s for the committed data on the 2-core machine; 90-140 s when it is loaded.)

What runs: ``torchrun --standalone --nproc-per-node 2`` of this file in ``--worker`` mode,
which applies the CPU shims below and calls torchtitan's own entry point
``torchtitan.train.main()`` (its ConfigManager, Trainer, CheckpointManager, structured
logger; nothing of its training loop is replaced). The driver watches rank 0's structured
log and SIGKILLs that worker once it begins step ``KILL_AT_STEP`` (19). With ``--restart
torchrun`` (``--max-restarts 1``: how the committed data was made) the torchrun agent sees
the failure, stops rank 1 and starts both workers again (``TORCHELASTIC_RESTART_COUNT=1``);
with ``--restart hand`` (the default, ``--max-restarts 0``) torchrun stops rank 1 and exits,
and the driver launches it again at once. The new workers load the last checkpoint (step
16: one every ``CKPT_EVERY`` = 8 steps) and train to ``STEPS`` (24), with an evaluation (2
batches) at step 1 and every ``EVAL_EVERY`` = 12 steps.

The CPU shims (torchtitan 0.3.0 has no CPU path; torch 2.13.0+cpu, gloo):

1. device type: ``torch._utils._get_available_device_type`` returns ``"cpu"`` before
   torchtitan is imported, so ``torchtitan.tools.utils.device_type`` is ``cpu`` and its
   device module ``torch.cpu`` (and gloo is the process-group backend).
2. GPU memory calls: ``torch.cpu`` gains no-op ``reset_peak_memory_stats``,
   ``empty_cache``, ``memory_stats``, ``get_device_name`` ... (``_CPU_MEMORY_SHIMS``)
   and the metrics' device-memory monitor reports zeros.
3. ``torch.distributed.set_timeout`` (absent in torch 2.13): a no-op;
   ``torch.distributed.barrier(device_ids=...)`` drops ``device_ids`` (gloo has none).
   FSDP2 (``parallelism.spmd_backend = "partial_dtensor"``: the default ``spmd_types``
   backend fails on CPU with plain-tensor parameters) reduces gradients with
   ``ReduceOp.AVG``/``PREMUL_SUM``, which gloo lacks: ``_get_gradient_divide_factors`` is
   called with ``force_sum_reduction_for_comms=True`` (SUM, then a division: FSDP2's own
   path for MTIA). Parameters in float32 (``training.mixed_precision_param``).
4. FlexAttention: ``torch.compile`` of ``flex_attention`` needs a GPU (triton), and eager
   ``flex_attention`` has no backward on CPU. The block mask (eager ``create_block_mask``)
   is made dense with ``create_mask`` and attended with SDPA
   (``F.scaled_dot_product_attention``). torchtitan 0.3.0 refuses its own ``sdpa`` backend
   for language models, so the attention module stays FlexAttention; only its kernel call
   (``FlexAttention._compiled_flex_attn``) is replaced.
5. A tiny debug model and data: the ``llama3`` ``debugmodel`` flavour cut to 2 of its 6
   layers (dim 256, vocab 2048) with ``seq_len`` 64, batch 2; a byte-level BPE tokenizer
   trained here on generated text (``tests/assets/tokenizer`` is not in the wheel) and a
   small ``c4_test`` style JSON-lines data set (``tests/assets/c4_test/data.json`` is not in
   the wheel either).

The driver's truth (``truth.json``, each clock read ``fsync``'d as it happens): every
worker writes ``truth/<pid>.jsonl``: its process start (the worker's first statement), when
torchtitan's structured logger began, each real checkpoint save (start, end, step: timed
around ``CheckpointManager._save``) and each load (timed around ``_load``, with the step
it restored). The driver writes the kill time (``kill.json``) and sums them up.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The shim run's own settings (the committed test data used these).
STEPS, CKPT_EVERY, KILL_AT_STEP, EVAL_EVERY, WORLD = 24, 8, 19, 12, 2


def _truth_line(rec: dict) -> None:
    """Append one truth record to this process's fsync'd truth file."""
    d = os.environ.get("TT_TRUTH_DIR")
    if not d:
        return
    restart = os.environ.get("TT_ATTEMPT") or os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)
    rec = dict(rec, pid=os.getpid(), rank=int(os.environ.get("RANK", 0)), restart=int(restart))
    fd = os.open(os.path.join(d, f"{os.getpid()}.jsonl"),
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


# --- the worker: CPU shims, then torchtitan's own main() ----------------------------------

def cpu_tiny():
    """torchtitan config function (``--module regenerate --config cpu_tiny``): the llama3
    debug model, shrunk for a 2-core CPU; paths from ``TT_ASSETS``."""
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    assets = os.environ["TT_ASSETS"]
    c = llama3_debugmodel()
    c.hf_assets_path = os.path.join(assets, "tokenizer")
    c.dataloader.dataset_path = os.path.join(assets, "c4_test")
    del c.model_spec.model.layers[2:]  # 2 of the 6 transformer blocks
    c.training.seq_len = 64
    c.training.local_batch_size = 2
    c.training.steps = int(os.environ.get("TT_STEPS", STEPS))
    # FSDP2 over gloo; the default spmd_types backend fails on CPU (plain tensor params)
    c.parallelism.spmd_backend = "partial_dtensor"
    c.training.mixed_precision_param = "float32"
    c.checkpoint.enable = True
    c.checkpoint.interval = int(os.environ.get("TT_CKPT_EVERY", CKPT_EVERY))
    c.checkpoint.last_save_model_only = False
    c.validator.enable = True
    c.validator.freq = int(os.environ.get("TT_EVAL_EVERY", EVAL_EVERY))
    c.validator.steps = 2
    c.validator.dataloader.dataset = "c4_test"
    c.validator.dataloader.dataset_path = c.dataloader.dataset_path
    c.debug.enable_structured_logging = True
    c.metrics.log_freq = 1
    return c


_CPU_MEMORY_SHIMS = ("reset_peak_memory_stats", "empty_cache", "reset_accumulated_memory_stats")


def _apply_cpu_shims() -> None:
    """The shims of the module docstring, applied before torchtitan is imported."""
    import torch
    import torch._utils
    import torch.distributed as dist

    torch._utils._get_available_device_type = lambda: "cpu"
    for name in _CPU_MEMORY_SHIMS:
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda *a, **k: None)
    if not hasattr(torch.cpu, "memory_stats"):
        torch.cpu.memory_stats = lambda *a, **k: {}
    if not hasattr(torch.cpu, "get_device_name"):
        torch.cpu.get_device_name = lambda *a, **k: "cpu"
    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = lambda *a, **k: None
    barrier = dist.barrier

    def _barrier(*a, **k):
        k.pop("device_ids", None)
        return barrier(*a, **k)

    dist.barrier = _barrier

    import torchtitan.models.common.attention as attn
    from torch.nn.attention.flex_attention import create_block_mask, create_mask

    def _sdpa_flex(q, k, v, *, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_aux=None, kernel_options=None):
        # FlexAttention's block mask as a dense boolean mask, attended with SDPA
        # (eager flex_attention has no backward on CPU).
        mask = None
        if block_mask is not None:
            mask = create_mask(block_mask.mask_mod, q.shape[0], 1, q.shape[2], k.shape[2],
                               device=q.device)
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        return out, None

    attn.FlexAttention._compiled_flex_attn = staticmethod(_sdpa_flex)
    attn._compiled_create_block_mask = create_block_mask
    # FSDP2's gradient division: gloo has no PREMUL_SUM/AVG: SUM and divide after (the
    # path FSDP2 takes for MTIA)
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as fsdp_coll

    factors = fsdp_coll._get_gradient_divide_factors

    def _divide_factors(*a, **k):
        if len(a) > 5:  # (rs_group, ar_group, dtype, device_type, factor, force_sum)
            a = a[:5] + (True,) + a[6:]
        else:
            k["force_sum_reduction_for_comms"] = True
        return factors(*a, **k)

    fsdp_coll._get_gradient_divide_factors = _divide_factors
    _shim_memory_monitor()
    _time_checkpoints()


def _shim_memory_monitor() -> None:
    """The metrics' device-memory monitor reads CUDA memory: report zeros on CPU."""
    from torchtitan.components import metrics

    mon = getattr(metrics, "DeviceMemoryMonitor", None)
    if mon is None:
        return

    def _init(self, device: str = "cpu"):
        self.device = device
        self.device_name = "cpu"
        self.device_capacity = 1
        self.device_capacity_gib = 1.0

    mon.__init__ = _init
    mon.reset_peak_stats = lambda self: None
    mon.get_peak_stats = lambda self: metrics.DeviceMemStats(0.0, 0.0, 0.0, 0.0, 0, 0)


def _time_checkpoints() -> None:
    """Truth: clock reads around CheckpointManager._save / _load (fsync'd)."""
    from torchtitan.components.checkpointer.dcp import CheckpointManager

    save, load = CheckpointManager._save, CheckpointManager._load

    def _save(self, curr_step, last_step=False):
        t0 = time.time()
        saved = save(self, curr_step, last_step)
        if saved:
            _truth_line({"ev": "save", "start": t0, "end": time.time(), "step": curr_step})
        return saved

    def _load(self, step=-1):
        t0 = time.time()
        loaded = load(self, step)
        _truth_line({"ev": "load", "start": t0, "end": time.time(), "loaded": bool(loaded),
                     "step": self._find_load_step() if loaded else 0})
        return loaded

    CheckpointManager._save, CheckpointManager._load = _save, _load


def worker() -> None:
    """One torchrun worker: shims, then ``torchtitan.train.main()``."""
    _truth_line({"ev": "proc_start", "t": time.time()})
    _apply_cpu_shims()
    from torchtitan.observability import structured_logger as sl

    init = sl.init_structured_logger

    def _init(*a, **k):
        init(*a, **k)
        _truth_line({"ev": "logger_started", "t": time.time()})

    sl.init_structured_logger = _init
    import torchtitan.train as tt_train

    tt_train.sl.init_structured_logger = _init
    sys.argv = [sys.argv[0], "--module", "regenerate", "--config", "cpu_tiny",
                "--dump_folder", os.environ["TT_DUMP"]]
    tt_train.main()


# --- the assets torchtitan's wheel lacks --------------------------------------------------

_WORDS = ("the model trains on a small corpus of words so that a tiny tokenizer and a "
          "tiny data set stand in for c4 while every phase of the trainer runs for real "
          "checkpoint step loss gradient optimizer batch token sequence rank process").split()


def make_assets(root: Path, n_docs: int = 400) -> Path:
    """Write ``root/tokenizer`` (tokenizer.json + tokenizer_config.json: byte-level BPE,
    vocab 2048 with ``<|begin_of_text|>``/``<|end_of_text|>``) and ``root/c4_test/
    data.json`` (``n_docs`` JSON lines ``{"text": ...}``, deterministic). Returns root."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(37)
    docs = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(40, 120)))
            for _ in range(n_docs)]
    (root / "c4_test").mkdir(parents=True, exist_ok=True)
    with open(root / "c4_test" / "data.json", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok.train_from_iterator(docs, trainers.BpeTrainer(
        vocab_size=2048, special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (root / "tokenizer").mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer" / "tokenizer.json"))
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": special[0], "eos_token": special[1], "add_bos_token": True,
         "add_eos_token": True}))
    return root


# --- the driver ---------------------------------------------------------------------------

def _records(path: Path):
    try:
        with open(path) as f:
            for line in f:
                try:
                    yield json.loads(line)
                except ValueError:
                    return
    except OSError:
        return


def _fsync_json(path: Path, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _watch_and_kill(dump: Path, kill_at_step: int, proc, deadline: float,
                    workdir: Path) -> dict:
    """SIGKILL rank 0's worker once its structured log shows step ``kill_at_step`` begin;
    returns (and fsyncs to ``kill.json``) the kill's time, pid and step."""
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"torchrun ended before step {kill_at_step}; see "
                               f"{workdir / 'torchrun.log'}")
        if time.monotonic() > deadline:
            raise RuntimeError("timed out before the kill point")
        for path in sorted((dump / "structured_logs").glob("*global_rank_0.*.jsonl")):
            for r in _records(path):
                if r.get("log_type_name") == "step_start" and \
                        int(r.get("step") or 0) >= kill_at_step:
                    t = time.time()
                    os.kill(int(r["pid"]), signal.SIGKILL)
                    kill = {"time": t, "pid": int(r["pid"]), "step": int(r["step"])}
                    _fsync_json(workdir / "kill.json", kill)
                    return kill
        time.sleep(0.02)


def run(workdir: Path, *, steps: int = STEPS, ckpt_every: int = CKPT_EVERY,
        kill_at_step: int | None = KILL_AT_STEP, eval_every: int = EVAL_EVERY,
        world: int = WORLD, restart: str = "hand", timeout_s: float = 900.0) -> dict:
    """Run the scenario in ``workdir`` (created); returns the truth (also written to
    ``workdir/truth.json``). ``kill_at_step`` None: no kill.

    ``restart``: ``"torchrun"``: one ``torchrun --max-restarts=1`` whose agent restarts the
    workers after the kill (how the committed data was made; under load the restarted
    workers' gloo rendezvous on the agent's re-created TCPStore sometimes hangs or is
    refused: torch 2.13's elastic agent, not torchtitan); ``"hand"``: ``--max-restarts=0``,
    and the driver launches torchrun again once the first one has ended (robust: a fresh
    rendezvous; the LIVE test uses it).

    Raises:
        RuntimeError: torchrun failed, or the kill point was never reached.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    assets = make_assets(workdir / "assets")
    dump, truth_dir = workdir / "dump", workdir / "truth"
    truth_dir.mkdir(exist_ok=True)
    env = dict(os.environ, TT_ASSETS=str(assets), TT_DUMP=str(dump),
               TT_TRUTH_DIR=str(truth_dir), TT_STEPS=str(steps),
               TT_CKPT_EVERY=str(ckpt_every), TT_EVAL_EVERY=str(eval_every),
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", TORCHELASTIC_ERROR_FILE=str(workdir / "error.json"))
    restarts = 1 if restart == "torchrun" else 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={world}", f"--max-restarts={restarts}", "--monitor-interval=0.1",
           str(Path(__file__).resolve()), "--worker"]
    launch = time.time()
    deadline = time.monotonic() + timeout_s
    kill: dict | None = None
    with open(workdir / "torchrun.log", "wb") as log:
        for attempt in (0, 1):
            env["TT_ATTEMPT"] = str(attempt) if restart == "hand" else ""
            # its own process group: a failed run is stopped whole (agent and workers)
            proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                if attempt == 0 and kill_at_step is not None:
                    kill = _watch_and_kill(dump, kill_at_step, proc, deadline, workdir)
                rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            if kill is None or restart == "torchrun" or attempt == 1:
                break
    exit_time = time.time()
    if rc != 0:
        raise RuntimeError(f"torchrun exited {rc}; see {workdir / 'torchrun.log'}:\n"
                           + (workdir / "torchrun.log").read_text(errors="replace")[-3000:])
    truth = _truth(truth_dir, kill, launch, exit_time, steps, workdir)
    truth["restart"] = restart
    _fsync_json(workdir / "truth.json", truth)
    return truth


def _truth(truth_dir: Path, kill: dict | None, launch: float, exit_time: float, steps: int,
           workdir: Path) -> dict:
    """The figures to compare a report with, from the workers' and driver's clock reads."""
    recs = [r for p in sorted(truth_dir.glob("*.jsonl")) for r in _records(p)]
    rank0 = [r for r in recs if r["rank"] == 0]
    saves = [r for r in rank0 if r["ev"] == "save"]
    loads = [r for r in rank0 if r["ev"] == "load" and r["loaded"]]
    out = {"launch_time": launch, "exit_time": exit_time, "final_step": steps,
           "attempts": 1 + (kill is not None), "saves": saves, "loads": loads,
           "records": recs, "kill": kill, "workdir": str(workdir),
           "checkpoint_save_s": sum(s["end"] - s["start"] for s in saves),
           "checkpoint_restore_s": sum(r["end"] - r["start"] for r in loads)}
    if kill is not None:
        before = [s for s in saves if s["restart"] == 0 and s["end"] <= kill["time"]]
        last = max(before, key=lambda s: s["end"])
        restarted = [r for r in recs if r["restart"] == 1]
        proc_start = min(r["t"] for r in restarted if r["ev"] == "proc_start")
        logger_start = min(r["t"] for r in restarted if r["ev"] == "logger_started")
        out.update({
            "resume_step": last["step"],
            "kept_steps": steps,
            "wasted_progress_s": kill["time"] - last["end"],
            # kill -> the restarted workers' first OS process start
            "infrastructure_recovery_s": proc_start - kill["time"],
            # what torchtitan's logs can show: kill -> the restarted workers' structured
            # logger (their imports before it are invisible in the logs)
            "recovery_to_logger_s": logger_start - kill["time"],
        })
    return out


def keep(workdir: Path, out: Path) -> list[Path]:
    """Copy the run's structured logs (gzipped) and its truth into ``out``."""
    kept = []
    for old in out.glob("*.jsonl.gz"):
        old.unlink()
    for path in sorted((workdir / "dump" / "structured_logs").glob("*.jsonl")):
        dst = out / (path.name + ".gz")
        with open(path, "rb") as src, gzip.GzipFile(dst, "wb", mtime=0) as gz:
            shutil.copyfileobj(src, gz)
        kept.append(dst)
    truth = json.loads((workdir / "truth.json").read_text())
    truth.pop("records", None)
    truth["workdir"] = "(regenerate.py --workdir)"
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return kept


def main() -> None:
    if "--worker" in sys.argv:
        worker()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=None, help="copy the logs and truth here")
    ap.add_argument("--no-kill", action="store_true")
    ap.add_argument("--restart", choices=("hand", "torchrun"), default="hand",
                    help="who restarts the killed job: the driver (a second torchrun) or "
                    "torchrun's agent (--max-restarts=1; the committed data)")
    args = ap.parse_args()
    t0 = time.time()
    truth = run(args.workdir, kill_at_step=None if args.no_kill else KILL_AT_STEP,
                restart=args.restart)
    print(json.dumps({k: v for k, v in truth.items() if k != "records"}, indent=1))
    print(f"run took {time.time() - t0:.1f} s")
    if args.out:
        for p in keep(args.workdir, args.out):
            print(p, p.stat().st_size)


if __name__ == "__main__":
    main()
