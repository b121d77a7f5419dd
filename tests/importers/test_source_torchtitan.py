"""The ``torchtitan`` source: torchtitan 0.3.0's structured logs as goodput spans.

The data under ``tests/data/sources/torchtitan/`` are the real structured logs of
torchtitan's own trainer (``torchtitan.train.main``) on CPU: two ranks under ``torchrun
--max-restarts 1``, rank 0 SIGKILLed at the start of step 19, both restarted from the
checkpoint of step 16 and trained to step 24; ``truth.json`` holds the driver's own
fsync'd clock reads (``regenerate.py --restart torchrun`` made both). The tests on that
data always run. The LIVE test runs torchtitan again, relaunched by hand (``regenerate.py``'s
default; 136 s on the shared 2-core machine), and is skipped when its environment
(``tests/data/sources/torchtitan/venv.sh``) is absent.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from goodput import schema
from goodput_processor.importers.sources import (
    detect_file_source,
    get_source,
    translate_files,
    write_spool,
)
from goodput_processor.importers.sources.torchtitan import SOURCE

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "sources" / "torchtitan"
FILES = sorted(DATA.glob("*.jsonl.gz"))
TOLERANCE_S = 0.5
TOOL_PYTHON = os.environ.get("TORCHTITAN_PYTHON", str(
    Path(__file__).resolve().parents[2] / ".venvs" / "torchtitan" / "bin" / "python"))


def _report(paths, run_dir: Path) -> tuple[dict, dict]:
    """Translate ``paths``, write the spool, run ``goodput report --format json``; returns
    (the job's report entry, the source's warnings)."""
    run = translate_files(SOURCE, paths)
    written = write_spool(run.resource_spans, run_dir)
    (job,) = written
    res = subprocess.run(
        [sys.executable, "-m", "goodput_processor.cli", "report", written[job]["run_dir"],
         "--format", "json"], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    (entry,) = json.loads(res.stdout)["jobs"]
    return entry, run.warnings


def _check_against_truth(job: dict, truth: dict) -> None:
    """The acceptance figures of issue 37 against the driver's truth."""
    attempts = job["attempts"]
    assert len(attempts) == truth["attempts"] == 2
    assert job["disruptions"] == 1
    assert job["max_productive_step"] == truth["final_step"]
    resume = truth["resume_step"]
    assert [a["resume_step"] for a in attempts] == [0, resume]
    kill_step = truth["kill"]["step"]
    assert [a["steps_kept"] for a in attempts] == [resume, truth["final_step"] - resume]
    assert attempts[0]["steps_wasted"] == kill_step - resume
    assert attempts[0]["end_reason"] == "killed" and attempts[1]["end_reason"] == "exit"
    b = job["badput_s"]
    assert b["checkpoint_save"] == pytest.approx(truth["checkpoint_save_s"], abs=TOLERANCE_S)
    assert b["checkpoint_restore"] == pytest.approx(truth["checkpoint_restore_s"],
                                                    abs=TOLERANCE_S)
    assert b["wasted_progress"] == pytest.approx(truth["wasted_progress_s"], abs=TOLERANCE_S)
    # torchtitan's logs begin when its structured logger starts: the restarted workers'
    # imports before it are part of the recovery the logs show (the
    # torchtitan_restart_startup_unseen warning); the truth reads both clocks.
    assert b["infrastructure_recovery"] == pytest.approx(truth["recovery_to_logger_s"],
                                                         abs=TOLERANCE_S)
    assert b["custom:eval"] > 0 and b["accelerator_init"] > 0 and b["training_prep"] > 0
    assert job["productive_time_s"] + sum(b.values()) == pytest.approx(job["total_time_s"],
                                                                      abs=1e-6)


# --- on the kept data of a real run ---------------------------------------------------------

@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> tuple[dict, dict, dict]:
    truth = json.loads((DATA / "truth.json").read_text())
    job, warnings = _report(FILES, tmp_path_factory.mktemp("tt-spool"))
    return truth, job, warnings


def test_kept_run_agrees_with_truth(kept) -> None:
    """Attempts, kept steps, max step, save, restore, wasted progress, recovery."""
    truth, job, _ = kept
    _check_against_truth(job, truth)


