"""The processor as the training side's ml-goodput-measurement drop-in sees it: its one
entry point.

:mod:`goodput.mgm` (``GoodputCalculator``, ``GoodputMonitor``, ``goodput_utils``) imports
the processor only through this module, and only when first needed (never when a module
of ``goodput`` is imported): ``from goodput_processor.mgm_entry import account_mgm``. Each
name is looked up in its module on first use (:data:`_EXPORTS`), so that a call needing
one function does not import the rest (the live store, the exporters' clients).

The import-linter contract "training side" in ``pyproject.toml`` holds ``goodput`` to this:
any other import of the processor from ``src/goodput`` fails ``lint-imports``.
"""

from __future__ import annotations

import importlib

# name -> module of the processor that defines it
_EXPORTS = {
    # live state of a job between polls: the spool tailer and the store `goodput serve` uses
    "LiveStore": "goodput_processor.serve.store",
    "SpoolTailer": "goodput_processor.serve.tail",
    "AccountingMemo": "goodput_processor.model.memo",
    # the span rows
    "NONE": "goodput_processor.read.rows",
    "as_of": "goodput_processor.read.rows",
    # the accounting, this project's definitions and mgm's
    "account": "goodput_processor.account.accounting",
    "account_interval": "goodput_processor.account.windows",
    "account_excluding": "goodput_processor.account.windows",
    "account_mgm": "goodput_processor.definitions.mgm",
    "compute_ideal_step_time": "goodput_processor.definitions.mgm",
    "account_mgm_excluding": "goodput_processor.definitions.mgm_exclusion",
    # mgm's details and series (Cloud Monitoring), and TensorBoard scalars
    "details": "goodput_processor.exporters.workload",
    "interval_details": "goodput_processor.exporters.workload",
    "native_breakdown": "goodput_processor.exporters.workload",
    "percentile": "goodput_processor.exporters.workload",
    "step_deviation_from_baseline": "goodput_processor.exporters.workload",
    "WorkloadOptions": "goodput_processor.exporters.workload",
    "WorkloadSender": "goodput_processor.exporters.workload",
    "cumulative_series": "goodput_processor.exporters.workload",
    "interval_series": "goodput_processor.exporters.workload",
    "step_deviation_series": "goodput_processor.exporters.workload",
    "ScalarWriter": "goodput_processor.exporters.tensorboard",
    "mgm_badput_scalars": "goodput_processor.exporters.tensorboard",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """The processor's ``name`` (:data:`_EXPORTS`), imported on first use.

    Raises:
        AttributeError: a name this entry point does not give.
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
