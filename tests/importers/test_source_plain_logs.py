"""The plain-log sources (no telemetry at all): ``megatron-log``, ``nemo-log``/``dllogger``,
``maxtext-log``, on the test data under ``tests/data/sources/<name>/`` (each beside the
script that regenerates it and its truth), through ``translate_files`` -> ``write_spool``
-> the report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from goodput import schema
from goodput_processor import report_run_dir
from goodput_processor.importers.sources import detect_file_source, get_source
from goodput_processor.importers.sources.driver import translate_files, write_spool

DATA = Path(__file__).resolve().parents[1] / "data" / "sources"
#: The tools' environments (each ``venv.sh``'s default place; ``GOODPUT_*_PYTHON`` wins).
_VENVS = Path(__file__).resolve().parents[2] / ".venvs"
MEG = DATA / "megatron-log"
FAR = 2**62
NS = 1_000_000_000


def _spans(run) -> list[tuple[str, int, int, dict]]:
    """(name, start ns, end ns, attrs) of every emitted span, in order, attempt by attempt."""
    out = []
    for rs in run.resource_spans:
        res = {kv["key"]: next(iter(kv["value"].values())) for kv in rs["resource"]["attributes"]}
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                attrs = {kv["key"]: next(iter(kv["value"].values())) for kv in s["attributes"]}
                attrs["attempt"] = int(res[schema.RES_ATTEMPT])
                out.append((s["name"], int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]),
                            attrs))
    return out


def _report(run, tmp_path):
    write_spool(run.resource_spans, tmp_path)
    (r,) = report_run_dir(tmp_path, now_ns=FAR)
    return r


def _ns(s: float) -> int:
    return round(s * NS)


# --- megatron-log -------------------------------------------------------------------------

def test_megatron_log_matches_truth_to_the_millisecond(tmp_path):
    truth = json.loads((MEG / "truth.json").read_text())
    files = [MEG / "trainer-0.previous.log", MEG / "trainer-0.log"]
    assert {detect_file_source(str(f)) for f in files} == {"megatron-log"}
    run = translate_files(get_source("megatron-log"), files)
    assert len(run.problems) == 0
    assert run.warnings == {"megatron_log_end_from_last_line": 1}
    spans = _spans(run)
    ms = 1_000_000
    for a, att in enumerate(truth["attempts"]):
        steps = [s for s in spans if s[0] == schema.STEP and s[3]["attempt"] == a]
        assert [int(s[3][schema.ATTR_STEP]) for s in steps] == [x[2] for x in att["steps"]]
        assert [int(s[3][schema.ATTR_STEP_COUNT]) for s in steps] == [x[3] for x in att["steps"]]
        for s, (t0, t1, _, _) in zip(steps, att["steps"], strict=True):
            # the line's end is the runtime's time of the line (0.4 ms after the
            # measurement); the start, count x the printed 0.1 ms average before it
            assert abs(s[2] - _ns(t1)) <= ms and abs(s[1] - _ns(t0)) <= ms, (s, t0, t1)
        saves = [s for s in spans if s[0] == schema.CHECKPOINT_SAVE and s[3]["attempt"] == a]
        assert [(int(s[3][schema.ATTR_CHECKPOINT_STEP])) for s in saves] == [
            x[2] for x in att["saves"]]
        for s, (t0, t1, _) in zip(saves, att["saves"], strict=True):
            assert abs(s[1] - _ns(t0)) <= ms and abs(s[2] - _ns(t1)) <= ms
        restores = [s for s in spans if s[0] == schema.CHECKPOINT_RESTORE
                    and s[3]["attempt"] == a]
        if att["restore"] is None:
            assert restores == []
        else:
            (r,) = restores
            t0, t1, step = att["restore"]
            assert int(r[3][schema.ATTR_CHECKPOINT_STEP]) == step
            assert abs(r[1] - _ns(t0)) <= ms and abs(r[2] - _ns(t1)) <= ms
        (start,) = [s for s in spans if s[0] == schema.JOB_START and s[3]["attempt"] == a]
        assert abs(start[1] - _ns(att["start"])) <= ms

    r = _report(run, tmp_path)
    a0, a1 = truth["attempts"]
    assert len(r.attempts) == 2 and r.disruptions == 1
    assert [x.end_reason for x in r.attempts] == ["killed", "exit"]
    assert r.attempts[1].resume_step == 50
    assert sum(x.steps_kept for x in r.attempts) == 100 and r.attempts[0].steps_wasted == 20
    save_s = sum(t1 - t0 for t0, t1, _ in a0["saves"] + a1["saves"])
    assert r.badput_s["checkpoint_save"] == pytest.approx(save_s, abs=0.002)
    assert r.badput_s["checkpoint_restore"] == pytest.approx(
        a1["restore"][1] - a1["restore"][0], abs=0.002)
    # wasted: from the end of the save of iteration 50 to the killed launch's last line
    assert r.badput_s["wasted_progress"] == pytest.approx(
        a0["last_line"] - a0["saves"][0][1], abs=0.002)
    # resume: from that last line to the restarted container's first line
    assert r.badput_s["infrastructure_recovery"] == pytest.approx(
        a1["start"] - a0["last_line"], abs=0.002)
    assert r.total_time_s == pytest.approx(a1["end"] - a0["start"], abs=0.002)


def _real_truth(d: Path, run: int) -> dict:
    out: dict = {}
    for ln in (d / f"real-truth-{run}.jsonl").read_text().splitlines():
        rec = json.loads(ln)
        out.setdefault(rec["kind"], {})[rec["n"]] = rec["t"]
    return out


def test_megatron_log_of_megatrons_own_training_log(tmp_path):
    """The iteration and print_datetime lines of Megatron's own training_log (the kept
    output of megatron_run.py): steps, save and restore within 10 ms of the process's own
    clock (measured: 5.1 ms at worst: training_log's own time and the pipe to the driver)."""
    _check_megatron_real(MEG, tmp_path, tol=10_000_000)


def _check_megatron_real(d: Path, tmp_path: Path, tol: int) -> None:
    files = [d / "real-0.previous.log", d / "real-0.log"]
    run = translate_files(get_source("megatron-log"), files)
    assert len(run.problems) == 0
    assert run.warnings == {"megatron_log_end_from_last_line": 1}
    spans = _spans(run)
    for a in (0, 1):
        tr = _real_truth(d, a)
        steps = [s for s in spans if s[0] == schema.STEP and s[3]["attempt"] == a]
        assert [int(s[3][schema.ATTR_STEP]) for s in steps] == (
            [1, 10, 20, 30, 40, 50, 60, 70] if a == 0 else [51, 60, 70, 80, 90, 100])
        for _name, start, end, attrs in steps:
            n, c = int(attrs[schema.ATTR_STEP]), int(attrs[schema.ATTR_STEP_COUNT])
            t0 = (tr["train_start"][n - 1] if c == 1 else
                  max(tr["iter_end"][n - c], tr.get("saved", {}).get(n - c, 0)))
            assert abs(end - tr["iter_end"][n]) < tol and abs(start - t0) < tol, (n, c)
        for name, kind in ((schema.CHECKPOINT_SAVE, ("save", "saved")),
                           (schema.CHECKPOINT_RESTORE, ("load", "loaded"))):
            got = [s for s in spans if s[0] == name and s[3]["attempt"] == a]
            assert len(got) == len(tr.get(kind[0], {}))
            for _name, start, end, attrs in got:
                n = int(attrs[schema.ATTR_CHECKPOINT_STEP])
                assert abs(start - tr[kind[0]][n]) < tol and abs(end - tr[kind[1]][n]) < tol
    r = _report(run, tmp_path)
    t0, t1 = _real_truth(d, 0), _real_truth(d, 1)
    assert len(r.attempts) == 2 and r.attempts[1].resume_step == 50
    assert [x.steps_kept for x in r.attempts] == [50, 50] and r.attempts[0].steps_wasted == 20
    # the killed launch's last line is iteration 70's; the truth's kill came after 73:
    # within the 0.5 s, and named (megatron_log_end_from_last_line)
    assert r.badput_s["wasted_progress"] == pytest.approx(
        (t0["kill"][-1] - t0["saved"][50]) / NS, abs=0.5)
    assert r.badput_s["infrastructure_recovery"] == pytest.approx(
        (t1["process_start"][-1] - t0["kill"][-1]) / NS, abs=0.5)


def test_megatron_log_one_concatenated_file(tmp_path):
    """One file with both launches: the restarted launch's process start comes from its
    ``time to initialize megatron`` line, and lines before it are the killed launch's."""
    truth = json.loads((MEG / "truth.json").read_text())
    both = tmp_path / "job.log"
    both.write_text((MEG / "trainer-0.previous.log").read_text()
                    + (MEG / "trainer-0.log").read_text())
    run = translate_files(get_source("megatron-log"), [both])
    r = _report(run, tmp_path / "out")
    assert len(r.attempts) == 2 and r.attempts[1].resume_step == 50
    assert sum(x.steps_kept for x in r.attempts) == 100
    a1 = truth["attempts"][1]
    # the second launch's process began 4.2 s after its container's first line (imports)
    assert r.attempts[1].start_ns == pytest.approx(_ns(a1["start"] + 4.2), abs=1_000_000)


def _later(line: str, ns: int) -> str:
    """``line`` with its RFC 3339 prefix moved ``ns`` later."""
    from datetime import datetime, timezone
    stamp, rest = line.split(" ", 1)
    secs, frac = stamp[:-1].split(".")
    t = datetime.strptime(secs, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    total = int(t.timestamp()) * NS + int(frac) + ns
    new = datetime.fromtimestamp(total // NS, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{new}.{total % NS:09d}Z {rest}"


def test_megatron_log_rank0_and_last_rank_pods(tmp_path):
    """With several ranks per pod set, rank 0's pod prints the start, load and save lines
    and the last rank's pod the iteration lines: four files (each pod's killed and current
    container) merge by time into the same report as one pod's two."""
    files = []
    for f in ("trainer-0.previous.log", "trainer-0.log"):
        lines = (MEG / f).read_text().splitlines()
        first, rest = lines[0], lines[1:]
        for pod, keep in (("rank0", lambda ln: " iteration " not in ln or "checkpoint" in ln),
                          ("last", lambda ln: " iteration " in ln and "checkpoint" not in ln)):
            out = tmp_path / f.replace("trainer-0", f"trainer-{pod}")
            # the last rank's container starts 30 ms after rank 0's
            head = first if pod == "rank0" else _later(first, 30_000_000)
            out.write_text("\n".join([head] + [ln for ln in rest if keep(ln)]) + "\n")
            files.append(out)
    one = _report(translate_files(get_source("megatron-log"),
                                  [MEG / "trainer-0.previous.log", MEG / "trainer-0.log"]),
                  tmp_path / "one")
    four = _report(translate_files(get_source("megatron-log"), files), tmp_path / "four")
    assert [(a.start_ns, a.end_ns, a.resume_step, a.steps_kept, a.steps_wasted)
            for a in four.attempts] == [(a.start_ns, a.end_ns, a.resume_step, a.steps_kept,
                                         a.steps_wasted) for a in one.attempts]
    assert four.badput_s == one.badput_s


def test_megatron_log_without_timestamp_prefixes(tmp_path):
    """No kubectl prefixes: the dates Megatron prints itself (read as UTC) give the times of
    the iteration, save and print_datetime lines; the rest is not timed."""
    plain = tmp_path / "plain.log"
    lines = []
    for f in ("trainer-0.previous.log", "trainer-0.log"):
        lines += [ln.split(" ", 1)[1] for ln in (MEG / f).read_text().splitlines()]
    plain.write_text("\n".join(lines) + "\n")
    run = translate_files(get_source("megatron-log"), [plain])
    assert run.warnings.get("megatron_log_naive_time_as_utc") == 1
    assert "megatron_log_time_chained" in run.warnings   # load lines have no date
    r = _report(run, tmp_path / "out")
    assert len(r.attempts) == 2 and sum(x.steps_kept for x in r.attempts) == 100
    truth = json.loads((MEG / "truth.json").read_text())
    save_s = sum(t1 - t0 for a in truth["attempts"] for t0, t1, _ in a["saves"])
    assert r.badput_s["checkpoint_save"] == pytest.approx(save_s, abs=0.002)


def test_megatron_log_bad_lines_are_counted_not_raised(tmp_path):
    src = (MEG / "trainer-0.previous.log").read_text().splitlines()
    bad = []
    for ln in src:
        bad.append(ln)
        if "iteration       30/" in ln:
            bad.append(ln[:ln.index("elapsed")])              # cut before its time
            bad.append("2026-13-45T99:00:00.0Z garbage")       # not a time
            bad.append("\x00\xff" * 20)
    bad.append(src[-1][:75])                                   # torn last line
    f = tmp_path / "bad.log"
    f.write_text("\n".join(bad))
    run = translate_files(get_source("megatron-log"), [f])
    assert run.problems.counts["truncated"] == 2 and run.problems.counts["malformed"] == 1
    r = _report(run, tmp_path / "out")
    assert len(r.attempts) == 1 and r.attempts[0].steps_kept == 70


def test_megatron_log_copied_data_regenerates(tmp_path):
    """The regenerate script writes the same files as are kept."""
    d = tmp_path / "megatron-log"
    shutil.copytree(MEG, d)
    import runpy
    runpy.run_path(str(d / "regenerate.py"), run_name="__main__")
    for f in ("trainer-0.previous.log", "trainer-0.log", "truth.json"):
        assert (d / f).read_bytes() == (MEG / f).read_bytes()


# --- nemo-log / dllogger --------------------------------------------------------------------

NEMO = DATA / "nemo-log"


def _truth(run: int, d: Path = NEMO) -> dict:
    """{kind: {step: t ns}} of the training process's own fsync'd times."""
    out: dict = {}
    for ln in (d / f"truth-{run}.jsonl").read_text().splitlines():
        rec = json.loads(ln)
        out.setdefault(rec["kind"], {})[rec["step"]] = rec["t"]
    return out


def test_dllogger_gives_per_step_times():
    _check_dllogger(NEMO)


def _check_dllogger(d: Path, live: bool = False) -> None:
    files = [d / "dllogger-0.json", d / "dllogger-1.json"]
    assert {detect_file_source(str(f)) for f in files} == {"dllogger"}
    run = translate_files(get_source("dllogger"), files)
    assert len(run.problems) == 0
    assert run.warnings == {"nemo_log_end_from_last_record": 2}   # no stdout: no clean end
    spans = _spans(run)
    recorded = {}
    for f in files:
        for ln in f.read_text().splitlines():
            rec = json.loads(ln[5:])
            recorded[(f.name, rec["step"] + 1)] = rec["data"]["train_step_timing in s"]
    worst_end = worst_time = 0
    for a in (0, 1):
        truth = _truth(a, d)
        steps = [s for s in spans if s[0] == schema.STEP and s[3]["attempt"] == a]
        assert all(schema.ATTR_STEP_COUNT not in s[3] for s in steps)   # one step each
        for _name, start, end, attrs in steps:
            n = int(attrs[schema.ATTR_STEP])
            # the step's time is the one NeMo's TimingCallback wrote, to the ns
            assert end - start == round(recorded[(f"dllogger-{a}.json", n)] * NS)
            # against the process's own clock (the driver's callback right after NeMo's)
            t0, t1 = truth["start"][n - 1], truth["end"][n]
            worst_end = max(worst_end, abs(end - t1))
            worst_time = max(worst_time, abs((end - start) - (t1 - t0)))
        nums = [int(s[3][schema.ATTR_STEP]) for s in steps]
        # the killed run lost the record being written (step 17's): at most one
        assert nums == list(range(nums[0], nums[-1] + 1))
        lost = {0} if a == 1 else ({0, 1} if live else {1})
        assert max(truth["end"]) - nums[-1] in lost
    # measured on the loaded 2-core VM that made the data: step times within 22 ms of the
    # driver's callback, ends up to 34 ms late (Lightning writes the record after the other
    # callbacks' on_train_batch_end, ModelCheckpoint's save every 5 steps included); a live
    # run on a machine as loaded as CI's is held to the 0.5 s
    tol = NS // 2 if live else 50_000_000
    assert worst_time < tol and worst_end < tol
    (start0,) = [s for s in spans if s[0] == schema.JOB_START and s[3]["attempt"] == 0]
    # the attempt starts at dllogger.init (timestamp - elapsedtime), after the process began
    assert 0 < start0[1] - _truth(0, d)["process_start"][-1] < 2 * NS


def test_nemo_log_with_stdout_restart(tmp_path):
    _check_nemo_restart(NEMO, tmp_path)


def _check_nemo_restart(d: Path, tmp_path: Path, live: bool = False) -> None:
    files = sorted(d.glob("dllogger-*.json")) + sorted(d.glob("nemo-*.log"))
    assert detect_file_source(str(d / "nemo-1.log")) == "nemo-log"
    run = translate_files(get_source("nemo-log"), files)
    assert len(run.problems) == 0
    r = _report(run, tmp_path)
    t0, t1 = _truth(0, d), _truth(1, d)
    assert len(r.attempts) == 2 and [a.end_reason for a in r.attempts] == ["killed", "exit"]
    assert r.attempts[1].resume_step == 15
    assert sum(a.steps_kept for a in r.attempts) == 30
    assert r.badput_s["checkpoint_restore"] > 0
    # wasted: from step 15's end to the kill; the importer ends the killed attempt at its
    # last record (step 16's), so it misses the time of the record lost at the kill; the
    # records come up to 34 ms after their batch's end (see above)
    last = max(int(json.loads(ln[5:])["step"]) + 1
               for ln in (d / "dllogger-0.json").read_text().splitlines())
    wasted_truth = (t0["kill"][-1] - t0["end"][15]) / NS
    lost = (t0["kill"][-1] - t0["end"][last]) / NS
    assert r.badput_s["wasted_progress"] == pytest.approx(wasted_truth - lost,
                                                          abs=0.5 if live else 0.05)
    assert lost < 0.5
    # recovery: from the last record to the restarted process's dllogger.init
    recovery = r.badput_s["infrastructure_recovery"]
    assert recovery == pytest.approx((t1["process_start"][-1] - t0["kill"][-1]) / NS, abs=0.5)


def test_dllogger_bad_records_are_counted_not_raised(tmp_path):
    lines = (NEMO / "dllogger-1.json").read_text().splitlines()
    bad = lines[:3] + ['DLLL {"timestamp": "x", "type": "LOG", "step": 3, "data": {}}',
                       "DLLL [1, 2]", 'DLLL {"type": "LOG", "step": "a", "data": {"train_st'] \
        + lines[3:] + [lines[-1][:40]]
    f = tmp_path / "dllogger.json"
    f.write_text("\n".join(bad))
    run = translate_files(get_source("dllogger"), [f])
    assert run.problems.counts == {"malformed": 2, "truncated": 2}
    r = _report(run, tmp_path / "out")
    assert r.attempts[0].steps_kept == len(lines)


# --- maxtext-log ----------------------------------------------------------------------------

MAXT = DATA / "maxtext-log"


def _mt_truth(run: int, d: Path = MAXT) -> dict:
    out: dict = {}
    for ln in (d / f"truth-{run}.jsonl").read_text().splitlines():
        rec = json.loads(ln)
        out.setdefault(rec["kind"], {})[rec["step"]] = rec["t"]
    return out


def test_maxtext_log_step_times_and_restart(tmp_path):
    _check_maxtext(MAXT, tmp_path)


def _check_maxtext(d: Path, tmp_path: Path, live: bool = False) -> None:
    files = [d / "maxtext-0.log", d / "maxtext-1.log"]
    assert {detect_file_source(str(f)) for f in files} == {"maxtext-log"}
    run = translate_files(get_source("maxtext-log"), files)
    assert len(run.problems) == 0
    assert run.warnings == {"maxtext_log_end_from_last_line": 2,
                            "maxtext_log_restore_end_at_loop_start": 1}
    spans = _spans(run)
    worst = 0
    for a in (0, 1):
        done = _mt_truth(a, d)["completed"]
        steps = [s for s in spans if s[0] == schema.STEP and s[3]["attempt"] == a]
        nums = [int(s[3][schema.ATTR_STEP]) for s in steps]
        # the killed run's step 23 completed but its line (printed one step late) never came
        assert nums == (list(range(0, 23)) if a == 0 else list(range(21, 40)))
        for _name, start, end, attrs in steps:
            n = int(attrs[schema.ATTR_STEP])
            worst = max(worst, abs(end - done[n]))
            if n - 1 in done:
                worst = max(worst, abs(start - done[n - 1]))
        for name, start, end, attrs in spans:
            if name == schema.CHECKPOINT_SAVE and attrs["attempt"] == a:
                n = int(attrs[schema.ATTR_CHECKPOINT_STEP])
                t = _mt_truth(a, d)
                worst = max(worst, abs(start - t["save"][n]), abs(end - t["saved"][n]))
    # every step's start and end and every save within 10 ms of the process's own clock
    # (measured: 7.6 ms at worst: the 1 ms rounding of the seconds over the chain, and the
    # truth's own fsync between a step's completion and its save's start); a live run on a
    # machine as loaded as CI's is held to the 0.5 s
    assert worst < (NS // 2 if live else 10_000_000)
    r = _report(run, tmp_path)
    t0, t1 = _mt_truth(0, d), _mt_truth(1, d)
    assert len(r.attempts) == 2 and r.attempts[1].resume_step == 20
    assert [a.steps_kept for a in r.attempts] == [21, 19] and r.attempts[0].steps_wasted == 2
    assert r.badput_s["checkpoint_restore"] == pytest.approx(
        (t1["restored"][20] - t1["restore"][20]) / NS, abs=0.5 if live else 0.05)
    # wasted: the end of the save of step 20 to the kill (the killed run's last line,
    # step 22's, came when step 23 completed, just before the kill)
    wasted = (t0["kill"][-1] - t0["saved"][20]) / NS
    assert r.badput_s["wasted_progress"] == pytest.approx(wasted, abs=0.5 if live else 0.05)


def test_maxtext_log_bad_lines_are_counted_not_raised(tmp_path):
    lines = (MAXT / "maxtext-1.log").read_text().splitlines()
    i = next(k for k, ln in enumerate(lines) if "completed step: 25," in ln)
    bad = lines[:i] + [lines[i][:lines[i].index(", seconds") + 5], "1999-99-99T00:00:00Z x"] \
        + lines[i:] + [lines[-1][:lines[-1].index("completed step") + 17]]
    f = tmp_path / "m.log"
    f.write_text("\n".join(bad))
    run = translate_files(get_source("maxtext-log"), [f])
    assert run.problems.counts == {"truncated": 2, "malformed": 1}
    r = _report(run, tmp_path / "out")
    assert r.attempts[0].steps_kept == 19


# --- never raises -------------------------------------------------------------------------

@pytest.mark.parametrize("name, files", [
    ("megatron-log", [MEG / "trainer-0.previous.log", MEG / "trainer-0.log"]),
    ("nemo-log", [NEMO / "dllogger-0.json", NEMO / "nemo-1.log"]),
    ("maxtext-log", [MAXT / "maxtext-0.log", MAXT / "maxtext-1.log"]),
])
def test_mutated_lines_never_raise(tmp_path, name, files):
    """Lines cut anywhere, numbers blown up, bytes thrown in, lines out of order: every
    source skips or reads them, never raises, and the report is still made."""
    import random
    rng = random.Random(37)
    lines = [ln for f in files for ln in f.read_text().splitlines()]
    out = []
    for ln in lines:
        r = rng.random()
        if r < 0.15:
            ln = ln[:rng.randrange(len(ln) + 1)]
        elif r < 0.25:
            ln = "".join("9" * 400 if c.isdigit() and rng.random() < 0.1 else c for c in ln)
        elif r < 0.3:
            i = rng.randrange(len(ln) + 1)
            ln = ln[:i] + "".join(chr(rng.randrange(1, 0x2fff)) for _ in range(8)) + ln[i:]
        elif r < 0.35:
            ln = ln.replace("0", "-", 1)
        out.append(ln)
    rng.shuffle(out[len(out) // 2:])
    f = tmp_path / "mutated.log"
    f.write_text("\n".join(out), encoding="utf-8", errors="surrogatepass")
    for _ in range(3):
        run = translate_files(get_source(name), [f])
        write_spool(run.resource_spans, tmp_path / "out", overwrite=True)
        report_run_dir(tmp_path / "out", now_ns=FAR)
        rng.shuffle(out)
        f.write_text("\n".join(out), encoding="utf-8", errors="surrogatepass")


_BIG = "9" * 400
_K = "2026-11-30T00:53:44.192320256Z "


@pytest.mark.parametrize("name, line", [
    ("megatron-log", _K + " [2026-11-30 00:53:44.191920] iteration        1/     100 | "
     f"elapsed time per iteration (ms): {_BIG}.5 |"),
    ("megatron-log", _K + f" [2026-11-30 00:53:44.191920] iteration {_BIG}/     100 | "
     "elapsed time per iteration (ms): 5.5 |"),
    ("megatron-log", _K + f"[2026-11-30 00:54:25.8] saving checkpoint at iteration {_BIG} to /x"),
    ("megatron-log", "9999-11-30T00:53:45.1Z  [9999-11-30 00:53:44.1] iteration   5/  100 | "
     "elapsed time per iteration (ms): 5.5 |"),
    ("dllogger", 'DLLL {"timestamp": "1e400", "elapsedtime": "1", "type": "LOG", "step": 1, '
     '"data": {"train_step_timing in s": 1}}'),
    ("dllogger", 'DLLL {"timestamp": "1796655211.76", "elapsedtime": "1", "type": "LOG", '
     '"step": 1e300, "data": {"train_step_timing in s": 1}}'),
    ("maxtext-log", _K + f"I1207 14:57:14.199647 1 x.py:1] completed step: 0, seconds: {_BIG}.1"),
    ("maxtext-log", _K + f"I1207 14:57:14.199647 1 x.py:1] Saved a checkpoint at step {_BIG}."),
])
def test_numbers_out_of_range_are_malformed(tmp_path, name, line):
    f = tmp_path / "x.log"
    f.write_text(line + "\n")
    run = translate_files(get_source(name), [f])
    assert run.problems.counts == {"malformed": 1}
    # (a DLLogger record with a good time still shows its process: only its step is dropped)
    assert [s for s in _spans(run) if s[0] != schema.JOB_START] == []


# --- live: the tools' own code run again, killed and restarted ------------------------------

def _repo(env: str, default: str, commit: str) -> str | None:
    """A git checkout holding ``commit`` (``$env``, else ``default``), or None."""
    import os
    import subprocess
    path = os.environ.get(env, default)
    if not path:
        return None
    try:
        ok = subprocess.run(["git", "-C", path, "cat-file", "-e", f"{commit}^{{commit}}"],
                            capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return None
    return path if ok else None


def test_live_nemo_dllogger_kill_and_restart(tmp_path):
    """Runs tests/data/sources/nemo-log/regenerate.py (real Lightning + NeMo's DLLogger and
    TimingCallback + dllogger, SIGKILL after step 17, restart from step 15; about 80 s)."""
    import os
    import subprocess
    import sys
    py = os.environ.get("GOODPUT_DLLOGGER_PYTHON", str(_VENVS / "dllogger" / "bin" / "python"))
    repo = _repo("GOODPUT_NEMO_REPO", "",
                 "8cfedd7203462cb251a914e700e5605444277561")
    if repo is None:
        pytest.skip("no NeMo git checkout with commit 8cfedd7 (set GOODPUT_NEMO_REPO)")
    if not os.path.exists(py) or subprocess.run(
            [py, "-c", "import dllogger, omegaconf, lightning"], capture_output=True,
            timeout=300).returncode != 0:
        pytest.skip(f"no DLLogger environment at {py} (build it with "
                    "tests/data/sources/nemo-log/venv.sh; or set GOODPUT_DLLOGGER_PYTHON)")
    subprocess.run([py, str(NEMO / "regenerate.py"), "--nemo-repo", repo, "--dest",
                    str(tmp_path)], check=True, timeout=600, stdout=sys.stderr)
    _check_dllogger(tmp_path, live=True)
    _check_nemo_restart(tmp_path, tmp_path / "out", live=True)


def test_live_maxtext_kill_and_restart(tmp_path):
    """Runs tests/data/sources/maxtext-log/regenerate.py (MaxText's own MetricLogger
    methods in a CPU loop, SIGKILL after step 23, restart from step 20; about 20 s)."""
    import subprocess
    import sys
    pytest.importorskip("absl", reason="MaxText's logging needs absl-py")
    repo = _repo("GOODPUT_MAXTEXT_REPO", "",
                 "e591f30cbbf217ed67ef71263ec0538239f9c3b8")
    if repo is None:
        pytest.skip("no MaxText git checkout with commit e591f30 (set GOODPUT_MAXTEXT_REPO)")
    subprocess.run([sys.executable, str(MAXT / "regenerate.py"), "--maxtext-repo", repo,
                    "--out", str(tmp_path)], check=True, timeout=600, stdout=sys.stderr)
    _check_maxtext(tmp_path, tmp_path / "out", live=True)


def test_live_megatron_training_log_kill_and_restart(tmp_path):
    """Runs tests/data/sources/megatron-log/megatron_run.py (Megatron-LM d98e8a64's own
    training_log and print_datetime on CPU, SIGKILL after iteration 73, restart from 50;
    about 60 s) in the environment of tests/data/sources/megatron/venv.sh."""
    import os
    import subprocess
    import sys
    py = os.environ.get("GOODPUT_MEGATRON_PYTHON", str(_VENVS / "megatron" / "bin" / "python"))
    if not os.path.exists(py) or subprocess.run(
            [py, "-c", "import megatron, nemo.lens"], capture_output=True,
            timeout=300).returncode != 0:
        pytest.skip(f"no Megatron-LM environment at {py} (build it with "
                    "tests/data/sources/megatron/venv.sh; or set GOODPUT_MEGATRON_PYTHON)")
    subprocess.run([py, str(MEG / "megatron_run.py"), "--out", str(tmp_path)], check=True,
                   timeout=600, stdout=sys.stderr)
    _check_megatron_real(tmp_path, tmp_path / "out", tol=NS // 2)


def test_nemo_log_stdout_alone_shows_the_restart(tmp_path):
    """Without the DLLogger files, the stdout of the two containers still shows two attempts
    and the restore (and nothing of the steps)."""
    run = translate_files(get_source("nemo-log"), [NEMO / "nemo-0.log", NEMO / "nemo-1.log"])
    spans = _spans(run)
    assert sorted({s[3]["attempt"] for s in spans}) == [0, 1]
    (restore,) = [s for s in spans if s[0] == schema.CHECKPOINT_RESTORE]
    assert restore[3]["attempt"] == 1 and int(restore[3][schema.ATTR_CHECKPOINT_STEP]) == 15
    assert not [s for s in spans if s[0] == schema.STEP]
