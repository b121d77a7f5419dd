"""Train a small MLP on scikit-learn's digits data set, with goodput instrumentation.

A real (if tiny) PyTorch CPU training job that records every phase of its life
as goodput spans: framework and device start-up, building the data pipeline and
model, restoring a checkpoint, a warm-up step, data loading, training steps,
checkpoint saves and evaluation. The data set ships with scikit-learn, so
nothing is downloaded.

Run it::

    python examples/pytorch_digits/train.py --run-dir runs/digits --ckpt-dir ckpt/digits
    goodput report runs/digits

Run it again with the same two directories (after killing it, say) and it
resumes from its latest checkpoint as the next attempt of the same job; the
report then accounts both attempts. ``examples/crash_restart.py`` does exactly
that with a real SIGKILL.

The same training run can be recorded three ways (``--marks``):

- ``manual`` (default): the phase API marks every phase (``with goodput.step(n):`` ...).
- ``auto``: no phase markers at all; ``goodput.instrument()`` records steps
  (optimizer hooks), data loading (DataLoader), checkpoint save and restore
  (``torch.save``/``torch.load`` of the training state, or ``torch.distributed.checkpoint``)
  and evaluation (``model.eval()`` ... ``model.train()``)::

      python examples/pytorch_digits/train.py --marks auto --run-dir runs/digits-auto \
          --ckpt-dir ckpt/digits-auto
      goodput report runs/digits-auto

- ``none``: the script does not even import goodput; run it under
  ``opentelemetry-instrument`` (settings from the environment)::

      GOODPUT_RUN_DIR=runs/digits-otel GOODPUT_JOB_NAME=digits-otel \
          opentelemetry-instrument python examples/pytorch_digits/train.py --marks none \
          --ckpt-dir ckpt/digits-otel
      goodput report runs/digits-otel

``--ckpt-format dcp`` saves with ``torch.distributed.checkpoint`` (one directory
per checkpoint, ``step-<8 digits>``) in every mode, so ``--marks manual
--ckpt-format dcp`` and ``--marks auto`` are the same training run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

CKPT_RE = re.compile(r"^ckpt-(\d{8})\.pt$")
DCP_RE = re.compile(r"^step-(\d{8})$")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", default="runs/digits", help="goodput spool directory")
    p.add_argument("--ckpt-dir", default="checkpoints/digits", help="checkpoint directory")
    p.add_argument("--job-name", default="digits", help="goodput job name")
    p.add_argument("--steps", type=int, default=300, help="train until this step number")
    p.add_argument("--ckpt-every", type=int, default=25, help="save a checkpoint every N steps")
    p.add_argument("--eval-every", type=int, default=100, help="evaluate every N steps")
    p.add_argument(
        "--step-sleep",
        type=float,
        default=0.01,
        help="extra seconds per step, so that the tiny steps are long enough to measure",
    )
    p.add_argument("--log-every", type=int, default=10, help="print the loss every N steps")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep-checkpoints", type=int, default=3, help="how many checkpoints to keep")
    p.add_argument(
        "--flush-interval",
        type=float,
        default=0.5,
        help="goodput flush interval in seconds (a SIGKILL loses at most this much)",
    )
    p.add_argument(
        "--raise-at-step",
        type=int,
        default=None,
        help="fault injection: raise an unhandled RuntimeError inside step N (after its "
        "computation, before the step span ends); a restart must leave the flag off, or it "
        "fails again at N",
    )
    p.add_argument(
        "--marks",
        choices=("manual", "auto", "none"),
        default="manual",
        help="manual: phase API markers; auto: goodput.instrument() only; none: no goodput "
        "code at all (run under opentelemetry-instrument; --run-dir, --job-name and "
        "--flush-interval then come from GOODPUT_RUN_DIR, GOODPUT_JOB_NAME, "
        "GOODPUT_FLUSH_INTERVAL_S)",
    )
    p.add_argument(
        "--ckpt-format",
        choices=("pt", "dcp"),
        default=None,
        help="pt: torch.save files; dcp: torch.distributed.checkpoint directories "
        "(default: pt with --marks manual, else dcp; the instrumentor sees both)",
    )
    args = p.parse_args(argv)
    if args.ckpt_format is None:
        args.ckpt_format = "pt" if args.marks == "manual" else "dcp"
    for name in ("steps", "ckpt_every", "eval_every", "log_every", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def latest_checkpoint(ckpt_dir: Path) -> tuple[int, Path] | None:
    """The ``(step, path)`` of the newest complete checkpoint in ``ckpt_dir``, if any."""
    found = []
    if ckpt_dir.is_dir():
        for path in ckpt_dir.iterdir():
            m = CKPT_RE.match(path.name)
            if m:
                found.append((int(m.group(1)), path))
    return max(found) if found else None


def latest_dcp_checkpoint(ckpt_dir: Path) -> tuple[int, Path] | None:
    """The ``(step, path)`` of the newest complete DCP checkpoint directory, if any.

    A DCP save writes ``.metadata`` last, so a directory without it is the
    remains of an interrupted save and is skipped.
    """
    found = []
    if ckpt_dir.is_dir():
        for path in ckpt_dir.iterdir():
            m = DCP_RE.match(path.name)
            if m and (path / ".metadata").is_file():
                found.append((int(m.group(1)), path))
    return max(found) if found else None


def save_dcp_checkpoint(
    ckpt_dir: Path, step: int, model: torch.nn.Module, optimizer: Any, keep: int
) -> Path:
    """Save model and optimizer with ``torch.distributed.checkpoint`` as step ``step``.

    The state dict has a top-level ``step`` entry: the goodput instrumentor
    reads the checkpoint step from it. Older checkpoints beyond ``keep`` are deleted.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    final = ckpt_dir / f"step-{step:08d}"
    dcp.save({"step": step, "model": model_sd, "optimizer": optim_sd}, checkpoint_id=final)
    for _, old in sorted(
        (int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := DCP_RE.match(p.name))
    )[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_dcp_checkpoint(path: Path, model: torch.nn.Module, optimizer: Any) -> int:
    """Load a DCP checkpoint into ``model`` and ``optimizer``; returns its step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"step": 0, "model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
    return int(state["step"])


class NoMarks:
    """Stands in for the goodput phase API with ``--marks auto/none``: every phase is a no-op."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: contextlib.nullcontext()


def save_checkpoint(ckpt_dir: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write ``state`` as the checkpoint of ``step`` atomically and prune old ones.

    The data goes to a hidden temporary file that is then renamed over the final
    name, so a process killed mid-save never leaves a truncated checkpoint
    behind. (Surviving a machine crash would also need an ``fsync`` of the file
    and of the directory; a killed process does not lose the page cache.)
    """
    import torch

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"ckpt-{step:08d}.pt"
    tmp = ckpt_dir / f".{final.name}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, final)
    for _, old in sorted(
        (int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := CKPT_RE.match(p.name))
    )[:-keep]:
        old.unlink(missing_ok=True)
    return final


class BatchStream:
    """Endless training batches in a reproducible order.

    Epoch ``e`` is shuffled with seed ``seed + e``, so a run resumed after
    ``batches_done`` batches sees exactly the batches an uninterrupted run would.
    The batches already consumed are skipped on the first :func:`next`.
    """

    def __init__(self, loader: Any, generator: torch.Generator, seed: int, batches_done: int):
        self._loader = loader
        self._generator = generator
        self._seed = seed
        self._epoch, self._skip = divmod(batches_done, len(loader))
        self._it: Any = None

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            self._start_epoch()
            for _ in range(self._skip):
                next(self._it)
        try:
            return next(self._it)
        except StopIteration:
            self._epoch += 1
            self._start_epoch()
            return next(self._it)

    def _start_epoch(self) -> None:
        self._generator.manual_seed(self._seed + self._epoch)
        self._it = iter(self._loader)


def evaluate(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Accuracy of ``model`` on a labelled set."""
    import torch

    model.eval()
    with torch.no_grad():
        accuracy = (model(inputs).argmax(dim=1) == targets).float().mean().item()
    model.train()
    return accuracy


def main(argv: list[str] | None = None) -> int:
    """Train (or resume) the digits job; returns the process exit status."""
    args = parse_args(argv)
    lifecycle = None  # the goodput module, for the attempt's end
    if args.marks == "none":
        goodput: Any = NoMarks()  # not even imported: opentelemetry-instrument does it all
    else:
        # goodput before torch: the attempt starts at the OS process start anyway,
        # and configure() installs the exit and SIGTERM hooks before any slow import.
        import goodput as _goodput

        _goodput.configure(
            job_name=args.job_name, run_dir=args.run_dir, flush_interval_s=args.flush_interval
        )
        if args.marks == "auto":
            # Automatic instrumentation only (goodput.instrument() would enable
            # every framework; this script only uses PyTorch).
            _goodput.instrument(["torch"])
        lifecycle = _goodput
        goodput = _goodput if args.marks == "manual" else NoMarks()
    ckpt_dir = Path(args.ckpt_dir)

    with goodput.accelerator_init():
        # Importing the framework is part of bringing the runtime up; on a GPU
        # host this is also where CUDA is initialised.
        import torch

        torch.set_num_threads(1)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        torch.zeros(1, device=device)  # force the device (CUDA context) to exist

    with goodput.training_prep():
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        digits = load_digits()
        x_train, x_val, y_train, y_val = train_test_split(
            digits.data / 16.0,
            digits.target,
            test_size=0.2,
            random_state=args.seed,
            stratify=digits.target,
        )
        x_train = torch.tensor(x_train, dtype=torch.float32)
        y_train = torch.tensor(y_train, dtype=torch.long)
        x_val = torch.tensor(x_val, dtype=torch.float32, device=device)
        y_val = torch.tensor(y_val, dtype=torch.long, device=device)
        generator = torch.Generator()
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(x_train, y_train),
            batch_size=args.batch_size,
            shuffle=True,
            generator=generator,
        )
        torch.manual_seed(args.seed)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 128),
            torch.nn.ReLU(),
            torch.nn.Linear(128, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 10),
        ).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        if args.ckpt_format == "dcp":
            import torch.distributed.checkpoint  # noqa: F401 - its import is part of the prep

    step = 0
    dcp_format = args.ckpt_format == "dcp"
    latest = latest_dcp_checkpoint(ckpt_dir) if dcp_format else latest_checkpoint(ckpt_dir)
    if latest is not None:
        ckpt_step, path = latest
        with goodput.checkpoint_restore(step=ckpt_step):
            if dcp_format:
                step = load_dcp_checkpoint(path, model, optimizer)
            else:
                state = torch.load(path, map_location=device, weights_only=True)
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                step = int(state["step"])
        print(f"restored checkpoint step {step} from {path}", flush=True)
    stream = BatchStream(loader, generator, args.seed, batches_done=step)

    with goodput.program_startup():
        # Warm-up: one forward and backward pass (first-call kernel selection,
        # allocator growth) without an optimizer update.
        warm = model(x_train[: args.batch_size].to(device))
        loss_fn(warm, y_train[: args.batch_size].to(device)).backward()
        optimizer.zero_grad(set_to_none=True)

    if step >= args.steps:
        print(f"nothing to do: already at step {step}", flush=True)
    accuracy = None
    for n in range(step + 1, args.steps + 1):
        with goodput.data_loading():
            inputs, targets = next(stream)
            inputs, targets = inputs.to(device), targets.to(device)
        with goodput.step(n):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), targets)
            loss.backward()
            optimizer.step()
            loss_value = loss.item()  # waits for the device
            if args.step_sleep > 0:
                time.sleep(args.step_sleep)
            if n == args.raise_at_step:
                print(f"raising at step {n}", flush=True)
                raise RuntimeError(f"injected failure at step {n} (--raise-at-step)")
        if n % args.log_every == 0 or n == args.steps:
            print(f"step {n} loss {loss_value:.4f}", flush=True)
        if n % args.ckpt_every == 0 or n == args.steps:
            with goodput.checkpoint_save(step=n):
                if dcp_format:
                    save_dcp_checkpoint(ckpt_dir, n, model, optimizer, args.keep_checkpoints)
                else:
                    state = {
                        "step": n,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                    }
                    save_checkpoint(ckpt_dir, n, state, args.keep_checkpoints)
            print(f"checkpoint saved step {n}", flush=True)
        if n % args.eval_every == 0 or n == args.steps:
            with goodput.custom_badput("eval"):
                accuracy = evaluate(model, x_val, y_val)
            print(f"eval step {n} accuracy {accuracy:.3f}", flush=True)

    if accuracy is not None:
        print(f"done: step {args.steps}, validation accuracy {accuracy:.3f}", flush=True)
    if lifecycle is not None:
        lifecycle.job_end()  # else the attempt ends at interpreter exit
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
