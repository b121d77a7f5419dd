"""torchft's OpenTelemetry log records as goodput spans (source ``torchft``).

Checked against torchft 0.2.0 with opentelemetry-sdk / -exporter-otlp-proto-http 1.39.1
(``TORCHFT_USE_OTEL=true``; 1.45 breaks ``import torchft``), on CPU with gloo, a real
lighthouse and two replica groups, one SIGKILLed and started again
(``tests/data/sources/torchft/``).

What torchft sends (OTLP logs over HTTP/protobuf, one ``LoggerProvider`` and batch
processor per logger, so the three streams arrive in separate requests, each about a
second behind; the resource has no process identity, only ``service.name =
unknown_service``), empty bodies, the data in attributes:

- scope ``torchft_commits``: ``job_id``, ``replica_id``, ``rank`` (the rank inside the
  replica group), ``quorum_id``, ``step`` (the manager's step before the commit: the step
  just done, 0-based), ``commit_result`` (bool), at the end of ``should_commit``;
- scope ``torchft_quorums``: ``job_id``, ``replica_id``, ``rank``, ``quorum_id``, ``step``
  (the quorum's max step: where a healing replica resumes), once per new quorum per
  process, when the lighthouse answered;
- scope ``torchft_errors``: ``job_id``, ``replica_id``, ``rank`` (the replica rank in the
  quorum), ``quorum_id``, ``error`` (``process_group_abort``).

How it maps (docs/sources/torchft.md):

- job: ``job_id`` (``JOB_ID``; torchft writes ``unknown`` without it: then
  ``service.name`` unless ``unknown_service``, else ``torchft``).
- **attempt = quorum.** A torchft job does not stop when a replica dies: the survivors
  form a new quorum and go on, and a replica that comes back joins a later quorum and heals
  from a peer. Each quorum is one configuration of the job, so each ``(replica, rank)`` in
  quorum ``q`` is one emitted process of attempt ``q - 1`` (the lighthouse numbers quorums
  from 1), rank ``goodput.process.index = 1000 * n + rank`` where ``n`` is the replica
  id's trailing number (torchft's own ``train_ddp_<n>`` naming; without one, the order in
  which replica ids were first seen). The records carry no OS process identity, so the
  processor takes the declared attempt numbers (as for imported logs): the time between
  two quorums (the lighthouse noticing a dead replica, or letting a new one in) is
  ``infrastructure_recovery``, and a replica's own restart and heal, which the others do
  not wait for, costs the job nothing and shows only as its step jump (its first commit
  is at the quorum's max step: the steps it did not do are not its progress).
- steps: a successful commit is one ``goodput.step`` (``goodput.step`` = the record's
  ``step``), from the same process's previous commit in the same quorum, or, for its first
  commit in a quorum, from that process's quorum record (the time before it, waiting for
  the lighthouse, is the reconfiguration). A first commit whose quorum record never came
  (lost) starts at the commit itself (zero length), named
  ``torchft_quorum_record_missing``.
- a failed commit (``commit_result`` false) is no kept step: followed by another commit
  of the same process in the same quorum it is ``goodput.custom_badput`` of type
  ``torchft_failed_commit``; as the last commit of its quorum (the job reconfigured) it is
  a ``goodput.step`` with status ERROR, which the next quorum's resume step throws away
  (``wasted_progress``) and the recovery report takes as the first sign of failure.
- ``torchft_errors``: a zero-length ``goodput.custom_badput`` of type
  ``torchft_<error>`` with status ERROR on that replica's process of the quorum (failure
  evidence, no time); counted as the warning ``torchft_process_group_abort``.

Buckets it can show: productive steps and step times, slowdown, ``wasted_progress``
(failed commits the next quorum redid), ``infrastructure_recovery`` (the gaps between
quorums), ``custom:torchft_failed_commit``. It cannot show checkpoint save or restore
(torchft logs neither its peer-to-peer heal nor any checkpoint), process startup,
initialisation or data loading (no record before a process's first quorum), a
replica's own restart time, or the step in flight at a kill.

What a kill loses: each logger's ``BatchLogRecordProcessor`` sends about once a second, so
a SIGKILLed process loses its last records (2.3 s in the checked run). A process of a
quorum that did not go on to a later one, silent for :data:`TAIL_HORIZON_NS` of the job's
record time (or at :meth:`finish`), whose last commit is behind its peers' in that quorum,
lost its tail: the peers' later successful steps of the quorum are emitted on it too
(replicas commit in lock step), named ``torchft_tail_lost`` and
``torchft_tail_steps_inferred``. So a killed quorum primary (lowest index) keeps the steps
it did. A process that goes on into the next quorum gets a ``goodput.job_end`` (reason
``restart``) at its last commit of the old one; a killed one none. torchft logs nothing
at a clean exit, so the last quorum always reads as killed. Commits arrive in order per
process; a commit received again (a resent request) gives the same spans again, with the
same ids, which the processor keeps once. A lighthouse restarted mid-job numbers quorums
from 1 again: its quorums would share attempt numbers with the first one's.
"""

