"""TensorBoard scalars of a job's goodput, with the tags ``ml-goodput-measurement`` writes.

Uses TensorBoard's own framework-free writer, ``tensorboard.summary.Writer`` (numpy
only; no TensorFlow, no PyTorch). Needs the ``tensorboard`` extra. Tags and values
(``docs/metrics.md``):

- ``goodput/goodput``: cumulative goodput in **percent** (0..100), at step = max
  productive step (0 before any), as the incumbent writes it.
- ``badput/<bucket>``: each badput bucket in percent of the total time, same step;
  ``custom:<type>`` buckets go to ``badput/custom_badput_events/<type>`` (lower case).
- ``step_deviation``: step time minus ideal step time in **seconds**, one point per kept
  step at step = its step number; each step number is written once (the first time it
  is seen as kept), so the cost of a write grows with the new steps only.
"""

from __future__ import annotations

import os
import time

import numpy as np

from goodput import schema

from .report import JobResult
from .timeline import NONE

__all__ = ["TAG_BADPUT", "TAG_GOODPUT", "TAG_STEP_DEVIATION", "TensorBoardWriter", "badput_tag"]

TAG_GOODPUT = "goodput/goodput"
TAG_BADPUT = "badput"
TAG_STEP_DEVIATION = "step_deviation"


def badput_tag(bucket: str) -> str:
    """TensorBoard tag of a badput bucket: ``badput/data_loading``,
    ``badput/custom_badput_events/eval`` for ``custom:eval``."""
    if bucket.startswith(schema.CUSTOM_PREFIX):
        return f"{TAG_BADPUT}/custom_badput_events/{bucket[len(schema.CUSTOM_PREFIX):].lower()}"
    return f"{TAG_BADPUT}/{bucket.lower()}"


class TensorBoardWriter:
    """Writes one job's goodput scalars to event files under ``logdir``.

    Not thread-safe (like the TensorBoard writer it wraps): call from one thread.

    Args:
        logdir: directory for the event files (created if missing).
        include_badput: write ``badput/*`` tags.
        include_step_deviation: write ``step_deviation``.

    Raises:
        OSError: ``logdir`` cannot be created.
    """

    def __init__(self, logdir: str | os.PathLike, *, include_badput: bool = True,
                 include_step_deviation: bool = True):
        from tensorboard.summary import Writer

        self.logdir = os.fspath(logdir)
        os.makedirs(self.logdir, exist_ok=True)
        self._writer = Writer(self.logdir)
        self._badput = include_badput
        self._deviation = include_step_deviation
        self._last_dev_step: int | None = None
        self._closed = False

    def write(self, result: JobResult, wall_time: float | None = None) -> int:
        """Write the scalars of ``result`` and flush; returns the number of points written.

        ``wall_time``: seconds since the epoch for the goodput/badput points (default
        now); step-deviation points carry their step's start time.
        """
        wt = time.time() if wall_time is None else wall_time
        step = result.max_productive_step or 0
        w = self._writer
        n = 1
        w.add_scalar(TAG_GOODPUT, result.goodput * 100.0, step, wall_time=wt)
        if self._badput:
            total = result.total_ns
            for bucket, ns in result.buckets_ns.items():
                if bucket == schema.PRODUCTIVE:
                    continue
                w.add_scalar(badput_tag(bucket), 100.0 * ns / total if total else 0.0, step,
                             wall_time=wt)
                n += 1
        if self._deviation:
            n += self._write_deviation(result)
        w.flush()
        return n

    def _write_deviation(self, result: JobResult) -> int:
        st = result.steps
        sel = (st.step != NONE) & ~np.isnan(st.deviation_s)
        if self._last_dev_step is not None:
            sel &= st.step > self._last_dev_step
        steps, devs, starts = st.step[sel], st.deviation_s[sel], st.start_ns[sel]
        for s, d, t0 in zip(steps.tolist(), devs.tolist(), starts.tolist(), strict=True):
            self._writer.add_scalar(TAG_STEP_DEVIATION, d, s, wall_time=t0 / 1e9)
        if len(steps):
            self._last_dev_step = int(steps.max())
        return len(steps)

    def close(self) -> None:
        """Flush and close the event file (idempotent)."""
        if not self._closed:
            self._closed = True
            self._writer.close()
