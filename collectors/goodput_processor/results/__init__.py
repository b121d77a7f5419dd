"""Results: the report's data classes and their JSON and table forms.

Takes what the accounting and the analyses computed and gives
:class:`~goodput_processor.results.report.JobResult` and its parts, the JSON report
(schema ``goodput.report/1``, ``docs/report-json.md``) and the terminal table.

Must not import account, definitions, exporters, html, importers, serve or cli.
"""
