"""What the acceptance of issue 38 measures while serve is attacked: ``/healthz`` asked once a
second (a fresh connection each time, 1 s to answer), and a healthy job exported by the
OpenTelemetry SDK's own OTLP exporters (gRPC and HTTP), each export's latency recorded
(seconds)."""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from goodput import schema

T0 = 1_700_000_000_000_000_000


@dataclass
class Health:
    """``/healthz`` once a second: ``asked`` times, ``ok`` of them 200 within ``timeout_s``;
    ``misses`` holds ``(second since start, status or error)`` of the others."""

    asked: int = 0
    ok: int = 0
    misses: list = field(default_factory=list)
    worst_s: float = 0.0


def probe_health(base: str, stop: threading.Event, out: Health, timeout_s: float = 1.0):
    """Ask ``base/healthz`` every second until ``stop``; count into ``out``."""
    t0 = nxt = time.monotonic()
    while not stop.is_set():
        t = time.monotonic()
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=timeout_s) as r:
                r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        except OSError as e:
            status = type(e).__name__
        took = time.monotonic() - t
        out.asked += 1
        out.worst_s = max(out.worst_s, took)
        if status == 200 and took <= timeout_s:
            out.ok += 1
        else:
            out.misses.append((round(t - t0, 1), status if status != 200 else "late"))
        nxt += 1.0
        stop.wait(max(0.0, nxt - time.monotonic()))


@dataclass
class Exports:
    """One healthy exporter's exports: when each began (seconds since the attack began),
    its latency (s) and whether it was acknowledged. Only those begun while the attack
    ran (``0 <= start < window_s``) count as attacked; a late exporter's backlog, sent
    after the attack, does not."""

    job: str
    protocol: str
    window_s: float = 0.0
    starts: list = field(default_factory=list)
    latencies: list = field(default_factory=list)
    acked: list = field(default_factory=list)  # bool per export
    acked_steps: int = 0
    wall_starts: list = field(default_factory=list)  # time.time() at each export's start
    #: HTTP only: the answers other than 200 (a retried export gets several), as
    #: ``[s since the attack began, status]``
    answers: list = field(default_factory=list)

    def attacked(self) -> list[int]:
        """Indexes of the exports begun while the attack ran."""
        return [i for i, t in enumerate(self.starts) if 0 <= t < self.window_s]

    def summary(self) -> dict:
        """``exports``, ``acked``, ``within_1s``, ``p50_s``, ``max_s``: of the attacked
        exports; ``total``, ``acked_all``, ``acked_steps``: of all, quiet ones included."""
        during = self.attacked()
        lat = sorted(self.latencies[i] for i in during) or [0.0]
        return {"exports": len(during), "acked": sum(self.acked[i] for i in during),
                "within_1s": sum(1 for i in during
                                 if self.acked[i] and self.latencies[i] <= 1.0),
                "p50_s": round(lat[len(lat) // 2], 3), "max_s": round(lat[-1], 3),
                "total": len(self.acked), "acked_all": sum(self.acked),
                "acked_steps": self.acked_steps, "not_200": self.answers}


class HealthyJob:
    """A training job's step spans made with the OTel SDK (fixed times, so two copies under
    two job names give the same report) and sent by its OTLP exporter, ``steps_per_export``
    steps at a time (one export a second while attacked).

    Args:
        job: the job name (``goodput.job.name`` and ``service.name``).
        protocol: ``"grpc"`` (target ``host:port``) or ``"http"`` (base URL).
        target: where serve listens for that protocol.
        token: the bearer token, or None.
        exports, steps_per_export: how many exports, of how many step spans each.
    """

    def __init__(self, job: str, protocol: str, target: str, token: str | None,
                 exports: int, steps_per_export: int = 10, timeout_s: float = 10.0):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SpanExporter

        self.out = Exports(job, protocol)
        self.t0: float | None = None  # when the attack began (set by the caller)
        self.exports, self.per = exports, steps_per_export
        res = Resource.create({schema.RES_SERVICE_NAME: job, schema.RES_JOB_NAME: job,
                               schema.RES_ATTEMPT: 0, schema.RES_SERVICE_INSTANCE_ID: "p0",
                               schema.RES_HOST_NAME: "h0", schema.RES_PROCESS_INDEX: 0,
                               schema.RES_PROCESS_COUNT: 1,
                               schema.RES_SCHEMA_VERSION: schema.SCHEMA_VERSION})
        self._provider = TracerProvider(resource=res)
        self._tracer = self._provider.get_tracer(schema.SCOPE_NAME)
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            self.exporter: SpanExporter = OTLPSpanExporter(
                endpoint=target, insecure=True, timeout=timeout_s,
                headers=(("authorization", f"Bearer {token}"),) if token else None)
        else:
            import requests
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            session = requests.Session()  # (its hook notes each answer other than 200)
            session.hooks["response"].append(self._answer)
            self.exporter = OTLPSpanExporter(
                endpoint=target + "/v1/traces", timeout=timeout_s, session=session,
                headers={"Authorization": f"Bearer {token}"} if token else None)
        logging.getLogger("opentelemetry.exporter").setLevel(logging.CRITICAL)

    def _answer(self, r, *args, **kwargs) -> None:
        if r.status_code != 200:
            t = -1.0 if self.t0 is None else round(time.monotonic() - self.t0, 2)
            self.out.answers.append([t, r.status_code])

    def batch(self, k: int) -> list:
        """Export ``k``'s spans: steps ``k*per .. (k+1)*per - 1``, 1 s each."""
        spans = []
        for i in range(k * self.per, (k + 1) * self.per):
            s = self._tracer.start_span(schema.STEP, start_time=T0 + i * 10**9,
                                        attributes={schema.ATTR_STEP: i})
            s.end(end_time=T0 + (i + 1) * 10**9)
            spans.append(s)
        return spans

    def export_one(self, k: int) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        spans = self.batch(k)
        t = time.monotonic()
        self.out.wall_starts.append(time.time())
        ok = self.exporter.export(spans) == SpanExportResult.SUCCESS
        self.out.starts.append(-1.0 if self.t0 is None else t - self.t0)  # -1: quiet
        self.out.latencies.append(time.monotonic() - t)
        self.out.acked.append(ok)
        self.out.acked_steps += len(spans) if ok else 0

    def run(self, stop: threading.Event | None = None, every_s: float = 0.0,
            first: int = 0) -> Exports:
        """Exports ``first`` .. ``exports - 1``, one each ``every_s`` seconds (a late one goes
        at once); stops early only when ``stop`` is set and a grace of 30 s has passed."""
        nxt = time.monotonic()
        grace = None
        for k in range(first, self.exports):
            if stop is not None and stop.is_set():
                grace = grace or time.monotonic() + 30
                if time.monotonic() > grace:
                    break
            self.export_one(k)
            nxt += every_s
            time.sleep(max(0.0, nxt - time.monotonic()))
        self.exporter.shutdown()
        return self.out
