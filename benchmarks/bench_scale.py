"""A simulated job of many hosts against a real ``goodput serve`` (and the spool reader).

Three parts, each printing one row of the table at the end:

1. ``otlp-burst``: ``goodput serve`` runs as its own OS process (loopback gRPC). ``--senders``
   OS processes each simulate ``hosts / senders`` hosts: every host exports its own process's
   spans (job_start, accelerator_init, training_prep, restore, program_startup, data loading +
   step per step, checkpoint saves; ``--restarts`` kills and resumes from the last
   checkpoint). Requests are batched as a Collector gateway batches them (many hosts'
   ResourceSpans per request, up to ``--batch`` spans). The whole history is sent as fast
   as the server takes it: sustained spans/s, RSS of the serve process, then the time of
   one full report (``GET /v1/report``) and that the straggler host is found.
2. ``otlp-live``: the same hosts stepping in real time (``--step-time`` seconds per step,
   ``--live-seconds`` long, one restart halfway when ``--restarts`` > 0); each sender flushes
   every ``--flush`` seconds (an SDK batch processor / gateway batch timeout). The lag is the
   time from the primary host ending step *k* to ``goodput_max_productive_step`` >= *k* on the
   Prometheus endpoint of ``goodput serve`` (a published metric), polled every 0.2 s.
3. ``spool``: one spool file per host and attempt (the recorder's layout) read by
   ``goodput report --format json`` (wall time, peak RSS) and by ``goodput serve
   --spool-dir`` (time until it listens, i.e. the first full read, then a report).

    python benchmarks/bench_scale.py [--hosts 4096] [--steps 30] [--restarts 1]
        [--senders 3] [--batch 2048] [--live-seconds 30] [--step-time 1.0] [--flush 1.0]
        [--skip live,spool]

One host (index ``hosts * 3 // 5``) has 1.3x the others' step time; the report must name it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SEC = 1_000_000_000
JOB_BURST, JOB_LIVE = "scale-burst", "scale-live"
CKPT_EVERY = 5


def _env():
    env = dict(os.environ)
    paths = [str(ROOT / "src"), str(ROOT / "collectors")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


# -- the simulated hosts ----------------------------------------------------------------

def host_spans(host: int, hosts: int, base_ns: int, steps: int, restarts: int, period_s: float,
               slow_host: int):
    """Spans of one host over all attempts: (end_ns, attempt, name, start_ns, attrs), by end.

    Each attempt: job_start, accelerator_init 2 periods, training_prep 1, restore 1 (after
    the first), program_startup 2, then ``steps`` steps of one period (10% data loading,
    60% step, 78% on the slow host), a 0.3-period blocking save every CKPT_EVERY steps; an
    attempt before the last is killed after its last step (no job_end) and the next starts
    5 periods later, resuming from the last checkpoint; the last ends with job_end.
    """
    from goodput import schema

    p = round(period_s * SEC)
    out = []
    t = base_ns
    resume = 0
    for attempt in range(restarts + 1):
        def add(name, s, e, attrs=None, attempt=attempt):
            out.append((e, attempt, name, s, attrs or {}))
        add(schema.JOB_START, t, t, {schema.ATTR_HEARTBEAT_INTERVAL_MS: 10_000})
        add(schema.ACCELERATOR_INIT, t, t + 2 * p)
        add(schema.TRAINING_PREP, t + 2 * p, t + 3 * p)
        t += 3 * p
        if attempt:
            add(schema.CHECKPOINT_RESTORE, t, t + p, {schema.ATTR_CHECKPOINT_STEP: resume})
            t += p
        add(schema.PROGRAM_STARTUP, t, t + 2 * p)
        t += 2 * p
        last_ckpt = resume
        for n in range(resume + 1, resume + steps + 1):
            add(schema.DATA_LOADING, t, t + p // 10)
            d = p * (78 if host == slow_host else 60) // 100
            add(schema.STEP, t + p // 10, t + p // 10 + d, {schema.ATTR_STEP: n})
            t += p
            if n % CKPT_EVERY == 0:
                add(schema.CHECKPOINT_SAVE, t, t + 3 * p // 10,
                    {schema.ATTR_CHECKPOINT_STEP: n, schema.ATTR_BLOCKING: True})
                t += 3 * p // 10
                last_ckpt = n
        if attempt == restarts:
            add(schema.JOB_END, t, t, {schema.ATTR_END_REASON: "exit"})
        else:
            t += 5 * p
        resume = last_ckpt
    out.sort(key=lambda s: s[0])
    return out


def _kv(key, v):
    from opentelemetry.proto.common.v1 import common_pb2

    if isinstance(v, bool):
        val = common_pb2.AnyValue(bool_value=v)
    elif isinstance(v, int):
        val = common_pb2.AnyValue(int_value=v)
    else:
        val = common_pb2.AnyValue(string_value=str(v))
    return common_pb2.KeyValue(key=key, value=val)


class _Batcher:
    """Gateway-style batching: ResourceSpans of many hosts, up to ``batch`` spans a request."""

    def __init__(self, job, hosts, batch):
        self.job, self.hosts, self.batch = job, hosts, batch
        self.pending: list = []  # (host, attempt, spans)
        self.n = 0

    def add(self, host, attempt, spans):
        self.pending.append((host, attempt, spans))
        self.n += len(spans)

    def requests(self):
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
        from opentelemetry.proto.common.v1 import common_pb2
        from opentelemetry.proto.trace.v1 import trace_pb2

        from goodput import schema

        req, size = trace_service_pb2.ExportTraceServiceRequest(), 0
        for host, attempt, spans in self.pending:
            res = [_kv(schema.RES_SERVICE_NAME, self.job), _kv(schema.RES_JOB_NAME, self.job),
                   _kv(schema.RES_ATTEMPT, attempt), _kv(schema.RES_PROCESS_INDEX, host),
                   _kv(schema.RES_PROCESS_COUNT, self.hosts),
                   _kv(schema.RES_HOST_NAME, f"host-{host:05d}"),
                   _kv(schema.RES_SCHEMA_VERSION, schema.SCHEMA_VERSION)]
            tid = (host * 1000 + attempt + 1).to_bytes(16, "big")
            pb = [trace_pb2.Span(trace_id=tid, span_id=sid.to_bytes(8, "big"), name=name,
                                 start_time_unix_nano=s, end_time_unix_nano=e,
                                 attributes=[_kv(k, v) for k, v in attrs.items()])
                  for sid, (e, _a, name, s, attrs) in spans]
            for i in range(0, len(pb), self.batch):
                chunk = pb[i : i + self.batch]
                if size + len(chunk) > self.batch and size:
                    yield req.SerializeToString(), size
                    req, size = trace_service_pb2.ExportTraceServiceRequest(), 0
                rs = req.resource_spans.add()
                rs.resource.attributes.extend(res)
                ss = rs.scope_spans.add(scope=common_pb2.InstrumentationScope(
                    name=schema.SCOPE_NAME))
                ss.spans.extend(chunk)
                size += len(chunk)
        if size:
            yield req.SerializeToString(), size
        self.pending, self.n = [], 0


def sender(cfg: dict) -> int:
    """One sender process: hosts [lo, hi); prints JSON lines (``ready``, then ``done``)."""
    import grpc

    lo, hi, mode = cfg["lo"], cfg["hi"], cfg["mode"]
    ch = grpc.insecure_channel(cfg["endpoint"], options=[
        ("grpc.max_send_message_length", 64 << 20)])
    export = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                            request_serializer=None, response_deserializer=None)
    per_host = {h: [(i + (h << 32), s) for i, s in enumerate(host_spans(
        h, cfg["hosts"], cfg["base_ns"], cfg["steps"], cfg["restarts"], cfg["period_s"],
        cfg["slow_host"]))] for h in range(lo, hi)}
    if mode == "burst":
        b = _Batcher(cfg["job"], cfg["hosts"], cfg["batch"])
        for h, spans in per_host.items():
            for attempt in sorted({s[1] for _, s in spans}):
                b.add(h, attempt, [x for x in spans if x[1][1] == attempt])
        payloads = list(b.requests())
        print(json.dumps({"ready": len(payloads)}), flush=True)
        sys.stdin.readline()  # go
        t0 = time.time()
        n = 0
        for raw, k in payloads:
            export(raw, timeout=120)
            n += k
        print(json.dumps({"spans": n, "t0": t0, "t1": time.time()}), flush=True)
        return 0
    # live: send what has ended every flush interval
    print(json.dumps({"ready": 0}), flush=True)
    sys.stdin.readline()
    pos = dict.fromkeys(per_host, 0)
    n = 0
    while True:
        now = time.time_ns()
        b = _Batcher(cfg["job"], cfg["hosts"], cfg["batch"])
        left = False
        for h, spans in per_host.items():
            i = pos[h]
            j = i
            while j < len(spans) and spans[j][1][0] <= now:
                j += 1
            pos[h] = j
            left |= j < len(spans)
            by_attempt: dict[int, list] = {}
            for x in spans[i:j]:
                by_attempt.setdefault(x[1][1], []).append(x)
            for attempt, xs in by_attempt.items():
                b.add(h, attempt, xs)
        for raw, k in b.requests():
            export(raw, timeout=120)
            n += k
        if not left:
            break
        time.sleep(max(0.0, cfg["flush"] - (time.time_ns() - now) / SEC))
    print(json.dumps({"spans": n}), flush=True)
    return 0


# -- the serve process --------------------------------------------------------------------

def start_serve(*extra):
    cmd = [sys.executable, "-m", "goodput_processor.cli", "serve", *extra]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         text=True)
    line = p.stderr.readline()
    if "listening" not in line:
        raise RuntimeError(f"goodput serve did not start: {line}{p.stderr.read()}")
    threading.Thread(target=p.stderr.read, daemon=True).start()  # drain
    addr = dict(kv.split("=", 1) for kv in line.split("listening", 1)[1].split())
    return p, addr, time.perf_counter() - t0


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB."""
    vals = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                vals[line.split(":")[0]] = int(line.split()[1]) / 1024
    return vals.get("VmRSS", 0.0), vals.get("VmHWM", 0.0)


