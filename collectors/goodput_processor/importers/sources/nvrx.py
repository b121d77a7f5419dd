"""NVIDIA resiliency extension (NVRx) launcher: ``ft_launcher``'s cycle events as launcher
evidence (``goodput import --from nvrx LAUNCHER.log``).

``ft_launcher`` (``python -m nvidia_resiliency_ext.fault_tolerance.launcher``) logs one INFO
line of its ``nvrx`` logger per fault-tolerance event (``shared_utils/profiling.py``)::

    2026-12-07 14:44:42,090 [INFO] [vm] [workload:?(?) infra:?(?)] profiling.py:93   - Cycle: 1
    Event: failure_detected Node: localhost_16128_0 Rank: 0 Time: 2026-12-07 14:44:42.090 UTC

(one line in the log). The cycle counts failures: ``failure_detected`` raises it by one.
Torchelastic's own line for each worker it saw fail comes through the same stream::

    E1207 14:44:42.089000 16128 torch/distributed/elastic/multiprocessing/api.py:1002] failed
    (exitcode: -9) local_rank: 1 (pid: 16210) of binary: /usr/bin/python

This source turns them into ``goodput.launcher_event`` spans of one launcher process per
node (``goodput.process.role = launcher``; ``goodput.launcher.restart_count`` = the cycle):

===============================  ==========================================================
``goodput.launcher.event``       from
===============================  ==========================================================
``nvrx.worker_failed``           torchelastic's ``failed (exitcode: N) ... (pid: P)``: zero
                                 length, with ``worker_pid`` and ``exit_code`` (negative:
                                 the signal): names the worker that failed first
``nvrx.failure_detected``        zero length, at ``failure_detected``
``nvrx.worker_terminated``       ``failure_detected`` -> ``worker_terminated`` (the agent
                                 stopping the surviving workers)
``nvrx.rendezvous``              ``rendezvous_started`` -> ``rendezvous_completed``
``nvrx.health_check``            zero length, at ``health_check_completed``
``nvrx.worker_start``            ``worker_start_started`` -> ``worker_start_completed``
``nvrx.attribution``             ``attribution_get_started`` -> ``..._completed``
``nvrx.<event>``                 any other event name (zero length; warning
                                 ``nvrx_unknown_event``)
===============================  ==========================================================

**What it shows.** The recovery of each cycle as the launcher saw it: which worker failed
first and how (exit code or signal: the first failure's ``process``, ``how`` and
``evidence.launcher_detected_after_s``), and the rendezvous before the restarted workers
(``evidence.launcher_rendezvous_s``), by the same rules as ``python -m goodput.torchrun``'s
torchelastic events (``docs/accounting.md``, "Recovery phases").

**What it cannot show.** No bucket (productive time, wasted progress, infrastructure
recovery, checkpoint save/restore, initialisation, ...) and no recovery phase's extent
(detection, termination, rescheduling, startup, rendezvous_init, restore,
recompilation_warmup): NVRx says nothing about steps, checkpoints or the workers' phases,
so a job seen only through this source has no attempts, no steps and no time. Merge it
with the workers' own telemetry (this project's recorder, or another source) under the same
job name: the workers' spans make the attempts, the buckets and the phases; the launcher's
events say who failed, how, and how long its rendezvous took. They add no time to any
bucket, so nothing is counted twice. The ``Rank`` of an event is the node's group rank,
not a worker's.

**Job name**: ``goodput import --job NAME`` (the emitter's job) wins; else the translator's
``job`` argument; else, for OTLP log records (``goodput serve``), their resource's
``goodput.job.name`` or ``service.name`` (set it in the Collector's ``filelog`` receiver);
else ``$GOODPUT_NVRX_JOB``; else ``$GOODPUT_JOB_NAME`` (the variable the workers' recorder
read, when the import runs in the job's environment); else ``nvrx-<rendezvous id>`` from
the launcher's ``--rdzv-id`` line.

**Live**: the launcher has no OTLP exporter; a Collector's ``filelog`` receiver tailing its
output sends each line as an OTLP log record (body = the line) to ``goodput serve``, which
hands the records whose first bodies are ``nvrx`` logger lines, cycle events or
torchelastic's worker failure line (:func:`matches`) to this source.

**Times.** Cycle events carry their own UTC time (milliseconds). Torchelastic's line has a
glog prefix in the launcher's local time (month, day, microseconds; no year): the year and
the offset from UTC are taken from the cycle lines before it (the logging prefix in local
time against the event's UTC time); when none of them had the logging prefix, the
importing machine's offset is used (warning ``nvrx_time_zone_assumed``).

**Host.** Launcher events are matched to worker processes by (host, pid): the host is the
``[hostname]`` field of the ``nvrx`` logging prefix; a log record's ``host.name`` resource
attribute comes before it, and ``$GOODPUT_NVRX_HOST`` (or the translator's ``host``)
before both (a log captured without the prefix). Without any, the node id's host part.

Checked against nvidia-resiliency-ext 0.7.0 (its cp312 wheel unpacked into Python 3.11,
torch 2.13.0 CPU, gloo, ``--standalone --nproc-per-node=2 --max-restarts=2``): see
``docs/sources/nvrx.md`` and ``tests/data/sources/nvrx/``.
"""

