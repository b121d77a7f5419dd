"""Regenerate the NeMo test data: a real Lightning run with NeMo's own ``DLLogger`` logger
and ``TimingCallback`` writing DLLogger JSON lines, SIGKILLed mid-run and restarted from
its last checkpoint; its stdout kept as ``kubectl logs --timestamps`` would show it.

What runs for real (pins):
- DLLogger 1.0.0 (NVIDIA/dllogger 0478734ff7be75adde8d160e04872664d1c62e5f, not on PyPI:
  ``venv.sh`` installs it from a checkout): ``JSONStreamBackend`` writes the lines;
- NeMo 8cfedd7203462cb251a914e700e5605444277561 (2025-09-20): ``nemo/utils/loggers/
  dllogger.py`` (the ``DLLogger`` Lightning logger) and ``nemo/utils/timers.py`` verbatim,
  and the ``TimingCallback`` class cut verbatim out of ``nemo/utils/exp_manager.py``;
- Lightning 2.6.6, torch 2.13.0 (CPU) of the main environment; omegaconf 2.3.0.

CPU shims (NeMo itself is not installed: its package import pulls in half of its
dependencies): ``nemo.utils.logging`` is the standard ``logging`` logger "nemo"; the three
NeMo files above are laid out as a package ``nemo`` in a temporary directory. The model is a
one-layer regression whose step sleeps 40-60 ms (step 7: 300 ms) so the times are
measurable.

The driver (this script) starts the training as a child process, time-stamps each line
of its output as it arrives (RFC 3339 ns, what the container runtime does), and writes
the truth: the child's own fsync'd ``on_train_batch_start``/``end`` times (a callback
right after NeMo's). It SIGKILLs the child once step 17 has ended, then starts it again
from the last checkpoint (step 15); the second run ends at step 30.

Run (about 40 s): ``.venvs/dllogger/bin/python tests/data/sources/nemo-log/
regenerate.py --nemo-repo PATH_TO_NEMO_GIT`` (a clone or mirror holding the commit).
Writes ``dllogger-0.json``, ``dllogger-1.json``, ``nemo-0.log``, ``nemo-1.log``,
``truth-0.jsonl``, ``truth-1.jsonl`` here.
"""

from __future__ import annotations

import argparse
import ast
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEMO_COMMIT = "8cfedd7203462cb251a914e700e5605444277561"
KILL_AFTER_STEP = 17
MAX_STEPS = 30


