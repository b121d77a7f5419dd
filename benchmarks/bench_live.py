"""What a live poll of a running job costs: 60 s of new data, then nothing new (issue 17).

Issue 17, target 1: after 60 s of new data on a 10^6-step job, a poll (``goodput serve``'s
``GET /v1/report``, the Prometheus scrape, the compat calculator, ``GoodputMonitor``) takes
under 50 ms, and under 5 ms when nothing is new, for both definitions. This measures
today's figures, and ml-goodput-measurement 0.2.3's on the same timeline.

**The job.** The real recorder records the job of ``benchmarks/recorded_job.py`` (its
child processes, one per attempt, on a simulated clock flushing every simulated second:
3 restarts (``--restarts``) that redo steps, 0.5 s steps with a data-loading phase before
each, a 2 s checkpoint every 1,000 steps, a 5 s ``eval`` every 5,000), except that the
*last* attempt is killed too (``os._exit`` right after a flush): it leaves no end marker,
as a job still running. The journal lines of its last 60 simulated seconds are cut off the
end of its journal and kept aside ("new data").

**"Now".** A running attempt is one seen alive within ``RUNNING_INTERVALS`` (3) heartbeat
intervals (1 s) of now (``goodput_processor.model.attempts.build_attempts``), and the polls of a
10^6-step job take seconds, so the real clock cannot stay within 3 s of a recorded job.
The processor reads "now" in one place, ``goodput_processor.model.attempts.clock_ns`` (its ``time``)
(every surface measured here calls ``build_attempts`` without ``now_ns``); the benchmark
replaces that module's ``time`` (as ``recorded_job.py`` does the recorder's) with a clock
set before each poll, which does not move during it (a poll that takes seconds would
otherwise see the job die under it, and account it differently part way): 0.5 s after the
last line fed (warm poll), 0.5 s after the last new line ("60 s new"), 1.0 s after it
("nothing new": no new data, but a later now). mgm 0.2.3 reads ``datetime.datetime.now``
in its ``goodput`` module: the same clock there. Each child checks that the last attempt
is ``running`` at the "nothing new" moment and that the timed polls read the clock
(column ``run``).

**Per surface and definitions**, in a fresh child process each (peak RSS = its maximum
resident set size, ``wait4``; ``--repeat`` rounds, surfaces interleaved, medians shown):
feed everything before the cut, poll once (warm: the whole job), append the 60 s to the
journal, poll and time it ("60 s new"), poll again and time it ("nothing new").

- ``serve-report``: an in-process ``GoodputServer(LiveStore(min_interval_s=0),
  grpc_port=None, http_port=0, spool_dirs=[RUN], poll_s=3600)`` (the store would reuse a
  result for ``min_interval_s``, 1 s by default and ``min(--report-interval, 1)`` in the
  CLI: 0 makes every GET recompute), with ``/metrics`` wired as ``goodput serve`` wires it
  (``serve.command._metrics``). The new lines are taken in by ``server.tailer.poll()``
  (what the tailer thread does every ``--poll-interval``; timed apart: column ``ingest``),
  then ``GET /v1/report`` over loopback HTTP, timed from the client. Serve has no
  definitions option for ``/v1/report`` or ``/metrics`` (only ``--workload-definitions``
  for the Cloud Monitoring upload): its ``mgm`` rows say ``n/a``.
- ``serve-metrics``: the same server, ``GET /metrics`` (Prometheus text). ``GoodputMetrics``
  reuses a snapshot younger than ``min_refresh_s`` (0.5 s, not settable from the CLI): the
  benchmark waits 0.6 s (real time) before each scrape so each one recomputes. The scrape
  with nothing new is then split: ``generate_latest`` of the same registry right after it
  (the snapshot reused: the OpenTelemetry SDK's collection of the gauges, its Prometheus
  exporter and ``prometheus_client``'s text, column ``sdk``), and the store's
  ``snapshot_windows`` 0.5 s later, nothing new still (the accounting with the rolling
  windows, column ``acct``); the rest of the scrape is loopback HTTP and the handler.
- ``compat``: ``goodput.mgm.goodput.GoodputCalculator(JOB, run_dir=RUN,
  definitions=D).get_job_goodput(include_badput_breakdown=True)``; it tails the spool itself
  (reading the new lines is inside the timed call). ``D`` = ``goodput`` and ``mgm``.
- ``monitor``: ``GoodputMonitor(RUN).run_once()`` (tail, account with the rolling windows);
  with ``mgm``, configured to also write mgm's Cloud Monitoring series with
  ``workload_definitions="mgm"`` (accelerator type ``TPU-v5p``) to a client that discards
  them (its only mgm path): the series' protobufs are built, the request is not sent.
- ``incumbent``: ml-goodput-measurement 0.2.3's ``GoodputCalculator.get_job_goodput(
  include_badput_breakdown=True)``, fed the log entries its recorder and Orbax's statistics
  would have written for the same timeline (``definitions.mgm_events.events`` of the
  spans) through an in-memory stand-in for its Cloud Logging reader (as the project's tests
  do), entries after the cut hidden until "appended". Its own cache is a JSON-lines file
  under a temporary ``cache_dir``. ``--incumbent-steps`` measures it on a smaller job.

Commands::

    python benchmarks/bench_live.py --steps 100000
    python benchmarks/bench_live.py                      # 10^6 steps, 3 rounds
    python benchmarks/bench_live.py --keep /tmp/bench_live_keep --surfaces serve-report compat
    python benchmarks/bench_live.py --incumbent-steps 100000   # incumbent on a smaller job
    python benchmarks/bench_live.py --keep DIR --surfaces serve-report serve-metrics --pack
    python benchmarks/bench_live.py --keep DIR --surfaces serve-report --hosts 4 \
        --steps 250000 --slow-share 0.01          # 4 processes in step: 10^6 host-steps
    python benchmarks/bench_live.py --keep DIR --restarts 3 200 --shape incumbent \
        --surfaces serve-report compat monitor --repeat 2 --profile /tmp/poll.prof
        # issue 40: the same surfaces with 3 and 200 restarts, side by side (column x R0)

``--restarts`` and ``--shape`` are ``recorded_job.add_job_options``'s (the job shapes of
``recorded_job.SHAPES``; ``incumbent``: 1 s steps, a checkpoint every 100, an eval every
500, evenly spaced restarts). Each surface runs with every ``--restarts`` in turn, in
each round.

Temporary data goes under ``/tmp/bench_live_*`` and is removed unless ``--keep DIR``
(``DIR/job-N``: the spool, restored whole at the end, reused by later runs;
``DIR/job-N.json``, ``.new``: the cut and the held-back lines; ``DIR/job-N.mgm.npz``: the
incumbent's entries). Run it on a quiet machine: it is a benchmark, never a test.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import recorded_job  # noqa: E402

SEC = 1_000_000_000
HOLD_S = 60  # seconds of new data
JOB = "recorded"  # recorded_job.py's job name
TARGET_NEW_MS, TARGET_NONE_MS = 50.0, 5.0
#: surface -> definitions it is measured with (None: the surface has no such option)
PLAN = {
    "serve-report": {"goodput": True, "mgm": None},
    "serve-metrics": {"goodput": True, "mgm": None},
    "compat": {"goodput": True, "mgm": True},
    "monitor": {"goodput": True, "mgm": True},
    "incumbent": {"mgm": True},
}
_NANO = re.compile(rb'UnixNano":"(\d+)"')


def _env() -> dict:
    """Environment of the child processes: this checkout's ``src`` and ``collectors``."""
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT / "collectors")])
    return {**os.environ, "PYTHONPATH": path}