from __future__ import annotations

import calendar
import hashlib
import os
import re
import time

from goodput import schema

from .base import Emitter, Source, Translator

__all__ = ["NvrxTranslator", "SOURCE", "matches", "sniff"]

_NS = 1_000_000_000

#: The profiler's line (anywhere in a line: prefixes of kubectl, Slurm, ... are skipped).
CYCLE_RE = re.compile(
    r"Cycle: (?P<cycle>\d+) Event: (?P<event>[A-Za-z_]+) Node: (?P<node>\S+) "
    r"Rank: (?P<rank>\S+) Time: (?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) UTC")
#: The ``nvrx`` logger's prefix: local time, level, host name.
PREFIX_RE = re.compile(
    r"(?P<t>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) \[(?P<lvl>\w+)\] "
    r"\[(?P<host>[\w.-]+)\]")
#: Torchelastic's glog-style prefix (local time, no year) and its worker failure message.
GLOG_RE = re.compile(
    r"[IWEF](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)\.(?P<us>\d{6}) +"
    r"(?P<pid>\d+) ")
FAILED_RE = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<lr>\d+) \(pid: (?P<pid>\d+)\)")
RDZV_ID_RE = re.compile(r"(?:--rdzv-id=|run_id\s+: )(?P<id>[\w.-]+)")

#: Events that open an interval, and the event that closes it, with the span's name.
PAIRS = {"rendezvous_started": ("rendezvous_completed", "nvrx.rendezvous"),
         "worker_start_started": ("worker_start_completed", "nvrx.worker_start"),
         "attribution_get_started": ("attribution_get_completed", "nvrx.attribution")}
CLOSERS = {end: (start, name) for start, (end, name) in PAIRS.items()}
POINTS = {"failure_detected": "nvrx.failure_detected",
          "health_check_completed": "nvrx.health_check"}


def _utc_ns(text: str) -> int:
    """``YYYY-MM-DD HH:MM:SS[.fff]`` read as UTC -> ns since the epoch."""
    whole, _, frac = text.partition(".")
    secs = calendar.timegm(time.strptime(whole, "%Y-%m-%d %H:%M:%S"))
    return secs * _NS + int((frac + "000000000")[:9])


def sniff(head: bytes) -> bool:
    """Whether a file's first 64 KiB hold an NVRx cycle event line."""
    return CYCLE_RE.search(head.decode("utf-8", "replace")) is not None