def _git_show(repo: str, path: str) -> str:
    return subprocess.run(["git", "-C", repo, "show", f"{NEMO_COMMIT}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def lay_out_nemo(repo: str, root: Path) -> None:
    """NeMo's three pinned files as a package ``nemo`` under ``root`` (the shims above)."""
    u = root / "nemo" / "utils"
    (u / "loggers").mkdir(parents=True)
    (root / "nemo" / "__init__.py").write_text("")
    (u / "__init__.py").write_text("import logging as _logging\n"
                                   "logging = _logging.getLogger('nemo')  # shim\n")
    (u / "loggers" / "__init__.py").write_text("")
    (u / "timers.py").write_text(_git_show(repo, "nemo/utils/timers.py"))
    (u / "loggers" / "dllogger.py").write_text(_git_show(repo, "nemo/utils/loggers/dllogger.py"))
    src = _git_show(repo, "nemo/utils/exp_manager.py")
    cls = next(n for n in ast.parse(src).body
               if isinstance(n, ast.ClassDef) and n.name == "TimingCallback")
    text = "\n".join(src.splitlines()[cls.lineno - 1:cls.end_lineno])
    (u / "timing_callback.py").write_text(
        "# TimingCallback, cut verbatim from nemo/utils/exp_manager.py at " + NEMO_COMMIT
        + "\nimport torch\nfrom lightning.pytorch.callbacks import Callback\n"
        "from nemo.utils import logging, timers\n\n\n" + text + "\n")


def child(out: Path, run: int, resume: str | None) -> None:
    """The training process."""
    import logging
    import random

    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from nemo.utils.loggers.dllogger import DLLogger
    from nemo.utils.timing_callback import TimingCallback

    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    truth = open(out / f"truth-{run}.jsonl", "a")

    def note(kind: str, step: int) -> None:
        truth.write(f'{{"kind": "{kind}", "step": {step}, "t": {time.time_ns()}}}\n')
        truth.flush()
        os.fsync(truth.fileno())

    class Truth(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            note("start", trainer.global_step)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            note("end", trainer.global_step)

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)
            self.rng = random.Random(run)

        def training_step(self, batch, batch_idx):
            time.sleep(0.3 if self.global_step == 7 else self.rng.uniform(0.04, 0.06))
            x, y = batch
            return torch.nn.functional.mse_loss(self.lin(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(512, 4), torch.randn(512, 1))
    note("process_start", -1)
    trainer = pl.Trainer(
        max_steps=MAX_STEPS, accelerator="cpu", devices=1, log_every_n_steps=1,
        logger=DLLogger(stdout=False, verbose=False, json_file=str(out / f"dllogger-{run}.json")),
        callbacks=[TimingCallback(), Truth(),
                   ModelCheckpoint(dirpath=str(out / "ckpt"), every_n_train_steps=5,
                                   save_top_k=-1)],
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8), ckpt_path=resume)
    note("exit", trainer.global_step)


def _pump(proc: subprocess.Popen, path: Path) -> None:
    with open(path, "w") as f:
        for line in proc.stdout:
            ns = time.time_ns()
            stamp = datetime.fromtimestamp(ns // 10**9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
            f.write(f"{stamp}.{ns % 10**9:09d}Z {line.rstrip()}\n")
            f.flush()


def _ended(path: Path, step: int) -> bool:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return False
    return f'"kind": "end", "step": {step},' in text


def drive(out: Path, pkg: Path) -> None:
    for f in out.glob("*"):
        if f.name.startswith(("dllogger-", "nemo-", "truth-")):
            f.unlink()
    env = dict(os.environ, PYTHONPATH=str(pkg) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    work = Path(tempfile.mkdtemp())
    for run in (0, 1):
        resume = None
        if run == 1:
            ckpts = sorted((work / "ckpt").glob("*.ckpt"),
                           key=lambda p: int(p.stem.split("step=")[1]))
            resume = str(ckpts[-1])
        cmd = [sys.executable, __file__, "--child", str(run), "--out", str(work)]
        if resume:
            cmd += ["--resume", resume]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        pump = threading.Thread(target=_pump, args=(proc, out / f"nemo-{run}.log"))
        pump.start()
        if run == 0:
            while not _ended(work / "truth-0.jsonl", KILL_AFTER_STEP) and proc.poll() is None:
                time.sleep(0.005)
            os.kill(proc.pid, signal.SIGKILL)
            with open(work / "truth-0.jsonl", "a") as f:
                f.write(f'{{"kind": "kill", "step": -1, "t": {time.time_ns()}}}\n')
        proc.wait()
        pump.join()
        for name in (f"dllogger-{run}.json", f"truth-{run}.jsonl"):
            (out / name).write_text((work / name).read_text())
        time.sleep(1.0)   # the restart's delay


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nemo-repo")
    ap.add_argument("--child", type=int)
    ap.add_argument("--out")
    ap.add_argument("--resume")
    ap.add_argument("--dest", default=str(HERE), help="where the files go (default: here)")
    a = ap.parse_args()
    if a.child is not None:
        child(Path(a.out), a.child, a.resume)
        return
    with tempfile.TemporaryDirectory() as tmp:
        lay_out_nemo(a.nemo_repo, Path(tmp))
        drive(Path(a.dest), Path(tmp))


if __name__ == "__main__":
    main()
