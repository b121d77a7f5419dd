"""Exporters: a job's results published as series.

Takes :class:`~goodput_processor.results.report.JobResult` and window results and gives
OpenTelemetry metrics for any reader (Prometheus, OTLP, Cloud Monitoring: :mod:`.metrics`),
ml-goodput-measurement's Cloud Monitoring series (:mod:`.workload`), TensorBoard scalars
(:mod:`.tensorboard`), and the in-process monitor that runs them in a training process
(:mod:`.monitor`).

Must not import html, importers or cli.
"""
