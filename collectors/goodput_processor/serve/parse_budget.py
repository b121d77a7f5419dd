"""What taking in a request may cost in memory, known before it is parsed (issue 38).

A request of 16 MiB made of empty ``ResourceSpans`` messages (two bytes each) parsed to
over 6 GiB: each sub-message is a C struct of 64 to 177 bytes in upb, then Python
objects in the store. The budget of bytes in flight (:class:`~goodput_processor.serve.
limits.ByteBudget`, ``--max-inflight-bytes``) is taken *before* the parse, so the
estimate must be an upper bound that a cheap look at the bytes can give:

- **protobuf** (:func:`protobuf_cost`): every sub-message of an OTLP
  ``ExportTraceServiceRequest`` starts with a one-byte tag of wire type 2 for a field
  number from 1 to 15 (no OTLP trace message has a message field past 15). Counting those
  bytes bounds the number of sub-messages of each field number; each is weighed by the
  most that upb takes for a message of that field number (:data:`TAG_BYTES`), in one pass
  (:func:`tag_bytes`, about 25 ms per 16 MiB). On top: a few times the size for
  strings, the rows and the log line (:data:`PROTOBUF_BYTE_FACTOR`), and the Python
  objects and log line parts of each ``ResourceSpans`` and ``ScopeSpans``, counted by a
  walk of the top two levels (:func:`structure_bound`). Real spans also hold such bytes in
  their ids, times and strings, so the bound is loose for them (about 13x their size; they
  take about 7x with the log), but it is a bound: a request of empty spans is estimated at
  96x its size and takes 89x.
- **JSON** (:func:`json_cost`): an upper bound on what ``json.loads`` allocates, from the
  counts of ``{``, ``[``, ``"``, ``,`` and ``:`` (``tests/test_serve_limits.py``), plus
  :data:`JSON_LINE_FACTOR` times its size for the log line.

``benchmarks/serve_amplification.py --bound`` takes the worst shapes it knows (21, both
encodings) into a store with a log, each in a fresh process, and compares the peak
resident memory with these estimates (``tests/test_serve_parse_budget.py`` runs three);
without ``--bound`` it sends them to a real ``goodput serve``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TAG_BYTES", "json_cost", "protobuf_cost", "structure_bound", "tag_bytes"]

#: Bytes of memory one sub-message may take in upb, by the one-byte tag it starts with
#: (field numbers 1-15, wire type 2): the largest struct of a message of that field number
#: plus its slot in a repeated field, measured with empty messages: ResourceSpans,
#: ScopeSpans and Span.Event 64, InstrumentationScope and KeyValue 56, Resource, AnyValue
#: and Status 32, ArrayValue and KeyValueList 24, Span 177 (185 kept), Span.Link 88; for
#: the logs service (the same bytes: ``LogsService/Export`` is estimated the same way)
#: ResourceLogs and ScopeLogs 64, LogRecord 136, its body (field 5) 32 and its attributes
#: (field 6) 56.
TAG_BYTES = {0x0a: 64, 0x12: 185, 0x1a: 56, 0x22: 56, 0x2a: 32, 0x32: 56, 0x4a: 56,
             0x5a: 64, 0x6a: 88, 0x7a: 32}
#: Byte -> its weight in :data:`TAG_BYTES` (0 for other bytes), for ``bytes.translate``.
_WEIGHTS = bytes(TAG_BYTES.get(b, 0) for b in range(256))  # (each weight < 256)
#: Bytes of a body weighed at a time by :func:`tag_bytes` (the GIL is let go between them).
_CHUNK = 1 << 18
#: Bytes per byte of a protobuf request for what is not a sub-message: strings and ids
#: copied by upb, their hex and JSON text in the log line (twice while it is joined).
PROTOBUF_BYTE_FACTOR = 4
#: Bytes per byte of an OTLP/JSON request for its log line (twice while it is joined).
JSON_LINE_FACTOR = 3


#: Bytes one ``ResourceSpans`` and one ``ScopeSpans`` may take besides their upb structs:
#: their Python objects while the request is split by job and read by the sources, and
#: their parts of the log line (measured with a ResourceSpans, or a ScopeSpans, per empty
#: span: ``benchmarks/serve_amplification.py --bound``).
RESOURCE_SPANS_BYTES = 1024
SCOPE_SPANS_BYTES = 384
#: Fields walked one by one at most (a few ms: the walk is Python, about 1 us a field);
#: past them the counts of ``0a`` and ``12`` bytes bound the ResourceSpans and ScopeSpans.
#: A real request has a few fields in its top two levels (a ResourceSpans per resource, its
#: resource, ScopeSpans and schema URL), so the walk stays exact for it; a request of many
#: tiny messages (an attack) is bounded by its byte counts, which are tight for it. (It was
#: 2^18, 0.2-0.3 s of CPU per hostile request of 1 MiB and more: issue 38, serve CPU-bound
#: under the abuse mix.)
MAX_WALK = 1 << 13


class _Walk:
    """Reads the fields of a protobuf message by their lengths, at most :data:`MAX_WALK`
    in all (:attr:`left`)."""

    def __init__(self, body):
        self.body, self.left = body, MAX_WALK

    def fields(self, i: int, end: int):
        """``(tag, value start, value end)`` of the length-delimited fields of numbers 1-15
        in ``body[i:end]``; stops at any other field (the parse decides about it, and the
        byte counts cover it) or when the walk is used up (``left`` < 0)."""
        body = self.body
        while i < end:
            tag = body[i]
            self.left -= 1
            if tag & 7 != 2 or tag >= 0x80 or self.left < 0:
                return
            i += 1
            length = shift = 0
            while i < end:
                c = body[i]
                i += 1
                length |= (c & 0x7F) << shift
                shift += 7
                if c < 0x80:
                    break
            yield tag, i, min(end, i + length)
            i += length


def structure_bound(body) -> tuple[int, int]:
    """Upper bounds on the ``ResourceSpans`` and the ``ScopeSpans`` of the protobuf request
    ``body``: its fields walked by their lengths (exact, and few for real requests), or,
    past :data:`MAX_WALK` fields, the numbers of ``0a`` and ``12`` bytes."""
    walk, n_rs, n_ss = _Walk(body), 0, 0
    for tag, start, end in walk.fields(0, len(body)):
        if tag == 0x0A:
            n_rs += 1
            for inner, _, _ in walk.fields(start, end):
                n_ss += inner == 0x12
    if walk.left < 0:
        return body.count(b"\x0a"), body.count(b"\x12")
    return n_rs, n_ss


def tag_bytes(body) -> int:
    """Sum over the bytes of ``body`` (bytes-like) of their :data:`TAG_BYTES` weight: each
    chunk of :data:`_CHUNK` bytes mapped to the weights (``bytes.translate``) and summed by
    numpy. (One pass instead of a ``bytes.count`` per tag byte: about 25 ms for 16 MiB
    instead of 80-100 ms, in chunks short enough that the other threads get the GIL in
    between: issue 38, where the counts of big bodies held it for half of the time that
    serve's threads held it under the abuse mix.)"""
    total = 0
    for i in range(0, len(body), _CHUNK):
        part = body[i:i + _CHUNK]
        if not hasattr(part, "translate"):  # (a memoryview)
            part = bytes(part)
        total += int(np.frombuffer(part.translate(_WEIGHTS), np.uint8).sum(dtype=np.uint64))
    return total


def protobuf_cost(body) -> int:
    """Upper bound on the bytes of memory taking in the protobuf ``body`` (an
    ``ExportTraceServiceRequest``, uncompressed, bytes-like) takes: the parse, the rows
    and the write-ahead log line (not the body itself, which the receiver holds)."""
    n_rs, n_ss = structure_bound(body)
    return (PROTOBUF_BYTE_FACTOR * len(body) + tag_bytes(body)
            + RESOURCE_SPANS_BYTES * n_rs + SCOPE_SPANS_BYTES * n_ss)


def json_cost(body) -> int:
    """Upper bound on the bytes of memory taking in the OTLP/JSON ``body`` (uncompressed,
    bytes-like) takes: ``json.loads`` (its size plus 120 bytes per ``{``, 72 per ``[``, 40
    per ``"``, 56 per ``,`` and 96 per ``:``: ~14x for OTLP/JSON, which parses to ~4.3x;
    the worst shapes, e.g. ``[{},{},...]``, ~25x) and the log line."""
    b = body if isinstance(body, (bytes, bytearray)) else bytes(body)
    return ((1 + JSON_LINE_FACTOR) * len(b) + 120 * b.count(b"{") + 72 * b.count(b"[")
            + 40 * b.count(b'"') + 56 * b.count(b",") + 96 * b.count(b":"))
