"""Model: a job's span rows into its attempts and processes.

Takes a :class:`~goodput_processor.read.rows.JobSpans` and gives its attempts
(:mod:`.attempts`: which attempts existed, their processes, when each started and was last
seen alive, from evidence), open records resolved (:mod:`.open_records`), rows kept packed
(:mod:`.packed`), summaries of a process's rows that combine in order (:mod:`.summaries`),
the points where a running attempt can be cut (:mod:`.pieces`), the rows the recovery
phases read (:mod:`.restart_rows`) and what a live job keeps between polls (:mod:`.memo`).

Must not import analysis, results, account, definitions, exporters, html, importers,
serve or cli.
"""
