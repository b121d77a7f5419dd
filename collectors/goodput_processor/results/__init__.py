"""Results: the report's data classes and their JSON and table forms.

Takes what the accounting and the analyses computed and gives a job's
:class:`~goodput_processor.results.job.JobResult` and its parts (:mod:`.job`), the JSON
report (:mod:`.report_json`, schema ``goodput.report/1``, ``docs/report-json.md``) and the
terminal table (:mod:`.table`).

Must not import account, definitions, exporters, html, importers, serve or cli.
"""
