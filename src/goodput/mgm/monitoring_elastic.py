"""``ml_goodput_measurement.monitoring_elastic`` (0.2.3): ``ElasticGoodputMonitor``.

The monitor of an elastic job: :class:`~goodput.mgm.monitoring.GoodputMonitor` with an
``ElasticGoodputCalculator`` (elastic badput ``ELASTIC_SLICE_DOWN``, ``ELASTIC_SCALE_UP``,
``ELASTIC_REINITIALIZATION`` in the breakdown and the TensorBoard tags
``badput/elastic_*``) and, with ``include_slice_efficiency=True``, the Cloud Monitoring
series ``stepping_slice_efficiency`` and ``available_slice_efficiency`` (cumulative and per
rolling window). As the incumbent, it always passes ``pathway_enabled=True`` (elastic
training runs on Pathways).
"""

from __future__ import annotations

import datetime

from goodput.mgm import goodput_elastic, goodput_utils, monitoring

__all__ = ["ElasticGoodputMonitor", "GCPOptions"]

GCPOptions = goodput_utils.GCPOptions


class ElasticGoodputMonitor(monitoring.GoodputMonitor):
    """Drop-in for ``ml_goodput_measurement.monitoring_elastic.ElasticGoodputMonitor``:
    the arguments of :class:`~goodput.mgm.monitoring.GoodputMonitor` without
    ``pathway_enabled`` (always True), plus ``include_slice_efficiency`` (upload the slice
    efficiency series). Keywords ``run_dir``, ``definitions`` and ``gcp_client`` as there.
    """

    _calculator_class = goodput_elastic.ElasticGoodputCalculator

    def __init__(
        self,
        job_name: str,
        logger_name: str,
        tensorboard_dir: str,
        upload_interval: int,
        monitoring_enabled: bool = False,
        include_badput_breakdown: bool = False,
        include_step_deviation: bool = False,
        include_slice_efficiency: bool = False,
        configured_ideal_step_time=None,
        step_deviation_interval_seconds: int = 10,
        gcp_options: GCPOptions = GCPOptions(),  # noqa: B008 - the incumbent's default
        skip_final_flush: bool = False,
        final_flush_timeout_seconds: float | None = (
            monitoring._PROCESS_TERMINATION_TIMEOUT_SECONDS),
        gcs_sync_interval_seconds: int = 3600,
        cache_dir: str = "/tmp",
        max_logs_retention_period: datetime.timedelta | None = None,
        *,
        run_dir=None,
        definitions: str = "mgm",
        gcp_client=None,
    ):
        self._include_slice_efficiency = bool(include_slice_efficiency)
        super().__init__(
            job_name=job_name, logger_name=logger_name, tensorboard_dir=tensorboard_dir,
            upload_interval=upload_interval, monitoring_enabled=monitoring_enabled,
            pathway_enabled=True, include_badput_breakdown=include_badput_breakdown,
            include_step_deviation=include_step_deviation,
            configured_ideal_step_time=configured_ideal_step_time,
            step_deviation_interval_seconds=step_deviation_interval_seconds,
            gcp_options=gcp_options, skip_final_flush=skip_final_flush,
            final_flush_timeout_seconds=final_flush_timeout_seconds,
            gcs_sync_interval_seconds=gcs_sync_interval_seconds, cache_dir=cache_dir,
            max_logs_retention_period=max_logs_retention_period, run_dir=run_dir,
            definitions=definitions, gcp_client=gcp_client)
