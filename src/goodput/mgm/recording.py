"""``ml_goodput_measurement.goodput.GoodputRecorder`` (0.2.3) on this project's recorder:
the recording half of :mod:`goodput.mgm.goodput` (which gives it under its incumbent name).

Each ``record_*`` call becomes a phase or a lifecycle record of :mod:`goodput.phases` and
:mod:`goodput.api` (the incumbent's ``datetime`` arguments, default now); the spans go to
the job's run directory (:func:`run_dir_of`), where the calculator reads them.
"""

from __future__ import annotations

import logging
import os

from goodput import api, phases, schema

__all__ = ["GoodputRecorder", "run_dir_of"]

#: The incumbent's module's logger: the recorder's messages keep the name they had.
log = logging.getLogger("goodput.mgm.goodput")


def run_dir_of(job_name: str, run_dir=None) -> str:
    """The run directory a recorder, calculator or monitor of ``job_name`` uses: ``run_dir``,
    else ``GOODPUT_RUN_DIR``, else ``goodput-runs/<job_name>`` (module docstring)."""
    if run_dir is not None:
        return os.fspath(run_dir)
    return os.environ.get("GOODPUT_RUN_DIR") or schema.default_run_dir(job_name)


class GoodputRecorder:
    """Drop-in for ``ml_goodput_measurement.goodput.GoodputRecorder``.

    Args:
        job_name: the job (run) name.
        logger_name: the incumbent's Cloud Logging log name: accepted, kept, not used to
            pick the run directory (module docstring).
        logging_enabled: record only if True (default False, as the incumbent: set it on the
            process that should write, e.g. ``jax.process_index() == 0``).
        cloud_logger: accepted for compatibility; unused.
        background_grace_period_s, background_batch_size, background_max_latency_s: the
            incumbent's Cloud Logging transport settings: accepted, unused (the spool is
            written by the recorder's own background thread every ``flush_interval_s``).
        **configure_kwargs: passed to :func:`goodput.configure` (``run_dir``,
            ``flush_interval_s``, ``traces_exporter``, ...).

    A second recorder of the same job and run directory in one process (MaxText creates
    one per elastic retry) shares the process's recorder instead of starting over. Every
    ``record_*`` method takes the incumbent's optional ``datetime`` (default now) and never
    raises into the training loop: a bad time is logged and counted.
    """

    def __init__(self, job_name: str, logger_name: str | None = None, logging_enabled=False,
                 cloud_logger=None, *, background_grace_period_s: float = 5.0,
                 background_batch_size: int = 100, background_max_latency_s: float = 2.0,
                 **configure_kwargs):
        self.job_name = job_name
        self.logger_name = logger_name
        self.logging_enabled = bool(logging_enabled)
        self._open: dict[tuple, phases.Phase] = {}
        if not self.logging_enabled:
            return
        try:
            rec = api.current_recorder()
            run_dir = configure_kwargs.get("run_dir")
            same = (rec is not None and not rec._shut and rec.job_name == job_name
                    and (run_dir is None or rec.run_dir == os.fspath(run_dir)))
            if not same:
                # each job start of this process is an explicit record_job_start_time: the
                # processor takes it for an attempt boundary (docs/accounting.md,
                # "Structure: attempts and processes from evidence")
                kw = dict(configure_kwargs)
                kw["resource_attributes"] = {
                    **(kw.get("resource_attributes") or {}),
                    schema.RES_RECORDER_API: schema.RECORDER_APIS[0]}
                api.configure(job_name, start=False, **kw)
        except Exception as e:  # never into the training program
            self.logging_enabled = False
            log.error("goodput: recorder for job %r not configured: %s", job_name, e)

    def _begin(self, key, name, attrs, when) -> None:
        if self.logging_enabled:
            self._open[key] = phases.Phase(name, attrs).begin(when)

    def _finish(self, key, when) -> None:
        if not self.logging_enabled:
            return
        phase = self._open.pop(key, None)
        if phase is None:
            api.get_recorder().error("%s end recorded without a start: ignored", key[0])
            return
        phase.finish(when)

    def flush(self) -> None:
        """Write everything recorded so far to the spool now (the incumbent's fence)."""
        if self.logging_enabled:
            api.flush()

    def record_checkpoint_progress(self, step, checkpoint_start_time) -> None:
        """A no-op, as in the incumbent (0.2.3 records nothing here)."""

    def record_job_start_time(self, start_time=None) -> None:
        """Begin a new attempt of the job at ``start_time`` (default now).

        As for the incumbent, each call begins an attempt: a second call in this process,
        or the first call of a restarted process once the job's steps had begun, also while
        a process of the earlier attempt is still alive (e.g. finishing a checkpoint save):
        the process's resource says ``goodput.recorder.api = ml-goodput-measurement``
        (``docs/accounting.md``, "Structure: attempts and processes from evidence")."""
        if self.logging_enabled:
            api.job_start(start_time)

    def record_job_end_time(self, end_time=None) -> None:
        """End the current attempt at ``end_time`` (default now)."""
        if self.logging_enabled:
            api.job_end(end_time)

    def record_step_start_time(self, step: int, start_time=None) -> None:
        """Step ``step`` starts (step time is measured between step starts)."""
        if self.logging_enabled:
            try:
                step = int(step)
            except (TypeError, ValueError) as e:
                api.get_recorder().error("step %r not recorded: %s", step, e)
                return
            api.step_start(step, start_time)

    def record_tpu_init_start_time(self, start_time=None) -> None:
        """Accelerator initialisation starts."""
        self._begin(("tpu_init",), schema.ACCELERATOR_INIT, None, start_time)

    def record_tpu_init_end_time(self, end_time=None) -> None:
        """Accelerator initialisation ends."""
        self._finish(("tpu_init",), end_time)

    def record_training_preparation_start_time(self, start_time=None) -> None:
        """Training preparation starts."""
        self._begin(("training_prep",), schema.TRAINING_PREP, None, start_time)

    def record_training_preparation_end_time(self, end_time=None) -> None:
        """Training preparation ends."""
        self._finish(("training_prep",), end_time)

    def record_data_loading_start_time(self, start_time=None) -> None:
        """Data loading (blocking) starts."""
        self._begin(("data_loading",), schema.DATA_LOADING, None, start_time)

    def record_data_loading_end_time(self, end_time=None) -> None:
        """Data loading ends."""
        self._finish(("data_loading",), end_time)

    def record_custom_badput_event_start_time(
        self, start_time=None, custom_badput_event_type: str = "unknown"
    ) -> None:
        """A custom badput event of ``custom_badput_event_type`` (e.g. ``"eval_step"``) starts."""
        attrs = {schema.ATTR_BADPUT_TYPE: str(custom_badput_event_type)}
        self._begin(("custom", custom_badput_event_type), schema.CUSTOM_BADPUT, attrs, start_time)

    def record_custom_badput_event_end_time(
        self, end_time=None, custom_badput_event_type: str = "unknown"
    ) -> None:
        """The custom badput event of ``custom_badput_event_type`` ends."""
        self._finish(("custom", custom_badput_event_type), end_time)


# --- calculator -------------------------------------------------------------------------------
