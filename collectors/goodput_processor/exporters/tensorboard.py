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

from ..read.rows import NONE
from ..results.job import JobResult

__all__ = ["TAG_BADPUT", "TAG_GOODPUT", "TAG_STEP_DEVIATION", "ScalarWriter", "TensorBoardWriter",
           "badput_tag", "mgm_badput_scalars"]

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


class ScalarWriter:
    """Writes plain scalar events (``simple_value``) to an event file under ``logdir``, as
    ``tensorboardX.SummaryWriter.add_scalar`` does (the writer of ml-goodput-measurement's
    monitor); read them back with ``EventAccumulator(...).Scalars(tag)``. Uses TensorBoard's
    own event file writer (no TensorFlow, no PyTorch). Not thread-safe.

    Args:
        logdir: directory for the event file (created if missing).

    Raises:
        OSError: ``logdir`` cannot be created.
    """

    def __init__(self, logdir: str | os.PathLike):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.logdir = os.fspath(logdir)
        os.makedirs(self.logdir, exist_ok=True)
        self._writer = EventFileWriter(self.logdir)
        self._closed = False

    def add_scalar(self, tag: str, value: float, step: int, display_name: str = "",
                   wall_time: float | None = None) -> None:
        """One point of ``tag`` at ``step`` (``display_name``: the plot's title, stored in
        the summary metadata as tensorboardX stores it)."""
        from tensorboard.compat.proto import event_pb2, summary_pb2

        v = summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
        if display_name:
            v.metadata.CopyFrom(summary_pb2.SummaryMetadata(display_name=display_name))
        self._writer.add_event(event_pb2.Event(
            wall_time=time.time() if wall_time is None else wall_time, step=int(step),
            summary=summary_pb2.Summary(value=[v])))

    def flush(self) -> None:
        """Write what was added to the file."""
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file (idempotent)."""
        if not self._closed:
            self._closed = True
            self._writer.close()


def mgm_badput_scalars(prefix: str, data: dict) -> list[tuple[str, float, str]]:
    """``(tag, value, display name)`` of ml-goodput-measurement's
    ``monitoring._log_tensorboard_scalars(writer, prefix, data, step)``: ``prefix/name``
    for a value (name lower-cased), ``prefix/name/sub`` (all lower-cased) for each entry of
    a nested dict, e.g. ``badput/tpu_initialization``,
    ``badput/custom_badput_events/eval_step``; the display name is the last part."""
    out = []
    for name, value in data.items():
        if isinstance(value, dict):
            for sub, x in value.items():
                out.append((f"{prefix}/{name}/{sub}".lower(), float(x), sub.lower()))
        else:
            out.append((f"{prefix}/{name.lower()}", float(value), name.lower()))
    return out
