"""Account: a job's wall-clock time painted into goodput and badput buckets.

Takes a job's rows and attempts (read, model) and the analyses, and gives its
:class:`~goodput_processor.results.job.JobResult` (:mod:`.accounting`: ``account``,
``report_run_dir``), the running totals painted attempt by attempt (:mod:`.painting`), the
buckets of a window or interval (:mod:`.windows`), the named warnings (:mod:`.checks`) and
what a live job keeps of its finished attempts between polls (:mod:`.live`).

Must not import definitions, exporters, html, importers, serve or cli.
"""
