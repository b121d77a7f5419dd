"""``GoodputRecorder``: the recorder API of Google's ``ml-goodput-measurement``.

Code written for ``ml_goodput_measurement.goodput.GoodputRecorder`` (MaxText and
others) switches by changing the import::

    from goodput.compat import GoodputRecorder
    recorder = GoodputRecorder(job_name=run_name, logger_name=f"goodput_{run_name}",
                               logging_enabled=(jax.process_index() == 0))
    recorder.record_job_start_time(datetime.datetime.now())

Every method takes the same optional ``datetime`` (default: now). As in the
original, a recorder with ``logging_enabled=False`` records nothing. Each
``record_job_start_time`` begins a new attempt. Spans go to the local spool and
any configured exporter instead of Cloud Logging; ``logger_name`` and
``cloud_logger`` are accepted and ignored.
"""

from __future__ import annotations

from goodput import api, phases, schema


class GoodputRecorder:
    """Drop-in for ``ml_goodput_measurement.goodput.GoodputRecorder``.

    Args:
        job_name: the job (run) name.
        logger_name: accepted for compatibility; unused.
        logging_enabled: record only if True (the original's default is False).
        cloud_logger: accepted for compatibility; unused.
        **configure_kwargs: passed to :func:`goodput.configure` (``run_dir``, ...).
    """

    def __init__(
        self,
        job_name: str,
        logger_name: str | None = None,
        logging_enabled: bool = False,
        cloud_logger=None,
        **configure_kwargs,
    ):
        self.job_name = job_name
        self.logger_name = logger_name
        self.logging_enabled = logging_enabled
        self._open: dict[tuple, phases.Phase] = {}
        if logging_enabled:
            api.configure(job_name, start=False, **configure_kwargs)

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

    def record_job_start_time(self, job_start_time=None) -> None:
        """Begin a new attempt of the job at ``job_start_time`` (default now)."""
        if self.logging_enabled:
            api.job_start(job_start_time)

    def record_job_end_time(self, job_end_time=None) -> None:
        """End the current attempt at ``job_end_time`` (default now)."""
        if self.logging_enabled:
            api.job_end(job_end_time)

    def record_step_start_time(self, step: int, start_time=None) -> None:
        """Step ``step`` starts (step time is measured between step starts)."""
        if self.logging_enabled:
            api.step_start(int(step), start_time)

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
