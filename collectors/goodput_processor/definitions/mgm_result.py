"""The result of ``--definitions mgm`` (:class:`MgmResult`) and mgm 0.2.3's names: the
badput types, their breakdown order, the release reproduced (see :mod:`.mgm`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["BADPUT_TYPES", "ELASTIC_TYPES", "MGM_VERSION", "Later", "MgmResult"]

#: The ml-goodput-measurement release whose definitions this module reproduces.
MGM_VERSION = "0.2.3"
#: mgm's ``BadputType`` names, in enum order, that :attr:`MgmResult.badput_s` holds
#: (``CUSTOM_BADPUT_EVENTS`` is per type in :attr:`MgmResult.custom_badput_s`).
BADPUT_TYPES = (
    "TPU_INITIALIZATION",
    "TRAINING_PREP",
    "PROGRAM_STARTUP",
    "DATA_LOADING_SYNC",
    "DATA_LOADING_ASYNC",
    "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "WASTED_PROGRESS_FROM_DISRUPTION",
    "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "OTHER",
)
#: The badput types of mgm's ``ElasticGoodputCalculator`` (``goodput_elastic.py``), in the
#: order its breakdown adds them; in :attr:`MgmResult.badput_s` for elastic results only.
ELASTIC_TYPES = ("ELASTIC_SLICE_DOWN", "ELASTIC_SCALE_UP", "ELASTIC_REINITIALIZATION")
#: Key order of mgm's ``_get_job_badput_breakdown`` (percentages).
_BREAKDOWN_ORDER = (
    "TPU_INITIALIZATION",
    "TRAINING_PREP",
    "DATA_LOADING_SYNC",
    "DATA_LOADING_ASYNC",
    "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "PROGRAM_STARTUP",
    "WASTED_PROGRESS_FROM_DISRUPTION",
    "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "CUSTOM_BADPUT_EVENTS",
    "OTHER",
)

_NS = 1_000_000_000
_EPS_S = 1e-9


class Later:
    """A value computed when first read: ``fn()``, once (then kept; ``fn`` is dropped).
    Given for a field of :class:`MgmResult` that not every caller reads (the ideal step
    time and step deviation read every step of the job), the field reads as the value.
    Pickled and copied as the value."""

    __slots__ = ("_fn", "_value")

    def __init__(self, fn) -> None:
        self._fn = fn
        self._value = None

    def value(self):
        """``fn()``, computed on the first call."""
        if self._fn is not None:
            self._value, self._fn = self._fn(), None
        return self._value

    def __reduce__(self):
        return _same, (self.value(),)


def _same(x):
    return x


class _LaterField:
    """A dataclass field whose value may be given as a :class:`Later` (read as its value;
    no default)."""

    def __set_name__(self, owner, name: str) -> None:
        self._slot = "_later_" + name

    def __get__(self, obj, objtype=None):
        if obj is None:
            raise AttributeError  # (dataclasses: the field has no default)
        v = obj.__dict__[self._slot]
        return v.value() if isinstance(v, Later) else v

    def __set__(self, obj, value) -> None:
        obj.__dict__[self._slot] = value


@dataclass(frozen=True)
class MgmResult:
    """mgm 0.2.3's answer for one job (or one interval of it).

    Durations are float seconds; ``goodput`` is a fraction in [0, 1] (mgm reports percent:
    :attr:`goodput_percent`). ``badput_s`` holds every name of :data:`BADPUT_TYPES` after
    mgm's sanitising (a value < 0 or > total becomes 0), ``OTHER`` included;
    ``DATA_LOADING_ASYNC`` is reported but is not badput (it is left out of ``OTHER``).
    ``custom_badput_s``: seconds per upper-cased custom badput type. ``badput_percent``:
    mgm's breakdown (``_get_job_badput_breakdown``): percent of the total per name, with
    ``CUSTOM_BADPUT_EVENTS`` a nested ``{type: percent}``; a value is 0 unless
    ``0 < seconds < total``. ``max_productive_step``/``last_recorded_step`` as mgm (0 when
    there are no steps); ``disruptions``: number of repeated step numbers.
    ``ideal_step_time_s``: given, or mgm's ``compute_ideal_step_time`` (None when every
    step time is under 1 s or there is no step time); ``step_deviation_s``: step number ->
    ``|step time - ideal|`` in seconds (empty without an ideal step time), a read-only
    mapping in mgm's dict order (:class:`~.mgm_steps.Deviation`, equal to that dict; a
    dict of signed deviations for exclusion results). ``interval``:
    None for the whole job, else the effective ``(start_ns, end_ns)`` (ns since the epoch)
    the interval total was measured over.

    Elastic results (mgm's ``ElasticGoodputCalculator``; ``elastic``) also hold
    :data:`ELASTIC_TYPES` in ``badput_s`` and, after ``OTHER``, in ``badput_percent``.
    ``badput_keys``: the names mgm's own dict of seconds holds (its
    ``get_job_goodput_details()["badput_time"]``: a bucket that never came up is not a
    key there), ``OTHER`` and ``CUSTOM_BADPUT_EVENTS`` included. ``slice_efficiency``:
    ``(stepping, available)`` fractions (mgm's ``stepping_slice_efficiency`` and
    ``available_slice_efficiency``; None without slice-count records or for non-elastic
    results). ``excluded_time_s``: mgm's ``total_excluded_time`` of an exclusion query
    (:func:`~.mgm_exclusion.account_mgm_excluding`; 0 otherwise).

    ``ideal_step_time_s`` and ``step_deviation_s`` may be given as :class:`Later` values
    (:func:`~.mgm.account_mgm` with a memo does): they are computed when first read, and
    read, compare, print and pickle as the values.
    """

    job: str
    total_time_s: float
    productive_time_s: float
    goodput: float
    badput_s: dict[str, float]
    custom_badput_s: dict[str, float]
    badput_percent: dict[str, float | dict[str, float]]
    max_productive_step: int
    last_recorded_step: int
    disruptions: int
    ideal_step_time_s: float | None = _LaterField()  # type: ignore[assignment]
    step_deviation_s: Mapping[int, float] = _LaterField()  # type: ignore[assignment]
    interval: tuple[int, int] | None = None
    elastic: bool = False
    badput_keys: tuple[str, ...] = ()
    slice_efficiency: tuple[float, float] | None = None
    excluded_time_s: float = 0.0

    @property
    def goodput_percent(self) -> float:
        """Goodput in percent (0..100), the unit mgm's ``get_job_goodput`` returns."""
        return self.goodput * 100

    def to_json_dict(self, step_deviation: bool = True) -> dict:
        """A JSON-ready dict (step numbers of ``step_deviation_s`` become strings; None
        there unless ``step_deviation``: :func:`~goodput_processor.definitions.write_json`
        writes it a piece at a time)."""
        return {
            "definitions": f"ml-goodput-measurement {MGM_VERSION}",
            "job": self.job,
            "interval": None if self.interval is None else {
                "start_unix_ns": self.interval[0], "end_unix_ns": self.interval[1]},
            "total_time_s": self.total_time_s,
            "productive_time_s": self.productive_time_s,
            "goodput": self.goodput,
            "goodput_percent": self.goodput_percent,
            "badput_s": dict(self.badput_s),
            "custom_badput_s": dict(self.custom_badput_s),
            "badput_percent": {k: dict(v) if isinstance(v, dict) else v
                               for k, v in self.badput_percent.items()},
            "max_productive_step": self.max_productive_step,
            "last_recorded_step": self.last_recorded_step,
            "disruptions": self.disruptions,
            "ideal_step_time_s": self.ideal_step_time_s,
            "step_deviation_s": (_str_keyed(self.step_deviation_s) if step_deviation
                                 else None),
            "elastic": self.elastic,
            "slice_efficiency": None if self.slice_efficiency is None else {
                "stepping": self.slice_efficiency[0],
                "available": self.slice_efficiency[1]},
            "excluded_time_s": self.excluded_time_s,
        }


def _str_keyed(deviation) -> dict[str, float]:
    """``deviation`` (a mapping step number -> seconds) with string keys, in its order."""
    fast = getattr(deviation, "str_keyed", None)
    if fast is not None:
        return fast()
    return dict(zip(map(str, deviation), deviation.values(), strict=True))
