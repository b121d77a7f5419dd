"""Rows read for one report keep only the columns the accounting reads
(``JobSpans.own_rows``): narrowed in the reader's own buffer, which then shrinks; through a
copy where duplicate spans were dropped; not at all where the rows are held in one array
elsewhere (the columnar cache). Either way the report is the one of the full rows."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from mgm_oracle import random_scenario

from goodput_processor import read_run_dir
from goodput_processor.account.accounting import account
from goodput_processor.account.run_dir import report_run_dir
from goodput_processor.definitions import report
from goodput_processor.definitions.mgm import account_mgm
from goodput_processor.read import cache
from goodput_processor.read.rows import ACCOUNT_NCOLS, NCOLS
from goodput_processor.results.report_json import job_to_dict


def _run(tmp_path, seed, duplicated):
    d = tmp_path / f"s{seed}"
    for tl in random_scenario(seed).timelines:
        tl.write(d)
    if duplicated:  # a file delivered twice: every span of that process read twice
        first = sorted(d.glob("*.jsonl"))[0]
        shutil.copy(first, d / ("again-" + first.name))
    return d


@pytest.mark.parametrize("seed", range(6))
def test_narrowed_rows_give_the_report_of_the_full_rows(tmp_path, seed, monkeypatch):
    monkeypatch.setenv("GOODPUT_REPORT_CACHE", "0")
    duplicated = seed % 2 == 1
    d = _run(tmp_path, seed, duplicated)
    (job,) = read_run_dir(d).jobs.values()
    full = {k: p.data.copy() for k, p in job.processes.items()}
    assert all(x.shape[1] == NCOLS for x in full.values())
    want = job_to_dict(account(job))  # rows not owned: all their columns, left as they are
    want_mgm = account_mgm(job).to_json_dict()
    (got,) = report_run_dir(d)
    assert job_to_dict(got) == want
    (got_mgm,) = report(d, "mgm")
    assert got_mgm.to_json_dict() == want_mgm
    if duplicated:
        assert got.skipped.get("duplicate", 0) > 0

    (job,) = read_run_dir(d).jobs.values()
    copied = {k for k, p in job.processes.items()
              if len(p._buf) != p.data.size}  # duplicates dropped: the rows are a copy
    assert bool(copied) == duplicated
    job.own_rows()
    assert job.rows_owned
    for k, p in job.processes.items():
        assert p.data.shape == (len(full[k]), ACCOUNT_NCOLS)
        assert np.array_equal(p.data, full[k][:, :ACCOUNT_NCOLS])
        if k in copied:
            assert len(p._buf) == 0  # the reader's buffer let go
        else:  # in place: the buffer holds the narrow rows and nothing more
            assert len(p._buf) == p.data.size
            assert np.shares_memory(p.data, np.frombuffer(p._buf, np.int64))


def test_rows_of_the_columnar_cache_are_left_whole(tmp_path):
    d = _run(tmp_path, 2, False)
    spans = read_run_dir(d, cache=False)
    assert cache.save(d, sorted(d.rglob("*.jsonl")), spans, now_s=2e9)
    (job,) = read_run_dir(d, cache=True).jobs.values()
    assert all(p.data.base is not None for p in job.processes.values())  # one array's views
    job.own_rows()
    assert all(p.data.shape[1] == NCOLS for p in job.processes.values())
    (fresh,) = spans.jobs.values()
    assert job_to_dict(account(job)) == job_to_dict(account(fresh))
