"""Profile capture (goodput.diagnostics.profile / .ondemand) with the real JAX and PyTorch
profilers: files on disk, ``custom:profile`` spans, session ids across processes, on-demand
capture over HTTP and SIGUSR2 in real training subprocesses."""

from __future__ import annotations

import glob
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from instr_util import ROOT, child_env, run_python
from instr_util import spans as _spans
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import goodput
from goodput import schema
from goodput.diagnostics import profile as P

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def rec(tmp_path):
    """A configured recorder (spool in tmp_path/run plus an in-memory exporter); the profile
    module's session counters start again at 1."""
    exporter = InMemorySpanExporter()
    goodput.configure("prof", run_dir=tmp_path / "run", exporters=[exporter],
                      flush_interval_s=0.05, handle_signals=False, start_time=time.time())
    saved = dict(P._COUNTERS)
    P._COUNTERS.update({k: 0 for k in P._COUNTERS})
    yield exporter, tmp_path / "run"
    goodput.shutdown()
    P._COUNTERS.update(saved)
    assert P.active_session() is None


def spans(run_dir) -> list[dict]:
    """The spans of a run directory's span spool (the metrics spool files are left out)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for f in Path(run_dir).glob("*.jsonl"):
            if not f.name.startswith(schema.METRICS_SPOOL_PREFIX):
                shutil.copy(f, tmp)
        return _spans(tmp)


def profile_spans(exporter) -> list:
    goodput.flush()
    return [s for s in exporter.get_finished_spans() if s.name == schema.CUSTOM_BADPUT
            and s.attributes.get(schema.ATTR_BADPUT_TYPE) == schema.PROFILE_BADPUT_TYPE
            and not s.attributes.get(schema.ATTR_OPEN)]  # not the records of it in flight


def report(run_dir):
    from goodput_processor.account.run_dir import report_run_dir

    goodput.job_end()
    (job,) = report_run_dir(run_dir)
    return job


def jax_steps(first: int, count: int) -> None:
    f = jax.jit(lambda x: jax.numpy.tanh(x @ x).sum())
    x = jax.numpy.ones((128, 128))
    for n in range(first, first + count):
        goodput.step_start(n)
        with jax.profiler.StepTraceAnnotation("train", step_num=n):
            f(x).block_until_ready()
        time.sleep(0.005)


def torch_steps(first: int, count: int, device: str = "cpu") -> None:
    model = torch.nn.Linear(64, 64).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for n in range(first, first + count):
        with goodput.step(n):
            opt.zero_grad()
            model(torch.randn(32, 64, device=device)).pow(2).mean().backward()
            opt.step()
            time.sleep(0.005)


# --- programmatic capture, in process ----------------------------------------------------


def test_jax_context_manager_writes_xplane_and_a_profile_span(rec):
    exporter, run_dir = rec
    jax_steps(1, 3)
    with P.profile(framework="jax") as prof:
        jax_steps(4, 3)
    jax_steps(7, 2)
    assert prof.session_id == "prof-a0-0001"
    assert prof.session_dir == str(run_dir.resolve() / "profiles" / "prof-a0-0001")
    # the XProf run folder is the session id (ProfileOptions.session_id), not a timestamp
    xplane = glob.glob(f"{prof.session_dir}/plugins/profile/prof-a0-0001/*.xplane.pb")
    assert len(xplane) == 1 and os.path.getsize(xplane[0]) > 0
    assert glob.glob(f"{prof.session_dir}/plugins/profile/prof-a0-0001/*.trace.json.gz")
    (span,) = profile_spans(exporter)
    assert span.attributes[schema.ATTR_PROFILE_SESSION] == "prof-a0-0001"
    assert span.attributes[schema.ATTR_PROFILE_DIR] == prof.session_dir
    assert span.attributes[schema.ATTR_PROFILE_TRIGGER] == "programmatic"
    job = report(run_dir)
    assert job.badput_s["custom:profile"] > 0
    assert job.max_productive_step == 8


def test_torch_decorator_each_call_is_a_capture(rec):
    exporter, run_dir = rec

    @P.profile(framework="torch")
    def train_a_few(first):
        torch_steps(first, 3)
        return first + 3

    torch_steps(1, 2)
    assert train_a_few(3) == 6
    assert train_a_few(6) == 9
    spans_ = profile_spans(exporter)
    assert [s.attributes[schema.ATTR_PROFILE_SESSION] for s in spans_] == [
        "prof-a0-0001", "prof-a0-0002"]
    for s in spans_:
        (trace,) = glob.glob(os.path.join(s.attributes[schema.ATTR_PROFILE_DIR],
                                          "*.pt.trace.json"))
        events = json.loads(Path(trace).read_text())["traceEvents"]
        names = {e.get("name") for e in events}
        assert {"aten::addmm", "Optimizer.step#SGD.step"} <= names
    assert report(run_dir).badput_s["custom:profile"] > 0


def test_start_stop_explicit_session_and_refusals(rec, tmp_path, caplog):
    exporter, _ = rec
    caplog.set_level(logging.WARNING, "goodput.diagnostics.profile")
    prof = P.profile(tmp_path / "profiles", framework="torch")
    prof.stop()  # stop without a start: a warning, nothing else
    assert "stop() without a running capture" in caplog.text
    prof.start(session_id="shared session/1")
    assert prof.active and prof.session_id == "shared_session_1"
    prof.start()  # the same object again: refused
    with P.profile(framework="torch") as inner:  # another capture meanwhile: refused
        torch_steps(1, 2)
    assert inner.session_id is None and not inner.active
    prof.stop()
    assert not prof.active
    assert glob.glob(str(tmp_path / "profiles" / "shared_session_1" / "*.pt.trace.json"))
    (span,) = profile_spans(exporter)
    assert span.attributes[schema.ATTR_PROFILE_SESSION] == "shared_session_1"
    stats = P.stats()
    assert stats["refused"] >= 2 and stats["active"] is None
    assert "nested or overlapping captures are refused" in caplog.text


def test_process_indices_excluding_this_process_capture_nothing(rec, tmp_path):
    exporter, _ = rec
    before = P.stats()["skipped"]
    with P.profile(tmp_path / "p", process_indices=[1, 2], framework="jax") as prof:
        jax_steps(1, 2)
    prof.stop()  # excluded process: no warning, nothing to stop
    assert prof.session_id is None
    assert not (tmp_path / "p").exists()
    assert profile_spans(exporter) == []
    assert P.stats()["skipped"] == before + 1
    # the skipped capture used session number 1 here too: the next one is number 2
    with P.profile(tmp_path / "p", process_indices=[0], framework="jax") as prof:
        jax_steps(3, 1)
    assert prof.session_id == "prof-a0-0002"


def test_profiler_errors_are_logged_and_counted_not_raised(rec, tmp_path):
    exporter, _ = rec
    errors = P.stats()["errors"]
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with P.profile(blocker, framework="jax") as prof:  # cannot create the session dir
        jax_steps(1, 1)
    assert prof.session_id is None and P.stats()["errors"] == errors + 1
    with P.profile(framework="tensorflow") as prof:  # unknown framework
        pass
    assert P.stats()["errors"] == errors + 2
    # the export fails at stop (the session dir was replaced by a file): counted, the span is
    # still recorded (the time was spent), and JAX's stuck state is reset for the next one
    prof = P.profile(tmp_path / "q", framework="jax")
    prof.start("broken")
    jax_steps(2, 1)
    os.rmdir(tmp_path / "q" / "broken")
    (tmp_path / "q" / "broken").write_text("x")
    prof.stop()
    assert P.stats()["errors"] == errors + 3
    with P.profile(tmp_path / "q", framework="jax") as prof:
        jax_steps(3, 1)
    assert glob.glob(f"{prof.session_dir}/plugins/profile/*/*.xplane.pb")
    assert [s.attributes[schema.ATTR_PROFILE_SESSION] for s in profile_spans(exporter)] == [
        "broken", prof.session_id]
    # exceptions of the profiled code pass through; the capture still ends
    with pytest.raises(ZeroDivisionError), P.profile(tmp_path / "q", framework="jax"):
        raise ZeroDivisionError
    assert P.active_session() is None


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_torch_capture_records_cuda_kernels(rec):
    exporter, _ = rec
    with P.profile(framework="torch") as prof:
        torch_steps(1, 3, device="cuda")
        torch.cuda.synchronize()
    (trace,) = glob.glob(os.path.join(prof.session_dir, "*.pt.trace.json"))
    events = json.loads(Path(trace).read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)


def test_auto_framework_never_imports_one():
    code = textwrap.dedent("""
        import sys
        from goodput.diagnostics import ondemand, profile as P
        assert "jax" not in sys.modules and "torch" not in sys.modules
        assert P.detect_framework() is None
        import torch
        assert P.detect_framework() == "torch"
        import jax
        assert P.detect_framework() == "jax" and P.detect_framework("torch") == "torch"
        print("ok")
    """)
    assert run_python(["-c", code]).stdout.strip() == "ok"


# --- real training subprocesses -----------------------------------------------------------

CHILD = textwrap.dedent("""
    import json, os, sys, time
    import goodput
    goodput.configure(os.environ["JOB"], run_dir=os.environ["RUN_DIR"], flush_interval_s=0.1)
    if os.environ["FW"] == "jax":
        import jax, jax.numpy as jnp
        f = jax.jit(lambda x: jnp.tanh(x @ x).sum())
        x = jnp.ones((128, 128))
        def work():
            f(x).block_until_ready()
    else:
        import torch
        model = torch.nn.Linear(64, 64)
        def work():
            model(torch.randn(32, 64)).sum().backward()
    from goodput.diagnostics import ondemand, profile as P
    n = 0
    def steps(k):
        global n
        for _ in range(k):
            n += 1
            with goodput.step(n):
                work()
                time.sleep(0.005)
    mode = sys.argv[1]
    if mode == "sessions":
        ids = []
        for indices in (None, None, [0], None):
            with P.profile(process_indices=indices) as prof:
                steps(2)
            ids.append(prof.session_id)
        print(json.dumps({"ids": ids, "stats": P.stats()}))
    else:
        h = ondemand.enable(port=int(os.environ.get("PORT", "0")))
        with open(os.environ["READY"] + ".tmp", "w") as fh:
            json.dump({"port": h.port, "pid": os.getpid(), "signal": h.signum}, fh)
        os.replace(os.environ["READY"] + ".tmp", os.environ["READY"])
        deadline = time.time() + 90
        while not os.path.exists(os.environ["STOP"]) and time.time() < deadline:
            steps(1)
        print(json.dumps(h.status()))