def get(url: str, timeout=300):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _senders(args, endpoint, job, mode, base_ns, slow):
    per = -(-args.hosts // args.senders)
    procs = []
    for k in range(args.senders):
        lo, hi = k * per, min(args.hosts, (k + 1) * per)
        if lo >= hi:
            break
        cfg = dict(lo=lo, hi=hi, hosts=args.hosts, mode=mode, endpoint=endpoint, job=job,
                   base_ns=base_ns, steps=args.steps if mode == "burst" else args.live_steps,
                   restarts=args.restarts if mode == "burst" else min(args.restarts, 1),
                   period_s=args.step_time if mode == "live" else 1.0, slow_host=slow,
                   batch=args.batch, flush=args.flush)
        procs.append(subprocess.Popen([sys.executable, __file__, "--sender", json.dumps(cfg)],
                                      env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True))
    ready = [json.loads(p.stdout.readline()) for p in procs]
    return procs, ready


def _go(procs):
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()


def _finish(procs):
    out = [json.loads(p.stdout.readline()) for p in procs]
    for p in procs:
        p.wait(60)
    return out


def _check_straggler(job: dict, slow: int) -> str:
    s = job.get("stragglers")
    if not s:
        return "no straggler report"
    top = s["slowest"][0]
    ok = top["process"] == slow and s["hosts"] > 1
    return (f"{'OK' if ok else 'WRONG'}: {top['host']} {top['ratio']:.2f}x of "
            f"{s['hosts']} hosts")


def part_burst(args, rows, slow):
    srv, addr, _ = start_serve("--grpc-port", "0", "--http-port", "0")
    try:
        rss0 = rss_mb(srv.pid)[0]
        procs, ready = _senders(args, addr["grpc"], JOB_BURST, "burst",
                                1_700_000_000 * SEC, slow)
        _go(procs)
        done = _finish(procs)
        spans = sum(d["spans"] for d in done)
        wall = max(d["t1"] for d in done) - min(d["t0"] for d in done)
        rss, hwm = rss_mb(srv.pid)
        t = time.perf_counter()
        rep = json.loads(get(addr["http"] + f"/v1/report?job={JOB_BURST}"))["jobs"][0]
        t_rep = time.perf_counter() - t
        rss2, hwm2 = rss_mb(srv.pid)
        steps = sum(a["steps_kept"] + a["steps_wasted"] for a in rep["attempts"])
        rows.append(("otlp-burst", f"{spans:,} spans from {args.hosts} hosts, "
                     f"{sum(r['ready'] for r in ready):,} requests of <= {args.batch}",
                     f"{spans / wall:,.0f} spans/s ({wall:.1f} s)",
                     f"RSS {rss:.0f} MB (idle {rss0:.0f}; peak {max(hwm, hwm2):.0f} after "
                     "report)",
                     f"report {t_rep:.2f} s; primary steps {steps}; "
                     + _check_straggler(rep, slow)))
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(60)


def part_live(args, rows, slow):
    srv, addr, _ = start_serve("--grpc-port", "0", "--http-port", "0", "--prometheus-port", "0")
    prom = addr["prometheus"]
    try:
        base = time.time_ns() + int(3 * SEC)  # senders start in 3 s
        procs, _ = _senders(args, addr["grpc"], JOB_LIVE, "live", base, slow)
        _go(procs)
        # step k of the primary ends at ends[k]
        # (a step redone after the restart counts from its first end: the metric first
        # reaches k then; later it drops to the checkpoint and climbs again)
        ends: dict[int, int] = {}
        for s in host_spans(0, args.hosts, base, args.live_steps, min(args.restarts, 1),
                            args.step_time, slow):
            if s[2] == "goodput.step":
                ends.setdefault(s[4]["goodput.step"], s[0])
        seen: dict[int, int] = {}
        pat = re.compile(rb'goodput_max_productive_step\{[^}]*job_name="%s"[^}]*\} ([0-9.e+]+)'
                         % JOB_LIVE.encode())
        scrape_s = []
        stop = threading.Event()
        result = {}

        def poll():
            best = 0
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    m = pat.search(get(prom, timeout=60))
                except OSError:
                    m = None
                scrape_s.append(time.perf_counter() - t)
                now = time.time_ns()
                if m:
                    v = int(float(m.group(1)))
                    for k in range(best + 1, v + 1):
                        seen.setdefault(k, now)
                    best = max(best, v)
                time.sleep(0.2)
            result["best"] = best

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        done = _finish(procs)
        time.sleep(max(3.0, 2 * args.flush))
        stop.set()
        th.join(120)
        rss, hwm = rss_mb(srv.pid)
        lags = np.array([(seen[k] - ends[k]) / SEC for k in sorted(seen) if k in ends])
        spans = sum(d["spans"] for d in done)
        lag = (f"lag p50/p90/max {np.percentile(lags, 50):.2f}/{np.percentile(lags, 90):.2f}/"
               f"{lags.max():.2f} s over {len(lags)} steps" if len(lags) else "no step seen")
        rep = json.loads(get(addr["http"] + f"/v1/report?job={JOB_LIVE}"))["jobs"][0]
        rows.append(("otlp-live", f"{spans:,} spans, {args.hosts} hosts stepping every "
                     f"{args.step_time} s, flush {args.flush} s",
                     f"{spans / (args.live_seconds or 1):,.0f} spans/s offered",
                     f"RSS {rss:.0f} MB (peak {hwm:.0f})",
                     f"{lag}; scrape p50 {np.median(scrape_s):.2f} s; "
                     + _check_straggler(rep, slow)))
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(60)


def write_spool(out_dir: Path, args, slow) -> tuple[int, int]:
    """One OTLP JSON spool file per host and attempt; returns (files, spans)."""
    from goodput import config, schema
    from goodput.spool import encode_attributes

    files = spans_n = 0
    for h in range(args.hosts):
        spans = host_spans(h, args.hosts, 1_700_000_000 * SEC, args.steps, args.restarts, 1.0,
                           slow)
        for attempt in sorted({s[1] for s in spans}):
            res = {schema.RES_SERVICE_NAME: "scale-spool", schema.RES_JOB_NAME: "scale-spool",
                   schema.RES_ATTEMPT: attempt, schema.RES_PROCESS_INDEX: h,
                   schema.RES_PROCESS_COUNT: args.hosts, schema.RES_HOST_NAME: f"host-{h:05d}",
                   schema.RES_SCHEMA_VERSION: schema.SCHEMA_VERSION}
            tid = f"{h * 1000 + attempt + 1:032x}"
            rows = [{"traceId": tid, "spanId": f"{(h << 32) + i:016x}", "name": name, "kind": 1,
                     "startTimeUnixNano": str(s), "endTimeUnixNano": str(e),
                     "attributes": encode_attributes(attrs), "status": {}}
                    for i, (e, a, name, s, attrs) in enumerate(spans) if a == attempt]
            with open(config.spool_path(str(out_dir), h, attempt, f"h{h:07d}"), "w") as f:
                for i in range(0, len(rows), 512):
                    req = {"resourceSpans": [{"resource": {"attributes": encode_attributes(res)},
                           "scopeSpans": [{"scope": {"name": schema.SCOPE_NAME},
                                           "spans": rows[i : i + 512]}]}]}
                    f.write(json.dumps(req, separators=(",", ":")) + "\n")
            files += 1
            spans_n += len(rows)
    return files, spans_n


def part_spool(args, rows, slow):
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as d:
        t = time.perf_counter()
        files, spans = write_spool(Path(d), args, slow)
        t_write = time.perf_counter() - t
        size = sum(f.stat().st_size for f in Path(d).iterdir())
        t = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "goodput_processor.cli", "report", d,
                              "--format", "json"], env=_env(), stdout=subprocess.PIPE)
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)
        t_rep = time.perf_counter() - t
        rep = json.loads(out)["jobs"][0]
        rows.append(("spool-report", f"{files:,} files, {spans:,} spans, {size / 1e6:.0f} MB "
                     f"(written in {t_write:.1f} s)", f"{spans / t_rep:,.0f} spans/s "
                     f"({t_rep:.1f} s incl. start)", f"peak RSS {ru.ru_maxrss / 1024:.0f} MB",
                     _check_straggler(rep, slow)))
        srv, addr, t_listen = start_serve("--grpc-port", "off", "--http-port", "0",
                                          "--spool-dir", d)
        try:
            t = time.perf_counter()
            rep = json.loads(get(addr["http"] + "/v1/report?job=scale-spool"))["jobs"][0]
            t_r = time.perf_counter() - t
            rss, hwm = rss_mb(srv.pid)
            rows.append(("spool-serve", f"{files:,} files tailed (--spool-dir)",
                         f"{spans / t_listen:,.0f} spans/s (first read {t_listen:.1f} s "
                         "incl. start)", f"RSS {rss:.0f} MB (peak {hwm:.0f})",
                         f"report {t_r:.2f} s; " + _check_straggler(rep, slow)))
        finally:
            srv.send_signal(signal.SIGTERM)
            srv.wait(60)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=30, help="steps per attempt (burst, spool)")
    ap.add_argument("--restarts", type=int, default=1)
    ap.add_argument("--senders", type=int, default=3, help="sender OS processes")
    ap.add_argument("--batch", type=int, default=2048, help="spans per request (gateway batch)")
    ap.add_argument("--live-seconds", type=float, default=30.0)
    ap.add_argument("--step-time", type=float, default=1.0, help="live step period (s)")
    ap.add_argument("--flush", type=float, default=1.0, help="live flush interval (s)")
    ap.add_argument("--skip", default="", help="comma list of burst,live,spool to skip")
    ap.add_argument("--sender", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.sender:
        return sender(json.loads(args.sender))
    if args.hosts < 2 or args.senders < 1 or args.steps < 1:
        ap.error("need --hosts >= 2, --senders >= 1, --steps >= 1")
    # live: attempts of (6 + steps) periods (+ restore, recovery) fill --live-seconds
    per_attempt = args.live_seconds / args.step_time / (2 if args.restarts else 1)
    args.live_steps = max(1, int(per_attempt) - 8)
    slow = args.hosts * 3 // 5
    skip = set(filter(None, args.skip.split(",")))
    rows: list[tuple] = []
    for name, fn in (("burst", part_burst), ("live", part_live), ("spool", part_spool)):
        if name not in skip:
            t = time.perf_counter()
            fn(args, rows, slow)
            print(f"[{name} done in {time.perf_counter() - t:.0f} s]", file=sys.stderr,
                  flush=True)
    print(f"\nbench_scale: {args.hosts} hosts, {args.steps} steps x {args.restarts + 1} attempts "
          f"(burst/spool), {args.senders} senders, {os.cpu_count()} CPUs")
    print("| part | input | rate | memory | result |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
