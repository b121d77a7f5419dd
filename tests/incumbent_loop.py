"""The ml-goodput-measurement README's training loop, recorded through the incumbent's
recorder API (``goodput.GoodputRecorder``, real recorder, real spool files).

:func:`record_run` records it in a run directory; :func:`drive` records it through any
recorder; :func:`sec` gives the datetime ``x`` seconds after ``T0``. Used by tests/compat/
and tests/definitions/.
"""

from __future__ import annotations

import datetime as dt

import goodput

T0 = dt.datetime(2026, 3, 1, 8, 0, 0, tzinfo=dt.timezone.utc)


def sec(x: float) -> dt.datetime:
    """The datetime ``x`` seconds after ``T0``."""
    return T0 + dt.timedelta(seconds=x)


def record_run(run_dir, job="mgm-run", steps=10):
    """The incumbent's README loop (seconds): job start 0, tpu init 1-2, prep 2-4, data
    loading 4-5, step 0 at 5 taking 5 s (3 s more than the others), steps of 2 s, an
    ``eval_step`` custom badput event of 3 s inside step 5, job end when step 9 ends."""
    rec = goodput.GoodputRecorder(job_name=job, logger_name=f"goodput_{job}",
                                  logging_enabled=True, run_dir=run_dir, handle_signals=False)
    end = drive(rec, steps)
    goodput.shutdown()
    return end


def drive(rec, steps=10, restart_from=None):
    """Record the README loop through ``rec`` (the incumbent's recorder API); with
    ``restart_from``, the job restarts after the last step, 4 s later, from that step."""
    rec.record_job_start_time(sec(0))
    rec.record_tpu_init_start_time(sec(1))
    rec.record_tpu_init_end_time(sec(2))
    rec.record_training_preparation_start_time(sec(2))
    rec.record_training_preparation_end_time(sec(4))
    rec.record_data_loading_start_time(sec(4))
    rec.record_data_loading_end_time(sec(5))
    t = 5.0
    for step in range(steps):
        rec.record_step_start_time(step, sec(t))
        t += 5 if step == 0 else 2
        if step == 5:
            rec.record_custom_badput_event_start_time(sec(t), custom_badput_event_type="eval_step")
            t += 3
            rec.record_custom_badput_event_end_time(sec(t), custom_badput_event_type="eval_step")
    if restart_from is not None:
        t += 4
        rec.record_job_start_time(sec(t))
        rec.record_data_loading_start_time(sec(t + 1))
        rec.record_data_loading_end_time(sec(t + 2))
        t += 2
        for step in range(restart_from, steps + 3):
            rec.record_step_start_time(step, sec(t))
            t += 2.5
    rec.record_job_end_time(sec(t))
    return t
