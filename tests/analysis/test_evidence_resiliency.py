"""Acceptance (issue 36, part 3): observed and inferred apart, on the issue's own case, a
``resiliency`` event log of 112 nodes and 68 launches (``benchmarks/resiliency_logs.py
--nodes 112 --attempts 68 --seed 1``) through the real ``goodput import`` and report.

Nodes other than node 0 log only ``job_started`` (and ``job_terminated`` when they end
cleanly): a node whose only record is its start is never the first to fail, a disruption
is charged as observed only to a process with an observed failure (an end marker, an
exception), the rest are inferred and shown apart (JSON, table); the attempts and the
goodput do not change.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from goodput_processor import read_run_dir
from goodput_processor.account.accounting import _account
from goodput_processor.analysis.attribution import host_badput
from goodput_processor.cli import main
from goodput_processor.read.rows import C_FLAGS, C_KIND, F_ERROR, K_JOB_END, K_JOB_START

#: Attempts and goodput of this log before and after the change (measured on it).
ATTEMPTS, GOODPUT = 68, 0.5199126924820566


@pytest.fixture(scope="module")
def imported(resiliency_112):
    """The log through the real ``goodput import`` (made once per session by
    tests/conftest.py, shared with test_html_report_scale)."""
    return resiliency_112


def test_no_disruption_charged_as_observed_without_an_observed_failure(imported, capsys):
    (job,) = read_run_dir(imported).jobs.values()
    r, attempts, _acc = _account(job, None, None, False)
    assert len(r.attempts) == ATTEMPTS
    assert r.goodput == pytest.approx(GOODPUT, abs=1e-12)
    by = {a.attempt: a for a in attempts}
    observed = 0
    for rec in r.recovery:
        f = rec.first_failure
        procs = by[rec.attempt].processes
        if f.process is None:  # every process of the attempt logged only its start
            assert all((p.data[:, C_KIND] == K_JOB_START).all() for p in procs)
            assert f.evidence == "inferred"
            continue
        (p,) = [p for p in procs if p.index == f.process]
        kinds = p.data[:, C_KIND]
        assert (kinds != K_JOB_START).any(), rec  # never a start-only node
        seen = bool((kinds == K_JOB_END).any() or (p.data[:, C_FLAGS] & F_ERROR).any())
        if f.evidence == "observed":
            observed += 1
            assert seen, rec
        else:
            assert f.how == "missing_heartbeat"
    every = host_badput(attempts, r, r.recovery, top=1000)  # all hosts, not the top 10
    assert sum(h.disruptions_caused for h in every.observed) == observed
    assert sum(h.disruptions_caused for h in every.inferred) == sum(
        x.first_failure.evidence == "inferred" and x.first_failure.process is not None
        for x in r.recovery)
    assert r.host_badput == every.observed[:10]
    assert all(h.evidence == "inferred" for h in r.host_badput_inferred)
    c = r.badput_charged
    assert c["observed_ns"] + c["inferred_ns"] + c["unattributed_ns"] == c["total_badput_ns"]
    # the JSON and the table say so
    assert main(["report", str(imported), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)["jobs"][0]
    assert doc["goodput"] == pytest.approx(GOODPUT, abs=1e-12) and len(doc["attempts"]) == 68
    assert sum(x["first_failure"]["evidence"] == "observed" for x in doc["recovery"]) == observed
    assert all(h["evidence"] == "inferred" for h in doc["host_badput_inferred"])
    assert all(h["evidence"] == "observed" for h in doc["host_badput"])
    assert main(["report", str(imported)]) == 0
    table = capsys.readouterr().out
    top = table.split("top hosts by badput caused (observed):")[1].split("inferred, not")[0]
    assert "inferred" not in top
    assert "inferred, not ranked above" in table
    starts_only = {p.index for a in attempts for p in a.processes
                   if (p.data[:, C_KIND] == K_JOB_START).all()}
    assert starts_only and np.all([rec.first_failure.process not in starts_only or any(
        p.index == rec.first_failure.process and (p.data[:, C_KIND] != K_JOB_START).any()
        for p in by[rec.attempt].processes) for rec in r.recovery])
