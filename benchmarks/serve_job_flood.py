"""A job-name flood against ``goodput serve``'s job slots (issue 38, item 5).

One client (127.0.0.2, as the HTTP client's source address) sends ``--names`` new job
names, one job start marker each, over OTLP/HTTP JSON to an in-process serve with the
default limits (or ``--max-jobs`` / ``--max-jobs-per-client``); then another client
(127.0.0.1) sends a new job. Prints how many names were acknowledged and refused, the time,
the jobs tracked, whether the other client's job got a slot, and the refusal's text.

    python benchmarks/serve_job_flood.py [--names 999]
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import time

from goodput import schema
from goodput_processor.serve import GoodputServer, LiveStore
from goodput_processor.serve.limits import Limits

T0_NS = 1_700_000_000 * 10**9


def _req(job: str) -> bytes:
    kv = [{"key": k, "value": {"stringValue": job}} for k in (schema.RES_JOB_NAME,
                                                             schema.RES_SERVICE_NAME)]
    span = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1", "name": schema.JOB_START,
            "startTimeUnixNano": str(T0_NS), "endTimeUnixNano": str(T0_NS)}
    return json.dumps({"resourceSpans": [{"resource": {"attributes": kv}, "scopeSpans": [
        {"scope": {"name": schema.SCOPE_NAME}, "spans": [span]}]}]}).encode()


def _post(port: int, body: bytes, source: str) -> tuple[int, str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20, source_address=(source, 0))
    try:
        c.request("POST", "/v1/traces", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--names", type=int, default=999)
    ap.add_argument("--max-jobs", type=int, default=Limits.max_jobs)
    ap.add_argument("--max-jobs-per-client", type=int, default=None)
    a = ap.parse_args()
    store = LiveStore(min_interval_s=0, limits=Limits(
        max_jobs=a.max_jobs, max_jobs_per_client=a.max_jobs_per_client))
    srv = GoodputServer(store, grpc_port=None, http_port=0)
    port = srv.http.port
    try:
        t0 = time.monotonic()
        answers = collections.Counter(_post(port, _req(f"flood-{i}"), "127.0.0.2")[0]
                                      for i in range(a.names))
        took = time.monotonic() - t0
        other = _post(port, _req("train"), "127.0.0.1")[0]
        refusal = _post(port, _req("flood-again"), "127.0.0.2")[1]
        print(f"flood of {a.names} names from 127.0.0.2: {dict(answers)} in {took:.1f} s; "
              f"jobs tracked {len(store.jobs())}; slots per client {store.slots.per_client}; "
              f"a new job from 127.0.0.1: {other}")
        print(f"refusal: {refusal}")
    finally:
        srv.stop(5, final=False)


if __name__ == "__main__":
    main()
