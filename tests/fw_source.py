"""A test-only source: the vocabulary of a made-up tool, ``fwtool``, read as goodput spans.

For the tests of ``goodput serve``'s intake of foreign producers (tests/serve/test_serve_sources.py)
and ``benchmarks/bench_serve.py --source fwtool`` while no real source is registered. Not a
real tool's vocabulary: it has the shape of one (its own resource keys, span names and log
record bodies), so that the path through the sources is the real one.

- Resource: ``fw.job_id`` (the job), ``fw.run_id`` (one per incarnation), ``fw.rank``,
  ``fw.restart`` (the restart count, the attempt; 0 when absent).
- Scope ``fwtool``. Spans: ``fw.start`` / ``fw.end`` (zero-length markers: job start, job
  end with reason ``exit``), ``fw.init`` (training prep), ``fw.iteration`` with the int
  attribute ``fw.iteration`` (a step), ``fw.save`` / ``fw.load`` with ``fw.iteration``
  (checkpoint save / restore). A step span without an int ``fw.iteration`` is malformed:
  skipped and counted.
- Log records: body ``fw.iteration`` with ``fw.iteration`` (int) and ``fw.duration_ms``
  (the step ended at the record's time); a record without ``fw.duration_ms`` is a step of
  zero length, named with the warning ``fw_duration_missing``.

Use: ``register(monkeypatch)`` puts it in the source registry for one test.
"""

from __future__ import annotations

from goodput import schema
from goodput_processor.importers.sources import Source, Translator

SCOPE = "fwtool"

_PHASES = {"fw.init": schema.TRAINING_PREP, "fw.iteration": schema.STEP,
           "fw.save": schema.CHECKPOINT_SAVE, "fw.load": schema.CHECKPOINT_RESTORE,
           "fw.start": schema.JOB_START, "fw.end": schema.JOB_END}


class FwTranslator(Translator):
    """``fwtool``'s spans and log records -> goodput spans (see the module docstring)."""

    def _proc(self, resource: dict, where: str) -> str | None:
        job, run = resource.get("fw.job_id"), resource.get("fw.run_id")
        rank = resource.get("fw.rank", 0)
        if not isinstance(job, str) or not isinstance(run, str) or not isinstance(rank, int):
            self.problems.add(where, "malformed", "resource without fw.job_id / fw.run_id")
            return None
        attempt = resource.get("fw.restart", 0)
        return self.emit.process(f"{run}/{rank}", job=job, rank=rank,
                                 attempt=attempt if isinstance(attempt, int) else 0,
                                 extra={"fw.run_id": run})

    def spans(self, resource, scope, spans, where):
        key = self._proc(resource, where)
        if key is None:
            return
        for s in spans:
            name = _PHASES.get(s.name)
            if name is None:
                self.problems.add(where, "unknown_record", f"span {s.name!r}")
                continue
            attrs = {}
            step = s.attrs.get("fw.iteration")
            if name in (schema.STEP, schema.CHECKPOINT_SAVE, schema.CHECKPOINT_RESTORE):
                if not isinstance(step, int) or isinstance(step, bool):
                    self.problems.add(where, "malformed", f"{s.name} without an int "
                                      f"fw.iteration ({step!r})")
                    continue
                attrs[schema.ATTR_STEP if name == schema.STEP
                      else schema.ATTR_CHECKPOINT_STEP] = step
            if name == schema.JOB_END:
                attrs[schema.ATTR_END_REASON] = "exit"
            self.emit.span(key, name, s.start_ns, s.end_ns, attrs, span_id=s.span_id or None)

    def logs(self, resource, scope, records, where):
        key = self._proc(resource, where)
        if key is None:
            return
        for r in records:
            step = r.attrs.get("fw.iteration")
            if r.body != "fw.iteration" or not isinstance(step, int) or not r.time_ns:
                self.problems.add(where, "malformed", f"log record {r.body!r} without an "
                                  f"int fw.iteration ({step!r}) or a time")
                continue
            ms = r.attrs.get("fw.duration_ms")
            if not isinstance(ms, (int, float)):
                self.warn("fw_duration_missing")
                ms = 0
            self.emit.span(key, schema.STEP, r.time_ns - round(ms * 1e6), r.time_ns,
                           {schema.ATTR_STEP: step})


SOURCE = Source(
    name="fwtool", imported_from="fwtool", reads=frozenset({"traces", "logs"}),
    translator=FwTranslator, matches=lambda resource, scope, names: scope == SCOPE,
    doc="", checked="test-only")


def register(monkeypatch) -> Source:
    """Add :data:`SOURCE` to the registry for one test (the registered sources stay)."""
    from goodput_processor.importers import sources

    monkeypatch.setattr(sources, "_cache", {**sources.all_sources(), SOURCE.name: SOURCE})
    return SOURCE
