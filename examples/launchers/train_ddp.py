"""A tiny data-parallel (DDP, gloo, CPU) training job for real launchers, with goodput marks.

Run it under ``torchrun`` (rank and size from ``RANK``/``WORLD_SIZE``) or let it start its
own ranks with ``torch.multiprocessing.spawn`` (``--spawn N``: the ranks get no ``RANK``
variable; goodput learns the rank from ``torch.distributed`` once the group is up)::

    export GOODPUT_JOB_NAME=ddp GOODPUT_RUN_DIR=runs/ddp GOODPUT_FLUSH_INTERVAL_S=0.25
    torchrun --standalone --nproc-per-node 2 --max-restarts 1 \\
        examples/launchers/train_ddp.py --ckpt-dir ckpt/ddp --truth truth.jsonl
    python examples/launchers/train_ddp.py --spawn 2 --ckpt-dir ckpt/ddp2 --truth t2.jsonl
    goodput report runs/ddp

Each rank calls ``goodput.configure()`` first (job name, spool directory and flush interval
from the ``GOODPUT_*`` environment), marks ``accelerator_init`` (the process group),
``training_prep`` (model, DDP wrapper, optimizer), ``checkpoint_restore`` (when the
checkpoint directory has one: rank 0 picks the newest, every rank loads it),
``step(n)`` and, on rank 0, ``checkpoint_save`` every ``--ckpt-every`` steps (``torch.save``
to a temporary file, then ``os.replace``; the other ranks wait at a barrier). Run the same
command again after a kill and it resumes from the newest checkpoint, with any world size.

With ``--truth FILE`` every rank also appends its own observations to ``FILE``, one JSON
object a line, written with ``O_APPEND`` by a single ``os.write`` (so lines of several
processes never mix, and a line is on disk once written, whatever kills the process next):
``{"pid", "rank", "world", "launch", "restart", "ev", "t", ...}`` with ``ev``

- ``start``: ``t`` = when the OS process started (``/proc/self/stat``), ``t_run`` = now;
- ``begin`` / ``end`` with ``name`` (``accelerator_init``, ``training_prep``,
  ``checkpoint_restore``, ``checkpoint_save``, ``step``) and ``step``: ``time.time()`` just
  before entering and just after leaving the goodput mark;
- ``exit``: the rank's work is done (the interpreter's exit hooks come next).

``launch`` is ``$LAUNCH_TAG`` (set by whoever launched it) and ``restart`` torchrun's
``TORCHELASTIC_RESTART_COUNT``. ``--no-goodput`` runs the same job without goodput (to time
how fast it dies on a signal without it). ``--slow-rank R --slow-extra S --slow-from-step K``
make rank R sleep S seconds more in each step from step K (a host that turned slow);
``--collective-wait`` all-reduces the loss in each step (the ranks meet there) inside
``goodput.collective_wait()`` (truth name ``collective_wait``), so that the report can tell
which rank arrived last.

Every restart of torchrun gets its own store prefix (a ``PrefixStore`` keyed by
``TORCHELASTIC_RESTART_COUNT``): keys of the previous restart stay in torchrun's store, and
without it a restarted gloo group often fails to connect.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import sys
import time

CKPT_RE = re.compile(r"^ckpt-(\d{8})\.pt$")


class _NoGoodput:
    """Stand-in for the ``goodput`` module (``--no-goodput``): every mark does nothing."""

    def configure(self, *args, **kwargs):
        return None

    def __getattr__(self, name):
        return lambda *args, **kwargs: contextlib.nullcontext()


def process_start() -> float:
    """When this OS process started, in seconds since the epoch (10 ms resolution)."""
    with open("/proc/self/stat", encoding="ascii") as f:
        stat = f.read()
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
        if self.fd is None:
            return
        rec = {**self.base, "ev": ev, "t": time.time() if t is None else t, **kw}
        os.write(self.fd, (json.dumps(rec) + "\n").encode())

    @contextlib.contextmanager
    def marked(self, mark, name: str, step: int | None = None):
        """``with mark:`` with ``begin``/``end`` lines around it."""
        self.emit("begin", name=name, step=step)
        with mark:
            yield
        self.emit("end", name=name, step=step)


def latest_checkpoint(ckpt_dir: str) -> int:
    """Step of the newest complete checkpoint in ``ckpt_dir`` (0: none)."""
    steps = [int(m.group(1)) for f in os.listdir(ckpt_dir) if (m := CKPT_RE.match(f))]
    return max(steps, default=0)


def make_store(rank: int, world: int):
    """The rendezvous store, with a prefix per torchrun restart."""
    import torch.distributed as dist

    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ["MASTER_PORT"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun hosts it
    store = dist.TCPStore(addr, port, world, is_master=(rank == 0 and not agent),
                          timeout=datetime.timedelta(seconds=60))
    return dist.PrefixStore(f"restart{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/",
                            store)


def run(rank: int, world: int, args: argparse.Namespace) -> None:
    """One rank of the job (the target of ``torch.multiprocessing.spawn`` too)."""
    if args.no_goodput:
        goodput = _NoGoodput()
    else:
        import goodput
    goodput.configure()  # the attempt starts when this OS process started
    truth = Truth(args.truth, rank, world)
    truth.emit("start", t=process_start(), t_run=time.time())

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    with truth.marked(goodput.accelerator_init(), "accelerator_init"):
        dist.init_process_group("gloo", store=make_store(rank, world), rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
    with truth.marked(goodput.training_prep(), "training_prep"):
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        os.makedirs(args.ckpt_dir, exist_ok=True)
    found = torch.tensor([latest_checkpoint(args.ckpt_dir) if rank == 0 else 0])
    dist.broadcast(found, 0)  # rank 0 picks: every rank resumes from the same checkpoint
    start = int(found.item())
    if start:
        with truth.marked(goodput.checkpoint_restore(step=start), "checkpoint_restore", start):
            state = torch.load(os.path.join(args.ckpt_dir, f"ckpt-{start:08d}.pt"))
            model.module.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
    gen = torch.Generator().manual_seed(1000 + rank)
    slow = args.slow_rank == rank
    for n in range(start + 1, args.steps + 1):
        with truth.marked(goodput.step(n), "step", n):
            extra = args.slow_extra if slow and n >= args.slow_from_step else 0.0
            time.sleep(args.step_sleep + extra)
            x = torch.randn(16, 32, generator=gen)
            loss = model(x).pow(2).mean()
            if args.collective_wait:  # the ranks meet here: the mean loss, for logging
                with truth.marked(goodput.collective_wait(), "collective_wait", n):
                    dist.all_reduce(loss.detach().clone())
            opt.zero_grad()
            loss.backward()  # the gradient all-reduce: ranks meet here every step
            opt.step()
        if n % args.ckpt_every == 0:
            if rank == 0:
                with truth.marked(goodput.checkpoint_save(step=n), "checkpoint_save", n):
                    path = os.path.join(args.ckpt_dir, f"ckpt-{n:08d}.pt")
                    tmp = f"{path}.tmp-{os.getpid()}"
                    torch.save({"step": n, "model": model.module.state_dict(),
                                "opt": opt.state_dict()}, tmp)
                    os.replace(tmp, path)
            dist.barrier()
    dist.destroy_process_group()
    truth.emit("exit")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--truth", default=None, help="append this process's observations here")
    p.add_argument("--steps", type=int, default=40, help="train until this step number")
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.04, help="seconds of each step")
    p.add_argument("--spawn", type=int, default=0,
                   help="start this many ranks with torch.multiprocessing.spawn (no RANK set)")
    p.add_argument("--no-goodput", action="store_true", help="the same job without goodput")
    p.add_argument("--slow-rank", type=int, default=-1,
                   help="this rank sleeps --slow-extra more in each step from --slow-from-step")
    p.add_argument("--slow-extra", type=float, default=0.0)
    p.add_argument("--slow-from-step", type=int, default=1)
    p.add_argument("--collective-wait", action="store_true",
                   help="all-reduce the loss in each step, marked goodput.collective_wait()")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.spawn:
        import socket

        import torch.multiprocessing as mp

        with socket.socket() as s:  # a free port for rank 0's store
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        mp.spawn(run, args=(args.spawn, args), nprocs=args.spawn)
        return 0
    run(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
