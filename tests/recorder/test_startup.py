"""Process start-up is its own bucket: a script written as the README says, run for real.

From the moment the OS process started to the first phase it recorded (interpreter start,
``import goodput``, ``import torch``, whatever ran before the first marker), the time is
``process_startup``; what no span covers after that is ``other``, and for a script that
marks its phases as the README shows it is next to nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from instr_util import child_env

pytest.importorskip("torch")

README_SCRIPT = """
import goodput
goodput.configure(job_name="readme-run")          # first thing: the attempt starts here

import torch                                       # slow imports: process start-up

def build():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(32, 64), torch.randn(32, 1)) for _ in range(20)]
    return model, opt, data

def train_step(model, opt, batch):
    x, y = batch
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()

with goodput.training_prep():
    model, opt, loader = build()
for n, batch in enumerate(loader * 10, start=1):
    with goodput.step(n):
        train_step(model, opt, batch)
    if n % 100 == 0:
        with goodput.checkpoint_save(step=n):
            torch.save(model.state_dict(), "ckpt.pt")
"""


def test_readme_script_startup_is_its_own_bucket_and_other_is_small(tmp_path):
    (tmp_path / "train.py").write_text(README_SCRIPT)
    env = child_env(GOODPUT_RUN_DIR=str(tmp_path / "run"))
    subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, check=True,
                   timeout=300)
    out = subprocess.run([sys.executable, "-m", "goodput_processor.cli", "report",
                          str(tmp_path / "run"), "--format", "json"], env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    (job,) = json.loads(out.stdout)["jobs"]
    bad, total = job["badput_s"], job["total_time_s"]
    assert bad["process_startup"] > 0.1  # the interpreter and import torch, at least
    assert bad["other"] < 0.02 * total, (bad, total)
    assert job["step_time"]["count"] == 200
