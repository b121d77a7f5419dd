"""The ``goodput`` command line run as a real subprocess, for tests in every stage folder.

:func:`goodput` runs ``python -m goodput_processor.cli`` with this checkout's ``src/`` and
``collectors/`` first on ``PYTHONPATH`` (so a clone tests its own code), 120 columns wide.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def goodput(*args, cwd=None) -> subprocess.CompletedProcess:
    """``goodput *args`` (each made a string) in a child process; its exit status, stdout
    and stderr (text). subprocess.TimeoutExpired after 60 s."""
    env = dict(os.environ)
    paths = [str(ROOT / "src"), str(ROOT / "collectors")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["COLUMNS"] = "120"
    return subprocess.run(
        [sys.executable, "-m", "goodput_processor.cli", *map(str, args)],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=60,
    )
