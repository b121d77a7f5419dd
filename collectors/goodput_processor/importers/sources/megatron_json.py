"""The ``megatron`` source's paths for the Collector's OTLP JSON (``goodput report`` of a
directory the file exporter wrote, ``goodput import`` of its files).

:class:`CollectorJson` is a part of :class:`~.megatron.MegatronTranslator`: the same state,
spans, problems and warnings as :meth:`~.megatron.MegatronTranslator.spans` gives, with less
made per span:

- :meth:`~CollectorJson.spans_json` reads the OTLP JSON span dicts as they are: no
  :class:`~.base.ForeignSpan` per ``megatron.train.iteration`` span of the usual shape.
- :meth:`~CollectorJson.spans_taken` takes a line's leading iteration spans as columns
  (:class:`~.base.SpanColumns`, from a template scan of the line's text:
  ``goodput_processor.read.foreign_template``), none of them a dict, and kept as columns
  (:meth:`~.base.Emitter.kept_columns`) until they are rows.

The translator supplies ``_READ``, ``_ITERATION`` (span names), ``_inc``, ``_key``,
``_incarnation``, ``_one`` and ``_maybe_end``.
"""

from __future__ import annotations

import numpy as np

from goodput import schema

from .base import SpanColumns, spans_of

__all__ = ["CollectorJson", "TEMPLATE_NAMES"]

#: The spans :meth:`CollectorJson.spans_taken` takes, and the int attribute it reads of each.
TEMPLATE_NAMES = (frozenset(("megatron.train.iteration", "megatron.iteration")),
                  "megatron.iteration")


def _error(d: dict) -> bool:
    """Status ERROR of an OTLP JSON span dict (as ``spans_of`` reads it)."""
    st = d.get("status")
    return bool(st) and st.get("code") in (2, "STATUS_CODE_ERROR")


def _refused(raw: list) -> bool:
    """Whether :func:`spans_of` refuses the list ``raw`` before it reads a span."""
    for d in raw:
        if type(d) is not dict:
            return True
        st = d.get("status")
        if st and type(st) is not dict:
            return True
    return False


class CollectorJson:
    """The OTLP JSON paths of the ``megatron`` translator (see the module docstring)."""

    #: what a template scan takes for :meth:`spans_taken` (span names, int attribute)
    template_names = TEMPLATE_NAMES

    def spans_json(self, resource: dict, scope: str, raw: list, where: str) -> None:
        """:meth:`spans` of OTLP JSON span dicts (the Collector's file exporter, as
        :func:`~.records.spans_of` takes them): the same state, spans and problems, without
        a :class:`ForeignSpan` per ``megatron.train.iteration`` span of the usual shape
        (a str name, its times as digits, a 16-digit span id, ``megatron.iteration`` an
        ``intValue``). Any other span goes through :meth:`_one` as :meth:`spans` takes it;
        a list :func:`spans_of` would refuse, or an incarnation's first spans, go to
        :meth:`spans` whole.

        Raises:
            TypeError, KeyError, ValueError, AttributeError: as :meth:`spans` and
                :func:`spans_of` (the caller counts the list as malformed).
        """
        if _refused(raw):  # what spans_of refuses is refused before any span is read
            return self.spans(resource, scope, spans_of(raw), where)
        self._json_spans(resource, scope, raw, where, None)

    def spans_taken(self, resource: dict, scope: str, taken: SpanColumns, rest: list,
                    where: str) -> bool:
        """:meth:`spans_json` of one list whose leading spans are ``taken`` (a template
        scan's columns: every one a ``megatron.train.iteration`` or ``megatron.iteration``
        span of the usual shape, ``value`` its ``megatron.iteration``, as its dict
        ``taken.span(i)`` reads) and whose others are ``rest`` (OTLP JSON dicts): the same
        state, spans, problems and warnings. Returns False, having done nothing, where
        these spans need the general way (the incarnation's first spans, spans after its
        end, times :meth:`spans_json` refuses, a list :func:`spans_of` refuses): the
        caller then gives the whole list to :meth:`spans_json`.

        Raises:
            as :meth:`spans_json`, of ``rest`` (the caller counts the list as malformed).
        """
        if not len(taken) or _refused(rest):
            return False
        model = taken.span(0)  # (every taken span's dict is this one's but for its fields)
        if _refused((model,)):
            return False
        inc = self._inc.get(self._key(resource))
        if inc is None or inc.fresh or inc.ended:
            return False
        start, end, value = taken.start, taken.end, taken.value
        if not ((start > 0).all() and (start <= end).all() and (value >= 0).all()):
            return False
        last = int(end.max())
        if last > inc.last_end:
            inc.last_end = last
        self.emit.kept_columns(inc.key, taken.as_spans(schema.STEP, schema.ATTR_STEP, 1,
                                                       _error(model)))
        top = int(value.max())
        if inc.max_step is None or top + 1 >= inc.max_step:
            inc.max_step = top + 1
            inc.last_iter = taken.span(int(np.flatnonzero(value == top)[-1]))
        if inc.mode is None:
            inc.mode, inc.pending = "per_step", []
        self._json_spans(resource, scope, rest, where, inc)
        return True

    def _json_spans(self, resource: dict, scope: str, raw: list, where: str, inc) -> None:
        """The loop of :meth:`spans_json` (``inc``: the list's incarnation where spans of
        it came before these; None: none yet)."""
        key = "" if inc is None else inc.key
        step_name, step_attr = schema.STEP, schema.ATTR_STEP
        iteration, read, one = self._ITERATION, self._READ, self._one
        append = None  # Emitter.kept_list's, fetched at the first step span
        for d in raw:
            name = d.get("name", "")
            if type(name) is not str:
                continue  # (str(name) is none of the names read: skipped as spans does)
            if name not in read:
                continue
            if inc is None:
                inc = self._incarnation(resource)
                key = inc.key
                if inc.fresh:  # its start marker needs every span: the general way
                    return self.spans(resource, scope, spans_of(raw), where)
            if name in iteration:
                try:
                    start = int(d["startTimeUnixNano"])
                    end = int(d["endTimeUnixNano"])
                    sid = d["spanId"]
                    it = None
                    for kv in d["attributes"]:
                        if kv["key"] == "megatron.iteration":
                            it = int(kv["value"]["intValue"])
                            break
                except (TypeError, ValueError, KeyError):
                    it = None
                if (type(it) is int and it >= 0 and 0 < start <= end and type(sid) is str
                        and len(sid) == 16):  # (the checks of spans, in its order)
                    if end > inc.last_end:
                        if inc.ended:
                            self.warn("megatron_span_after_end")
                        inc.last_end = end
                    step = it + 1
                    if append is None:
                        append = self.emit.kept_list(key, start).append
                    append((step_name, start, end, {step_attr: step}, sid.lower(),
                            _error(d)))
                    if inc.max_step is None or step >= inc.max_step:
                        inc.max_step, inc.last_iter = step, d  # (a ForeignSpan when read)
                    if inc.mode is None:
                        inc.mode, inc.pending = "per_step", []
                    continue
            one(inc, spans_of((d,))[0], where)
        if inc is not None:
            self._maybe_end(inc)