""")


def _child_env(tmp_path, fw, job, run_dir, **extra):
    return child_env(FW=fw, JOB=job, RUN_DIR=str(run_dir), READY=str(tmp_path / "ready.json"),
                     STOP=str(tmp_path / "stop"), **extra)


def test_session_ids_equal_across_processes_and_process_indices(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    procs = [subprocess.Popen(
        [sys.executable, str(script), "sessions"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=_child_env(tmp_path, "jax", "multi", tmp_path / f"run{i}",
                                  GOODPUT_PROCESS_INDEX=str(i), GOODPUT_PROCESS_COUNT="2"))
        for i in (0, 1)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-4000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    ids0, ids1 = outs[0]["ids"], outs[1]["ids"]
    assert ids0 == ["multi-a0-0001", "multi-a0-0002", "multi-a0-0003", "multi-a0-0004"]
    # process 1 is not in process_indices=[0] for the third capture: nothing there, and the
    # fourth capture still has the same id on both processes
    assert ids1 == [ids0[0], ids0[1], None, ids0[3]]
    assert outs[1]["stats"]["skipped"] == 1 and outs[0]["stats"]["captures"] == 4
    for i, ids in ((0, ids0), (1, ids1)):
        prof_dir = tmp_path / f"run{i}" / "profiles"
        assert sorted(os.listdir(prof_dir)) == sorted(s for s in ids if s)
        got = [s["attrs"][schema.ATTR_PROFILE_SESSION] for s in spans(tmp_path / f"run{i}")
               if s["name"] == schema.CUSTOM_BADPUT]
        assert got == [s for s in ids if s]


def _wait_for(path: Path, timeout: float = 60):
    end = time.time() + timeout
    while not path.exists():
        if time.time() > end:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


def _http(method: str, url: str) -> tuple[int, dict]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _finish(proc, tmp_path) -> dict:
    (tmp_path / "stop").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def test_on_demand_http_capture_in_a_torch_training_process(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), "serve"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=_child_env(tmp_path, "torch", "od", run_dir))
    try:
        _wait_for(tmp_path / "ready.json")
        ready = json.loads((tmp_path / "ready.json").read_text())
        url = f"http://127.0.0.1:{ready['port']}/profile"
        for bad in ("abc", "0", "-1", "601", "nan", "inf"):
            code, body = _http("POST", f"{url}?duration_s={bad}")
            assert code == 400 and "duration_s" in body["error"], (bad, body)
        assert _http("GET", url.replace("/profile", "/nope"))[0] == 404
        code, body = _http("POST", f"{url}?duration_s=1.5")
        assert code == 202, body
        sid = body["session_id"]
        assert sid == "od-a0-ondemand-0001" and body["pid"] == ready["pid"]
        code, busy = _http("POST", f"{url}?duration_s=1")
        assert code == 409 and busy["session_id"] == sid
        end = time.time() + 60
        while True:
            code, status = _http("GET", url)
            assert code == 200
            if status["last"] and status["last"]["session_id"] == sid:
                break
            assert time.time() < end, status
            time.sleep(0.1)
        last = status["last"]
        assert status["state"] == "idle" and last["error"] is None
        assert last["framework"] == "torch" and last["ended_at"] - last["started_at"] >= 1.5
        (trace,) = glob.glob(os.path.join(last["dir"], "*.pt.trace.json"))
        # captured on the training (main) thread: its ops are in the trace
        events = json.loads(Path(trace).read_text())["traceEvents"]
        assert any(e.get("name") == "aten::addmm" for e in events)
        # a second capture with a session id given by the caller
        code, body = _http("POST", f"{url}?duration_s=0.3&session_id=all-hosts-1")
        assert code == 202 and body["session_id"] == "all-hosts-1"
        while _http("GET", url)[1]["last"]["session_id"] != "all-hosts-1":
            assert time.time() < end
            time.sleep(0.1)
    finally:
        final = _finish(proc, tmp_path)
    assert final["captures"] == 2 and final["errors"] == 0
    got = {s["attrs"][schema.ATTR_PROFILE_SESSION]: s for s in spans(run_dir)
           if s["name"] == schema.CUSTOM_BADPUT}
    assert set(got) == {sid, "all-hosts-1"}
    assert got[sid]["attrs"][schema.ATTR_PROFILE_TRIGGER] == "on_demand"
    assert got[sid]["end"] - got[sid]["start"] >= 1.5e9
    from goodput_processor.account.run_dir import report_run_dir

    (job,) = report_run_dir(run_dir)
    assert job.badput_s["custom:profile"] >= 1.5


def test_on_demand_sigusr2_capture_in_a_jax_training_process(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), "serve"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=_child_env(tmp_path, "jax", "sig", run_dir, PORT="-1",
                                           GOODPUT_PROFILE_DURATION_S="0.5"))
    try:
        _wait_for(tmp_path / "ready.json")
        ready = json.loads((tmp_path / "ready.json").read_text())
        assert ready["port"] is None and ready["signal"] == signal.SIGUSR2
        os.kill(ready["pid"], signal.SIGUSR2)
        sess = run_dir / "profiles" / "sig-a0-ondemand-0001"
        end = time.time() + 60
        while not glob.glob(f"{sess}/plugins/profile/sig-a0-ondemand-0001/*.xplane.pb"):
            assert time.time() < end and proc.poll() is None
            time.sleep(0.1)
    finally:
        final = _finish(proc, tmp_path)
    assert final["captures"] == 1 and final["last"]["session_id"] == "sig-a0-ondemand-0001"
    (span,) = [s for s in spans(run_dir) if s["name"] == schema.CUSTOM_BADPUT]
    assert span["attrs"][schema.ATTR_PROFILE_TRIGGER] == "on_demand"
    assert span["attrs"][schema.ATTR_PROFILE_DIR] == str(sess)
    assert 0.5e9 <= span["end"] - span["start"] < 30e9


# --- the examples ---------------------------------------------------------------------------


@pytest.mark.parametrize("script", ["jax_train.py", "torch_train.py"])
def test_example_runs_end_to_end(tmp_path, script):
    run_dir = tmp_path / "run"
    proc = run_python([ROOT / "examples" / "diagnostics" / script, "--run-dir", run_dir,
                       "--steps", "60", "--on-demand"],
                      env=child_env(GOODPUT_PROFILE_PORT="0"), timeout=180)
    out = proc.stdout
    assert "profile session" in out and "custom:profile" in out
    profiles = list((run_dir / "profiles").iterdir())
    assert len(profiles) == 1
    suffix = ".xplane.pb" if script.startswith("jax") else ".pt.trace.json"
    assert [p for p in profiles[0].rglob("*") if p.name.endswith(suffix)]
    # the metric points the example recorded, as written to the local OTLP JSON spool
    points: dict[str, list] = {}
    for path in run_dir.glob(f"{schema.METRICS_SPOOL_PREFIX}*.jsonl"):
        for line in path.read_text().splitlines():
            for rm in json.loads(line)["resourceMetrics"]:
                for sm in rm["scopeMetrics"]:
                    for m in sm["metrics"]:
                        kind = next(k for k in ("gauge", "sum") if k in m)
                        points.setdefault(m["name"], []).extend(m[kind]["dataPoints"])
    for name in ("ml.loss", "ml.learning_rate", "ml.step_time", "ml.throughput",
                 "ml.gradient_norm", "ml.step", "system.cpu.utilization"):
        assert points.get(name), (name, sorted(points))
    assert max(float(p["asInt"]) if "asInt" in p else p["asDouble"]
               for p in points["ml.step"]) >= 50
    assert all(0 <= p["asDouble"] < 20 for p in points["ml.loss"])
    names = {s["name"] for s in spans(run_dir)}
    assert {schema.STEP, schema.CUSTOM_BADPUT, schema.RUN_CONFIG} <= names


def test_nested_use_of_one_profile_object_stops_only_at_the_outer_end(rec):
    exporter, _ = rec
    prof = P.profile(framework="jax")

    @prof
    def inner():
        jax_steps(1, 1)
        return P.active_session()

    with prof:
        with prof:  # refused: the outer capture goes on
            assert prof.active
        assert prof.active
        assert inner() == prof.session_id  # a call inside the capture is not a new one
        assert prof.active
    assert not prof.active and P.active_session() is None
    assert len(profile_spans(exporter)) == 1