def test_kept_run_warnings(kept) -> None:
    """The restart is inferred (one attempt), and rank 0's open step is named."""
    _, _, warnings = kept
    assert warnings["torchtitan_attempt_inferred"] == 1
    assert warnings["torchtitan_restart_startup_unseen"] == 1
    assert warnings["torchtitan_span_open_at_end"] >= 1


def test_spans_emitted() -> None:
    """Each torchtitan span maps as documented: steps, real saves only, the restore with
    its step, eval as custom badput, one resource per process with its rank."""
    run = translate_files(SOURCE, FILES)
    truth = json.loads((DATA / "truth.json").read_text())
    by_rank: dict[tuple, list] = {}
    for rs in run.resource_spans:
        res = {kv["key"]: kv["value"] for kv in rs["resource"]["attributes"]}
        key = (int(res[schema.RES_PROCESS_INDEX]["intValue"]),
               int(res[schema.RES_ATTEMPT]["intValue"]))
        assert res[schema.RES_IMPORTED_FROM]["stringValue"] == "torchtitan"
        by_rank.setdefault(key, []).extend(s for ss in rs["scopeSpans"] for s in ss["spans"])
    assert sorted(by_rank) == [(0, 0), (0, 1), (1, 0), (1, 1)]

    def attrs(s):
        return {kv["key"]: next(iter(kv["value"].values())) for kv in s["attributes"]}

    def named(key, name):
        return [(s, attrs(s)) for s in by_rank[key] if s["name"] == name]

    saves = [int(a[schema.ATTR_CHECKPOINT_STEP]) for _, a in named((0, 0), schema.CHECKPOINT_SAVE)]
    saves += [int(a[schema.ATTR_CHECKPOINT_STEP]) for _, a in named((0, 1), schema.CHECKPOINT_SAVE)]
    assert saves == [s["step"] for s in truth["saves"]] == [8, 16, 24]
    (restore,) = named((0, 1), schema.CHECKPOINT_RESTORE)
    assert int(restore[1][schema.ATTR_CHECKPOINT_STEP]) == truth["resume_step"]
    assert not named((0, 0), schema.CHECKPOINT_RESTORE)
    steps0 = [int(a[schema.ATTR_STEP]) for _, a in named((0, 0), schema.STEP)]
    assert steps0 == list(range(1, truth["kill"]["step"] + 1))
    assert [a.get(schema.ATTR_OPEN) for _, a in named((0, 0), schema.STEP)][-1] is True
    steps1 = [int(a[schema.ATTR_STEP]) for _, a in named((0, 1), schema.STEP)]
    assert steps1 == list(range(truth["resume_step"] + 1, truth["final_step"] + 1))
    evals = named((0, 0), schema.CUSTOM_BADPUT)
    assert evals and all(a[schema.ATTR_BADPUT_TYPE] == "eval" for _, a in evals)
    assert len(named((0, 0), schema.ACCELERATOR_INIT)) == 1
    assert len(named((0, 0), schema.JOB_START)) == 1
    assert not named((0, 0), schema.JOB_END)  # killed: no teardown record
    (end,) = named((0, 1), schema.JOB_END)
    assert end[1][schema.ATTR_END_REASON] == "exit"
    # save durations: within 0.5 s of the clock reads around CheckpointManager._save
    got = sorted((int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e9
                 for key in ((0, 0), (0, 1)) for s, _ in named(key, schema.CHECKPOINT_SAVE))
    want = sorted(s["end"] - s["start"] for s in truth["saves"])
    assert got == pytest.approx(want, abs=TOLERANCE_S)


def test_detected_and_registered() -> None:
    """``--from`` is told from a file's first line, gzip or not; the source is built in."""
    assert get_source("torchtitan") is SOURCE
    assert detect_file_source(str(FILES[0])) == "torchtitan"
    assert not SOURCE.sniff(b'{"resourceSpans": []}\n')
    assert not SOURCE.sniff(b"iteration 1/10 | elapsed time per iteration (ms): 3.2\n")


def test_damaged_input_is_skipped(tmp_path) -> None:
    """Garbage, a record without a time, an end without its start and a torn last line are
    counted as problems and skipped; the report stays the same."""
    damaged = []
    for i, path in enumerate(FILES):
        lines = gzip.open(path, "rt").read().splitlines(keepends=True)
        if i == 0:
            lines.insert(3, "not json at all\n")
            lines.insert(5, json.dumps({"log_type_name": "step_start", "time_us": "x"}) + "\n")
            lines.insert(7, json.dumps(dict(json.loads(lines[8]), log_type_name="zzz_end"))
                         + "\n")
            lines.append('{"delta_ms": 0.1, "rank": 0, "log_ty')
        out = tmp_path / path.name.replace(".gz", "")
        out.write_text("".join(lines))
        damaged.append(out)
    run = translate_files(SOURCE, damaged)
    counts = run.problems.counts
    assert counts["malformed"] == 2 and counts["truncated"] == 1
    assert counts["unmatched_end"] == 1
    clean = translate_files(SOURCE, FILES)
    spans = [s["name"] for rs in run.resource_spans for ss in rs["scopeSpans"]
             for s in ss["spans"]]
    assert spans == [s["name"] for rs in clean.resource_spans for ss in rs["scopeSpans"]
                     for s in ss["spans"]]


def test_same_file_twice_is_one_process() -> None:
    """A file given twice (or a copy of it) is one process, not a restart."""
    once, twice = translate_files(SOURCE, FILES), translate_files(SOURCE, FILES + FILES[:1])
    assert twice.warnings == once.warnings
    assert len(twice.resource_spans) == len(once.resource_spans)


def test_relaunch_by_hand_in_one_process(tmp_path) -> None:
    """A second training_start in one process (train() run again) is a new attempt."""
    rec = {"rank": 0, "pid": 7, "host_name": "h", "log_type": "event"}
    t = [1_700_000_000_000_000]

    def line(name, step=None, rel=None, tags=None, dt=1000):
        t[0] += dt
        r = dict(rec, log_type_name=name, time_us=t[0])
        if step is not None:
            r.update(step=step, relative_step=rel)
        if tags:
            r["step_tags"] = tags
        return json.dumps(r) + "\n"

    text = line("training_start") + line("checkpoint_load_start") + line("checkpoint_load_end")
    text += line("step_start", 1, 1) + line("step_end", 1, 1)
    text += line("training_start") + line("checkpoint_load_start") + line("checkpoint_load_end")
    text += line("step_start", 2, 1) + line("step_end", 2, 1)
    path = tmp_path / "training.global_rank_0.jsonl"
    path.write_text(text)
    run = translate_files(SOURCE, [path])
    assert run.warnings["torchtitan_attempt_inferred"] == 1
    names = {}
    for rs in run.resource_spans:
        res = {kv["key"]: kv["value"] for kv in rs["resource"]["attributes"]}
        names[int(res[schema.RES_ATTEMPT]["intValue"])] = [
            s["name"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert sorted(names) == [0, 1]
    assert schema.CHECKPOINT_RESTORE in names[1] and schema.CHECKPOINT_RESTORE not in names[0]


# --- LIVE: torchtitan itself, SIGKILLed and restarted -----------------------------------------

def _tool_ready() -> bool:
    if not Path(TOOL_PYTHON).exists():
        return False
    res = subprocess.run([TOOL_PYTHON, "-c", "import torchtitan.train"], capture_output=True,
                         timeout=300, check=False)
    return res.returncode == 0


@pytest.mark.skipif(not _tool_ready(), reason=f"torchtitan 0.3.0 is not importable by "
                    f"{TOOL_PYTHON} (build it with tests/data/sources/torchtitan/venv.sh, "
                    "or set TORCHTITAN_PYTHON)")
def test_live_kill_and_restart(tmp_path) -> None:
    """torchtitan's own trainer under torchrun, rank 0 SIGKILLed at step 19, torchrun
    launched again by the driver, resumed from step 16's checkpoint: the report agrees
    with the driver's truth."""
    work = tmp_path / "run"
    res = subprocess.run([TOOL_PYTHON, str(DATA / "regenerate.py"), "--workdir", str(work)],
                         capture_output=True, text=True, timeout=900, check=False)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    truth = json.loads((work / "truth.json").read_text())
    logs = sorted((work / "dump" / "structured_logs").glob("*.jsonl"))
    assert len(logs) == 4
    job, warnings = _report(logs, tmp_path / "spool")
    _check_against_truth(job, truth)
    assert warnings["torchtitan_attempt_inferred"] == 1
