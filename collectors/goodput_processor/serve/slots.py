"""Fair job slots and final retirement in ``goodput serve``'s live store.

Job slots. A job takes one of ``--max-jobs`` slots from its first span until it leaves.
Each client may hold at most ``--max-jobs-per-client`` of them (default: half of
``--max-jobs``), so a client that floods new job names cannot take the slots of another
client. A client is who sent the request: the peer's address (HTTP ``client_address``,
gRPC ``context.peer()`` without its port), ``spool:<dir>`` for the spool tailer; the
receivers say it with :func:`as_client` around their call into the store (the store's
own signatures are unchanged; a call without it counts against ``--max-jobs`` only). The
client that sent a job's first span since serve started holds its slot.

When a new job does not fit, jobs that never made progress (no kept step) and have sent
nothing for ``--idle-without-progress`` seconds (default 300) leave first, as jobs idle
for ``--retention`` do, and only then is the request refused: first the client's own such
jobs, then (when all of ``--max-jobs`` are taken) those of the clients holding the most
slots. A refusal is retryable and names the limit, the flags and what frees a slot.

Retirement is final. A job that left (idle for ``--retention``, or without progress when
slots were short) keeps its final report (``"final": true``, in ``WAL_DIR/results/<job
slug>.json`` with a log), and spans for it that arrive later are refused for good
(``retired``: HTTP ``400``, gRPC ``INVALID_ARGUMENT``, with the reason and where the final
report is), never starting the job over. With a write-ahead log the result file is what
says a job is retired, so it stays retired across restarts; without one serve remembers
the last :data:`REMEMBERED` retired names.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
import time
from collections import OrderedDict

import numpy as np

from ..read import rows as tl
from .limits import Limits, Refused

__all__ = ["REMEMBERED", "JobSlots", "as_client", "current_client", "made_progress",
           "peer_host"]

#: Retired job names remembered in memory (without a write-ahead log, or before a result
#: file is read): the oldest are forgotten past it.
REMEMBERED = 65536

_log = logging.getLogger(__name__)
_CLIENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "goodput_serve_client", default=None)
_PORT = re.compile(r"^(ipv4:|ipv6:)?\[?(?P<host>.*?)\]?:\d+$")


@contextlib.contextmanager
def as_client(identity: str | None):
    """Calls into the store inside this block come from client ``identity`` (None: no
    client; such calls count against ``--max-jobs`` only)."""
    token = _CLIENT.set(identity)
    try:
        yield
    finally:
        _CLIENT.reset(token)


def current_client() -> str | None:
    """The client of the call in progress (:func:`as_client`), or None."""
    return _CLIENT.get()


def peer_host(peer: str) -> str:
    """A gRPC peer (``ipv4:10.0.0.5:43210``, ``ipv6:[::1]:5000``, ``unix:/path``) or an
    address without its port: the client's identity."""
    m = _PORT.match(peer or "")
    return m.group("host") if m else (peer or "unknown")


def made_progress(job, rows: dict) -> bool:
    """Whether a job (the reader's ``_Job``; ``rows``: the store's process rows of it) has
    a kept step: a step row waiting in a process's buffer or taken into its rows (a
    process whose rows are packed counts as progress: only big processes are packed)."""
    for key, p in job.processes.items():
        if len(p._buf) and (np.frombuffer(p._buf, np.int64)[tl.C_KIND::tl.NCOLS]
                            == tl.K_STEP).any():
            return True
        r = rows.get(key)
        if r is not None and (r.packed is not None
                              or (r.view()[:, tl.C_KIND] == tl.K_STEP).any()):
            return True
    return False


