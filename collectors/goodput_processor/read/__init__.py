"""Read: spool files, caches and other tools' OTLP JSON into span rows.

Takes a run directory (the recorder's spool: ``*.jsonl``, ``*.jsonl.gz``, ``*.tail``; a
foreign producer's OTLP JSON, through :mod:`goodput_processor.importers.sources`) and gives a
:class:`~goodput_processor.read.rows.SpanSet`: per job and process, int64 rows of
:data:`~goodput_processor.read.rows.COLUMNS`, and named counts of what it could not read.
Keeps the columnar cache of those rows and the result cache of a finished run beside the
spool (:mod:`.cache`, :mod:`.result_cache`).

Must not import any later stage (model, analysis, results, account, definitions,
exporters, html, serve, cli); of importers only the source adapters, lazily.
"""
