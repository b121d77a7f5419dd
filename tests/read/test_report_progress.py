"""``goodput report`` draws a progress bar on stderr while it reads a large spool, only when
stderr is a terminal (issue 40, item 5).

The report runs as its own process with stderr on a real pseudo-terminal (``pty``) and a
small spool, the threshold lowered to 0 MiB by ``GOODPUT_PROGRESS_MIN_MB``, beside one
with stderr on a file, where nothing may be printed. stdout is the same JSON in both.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from goodput_processor import cli
from goodput_processor.read import progress
from goodput_processor.read.reader import read_run_dir, span_files
from goodput_processor.terminal import ProgressBar

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import synth  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A small spool (about 0.4 MB): 1,000 steps, one restart."""
    out = tmp_path_factory.mktemp("progress") / "run"
    synth.write_job(str(out), 1000, restarts=1)
    return out


def _reports(run: Path, tmp: Path) -> dict[bool, tuple[bytes, bytes, int]]:
    """``{stderr on a terminal: (stdout, stderr, exit status)}`` of ``goodput report RUN
    --format json --no-cache``, threshold 0 MiB, one process with stderr on a
    pseudo-terminal and one with stderr on a file, side by side."""
    env = {**os.environ, "GOODPUT_PROGRESS_MIN_MB": "0", "TERM": "xterm", "COLUMNS": "100"}
    cmd = [sys.executable, "-m", "goodput_processor.cli", "report", str(run), "--format",
           "json", "--no-cache"]
    with open(tmp / "out", "wb") as out, open(tmp / "err", "wb") as err:
        piped = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
    main_fd, term_fd = pty.openpty()
    on_term = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=term_fd, env=env)
    os.close(term_fd)
    term_out = on_term.stdout.read()
    term_err = b""
    while True:  # until the child's end closes the terminal (EIO on Linux)
        try:
            chunk = os.read(main_fd, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        term_err += chunk
    os.close(main_fd)
    return {True: (term_out, term_err, on_term.wait(timeout=120)),
            False: ((tmp / "out").read_bytes(), (tmp / "err").read_bytes(),
                    piped.wait(timeout=120))}


def test_bar_on_a_terminal_and_nothing_on_a_pipe(run, tmp_path):
    got = _reports(run, tmp_path)
    (out_tty, err_tty, rc_tty), (out_pipe, err_pipe, rc_pipe) = got[True], got[False]
    assert rc_tty == rc_pipe == 0
    assert b"reading spool" in err_tty and b"100%" in err_tty
    assert err_pipe == b""
    assert json.loads(out_tty) == json.loads(out_pipe)


def test_the_threshold(run, monkeypatch):
    """On a terminal, a bar from ``GOODPUT_PROGRESS_MIN_MB`` MiB of span files on (256 by
    default); a bad value is a usage error."""
    main_fd, term_fd = pty.openpty()
    with os.fdopen(term_fd, "w") as term:
        monkeypatch.setattr(sys, "stderr", term)
        for value, drawn in (("0", True), ("0.1", True), ("1000", False), ("", False)):
            monkeypatch.setenv("GOODPUT_PROGRESS_MIN_MB", value)
            assert isinstance(cli._read_bar(str(run)), ProgressBar) is drawn, value
        monkeypatch.setenv("GOODPUT_PROGRESS_MIN_MB", "lots")
        with pytest.raises(cli.UsageError, match="GOODPUT_PROGRESS_MIN_MB"):
            cli._read_bar(str(run))
    os.close(main_fd)


def test_the_reader_counts_every_byte_once(run):
    """Serially and with worker processes, the ticks add up to the span files' bytes."""
    total = sum(p.stat().st_size for p in span_files(run))
    for workers in (1, 2):
        calls: list[tuple[str, int, int]] = []
        with progress.watching(lambda *a, calls=calls: calls.append(a)):
            read_run_dir(run, workers=workers, cache=False)
        assert {c[0] for c in calls} == {"read"} and {c[2] for c in calls} == {total}
        assert sum(c[1] for c in calls) == total
    assert progress.ticker(total) is None  # outside the block: nobody watches
