"""Issue 36 parts 5 and 6, on the recording side.

Part 5, the resource tells the truth: a real ``torch.multiprocessing.spawn`` job (2 ranks,
gloo on the CPU, no ``RANK`` variable). With ``goodput.configure()`` after
``init_process_group`` every span's resource carries the rank (index source ``framework``);
with it before, the spans after the rank is learned do, in the same spool file, and the
processor still reads one process per file. A filter on ``goodput.process.index`` finds each
rank's own steps.

Part 6, warnings with evidence: one log line at the first record saying where the spool is
when the default job name or run directory is used; a warning when ``configure`` comes
after phases were already recorded, saying what happened and what to do.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from goodput import schema
from goodput_processor.account.run_dir import report_run_dir
from goodput_processor.read.reader import _Reader

HERE = Path(__file__).resolve().parents[1]  # tests/


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lines(path: Path):
    """(resource attributes, span names, step numbers) of each line of a spool file."""
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            res = {a["key"]: int(a["value"]["intValue"]) if "intValue" in a["value"]
                   else next(iter(a["value"].values())) for a in rs["resource"]["attributes"]}
            spans = [s for ss in rs["scopeSpans"] for s in ss["spans"]]
            names = [s["name"] for s in spans]
            steps = []
            for s in spans:
                attrs = {a["key"]: a["value"] for a in s.get("attributes", [])}
                if s["name"] == schema.STEP and schema.ATTR_OPEN not in attrs:
                    steps.append(int(attrs[schema.ATTR_STEP]["intValue"]))
            yield res, names, steps, spans


def _identity(spans) -> int | None:
    for s in spans:
        if s["name"] == schema.IDENTITY:
            attrs = {a["key"]: a["value"] for a in s["attributes"]}
            return int(attrs[schema.RES_PROCESS_INDEX]["intValue"])
    return None


@pytest.mark.skipif(importlib.util.find_spec("torch") is None
                    or not sys.platform.startswith("linux"), reason="needs torch (gloo)")
@pytest.mark.parametrize("mode", ["before", "after"])
def test_spawned_ranks_resources_carry_their_rank(tmp_path, mode) -> None:
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and not k.startswith("GOODPUT_")}
    out = subprocess.run([sys.executable, str(HERE / "spawn_identity_child.py"), str(run),
                          str(_free_port()), mode], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "END" in out.stdout, out.stderr[-3000:]
    files = sorted(run.glob("*.jsonl"))
    assert len(files) == 2
    by_index: dict[int, list[int]] = {}  # what a backend filter on the index finds
    ranks = set()
    for f in files:
        rank = None
        for res, _names, steps, spans in _lines(f):
            rank = _identity(spans) if rank is None else rank
            index = res[schema.RES_PROCESS_INDEX]
            if rank is not None:  # the rank is known: every span from here says it
                assert index == rank, (f.name, res)
                assert res[schema.RES_PROCESS_INDEX_SOURCE] == "framework"
                assert res[schema.RES_PROCESS_COUNT] == 2
            else:  # before: what the environment said (nothing: 0)
                assert mode == "before"
                assert (index, res[schema.RES_PROCESS_INDEX_SOURCE]) == (0, "default")
            by_index.setdefault(index, []).extend(steps)
        assert rank is not None, f.name
        ranks.add(rank)
        if mode == "after":  # known at configure: the file's name says it too
            assert f.name.startswith(f"spans-p{rank:05d}-")
    assert ranks == {0, 1}
    # each rank's 6 steps are found under its own index, and only there
    assert {i: sorted(s) for i, s in by_index.items() if s} == {0: list(range(6)),
                                                                1: list(range(6))}
    # the processor: one attempt of 2 processes, not 3 or 4
    (job,) = report_run_dir(run)
    if mode == "before":  # also read in two ranges, cut where the resource changes
        for f in files:
            _one_process_in_two_ranges(f)
    assert [a.processes for a in job.attempts] == [2]
    assert job.disruptions == 0 and job.max_productive_step == 5
    assert job.recorder_errors == 0


def _one_process_in_two_ranges(path: Path) -> None:
    """The file read in two ranges, cut before the first line with the rank in its
    resource, by one reader (a tailing reader reads on), then by two merged (parallel
    ranges): one process either way (the reader maps a resource's ``service.instance.id``
    to the process it already has)."""
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    cut = next(i for i, ln in enumerate(lines) if b'"framework"' in ln)
    at = sum(len(ln) for ln in lines[:cut])
    one = _Reader()
    one.read_range(str(path), 0, at)
    one.read_range(str(path), at, None)
    one.finish()
    a, b = _Reader(), _Reader()
    a.read_range(str(path), 0, at)
    b.read_range(str(path), at, None)
    a.merge(b, cut, a.last_job)
    a.finish()
    for reader in (one, a):
        (job,) = reader.jobs.values()
        assert len(job.processes) == 1, list(job.processes)


# --- part 6 ---------------------------------------------------------------------------------


def _script(tmp_path: Path, code: str, env: dict | None = None) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GOODPUT_", "OTEL_"))}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path,
                         env={**base, **(env or {})}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_a_script_that_never_configures_says_where_its_spool_is(tmp_path) -> None:
    stderr = _script(tmp_path, """
        import goodput
        for n in range(3):
            with goodput.step(n):
                pass
    """)
    where = tmp_path / "goodput-runs" / "goodput-job"
    assert stderr.splitlines() == [
        f"goodput: recording job 'goodput-job' to {where} (the default job name; set "
        "goodput.configure(job_name=..., run_dir=...) or GOODPUT_JOB_NAME / GOODPUT_RUN_DIR)"]
    assert list(where.glob("spans-*.jsonl"))


def test_the_default_run_dir_is_said_once_and_an_explicit_one_not(tmp_path) -> None:
    stderr = _script(tmp_path, """
        import goodput
        goodput.configure("mine")
        with goodput.step(0):
            pass
        goodput.job_start()  # a second attempt: not said again
    """)
    assert stderr.count("goodput: recording job 'mine' to ") == 1, stderr
    assert "(the default run directory;" in stderr
    assert _script(tmp_path, """
        import goodput
        goodput.configure("mine", run_dir="elsewhere")
        with goodput.step(0):
            pass
    """) == ""
    assert _script(tmp_path, """
        import goodput
        goodput.configure()
        with goodput.step(0):
            pass
    """, {"GOODPUT_JOB_NAME": "env-job", "GOODPUT_RUN_DIR": "env-dir"}) == ""


def test_configure_after_phases_were_recorded_says_so(tmp_path) -> None:
    stderr = _script(tmp_path, """
        import goodput
        with goodput.step(0):
            pass
        goodput.configure("late", run_dir="late-dir")
        with goodput.step(1):
            pass
    """)
    warned = [ln for ln in stderr.splitlines() if "configure() called after" in ln]
    assert warned == [
        "goodput: configure() called after 1 phase(s) were recorded with the defaults "
        "(goodput.configure() had not been called yet): they stay in job 'goodput-job' in "
        "goodput-runs/goodput-job, and what follows goes to job 'late' in late-dir: the run "
        "is split into two jobs. Call goodput.configure() once, before the first phase."]
    stderr = _script(tmp_path, """
        import goodput
        goodput.configure("same", run_dir="d")
        with goodput.step(0):
            pass
        goodput.configure("same", run_dir="d")
    """)
    assert "a new attempt of job 'same' in d begins: the report shows a restart" in stderr
    assert _script(tmp_path, """
        import goodput
        goodput.configure("same", run_dir="d")
        goodput.configure("same", run_dir="d")  # nothing recorded in between: silent
    """) == ""