from __future__ import annotations

import re

from goodput import schema

from .base import Emitter, ForeignLog, Source, Translator

__all__ = ["SOURCE", "TorchftTranslator"]

SCOPES = ("torchft_commits", "torchft_quorums", "torchft_errors")
#: A run silent this long (ns of the job's record time) while its job goes on is over:
#: its lost tail is looked for (a live process sends its records about once a second).
TAIL_HORIZON_NS = 10_000_000_000
#: Commits remembered per run (their spans, for a resent request and a peer's lost tail);
#: a run over for :data:`TAIL_HORIZON_NS` keeps none, so ``goodput serve``'s state is
#: bounded by the live runs.
SEEN_MAX = 4096
#: Process index of replica ``n``'s rank ``r``: ``REPLICA_STRIDE * n + r``.
REPLICA_STRIDE = 1000
_TRAILING = re.compile(r"(\d+)$")


class _Run:
    """One ``(job, replica, rank)`` in one quorum: an emitted process."""

    __slots__ = ("key", "tkey", "ended", "qtime", "commits", "prev_end", "failed", "seen",
                 "last_step", "last_t", "tail_done")

    def __init__(self, key: str, tkey: tuple):
        self.key, self.tkey = key, tkey
        self.ended = 0  # 1: the process went on to a later quorum; 2: its end marker written
        self.qtime: int | None = None  # its quorum record's time (ns)
        self.commits: list[tuple[int, int, bool]] = []  # waiting: (time, step, result)
        self.prev_end: int | None = None  # end of its last commit handled
        self.failed: tuple[int, int, int] | None = None  # (start, end, step) undecided
        self.seen: dict = {}  # (time, step) of a commit -> the spans it made
        self.last_step: int | None = None  # its last successful commit's step
        self.last_t = 0  # its latest record's time (ns)
        self.tail_done = False  # its lost tail was looked for


