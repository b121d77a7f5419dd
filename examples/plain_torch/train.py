"""A plain PyTorch training loop without any goodput code, for ``opentelemetry-instrument``.

DataLoader, AdamW, a checkpoint every ``--ckpt-every`` steps written to a temporary name
and renamed into place (atomic), and on start the newest complete checkpoint is loaded,
so running the same command again after a kill resumes. Three checkpoint formats
(``--format``):

- ``torch``: ``torch.save({"model": ..., "optimizer": ..., "step": n}, path)`` /
  ``torch.load`` (one file ``ckpt-<8 digits>.pt``);
- ``safetensors``: ``safetensors.torch.save_model`` for the model and ``save_file`` for the
  flattened optimizer state, both with ``metadata={"step": str(n)}``, in a directory
  ``step-<8 digits>``; resumed with ``load_model`` / ``load_file``;
- ``accelerate``: ``Accelerator().save_state(dir)`` / ``load_state(dir)`` (model, optimizer
  and the rest), in ``step-<8 digits>``.

Under ``torchrun`` (``WORLD_SIZE`` > 1, ``--format torch``) it trains data-parallel
(gloo, ``DistributedDataParallel``, ``DistributedSampler``); rank 0 saves, every rank
loads. Each torchrun restart gets its own store prefix (keys of the previous restart stay
in torchrun's store; without it a restarted gloo group often fails to connect)::

    export OTEL_SERVICE_NAME=plain GOODPUT_RUN_DIR=runs/plain GOODPUT_FLUSH_INTERVAL_S=0.5
    opentelemetry-instrument python examples/plain_torch/train.py --ckpt-dir ckpt/plain
    # kill -9 it mid-training, run the same command again; then
    goodput report runs/plain

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 --no-python \\
        opentelemetry-instrument python examples/plain_torch/train.py --ckpt-dir ckpt/ddp

``tests/instrumentation/test_instr_torch_checkpoints.py`` kills it with SIGKILL and compares
the report with the truth. With ``--truth FILE`` every process appends what it did to ``FILE``, one
JSON object a line, with ``O_APPEND`` and one ``os.write`` a line (the format of
``examples/launchers/train_ddp.py``): ``start`` (the OS process start), ``begin``/``end``
of each ``step`` (from the end of the previous optimizer update, or for a process's first
step from its first batch fetch, to the end of its own update: the definition of a step
in ``docs/instrumentation/pytorch.md``), ``data_loading`` (each batch fetch),
``checkpoint_save`` and ``checkpoint_restore`` (the whole save or restore, rename and
``load_state_dict`` included), ``accelerator_init`` (the process group), and ``exit``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import sys
import time

FORMATS = ("torch", "safetensors", "accelerate")
CKPT_RE = {"torch": re.compile(r"^ckpt-(\d{8})\.pt$"),
           "safetensors": re.compile(r"^step-(\d{8})$"),
           "accelerate": re.compile(r"^step-(\d{8})$")}


def process_start() -> float:
    """When this OS process started, in seconds since the epoch (10 ms resolution; Linux)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return time.time()
    ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


class Truth:
    """Appends this process's observations to the truth file (a no-op without one)."""

    def __init__(self, path: str | None, rank: int, world: int):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None
        self.base = {"pid": os.getpid(), "rank": rank, "world": world,
                     "launch": os.environ.get("LAUNCH_TAG", ""),
                     "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}

    def emit(self, ev: str, t: float | None = None, **kw) -> None:
        if self.fd is not None:
            rec = {**self.base, "ev": ev, "t": time.time() if t is None else t, **kw}
            os.write(self.fd, (json.dumps(rec) + "\n").encode())

    def span(self, name: str, t0: float, t1: float, step: int | None = None) -> None:
        self.emit("begin", t=t0, name=name, step=step)
        self.emit("end", t=t1, name=name, step=step)


def latest_checkpoint(ckpt_dir: str, fmt: str) -> int:
    """Step of the newest complete checkpoint in ``ckpt_dir`` (0: none)."""
    steps = [int(m.group(1)) for f in os.listdir(ckpt_dir) if (m := CKPT_RE[fmt].match(f))]
    return max(steps, default=0)


def make_store(rank: int, world: int):
    """torchrun's rendezvous store, with a prefix per restart."""
    import torch.distributed as dist

    store = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"),
                          int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0
                          and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True",
                          timeout=datetime.timedelta(seconds=60))
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"restart{restart}/", store)


# --- the three checkpoint formats ----------------------------------------------------------


def save(fmt: str, ckpt_dir: str, n: int, model, opt, acc) -> None:
    """Write the checkpoint of step ``n`` under a temporary name, then rename it into place."""
    import torch

    if fmt == "torch":
        path = os.path.join(ckpt_dir, f"ckpt-{n:08d}.pt")
        tmp = f"{path}.tmp"
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": n}, tmp)
        os.replace(tmp, path)
        return
    final = os.path.join(ckpt_dir, f"step-{n:08d}")
    tmp = f"{final}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if fmt == "safetensors":
        from safetensors.torch import save_file, save_model

        os.makedirs(tmp)
        meta = {"step": str(n)}
        save_model(model, os.path.join(tmp, "model.safetensors"), metadata=meta)
        state = opt.state_dict()
        flat = {f"{i}.{k}": v for i, s in state["state"].items() for k, v in s.items()}
        save_file(flat, os.path.join(tmp, "optimizer.safetensors"),
                  metadata={**meta, "param_groups": json.dumps(state["param_groups"])})
    else:
        acc.save_state(tmp)
    os.replace(tmp, final)


