"""Child process of ``tests/compat/test_mgm_readme_flow.py``: the ml-goodput-measurement README's
flow with ``goodput.mgm`` in one real process, recorder and monitor together.

Usage: ``python mgm_readme_child.py RUN_DIR TENSORBOARD_DIR ENTRIES_FILE MODE``. The calls
of the README (job start, TPU init, training preparation, per step a data loading and a
step start, an ``eval_step`` custom badput event, job end) go to ``goodput.mgm``'s
``GoodputRecorder`` and, with the same times, to ml-goodput-measurement 0.2.3's own
recorder, whose Cloud Logging entries are written as JSON lines to ``ENTRIES_FILE`` (the
oracle's log). ``goodput.mgm``'s ``GoodputMonitor`` uploads goodput with the badput
breakdown to TensorBoard every second while the job runs (its default definitions).
``MODE``: ``end`` records the job end, then stops the uploader (its final upload) and
exits; ``kill`` prints ``READY`` after step 5 and waits to be killed (no end, no final
upload).
"""

from __future__ import annotations

import datetime
import json
import sys
import time

from goodput.mgm import goodput, monitoring

JOB = "readme-job"


class _FileLog:
    """mgm's ``cloud_logger``: each entry as one JSON line, written at once."""

    def __init__(self, path: str):
        self._f = open(path, "a")  # noqa: SIM115 - open for the whole run

    def write_cloud_logging_entry(self, entry) -> None:
        self._f.write(json.dumps(entry) + "\n")
        self._f.flush()


class Both:
    """Each ``record_*`` call at one time (now, UTC) to both recorders."""

    def __init__(self, ours, theirs):
        self.ours, self.theirs = ours, theirs

    def __getattr__(self, name):
        def call(*args, **kwargs):
            now = datetime.datetime.now(datetime.timezone.utc)
            if name.startswith("record_custom_badput_event"):
                kwargs = {"custom_badput_event_type": kwargs["custom_badput_event_type"]}
                getattr(self.ours, name)(now, **kwargs)
                getattr(self.theirs, name)(now, **kwargs)
            elif name == "record_step_start_time":
                getattr(self.ours, name)(args[0], now)
                getattr(self.theirs, name)(args[0], now)
            else:
                getattr(self.ours, name)(now)
                getattr(self.theirs, name)(now)
        return call


def main() -> int:
    from ml_goodput_measurement.src import goodput as mgm

    run_dir, tb_dir, entries, mode = sys.argv[1:5]
    recorder = Both(
        goodput.GoodputRecorder(job_name=JOB, logger_name=f"goodput_{JOB}",
                                logging_enabled=True, run_dir=run_dir, flush_interval_s=0.1),
        mgm.GoodputRecorder(JOB, f"goodput_{JOB}", True, cloud_logger=_FileLog(entries)))
    monitor = monitoring.GoodputMonitor(
        job_name=JOB, logger_name=f"goodput_{JOB}", tensorboard_dir=tb_dir, upload_interval=1,
        monitoring_enabled=True, include_badput_breakdown=True, run_dir=run_dir)
    recorder.record_job_start_time()
    monitor.start_goodput_uploader()
    recorder.record_tpu_init_start_time()
    time.sleep(0.3)
    recorder.record_tpu_init_end_time()
    recorder.record_training_preparation_start_time()
    time.sleep(0.4)
    recorder.record_training_preparation_end_time()
    for step in range(10):
        recorder.record_data_loading_start_time()
        time.sleep(0.05)
        recorder.record_data_loading_end_time()
        recorder.record_step_start_time(step)
        time.sleep(0.8 if step == 0 else 0.25)  # the first step compiles
        if step == 4:
            recorder.record_custom_badput_event_start_time(custom_badput_event_type="eval_step")
            time.sleep(0.3)
            recorder.record_custom_badput_event_end_time(custom_badput_event_type="eval_step")
        if step == 5 and mode == "kill":
            print("READY", flush=True)
            while True:
                time.sleep(60)
    recorder.record_job_end_time()
    monitor.stop_goodput_uploader()
    return 0


if __name__ == "__main__":
    sys.exit(main())
