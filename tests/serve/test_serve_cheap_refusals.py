"""goodput serve refuses cheaply (issue 38: under the abuse mix serve was CPU-bound by its
refusals, ~3 ms of CPU each).

- The parse estimate weighs a body's tag bytes in one pass (``tag_bytes``), the same sum as
  a count per tag byte, for bytes, bytearrays and memoryviews; a body of many tiny messages
  is bounded by its byte counts after ``MAX_WALK`` fields, a real request is walked exactly.
- A refusal is counted without waiting for the store's lock (held while a request is taken
  in), and a gRPC refusal is counted before its client sees it.
- A body refused before it is read is dropped by the kernel, yet the client that sent all
  of it reads the answer and a clean close, and the server goes on.
- The byte budget keeps its last part for small requests (an exporter's batch), unless a
  request comes alone; a small request refused for the budget keeps its connection.
- Appends of new jobs to the write-ahead log (under the store's lock) leave the fsyncs of
  new directories and of segments closed for ``max_open_files`` to the background thread;
  a replay reads everything back; ``fsync_interval_s=0`` still fsyncs in the append.

Real GoodputServer on loopback, real gRPC and HTTP clients; about 3 s.
"""

from __future__ import annotations

import http.client
import os
import socket
import threading

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from otlp_fixtures import T0_NS

from goodput import schema
from goodput_processor.serve import GoodputServer, LiveStore
from goodput_processor.serve import parse_budget as pb
from goodput_processor.serve.limits import ByteBudget, Limits
from goodput_processor.serve.wal import WriteAheadLog

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _kv(key, **v):
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(**v))


def _req(*jobs, n=3) -> trace_service_pb2.ExportTraceServiceRequest:
    req = trace_service_pb2.ExportTraceServiceRequest()
    for job in jobs:
        rs = req.resource_spans.add()
        rs.resource.attributes.extend([
            _kv(schema.RES_SERVICE_NAME, string_value=job),
            _kv(schema.RES_JOB_NAME, string_value=job), _kv(schema.RES_ATTEMPT, int_value=0)])
        ss = rs.scope_spans.add()
        ss.scope.name = schema.SCOPE_NAME
        ss.spans.extend(trace_pb2.Span(
            trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"), name=schema.STEP,
            start_time_unix_nano=T0_NS + i * 10**9, end_time_unix_nano=T0_NS + (i + 1) * 10**9,
            attributes=[_kv(schema.ATTR_STEP, int_value=i)]) for i in range(n))
    return req


def _counted(body) -> int:
    return sum(bytes(body).count(bytes([t])) * w for t, w in pb.TAG_BYTES.items())


def test_tag_bytes_is_the_sum_of_a_count_per_tag_byte():
    real = _req("a", "b", n=50).SerializeToString()
    for body in (os.urandom(3 * pb._CHUNK + 17), b"\x0a\x00" * 70_000, real, b"", b"\x12"):
        for form in (bytes, bytearray, memoryview):
            assert pb.tag_bytes(form(body)) == _counted(body)


def test_walk_is_exact_for_a_real_request_and_stops_for_tiny_messages():
    real = _req("a", "b", "c", n=20).SerializeToString()
    assert pb.structure_bound(real) == (3, 3)
    tiny = b"\x0a\x02\x12\x00" * (pb.MAX_WALK + 10)  # ResourceSpans of one empty ScopeSpans
    assert pb.structure_bound(tiny) == (tiny.count(b"\x0a"), tiny.count(b"\x12"))
    # the estimate still bounds them: their upb structs, Python objects and log parts
    n = pb.MAX_WALK + 10
    assert pb.protobuf_cost(tiny) >= n * (pb.RESOURCE_SPANS_BYTES + pb.SCOPE_SPANS_BYTES)


def test_a_refusal_is_counted_while_the_store_lock_is_held():
    store = LiveStore(min_interval_s=0)
    got = []
    with store._lock:  # (as while a big request is taken in)
        t = threading.Thread(target=lambda: got.append(store.count("refused_connections")))
        t.start()
        t.join(30)
        assert not t.is_alive() and got == [1]
    assert store.stats["refused_connections"] == 1


def _server(**limits) -> GoodputServer:
    return GoodputServer(LiveStore(min_interval_s=0), grpc_port=0, http_port=0,
                         token="s3cret", max_message_bytes=1 << 20, limits=Limits(**limits))