# --- the job ------------------------------------------------------------------------------


def record(out_dir: Path, steps: int, restarts: int = 3, seed: int = 0,
           slow_share: float = 0.0, hosts: int = 1, shape: str = "own") -> float:
    """Record the job of ``recorded_job.py`` (its ``shape``) into ``out_dir`` with its last
    attempt killed (no end marker: it is running); returns the wall seconds it took.

    The kills are ``recorded_job.kill_steps``; the last attempt runs to ``steps`` and is
    killed right after its last flush (``recorded_job.state_of(running=True)``);
    ``slow_share`` of its steps take twice as long; ``hosts`` processes run each attempt
    (``recorded_job.py --hosts``).
    """
    return recorded_job.write_job(str(out_dir), steps, restarts, seed=seed, env=_env(),
                                  slow_share=slow_share, hosts=hosts, shape=shape,
                                  running=True)["seconds"]


def _line_time(line: bytes) -> int:
    """Latest time (ns) in a journal line: the simulated moment it was flushed."""
    return max((int(x) for x in _NANO.findall(line)), default=0)


def split(run_dir: Path, meta_path: Path, new_path: Path) -> dict:
    """Cut the last ``HOLD_S`` simulated seconds off the running attempt's journals.

    A process's journal is its ``*.jsonl`` whose last line is the latest (one per process
    index, ``spans-pNNNNN-*``); the lines each flushed after ``t_last - HOLD_S`` (``t_last``:
    the latest line of all) go to ``new_path`` (the journals' in turn) and the journals are
    truncated before them. Returns (and writes to ``meta_path``) the files (each its name,
    offset, size and bytes held back), ``t_last``, ``t_kept`` (the latest kept line's
    time), and counts of lines and spans held back.

    Raises:
        SystemExit: a journal segment began less than ``HOLD_S`` s before the end.
    """
    latest: dict[str, tuple[int, Path]] = {}
    for p in sorted(run_dir.glob("*.jsonl")):
        with open(p, "rb") as f:
            f.seek(max(0, p.stat().st_size - (1 << 20)))
            tail = f.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
        t, proc = _line_time(tail), p.name.split("-")[1]
        if proc not in latest or t > latest[proc][0]:
            latest[proc] = (t, p)
    t_last = max(t for t, _ in latest.values())
    cut = t_last - HOLD_S * SEC
    files, held, t_kept, n_lines = [], [], 0, 0
    for _t, path in sorted(latest.values(), key=lambda tp: tp[1].name):
        data = path.read_bytes()
        lines = data.splitlines(keepends=True)
        i = len(lines)
        while i > 0 and _line_time(lines[i - 1]) > cut:
            i -= 1
        if i == 0:
            raise SystemExit(f"{path.name}: its segment began less than {HOLD_S} s before "
                             "the job's end; try another --steps")
        new = b"".join(lines[i:])
        files.append({"file": path.name, "offset": len(data) - len(new), "size": len(data),
                      "bytes": len(new)})
        held.append(new)
        t_kept, n_lines = max(t_kept, _line_time(lines[i - 1])), n_lines + len(lines) - i
    new = b"".join(held)
    meta = {"files": files, "t_last": t_last, "t_kept": t_kept, "lines": n_lines,
            "spans": new.count(b'"name":"goodput.'), "bytes": len(new)}
    new_path.write_bytes(new)
    meta_path.write_text(json.dumps(meta))
    truncate(run_dir, meta)
    return meta


