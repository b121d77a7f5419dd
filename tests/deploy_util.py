"""Helpers for tests/deploy/test_deploy.py and tests/deploy/test_prometheus.py.

A real ``goodput serve`` process (:class:`Serve`), the real training child
(``tests/restart_child.py``), bounded waits, and the metric names in a scrape and in
PromQL expressions (rules and dashboard panels).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "goodput-rules.yml"
RULES_TEST = DEPLOY / "prometheus" / "goodput-rules.test.yml"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "goodput-dashboard.json"
CHILD = Path(__file__).with_name("restart_child.py")

#: Names Prometheus makes itself, not goodput serve.
SYNTHETIC = {"up", "ALERTS", "ALERTS_FOR_STATE"}
#: Metrics being added to goodput serve (issue 15) that a scrape may not show yet: the
#: job's errors and limits, and serve's own telemetry. Each is trusted only until serve
#: exports a metric of that family; from then on the scrape decides (:func:`known_names`).
PENDING = {
    "goodput_job_errors_total", "goodput_job_over_limit",
    "goodput_serve_requests_total", "goodput_serve_spans_total", "goodput_serve_refused_total",
    "goodput_serve_wal_size_bytes", "goodput_serve_replay_duration_seconds", "goodput_serve_jobs",
}


def child_env() -> dict[str, str]:
    """Environment for child processes: the checkout importable, no goodput/OTel settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOODPUT_", "OTEL_"))}
    paths = [str(REPO / "src"), str(REPO / "collectors"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_for(check, timeout_s: float, what: str, every_s: float = 0.25):
    """Call ``check()`` until it returns something truthy (returned) or ``timeout_s`` ends."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def training_child(job: str, run_dir: Path, *args: str) -> subprocess.Popen:
    """Start ``tests/restart_child.py`` (stdout piped, one line per checkpoint)."""
    return subprocess.Popen([sys.executable, str(CHILD), job, str(run_dir), *args],
                            stdout=subprocess.PIPE, text=True, env=child_env())


class Serve:
    """``goodput serve ARGS`` as a real process in ``workdir`` (where its default
    write-ahead log goes); ``addrs`` from its "listening" line."""

    def __init__(self, workdir: Path, *args: str):
        self.log = workdir / "serve.err"
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "goodput_processor.cli", "serve", *args],
                stdout=subprocess.DEVNULL, stderr=err, env=child_env(), cwd=workdir)
        line = wait_for(self._listening, 60, "goodput serve to listen")
        self.addrs = dict(re.findall(r"(\w+)=(\S+)", line))

    def _listening(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"goodput serve exited: {self.log.read_text()}")
        return next((s for s in self.log.read_text().splitlines() if "listening" in s), None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def get(url: str, token: str | None = None, timeout_s: float = 10) -> str:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.read().decode()


def sample_names(text: str) -> dict[str, list[dict]]:
    """Sample name -> label sets, from a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[dict]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s.labels)
    return out


def known_names(scraped: set[str]) -> set[str]:
    """The scraped names, plus each :data:`PENDING` name whose family serve does not export
    yet (once it does, a pending name must be in the scrape as it is)."""
    names = set(scraped)
    for name in PENDING:
        stem = name.removesuffix("_total")
        if not any(s == stem or s.startswith(stem + "_") for s in scraped):
            names.add(name)
    return names


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
             "and", "or", "unless", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric (and recording rule) names an expression selects.

    Strings, label matchers, ranges and ``by (...)``-style label lists are cut out first;
    what is left that is not a function, keyword, number or duration is a name.
    """
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", e):
        if e[m.end():].lstrip().startswith("(") or m.group(0).lower() in _KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def rules(path: Path = RULES) -> list[dict]:
    """Every rule of a Prometheus rule file, with its group's name under ``group``."""
    doc = yaml.safe_load(path.read_text())
    return [dict(r, group=g["name"]) for g in doc["groups"] for r in g["rules"]]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs(dash: dict) -> list[tuple[str, str]]:
    """(panel title, expression) of every query of the dashboard, variables included."""
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    for v in dash["templating"]["list"]:
        m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", v["definition"])
        assert m, v["definition"]
        out.append((f"variable {v['name']}", m.group(1)))
    return out


def grafana_to_promql(expr: str, job: str = ".*", window: str = "60") -> str:
    """A dashboard expression with Grafana's variables filled in."""
    return (expr.replace("$__rate_interval", "1m").replace("$job", job)
            .replace("$window", window))
