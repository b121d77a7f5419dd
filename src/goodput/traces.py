"""How an attempt's spans are grouped into traces: windows with a ``goodput.window`` root.

Each window is one trace whose root span (``goodput.window``) is the parent of every
span in it, so a trace stays small (Cloud Trace keeps 1,000 spans per trace) and reads
as a waterfall. A window closes after a number of spans or seconds, and at the
attempt's end. Its children name their parent as soon as they are created; the root
itself is written when the window closes (it must cover its children), so after a
SIGKILL only the last window lacks it. Windows link to the one before. The processor
reads window spans past (:data:`goodput.schema.STRUCTURE`); ``docs/exporting.md`` shows
how they look in Cloud Trace.

Spans are encoded to OTLP/JSON text at once (:class:`goodput.encode.Encoder`) and handed
to a sink (:class:`goodput.segments.SpoolWriter`, or the memory sink without a spool):
``sink.add(text, name, start, end, is_open)`` for each span, the window's root included,
then ``sink.window_done()`` when a window has closed. Runs on the recorder's background
thread only.
"""

from __future__ import annotations

import random

from goodput import schema


class AttemptIds:
    """Span and trace ids of one attempt.

    Draws from its own ``random.Random`` (seeded from the OS): training code
    reseeds the global ``random`` module (``transformers.set_seed``, Lightning's
    ``seed_everything``), which would repeat span ids, and drawing from it would
    shift the job's own random sequence.
    """

    def __init__(self):
        self._bits = random.Random().getrandbits

    def span_id(self) -> int:
        """A fresh span id (64 bits, not 0)."""
        value = self._bits(64)
        while not value:
            value = self._bits(64)
        return value

    def new_window(self) -> tuple[int, int]:
        """Fresh ``(trace_id, span_id)`` for a window (not 0)."""
        trace = self._bits(128)
        while not trace:
            trace = self._bits(128)
        return trace, self.span_id()


class _Window:
    """An open window: its ids (ints and hex), its extent (ns), its number of children."""

    __slots__ = ("ids", "trace_hex", "span_hex", "index", "opened", "first", "last", "count")

    def __init__(self, ids: tuple[int, int], index: int, opened: int):
        self.ids = ids
        self.trace_hex = format(ids[0], "032x")
        self.span_hex = format(ids[1], "016x")
        self.index = index
        self.opened = opened
        self.first = opened  # earliest child start
        self.last = opened  # latest child end
        self.count = 0


class TraceWindows:
    """Encodes an attempt's spans inside windows (one trace each) and writes their roots.

    Args:
        encoder: the attempt's :class:`goodput.encode.Encoder`.
        ids: the attempt's :class:`AttemptIds`.
        max_ns: a window closes once a span ends this many ns after it opened.
        max_spans: ... or once it holds this many spans.
        sink: takes the encoded spans (see the module docstring).
    """

    def __init__(self, encoder, ids: AttemptIds, max_ns: int, max_spans: int, sink):
        self._span = encoder.span
        self._ids = ids
        self._max_ns = max_ns
        self._max_spans = max_spans
        self._sink = sink
        self._window: _Window | None = None
        self._index = 0
        self._prev: tuple[str, str] | None = None  # (trace hex, span hex) of the last root

    def emit(self, name: str, t0: int, t1: int, attrs=None, err: str | None = None,
             is_open: bool = False) -> None:
        """One finished span ``name`` from ``t0`` to ``t1`` (ns), in the current window;
        ``is_open``: a ``goodput.open`` record (its attributes say so already)."""
        if t1 < t0:
            t1 = t0
        w = self._window
        if w is not None and (w.count >= self._max_spans or t1 - w.opened >= self._max_ns):
            self.close()
            w = None
        if w is None:
            w = self._window = _Window(self._ids.new_window(), self._index, t0)
            self._index += 1
        text = self._span(w.trace_hex, self._ids.span_id(), w.span_hex, name, t0, t1, attrs,
                          err)
        self._sink.add(text, name, t0, t1, is_open)
        if t0 < w.first:
            w.first = t0
        if t1 > w.last:
            w.last = t1
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
        attrs = {schema.ATTR_WINDOW_INDEX: w.index, schema.ATTR_WINDOW_SPANS: w.count}
        text = self._span(w.trace_hex, w.ids[1], None, schema.WINDOW, w.first, w.last, attrs,
                          None, self._prev)
        self._sink.add(text, schema.WINDOW, w.first, w.last, False)
        self._sink.window_done()
        self._prev = (w.trace_hex, w.span_hex)
