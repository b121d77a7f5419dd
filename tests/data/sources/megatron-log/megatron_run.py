# ruff: noqa: UP032 - the format strings are copied verbatim from Megatron-LM
"""Regenerate ``real-0.previous.log``, ``real-0.log`` and ``real-truth-{0,1}.jsonl``: a
Megatron-LM stdout whose iteration and ``print_datetime`` lines are printed by Megatron's
own ``training_log`` and ``print_datetime`` (Megatron-LM main
d98e8a64ddf34856e74b24714e3bedb2f5a39553, the environment of
``tests/data/sources/megatron/venv.sh``), SIGKILLed after iteration 73 and restarted from
iteration 50, each line time-stamped by the driver as it arrives (what the container
runtime does for ``kubectl logs --timestamps``).

What is real: ``training_log`` (the iteration line, its ``interval-time`` timer arithmetic
and ``is_first_iteration`` handling), ``print_datetime``, Megatron's ``Timers``, its
argument defaults (``parse_args``), the microbatch calculator and ``parallel_state`` on a
one-process gloo group. What is not: the lines printed inside ``validate_args``,
``initialize_megatron``, ``pretrain`` (``time to initialize megatron``),
``save_checkpoint`` and ``load_checkpoint`` use their format strings copied from that
commit (as ``regenerate.py``), since those functions need CUDA and a real model; the
iterations themselves are sleeps (50 ms; the first 0.3 s), the save 0.5 s, the load 0.3 s.
CPU shims (besides ``../megatron/cpu_shims.py``'s ``typing.override`` and ``triton``
stub): ``torch.cuda.synchronize`` is a no-op and ``torch.cuda.current_device()`` is
``"cpu"`` (the timers and ``reduce_max_stat_across_model_parallel_group`` put their small
tensors there); no loss keys are passed to ``training_log`` (its reset makes them with
``device='cuda'``).

Run (about 60 s on a loaded 2-core VM): ``.venvs/megatron/bin/python
tests/data/sources/megatron-log/megatron_run.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ITER_S, FIRST_S, SAVE_S, LOAD_S = 0.05, 0.3, 0.5, 0.3
SAVE_AT, KILL_AFTER, TRAIN_ITERS = 50, 73, 100


def child(run: int, out: Path) -> None:
    program_start = time.time()
    truth = open(out / f"real-truth-{run}.jsonl", "a")

    def note(kind: str, n: int, t: float | None = None) -> None:
        t = time.time() if t is None else t
        truth.write(f'{{"kind": "{kind}", "n": {n}, "t": {int(t * 1e9)}}}\n')
        truth.flush()
        os.fsync(truth.fileno())

    note("process_start", -1, program_start)
    print("+ python pretrain_gpt.py --log-interval 10 --save-interval 50", flush=True)
    sys.path.insert(0, str(HERE.parent / "megatron"))
    import cpu_shims
    cpu_shims.install()
    import torch
    torch.cuda.synchronize = lambda *a, **k: None          # shim
    torch.cuda.current_device = lambda: "cpu"               # shim
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state as mpu
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
    from megatron.training import global_vars
    from megatron.training import training as T
    from megatron.training.arguments import parse_args
    sys.argv = ["pretrain_gpt.py"]
    args = parse_args(ignore_unknown_args=True)
    for k, v in dict(train_iters=TRAIN_ITERS, log_interval=10, micro_batch_size=4,
                     global_batch_size=256, data_parallel_size=8, world_size=8, num_layers=2,
                     hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                     seq_length=128, padded_vocab_size=1024, kv_channels=16,
                     consumed_train_samples=0, skipped_train_samples=0, timing_log_level=0,
                     timing_log_option="minmax", gtp_weight_remat_size=1).items():
        setattr(args, k, v)
    # megatron/training/arguments.py:567 (validate_args), copied
    print('using world size: {}, data-parallel size: {}, '
          'context-parallel size: {}, '
          'hierarchical context-parallel sizes: {}, '
          'tensor-model-parallel size: {}, '
          'pipeline-model-parallel size: {}'.format(8, 8, 1, None, 1, 1), flush=True)
    print("> initializing torch distributed ...", flush=True)   # initialize.py:286, copied
    mpu.initialize_model_parallel(1, 1)
    global_vars.set_args(args)
    init_num_microbatches_calculator(0, None, args.global_batch_size, args.micro_batch_size,
                                     args.data_parallel_size)
    global_vars._set_timers(args)
    global_vars._set_energy_monitor(args)
    timers = global_vars.get_timers()
    # training.py:1741, copied (the import of training.py is the legacy start)
    print('time to initialize megatron (seconds): {:.3f}'.format(
        time.time() - T._LEGACY_TRAIN_START_TIME), flush=True)
    T.print_datetime('after megatron is initialized')
    note("init_end", -1)
    it = 0
    if run == 1:
        note("load", SAVE_AT)
        # checkpointing.py:2078 and :3159, copied
        print(f' loading distributed checkpoint from /ckpt/gpt at iteration {SAVE_AT}',
              flush=True)
        time.sleep(LOAD_S)
        print(f'  successfully loaded checkpoint from /ckpt/gpt '
              f'[ t {1}/{1}, gtp_remat {1}/{1}, p {1}/{1} ] at iteration {SAVE_AT}', flush=True)
        note("loaded", SAVE_AT)
        it = SAVE_AT
    args.consumed_train_samples = it * 256
    T.print_datetime('after model, optimizer, and learning rate scheduler are built')
    T.print_datetime('after dataloaders are built')
    timers('interval-time', log_level=0).start(barrier=True)    # train()
    T.print_datetime('before the start of training step')
    note("train_start", it)
    total: dict = {}
    first = True
    while it < (KILL_AFTER if run == 0 else TRAIN_ITERS):
        it += 1
        time.sleep(FIRST_S if first else ITER_S)
        note("iter_end", it)
        args.consumed_train_samples += 256
        T.training_log({}, total, 1.5e-4, it, 1.0, False, False, 1.234, None, None, None,
                       is_first_iteration=first)
        first = False
        if it % SAVE_AT == 0:
            timers('interval-time').stop()                      # save_checkpoint_and_time
            note("save", it)
            # checkpointing.py:693 and :1085, copied
            print(f'[{datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")}] saving checkpoint '
                  f'at iteration {it:7d} to /ckpt/gpt in torch_dist format', flush=True)
            time.sleep(SAVE_S)
            print(f'  [{datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")}] successfully saved '
                  f'checkpoint from iteration {int(it):7d} to /ckpt/gpt '
                  f'[ t {1}/{1}, gtp_remat {1}/{1}, p {1}/{1} ]', flush=True)
            note("saved", it)
            timers('interval-time', log_level=0).start(barrier=True)
    if run == 0:
        note("kill_me", it)
        time.sleep(60)
    T.print_datetime('after training is done')
    note("exit", it)


def _pump(proc, path: Path) -> None:
    with open(path, "w") as f:
        for line in proc.stdout:
            ns = time.time_ns()
            stamp = datetime.fromtimestamp(ns // 10**9, timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%S")
            f.write(f"{stamp}.{ns % 10**9:09d}Z {line.rstrip()}\n")
            f.flush()


def drive(out: Path) -> None:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore", TZ="UTC")
    for run, name in ((0, "real-0.previous.log"), (1, "real-0.log")):
        (out / f"real-truth-{run}.jsonl").unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(run), "--out",
                                 str(out)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, env=env)
        pump = threading.Thread(target=_pump, args=(proc, out / name))
        pump.start()
        if run == 0:
            truth = out / "real-truth-0.jsonl"
            while proc.poll() is None and (not truth.exists()
                                           or '"kill_me"' not in truth.read_text()):
                time.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)
            with open(truth, "a") as f:
                f.write(f'{{"kind": "kill", "n": -1, "t": {time.time_ns()}}}\n')
        proc.wait()
        pump.join()
        time.sleep(1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", type=int)
    ap.add_argument("--out", default=str(HERE))
    a = ap.parse_args()
    if a.child is not None:
        child(a.child, Path(a.out))
    else:
        drive(Path(a.out))


if __name__ == "__main__":
    main()
