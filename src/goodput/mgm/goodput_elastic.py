"""``ml_goodput_measurement.goodput_elastic`` (0.2.3): elastic training.

:class:`ElasticGoodputRecorder` records what an elastic job (Pathways, MaxText's
``elastic_utils``) goes through, as spans of schema 1.2 (``docs/span-schema.md``):

- ``record_elastic_wait_start_time(event_type)`` / ``_end_time(event_type)``: waiting for
  slices after an elastic event -> ``goodput.elastic_wait`` (``goodput.elastic.event_type``;
  a type containing ``scale_up`` is a scale-up, any other a slice-down);
- ``record_elastic_reinit_start_time()`` / ``_end_time()``: re-initialising on the new
  slices -> ``goodput.elastic_reinit``;
- ``record_elastic_slice_counts(active_slices, total_slices, available_slices)``: a
  ``goodput.elastic_slices`` marker, from which stepping and available slice efficiency
  are computed.

:class:`ElasticGoodputCalculator` answers with the incumbent's elastic rules under
``definitions="mgm"``, the default (elastic waits and reinitialisation as ``ELASTIC_*``
badput, the reinitialisation's overlap taken out of TPU initialisation and training
preparation, the slice efficiencies in the details), and with this project's elastic buckets under
``definitions="goodput"`` (``docs/accounting.md``, "Elastic training").
"""

from __future__ import annotations

import time

from goodput import api, phases, schema
from goodput.mgm import goodput

__all__ = ["ElasticGoodputCalculator", "ElasticGoodputRecorder", "GoodputRecorder"]

GoodputRecorder = goodput.GoodputRecorder


class ElasticGoodputRecorder(GoodputRecorder):
    """The recorder of an elastic job: :class:`~goodput.mgm.goodput.GoodputRecorder` plus
    the ``record_elastic_*`` calls (module docstring). Same constructor; every method takes
    the incumbent's optional ``datetime`` (default now) and never raises."""

    def record_elastic_slice_counts(self, active_slices: int, total_slices: int,
                                    available_slices: int, timestamp=None) -> None:
        """The job has ``active_slices`` stepping, ``available_slices`` healthy, of
        ``total_slices``, as of ``timestamp`` (default now)."""
        if not self.logging_enabled:
            return
        rec = api.get_recorder()
        try:
            at = time.time_ns() if timestamp is None else phases.to_ns(timestamp, "timestamp")
            attrs = {schema.ATTR_SLICES_ACTIVE: int(active_slices),
                     schema.ATTR_SLICES_AVAILABLE: int(available_slices),
                     schema.ATTR_SLICES_TOTAL: int(total_slices)}
        except (TypeError, ValueError) as e:
            rec.error("elastic slice counts not recorded: %s", e)
            return
        rec.record(schema.ELASTIC_SLICES, at, at, attrs)

    def record_elastic_wait_start_time(self, event_type: str, start_time=None) -> None:
        """The job starts waiting for slices after an elastic event of ``event_type``
        (MaxText: ``elastic_slice_down`` or ``elastic_scale_up``)."""
        attrs = {schema.ATTR_ELASTIC_EVENT_TYPE: str(event_type)}
        self._begin(("elastic_wait", str(event_type)), schema.ELASTIC_WAIT, attrs, start_time)

    def record_elastic_wait_end_time(self, event_type: str, end_time=None) -> None:
        """The wait for slices of ``event_type`` ends."""
        self._finish(("elastic_wait", str(event_type)), end_time)

    def record_elastic_reinit_start_time(self, start_time=None) -> None:
        """Re-initialisation on the new set of slices starts."""
        self._begin(("elastic_reinit",), schema.ELASTIC_REINIT, None, start_time)

    def record_elastic_reinit_end_time(self, end_time=None) -> None:
        """Re-initialisation ends (training resumes)."""
        self._finish(("elastic_reinit",), end_time)


class ElasticGoodputCalculator(goodput.GoodputCalculator):
    """The calculator of an elastic job: :class:`~goodput.mgm.goodput.GoodputCalculator`
    (same arguments and methods) with the incumbent's elastic rules under
    ``definitions="mgm"`` (the default): ``ELASTIC_SLICE_DOWN``, ``ELASTIC_SCALE_UP`` and
    ``ELASTIC_REINITIALIZATION`` in the breakdowns, and ``stepping_slice_efficiency`` /
    ``available_slice_efficiency`` (fractions) in ``get_job_goodput_details`` and
    ``get_interval_metric_details`` when slice counts were recorded."""

    _elastic = True
