"""``goodput serve`` keeps a quiet process's rows packed, and polls go on without reading them.

A job recorded by the real recorder (``benchmarks/recorded_job.py``: restarts, checkpoints,
custom badput, a ``goodput.open`` record at every flush) is taken into a
:class:`~goodput_processor.serve.store.LiveStore` line by line, its last attempt a batch at a
time. Once the finished attempts' rows are packed (:meth:`LiveStore.compact`), every poll
must equal accounting the job afresh, read no packed row, and a late line of a finished
attempt must land on its packed rows as on unpacked ones.
"""

from __future__ import annotations

import gzip
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from test_incremental import _state

from goodput_processor.accounting import account
from goodput_processor.cli import main
from goodput_processor.reader import span_files
from goodput_processor.serve import GoodputServer, LiveStore
from goodput_processor.serve.rows import PackedProcessSpans, pack_rows, unpack_rows

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import recorded_job  # noqa: E402

NOW = 2**62  # far after the job: its last attempt is judged from its own evidence


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(rows=hnp.arrays(np.int64, st.tuples(st.integers(0, 40), st.integers(1, 9)),
                       elements=st.integers(-(2**63), 2**63 - 1)))
def test_packed_rows_come_back_exactly(rows):
    """Any int64 rows (the extremes included: the column differences wrap) unpack to
    themselves, with room after them when asked."""
    packed = pack_rows(rows)
    assert packed.n == len(rows)
    assert np.array_equal(unpack_rows(packed), rows)
    assert np.array_equal(unpack_rows(packed, extra=3)[: len(rows)], rows)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[int, list[bytes]]:
    """The recorder's spool of a 6,000-step job with 3 restarts: its lines by attempt."""
    run = tmp_path_factory.mktemp("recorded")
    recorded_job.write_job(str(run), 6000, env={"PYTHONPATH": str(ROOT / "src")})
    by_pid: dict[int, list[bytes]] = {}  # (an attempt is one OS process: its pid names it)
    for path in span_files(run):
        pid = int(re.search(r"-a\d+-(\d+)-", path.name).group(1))
        with (gzip.open(path) if path.name.endswith(".gz") else open(path, "rb")) as f:
            by_pid.setdefault(pid, []).extend(f.read().splitlines(keepends=True))
    assert len(by_pid) == 4
    return dict(enumerate(by_pid[pid] for pid in sorted(by_pid)))


def _feed(store: LiveStore, lines, where: str) -> None:
    for i, line in enumerate(lines):
        store.ingest_line(line, (where, i))


def _poll_reads_no_packed_row(store: LiveStore, name: str):
    """A poll through the store's memo: its result, the packed processes (the store's, and
    the resolved copies the memo keeps), and those it read."""
    snap = store.snapshot(name)
    with store.memo(name) as memo:
        live = account(snap, None, NOW, memo=memo)
        resolved = [run.proc for _, runs in memo.entries("runs") for run in runs]
    packed = [p for p in (*snap.processes.values(), *resolved)
              if isinstance(p, PackedProcessSpans)]
    return live, packed, [p for p in packed if p.__dict__["data"] is not None]


def test_polls_of_a_running_job_read_no_packed_row(recorded):
    """Finished attempts packed (the store's rows and the memo's resolved copy), the
    running one arriving a batch at a time: each poll equals accounting afresh and inflates
    none of the packed rows; the store's rows fall to under a third."""
    store = LiveStore(min_interval_s=0)
    last = max(recorded)
    for attempt in range(last):
        _feed(store, recorded[attempt], f"a{attempt}")
    running = recorded[last]
    cut = len(running) // 3
    _feed(store, running[:cut], "running")
    (name,) = store.jobs()
    store.results(now_ns=NOW)
    before = store.memory_bytes()[name]
    assert store.compact(min_quiet_s=0, min_rows=0) > 10_000
    assert store.memory_bytes()[name] < before / 3
    for k in (cut, 2 * cut, len(running)):
        _feed(store, running[k - cut : k] if k > cut else [], "running")
        live, packed, read = _poll_reads_no_packed_row(store, name)
        assert len(packed) >= 2 * last  # the finished attempts' processes, resolved too
        assert read == []
        assert _state(live) == _state(account(store.snapshot(name), None, NOW))
    # a line of a finished attempt delivered again (a retried export): its rows are
    # unpacked, the duplicates dropped as before
    dups = store.snapshot(name).skipped["duplicate"]
    _feed(store, recorded[0][-3:], "retry")
    live, packed, read = _poll_reads_no_packed_row(store, name)
    assert store.snapshot(name).skipped["duplicate"] > dups
    assert _state(live) == _state(account(store.snapshot(name), None, NOW))


def test_a_maintenance_round_packs_only_quiet_processes(recorded):
    """``GoodputServer.maintain`` packs the processes quiet for ``pack_after_s``; with it
    off nothing is packed; the report is the same either way."""
    results = {}
    for pack_after in (None, 0.0, 3600.0):
        store = LiveStore(min_interval_s=0, pack_after_s=pack_after)
        for attempt, lines in recorded.items():
            _feed(store, lines, f"a{attempt}")
        server = GoodputServer(store, grpc_port=None, http_port=None)
        results[pack_after] = store.report_json(now_ns=NOW)
        before = store.memory_bytes()["recorded"]
        server.maintain()
        after = store.memory_bytes()["recorded"]
        if pack_after == 0.0:  # (processes of 4,096 rows and more)
            assert after < before * 0.7
        else:  # off, or not quiet for long enough yet
            assert after == before
        assert store.report_json(now_ns=NOW) == results[pack_after]
    assert len(set(results.values())) == 1


def test_pack_after_option(tmp_path, capsys):
    """``goodput serve --pack-after`` takes seconds >= 0 or ``off``."""
    assert main(["serve", "--grpc-port", "off", "--http-port", "off", "--spool-dir",
                 str(tmp_path), "--pack-after", "-1"]) == 2
    assert "--pack-after must be a number >= 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="pack_after_s"):
        LiveStore(pack_after_s=-1)
