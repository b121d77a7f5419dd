"""Realistic multi-node ``resiliency.goodput_measure`` event logs with known truth.

:func:`generate` simulates a job of many nodes launched again and again, and writes the
event log its nodes would have written (JSON lines ``{"timestamp", "job_name",
"event_type", "node_rank"?, "step"?}``), with the time of every bucket of
``goodput report --ideal-step-time REF`` computed from what it simulated. What it
simulates, each launch (attempt) a wave of node starts:

- most restarts are pod kills: nobody logs ``job_terminated``; some restarts follow a
  graceful stop (every node logs ``job_terminated``); the last launch ends with
  ``user_terminated`` and every node's ``job_terminated``;
- nodes missing from a launch (its lines lost: no start, no termination; never node 0,
  which writes the checkpoint events);
- launches that die before loading a checkpoint;
- a restart that resumes from the checkpoint before the last one (the last one unusable),
  so the work after it is wasted;
- slow launches (steps 1.2-1.5 x the reference), the rest within 1 % of it (+ the save);
- a node's launcher that logs ``job_started`` twice 0.1-3 s apart, a node's
  ``job_terminated`` twice, any line written twice (identical); lines shuffled, as from
  many writers; checkpoint events with ``node_rank`` 0 or with none.

The truth (seconds per bucket, :attr:`GeneratedLog.truth`) is what the log can show: a
killed launch ends at its last event (the work between it and the kill left no trace, so
it counts as infrastructure recovery, as ``goodput report`` counts it;
:attr:`GeneratedLog.unlogged_s` says how much that was). Buckets:
``productive``, ``training_slowdown``, ``wasted_progress``, ``infrastructure_recovery``,
``custom:scheduling`` (``user_scheduled`` to the first start), ``training_prep`` (node 0's
start to the load of step 0), ``custom:startup_and_restore`` (node 0's start to the load
of a step > 0), ``process_startup`` (a launch's first start to node 0's start, and the
whole of a launch that died before loading: nothing but start markers; for the first
launch, whose first span is the scheduling span, that time is ``other``), ``other`` (also
the end of the last launch after its last save); the rest are 0.

    python benchmarks/resiliency_logs.py OUT.log [--seed 1] [--nodes 112] [--attempts 12]
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

__all__ = ["BUCKETS", "Config", "GeneratedLog", "generate", "write_log"]

#: Buckets the truth has (``goodput report`` names); all others are 0.
BUCKETS = ("productive", "training_slowdown", "wasted_progress", "infrastructure_recovery",
           "custom:scheduling", "training_prep", "custom:startup_and_restore",
           "process_startup", "other")
_US = 1_000_000
_T0 = datetime(2025, 9, 27, 4, 0)


@dataclass(frozen=True)
class Config:
    """What to simulate. Times in seconds; ``p_*`` are probabilities per launch (or line)."""

    nodes: int = 112
    attempts: int = 12  #: launches; the last one ends the job
    ref_step_s: float = 1.0  #: reference (ideal) step time
    save_every: int = 100  #: steps between checkpoints
    p_graceful: float = 0.2  #: a restart after a graceful stop (every node terminates)
    p_dead: float = 0.15  #: a launch dies before loading a checkpoint (never the last)
    p_missing: float = 0.3  #: 1-3 nodes (not node 0) log nothing in a launch
    p_slow: float = 0.25  #: a launch's steps run 1.2-1.5 x the reference
    p_old_checkpoint: float = 0.15  #: a restart resumes from the checkpoint before the last
    p_dup_start: float = 0.1  #: a node logs job_started twice (per node and launch)
    p_dup_end: float = 0.05  #: a node logs job_terminated twice
    p_dup_line: float = 0.01  #: any line written twice, identical
    start_spread_s: tuple[float, float] = (5.0, 40.0)  #: the nodes of a launch start within
    restart_delay_s: tuple[float, float] = (30.0, 300.0)  #: kill -> next launch's first start
    job: str = "llm-112"


@dataclass
class GeneratedLog:
    """A generated log: its lines (dicts, shuffled) and what is true about it."""

    rows: list[dict]
    truth: dict[str, float]  #: seconds per bucket (:data:`BUCKETS`)
    attempts: int  #: launches, including those that died before loading
    nodes: int  #: distinct node ranks in the log
    duplicates: int  #: lines a correct importer drops as duplicates
    min_loaded_step: int
    max_saved_step: int
    unlogged_s: float  #: work between killed launches' last event and the kill (in recovery)
    killed: int = 0  #: launches that ended without any job_terminated (pod kills, deaths)
    resume_steps: list = field(default_factory=list)  #: per launch: step loaded, None: died


def _us(seconds: float) -> int:
    return round(seconds * _US)


def generate(seed: int, config: Config = Config()) -> GeneratedLog:
    """Simulate a job and return its log and truth (deterministic for a ``seed``)."""
    c, rng = config, random.Random(seed)
    lines: list[tuple[int, str, dict]] = []  # (time in µs, event type, extra fields)
    dups = 0

    def ev(t: int, kind: str, **kw) -> None:
        nonlocal dups
        lines.append((t, kind, kw))
        if rng.random() < c.p_dup_line:
            lines.append((t, kind, kw))
            dups += 1

    def u(lo: float, hi: float) -> int:
        return _us(rng.uniform(lo, hi))

    ev(0, "user_scheduled")
    t = u(30, 600)  # in the queue until the first node starts
    ckpts: list[int] = []  # usable checkpoint steps, ascending
    launches, seen, unlogged = [], set(), 0
    for i in range(c.attempts):
        last = i == c.attempts - 1
        present = list(range(c.nodes))
        if rng.random() < c.p_missing:
            for n in rng.sample(range(1, c.nodes), rng.randint(1, 3)):
                present.remove(n)
        seen.update(present)
        spread = rng.uniform(*c.start_spread_s)
        starts = {n: t + u(0, spread) for n in present}
        for n, s in starts.items():
            ev(s, "job_started", node_rank=n)
            if rng.random() < c.p_dup_start:
                ev(s + u(0.1, 3), "job_started", node_rank=n)
                dups += 1
        a = {"start": min(starts.values()), "node0": starts[0], "stretches": []}
        launches.append(a)
        last_start = max(starts.values())
        if not last and rng.random() < c.p_dead:  # dies during start-up
            a.update(dead=True, end=last_start, step=None, killed=True)
            t = last_start + u(5, 60) + u(*c.restart_delay_s)
            continue
        if len(ckpts) >= 2 and rng.random() < c.p_old_checkpoint:
            ckpts.pop()  # the latest checkpoint is unusable: resume from the one before
        step = ckpts[-1] if ckpts else 0
        load = last_start + u(15, 90)
        _ckpt_event(ev, rng, load, "checkpoint_loaded", step)
        a.update(dead=False, load=load, step=step, killed=False)
        per_step = c.ref_step_s * (rng.uniform(1.2, 1.5) if rng.random() < c.p_slow
                                   else rng.uniform(0.98, 1.01))
        tt = load
        for _ in range(rng.randint(3, 8) if last else rng.randint(0, 8)):
            dur = _us(c.save_every * per_step + rng.uniform(0.2, 2.0))  # steps + the save
            step += c.save_every
            _ckpt_event(ev, rng, tt + dur, "checkpoint_saved", step)
            a["stretches"].append((tt, tt + dur, step))
            tt += dur
            ckpts = [s for s in ckpts if s < step] + [step]
        if last or rng.random() < c.p_graceful:
            stop = tt + (u(1, 10) if last else u(5, 60))
            if last:
                ev(stop, "user_terminated")
            ends = []
            for n in present:
                e = stop + u(0.5, 15)
                ev(e, "job_terminated", node_rank=n)
                if rng.random() < c.p_dup_end:  # logged twice: the node's end is the last
                    e += u(0.1, 1)
                    ev(e, "job_terminated", node_rank=n)
                    dups += 1
                ends.append(e)
            a["end"] = max(ends)
            t = a["end"] + u(*c.restart_delay_s)
        else:  # pod kill: no line; the work since the last event is lost, unseen
            a.update(end=tt, killed=True)
            kill = tt + u(1, c.save_every * c.ref_step_s)
            unlogged += kill - tt
            t = kill + u(*c.restart_delay_s)
    rng.shuffle(lines)
    rows = [{"timestamp": (_T0 + timedelta(microseconds=tm)).isoformat(timespec="microseconds"),
             "job_name": c.job, "event_type": kind, **kw} for tm, kind, kw in lines]
    loaded = [a["step"] for a in launches if not a["dead"]]
    saved = [s for a in launches for *_, s in a["stretches"]]
    return GeneratedLog(rows=rows, truth=_truth(launches, c.ref_step_s * _US, c.save_every),
                        attempts=len(launches), nodes=len(seen), duplicates=dups,
                        min_loaded_step=min(loaded), max_saved_step=max(saved, default=0),
                        unlogged_s=unlogged / _US, killed=sum(a["killed"] for a in launches),
                        resume_steps=[a["step"] for a in launches])


def _ckpt_event(ev, rng: random.Random, t: int, kind: str, step: int) -> None:
    """A checkpoint event of node 0, with ``node_rank`` 0 or none (both are node 0)."""
    if rng.random() < 0.5:
        ev(t, kind, step=step, node_rank=0)
    else:
        ev(t, kind, step=step)


def _truth(launches: list[dict], ref_us: float, save_every: int) -> dict[str, float]:
    """Seconds per bucket, by the accounting rules (docs/accounting.md) applied to what was
    simulated: kept stretches are productive (slowdown beyond 5 % of the reference); a
    launch with a later one wastes from the end of its last kept stretch to its end."""
    us = dict.fromkeys(BUCKETS, 0)
    us["custom:scheduling"] = launches[0]["start"]
    for i, a in enumerate(launches):
        later = launches[i + 1:]
        if later:
            us["infrastructure_recovery"] += later[0]["start"] - a["end"]
        # Before node 0's first span the launch was starting up; the first launch's first
        # span is the scheduling span (from user_scheduled), so its gap is plain ``other``.
        early = "process_startup" if i else "other"
        if a["dead"]:  # only start markers: the launch never got past its start-up
            us[early] += a["end"] - a["start"]
            continue
        us[early] += a["node0"] - a["start"]
        bucket = "custom:startup_and_restore" if a["step"] > 0 else "training_prep"
        us[bucket] += a["load"] - a["node0"]
        resumes = [b["step"] for b in later if not b["dead"]]
        kept = [s for s in a["stretches"] if all(s[2] <= r for r in resumes)]
        wasted_from = None
        if later and a["stretches"]:
            wasted_from = kept[-1][1] if kept else a["stretches"][0][0]
        for begin, end, _step in kept:
            dur = end - begin
            if dur > save_every * ref_us * 1.05:  # anomalous: beyond the 5 % noise floor
                us["productive"] += save_every * ref_us
                us["training_slowdown"] += dur - save_every * ref_us
            else:
                us["productive"] += dur
        if wasted_from is not None:
            us["wasted_progress"] += a["end"] - wasted_from
        else:
            us["other"] += a["end"] - (a["stretches"][-1][1] if a["stretches"] else a["load"])
    return {k: v / _US for k, v in us.items()}


def write_log(path, log: GeneratedLog) -> None:
    """Write ``log.rows`` to ``path`` as JSON lines."""
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in log.rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the log file to write (JSON lines)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=Config.nodes)
    ap.add_argument("--attempts", type=int, default=Config.attempts)
    args = ap.parse_args(argv)
    log = generate(args.seed, Config(nodes=args.nodes, attempts=args.attempts))
    write_log(args.out, log)
    print(json.dumps({"lines": len(log.rows), "attempts": log.attempts, "nodes": log.nodes,
                      "duplicates": log.duplicates, "truth_s": log.truth,
                      "unlogged_s": log.unlogged_s}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
