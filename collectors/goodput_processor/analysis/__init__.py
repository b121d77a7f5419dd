"""Analysis: what a job's steps and attempts say beyond its buckets.

Takes a job's rows and attempts (read, model) and gives step-time statistics
(:mod:`.steptimes`, :mod:`.order_stats`), the straggler report (:mod:`.stragglers`,
:mod:`.keyed_runs`), where each disruption's time went (:mod:`.recovery`), badput
attributed to hosts (:mod:`.attribution`) and elastic slice efficiencies (:mod:`.elastic`).

Must not import results, account, definitions, exporters, html, importers, serve or cli.
"""