def _files(meta: dict) -> list[dict]:
    """The journals :func:`split` cut (a kept job's meta from before several hosts: one)."""
    return meta.get("files") or [meta]


def truncate(run_dir: Path, meta: dict) -> None:
    """Put the journals in their state before the new data (cut at the offsets)."""
    for f in _files(meta):
        path = run_dir / f["file"]
        size = path.stat().st_size
        if size not in (f["offset"], f["size"]):
            raise SystemExit(f"{path}: {size} bytes, expected {f['offset']} or {f['size']}"
                             " (the kept job was changed; delete it)")
        os.truncate(path, f["offset"])


def append_new(run_dir: Path, meta: dict, new_path: Path) -> None:
    """Append the held-back lines to the journals, as the recorders' flushes would."""
    new, at = new_path.read_bytes(), 0
    for f in _files(meta):
        with open(run_dir / f["file"], "ab") as out:
            out.write(new[at : at + f["bytes"]])
        at += f["bytes"]


def spool_bytes(run_dir: Path) -> int:
    """Bytes of every file of the spool."""
    return sum(p.stat().st_size for p in run_dir.iterdir() if p.is_file())


def prepare(base: Path, steps: int, slow_share: float = 0.0, hosts: int = 1,
            restarts: int = 3, shape: str = "own") -> dict:
    """The job of ``steps`` steps (``slow_share`` of them twice as long) on ``hosts``
    processes with ``restarts`` restarts in ``shape`` (``recorded_job.SHAPES``) under
    ``base`` (recorded unless already there), cut; returns its paths and facts (``rec_s``:
    recording seconds, None if reused)."""
    name = (f"job-{steps}" + (f"-slow{slow_share:g}" if slow_share else "")
            + (f"-hosts{hosts}" if hosts > 1 else "")
            + recorded_job.job_name(steps, restarts, shape)[len(str(steps)):])
    run_dir, meta_path = base / name, base / f"{name}.json"
    new_path = base / f"{name}.new"
    rec_s = None
    if meta_path.exists() and new_path.exists():
        meta = json.loads(meta_path.read_text())
        truncate(run_dir, meta)
    else:
        if run_dir.exists():
            shutil.rmtree(run_dir)
        rec_s = record(run_dir, steps, restarts, slow_share=slow_share, hosts=hosts,
                       shape=shape)
        meta = split(run_dir, meta_path, new_path)
    return {"steps": steps, "run_dir": run_dir, "meta": meta, "meta_path": meta_path,
            "new_path": new_path, "rec_s": rec_s, "npz": base / f"{name}.mgm.npz",
            "spool": spool_bytes(run_dir) + meta["bytes"]}


# --- "now" ---------------------------------------------------------------------------------


class ShiftedClock:
    """Stands in for the ``time`` module in ``goodput_processor.model.attempts``: ``time_ns`` is
    the simulated moment given to :meth:`anchor` (it stands still until the next anchor);
    counts its reads."""

    def __init__(self):
        self.now = 0
        self.reads = 0

    def anchor(self, sim_ns: int) -> None:
        """From now on, ``time_ns()`` is ``sim_ns``."""
        self.now = sim_ns

    def time_ns(self) -> int:
        """The simulated now, in ns since the epoch."""
        self.reads += 1
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


