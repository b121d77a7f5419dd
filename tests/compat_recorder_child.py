"""Child process of ``tests/compat/test_compat_recorder_kills.py`` and
``tests/compat/test_mgm_scenarios.py``:
one OS process of a training job that makes ``goodput.mgm`` recorder calls
(``ElasticGoodputRecorder``: the plain recorder's and the elastic ones), then exits or waits
to be killed.

Usage: ``python compat_recorder_child.py RUN_DIR JOB FLUSH_INTERVAL_S``; the first line on
stdin is a JSON object ``{"calls": [...], "end": "exit" | "hang"}``. Each call is
``[method, *args]`` with times as integer microseconds since the Unix epoch (``null``:
the method's default, now); ``["pause"]`` prints ``PAUSED`` and waits for a line on stdin
(the parent queries the spool meanwhile); ``["sleep", seconds]`` sleeps;
``["checkpoint_save_start", step, time]`` / ``["checkpoint_save_end", time]`` record a
blocking checkpoint save with ``goodput.checkpoint_save(step)`` (what a drop-in user's
Orbax save statistics become, ``docs/migration.md``). After the calls,
``exit`` returns normally (interpreter exit) and ``hang`` prints ``READY`` and sleeps until
the parent kills the process. Imports only ``goodput`` (fast to start).
"""

from __future__ import annotations

import datetime
import json
import sys
import time

import goodput
from goodput.mgm.goodput_elastic import ElasticGoodputRecorder

_TIMED = {  # method -> index of its time argument in the args
    "record_job_start_time": 0,
    "record_job_end_time": 0,
    "record_step_start_time": 1,
    "record_tpu_init_start_time": 0,
    "record_tpu_init_end_time": 0,
    "record_training_preparation_start_time": 0,
    "record_training_preparation_end_time": 0,
    "record_data_loading_start_time": 0,
    "record_data_loading_end_time": 0,
    "record_custom_badput_event_start_time": 0,
    "record_custom_badput_event_end_time": 0,
    "record_elastic_slice_counts": 3,
    "record_elastic_wait_start_time": 1,
    "record_elastic_wait_end_time": 1,
    "record_elastic_reinit_start_time": 0,
    "record_elastic_reinit_end_time": 0,
}


def as_datetime(us: int | None) -> datetime.datetime | None:
    """``us`` microseconds since the epoch as an exact UTC datetime (None stays None)."""
    if us is None:
        return None
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return epoch + datetime.timedelta(microseconds=us)


def main() -> int:
    run_dir, job, flush = sys.argv[1], sys.argv[2], float(sys.argv[3])
    plan = json.loads(sys.stdin.readline())
    # the elastic recorder is the plain one plus the record_elastic_* calls
    recorder = ElasticGoodputRecorder(job, f"goodput_{job}", logging_enabled=True,
                                      run_dir=run_dir, flush_interval_s=flush)
    save = None
    for method, *args in plan["calls"]:
        if method == "checkpoint_save_start":
            save = goodput.checkpoint_save(args[0]).begin(as_datetime(args[1]))
            continue
        if method == "checkpoint_save_end":
            save.finish(as_datetime(args[0]))
            continue
        if method == "pause":
            print("PAUSED", flush=True)
            sys.stdin.readline()
            continue
        if method == "sleep":
            time.sleep(args[0])
            continue
        i = _TIMED[method]
        if i < len(args):
            args[i] = as_datetime(args[i])
        getattr(recorder, method)(*args)
    if plan["end"] == "hang":
        print("READY", flush=True)
        while True:
            time.sleep(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