def test_grpc_wrong_token_is_counted_before_its_answer():
    srv = _server()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{srv.grpc.port}") as ch:
            call = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            for i in range(20):
                try:
                    call(b"\x0a\x00", metadata=(("authorization", "Bearer nope"),), timeout=20)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAUTHENTICATED
                assert srv.store.stats["refused_unauthenticated"] == i + 1
    finally:
        srv.stop(5, final=False)


def test_a_refused_body_sent_whole_is_dropped_and_answered():
    srv = _server()
    try:
        big = 24 << 20  # over --max-message-bytes and the sockets' buffers
        s = socket.create_connection(("127.0.0.1", srv.http.port), timeout=20)
        s.sendall((f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
                   f"Content-Type: application/x-protobuf\r\nContent-Length: {big}\r\n\r\n"
                   ).encode())
        s.sendall(bytes(big))  # all of it, before reading: the server drops what it gets
        answer = b""
        while chunk := s.recv(65536):  # ... then a clean close, not a reset
            answer += chunk
        s.close()
        head = answer.split(b"\r\n\r\n", 1)[0].decode()
        assert head.startswith("HTTP/1.1 413") and "Connection: close" in head
        assert b"--max-message-bytes" in answer
        assert srv.store.stats["refused_too_large"] == 1
        # the server goes on: a request that fits is taken in
        with grpc.insecure_channel(f"127.0.0.1:{srv.grpc.port}") as ch:
            call = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            call(_req("ok").SerializeToString(), metadata=(("authorization", "Bearer s3cret"),),
                 timeout=20)
        assert "ok" in srv.store.jobs()
    finally:
        srv.stop(5, final=False)


def test_the_budget_keeps_its_last_part_for_small_requests():
    b = ByteBudget(16 << 20, reserve=1 << 20)
    assert b.acquire(10 << 20) and not b.acquire(6 << 20)  # big: 15 MiB at most
    assert b.acquire(5 << 20) and not b.acquire(1)
    assert b.acquire(1 << 20, small=True) and b.used == b.capacity
    b.release(b.used)
    assert b.acquire(4 << 20) and b.acquire(12 << 20, own=4 << 20)  # alone: all of it
    assert not b.acquire(1, small=True)


def test_a_small_request_refused_for_the_budget_keeps_its_connection():
    srv = _server(max_inflight_bytes=8 << 20)
    budget = srv.http.budget
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.http.port, timeout=20)
        body = _req("small").SerializeToString()
        hdr = {"Authorization": "Bearer s3cret", "Content-Type": "application/x-protobuf"}
        assert budget.acquire(budget.capacity, small=True)  # (all of it held elsewhere)
        conn.request("POST", "/v1/traces", body=body, headers=hdr)
        r = conn.getresponse()
        r.read()
        assert r.status == 503 and r.getheader("Retry-After") == "1"
        assert r.getheader("Connection") is None  # kept
        sock = conn.sock
        budget.release(budget.capacity)
        conn.request("POST", "/v1/traces", body=body, headers=hdr)
        r = conn.getresponse()
        r.read()
        assert r.status == 200 and conn.sock is sock  # the same connection
        conn.close()
        assert srv.store.stats["refused_inflight"] == 1 and "small" in srv.store.jobs()
    finally:
        srv.stop(5, final=False)


def test_wal_appends_of_new_jobs_leave_their_fsyncs_to_the_background(tmp_path):
    wal = WriteAheadLog(tmp_path / "a", max_open_files=4)  # (no thread started)
    for i in range(20):
        wal.append(f"job-{i}", b'{"n": %d}\n' % i)
    assert wal.fsyncs == 0  # none in the appends: 16 segments closed, 21 directories new
    assert len(wal._open) == 4 and len(wal._closing) == 16 and len(wal._dirs) == 21
    wal.sync()
    assert wal.fsyncs == 20 and not wal._closing and not wal._dirs
    wal.close()
    lines = []
    WriteAheadLog(tmp_path / "a").replay(lambda line, where: lines.append(line))
    assert sorted(lines) == sorted(b'{"n": %d}\n' % i for i in range(20))
    eager = WriteAheadLog(tmp_path / "b", fsync_interval_s=0, max_open_files=4)
    for i in range(20):
        eager.append(f"job-{i}", b"{}\n")
    assert eager.fsyncs == 20 and not eager._closing and not eager._dirs
    eager.close()
