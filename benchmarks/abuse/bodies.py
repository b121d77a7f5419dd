"""Request bodies for the abuse run: healthy OTLP, empty-message amplification, malformed,
huge attributes and gzip bombs (bytes; sizes in bytes)."""

from __future__ import annotations

import json
import zlib

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from goodput import schema

T0 = 1_700_000_000_000_000_000
MiB = 1 << 20
EXPORT_PATH = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _kv(key, **v):
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(**v))


def pb_request(jobs, n: int = 1, spans=None) -> trace_service_pb2.ExportTraceServiceRequest:
    """A request with ``n`` step spans (or the given ``spans``) for each job name in ``jobs``."""
    req = trace_service_pb2.ExportTraceServiceRequest()
    for job in jobs:
        rs = req.resource_spans.add()
        rs.resource.attributes.extend([
            _kv(schema.RES_SERVICE_NAME, string_value=job),
            _kv(schema.RES_JOB_NAME, string_value=job), _kv(schema.RES_ATTEMPT, int_value=0),
            _kv(schema.RES_SCHEMA_VERSION, string_value=schema.SCHEMA_VERSION)])
        ss = rs.scope_spans.add()
        ss.scope.name = schema.SCOPE_NAME
        ss.spans.extend(spans if spans is not None else [trace_pb2.Span(
            trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"), name=schema.STEP,
            start_time_unix_nano=T0 + i * 10**9, end_time_unix_nano=T0 + (i + 1) * 10**9,
            attributes=[_kv(schema.ATTR_STEP, int_value=i)]) for i in range(n)])
    return req


def json_request(jobs, n: int = 1) -> bytes:
    """The same as :func:`pb_request`, as OTLP/JSON (hex ids)."""
    from google.protobuf.json_format import MessageToDict

    doc = MessageToDict(pb_request(jobs, n))
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for i, s in enumerate(ss["spans"]):  # OTLP/JSON ids are hex, not base64
                s["traceId"], s["spanId"] = "01" * 16, f"{i + 1:016x}"
    return json.dumps(doc).encode()


def empty_resource_spans(size: int, form: str) -> bytes:
    """A request of ``size`` bytes (at most) made of empty ``ResourceSpans`` messages:
    protobuf (``form="pb"``, 2 bytes each: tag 1, length 0) or OTLP/JSON (``"json"``,
    ``{}`` 3 bytes each). This is issue 38's amplification body."""
    if form == "pb":
        return b"\x0a\x00" * (size // 2)
    n = (size - len('{"resourceSpans":[]}')) // 3
    return b'{"resourceSpans":[' + b"{}," * (n - 1) + b"{}]}"


def malformed_bodies(victim: str) -> list[tuple[str, bytes]]:
    """``(content type, body)`` pairs that are not OTLP: each should get ``400`` and touch no
    job. Some name ``victim`` (the healthy job) so that a leak shows in its report."""
    res = {"attributes": [{"key": schema.RES_JOB_NAME, "value": {"stringValue": victim}},
                          {"key": schema.RES_SERVICE_NAME, "value": {"stringValue": victim}}]}
    j = "application/json"
    docs = [{"resourceSpans": 5}, {"resourceSpans": [5]}, {"resourceSpans": "x"},
            {"resourceSpans": [{"scopeSpans": 5}]}, {"resourceSpans": [{"resource": 5}]},
            {"resourceSpans": [{"resource": res, "scopeSpans": [{"spans": [5, "x"]}]}]},
            {"resourceSpans": [{"resource": res, "scopeSpans": [{"spans": [
                {"name": schema.STEP, "traceId": "zz", "spanId": 7,
                 "startTimeUnixNano": "x", "attributes": 5}]}]}]},
            [], 5, None]
    out = [(j, json.dumps(d).encode()) for d in docs]
    out += [(j, b"{not json"), (j, b'{"resourceSpans": [' * 64),
            ("application/x-protobuf", b"\xff" * 64), ("application/x-protobuf", b"\x0a\xff\xff")]
    return out


def huge_attribute_request(job: str, i: int, attr_bytes: int) -> bytes:
    """A custom badput span of a new type ``i`` carrying a string attribute ``attr_bytes``
    long (and a type of ``attr_bytes // 8``): issue 38's uncut attributes in the WAL."""
    span = trace_pb2.Span(
        trace_id=b"\x02" * 16, span_id=(i + 1).to_bytes(8, "big"), name=schema.CUSTOM_BADPUT,
        start_time_unix_nano=T0 + i * 10**9, end_time_unix_nano=T0 + i * 10**9 + 10**8,
        attributes=[_kv(schema.ATTR_BADPUT_TYPE,
                        string_value=f"t{i}-".ljust(max(attr_bytes // 8, 8), "x")),
                    _kv("note", string_value="n" * attr_bytes)])
    return pb_request([job], spans=[span]).SerializeToString()


def gzip_bomb(inflated: int) -> bytes:
    """``inflated`` bytes of zeros, gzip-compressed (about 1/1000 of it)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(MiB)
    return b"".join(z.compress(chunk) for _ in range(inflated // MiB)) + z.flush()
