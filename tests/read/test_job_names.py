"""A job name sent as an int, a bool or a float is never the job of the same text sent as
a string (issue 38: ``5`` and ``"5"``, ``true`` and ``"True"``, ``1.0`` and ``"1.0"`` were
one job)."""

from __future__ import annotations

import json

from goodput import schema
from goodput_processor.read.reader import read_run_dir

S = 1_000_000_000
T0 = 1_700_000_000 * S


def _line(name_value: dict, n: int) -> str:
    res = {"attributes": [{"key": schema.RES_JOB_NAME, "value": name_value},
                          {"key": schema.RES_SCHEMA_VERSION,
                           "value": {"stringValue": schema.SCHEMA_VERSION}}]}
    span = {"traceId": "%032x" % (n + 1), "spanId": "%016x" % (n + 1), "name": schema.STEP,
            "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + S),
            "attributes": [{"key": schema.ATTR_STEP, "value": {"intValue": "1"}}]}
    return json.dumps({"resourceSpans": [{"resource": res, "scopeSpans": [
        {"scope": {"name": schema.SCOPE_NAME}, "spans": [span]}]}]})


def test_typed_job_names_are_apart(tmp_path):
    values = [{"intValue": "5"}, {"stringValue": "5"}, {"boolValue": True},
              {"stringValue": "True"}, {"doubleValue": 1.0}, {"stringValue": "1.0"}]
    (tmp_path / "spans-p00000-a0000.jsonl").write_text(
        "\n".join(_line(v, i) for i, v in enumerate(values)) + "\n")
    jobs = read_run_dir(tmp_path, cache=False).jobs
    assert sorted(jobs) == ["1.0", "5", "True", "bool:True", "float:1.0", "int:5"]
    assert all(len(j.processes) == 1 for j in jobs.values())


def test_spans_at_the_int64_limit_are_named(tmp_path):
    """A job whose spans all lie at 2^63 - 1 ns (a sentinel, not a time) gets the
    clock_jump warning instead of a silent goodput of 0 (issue 38)."""
    from goodput_processor.account.accounting import account

    end = 2**63 - 1
    line = _line({"stringValue": "sentinel"}, 0).replace(str(T0 + S), str(end)).replace(
        str(T0), str(end))
    (tmp_path / "spans-p00000-a0000.jsonl").write_text(line + "\n")
    r = account(read_run_dir(tmp_path, cache=False).jobs["sentinel"])
    assert [w.code for w in r.warnings] == ["clock_jump"]
    assert "2^63 - 1" in r.warnings[0].message