def restore(fmt: str, ckpt_dir: str, n: int, model, opt, acc) -> None:
    """Load the checkpoint of step ``n`` into the model and optimizer."""
    import torch

    if fmt == "torch":
        state = torch.load(os.path.join(ckpt_dir, f"ckpt-{n:08d}.pt"), map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        assert state["step"] == n
        return
    path = os.path.join(ckpt_dir, f"step-{n:08d}")
    if fmt == "safetensors":
        from safetensors import safe_open
        from safetensors.torch import load_file, load_model

        load_model(model, os.path.join(path, "model.safetensors"))
        opt_path = os.path.join(path, "optimizer.safetensors")
        flat = load_file(opt_path)
        with safe_open(opt_path, framework="pt") as f:
            groups = json.loads(f.metadata()["param_groups"])
        state: dict[int, dict] = {}
        for key, value in flat.items():
            i, name = key.split(".", 1)
            state.setdefault(int(i), {})[name] = value
        opt.load_state_dict({"state": state, "param_groups": groups})
    else:
        acc.load_state(path)


# --- training -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--format", choices=FORMATS, default="torch")
    p.add_argument("--steps", type=int, default=300, help="train until this step number")
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--step-sleep", type=float, default=0.02,
                   help="seconds of extra work per step (stands in for a bigger model)")
    p.add_argument("--width", type=int, default=256, help="MLP width (its hidden layer: 4x)")
    p.add_argument("--truth", default=None, help="append this process's observations here")
    args = p.parse_args(argv)

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    truth = Truth(args.truth, rank, world)
    truth.emit("start", t=process_start(), t_run=time.time())

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    if world > 1:
        if args.format != "torch":
            p.error("several ranks: --format torch only")
        t0 = time.time()
        dist.init_process_group("gloo", store=make_store(rank, world), rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
        truth.span("accelerator_init", t0, time.time())

    torch.manual_seed(0)
    w = args.width
    model = torch.nn.Sequential(torch.nn.Linear(w, 4 * w), torch.nn.ReLU(),
                                torch.nn.Linear(4 * w, w))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(512, w), torch.randn(512, w))
    sampler = (torch.utils.data.distributed.DistributedSampler(data, world, rank, seed=0)
               if world > 1 else None)
    loader = torch.utils.data.DataLoader(data, batch_size=16, sampler=sampler,
                                         shuffle=sampler is None,
                                         generator=torch.Generator().manual_seed(0))
    acc = None
    if args.format == "accelerate":
        from accelerate import Accelerator

        acc = Accelerator(cpu=True)
        model, opt, loader = acc.prepare(model, opt, loader)
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    inner = model  # what is saved: the bare module (DDP's .module)
    os.makedirs(args.ckpt_dir, exist_ok=True)

    found = latest_checkpoint(args.ckpt_dir, args.format) if rank == 0 else 0
    if world > 1:  # rank 0 picks: every rank resumes from the same checkpoint
        t = torch.tensor([found])
        dist.broadcast(t, 0)
        found = int(t.item())
    start = found
    if start:
        truth.emit("begin", name="checkpoint_restore", step=start)
        restore(args.format, args.ckpt_dir, start, inner, opt, acc)
        truth.emit("end", name="checkpoint_restore", step=start)

    epoch = 0
    it = iter(loader)

    def fetch():
        nonlocal it, epoch
        t0 = time.time()
        try:
            batch = next(it)
        except StopIteration:  # a new epoch
            epoch += 1
            if sampler is not None:
                sampler.set_epoch(epoch)
            it = iter(loader)
            t0 = time.time()
            batch = next(it)
        truth.span("data_loading", t0, time.time())
        return batch, t0

    for n in range(start + 1, args.steps + 1):
        (x, y), t_fetch = fetch()
        if n == start + 1:  # a process's first step starts at its first fetch
            truth.emit("begin", t=t_fetch, name="step", step=n)
        time.sleep(args.step_sleep)
        loss = F.mse_loss(net(x), y)
        opt.zero_grad()
        if acc is not None:
            acc.backward(loss)
        else:
            loss.backward()
        opt.step()
        t_end = time.time()
        truth.emit("end", t=t_end, name="step", step=n)
        if n < args.steps:  # the next step starts where this update ended
            truth.emit("begin", t=t_end, name="step", step=n + 1)
        if n % args.ckpt_every == 0:
            if rank == 0:
                truth.emit("begin", name="checkpoint_save", step=n)
                save(args.format, args.ckpt_dir, n, inner, opt, acc)
                truth.emit("end", name="checkpoint_save", step=n)
            if world > 1:
                dist.barrier()
        if n % 50 == 0 and rank == 0:
            print(f"step {n} loss {loss.item():.4f}", flush=True)
    if world > 1:
        dist.destroy_process_group()
    truth.emit("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
