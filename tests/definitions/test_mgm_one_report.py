"""One ``goodput report --definitions mgm``: the rows read for it go once each attempt's
events are taken (smallest attempt first), each column of the attempts' events once
merged, and the JSON's step deviations are written a piece at a time; the numbers and the
text are those of accounting rows that are kept and of one JSON document."""

from __future__ import annotations

import io
import json

import pytest
from mgm_oracle import random_scenario
from otlp_fixtures import Timeline

from goodput_processor import definitions, read_run_dir
from goodput_processor.cli import main
from goodput_processor.definitions import NoResult, report, to_json, write_json
from goodput_processor.definitions.mgm import account_mgm
from goodput_processor.definitions.mgm_exclusion import account_mgm_excluding
from goodput_processor.read.rows import C_END


def _run(tmp_path, seed):
    d = tmp_path / f"s{seed}"
    for tl in random_scenario(seed).timelines:
        tl.write(d)
    return d


@pytest.mark.parametrize("seed", range(8))
def test_one_report_equals_accounting_kept_rows(tmp_path, seed, monkeypatch):
    monkeypatch.setenv("GOODPUT_REPORT_CACHE", "0")
    d = _run(tmp_path, seed)
    (job,) = read_run_dir(d).jobs.values()
    kept = account_mgm(job)  # rows not owned: left as they are
    assert all(len(p.data) for p in job.processes.values())
    (got,) = report(d, "mgm")  # rows owned by this one accounting: dropped on the way
    assert got.to_json_dict() == kept.to_json_dict()
    job.rows_owned = True
    again = account_mgm(job)
    assert again.to_json_dict() == kept.to_json_dict()
    assert not any(len(p.data) for p in job.processes.values())


def test_attempts_taken_smallest_first_keep_the_attempts_order(tmp_path, monkeypatch):
    """Attempts of 30, 4 and 12 steps, each with its own custom badput type: taken smallest
    first, the stream and the custom types are still in attempt order (the JSON text, key
    order included, is that of rows kept); the same where each attempt's job start comes
    before the end of the one before (its start is taken at that end: the attempts' events
    meet at one instant and are merged by sorting)."""
    monkeypatch.setenv("GOODPUT_REPORT_CACHE", "0")
    for overlap in (False, True):
        d, t, first = tmp_path / f"o{overlap}", 0.0, 0
        for attempt, (n, kind) in enumerate([(30, "eval"), (4, "data_wait"), (12, "profile")]):
            tl = Timeline(job="j", attempt=attempt).job_start(t - (3 if overlap and t else 0))
            tl.steps(first, first + n - 1, start=t + 1, step_time=1 + 0.1 * attempt)
            tl.custom(kind, t + 2.3, t + 2.6)  # inside the attempt's second step
            t += 1 + n * (1 + 0.1 * attempt)
            tl.job_end(t).write(d)
            first, t = first + n - 2, t + 2
        (job,) = read_run_dir(d).jobs.values()
        kept = to_json("mgm", [account_mgm(job)])
        assert list(json.loads(kept)["jobs"][0]["custom_badput_s"]) == [
            "EVAL", "DATA_WAIT", "PROFILE"]
        assert to_json("mgm", report(d, "mgm")) == kept


@pytest.mark.parametrize("piece", [1, 3, 1 << 16])
@pytest.mark.parametrize("indent", [2, None])
def test_json_written_a_piece_at_a_time_is_the_one_document(tmp_path, monkeypatch, piece,
                                                            indent):
    monkeypatch.setenv("GOODPUT_REPORT_CACHE", "0")
    results = [r for seed in range(3) for r in report(_run(tmp_path, seed), "mgm")]
    (job,) = read_run_dir(_run(tmp_path, 3)).jobs.values()
    ends = sorted(int(p.data[:, C_END].max()) for p in job.processes.values())
    # and a dict of signed deviations (an exclusion query)
    excluded = account_mgm_excluding(job, [(ends[0] - 10**9, ends[0])])
    assert isinstance(excluded.step_deviation_s, dict) and len(excluded.step_deviation_s) > 3
    results += [NoResult("refused", "mgm", "productive training time is invalid"), excluded]
    assert any(len(r.step_deviation_s) > 3 for r in results[:3])
    monkeypatch.setattr(definitions, "PIECE", piece)
    out = io.StringIO()
    write_json("mgm", results, out, indent)
    assert out.getvalue() == to_json("mgm", results, indent) + "\n"


def test_a_job_without_step_deviation(tmp_path, monkeypatch):
    from otlp_fixtures import Timeline

    Timeline().job_start(0).steps(0, 5, start=1, step_time=0.5).job_end(4).write(tmp_path)
    (r,) = report(tmp_path, "mgm")  # sub-second steps: no ideal step time, no deviation
    assert len(r.step_deviation_s) == 0
    out = io.StringIO()
    write_json("mgm", [r], out)
    assert out.getvalue() == to_json("mgm", [r]) + "\n" and '"step_deviation_s": {}' in \
        out.getvalue()


def test_cli_json_is_the_document(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(definitions, "PIECE", 2)
    d = _run(tmp_path, 5)
    assert main(["report", str(d), "--definitions", "mgm", "--format", "json",
                 "--no-cache"]) == 0
    assert capsys.readouterr().out == to_json("mgm", report(d, "mgm")) + "\n"
