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
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from live_polls import result_state

from goodput_processor.account.accounting import account
from goodput_processor.cli import main
from goodput_processor.read.reader import span_files
from goodput_processor.read.rows import ProcessSpans
from goodput_processor.serve import GoodputServer, LiveStore
from goodput_processor.serve.rows import PackedProcessSpans, pack_rows, unpack_rows
from goodput_processor.serve.spill import Spill

ROOT = Path(__file__).resolve().parents[2]
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


def _processes_held(memo) -> list:
    """Every process object the memo's results hold, looked for through tuples, lists,
    dicts and the objects' attributes (4 levels down)."""
    out, seen = [], set()

    def walk(x, depth):
        if id(x) in seen or depth > 4 or isinstance(x, (str, bytes, int, float, np.ndarray)):
            return
        seen.add(id(x))
        if isinstance(x, ProcessSpans):
            out.append(x)
            return
        if isinstance(x, dict):
            items = x.values()
        elif isinstance(x, (tuple, list, set, frozenset)):
            items = x
        else:
            items = getattr(x, "__dict__", {}).values()
        for v in items:
            walk(v, depth + 1)

    for d in (memo._old, memo._new):
        walk(list(d.values()), 0)
    return out


def _poll_reads_no_packed_row(store: LiveStore, name: str):
    """A poll through the store's memo: its result, the packed processes (the store's, and
    the resolved copies the memo keeps), and those it read."""
    snap = store.snapshot(name)
    with store.memo(name) as memo:
        live = account(snap, None, NOW, memo=memo)
        resolved = [run.proc for _, runs in memo.entries("runs") for run in runs]
        held = _processes_held(memo)
    # nothing the memo keeps holds a packed process's rows: neither an unpacked copy of
    # it (kept from before the compaction) nor a packed one whose rows were read
    packed_origins = {p.origin for p in resolved if isinstance(p, PackedProcessSpans)}
    assert packed_origins
    assert [p.origin for p in held if p.origin in packed_origins and (
        not isinstance(p, PackedProcessSpans) or p.__dict__["data"] is not None)] == []
    packed = [p for p in (*snap.processes.values(), *resolved)
              if isinstance(p, PackedProcessSpans)]
    return live, packed, [p for p in packed if p.__dict__["data"] is not None]


@pytest.mark.parametrize("on_disk", [False, True])
def test_polls_of_a_running_job_read_no_packed_row(recorded, tmp_path, on_disk):
    """Finished attempts packed (the store's rows and the memo's resolved copy), the
    running one arriving a batch at a time: each poll equals accounting afresh and inflates
    none of the packed rows; the store's rows fall to under a third. ``on_disk``: the
    packed rows are kept in a :class:`Spill`'s file (none of them left in memory), and read
    back from it by the fresh accountings and by a line that lands on them."""
    spill = Spill(tmp_path / "spill") if on_disk else None
    store = LiveStore(min_interval_s=0, spill=spill)
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
    if on_disk:  # (every packed process's bytes in the job's one file, none in memory)
        packed_rows = [r.packed for r in store._rows[name].values() if r.packed is not None]
        assert packed_rows and all(p.nbytes == 0 for p in packed_rows)
        spill_dir = tmp_path / "spill"
        (path,) = spill_dir.iterdir()
        assert path.stat().st_size == spill.disk_bytes > 10_000
    for k in (cut, 2 * cut, len(running)):
        _feed(store, running[k - cut : k] if k > cut else [], "running")
        live, packed, read = _poll_reads_no_packed_row(store, name)
        assert len(packed) >= 2 * last  # the finished attempts' processes, resolved too
        assert read == []
        assert result_state(live) == result_state(account(store.snapshot(name), None, NOW))
    # a line of a finished attempt delivered again (a retried export): its rows are
    # unpacked, the duplicates dropped as before
    dups = store.snapshot(name).skipped["duplicate"]
    _feed(store, recorded[0][-3:], "retry")
    live, packed, read = _poll_reads_no_packed_row(store, name)
    assert store.snapshot(name).skipped["duplicate"] > dups
    assert result_state(live) == result_state(account(store.snapshot(name), None, NOW))
    if on_disk:  # the job leaves (idle since a request: retention counts from those)
        store.ingest_json(json.loads(recorded[0][-1]), ("request",))
        store.retention_s = 60.0
        assert [r.job for r in store.retire_idle(now_s=time.time() + 61)] == [name]
        assert list(spill_dir.iterdir()) == [] and spill.disk_bytes == 0


