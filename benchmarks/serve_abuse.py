"""Abuse of ``goodput serve`` (issue 38's acceptance): every attack at once, and does serve
hold?

Starts ``goodput serve`` as a real subprocess on loopback with the write-ahead log on
(``--wal-dir``), a bearer token (``--token-file``) and the limit flags. Two quiet copies of a
healthy job go in first (the OTel SDK's OTLP exporters, gRPC and HTTP). Then, for
``--duration`` seconds, the attacks of ``--attacks`` (default all; see
:mod:`abuse.attacks`: ``amplify``, ``wrongtoken``, ``stalled``, ``idle``, ``malformed``,
``hugeattr``, ``flood``, ``slowloris``, ``bomb``) run, each from a process of its own, while
this one measures:

- serve's resident memory (``VmRSS`` every ``--sample`` s, the kernel's peak ``VmHWM`` at
  the end) against :meth:`Result.ceiling_bytes`;
- ``/healthz`` once a second (a miss: not 200 within 1 s);
- the same healthy job exported again under the attack, one export a second over gRPC and
  one over HTTP, each export's latency (acknowledged within 1 s?), and its report against
  the quiet copy's (the job name aside);
- at the end serve is stopped (SIGTERM; ``--sigkill``: SIGKILL) and started again on the
  same WAL: every job whose spans were acknowledged (the healthy ones, the job-name
  flood's, the huge attributes') must be in the report with every acknowledged step.

Prints a table; ``--json`` prints the :class:`Result` too; exit status 0 only when every
check holds. ``run(Config(...))`` returns the Result (``tests/serve/test_serve_limits.py`` runs a
short one).

The ceiling (:meth:`Result.ceiling_bytes`), from the limits: ``baseline +
max_inflight_bytes + max_connections x 256 KiB + margin`` (the RSS after start and the
quiet jobs; request bodies, inflated and parsed, held at once; a thread's stack and buffers
per connection; ``--margin``, default 96 MiB, for what the store keeps of at most
``--max-jobs`` jobs with attributes cut, gRPC's own buffers and the allocator's slack).

    python benchmarks/serve_abuse.py --duration 60 [--attacks amplify,stalled] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from abuse import serve as sv  # noqa: E402
from abuse.attacks import ATTACKS  # noqa: E402
from abuse.bodies import MiB  # noqa: E402
from abuse.probes import Health, HealthyJob, probe_health  # noqa: E402

FLAGS = sv.FLAGS


@dataclass
class Config:
    """One abuse run (sizes in bytes, times in seconds; attack parameters as in
    :mod:`abuse.attacks`)."""

    duration_s: float = 60.0
    attacks: tuple = ATTACKS
    amplify_mib: tuple = (1, 4, 16)
    amplify_clients: int = 3
    wrongtoken_calls: int = 96
    wrongtoken_bytes: int = 15 * MiB
    stalled_calls: int = 300
    idle_connections: int = 260
    malformed_pause_s: float = 0.01
    attr_bytes: int = 12 * MiB
    jobs: int = 1_000_000
    jobs_per_request: int = 25
    http_flooders: int = 3
    slowloris: int = 200
    slowloris_bytes: int = 15 * MiB
    bomb_bytes: int = 256 * MiB
    margin_bytes: int = 96 * MiB
    sample_s: float = 0.2
    #: serve is SIGKILLed past this RSS, to spare the machine (the run then fails)
    rss_kill_bytes: int = 6 << 30
    token: str | None = "abuse-run-token"
    export_every_s: float = 1.0
    steps_per_export: int = 10
    serve_args: tuple = ()  # more ``goodput serve`` flags, as given
    #: ``--health-port 0`` where serve has it (``/healthz`` probed there), else the HTTP port
    health_port: bool = True
    #: stop serve before the restart with SIGKILL instead of SIGTERM
    sigkill: bool = False
    #: ``os.nice`` of the attackers' processes (0: serve's priority). On one machine the
    #: attackers take serve's CPU, which attackers on other machines would not: 10 models
    #: those, and a run should report both.
    attacker_nice: int = 0
    #: CPUs the attackers run on (``os.sched_setaffinity``); serve, the healthy exporters and
    #: the probes run on the others. Empty: all share every CPU. On a 2-core machine ``(1,)``
    #: models attackers on other machines more closely than a nice level: their CPU time is
    #: not serve's (the loopback network and the kernel stay shared).
    attacker_cpus: tuple = ()
    #: ``goodput serve`` limits (Limits field names; None: the serve default).
    limits: dict = field(default_factory=lambda: {
        "max_connections": 256, "max_inflight_bytes": 256 * MiB, "max_message_bytes": 16 * MiB,
        "request_timeout_s": 10, "max_jobs": 1000, "max_custom_types": 64,
        "max_attribute_bytes": 1024})


@dataclass
class Result:
    """What one run saw (bytes, seconds)."""

    config: Config
    baseline_rss: int = 0
    peak_rss: int = 0  # sampled every sample_s
    hwm_rss: int = 0  # the kernel's peak (VmHWM)
    final_rss: int = 0
    samples: int = 0
    answers: dict = field(default_factory=dict)  # attack -> {status: count}
    health: dict = field(default_factory=dict)  # asked, ok, misses, worst_s
    exports: dict = field(default_factory=dict)  # protocol -> Exports.summary()
    export_latencies: dict = field(default_factory=dict)  # protocol -> [(start, s, acked)]
    healthy_unchanged: dict = field(default_factory=dict)  # protocol -> bool
    healthy_diff: dict = field(default_factory=dict)  # protocol -> report keys that differ
    killed_at_rss: int = 0  # serve SIGKILLed by this run past rss_kill_bytes (0: never)
    acked_jobs: int = 0
    lost: list = field(default_factory=list)  # "job: why" after the restart
    wal_bytes: int = 0
    serve_metrics: dict = field(default_factory=dict)
    exit_code: int | None = None
    restart_exit_code: int | None = None
    attackers_unfinished: list = field(default_factory=list)
    #: CPU seconds used while attacked: ``serve``, ``harness`` (this process: the healthy
    #: exporters and probes), ``attack <name>`` each; ``serve waiting for a CPU``: seconds
    #: serve's threads were runnable but not running (summed over threads); ``window_s``
    #: the wall seconds
    cpu_s: dict = field(default_factory=dict)
    export_wall_starts: dict = field(default_factory=dict)  # protocol -> [time.time()]
    stderr_tail: list = field(default_factory=list)
    wall_s: float = 0.0

    def ceiling_bytes(self) -> int:
        """``baseline + max_inflight_bytes + max_connections x 256 KiB + margin``."""
        lim = self.config.limits
        return (self.baseline_rss + (lim.get("max_inflight_bytes") or 256 * MiB)
                + (lim.get("max_connections") or 256) * (256 << 10) + self.config.margin_bytes)

    @property
    def peak(self) -> int:
        return max(self.peak_rss, self.hwm_rss)

    def checks(self) -> dict:
        """Each acceptance check of issue 38: name -> held?"""
        h = self.health
        return {"memory under the ceiling": self.peak <= self.ceiling_bytes(),
                "/healthz 200 every second": bool(h) and h["ok"] == h["asked"] > 0,
                "healthy exports acked within 1 s": bool(self.exports) and all(
                    e["within_1s"] == e["exports"] > 0 for e in self.exports.values()),
                "healthy report unchanged": bool(self.healthy_unchanged) and all(
                    self.healthy_unchanged.values()),
                "nothing acknowledged lost": not self.lost}

    @property
    def ok(self) -> bool:
        return all(self.checks().values())


def _diff(a: dict | None, b: dict | None, name_a: str, name_b: str) -> list[str]:
    """The top-level keys where two jobs' reports differ, their names aside (``["missing"]``
    when one is None)."""
    if a is None or b is None:
        return ["missing"]
    a = json.loads(json.dumps(a).replace(name_a, "JOB"))
    b = json.loads(json.dumps(b).replace(name_b, "JOB"))
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _steps(report: dict) -> int:
    """Steps a job's report holds: kept and wasted, over its attempts."""
    return sum((a.get("steps_kept") or 0) + (a.get("steps_wasted") or 0)
               for a in report.get("attempts") or [])


