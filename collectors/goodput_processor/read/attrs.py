"""Which span attribute goes to which slot of a span row, per span kind.

The tables the reader's paths share (:mod:`.spans`, :mod:`.template`, :mod:`.emitted`, and
``goodput serve``'s decoders): a kind name's code (:data:`_KIND_CODES`, the ``kind``
column), and per kind, which attribute keys it reads into which slot of its row
(:data:`_KIND_ATTRS`: 0 = ``ival``, 1 = ``aux``, 2 = the string slot, 3 = the blocking
flag, 4 = the open flag; :data:`~goodput_processor.read.rows.COLUMNS`, ``docs/span-schema.md``)
and the flag bit a flag attribute's value sets (:func:`flag_bit`).
"""

from __future__ import annotations

from goodput import schema

from . import rows as tl

__all__ = ["flag_bit"]

_KIND_CODES = {name: code for code, name in enumerate(tl.KIND_NAMES)}
_K_CUSTOM = tl.K_CUSTOM_BADPUT
# Per kind: attribute key -> slot (0 = ival, 1 = aux, 2 = string, 3 = blocking flag,
# 4 = open flag).
_BLOCKING = {schema.ATTR_BLOCKING: 3, schema.ATTR_OPEN: 4}
_RECORDER = {schema.ATTR_RECORDER_ERRORS: 0, schema.ATTR_RECORDER_DROPPED: 1}
_KIND_ATTRS: tuple[dict[str, int], ...] = (
    {schema.ATTR_HEARTBEAT_INTERVAL_MS: 0}, {**_RECORDER, schema.ATTR_END_REASON: 2}, _RECORDER,
    {schema.RES_PROCESS_INDEX: 0, schema.RES_PROCESS_COUNT: 1},
    _BLOCKING, _BLOCKING, _BLOCKING, _BLOCKING,
    {schema.ATTR_STEP: 0, schema.ATTR_STEP_COUNT: 1, **_BLOCKING},
    {schema.ATTR_CHECKPOINT_STEP: 0, **_BLOCKING}, {schema.ATTR_CHECKPOINT_STEP: 0, **_BLOCKING},
    {schema.ATTR_BADPUT_TYPE: 2, **_BLOCKING},
    {schema.ATTR_ELASTIC_EVENT_TYPE: 2, **_BLOCKING}, _BLOCKING,
    # elastic_slices: the available count goes to the string slot (see timeline.COLUMNS)
    {schema.ATTR_SLICES_ACTIVE: 0, schema.ATTR_SLICES_TOTAL: 1,
     schema.ATTR_SLICES_AVAILABLE: 2},
    _BLOCKING,  # collective_wait (1.3)
    {schema.ATTR_LAUNCHER_WORKER_PID: 0, schema.ATTR_LAUNCHER_EXIT_CODE: 1,
     schema.ATTR_LAUNCHER_EVENT: 2},  # launcher_event (1.3)
)
if len(_KIND_ATTRS) != len(tl.KIND_NAMES):  # pragma: no cover - a schema edit, not input
    raise ImportError("_KIND_ATTRS needs one entry per rows.KIND_NAMES kind")


def flag_bit(slot: int, value) -> int:
    """The ``flags`` bit a slot-3/4 attribute value sets: ``goodput.blocking`` false ->
    ``F_NONBLOCKING``, ``goodput.open`` true -> ``F_OPEN``, else 0."""
    text = str(value).lower()
    if slot == 3:
        return tl.F_NONBLOCKING if text in ("false", "0") else 0
    return tl.F_OPEN if text in ("true", "1") else 0
