"""Measuring never changes the job: SIGTERM and SIGINT end a process exactly as fast with
goodput as without it, also while it is blocked in native code (a ``TCPStore`` wait), and
what it had done is in the spool (``docs/recording.md``, "Signals")."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from instr_util import child_env, spans

from goodput_processor.account.run_dir import report_run_dir

pytest.importorskip("torch.distributed")

CHILD = """
import contextlib, datetime, sys, time
phase = contextlib.nullcontext()
if sys.argv[1] == "goodput":
    import goodput
    goodput.configure("sig", run_dir=sys.argv[2], flush_interval_s=0.1)
    with goodput.step(1):
        time.sleep(0.05)
    phase = goodput.custom_badput("rendezvous")
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=120))
print("blocked", flush=True)
with phase:
    if sys.argv[3] == "native":
        store.wait(["never-set"])  # the main thread never returns to the interpreter
    else:
        while True:
            time.sleep(0.01)
"""


def _time_to_exit(tmp_path, mode: str, sig: int, where: str) -> tuple[float, int]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "blocked.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, str(script), mode, str(tmp_path / "run"), where],
                            stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert proc.stdout.readline().strip() == "blocked"
        time.sleep(1.0)  # well inside the wait, and past several flushes
        t0, sent = time.monotonic(), time.time()
        proc.send_signal(sig)
        rc = proc.wait(60)
        (tmp_path / "sent").write_text(repr(sent))
        return time.monotonic() - t0, rc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# SIGINT while blocked in native code ends neither process (Python's own handler waits for
# the interpreter too), so it is tried where the interpreter runs.
@pytest.mark.parametrize("sig, where", [(signal.SIGTERM, "native"), (signal.SIGTERM, "python"),
                                        (signal.SIGINT, "python")])
def test_a_process_exits_on_a_signal_as_fast_as_without_goodput(tmp_path, sig, where):
    plain, rc_plain = _time_to_exit(tmp_path / "plain", "plain", sig, where)
    measured, rc = _time_to_exit(tmp_path / "goodput", "goodput", sig, where)
    assert rc == rc_plain  # the same way of dying (killed by SIGTERM / KeyboardInterrupt)
    assert measured < plain + 0.5, (measured, plain)
    # The phase it was blocked in is in the spool, as a record of a phase in flight.
    names = {s["name"] for s in spans(tmp_path / "goodput" / "run")}
    assert "goodput.step" in names
    if sig == signal.SIGTERM:
        raw = (tmp_path / "goodput" / "run").glob("*.jsonl")
        assert any('"goodput.open"' in p.read_text() and "rendezvous" in p.read_text()
                   for p in raw)
        # Heartbeats went on while it was blocked: the attempt ends within a flush
        # interval (0.1 s, plus slack for a busy machine) of the signal, inside the phase.
        sent = float((tmp_path / "goodput" / "sent").read_text())
        (job,) = report_run_dir(tmp_path / "goodput" / "run", now_ns=int((sent + 60) * 1e9))
        assert job.attempts[0].end_reason == "killed"
        assert sent - 0.5 < job.end_ns / 1e9 <= sent + 0.1
        assert job.badput_s["custom:rendezvous"] > 0.8