def _wait_ready(base: str, token, limit_s: float = 120) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if sv.get(base, "/readyz", token, timeout=5)[0] == 200:
            return
        time.sleep(0.1)
    raise RuntimeError(f"goodput serve not ready within {limit_s} s ({base}/readyz)")


def _stop(proc, timeout_s=90) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(10)


def _attacker(attack: str, acfg: dict, env: dict, nice: int = 0,
              cpus: tuple = ()) -> subprocess.Popen:
    """``python -m abuse.attacks`` for one attack (its settings on stdin), at ``os.nice(nice)``,
    on CPUs ``cpus`` (empty: those of this process)."""

    def pre():
        if nice:
            os.nice(nice)
        if cpus:
            os.sched_setaffinity(0, cpus)

    proc = subprocess.Popen([sys.executable, "-m", "abuse.attacks"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=pre if nice or cpus else None)
    proc.stdin.write(json.dumps({**acfg, "attacks": [attack]}))
    proc.stdin.close()
    proc.stdin = None  # communicate() reads only
    return proc


def _gather(attackers: list) -> dict:
    """The attackers' results merged: answers, acked_jobs, acked_present, unfinished.

    Raises:
        RuntimeError: one gave no result within 120 s (its stderr in the message).
    """
    doc = {"answers": {}, "acked_jobs": [], "acked_present": [], "unfinished": []}
    for a in attackers:
        try:
            out, err = a.communicate(timeout=120)
            one = json.loads(out)
        except (subprocess.TimeoutExpired, ValueError) as e:
            a.kill()
            raise RuntimeError(f"an attacker gave no result: {e}") from e
        doc["answers"].update(one["answers"])
        for k in ("acked_jobs", "acked_present", "unfinished"):
            doc[k] += one.get(k, [])
    return doc


def run(cfg: Config) -> Result:
    """One abuse run against a fresh ``goodput serve`` (see the module docstring).

    Raises:
        RuntimeError: serve did not start, or did not get ready, or the attackers' process
            gave no result.
    """
    t_start = time.monotonic()
    res, tok = Result(config=cfg), cfg.token
    if cfg.attacker_cpus:  # serve (started below) and the healthy side inherit the rest
        rest = os.sched_getaffinity(0) - set(cfg.attacker_cpus)
        if not rest:
            raise RuntimeError(f"--attacker-cpus {cfg.attacker_cpus} leaves no CPU for serve")
        os.sched_setaffinity(0, rest)
    n_exports = int(cfg.duration_s / cfg.export_every_s) + 1  # the first one quiet
    with tempfile.TemporaryDirectory(prefix="serve-abuse-") as tmp:
        proc, addr, tail = sv.start_serve(cfg.limits, tmp, tok, list(cfg.serve_args),
                                         cfg.health_port)
        base, hbase = addr["http"], sv.health_base(addr)
        try:
            _wait_ready(base, tok)
            for proto, target in (("grpc", addr["grpc"]), ("http", base)):
                HealthyJob(f"quiet-{proto}", proto, target, tok, n_exports,
                           cfg.steps_per_export).run()
            time.sleep(1.0)
            res.baseline_rss = sv.rss(proc.pid)[0]
            acfg = {**asdict(cfg), "addr": addr, "victim": "healthy-grpc",
                    "duration_s": cfg.duration_s + 60}  # they stop at SIGTERM below
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [os.path.dirname(os.path.abspath(__file__))] + sys.path)}
            stop, health = threading.Event(), Health()
            healthy = {p: HealthyJob(f"healthy-{p}", p, t, tok, n_exports, cfg.steps_per_export)
                       for p, t in (("grpc", addr["grpc"]), ("http", base))}
            for h in healthy.values():  # a job that was there before the attack: its slot
                h.export_one(0)
            attackers = [_attacker(a, acfg, env, cfg.attacker_nice, cfg.attacker_cpus)
                         for a in cfg.attacks]  # one process each
            for a in attackers:
                a.stderr.readline()  # "started"
            cpu0 = _cpu(proc, attackers, cfg.attacks)
            t_cpu = time.monotonic()
            for h in healthy.values():
                h.t0, h.out.window_s = time.monotonic(), cfg.duration_s
            threads = [threading.Thread(target=probe_health, args=(hbase, stop, health))]
            threads += [threading.Thread(target=h.run, args=(stop, cfg.export_every_s, 1))
                        for h in healthy.values()]
            for t in threads:
                t.daemon = True
                t.start()
            end = time.monotonic() + cfg.duration_s
            while time.monotonic() < end:
                r = sv.rss(proc.pid)[0]
                res.peak_rss, res.samples = max(res.peak_rss, r), res.samples + 1
                if r > cfg.rss_kill_bytes and not res.killed_at_rss:
                    res.killed_at_rss = r
                    proc.kill()
                time.sleep(cfg.sample_s)
            cpu1 = _cpu(proc, attackers, cfg.attacks)
            res.cpu_s = {k: round(cpu1[k] - cpu0[k], 1) for k in cpu0}
            res.cpu_s["window_s"] = round(time.monotonic() - t_cpu, 1)
            stop.set()
            for a in attackers:
                a.send_signal(signal.SIGTERM)
            doc = _gather(attackers)
            for t in threads:
                t.join(60)
            res.answers, res.attackers_unfinished = doc["answers"], doc["unfinished"]
            res.final_rss, res.hwm_rss = sv.rss(proc.pid)
            res.peak_rss = max(res.peak_rss, res.final_rss)
            res.health = {"asked": health.asked, "ok": health.ok, "misses": health.misses,
                          "worst_s": round(health.worst_s, 3),
                          "port": "--health-port" if hbase != base else "--http-port"}
            for p, h in healthy.items():
                res.exports[p] = h.out.summary()
                res.export_wall_starts[p] = [round(t, 3) for t in h.out.wall_starts]
                res.export_latencies[p] = [  # (s since the attack began, latency s, acked)
                    (round(t, 2), round(x, 4), ok) for t, x, ok in zip(
                        h.out.starts, h.out.latencies, h.out.acked, strict=True)]
                d = _diff(sv.job_report(base, f"quiet-{p}", tok),
                          sv.job_report(base, f"healthy-{p}", tok), f"quiet-{p}", f"healthy-{p}")
                res.healthy_unchanged[p], res.healthy_diff[p] = not d, d
            status, text = sv.get(base, "/metrics", tok)
            if status == 200:
                res.serve_metrics = _metrics(text.decode())
        finally:
            if cfg.sigkill:  # a crash, not a stop: what was acknowledged is in the WAL
                proc.kill()
            res.exit_code = _stop(proc)
            res.wal_bytes = sv.dir_bytes(os.path.join(tmp, "wal"))
            res.stderr_tail = list(tail)[-10:]
        # restart on the same WAL: is every acknowledged span there?
        proc, addr, tail = sv.start_serve(cfg.limits, tmp, tok, list(cfg.serve_args),
                                         cfg.health_port)
        try:
            _wait_ready(addr["http"], tok)
            jobs = sv.all_jobs(addr["http"], tok)
            want = {f"healthy-{p}": h.out.acked_steps for p, h in healthy.items()}
            want.update({j: 1 for j in doc["acked_jobs"]})
            want.update({j: 0 for j in doc.get("acked_present", [])})
            res.acked_jobs = len(want)
            for job, steps in sorted(want.items()):
                if job not in jobs:
                    res.lost.append(f"{job}: not in the report after the restart")
                elif _steps(jobs[job]) < steps:
                    res.lost.append(f"{job}: {_steps(jobs[job])} of {steps} steps")
        finally:
            res.restart_exit_code = _stop(proc)
    res.wall_s = time.monotonic() - t_start
    return res


