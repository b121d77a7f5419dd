"""Former home of the ``ml-goodput-measurement`` compatible recorder: an alias.

The drop-in API now lives in :mod:`goodput.mgm`, one module per module of the incumbent
(``goodput``, ``monitoring``, ``goodput_utils``, ``goodput_elastic``,
``monitoring_elastic``); ``from goodput.compat import GoodputRecorder`` keeps working and is
:class:`goodput.mgm.goodput.GoodputRecorder`.
"""

from goodput.mgm.goodput import GoodputRecorder

__all__ = ["GoodputRecorder"]