class TorchftTranslator(Translator):
    """Translator of torchft's ``torchft_commits`` / ``torchft_quorums`` /
    ``torchft_errors`` log records (module docstring)."""

    def __init__(self, emitter: Emitter, problems=None):
        super().__init__(emitter, problems)
        self._runs: dict[tuple, _Run] = {}  # (job, replica, rank, quorum) -> run
        self._replica_order: dict[str, int] = {}
        self._failed: dict[tuple, _Run] = {}  # runs holding an undecided failed commit
        self._latest: dict[str, int] = {}  # job -> its latest record's time (ns)

    # --- records -------------------------------------------------------------------------

    def logs(self, resource: dict, scope: str, records: list[ForeignLog], where: str) -> None:
        if scope not in SCOPES:
            return
        job = self._job(resource, records)
        touched = set()
        for r in records:
            a = r.attrs
            try:
                replica = str(a["replica_id"]) if a.get("replica_id") is not None else ""
                rank = int(a.get("rank") or 0)
                quorum = int(a["quorum_id"])
                if scope != "torchft_errors":
                    step = int(a["step"])
            except (KeyError, TypeError, ValueError):
                self.problems.add(where, "malformed",
                                  f"{scope} record without job/replica/quorum/step: {a}")
                continue
            if r.time_ns <= 0 or quorum < 0:
                self.problems.add(where, "malformed", f"{scope} record time {r.time_ns} / "
                                  f"quorum {quorum}")
                continue
            if not replica:
                self.warn("torchft_replica_id_missing")
            rjob = str(a.get("job_id") or job)
            if rjob == "unknown":
                rjob = job
            if scope == "torchft_errors":
                self._error(rjob, replica, quorum, str(a.get("error") or "error"), r.time_ns)
                continue
            run = self._run(rjob, replica, rank, quorum)
            run.last_t = max(run.last_t, r.time_ns)
            self._latest[rjob] = max(self._latest.get(rjob, 0), r.time_ns)
            if scope == "torchft_quorums":
                if run.qtime is None or r.time_ns < run.qtime:
                    run.qtime = r.time_ns
            else:
                ident = (r.time_ns, step)
                if ident in run.seen:  # (a request sent again: its spans again, same ids)
                    for args, error in run.seen[ident]:
                        self.emit.span(*args, error=error)
                    continue
                run.seen[ident] = []
                res = a.get("commit_result")
                ok = res if isinstance(res, bool) else str(res).lower() == "true"
                if run.prev_end is not None and r.time_ns < run.prev_end:
                    self.problems.add(where, "out_of_order", f"commit of step {step} at "
                                      f"{r.time_ns} before the one handled at {run.prev_end}")
                    continue
                run.commits.append((r.time_ns, step, ok))
                self._moved_on(rjob, replica, rank, quorum, touched)
            touched.add((rjob, replica, rank, quorum))
        for k in sorted(touched):
            self._drain(self._runs[k])
        for j in sorted({k[0] for k in touched}):
            self._tails(j, TAIL_HORIZON_NS)

    def _job(self, resource: dict, records: list[ForeignLog]) -> str:
        for r in records:
            j = r.attrs.get("job_id")
            if j and j != "unknown":
                return str(j)
        svc = resource.get("service.name")
        if svc and svc != "unknown_service" and not str(svc).startswith("unknown_service:"):
            return str(svc)
        return "torchft"

    def _index(self, replica: str, rank: int) -> int:
        m = _TRAILING.search(replica)
        if m:
            n = int(m.group(1))
        else:
            n = self._replica_order.setdefault(replica, len(self._replica_order))
        return REPLICA_STRIDE * n + rank

    def _run(self, job: str, replica: str, rank: int, quorum: int) -> _Run:
        k = (job, replica, rank, quorum)
        run = self._runs.get(k)
        if run is None:
            key = self.emit.process(
                f"torchft\0{job}\0{replica}\0{rank}\0{quorum}", job=job,
                rank=self._index(replica, rank), attempt=max(quorum - 1, 0),
                extra={"torchft.replica_id": replica, "torchft.rank": rank,
                       "torchft.quorum_id": quorum})
            run = self._runs[k] = _Run(key, k)
        return run

    def _error(self, job: str, replica: str, quorum: int, error: str, t: int) -> None:
        self.warn(f"torchft_{error}" if error == "process_group_abort"
                  else "torchft_error")
        runs = sorted((k[2], r) for k, r in self._runs.items()
                      if k[0] == job and k[1] == replica and k[3] == quorum)
        if runs:  # (the record's rank is the replica's rank in the quorum, not its own)
            self.emit.span(runs[0][1].key, schema.CUSTOM_BADPUT, t, t,
                           {schema.ATTR_BADPUT_TYPE: f"torchft_{error}"}, error=True)

    # --- steps ---------------------------------------------------------------------------

    def _drain(self, run: _Run, final: bool = False) -> None:
        """Emit the commits of ``run`` whose start is known (all of them when ``final``),
        and its end marker once it went on to a later quorum."""
        if not run.commits:
            self._end(run)
            return
        if run.prev_end is None and run.qtime is None and not final:
            return  # (its quorum record may come in a later request)
        run.commits.sort()
        for t, step, ok in run.commits:
            start = run.prev_end if run.prev_end is not None else run.qtime
            if start is None or start > t:
                if start is None:
                    self.warn("torchft_quorum_record_missing")
                start = t
            if run.failed is not None:  # another commit followed it in the same quorum
                fs, fe, fstep = run.failed
                self._span(run, (fe, fstep), schema.CUSTOM_BADPUT, fs, fe,
                           {schema.ATTR_BADPUT_TYPE: "torchft_failed_commit"})
                run.failed = None
                self._failed.pop(run.tkey, None)
            if ok:
                self._span(run, (t, step), schema.STEP, start, t, {schema.ATTR_STEP: step})
                run.last_step = step
            else:
                run.failed = (start, t, step)
                self._failed[run.tkey] = run
            run.prev_end = t
        run.commits = []
        self._end(run)

    def _end(self, run: _Run) -> None:
        """``goodput.job_end`` (reason ``restart``) at the last commit of a run whose
        process went on to a later quorum: the same process, in the job's next attempt."""
        if run.ended == 1 and run.prev_end is not None and not run.commits:
            if run.failed is not None:
                self._close_failed(self._failed.pop(run.tkey, run))
            self._span(run, ("end", run.prev_end), schema.JOB_END, run.prev_end, run.prev_end,
                       {schema.ATTR_END_REASON: "restart"})
            run.ended = 2

    def _moved_on(self, job: str, replica: str, rank: int, quorum: int,
                  touched: set) -> None:
        """A commit of ``(replica, rank)`` in ``quorum``: its runs in earlier quorums are
        over (commits come in order per process), and an undecided failed commit there
        was that quorum's last (the job reconfigured after it). A process that was
        restarted in between is another incarnation; its old run gets no end marker."""
        for k in [k for k in self._failed if k[:3] == (job, replica, rank) and k[3] < quorum]:
            self._close_failed(self._failed.pop(k))
        prev = self._runs.get((job, replica, rank, quorum - 1))
        if prev is not None and not prev.ended:
            prev.ended = 1
            touched.add(prev.tkey)

    def _close_failed(self, run: _Run) -> None:
        fs, fe, step = run.failed
        self._span(run, (fe, step), schema.STEP, fs, fe, {schema.ATTR_STEP: step}, True)
        run.failed = None

    def _span(self, run: _Run, ident: tuple, name: str, start: int, end: int, attrs: dict,
              error: bool = False) -> None:
        """Emit a span made of commit ``ident`` and remember it for a resent request."""
        args = (run.key, name, start, end, attrs)
        run.seen.setdefault(ident, []).append((args, error))
        if len(run.seen) > SEEN_MAX:
            del run.seen[next(iter(run.seen))]
        self.emit.span(*args, error=error)

    def finish(self) -> None:
        for run in self._runs.values():
            self._drain(run, final=True)
            if run.failed is not None:
                self._close_failed(run)
        self._failed.clear()
        for job in sorted(self._latest):
            self._tails(job, 0)

    def _tails(self, job: str, horizon_ns: int) -> None:
        """Lost tails: a run of ``job`` that did not go on to a later quorum, silent for
        ``horizon_ns`` of the job's record time, whose last commit is behind its quorum
        peers' (it was killed with records still in its exporter). Its peers' later
        successful steps of that quorum are emitted on it too (the replicas commit in
        lock step), named ``torchft_tail_lost`` (per run) and
        ``torchft_tail_steps_inferred`` (per step)."""
        latest = self._latest.get(job, 0)
        for k, run in self._runs.items():
            if (k[0] != job or run.tail_done or run.ended or run.commits
                    or latest - run.last_t < horizon_ns):
                continue
            run.tail_done = True
            done = -1 if run.last_step is None else run.last_step
            peers: dict[int, tuple] = {}
            for pk, peer in self._runs.items():
                if pk[0] != job or pk[3] != k[3] or peer is run:
                    continue
                for spans in peer.seen.values():
                    for (_, name, start, end, attrs), error in spans:
                        st = attrs.get(schema.ATTR_STEP)
                        if name == schema.STEP and not error and st > done:
                            peers.setdefault(st, (start, end))
            if not peers:
                continue
            self.warn("torchft_tail_lost")
            self.warn("torchft_tail_steps_inferred", len(peers))
            for st, (start, end) in sorted(peers.items()):
                self._span(run, ("inferred", st), schema.STEP, start, end,
                           {schema.ATTR_STEP: st})
            run.last_step = max(peers)
        for k, run in self._runs.items():  # (over: what a resend would need is let go)
            if (k[0] == job and run.seen and (run.tail_done or run.ended == 2)
                    and latest - run.last_t >= horizon_ns > 0):
                run.seen.clear()


def _matches(resource: dict, scope: str, names) -> bool:
    return scope in SCOPES


def _sniff(head: bytes) -> bool:
    return b'"resourceLogs"' in head and any(s.encode() in head for s in SCOPES)


SOURCE = Source(
    name="torchft",
    imported_from="torchft",
    reads=frozenset({"logs"}),
    translator=TorchftTranslator,
    matches=_matches,
    sniff=_sniff,
    doc="sources/torchft.md",
    checked="torchft 0.2.0 (opentelemetry-sdk 1.39.1)",
)
