"""Exporters: a job's results published as series.

Takes :class:`~goodput_processor.results.job.JobResult` and window results and gives
OpenTelemetry metrics for any reader (Prometheus, OTLP, Cloud Monitoring: :mod:`.metrics`),
ml-goodput-measurement's Cloud Monitoring series (:mod:`.workload`) and TensorBoard scalars
(:mod:`.tensorboard`). What runs them (``goodput serve``, and in a training process the
monitor, :mod:`goodput_processor.serve.monitor`) is in serve/.

Must not import html, importers, serve or cli.
"""
