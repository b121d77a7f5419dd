"""``--definitions ettr``: Meta's effective training time ratio and ETT%
(``goodput_processor.definitions.ettr``).

The worked example is the paper's own (Kokolis et al., "Revisiting Reliability in Large-Scale
Machine Learning Research Clusters", HPCA 2025, arXiv:2410.21680, section "Quantifying ETTR
for large-scale training"): RSC-1's failure rate, r_f = 6.50 failures per 1,000 node-days; a
hypothetical job of 16,000 GPUs (2,000 nodes of 8) taking the whole cluster; restart overhead
u0 = 5 min; checkpoints every 60 min give an expected ETTR of 0.7, every 5 min 0.93
(checkpoint writes not blocking). Its figures of MTTF: 1.8 h at 16,384 GPUs, 0.23 h at
131,072. Here they come out of the closed form, and out of ``goodput report --definitions
ettr`` on a timeline that realises the model: a failure every MTTF, each losing half a
checkpoint interval of work and costing u0 to restart.
"""

from __future__ import annotations

import json

import pytest
from cli_util import goodput
from otlp_fixtures import Timeline
from test_definitions_doc import FAR_FUTURE, MIN, example_2, load

from goodput import schema
from goodput_processor.definitions import report
from goodput_processor.definitions.ettr import account_ettr, expected_ettr

RSC1 = 6.50e-3  # failures per node-day
NODES = 16_000 // 8
U0 = 5 * MIN


def test_the_papers_figures_from_the_closed_form():
    mttf_h = lambda gpus: 24 / (gpus / 8 * RSC1)  # noqa: E731 - MTTF = 1 / (N r_f)
    assert round(mttf_h(16_384), 1) == 1.8
    assert round(mttf_h(131_072), 2) == 0.23
    hourly = expected_ettr(NODES, RSC1, U0, 60 * MIN)
    five = expected_ettr(NODES, RSC1, U0, 5 * MIN)
    assert hourly == pytest.approx(1 - 13 / 1440 * 35)  # 13 failures/day, 35 min lost each
    assert round(hourly, 1) == 0.7 and round(five, 2) == 0.93
    # 4,096 GPUs with hourly checkpoints: above 0.9 (the paper's jobs of 2-4k GPUs)
    assert expected_ettr(4096 / 8, RSC1, U0, 60 * MIN) > 0.9
    # blocking checkpoint writes stretch each interval
    assert expected_ettr(NODES, RSC1, U0, 5 * MIN, 30) == pytest.approx(five / 1.1)
    with pytest.raises(ValueError):
        expected_ettr(NODES, RSC1, U0, 0)


def _model_job(d, interval_s: float, cycles: int = 3):
    """A failure every MTTF (6,646 s at 2,000 nodes): each attempt restores its checkpoint
    for u0 (5 min), trains until the failure, and loses the half checkpoint interval after its
    last checkpoint (written in the background: not blocking). The next attempt starts at the
    failure. Returns the start of attempt ``cycles`` (the moment to measure at)."""
    mttf = 86_400 / (NODES * RSC1)
    kept, lost = mttf - U0 - interval_s / 2, interval_s / 2
    n = 450  # kept steps per attempt
    tau = kept / n
    step = 0
    for i in range(cycles + 1):
        t0 = i * mttf
        tl = Timeline(attempt=i).job_start(t0).restore(t0, t0 + U0, step=step)
        if i == cycles:
            tl.write(d)
            break
        t = t0 + U0
        for k in range(1, n + 1):
            tl.step(step + k, t + (k - 1) * tau, t + k * tau)
        t += kept
        tl.save(t, t + 1, step=step + n, blocking=False)
        m = 1
        while t + m * tau <= t0 + mttf:  # the lost steps, the last cut by the failure
            tl.step(step + n + m, t + (m - 1) * tau, t + m * tau)
            m += 1
        tl.heartbeat(t0 + mttf - 1, t0 + mttf).write(d)
        step += n
    assert lost > 0
    return Timeline().ns(cycles * mttf)


@pytest.mark.parametrize("interval_min, paper", [(60, 0.7), (5, 0.93)])
def test_the_papers_example_on_a_timeline(tmp_path, interval_min, paper):
    at = _model_job(tmp_path, interval_min * MIN)
    (r,) = report(tmp_path, "ettr", at_ns=at)
    want = expected_ettr(NODES, RSC1, U0, interval_min * MIN)
    assert r.ettr == pytest.approx(want, abs=1e-6)
    assert round(r.ettr, 1 if interval_min == 60 else 2) == paper
    assert r.disruptions == 3 and r.queue_time_s is None and not r.queue_known
    assert r.ett_percent == pytest.approx(100 * r.ettr)  # no pod times: W = E2E = the total
    # u0 (restore) plus the half interval lost, per failure, is what ETTR loses
    mttf = 86_400 / (NODES * RSC1)
    assert r.wallclock_s == pytest.approx(3 * mttf)
    assert r.unproductive_runtime_s == pytest.approx(3 * (U0 + interval_min * MIN / 2))
    # the mean restart overhead: u0 for the first two; the third restart is cut at its start
    assert r.restart_overhead_s == pytest.approx((U0 + U0 + 0) / 3)
    # the command line: table and JSON
    p = goodput("report", tmp_path, "--definitions", "ettr", "--at", f"{at / 1e9:.9f}",
                "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["definitions"] == "ettr"
    assert doc["jobs"][0]["ettr"] == pytest.approx(want, abs=1e-6)
    p = goodput("report", tmp_path, "--definitions", "ettr", "--at", f"{at / 1e9:.9f}")
    assert "ETTR = R / W" in p.stdout and f"{want:.4f}" in p.stdout


def _pods(tl, created, scheduled):
    tl.resource[schema.RES_K8S_POD_CREATED] = tl.ns(created)
    tl.resource[schema.RES_K8S_POD_SCHEDULED] = tl.ns(scheduled)
    return tl


def test_docs_example_2_with_and_without_queueing(tmp_path):
    """docs/definitions.md: the resiliency primer (minutes). R = kept steps = 100 + 25 (the
    slow steps count: they consumed new data); W = 200: ETTR 0.625, ETT% 62.5. With pod
    times (created 20 min before the start, scheduled 5 min before it): W = 220, E2E = 205."""
    job = load(tmp_path / "plain", *example_2())
    r = account_ettr(job, 2 * MIN, now_ns=FAR_FUTURE)
    assert (r.ettr, r.ett_percent) == (pytest.approx(0.625), pytest.approx(62.5))
    assert r.productive_runtime_s == pytest.approx(125 * MIN)
    assert r.goodput == pytest.approx(0.5)
    a0, a1 = example_2()
    job = load(tmp_path / "queued", _pods(a0, -20, -5), a1)
    q = account_ettr(job, 2 * MIN, now_ns=FAR_FUTURE)
    assert q.queue_time_s == pytest.approx(15 * MIN) and q.queue_known and q.allocation_known
    assert q.wallclock_s == pytest.approx(220 * MIN) and q.e2e_s == pytest.approx(205 * MIN)
    assert f"{q.ettr:.4f}" == "0.5682" and f"{q.ett_percent:.2f}" == "60.98"


def test_exclusions_are_refused(tmp_path):
    load(tmp_path, *example_2())
    with pytest.raises(ValueError, match="ettr"):
        report(tmp_path, "ettr", exclusions_ns=[(0, 1)])
    p = goodput("report", tmp_path, "--definitions", "ettr", "--exclude", "0,1")
    assert p.returncode == 2 and "not defined for --definitions ettr" in p.stderr
