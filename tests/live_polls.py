"""A live job polled batch by batch, for the tests that compare it with accounting afresh.

:func:`arrivals` draws a :func:`random_jobs.loop_jobs` job and the order its rows arrive in
(batches of ``(process key, row index)``); :func:`take_batch` and :func:`store_snapshot`
give the job as a store holds it after some batches; :func:`result_state` is what two
accountings must agree on; :func:`pieces_of` cuts running attempts into small pieces.
Used by tests/model/ (incremental, restart rows), tests/analysis/ (running arrivals),
tests/definitions/ (mgm incremental) and tests/serve/ (packing).
"""

from __future__ import annotations

import contextlib

import numpy as np
from hypothesis import strategies as st
from random_jobs import MS, loop_jobs

from goodput_processor import to_json_dict
from goodput_processor.analysis import slow_hosts
from goodput_processor.model import pieces
from goodput_processor.read.rows import (
    C_END,
    C_START,
    NCOLS,
    JobSpans,
    ProcessSpans,
    drop_duplicates,
)


def result_state(r) -> tuple:
    """What two accountings of a job must agree on: the JSON report of result ``r`` and
    its per-step arrays (step, attempt, start ns, time ns, count, anomalous) as lists."""
    steps = tuple(np.asarray(a).tolist() for a in (
        r.steps.step, r.steps.attempt, r.steps.start_ns, r.steps.time_ns, r.steps.count,
        r.steps.anomalous))
    return to_json_dict([r]), steps


@st.composite
def arrivals(draw):
    """A job, and the order its rows arrive in: ``[(process key, row)]`` cut in batches."""
    job = draw(loop_jobs())
    rows = [(key, i) for key, p in job.processes.items() for i in range(len(p.data))]
    order = draw(st.permutations(rows))
    dups = draw(st.lists(st.sampled_from(rows), max_size=4)) if rows else []
    order = list(order) + dups  # exact duplicates, arriving again later
    cuts = sorted(draw(st.lists(st.integers(0, len(order)), max_size=6)))
    batches = [order[a:b] for a, b in zip([0, *cuts], [*cuts, len(order)], strict=True)]
    return job, [b for b in batches if b]


def store_snapshot(job: JobSpans, seen: dict, identity: bool = False) -> JobSpans:
    """The job as a store holds it after the rows in ``seen``: each process's rows in
    arrival order, duplicates dropped (the first kept); ``identity``: each process with an
    OS process identity (instance, pid, start: its open records are then resolved a batch
    at a time, :mod:`goodput_processor.model.open_records`)."""
    out = JobSpans(job.name, strings=job.strings)
    for key, idx in seen.items():
        p = job.processes[key]
        data, _ = drop_duplicates(p.data[idx]) if idx else (np.zeros((0, NCOLS), np.int64), 0)
        os_process = {}
        if identity:
            os_process = {"instance": f"a{key[0]}p{key[1]}{key[2]}", "pid": 100 + key[1],
                          "process_start_ns": int(p.data[:, C_START].min())}
        out.processes[key] = ProcessSpans(p.job, p.attempt, p.index, host=p.host,
                                          process_count=p.process_count, data=data,
                                          **os_process)
    return out


@contextlib.contextmanager
def pieces_of(rows: int | None, spare: int | None = None):
    """Running attempts cut into pieces of at least ``rows`` rows (None: the default), the
    last rows of the attempt included, so that small jobs are cut too; with ``spare``, the
    slowdown attribution keeps that many spare candidate steps (0: a part's steps are read
    again whenever the threshold falls below its slowest unkept step)."""
    saved = pieces.PIECE_ROWS, pieces._KEEP_LAST, slow_hosts.SPARE_CANDIDATES
    if rows is not None:
        pieces.PIECE_ROWS, pieces._KEEP_LAST = rows, 0
    if spare is not None:
        slow_hosts.SPARE_CANDIDATES = spare
    try:
        yield
    finally:
        pieces.PIECE_ROWS, pieces._KEEP_LAST, slow_hosts.SPARE_CANDIDATES = saved


def take_batch(job: JobSpans, seen: dict, batch, running: bool,
          identity: bool = False) -> tuple[JobSpans, int]:
    """The job after ``batch`` arrived (``seen``: the rows so far, updated; ``identity``:
    see :func:`store_snapshot`), and the poll's now: just after its last row (running) or long
    after."""
    for key, i in batch:
        seen.setdefault(key, []).append(i)
    snap = store_snapshot(job, seen, identity)
    last = max(int(p.data[:, C_END].max()) for p in snap.processes.values() if len(p.data))
    return snap, last + (MS if running else 10**12)
