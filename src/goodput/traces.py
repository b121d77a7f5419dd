"""How an attempt's spans are grouped into traces: windows with a ``goodput.window`` root.

Each window is one trace whose root span (``goodput.window``) is the parent of every
span in it, so a trace stays small (Cloud Trace keeps 1,000 spans per trace) and reads
as a waterfall. A window closes after a number of spans or seconds, and at the
attempt's end. Its children name their parent as soon as they are created; the root
itself is written when the window closes (it must cover its children), so after a
SIGKILL only the last window lacks it. Windows link to the one before. The processor
reads window spans past (:data:`goodput.schema.STRUCTURE`); ``docs/exporting.md`` shows
how they look in Cloud Trace.

Runs on the recorder's background thread only.
"""

from __future__ import annotations

import random

from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)

from goodput import schema


class AttemptIds(RandomIdGenerator):
    """Span and trace ids of one attempt; a window's root gets ids chosen in advance.

    Draws from its own ``random.Random`` (seeded from the OS): training code
    reseeds the global ``random`` module (``transformers.set_seed``, Lightning's
    ``seed_everything``), which would repeat span ids, and drawing from it would
    shift the job's own random sequence.

    A window's children are created (with the window as parent) before the
    window's own span, which is built when the window closes: :meth:`root_next`
    makes the next root span take the ids the children already point to.
    """

    def __init__(self):
        self._rng = random.Random()
        self._root: tuple[int, int] | None = None
        self._root_span_id = 0

    def _nonzero(self, bits: int) -> int:
        while True:
            value = self._rng.getrandbits(bits)
            if value:
                return value

    def new_window(self) -> tuple[int, int]:
        """Fresh ``(trace_id, span_id)`` for a window."""
        return self._nonzero(128), self._nonzero(64)

    def root_next(self, ids: tuple[int, int]) -> None:
        """The next span started without a parent gets ``ids``."""
        self._root = ids

    def generate_span_id(self) -> int:
        if self._root_span_id:
            value, self._root_span_id = self._root_span_id, 0
            return value
        return self._nonzero(64)

    def generate_trace_id(self) -> int:
        if self._root is not None:  # the SDK asks for the trace id first, then the span id
            (trace_id, self._root_span_id), self._root = self._root, None
            return trace_id
        return self._nonzero(128)


class _Window:
    """An open window: its ids, the parent context of its children, their extent (ns)."""

    __slots__ = ("ids", "context", "index", "opened", "first", "last", "count")

    def __init__(self, ids: tuple[int, int], index: int, opened: int):
        self.ids = ids
        ctx = SpanContext(ids[0], ids[1], is_remote=False,
                          trace_flags=TraceFlags(TraceFlags.SAMPLED))
        self.context = set_span_in_context(NonRecordingSpan(ctx))
        self.index = index
        self.opened = opened
        self.first = opened  # earliest child start
        self.last = opened  # latest child end
        self.count = 0


class TraceWindows:
    """Starts an attempt's spans inside windows (one trace each) and writes their roots.

    Args:
        tracer: the attempt's tracer, whose provider uses ``ids`` as id generator.
        ids: the attempt's :class:`AttemptIds`.
        max_ns: a window closes once a span ends this many ns after it opened.
        max_spans: ... or once it holds this many spans.
    """

    def __init__(self, tracer, ids: AttemptIds, max_ns: int, max_spans: int):
        self._tracer = tracer
        self._ids = ids
        self._max_ns = max_ns
        self._max_spans = max_spans
        self._window: _Window | None = None
        self._index = 0
        self._prev: SpanContext | None = None

    def emit(self, name: str, t0: int, t1: int, attrs=None, err: str | None = None) -> None:
        """One finished span ``name`` from ``t0`` to ``t1`` (ns), in the current window."""
        t1 = max(t0, t1)
        w = self._window
        if w is not None and (w.count >= self._max_spans or t1 - w.opened >= self._max_ns):
            self.close()
            w = None
        if w is None:
            w = self._window = _Window(self._ids.new_window(), self._index, t0)
            self._index += 1
        span = self._tracer.start_span(
            name, context=w.context, kind=SpanKind.INTERNAL, attributes=attrs, start_time=t0
        )
        if err is not None:
            span.set_status(Status(StatusCode.ERROR, err))
        span.end(end_time=t1)
        w.first = min(w.first, t0)
        w.last = max(w.last, t1)
        w.count += 1

    def close_if_older(self, now_ns: int) -> None:
        """Close the open window if it opened ``max_ns`` or more before ``now_ns``."""
        w = self._window
        if w is not None and now_ns - w.opened >= self._max_ns:
            self.close()

    def close(self) -> None:
        """Write the open window's root span (covering its children); none if it is empty."""
        w, self._window = self._window, None
        if w is None or not w.count:
            return
        self._ids.root_next(w.ids)
        attrs = {schema.ATTR_WINDOW_INDEX: w.index, schema.ATTR_WINDOW_SPANS: w.count}
        links = [Link(self._prev)] if self._prev is not None else None
        span = self._tracer.start_span(
            schema.WINDOW, context=Context(), kind=SpanKind.INTERNAL, attributes=attrs,
            links=links, start_time=w.first,
        )
        span.end(end_time=w.last)
        self._prev = span.get_span_context()
