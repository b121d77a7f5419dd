"""The launcher's rendezvous matched to the restart it preceded (``launcher_rendezvous_s``),
on spools with the times real ``python -m goodput.torchrun`` restarts gave.

Seen on real restarts (``benchmarks/launchers.py --cases torchrun_restart_phases``): the
agent's ``torchelastic.worker.status.RENDEZVOUS`` event ends a few ms *after* the next
attempt's recorded start, because that start is the workers' OS process start read from
``/proc`` in 10 ms ticks, rounded down; and torchelastic's zero-length
``torchelastic.rendezvous.*`` state records name a rendezvous too. Matched in a window that
ended at the recorded start, the report said 0.0 s (only the zero-length records were in
it) in 3 of 7 restarts. The real restarts themselves are in ``tests/end_to_end/test_launchers.py``.
"""

from __future__ import annotations

import pytest
from otlp_fixtures import Timeline

from goodput import schema
from goodput_processor.account.run_dir import report_run_dir
from goodput_processor.analysis.launcher_events import LAUNCHER_MATCH_NS

RDZV = "torchelastic.worker.status.RENDEZVOUS"
#: torchelastic's rendezvous state records, as goodput.torchrun writes them (zero length)
STATES = ("torchelastic.rendezvous.RUNNING:dynamic_rendezvous.py:DynamicRendezvousHandler."
          "next_rendezvous",
          "torchelastic.rendezvous.SUCCEEDED:dynamic_rendezvous.py:_DistributedRendezvousOp"
          "Executor._mark_rendezvous_complete")


def _job(d, starts, events, *, agents=1):
    """One rank per attempt, attempt ``i`` from ``starts[i]`` (s) for 4 s (steps of 1 s;
    killed, except the last, which ends). ``events``: ``(agent, name, start, end)`` launcher
    events (s) of ``agents`` launcher processes (one per node)."""
    for i, s in enumerate(starts):
        tl = Timeline(attempt=i, process=0, count=1, host="node0", **{
            schema.RES_PROCESS_PID: 100 + i, schema.RES_SERVICE_INSTANCE_ID: f"w{i}",
            schema.RES_PROCESS_START: Timeline().ns(s)})
        tl.job_start(s).steps(1 + 3 * i, 3 + 3 * i, s + 1, 1.0)
        if i == len(starts) - 1:
            tl.job_end(s + 4)
        else:
            tl.heartbeat(s + 3.5, s + 4)
        tl.write(d)
    for a in range(agents):
        tl = Timeline(process=0, host=f"node{a}", **{
            schema.RES_PROCESS_ROLE: "launcher", schema.RES_PROCESS_PID: 90 + a,
            schema.RES_SERVICE_INSTANCE_ID: f"agent{a}",
            schema.RES_PROCESS_START: Timeline().ns(starts[0] - 3)})
        tl.job_start(starts[0] - 3)
        for who, name, t0, t1 in events:
            if who == a:
                tl.span(schema.LAUNCHER_EVENT, t0, t1, {schema.ATTR_LAUNCHER_EVENT: name})
        tl.heartbeat(starts[-1], starts[-1] + 4).write(d)
    (r,) = report_run_dir(d)
    return r


def _rdzv(r) -> list:
    return [rec.evidence.get("launcher_rendezvous_s") for rec in r.recovery]


def test_the_agent_event_ending_after_the_recorded_start_is_kept(tmp_path):
    """The real case: the agent's rendezvous took 0.177 s and ended 6 ms after the next
    attempt's recorded start, with zero-length state records inside the gap."""
    r = _job(tmp_path, [0, 6], [
        (0, RDZV, -1, -0.5),  # the first attempt's rendezvous: not the restart's
        (0, STATES[0], 4.3, 4.3), (0, RDZV, 5.829, 6.006), (0, STATES[1], 5.9, 5.9)])
    assert _rdzv(r) == [pytest.approx(0.177, abs=1e-9)]


def test_zero_length_records_alone_give_no_duration(tmp_path):
    """Only torchelastic's zero-length state records: no duration was recorded, so the
    evidence has none (not 0.0)."""
    r = _job(tmp_path, [0, 6], [(0, STATES[0], 4.3, 4.3), (0, STATES[1], 5.9, 5.9)])
    assert _rdzv(r) == [None]


def test_no_launcher_no_evidence(tmp_path):
    r = _job(tmp_path, [0, 6], [], agents=0)
    assert _rdzv(r) == [None]


@pytest.mark.parametrize("after_ms", [-15.2, -0.5, 0.0, 3.2, 6.0, 9.9])
def test_each_restart_gets_its_own_rendezvous(tmp_path, after_ms):
    """Three attempts; the agent's rendezvous before each restart ends ``after_ms`` from
    that restart's recorded start (the spread seen on 10 real restarts, and a whole tick):
    each goes to its own restart, once."""
    late = after_ms / 1000
    r = _job(tmp_path, [0, 6, 12], [
        (0, RDZV, -1, -0.5), (0, RDZV, 5.7, 6 + late), (0, RDZV, 11.5, 12 + late)])
    assert _rdzv(r) == [pytest.approx(0.3 + late, abs=1e-9),
                        pytest.approx(0.5 + late, abs=1e-9)]


def test_an_event_ending_past_the_clock_resolution_is_the_next_restarts(tmp_path):
    """An event ending more than one tick (+1 ms) after a start cannot have preceded it:
    it belongs to the next attempt (here: none)."""
    past = LAUNCHER_MATCH_NS / 1e9 + 0.002
    r = _job(tmp_path, [0, 6], [(0, RDZV, 5.5, 6 + past)])
    assert _rdzv(r) == [None]


def test_agents_of_several_nodes_count_once(tmp_path):
    """Two agents (two nodes) wait in the same rendezvous: the union of their events, not
    the sum."""
    r = _job(tmp_path, [0, 6], [(0, RDZV, 5.5, 5.9), (1, RDZV, 5.6, 6.004)], agents=2)
    assert _rdzv(r) == [pytest.approx(0.504, abs=1e-9)]
