"""A spool whose size follows what it holds: segments compacted at the attempt's end and on
a timer, and what a killed attempt left (its journal, a ``.gz.tmp``) finished at the next
start of its rank, with every report the same (issue 40)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from goodput import leftovers, schema
from goodput.encode import Encoder
from goodput.segments import SpoolWriter
from goodput.traces import AttemptIds, TraceWindows
from goodput_processor.read.reader import read_run_dir

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "collectors")])}

# A training process: steps, flushed; then a step in flight until it is killed, or an exit.
_CHILD = """
import goodput, sys, time
goodput.configure('left', run_dir=sys.argv[1], flush_interval_s=0.02, trace_window_spans=20,
                  process_index=0)
for i in range(int(sys.argv[2]), int(sys.argv[2]) + 200):
    with goodput.step(i):
        time.sleep(0.0005)
goodput.flush()
rec = goodput.get_recorder()
if rec._tidy is not None:
    rec._tidy.join(30)
if sys.argv[3] == 'kill':
    s = goodput.step(10**6); s.__enter__(); time.sleep(0.1)
    print('ready', flush=True); time.sleep(60)
goodput.shutdown()
print('done', flush=True)
"""


def _run(run: Path, first: int, how: str, seg_mb: str = "0.01") -> None:
    env = {**ENV, "GOODPUT_SPOOL_SEGMENT_MB": seg_mb}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(run), str(first), how],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == ("ready" if how == "kill" else "done")
    if how == "kill":
        proc.kill()
    proc.wait(30)


def _report(run: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "goodput_processor.cli", "report", str(run),
                          "--format", "json", "--no-cache"], capture_output=True, text=True,
                         check=True, env=ENV)
    return json.loads(out.stdout)


def _without(run: Path, dest: Path, pid_of: Path) -> Path:
    """A copy of ``run`` without the files of the process that wrote ``pid_of``."""
    shutil.copytree(run, dest)
    base = pid_of.name.split(".")[0]
    for p in dest.iterdir():
        if p.name.startswith(base):
            p.unlink()
    return dest


def test_a_killed_attempt_is_finished_at_the_next_start(tmp_path):
    """SIGKILL mid-attempt leaves its last journal uncompacted (and, killed while it wrote a
    compacted segment, a .gz.tmp): a report removes a .gz.tmp a minute old, the next process
    of the rank any, and compacts the journal; the killed attempt reports the same."""
    run = tmp_path / "run"
    _run(run, 0, "kill")
    names = os.listdir(run)
    assert not [n for n in names if n.endswith(".tmp")]  # built in memory: nothing on disk
    bare = [n for n in names if n.endswith(".jsonl") and n + ".gz" not in names]
    assert len(bare) == 1 and [n for n in names if n.endswith(".jsonl.gz")]  # rotated ones
    tmp = run / (bare[0] + ".gz.tmp")  # as a kill while it was written leaves it
    tmp.write_bytes(b"\x1f\x8b unfinished")
    os.utime(tmp, (tmp.stat().st_atime - 120, tmp.stat().st_mtime - 120))
    before = _report(run)
    assert not tmp.exists()  # the report removed it: its writer is gone (tail not locked)
    tmp.write_bytes(b"\x1f\x8b unfinished")
    read_run_dir(run)
    assert tmp.exists()  # a minute old at least: it may be being written
    _run(run, 200, "exit")
    names = sorted(os.listdir(run))
    assert not [n for n in names if n.endswith(".tmp")]
    assert bare[0] + ".gz" in names and bare[0] in names  # compacted; retired after grace
    with open(run / bare[0], "rb") as f:
        assert gzip.open(run / (bare[0] + ".gz")).read() == f.read()
    ours = [n for n in names if n.endswith(".jsonl")
            and n.split(".")[0] != bare[0].split(".")[0]]
    after = _report(_without(run, tmp_path / "first", run / ours[0]))
    assert after == before
    (job,) = _report(run)["jobs"]
    assert [a["end_reason"] for a in job["attempts"]] == ["killed", "exit"]


def test_the_attempt_end_compacts_its_last_segment(tmp_path):
    """A clean exit writes the last segment's .gz (its journal stays for the grace); the
    report reads the .gz and is the one of the journals alone."""
    run = tmp_path / "run"
    _run(run, 0, "exit", seg_mb="16")
    names = os.listdir(run)
    (journal,) = [n for n in names if n.endswith(".jsonl")]
    assert journal + ".gz" in names and not [n for n in names if n.endswith(".tmp")]
    lines = gzip.open(run / (journal + ".gz")).read().splitlines()
    assert all(ln.count(b'"resource"') == 1 for ln in lines)  # a request per line, as ever
    assert len(lines) == sum(ln.count(b'"goodput.window"') for ln in lines)  # one a window
    plain = tmp_path / "plain"
    shutil.copytree(run, plain)
    (plain / (journal + ".gz")).unlink()
    assert _report(run) == _report(plain)


def test_segments_close_on_the_timer(tmp_path):
    """A segment closes at the first window close segment_ns after its first span, though
    its journal is far from full; each is compacted and retired."""
    path = tmp_path / "spans-p00000-a0000-1-abcdef01.jsonl"
    enc = Encoder({"service.name": "w"}, "goodput", "0.1.0")
    now = [0]
    w = SpoolWriter(path, enc, segment_bytes=1 << 30, segment_ns=50, grace_ns=0,
                    clock=lambda: now[0])
    windows = TraceWindows(enc, AttemptIds(), 10**12, 5, w)
    for i in range(100):
        now[0] = i * 10
        windows.emit(schema.STEP, i * 10, i * 10 + 9, {schema.ATTR_STEP: i})
        w.flush()
    windows.close()
    w.close()
    gz = sorted(tmp_path.glob("*.jsonl.gz"))
    assert len(gz) >= 8 and len(w.retired) == len(gz)
    steps = [s for p in gz for line in gzip.open(p).read().splitlines()
             for s in json.loads(line)["resourceSpans"][0]["scopeSpans"][0]["spans"]
             if s["name"] == schema.STEP]
    assert len(steps) == 100
    w.reap(10, sent=lambda p: True)
    assert not list(tmp_path.glob("*.jsonl")) and len(list(tmp_path.glob("*.gz"))) == len(gz)


def test_tidy_leaves_live_writers_and_unsent_journals(tmp_path):
    """Another process of the rank that is alive (its tail locked) keeps its journal; a dead
    one's journal that an exporter has not sent is compacted but not retired; a damaged .gz
    (a crash before it was synced) is made again; orphan sidecars go."""
    import fcntl

    d = str(tmp_path)
    live, dead, unsent = (f"spans-p00000-a000{i}-{i}-0000000{i}" for i in range(3))
    for base in (live, dead, unsent):
        (tmp_path / f"{base}.jsonl").write_bytes(b'{"resourceSpans":[]}\n' * 50)
        (tmp_path / f"{base}.tail").write_bytes(b"t")
    (tmp_path / f"{live}.jsonl.gz.tmp").write_bytes(b"x")
    (tmp_path / f"{dead}.jsonl.gz").write_bytes(b"\x1f\x8b damaged")
    (tmp_path / f"{unsent}.jsonl.otlp.offset").write_text("10\n")
    (tmp_path / f"{dead}.s0001.jsonl.otlp.offset").write_text("5\n")  # its journal is gone
    (tmp_path / "spans-p00001-a0000-9-00000009.jsonl").write_bytes(b"{}\n")  # another rank
    (tmp_path / "spans-p00000-a0001.jsonl").write_bytes(b"{}\n")  # goodput import's: not ours
    adopted = []
    with open(tmp_path / f"{live}.tail", "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        counts = leftovers.tidy(d, 0, "spans-p00000-a0009-9-00000009", adopted.append)
    assert counts == {"tmp_removed": 0, "compacted": 2, "adopted": 1, "bad_gz": 1,
                      "sidecars_removed": 1}
    assert adopted == [os.path.join(d, f"{dead}.jsonl")]
    assert (tmp_path / f"{live}.jsonl.gz.tmp").exists() and not (
        tmp_path / f"{live}.jsonl.gz").exists()
    for base in (dead, unsent):
        assert gzip.open(tmp_path / f"{base}.jsonl.gz").read() == \
            (tmp_path / f"{base}.jsonl").read_bytes()
    assert not list(tmp_path.glob("spans-p00001-*.gz")) + list(tmp_path.glob("*a0001.jsonl.gz"))
