"""OTLP/JSON text of the recorder's spans, built straight from its records.

The spool holds one OTLP ``ExportTraceServiceRequest`` per line in the OTLP/JSON encoding
(the OpenTelemetry Collector's file format, see ``docs/span-schema.md``). The recorder's
background thread used to build an SDK span per record and encode it; it now writes each
span's JSON text at once (:meth:`Encoder.span`, about 1 µs) and joins those texts into
lines behind the attempt's resource, encoded once (:meth:`Encoder.line`). Exporters other
than the spool get SDK ``ReadableSpan`` objects decoded from these lines
(:func:`goodput.decode.decode_line`), so the text is the one encoding of a span.

The text is what :func:`goodput.spool.encode_request` gives for the same SDK span, with
two differences a reader of OTLP cannot tell apart: keys come in another order (a line's
resource after its spans), and an unset status is left out instead of written as
``"status":{}``. Attribute values are
encoded as the SDK keeps them (bool, int, float, str and sequences of those as such;
anything else as its ``str()``, as the SDK's attribute cleaning does).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from goodput.spool import encode_attributes, encode_value

_dumps = json.dumps
_KEYS: dict[str, str] = {}  # attribute key -> '{"key":"<key>","value":'
_NAMES: dict[str, str] = {}  # span name -> its JSON string


def _key(key: str) -> str:
    text = _KEYS.get(key)
    if text is None:
        text = _KEYS[key] = '{"key":' + _dumps(str(key)) + ',"value":'
    return text


def attributes_json(attrs: Mapping) -> str:
    """``attrs`` as the text of an OTLP/JSON ``KeyValue`` list, without the brackets."""
    parts = []
    for k, v in attrs.items():
        t = type(v)
        if t is int:
            parts.append(f'{_key(k)}{{"intValue":"{v}"}}}}')
        elif t is str:
            parts.append(_key(k) + '{"stringValue":' + _dumps(v) + "}}")
        elif t is bool:
            parts.append(_key(k) + ('{"boolValue":true}}' if v else '{"boolValue":false}}'))
        else:  # floats, sequences, int subclasses, anything else: the general encoder
            parts.append(_key(k) + _dumps(encode_value(v)) + "}")
    return ",".join(parts)


class Encoder:
    """Encodes one attempt's spans: the resource and scope once, each span as text.

    Args:
        resource_attributes: the attempt's resource attributes (a mapping).
        scope_name, scope_version: the instrumentation scope of every span.
    """

    def __init__(self, resource_attributes: Mapping, scope_name: str, scope_version: str):
        scope = _dumps({"name": scope_name, "version": scope_version}, separators=(",", ":"))
        #: Text before a line's spans, and after them (with the newline). The resource
        #: comes after the spans (JSON keys have no order): a file's first bytes then hold
        #: its first span's ids, so two files of one attempt (journal segments) never
        #: start alike, which the Collector's file receivers take for the same file.
        self.prefix = '{"resourceSpans":[{"scopeSpans":[{"scope":' + scope + ',"spans":['
        self.set_resource(resource_attributes)

    def set_resource(self, resource_attributes: Mapping) -> None:
        """Lines made from now on (:meth:`line`) carry this resource (a process that
        learned its rank from the framework: ``goodput.recorder``)."""
        resource = _dumps({"attributes": encode_attributes(dict(resource_attributes))},
                          separators=(",", ":"))
        self.suffix = ']}],"resource":' + resource + "}]}\n"

    def span(self, trace_hex: str, span_id: int, parent_hex: str | None, name: str,
             t0: int, t1: int, attrs: Mapping | None = None, error: str | None = None,
             link: tuple[str, str] | None = None) -> str:
        """One ``INTERNAL`` span as OTLP/JSON text.

        Args:
            trace_hex: trace id, 32 lowercase hex digits.
            span_id: span id (int, 64 bits, not 0).
            parent_hex: parent span id as 16 hex digits, or None for a root.
            name: span name; t0, t1: start and end, ns since the epoch (ints).
            attrs: attributes or None; error: a status ``ERROR`` with this message.
            link: ``(trace hex, span hex)`` of one linked span (window roots), or None.
        """
        qname = _NAMES.get(name)
        if qname is None:
            qname = _NAMES[name] = _dumps(str(name))
        text = (f'{{"traceId":"{trace_hex}","spanId":"{span_id:016x}",'
                + (f'"parentSpanId":"{parent_hex}",' if parent_hex else "")
                + f'"name":{qname},"kind":1,"startTimeUnixNano":"{t0}",'
                  f'"endTimeUnixNano":"{t1}"')
        if attrs:
            text += ',"attributes":[' + attributes_json(attrs) + "]"
        if link is not None:
            text += f',"links":[{{"traceId":"{link[0]}","spanId":"{link[1]}","attributes":[]}}]'
        if error is not None:
            text += ',"status":{"code":2,"message":' + _dumps(str(error)) + "}"
        return text + "}"

    def line(self, spans: list[str]) -> str:
        """One spool line (a request holding ``spans``, texts of :meth:`span`), with ``\\n``."""
        return self.prefix + ",".join(spans) + self.suffix