class _Node:
    """One launcher (node) of the input and what its events left open."""

    __slots__ = ("node", "host", "pid", "key", "cycle", "opened", "fail_at", "seen")

    def __init__(self, node: str, host: str | None, pid: int | None):
        self.node, self.host, self.pid = node, host, pid
        self.key: str | None = None  # the emitter's process, named at the first event
        self.cycle = 0  # its last cycle (a worker failure line belongs to it)
        #: started event -> (time ns, cycle) of an interval not closed yet
        self.opened: dict[str, tuple[int, int]] = {}
        self.fail_at: dict[int, int] = {}  # cycle -> its failure_detected (ns)
        self.seen: set = set()  # events taken (a line read twice counts once)


class NvrxTranslator(Translator):
    """``ft_launcher`` log lines -> ``goodput.launcher_event`` spans (see the module).

    Lines are taken in the order the launcher wrote them (one node's file, or one node's
    log records, in order); an event is emitted as soon as it is complete (an interval at
    its closing event), so ``goodput serve`` needs no :meth:`finish`.

    Args:
        emitter, problems: as :class:`~.base.Translator`.
        job: the job name of the launcher's events (the workers' job, so the two merge);
            None: the log records' ``goodput.job.name`` or ``service.name`` resource
            attribute (``goodput serve``), ``$GOODPUT_NVRX_JOB``, ``$GOODPUT_JOB_NAME``,
            else ``nvrx-<rdzv id>`` (``goodput import --job`` overrides all of them).
        host: the launcher's host name (matches the workers' ``host.name``); None:
            ``$GOODPUT_NVRX_HOST``, else the log records' ``host.name`` resource attribute,
            else the ``nvrx`` logging prefix's host, else the node id's host part.
    """

    def __init__(self, emitter: Emitter, problems=None, *, job: str | None = None,
                 host: str | None = None):
        super().__init__(emitter, problems)
        self.job = job
        self._env_job = os.environ.get("GOODPUT_NVRX_JOB") or os.environ.get(
            "GOODPUT_JOB_NAME") or None
        self._res_job: str | None = None  # the log records' service.name
        self.host = host or os.environ.get("GOODPUT_NVRX_HOST") or None
        self.rdzv_id: str | None = None
        self._nodes: dict[str, _Node] = {}
        self._offset_ns: int | None = None  # local time - UTC, learned from cycle lines
        self._ref_ns: int | None = None  # the last cycle event's time (for glog's year)
        self._prefix_host: str | None = None
        self._res_host: str | None = None
        self._failed: set[tuple[str, int]] = set()  # (node, cycle) with a worker failure
        self._detected: set[tuple[str, int]] = set()  # (node, cycle) failure_detected

    def start_file(self, path: str) -> None:
        self._prefix_host = self._res_host = self._res_job = None

    # reading ------------------------------------------------------------------------

    def logs(self, resource: dict, scope: str, records, where: str) -> None:
        """Log records whose body is one launcher line (the Collector's ``filelog``
        receiver tailing the launcher's output)."""
        host = resource.get(schema.RES_HOST_NAME)
        self._res_host = host if isinstance(host, str) and host else None
        job = resource.get(schema.RES_JOB_NAME) or resource.get(schema.RES_SERVICE_NAME)
        self._res_job = job if isinstance(job, str) and job else None
        for i, r in enumerate(records):
            if isinstance(r.body, str):
                self.line(r.body.rstrip("\r\n"), f"{where}#{i}")
            else:
                self.problems.add(f"{where}#{i}", "malformed", "log record body is not text")

    def line(self, text: str, where: str) -> None:
        m = PREFIX_RE.search(text)
        if m:
            self._prefix_host = m.group("host")
        c = CYCLE_RE.search(text)
        if c:
            self._cycle_line(c, m, where)
            return
        if "Cycle: " in text and " Event: " in text:
            self.problems.add(where, "truncated", "an NVRx cycle event line cut short")
            return
        f = FAILED_RE.search(text)
        if f:
            self._failed_line(text, f, m, where)
            return
        if self.rdzv_id is None and (r := RDZV_ID_RE.search(text)):
            self.rdzv_id = r.group("id")

    def _node(self, node: str) -> _Node:
        n = self._nodes.get(node)
        if n is None:
            parts = node.rsplit("_", 2)  # _NodeDesc: "<addr>_<pid>_<local id>"
            pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
            host = (self.host or self._res_host or self._prefix_host
                    or (parts[0] if len(parts) == 3 else None))
            n = self._nodes[node] = _Node(node, host, pid)
        return n

    def _cycle_line(self, c: re.Match, prefix: re.Match | None, where: str) -> None:
        try:
            t = _utc_ns(c.group("time"))
        except ValueError as e:
            self.problems.add(where, "malformed", f"bad cycle event time ({e})")
            return
        if prefix is not None:  # the logging prefix is local time: learn the offset
            try:
                local = _utc_ns(prefix.group("t")) + int(prefix.group("ms")) * 1_000_000
                quarter = 900 * _NS
                self._offset_ns = round((local - t) / quarter) * quarter
            except ValueError:
                pass
        cycle, event = int(c.group("cycle")), c.group("event")
        n = self._node(c.group("node"))
        rank = c.group("rank")
        self._ref_ns, n.cycle = t, cycle
        self._event(n, t, cycle, event, {}, int(rank) if rank.isdigit() else 0)

    def _failed_line(self, text: str, f: re.Match, prefix: re.Match | None,
                     where: str) -> None:
        if not self._nodes:
            self.problems.add(where, "unknown_record",
                              "worker failure line before any cycle event")
            return
        g = GLOG_RE.search(text)
        t, agent = None, None
        if g is not None:
            t, agent = self._glog_ns(g), int(g.group("pid"))
        elif prefix is not None and self._offset_ns is not None:
            t = (_utc_ns(prefix.group("t")) + int(prefix.group("ms")) * 1_000_000
                 - self._offset_ns)
        if t is None:
            self.problems.add(where, "malformed", "worker failure line without a time")
            return
        # the agent's pid (glog's) names its node; else the node that logged last
        node = next((n for n in self._nodes.values() if agent is not None and n.pid == agent),
                    None) or list(self._nodes.values())[-1]
        self._event(node, t, node.cycle, "worker_failed", {
            schema.ATTR_LAUNCHER_WORKER_PID: int(f.group("pid")),
            schema.ATTR_LAUNCHER_EXIT_CODE: int(f.group("code")),
            "nvrx.local_rank": int(f.group("lr"))}, 0)

    def _glog_ns(self, g: re.Match) -> int:
        """A glog prefix's time (launcher local time, no year) in ns since the epoch."""
        ref = self._ref_ns
        if ref is None or self._offset_ns is None:
            self.warn("nvrx_time_zone_assumed")
        if ref is None:
            ref = time.time_ns()
        offset = self._offset_ns
        if offset is None:
            offset = -time.altzone * _NS if time.daylight and time.localtime().tm_isdst \
                else -time.timezone * _NS
        year = time.gmtime((ref + offset) // _NS).tm_year
        best = None
        for y in (year - 1, year, year + 1):  # the year that puts it nearest the reference
            try:
                local = (calendar.timegm((y, int(g.group("mo")), int(g.group("d")),
                                          int(g.group("h")), int(g.group("mi")),
                                          int(g.group("s")), 0, 0, 0)) * _NS
                         + int(g.group("us")) * 1000)
            except (ValueError, OverflowError):
                continue
            t = local - offset
            if best is None or abs(t - ref) < abs(best - ref):
                best = t
        return best if best is not None else ref

    # writing ------------------------------------------------------------------------

    def _event(self, n: _Node, t: int, cyc: int, ev: str, attrs: dict, rank: int) -> None:
        """Emit what event ``ev`` of node ``n`` completes (see the module's table)."""
        seen = (t, cyc, ev, tuple(sorted(attrs.items())))
        if seen in n.seen:
            return
        n.seen.add(seen)
        if n.key is None:
            job = (self.job or self._res_job or self._env_job
                   or (f"nvrx-{self.rdzv_id}" if self.rdzv_id else "nvrx"))
            extra = {"nvrx.node": n.node}
            if self.rdzv_id:
                extra["nvrx.rdzv_id"] = self.rdzv_id
            n.key = self.emit.process(f"nvrx\0{n.host}\0{n.node}", job=job, rank=rank,
                                      host=n.host, pid=n.pid, start_ns=t, role="launcher",
                                      extra=extra)
        key, base = n.key, {schema.ATTR_LAUNCHER_RESTART_COUNT: cyc, **attrs}
        if ev == "worker_failed":
            self._failed.add((n.node, cyc))
            self._span(key, "nvrx.worker_failed", t, t, base)
        elif ev in PAIRS:
            if ev in n.opened:  # started again before it completed
                self._unfinished(n, ev)
            n.opened[ev] = (t, cyc)
        elif ev in CLOSERS:
            start, name = CLOSERS[ev]
            self._span(key, name, n.opened.pop(start, (t, cyc))[0], t, base)
        elif ev == "worker_terminated":
            self._span(key, "nvrx.worker_terminated", n.fail_at.get(cyc, t), t, base)
        elif ev in POINTS:
            if ev == "failure_detected":
                n.fail_at.setdefault(cyc, t)
                self._detected.add((n.node, cyc))
            self._span(key, POINTS[ev], t, t, base)
        else:
            self.warn("nvrx_unknown_event")
            self._span(key, f"nvrx.{ev}", t, t, base)

    def _unfinished(self, n: _Node, ev: str) -> None:
        t0, cyc = n.opened.pop(ev)
        self.warn(f"nvrx_{ev[:-len('_started')]}_unfinished")
        self._span(n.key, PAIRS[ev][1], t0, t0, {schema.ATTR_LAUNCHER_RESTART_COUNT: cyc})

    def finish(self) -> None:
        """Close what the input ended inside (a killed launcher) and name the failures no
        worker failure line explains."""
        for n in self._nodes.values():
            for ev in list(n.opened):
                self._unfinished(n, ev)
        # failure_detected raises the cycle: the worker failure line before it is in the
        # cycle before; a healthy node joining another node's restart has none, so a cycle
        # is unnamed only when no node saw a worker fail
        failed = {c for _, c in self._failed}
        unnamed = {c for _, c in self._detected if c - 1 not in failed}
        if unnamed:
            self.warn("nvrx_failed_worker_unnamed", len(unnamed))

    def _span(self, key: str, name: str, t0: int, t1: int, attrs: dict) -> None:
        # the id names the event: two events at the same instant (torchelastic's failure
        # line and failure_detected often share a millisecond) are two spans, and the same
        # log read twice gives the same ids
        sid = hashlib.blake2b(f"{key}\0{name}\0{t0}\0{t1}\0{sorted(attrs.items())}".encode(),
                              digest_size=8).hexdigest()
        self.emit.span(key, schema.LAUNCHER_EVENT, t0, t1,
                       {schema.ATTR_LAUNCHER_EVENT: name, **attrs}, span_id=sid)


#: The ``nvrx`` logger's prefix fields, on every line ft_launcher logs through it.
_NVRX_PREFIX_RE = re.compile(r"\] \[workload:\S+ infra:\S+\] ")


def matches(resource: dict, scope: str, names) -> bool:
    """Whether OTLP log records are ft_launcher's output (``names``: their first bodies):
    an ``nvrx`` logger line, a cycle event or torchelastic's worker failure line."""
    return any(isinstance(b, str) and (_NVRX_PREFIX_RE.search(b) or CYCLE_RE.search(b)
                                       or FAILED_RE.search(b)) for b in names)


SOURCE = Source(
    name="nvrx",
    imported_from="nvrx",
    reads=frozenset({"lines", "logs"}),
    translator=NvrxTranslator,
    matches=matches,
    sniff=sniff,
    doc="sources/nvrx.md",
    checked="nvidia-resiliency-ext 0.7.0 (ft_launcher; torch 2.13.0 CPU, gloo)",
)