def test_packed_rows_whose_file_went_fail_their_job_alone(recorded, tmp_path):
    """A spill file removed while rows are kept in it: the accounting that reads them back
    reports that job failed, naming the file, and another job carries on."""
    spill = Spill(tmp_path / "spill")
    store = LiveStore(min_interval_s=0, spill=spill)
    for attempt, lines in recorded.items():
        _feed(store, lines, f"a{attempt}")
    other = [line.replace(b'"recorded"', b'"other"') for line in recorded[0][:200]]
    _feed(store, other, "other")
    assert sorted(store.jobs()) == ["other", "recorded"]
    for name in store.jobs():  # (the store's own rows, as a poll takes them; nothing
        store.snapshot(name)  # accounted yet: no memo to answer from)
    store.compact(min_quiet_s=0, min_rows=0)
    assert spill.disk_bytes > 0
    for path in (tmp_path / "spill").iterdir():
        if path.name.startswith("recorded"):
            path.unlink()
    results = {r.job: r for r in store.results(now_ns=NOW)}
    assert results["recorded"].error is not None and "spill" in results["recorded"].error
    assert results["other"].error is None and results["other"].total_time_s > 0


def test_spill_directory_of_its_own_is_removed_on_close():
    """``Spill()`` makes a private directory under the temporary directory; ``close``
    removes it with its files; packed rows that cannot be written stay in memory."""
    spill = Spill()
    store = LiveStore(spill=spill)
    packed = pack_rows(np.arange(12, dtype=np.int64).reshape(4, 3))
    assert spill.put("job", packed) == sum(packed.columns.lengths) > 0
    assert np.array_equal(unpack_rows(packed), np.arange(12).reshape(4, 3))
    directory = Path(spill.directory)
    assert [p.name for p in directory.iterdir()] == [p.name for p in directory.glob("job-*")]
    store.spill.close()
    assert not directory.exists()
    again = pack_rows(np.ones((2, 2), np.int64))
    assert spill.put("job", again) == 0 and isinstance(again.columns, list)


def test_spill_dir_option(tmp_path, capsys):
    """``goodput serve --spill-dir`` takes a directory it can make, ``auto`` or ``off``."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["serve", "--grpc-port", "off", "--http-port", "off", "--spool-dir",
                 str(tmp_path), "--spill-dir", str(blocker / "sub")]) == 2
    assert "cannot use --spill-dir" in capsys.readouterr().err


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


def test_the_heap_is_given_back_once_after_the_first_accounting_after_a_compaction(
        recorded):
    """The first accounting of each memo after a compaction lets go of what the memo held
    from before it (freed to glibc's heap without the process growing): the next
    :meth:`LiveStore.give_back_heap` trims whatever the process grew by, once per memo;
    with nothing compacted, it trims only when the process has grown."""
    from goodput_processor.read.heap import trim_heap

    store = LiveStore(min_interval_s=0, pack_after_s=0.0)
    for attempt, lines in recorded.items():
        _feed(store, lines, f"a{attempt}")
    store.results(now_ns=NOW)
    store.snapshot_windows("recorded", (60,), now_ns=NOW)
    trim_heap()  # (the mark the growth is measured from: now)
    assert store.give_back_heap() is False  # nothing compacted, nothing grown
    assert store.compact() > 0
    assert store.give_back_heap() is False  # (compaction trims itself; nothing accounted)
    store.results(now_ns=NOW + 1)
    assert store.give_back_heap() is True  # the report's memo let go of its old results
    assert store.give_back_heap() is False
    store.snapshot_windows("recorded", (60,), now_ns=NOW + 1)
    assert store.give_back_heap() is True  # ... and the windows' memo
    store.results(now_ns=NOW + 2)
    assert store.give_back_heap() is False  # once per memo and compaction


def test_pack_after_option(tmp_path, capsys):
    """``goodput serve --pack-after`` takes seconds >= 0 or ``off``."""
    assert main(["serve", "--grpc-port", "off", "--http-port", "off", "--spool-dir",
                 str(tmp_path), "--pack-after", "-1"]) == 2
    assert "--pack-after must be a number >= 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="pack_after_s"):
        LiveStore(pack_after_s=-1)
