"""``python -m goodput.torchrun [torchrun arguments]``: torchrun, with its events recorded.

torchelastic's agent publishes events through ``torch.distributed.elastic.events`` to the
logging handler named by ``--event-log-handler`` (default ``null``: dropped): a worker
started (``torchelastic.worker.status.START``, with its pid), a rendezvous finished
(``...RENDEZVOUS``, with its duration), and, when the run ends, each worker's final state with
its exit code. It publishes nothing when it *sees* a worker fail and restarts the group,
which is what a restart's phases need. This launcher runs ``torch.distributed.run`` in this
process with

- goodput configured as a **launcher** (resource ``goodput.process.role = launcher``: the
  processor reads its events and counts it in no attempt), the job name and run directory
  from the same ``GOODPUT_*`` variables as the workers;
- a handler ``goodput`` registered with torchelastic's events (and for its rendezvous events,
  ``dynamic_rendezvous``, when nothing else handles them) that writes each event as a
  ``goodput.launcher_event`` span (schema 1.3): the event's name, the worker's pid, exit
  code, global rank and the agent's restart count; an event with a duration covers it;
- the agent's worker monitor (``LocalElasticAgent._monitor_workers``, private API of torch
  2.x, wrapped only if present) reporting each failed worker once, when the agent sees it,
  as ``torchelastic.worker.failed`` with its exit code (negative: the signal that killed it,
  torchelastic's convention).

``--event-log-handler goodput`` is added unless the command line names a handler. Everything
here is guarded: an error while recording is counted by the recorder, never raised into the
agent. The processor uses the events for the recovery phases (``docs/accounting.md``,
"Recovery phases"): which worker failed first and how, and the agent's rendezvous.
"""

from __future__ import annotations

import json
import logging
import sys
import time

from goodput import schema

__all__ = ["HANDLER_NAME", "GoodputEventHandler", "install", "main"]

#: Name of the torchelastic event handler this module registers.
HANDLER_NAME = "goodput"
_INT_ATTRS = (("global_rank", schema.ATTR_LAUNCHER_GLOBAL_RANK),
              ("agent_restarts", schema.ATTR_LAUNCHER_RESTART_COUNT))


def _int(v) -> int | None:
    """An int from an event value (ints, digit strings, one-element lists as torchelastic's
    nested metadata has them); None otherwise."""
    if isinstance(v, (list, tuple)) and len(v) == 1:
        v = v[0]
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.lstrip("-").isdigit():
        return int(v)
    return None


def record_event(name: str, attrs: dict, duration_ns: int = 0, at_ns: int | None = None) -> None:
    """Write one ``goodput.launcher_event`` span ending now (or at ``at_ns``)."""
    import goodput

    end = time.time_ns() if at_ns is None else at_ns
    attrs = {schema.ATTR_LAUNCHER_EVENT: name[:200],
             **{k: v for k, v in attrs.items() if v is not None}}
    goodput.get_recorder().record(schema.LAUNCHER_EVENT, end - max(duration_ns, 0), end, attrs)


class GoodputEventHandler(logging.Handler):
    """A ``logging.Handler`` for torchelastic's events: each becomes a launcher event span."""

    def emit(self, record: logging.LogRecord) -> None:  # noqa: D102 - logging API
        try:
            ev = json.loads(record.getMessage())
            if not isinstance(ev, dict):
                return
            if "node_state" in ev:  # a rendezvous event (RdzvEvent)
                name = str(ev.get("name", ""))
                if "keep_alive" in name:
                    return
                record_event(f"torchelastic.rendezvous.{ev.get('node_state')}:{name}",
                             {schema.ATTR_LAUNCHER_GLOBAL_RANK: _int(ev.get("rank"))})
                return
            md = ev.get("metadata") or {}
            inner = md.get("metadata")
            try:
                inner = json.loads(inner) if isinstance(inner, str) else (inner or {})
            except ValueError:
                inner = {}
            attrs = {key: _int(md.get(field)) for field, key in _INT_ATTRS}
            attrs[schema.ATTR_LAUNCHER_WORKER_PID] = (_int(inner.get("worker_pid"))
                                                      or _int(md.get("worker_id")))
            attrs[schema.ATTR_LAUNCHER_EXIT_CODE] = _int(inner.get("exit_code"))
            dur = md.get("duration_ms")
            dur_ns = int(dur * 1e6) if isinstance(dur, (int, float)) and dur > 0 else 0
            record_event(str(ev.get("name", "torchelastic")), attrs, dur_ns)
        except Exception:  # never into the agent
            _count_error("torchelastic event not recorded")


def _count_error(what: str) -> None:
    try:
        import goodput

        goodput.get_recorder().error(what)
    except Exception:
        pass


def _wrap_monitor() -> None:
    """Report each worker the agent sees fail, once (``torchelastic.worker.failed``)."""
    try:
        from torch.distributed.elastic.agent.server.local_elastic_agent import (
            LocalElasticAgent,
        )
    except ImportError:
        return
    orig = getattr(LocalElasticAgent, "_monitor_workers", None)
    if orig is None or getattr(orig, "_goodput", False):
        return
    seen: set[int] = set()

    def _monitor_workers(self, worker_group):
        result = orig(self, worker_group)
        try:
            if result.is_failed():
                spec = self._worker_group.spec
                restarts = spec.max_restarts - self._remaining_restarts
                for rank, failure in sorted(result.failures.items(),
                                            key=lambda kv: kv[1].timestamp):
                    if failure.pid in seen:
                        continue
                    seen.add(failure.pid)
                    record_event("torchelastic.worker.failed", {
                        schema.ATTR_LAUNCHER_WORKER_PID: int(failure.pid),
                        schema.ATTR_LAUNCHER_EXIT_CODE: int(failure.exitcode),
                        schema.ATTR_LAUNCHER_GLOBAL_RANK: int(rank),
                        schema.ATTR_LAUNCHER_RESTART_COUNT: int(restarts)})
        except Exception:
            _count_error("torchelastic failure not recorded")
        return result

    _monitor_workers._goodput = True  # type: ignore[attr-defined]
    LocalElasticAgent._monitor_workers = _monitor_workers


def install() -> GoodputEventHandler:
    """Configure goodput as this process's launcher recorder, register the event handler
    with torchelastic (name :data:`HANDLER_NAME`) and wrap the agent's worker monitor.
    Returns the handler."""
    from torch.distributed.elastic.events import handlers

    import goodput

    goodput.configure(resource_attributes={schema.RES_PROCESS_ROLE: "launcher"})
    handler = GoodputEventHandler()
    table = handlers._log_handlers  # torchelastic's registry of named handlers (private)
    table[HANDLER_NAME] = handler
    if isinstance(table.get("dynamic_rendezvous"), logging.NullHandler):
        table["dynamic_rendezvous"] = handler
    _wrap_monitor()
    return handler


def main(argv: list[str] | None = None) -> None:
    """Run torchrun with ``argv`` (default ``sys.argv[1:]``), its events recorded."""
    args = list(sys.argv[1:] if argv is None else argv)
    install()
    if not any(a.split("=")[0] in ("--event-log-handler", "--event_log_handler")
               for a in args):
        args = ["--event-log-handler", HANDLER_NAME, *args]
    from torch.distributed.run import main as torchrun_main

    torchrun_main(args)


if __name__ == "__main__":
    main()
