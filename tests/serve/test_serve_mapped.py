"""``goodput serve``'s compaction with a spill: what it moves to memory-mapped files (the
kept steps of whole attempts and pieces, the sorted step times, the painted segments the
rolling windows may still reach) reads back the same, and the polls and rolling windows
after it equal those of a store that never compacted (issue 40 item 3)."""

from __future__ import annotations

import gc
import gzip
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from goodput_processor.model.packed import PackedSegments
from goodput_processor.read.reader import span_files
from goodput_processor.read.rows import C_END
from goodput_processor.serve import LiveStore
from goodput_processor.serve.compaction import _mapped
from goodput_processor.serve.spill import Spill

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import recorded_job  # noqa: E402

WINDOWS_S = (60, 300, 900, 10**6)  # (the last reaches back to the job's start)


def test_spill_maps_arrays_of_any_width_aligned(tmp_path):
    """:meth:`Spill.map` gives equal, read-only views, each 8-byte aligned (int16 owner
    levels among int64 arrays), an empty one included; the bytes count while mapped."""
    spill = Spill(tmp_path)
    arrays = [np.array([3, -1, 7], np.int16), np.arange(5, dtype=np.int64) * -(2**40),
              np.zeros(0, np.int64), np.array([0.5, 2.0]), np.array([1], np.int16)]
    got = spill.map(arrays)
    assert got is not None and spill.mapped_bytes >= sum(a.nbytes for a in arrays)
    for a, b in zip(arrays, got, strict=True):
        assert b.dtype == a.dtype and np.array_equal(a, b) and not b.flags.writeable
        assert b.ctypes.data % 8 == 0 and _mapped(b)
    del got, a, b
    gc.collect()
    assert spill.mapped_bytes == 0
    spill.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> list[list[bytes]]:
    """The recorder's spool of a 6,000-step job with 3 restarts: its lines by attempt."""
    run = tmp_path_factory.mktemp("recorded")
    recorded_job.write_job(str(run), 6000, env={"PYTHONPATH": str(ROOT / "src")})
    by_pid: dict[int, list[bytes]] = {}
    for path in span_files(run):
        pid = int(re.search(r"-a\d+-(\d+)-", path.name).group(1))
        with (gzip.open(path) if path.name.endswith(".gz") else open(path, "rb")) as f:
            by_pid.setdefault(pid, []).extend(f.read().splitlines(keepends=True))
    return [by_pid[pid] for pid in sorted(by_pid)]


def _feed(stores, lines, where: str) -> None:
    for store in stores:
        for i, line in enumerate(lines):
            store.ingest_line(line, (where, i))


def _end_ns(store: LiveStore, name: str) -> int:
    return max(int(p.data[:, C_END].max()) for p in store.snapshot(name).processes.values())


def _same(a, b) -> None:
    assert a.windows == b.windows
    assert a.result.buckets_ns == b.result.buckets_ns
    assert a.result.step_time == b.result.step_time


def test_polls_and_windows_after_mapping_equal_a_store_never_compacted(recorded, tmp_path):
    """Finished attempts and most of the running one taken in, accounted, compacted with
    everything mapped (``map_least=1``); then the running attempt's last lines: every
    report and rolling window (one reaching back to the start) equals that of a store
    that never compacted, and the windows' memo keeps its painted segments mapped or
    packed, none in memory."""
    spill = Spill(tmp_path / "spill")
    store = LiveStore(min_interval_s=0, spill=spill)
    plain = LiveStore(min_interval_s=0, pack_after_s=None)
    both = (store, plain)
    for k, lines in enumerate(recorded[:-1]):
        _feed(both, lines, f"a{k}")
    running = recorded[-1]
    cut = len(running) * 2 // 3
    _feed(both, running[:cut], "running")
    (name,) = store.jobs()
    now = _end_ns(store, name) + 10**9
    for s in both:
        s.results(now_ns=now)
        s.snapshot_windows(name, WINDOWS_S, now_ns=now)
    assert store.compact(min_quiet_s=0, min_rows=0, map_least=1) > 0
    assert spill.mapped_bytes > 0
    with store.memo(name, windows=True) as memo:
        segs = [p[6] for t in ("attempt", "piece") for _, p in memo.entries(t)]
        assert segs and all(isinstance(s, PackedSegments) or _mapped(s[0]) or len(s[0]) < 2
                            for s in segs)
        assert any(not isinstance(s, PackedSegments) for s in segs)  # (the windows reach)
    _same(store.snapshot_windows(name, WINDOWS_S, now_ns=now),
          plain.snapshot_windows(name, WINDOWS_S, now_ns=now))
    _feed(both, running[cut:], "running")
    now = _end_ns(store, name) + 10**9
    for _ in range(2):  # (the second from what the first kept)
        _same(store.snapshot_windows(name, WINDOWS_S, now_ns=now),
              plain.snapshot_windows(name, WINDOWS_S, now_ns=now))
        assert store.report_json(now_ns=now) == plain.report_json(now_ns=now)
    spill.close()