class JobSlots:
    """Who holds which job slot, which jobs may leave to make room, and which are retired.

    Not thread-safe: the store calls it under its lock.

    Args:
        limits: ``max_jobs``, ``max_jobs_per_client``, ``idle_without_progress_s``.
        results_dir: the write-ahead log's ``results/`` (a retired job's result file
            there marks it retired); None without a log.
    """

    def __init__(self, limits: Limits, results_dir=None):
        self.limits, self.results_dir = limits, results_dir
        self._owner: dict[str, str] = {}  # job -> client holding its slot
        self._held: dict[str, set[str]] = {}  # client -> jobs
        self._progressed: set[str] = set()  # jobs seen with a kept step
        self._retired: OrderedDict[str, str] = OrderedDict()  # job -> why (most recent)
        #: Jobs being retired now (their spans are refused as retryable meanwhile).
        self.retiring: set[str] = set()

    @property
    def per_client(self) -> int:
        """Slots one client may hold."""
        lim = self.limits
        return lim.max_jobs_per_client or max(1, lim.max_jobs // 2)

    # --- holders -----------------------------------------------------------------------

    def claim(self, name: str, client: str | None) -> None:
        """``client`` sent job ``name``'s first span (no-op when it has a holder)."""
        if client is None or name in self._owner:
            return
        self._owner[name] = client
        self._held.setdefault(client, set()).add(name)

    def held(self, client: str, tracked) -> int:
        """Slots ``client`` holds among the jobs ``tracked`` (others are let go)."""
        mine = self._held.get(client)
        if not mine:
            return 0
        gone = [n for n in mine if n not in tracked]
        for n in gone:
            self.forget(n)
        return len(self._held.get(client, ()))

    def forget(self, name: str) -> None:
        """Job ``name`` left: its slot is free."""
        client = self._owner.pop(name, None)
        if client is not None:
            mine = self._held.get(client)
            if mine is not None:
                mine.discard(name)
                if not mine:
                    del self._held[client]
        self._progressed.discard(name)

    # --- making room ---------------------------------------------------------------------

    def short(self, new: list[str], client: str | None, tracked) -> str | None:
        """``"client"`` when ``new`` jobs of ``client`` are over its slots,
        ``"global"`` when over ``--max-jobs``, else None."""
        if not new:
            return None
        if client is not None and self.held(client, tracked) + len(new) > self.per_client:
            return "client"
        if len(tracked) + len(new) > self.limits.max_jobs:
            return "global"
        return None

    def candidates(self, scope: str, client: str | None, n: int, tracked, last_seen: dict,
                   now_s: float, progress) -> list[str]:
        """Up to ``n`` jobs that may leave to make room: no kept step (``progress(name)``
        says whether a job has one) and no span for ``idle_without_progress_s``; of
        ``client`` only (``scope="client"``), else of every client, those of the clients
        holding the most slots first; the longest idle first."""
        idle_s = self.limits.idle_without_progress_s
        if scope == "client":
            pool = list(self._held.get(client, ()))
        else:
            pool = list(tracked)
        out = []
        for name in pool:
            if name in self._progressed or name not in tracked:
                continue
            seen = last_seen.get(name)
            if seen is None or now_s - seen < idle_s:
                continue
            if progress(name):
                self._progressed.add(name)
                continue
            out.append(name)

        def order(name):
            owner = self._owner.get(name)
            return (-len(self._held.get(owner, ())) if owner else 0, last_seen[name])

        return sorted(out, key=order)[:n]

    def make_room(self, groups: dict, tracked, client: str | None, last_seen: dict,
                  progress, retire, lock, retention_s) -> None:
        """Make room for the new jobs of ``groups`` (those not ``tracked``) of ``client``,
        or refuse them: while they do not fit, retire (``retire(names, why)``, with
        ``lock``, held by the caller, let go meanwhile) the :meth:`candidates`; when there
        are none (or twice did not do), raise :meth:`refusal`.

        Raises:
            Refused: ``over_client_jobs`` or ``over_jobs`` (retryable).
        """
        for attempt in range(3):
            new = [n for n in groups if n not in tracked]
            scope = self.short(new, client, tracked)
            if scope is None:
                return
            over = (self.held(client, tracked) + len(new) - self.per_client
                    if scope == "client" else len(tracked) + len(new) - self.limits.max_jobs)
            names = [] if attempt == 2 else self.candidates(
                scope, client, over, tracked, last_seen, time.time(), progress)
            if not names:
                raise self.refusal(scope, client, tracked, retention_s)
            lock.release()
            try:
                retire(names, f"no kept step and no span for "
                       f"{self.limits.idle_without_progress_s:g} s (--idle-without-progress) "
                       "while job slots were short")
            finally:
                lock.acquire()

    def refusal(self, scope: str, client: str | None, tracked, retention_s) -> Refused:
        """The retryable :class:`Refused` for a new job that does not fit."""
        lim = self.limits
        frees = (f"a job without a step leaves after --idle-without-progress "
                 f"{lim.idle_without_progress_s:g} s without spans"
                 + (f", any job after --retention {retention_s:g} s" if retention_s else ""))
        if scope == "client":
            return Refused("over_client_jobs", f"client {client} holds {self.per_client} "
                           f"jobs, the limit per client (--max-jobs-per-client "
                           f"{self.per_client}, of --max-jobs {lim.max_jobs}): {frees}; "
                           "raise --max-jobs-per-client, or send fewer job names",
                           retry_after_s=min(30.0, lim.idle_without_progress_s) or 1.0)
        return Refused("over_jobs", f"{len(tracked)} jobs tracked, the limit is "
                       f"{lim.max_jobs} (--max-jobs): {frees}; raise --max-jobs",
                       retry_after_s=30.0)

    # --- retirement --------------------------------------------------------------------

    def retire(self, name: str, why: str) -> None:
        """Job ``name`` is retired (from now on, before its result is written)."""
        self._retired[name] = why
        self._retired.move_to_end(name)
        while len(self._retired) > REMEMBERED:
            self._retired.popitem(last=False)
        self.forget(name)

    def unretire(self, name: str) -> None:
        """Retiring job ``name`` failed (its result could not be written): it stays."""
        self._retired.pop(name, None)

    def retired(self, name: str, slug=None) -> str | None:
        """Why job ``name`` was retired, or None (not retired). With a log, a result file
        ``results/<slug>.json`` (``slug``: the job's :func:`~goodput_processor.serve.wal.
        job_slug`) says so across restarts."""
        why = self._retired.get(name)
        if why is not None or self.results_dir is None or slug is None:
            return why
        if os.path.exists(os.path.join(self.results_dir, f"{slug}.json")):
            self._retired[name] = why = "retired before serve started"
            while len(self._retired) > REMEMBERED:
                self._retired.popitem(last=False)
        return why

    def take_out_late(self, groups: dict, tracked, stats, slug=None) -> None:
        """Spans for retired jobs (not ``tracked``) in a request's ``groups`` (job ->
        (ResourceSpans, spans)): refused for good (:class:`Refused` ``retired``) when the
        request holds nothing else, else taken out of ``groups`` (the other jobs' spans are
        taken in), counted in ``stats["retired_spans"]`` and logged. A job being retired
        now is refused as retryable. ``slug``: :func:`~goodput_processor.serve.wal.
        job_slug` with a log (None without).

        Raises:
            Refused: as said.
        """
        late = {}
        for name in groups:
            if name in self.retiring:
                raise Refused("unavailable", f"job {name!r} is being retired",
                              retry_after_s=2.0)
            if name not in tracked:
                why = self.retired(name, slug(name) if slug else None)
                if why is not None:
                    late[name] = why
        if not late:
            return
        name, why = next(iter(late.items()))
        where = (os.path.join(self.results_dir, f"{slug(name)}.json")
                 if slug and self.results_dir is not None else None)
        if len(late) == len(groups):
            raise self.late(name, why, where)
        for n in late:
            stats["retired_spans"] += groups.pop(n)[1]
        stats["retired_requests"] += 1
        if stats["retired_requests"] in (1, 10) or stats["retired_requests"] % 1000 == 0:
            _log.warning("goodput serve: part of a request: %s", self.late(name, why,
                                                                         where).message)

    def final_report(self, slug: str) -> dict | None:
        """The final report in ``results/<slug>.json`` (``job_to_dict`` with ``"final":
        true`` and ``"retired"``: why); None without a log, or when there is no such file
        or it cannot be read."""
        if self.results_dir is None:
            return None
        try:
            with open(os.path.join(self.results_dir, f"{slug}.json"), "rb") as f:
                doc = json.loads(f.read())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict):
            return None
        doc.setdefault("final", True)
        doc.setdefault("retired", "retired by an older serve")
        return doc

    def late(self, name: str, why: str, where: str | None) -> Refused:
        """The refusal, for good, of spans for retired job ``name``."""
        at = f" ({where})" if where else ""
        return Refused("retired", f"job {name!r} was retired ({why}) and its report is "
                       f"final{at}: spans sent after are refused, never starting it "
                       "over; send a new run under a new job name (goodput.job.name), or "
                       "raise --retention", retryable=False)