def _cpu(proc, attackers: list, names) -> dict:
    """CPU seconds used so far by serve, this process and each attacker."""
    out = {"serve": sv.cpu_s(proc.pid), "serve waiting for a CPU": sv.runqueue_s(proc.pid),
           "harness": time.process_time()}
    out.update({f"attack {n}": sv.cpu_s(a.pid) for n, a in zip(names, attackers, strict=True)})
    return out


def _metrics(text: str) -> dict:
    import re

    return {name + (f"[{reason}]" if reason else ""): float(v)
            for name, reason, v in re.findall(
                r'^(goodput_serve_(?:jobs|refused_total|requests_total))'
                r'(?:\{[^}]*reason="([^"]*)"[^}]*\}|\{[^}]*\})? (\S+)$', text, re.M)}


def table(res: Result) -> str:
    """The result as a text table."""
    m = lambda b: f"{b / MiB:8.1f} MiB"  # noqa: E731
    c = res.config
    out = ["goodput serve, WAL on, token " + ("on" if c.token else "off") + ", limits: "
           + ", ".join(f"{k}={v}" for k, v in c.limits.items())
           + (" " + " ".join(c.serve_args) if c.serve_args else ""),
           f"attacks for {c.duration_s:g} s: {','.join(c.attacks)}", "",
           f"RSS baseline            {m(res.baseline_rss)}",
           f"RSS peak (sampled, {res.samples:4d}) {m(res.peak_rss)}",
           f"RSS peak (VmHWM)        {m(res.hwm_rss)}",
           f"RSS at the end          {m(res.final_rss)}",
           f"ceiling                 {m(res.ceiling_bytes())}   (baseline + max_inflight_bytes"
           " + max_connections x 256 KiB + margin)",
           f"WAL at the end          {m(res.wal_bytes)}"
           + (f"   serve SIGKILLed at {m(res.killed_at_rss)} RSS (--rss-kill)"
              if res.killed_at_rss else ""), "",
           f"{'attack':<22} answers by status"]
    for kind, by in sorted(res.answers.items()):
        out.append(f"{kind:<22} " + ", ".join(f"{s}: {n}" for s, n in sorted(
            by.items(), key=lambda kv: -kv[1])))
    h = res.health
    out += ["", f"/healthz ({h.get('port')}) {h.get('ok')} of {h.get('asked')} answered 200 within "
            f"1 s (worst {h.get('worst_s')} s); misses at s: {h.get('misses', [])[:12]}"]
    for p, e in res.exports.items():
        out.append(f"healthy export {p:<8} {e['within_1s']} of {e['exports']} acked within 1 s "
                   f"({e['acked']} acked; p50 {e['p50_s']} s, max {e['max_s']} s; "
                   f"{e['total'] - e['exports']} more quiet or after, {e['acked_all']} of "
                   f"{e['total']} acked in all); report "
                   f"unchanged: {res.healthy_unchanged.get(p)} {res.healthy_diff.get(p) or ''}")
        if e.get("not_200"):
            out.append(f"  its answers other than 200 [s, status]: {e['not_200'][:12]}")
    out.append(f"after a restart         {res.acked_jobs} jobs with acknowledged spans, "
               f"{len(res.lost)} lost {res.lost[:5]}")
    if res.cpu_s:
        w = res.cpu_s.get("window_s") or 1.0
        out += ["", f"CPU while attacked ({w:g} s, attackers at nice {c.attacker_nice}"
                f"{f', on CPUs {list(c.attacker_cpus)}' if c.attacker_cpus else ''}): "
                + ", ".join(f"{k} {v:g} s ({100 * v / w:.0f}%)" for k, v in res.cpu_s.items()
                            if k != "window_s")]
    if res.serve_metrics:
        out += ["", "serve's counters: " + ", ".join(
            f"{k.replace('goodput_serve_', '')}={v:g}" for k, v in res.serve_metrics.items())]
    out += ["", f"serve exit codes        {res.exit_code} (then {res.restart_exit_code} after "
            f"the restart); attackers unfinished: {res.attackers_unfinished or 'none'}",
            f"wall time               {res.wall_s:.1f} s", ""]
    out += [f"{'PASS' if ok else 'FAIL'}  {name}" for name, ok in res.checks().items()]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    c = Config()
    p.add_argument("--attacks", default=",".join(c.attacks),
                   help=f"comma-separated, of {','.join(ATTACKS)} (default all)")
    p.add_argument("--duration", type=float, default=c.duration_s, help="seconds")
    p.add_argument("--amplify-mib", default=",".join(map(str, c.amplify_mib)),
                   help="body sizes, MiB")
    for name in ("amplify_clients", "wrongtoken_calls", "wrongtoken_bytes", "stalled_calls",
                 "idle_connections", "attr_bytes", "jobs", "jobs_per_request",
                 "http_flooders", "slowloris", "slowloris_bytes", "bomb_bytes",
                 "steps_per_export"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(c, name))
    p.add_argument("--malformed-pause", type=float, default=c.malformed_pause_s)
    p.add_argument("--margin", type=int, default=c.margin_bytes, help="bytes")
    p.add_argument("--rss-kill", type=int, default=c.rss_kill_bytes,
                   help="SIGKILL serve past this RSS (bytes), to spare the machine")
    p.add_argument("--no-token", action="store_true", help="serve without --token-file")
    p.add_argument("--sigkill", action="store_true",
                   help="SIGKILL serve before the restart (default SIGTERM)")
    p.add_argument("--attacker-nice", type=int, default=0,
                   help="os.nice of the attackers' processes (10: a model of attackers on "
                        "other machines, which take none of serve's CPU; default 0)")
    p.add_argument("--attacker-cpus", default="",
                   help="comma-separated CPU numbers for the attackers; serve and the healthy "
                        "exporters get the others (1 on a 2-core machine: a model of attackers "
                        "on other machines; default: all share)")
    p.add_argument("--no-health-port", action="store_true",
                   help="probe /healthz on the HTTP port even where serve has --health-port")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="one more goodput serve flag (repeatable; '--serve-arg=--flag=v')")
    for k, v in c.limits.items():
        p.add_argument(FLAGS[k], dest=k, type=type(v), default=v)
    p.add_argument("--json", action="store_true", help="print the Result as JSON too")
    a = p.parse_args(argv)
    attacks = tuple(x for x in a.attacks.split(",") if x)
    bad = [x for x in attacks if x not in ATTACKS]
    if bad:
        p.error(f"--attacks: unknown {bad}; choose from {','.join(ATTACKS)}")
    cfg = Config(duration_s=a.duration, attacks=attacks,
                 amplify_mib=tuple(float(x) for x in a.amplify_mib.split(",")),
                 malformed_pause_s=a.malformed_pause, margin_bytes=a.margin,
                 rss_kill_bytes=a.rss_kill,
                 token=None if a.no_token else c.token, serve_args=tuple(a.serve_arg),
                 health_port=not a.no_health_port, sigkill=a.sigkill,
                 attacker_nice=a.attacker_nice,
                 attacker_cpus=tuple(int(x) for x in a.attacker_cpus.split(",") if x),
                 limits={k: getattr(a, k) for k in c.limits},
                 **{k: getattr(a, k) for k in (
                     "amplify_clients", "wrongtoken_calls", "wrongtoken_bytes", "stalled_calls",
                     "idle_connections", "attr_bytes", "jobs", "jobs_per_request",
                     "http_flooders", "slowloris", "slowloris_bytes", "bomb_bytes",
                     "steps_per_export")})
    res = run(cfg)
    print(table(res))
    if a.json:
        print(json.dumps(asdict(res), indent=1))
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