def install_clock() -> ShiftedClock:
    """Install a :class:`ShiftedClock` as the processor's "now"; returns it."""
    from goodput_processor.model import attempts

    clock = ShiftedClock()
    attempts.time = clock
    return clock


def mgm_datetime(clock: ShiftedClock):
    """A ``datetime`` module for mgm 0.2.3's ``goodput`` module whose ``now`` reads
    ``clock`` (as ``tests/compat/test_mgm_scenarios.py`` freezes it)."""
    import types

    class Shifted(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            t = _dt.datetime.fromtimestamp(clock.time_ns() / SEC, _dt.timezone.utc)
            return t.astimezone(tz) if tz is not None else t.replace(tzinfo=None)

    return types.SimpleNamespace(datetime=Shifted, timezone=_dt.timezone,
                                 timedelta=_dt.timedelta, date=_dt.date)


def last_reason(store, now_ns: int) -> str:
    """``end_reason`` of the job's last attempt in ``store`` (a ``LiveStore``) at ``now_ns``."""
    from goodput_processor.model.attempts import build_attempts

    return build_attempts(store.snapshot(JOB), now_ns)[-1].end_reason


# --- the incumbent's log ----------------------------------------------------------------------


def incumbent_entries(run_dir: Path, meta: dict, npz: Path) -> None:
    """Write to ``npz`` the mgm event stream of the whole job (``mgm_events.events``, last
    attempt running), sorted by time: what mgm's recorder and Orbax's statistics log."""
    import numpy as np

    from goodput_processor.definitions.mgm_events import events
    from goodput_processor.read.reader import read_run_dir

    js = read_run_dir(run_dir, workers=1, cache=False).jobs[JOB]
    ev, _, _ = events(js, meta["t_last"] + SEC // 2)
    order = np.argsort(ev.t, kind="stable")
    np.savez(npz, t=ev.t[order], kind=ev.kind[order], val=ev.val[order], dur=ev.dur[order],
             types=np.array(json.dumps(list(ev.types))))


class MemoryLog:
    """mgm 0.2.3's ``_CloudLogger`` read side over the event arrays of
    :func:`incumbent_entries`: entries whose payload time is in ``(start, end]`` among the
    first :attr:`visible`, in time order, built as its recorder (and Orbax) write them."""

    def __init__(self, npz: Path, cut_ns: int):
        import numpy as np

        from goodput_processor.definitions import mgm_events as me

        z = np.load(npz)
        self.us = (z["t"] + 500) // 1000  # payload times are float seconds: µs exact
        self.kind, self.val, self.dur = z["kind"], z["val"], z["dur"]
        self.types = json.loads(str(z["types"]))
        self.visible = int(np.searchsorted(self.us, (cut_ns + 500) // 1000, "right"))
        self.total = len(self.us)
        self._np = np
        pairs = {me.E_JOB_START: "job_start_time", me.E_JOB_END: "job_end_time",
                 me.E_TPU_START: "tpu_init_start_time", me.E_TPU_END: "tpu_init_end_time",
                 me.E_PREP_START: "training_prep_start_time",
                 me.E_PREP_END: "training_prep_end_time",
                 me.E_DL_START: "data_loading_start_time",
                 me.E_DL_END: "data_loading_end_time"}
        self._simple = pairs
        self._me = me

    def _payload(self, i: int) -> dict | None:
        me, k, ts = self._me, int(self.kind[i]), int(self.us[i]) / 1e6
        if k in self._simple:
            return {"job_name": JOB, self._simple[k]: ts}
        if k == me.E_STEP:
            return {"job_name": JOB, "step_count": int(self.val[i]), "step_start_time": ts}
        if k in (me.E_CUSTOM_START, me.E_CUSTOM_END):
            key = "start" if k == me.E_CUSTOM_START else "end"
            return {"job_name": JOB, "custom_badput_event_type": self.types[int(self.val[i])],
                    f"custom_badput_event_{key}_time": ts}
        d = round(int(self.dur[i]) / 1000) / 1e6
        if k == me.E_SAVE:  # Orbax's SaveStepStatistics
            return {"step": int(self.val[i]), "event_type": "save", "directory": "/ckpt",
                    "reached_preemption": False, "preemption_received_at": None,
                    "synchronous": True, "wait_for_prev_start_time": ts,
                    "wait_for_prev_duration_secs": 0.0, "checkpointer_blocking_start_time": ts,
                    "checkpointer_blocking_duration_secs": d, "get_old_steps_start_time": ts,
                    "get_old_steps_duration_secs": 0.0,
                    "checkpoint_manager_blocking_start_time": ts,
                    "checkpoint_manager_blocking_duration_secs": d}
        if k == me.E_RESTORE:  # Orbax's RestoreStepStatistics
            return {"step": int(self.val[i]), "event_type": "restore", "directory": "/ckpt",
                    "checkpointer_start_time": ts, "checkpointer_duration_secs": d,
                    "checkpoint_manager_start_time": ts, "checkpoint_manager_duration_secs": d}
        return None  # elastic events: none in this job

    @staticmethod
    def _us(t: _dt.datetime) -> int:
        return (t - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)) // _dt.timedelta(
            microseconds=1)

    def read_cloud_logging_entries(self, start_time=None, end_time=None,
                                   last_entry_info=None):
        """Entries in ``(start_time, end_time]`` and ``(last timestamp, id)`` of the last
        one (``(None, None)`` if none), as mgm's ``_CloudLogger`` returns them."""
        np = self._np
        lo = 0 if start_time is None else int(np.searchsorted(self.us, self._us(start_time),
                                                               "right"))
        hi = self.visible if end_time is None else min(
            self.visible, int(np.searchsorted(self.us, self._us(end_time), "right")))
        out = [p for p in (self._payload(i) for i in range(lo, hi)) if p is not None]
        if hi <= lo:
            return out, (None, None)
        last = _dt.datetime.fromtimestamp(int(self.us[hi - 1]) / 1e6, _dt.timezone.utc)
        return out, (last, f"{hi - 1:08d}")


# --- the surfaces (one child process each) -----------------------------------------------------


class _DiscardingClient:
    """A Cloud Monitoring ``MetricServiceClient`` that drops what it is sent."""

    def create_time_series(self, **_kwargs) -> None:
        """Accept and discard one ``CreateTimeSeries`` request."""


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=600) as r:
        return r.read()


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def child(surface: str, defs: str, run_dir: Path, meta: dict, new_path: Path, work: Path,
          npz: Path | None, pack: bool = False, profile: str | None = None) -> dict:
    """Measure one surface with one definitions in this process (see the module docstring);
    returns ``warm``, ``new``, ``none`` (ms), ``ingest`` (ms, serve only), ``running``
    (the last attempt's end reason at the "nothing new" anchor), ``reads`` (clock reads
    by the timed polls) and ``goodput`` (percent, as the last poll answered). With
    ``profile`` (``serve-report`` only), one more ``GET /v1/report`` with nothing new, after
    the timed ones, runs its handler under ``cProfile`` (in the server's thread), whose
    stats go to the file ``profile``."""
    truncate(run_dir, meta)
    clock = install_clock()
    half = SEC // 2
    kept, last = meta["t_kept"] + half, meta["t_last"] + half
    ingest = close = None

    def settle():
        pass

    if surface in ("serve-report", "serve-metrics"):
        import prometheus_client

        from goodput_processor.serve.command import _metrics, add_serve_command
        from goodput_processor.serve.server import GoodputServer
        from goodput_processor.serve.store import LiveStore

        ap = argparse.ArgumentParser()
        add_serve_command(ap.add_subparsers())
        args = ap.parse_args(["serve", "--grpc-port", "off", "--http-port", "0",
                              "--spool-dir", str(run_dir), "--wal-dir", "off"])
        from goodput_processor.serve.spill import Spill

        store = LiveStore(min_interval_s=0, spill=Spill() if pack else None)
        provider, registry, _prom = _metrics(args, store)
        windows = tuple(float(w) for w in args.windows.split(","))

        def metrics_text():
            return (prometheus_client.generate_latest(registry),
                    prometheus_client.CONTENT_TYPE_LATEST)

        clock.anchor(kept)
        server = GoodputServer(store, grpc_port=None, http_port=0, spool_dirs=[str(run_dir)],
                               poll_s=3600, metrics=metrics_text)
        url = server.addresses()["http"] + ("/v1/report" if surface == "serve-report"
                                            else "/metrics")
        scraped = [0.0]

        def settle():  # GoodputMetrics reuses a snapshot younger than 0.5 s
            if surface == "serve-metrics":
                time.sleep(max(0.0, scraped[0] + 0.6 - time.monotonic()))

        def poll():
            body = _get(url)
            scraped[0] = time.monotonic()
            return body

        def close():
            server.stop(5.0, final=False)
            provider.shutdown(timeout_millis=1000)
    elif surface == "compat":
        from goodput.mgm.goodput import GoodputCalculator

        calc = GoodputCalculator(JOB, run_dir=run_dir, definitions=defs)

        def poll():
            return calc.get_job_goodput(include_badput_breakdown=True)
    elif surface == "monitor":
        from goodput_processor.exporters.workload import WorkloadOptions
        from goodput_processor.serve.monitor import GoodputMonitor

        kw = ({"workload": WorkloadOptions("bench", "local", acc_type="TPU-v5p"),
               "workload_definitions": "mgm", "workload_client": _DiscardingClient()}
              if defs == "mgm" else {})
        mon = GoodputMonitor(run_dir, interval_s=3600, **kw)

        def poll():
            if not mon.run_once():
                raise RuntimeError(f"monitor cycle failed ({mon.errors} errors)")
    elif surface == "incumbent":
        from ml_goodput_measurement.src import goodput as mgm

        mgm.datetime = mgm_datetime(clock)
        log = MemoryLog(npz, meta["t_last"] - HOLD_S * SEC)
        cache = Path(tempfile.mkdtemp(prefix="mgm-cache-", dir=work))
        calc = mgm.GoodputCalculator(JOB, "bench", cloud_logger=log, cache_dir=str(cache))

        def poll():
            return calc.get_job_goodput(include_badput_breakdown=True)
    else:
        raise SystemExit(f"unknown surface {surface!r}")

    if surface not in ("serve-report", "serve-metrics"):
        clock.anchor(kept)
    warm, _ = _timed(poll)
    if pack and surface.startswith("serve"):  # a maintenance round once all is quiet
        server.store.compact(min_quiet_s=0)
    if surface == "incumbent":
        log.visible = log.total
    else:
        append_new(run_dir, meta, new_path)
    if surface.startswith("serve"):
        ingest, n = _timed(server.tailer.poll)
        if n != meta["lines"]:
            raise RuntimeError(f"serve took in {n} new lines, expected {meta['lines']}")
    reads = clock.reads
    settle()
    clock.anchor(last)
    new, _ = _timed(poll)
    settle()
    clock.anchor(last + half)
    none, body = _timed(poll)
    reads = clock.reads - reads
    at = clock.now
    if profile and surface == "serve-report":
        clock.anchor(last + 2 * half)  # nothing new still, a later now
        _profiled_poll(server, poll, profile)
    sdk = acct = None
    if surface == "serve-metrics":  # the scrape with nothing new, split (see the docstring)
        sdk, _ = _timed(lambda: prometheus_client.generate_latest(registry))
        clock.anchor(last + 2 * half)
        acct, _ = _timed(lambda: server.store.snapshot_windows(JOB, windows))
    if surface == "serve-report":
        doc = json.loads(body)["jobs"][0]
        running, value = doc["attempts"][-1]["end_reason"], doc["goodput"] * 100
    elif surface == "serve-metrics":
        running = last_reason(server.store, at)
        m = re.search(rb"^goodput_goodput(?:_ratio)?\{[^}]*\} ([0-9.e+-]+)$", body, re.M)
        value = float(m.group(1)) * 100 if m else None
    elif surface == "compat":
        running, value = last_reason(calc._store, at), body[0]
    elif surface == "monitor":
        running, value = last_reason(mon._store, at), mon.snapshots[0].result.goodput * 100
    else:
        running = "running" if calc._goodput_cache.get_job_end_time() is None else "ended"
        value = body[0]
    if close is not None:
        close()
    if surface == "incumbent":
        shutil.rmtree(cache, ignore_errors=True)
    return {"warm": warm, "new": new, "none": none, "ingest": ingest, "running": running,
            "reads": reads, "goodput": value, "sdk": sdk, "acct": acct}


def _profiled_poll(server, poll, path: str) -> None:
    """One more poll whose HTTP handler runs under ``cProfile`` (the handler's thread);
    stats dumped to ``path``."""
    import cProfile

    from goodput_processor.serve import http as serve_http

    cls = serve_http._Handler  # (its _report may be a base class's: put back as it was)
    orig, own = cls._report, "_report" in vars(cls)
    prof = cProfile.Profile()

    def profiled(self, *a, **kw):
        prof.enable()
        try:
            return orig(self, *a, **kw)
        finally:
            prof.disable()

    cls._report = profiled
    try:
        poll()
    finally:
        if own:
            cls._report = orig
        else:
            del cls._report
    prof.dump_stats(path)


def run_child(surface: str, defs: str, job: dict, work: Path, pack: bool = False,
              profile: str | None = None) -> dict:
    """Run :func:`child` in a fresh process; adds ``rss`` (its peak RSS, MB)."""
    cmd = [sys.executable, __file__, "--child", surface, "--defs", defs,
           "--run-dir", str(job["run_dir"]), "--meta", str(job["meta_path"]),
           "--new", str(job["new_path"]), "--work", str(work), "--npz", str(job["npz"])
           ] + (["--pack"] if pack else []) + (["--profile", profile] if profile else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    out: dict[str, bytes] = {}
    readers = [threading.Thread(target=lambda k=k, f=f: out.__setitem__(k, f.read()))
               for k, f in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(proc.pid, 0)
    for r in readers:
        r.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{surface}/{defs} failed:\n{out['err'].decode()[-4000:]}")
    res = json.loads(out["out"].decode().strip().splitlines()[-1])
    res["rss"] = usage.ru_maxrss / 1024
    return res


# --- main -----------------------------------------------------------------------------------------


def _ms(v) -> str:
    return "-" if v is None else (f"{v:,.1f}" if v < 100 else f"{v:,.0f}")


def main(argv=None) -> int:
    """Parse the options, record (or reuse) the jobs, run the children, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds (medians shown)")
    ap.add_argument("--keep", metavar="DIR", help="record into DIR, keep and reuse the job")
    ap.add_argument("--surfaces", nargs="+", choices=list(PLAN), default=list(PLAN))
    ap.add_argument("--incumbent-steps", type=int, default=None,
                    help="steps of the job the incumbent is measured on (default --steps)")
    ap.add_argument("--slow-share", type=float, default=0.0,
                    help="fraction of steps (0 to 1) that take twice as long, so that the "
                    "job has anomalous steps to attribute to hosts (default 0)")
    ap.add_argument("--hosts", type=int, default=1,
                    help="processes per attempt, in step (recorded_job.py --hosts; the "
                    "incumbent is measured on one: default 1)")
    recorded_job.add_job_options(ap)  # --restarts R [R ...] (0: one attempt), --shape
    ap.add_argument("--profile", metavar="FILE",
                    help="serve-report: cProfile the handler of one more GET /v1/report "
                    "with nothing new (after the timed ones) into FILE (with several "
                    "--restarts: FILE.RN for N restarts; the last round's)")
    ap.add_argument("--pack", action="store_true",
                    help="serve: pack every process's rows after the warm poll "
                    "(LiveStore.compact, as a maintenance round does to quiet processes), "
                    "with a spill as goodput serve's default --spill-dir auto")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--defs", help=argparse.SUPPRESS)
    for a in ("--run-dir", "--meta", "--new", "--work", "--npz"):
        ap.add_argument(a, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.hosts < 1 or (args.hosts > 1 and "incumbent" in args.surfaces):
        ap.error("--hosts must be at least 1, and 1 with the incumbent surface")
    if min(args.restarts) < 0:
        ap.error(f"--restarts must be at least 0, got {args.restarts}")
    if args.child == "incumbent-log":
        incumbent_entries(Path(args.run_dir), json.loads(Path(args.meta).read_text()),
                          Path(args.npz))
        return 0
    if args.child:
        res = child(args.child, args.defs, Path(args.run_dir),
                    json.loads(Path(args.meta).read_text()), Path(args.new), Path(args.work),
                    Path(args.npz), args.pack, args.profile)
        print(json.dumps(res), flush=True)
        return 0

    t_start = time.perf_counter()
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_live_",
                                                                   dir="/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench_live_work_", dir="/tmp"))
    inc_steps = args.incumbent_steps or args.steps
    jobs: dict[tuple[int, int], dict] = {}
    try:
        sizes = {args.steps} | ({inc_steps} if "incumbent" in args.surfaces else set())
        for steps, restarts in ((n, r) for n in sorted(sizes) for r in args.restarts):
            jobs[steps, restarts] = job = prepare(base, steps, args.slow_share, args.hosts,
                                                  restarts, args.shape)
            m = job["meta"]
            print(f"job {steps:,} steps, {restarts} restarts ({args.shape}): spool "
                  f"{job['spool'] / 1e6:.1f} MB, "
                  + (f"recorded in {job['rec_s']:.1f} s" if job["rec_s"] is not None
                     else "reused") + f"; new data: last {HOLD_S} s = {m['lines']} journal "
                  f"lines, {m['spans']} spans, {m['bytes'] / 1e3:.0f} kB of "
                  + ", ".join(f["file"] for f in _files(m)),
                  flush=True)
        for job in (jobs[inc_steps, r] for r in args.restarts
                    if "incumbent" in args.surfaces):
            if not job["npz"].exists():
                t0 = time.perf_counter()
                append_new(job["run_dir"], job["meta"], job["new_path"])
                subprocess.run([sys.executable, __file__, "--child", "incumbent-log",
                                "--run-dir", str(job["run_dir"]), "--meta",
                                str(job["meta_path"]), "--npz", str(job["npz"])],
                               check=True, env=_env())
                truncate(job["run_dir"], job["meta"])
                print(f"incumbent's log entries built in {time.perf_counter() - t0:.1f} s",
                      flush=True)
        plan = [(s, d) for s in args.surfaces for d, ok in PLAN[s].items() if ok]
        results: dict[tuple, list] = {(s, d, n): [] for s, d in plan for n in args.restarts}
        for r in range(args.repeat):
            for (s, d), n in ((k, n) for k in plan for n in args.restarts):  # side by side
                steps = inc_steps if s == "incumbent" else args.steps
                prof = (None if not args.profile or s != "serve-report" else args.profile
                        if len(args.restarts) == 1 else f"{args.profile}.R{n}")
                res = run_child(s, d, jobs[steps, n], work, args.pack, prof)
                results[(s, d, n)].append(res)
                print(f"  round {r + 1}: {s:<13} {d:<8} R={n:<5} warm {_ms(res['warm'])} ms, "
                      f"60 s new "
                      f"{_ms(res['new'])} ms, nothing new {_ms(res['none'])} ms, "
                      f"{res['running']}, goodput {res['goodput'] or 0:.3f} %, "
                      f"RSS {res['rss']:.0f} MB", flush=True)
        print_table(args, plan, results, inc_steps)
    finally:
        for job in jobs.values():
            if args.keep:
                truncate(job["run_dir"], job["meta"])
                append_new(job["run_dir"], job["meta"], job["new_path"])
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"total wall time {time.perf_counter() - t_start:.0f} s")
    return 0


def print_table(args, plan, results, inc_steps) -> None:
    """Print the medians, one row per surface, definitions and restarts (``n/a``: no such
    option); with several ``--restarts``, ``x R0`` is each row's "60 s new" and "nothing
    new" over the same surface's with the first ``--restarts`` (issue 40: within 1.5x)."""
    med = {k: {f: (statistics.median(x[f] for x in v) if v[0][f] is not None else None)
               for f in ("warm", "new", "none", "ingest")} for k, v in results.items()}
    r0 = args.restarts[0]
    inc = med.get(("incumbent", "mgm", r0))
    inc_txt = "-" if inc is None else f"{_ms(inc['new'])} / {_ms(inc['none'])}" + (
        f" @{inc_steps:,}" if inc_steps != args.steps else "")
    print(f"\nlive poll cost: median of {args.repeat}; ms; target {TARGET_NEW_MS:g} ms "
          f"(60 s new) / {TARGET_NONE_MS:g} ms (nothing new); shape {args.shape}")
    head = (f"{'surface':<13} {'defs':<8} {'steps':>9} {'restarts':>8} {'60s new':>8} "
            f"{'nothing':>8} {'warm':>7} {'ingest':>7} {'peak MB':>8} {'run':>4} "
            f"{'meets':>5} {'x R0 new/none':>14}  incumbent 60s/none")
    print(head)
    print("-" * len(head))
    for s in args.surfaces:
        for d, ok in PLAN[s].items():
            steps = inc_steps if s == "incumbent" else args.steps
            if not ok:
                print(f"{s:<13} {d:<8} {steps:>9,} n/a: serve has no definitions option "
                      "for this endpoint")
                continue
            for n in args.restarts:
                m, rows, m0 = med[(s, d, n)], results[(s, d, n)], med[(s, d, r0)]
                run = ("yes" if all(x["running"] == "running" and x["reads"] for x in rows)
                       else "NO")
                meets = ("yes" if m["new"] < TARGET_NEW_MS and m["none"] < TARGET_NONE_MS
                         else "no")
                ratio = (f"{m['new'] / m0['new']:.2f} / {m['none'] / m0['none']:.2f}"
                         if n != r0 else "-")
                print(f"{s:<13} {d:<8} {steps:>9,} {n:>8,} {_ms(m['new']):>8} "
                      f"{_ms(m['none']):>8} {_ms(m['warm']):>7} {_ms(m['ingest']):>7} "
                      f"{max(x['rss'] for x in rows):>8.0f} {run:>4} {meets:>5} {ratio:>14}  "
                      + ("" if s == "incumbent" else inc_txt))
    print("warm: first poll (whole job); ingest: serve's tailer taking in the new lines "
          "(not in the poll); run: last attempt 'running' at the poll and 'now' read; "
          f"peak MB: the child process's max RSS; x R0: over the same with {r0} restarts")
    for n in args.restarts:
        rows = results.get(("serve-metrics", "goodput", n))
        if rows:
            sdk, acct = (statistics.median(x[f] for x in rows) for f in ("sdk", "acct"))
            none = med[("serve-metrics", "goodput", n)]["none"]
            print(f"serve-metrics, {n} restarts, nothing new, split (medians): {_ms(acct)} ms "
                  f"the accounting with the rolling windows, {_ms(sdk)} ms the OpenTelemetry "
                  f"SDK's collection and the Prometheus text, {_ms(none - acct - sdk)} ms the "
                  "rest (loopback HTTP, the handler)")


if __name__ == "__main__":
    raise SystemExit(main())
