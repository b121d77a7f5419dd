"""The recovery phase between a restart's first mark and its first kept step is named for
what it is: ``initialization`` when the attempt that took over had one process (no
rendezvous took place), ``rendezvous_init`` otherwise. The JSON key stays
``phases_s.rendezvous_init``; ``phase_labels`` gives the name shown, in the table and the
HTML. (The real one-process restarts: ``tests/instrumentation/test_instr_jax.py``, a JAX/Orbax
crash.)
"""

from __future__ import annotations

import json

import pytest
from cli_util import goodput
from otlp_fixtures import Timeline

from goodput_processor.account.run_dir import report_run_dir
from goodput_processor.analysis.recovery import ONE_PROCESS_INIT
from goodput_processor.html.sections import recovery_html


def _restarts(d, worlds):
    """One attempt per entry of ``worlds`` (its number of ranks), 10 s apart: init 1 s,
    steps 1 s each from step 1 (the first attempt) or after a restore; all but the last
    fall silent."""
    step = 0
    for i, world in enumerate(worlds):
        t0 = 10 * i
        for rank in range(world):
            tl = Timeline(attempt=i, process=rank, count=world).job_start(t0)
            tl.span("accelerator_init", t0 + 0.5, t0 + 1.5)
            if i:
                tl.restore(t0 + 1.5, t0 + 2, step=step)
            tl.steps(step + 1, step + 4, t0 + 2, 1.0)
            if i == len(worlds) - 1:
                tl.job_end(t0 + 6)
            else:
                tl.heartbeat(t0 + 5, t0 + 6)
            tl.write(d)
        step += 4
    return d


def test_a_one_process_restart_is_initialization(tmp_path):
    run = _restarts(tmp_path / "run", [1, 1])
    (r,) = report_run_dir(run)
    (rec,) = r.recovery
    assert rec.labels == {"rendezvous_init": ONE_PROCESS_INIT}
    assert rec.label("rendezvous_init") == "initialization" and rec.label("restore") == "restore"
    assert rec.phases["rendezvous_init"] == pytest.approx(1.0)  # the key is stable
    out = goodput("report", run, "--format", "json")
    (rj,) = json.loads(out.stdout)["jobs"][0]["recovery"]
    assert rj["phase_labels"] == {"rendezvous_init": "initialization"}
    assert rj["phases_s"]["rendezvous_init"] == pytest.approx(1.0)
    table = goodput("report", run).stdout
    assert "initialization 1.00 s" in table and "rendezvous_init" not in table
    html = recovery_html(r)
    assert "initialization" in html and "rendezvous_init" not in html


def test_a_restart_of_several_processes_keeps_rendezvous_init(tmp_path):
    run = _restarts(tmp_path / "run", [2, 2])
    (r,) = report_run_dir(run)
    (rec,) = r.recovery
    assert rec.labels == {} and rec.label("rendezvous_init") == "rendezvous_init"
    assert "rendezvous_init 1.00 s" in goodput("report", run).stdout
    assert "initialization" not in recovery_html(r)


def test_restarts_of_both_kinds_name_each_its_own(tmp_path):
    """2 ranks, then 1, then 2 again (world size changed twice): each record names its own
    phase; the HTML columns join the names."""
    run = _restarts(tmp_path / "run", [2, 1, 2])
    (r,) = report_run_dir(run)
    assert [rec.label("rendezvous_init") for rec in r.recovery] == [
        "initialization", "rendezvous_init"]
    assert "initialization / rendezvous_init" in recovery_html(r)
