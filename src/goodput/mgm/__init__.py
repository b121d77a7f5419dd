"""The API of Google's ``ml-goodput-measurement`` 0.2.3, module by module, on goodput-otel.

Code written for the incumbent changes one import and nothing else::

    from ml_goodput_measurement import goodput, monitoring     # before
    from goodput.mgm import goodput, monitoring                # after

Modules (each the incumbent's module of that name: same classes, arguments, defaults,
methods, enums and return shapes; ``docs/migration.md`` has the table):

- :mod:`goodput.mgm.goodput`: ``GoodputRecorder``, ``GoodputCalculator``;
- :mod:`goodput.mgm.goodput_elastic`: ``ElasticGoodputRecorder``,
  ``ElasticGoodputCalculator``;
- :mod:`goodput.mgm.monitoring`: ``GoodputMonitor`` (TensorBoard scalars with the
  incumbent's tags, the incumbent's Cloud Monitoring series);
- :mod:`goodput.mgm.monitoring_elastic`: ``ElasticGoodputMonitor``;
- :mod:`goodput.mgm.goodput_utils`: ``GCPOptions``, the enums and helpers;
- :mod:`goodput.mgm.exclusion_utils`: ``normalize_intervals``, ``get_exclusion_overlap``.

Recording needs only this package and the OpenTelemetry SDK. Querying and monitoring use
the processor through its one entry point, :mod:`goodput_processor.mgm_entry`, imported
when first needed, never when a module of this package is imported (the import-linter
contract "training side" in ``pyproject.toml`` checks it).
"""
