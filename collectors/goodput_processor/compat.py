"""Former home of the ``ml-goodput-measurement`` compatible calculator: an alias.

The drop-in API now lives on the training side's :mod:`goodput.mgm` (it imports the
processor lazily): ``from goodput_processor.compat import GoodputCalculator`` keeps
working and is :class:`goodput.mgm.goodput.GoodputCalculator`. The processor's own modules
never import this one (the processor imports nothing of the training side but
:mod:`goodput.schema`); the names are resolved when first used.
"""

from __future__ import annotations

_NAMES = ("BadputType", "GoodputCalculator", "GoodputType", "IntervalMetricType", "MetricType")
__all__ = list(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        from goodput.mgm import goodput as _mgm

        return getattr(_mgm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
