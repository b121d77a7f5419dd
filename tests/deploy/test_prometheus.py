"""A real Prometheus server scrapes a real ``goodput serve`` and fires the disruption alert
on a real crash-and-restart run.

``goodput serve`` (with a token) tails the run directory of ``tests/restart_child.py``;
Debian's ``prometheus`` runs on loopback with ``deploy/prometheus/prometheus.yml`` (scrape
``/metrics`` on serve's HTTP port every second, the bearer token from a file) and
``deploy/prometheus/goodput-rules.yml``. The
training process is killed with SIGKILL once Prometheus has seen it with no disruption,
then restarted from its last checkpoint; the test waits (bounded) for
``GoodputDisruption`` to fire. Then every rule must evaluate without error and every
dashboard query must run, with data wherever serve exports its metrics. About 20 s.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.parse

import pytest
import yaml
from deploy_util import (
    PROMETHEUS_YML,
    RULES,
    Serve,
    dashboard,
    dashboard_exprs,
    get,
    grafana_to_promql,
    promql_metric_names,
    rules,
    training_child,
    wait_for,
)

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (Debian: apt-get install prometheus)")

JOB = "prom-crash"
TOKEN = "prometheus-test-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prometheus_config(tmp, serve_target: str) -> str:
    """deploy/prometheus/prometheus.yml scraping ``serve_target`` every second, with the
    rules of deploy/ (the disruption alert with no ``for``)."""
    token = tmp / "token"
    token.write_text(TOKEN + "\n")
    rule_doc = yaml.safe_load(RULES.read_text())
    for group in rule_doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "GoodputDisruption":
                rule["for"] = "0s"
    (tmp / "rules.yml").write_text(yaml.safe_dump(rule_doc))
    conf = yaml.safe_load(PROMETHEUS_YML.read_text())
    conf["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    conf["rule_files"] = [str(tmp / "rules.yml")]
    (job,) = [j for j in conf["scrape_configs"] if j["job_name"] == "goodput-serve"]
    job["authorization"]["credentials_file"] = str(token)
    job["static_configs"] = [{"targets": [serve_target]}]
    conf["scrape_configs"] = [job]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(conf))
    return str(tmp / "prometheus.yml")


def _metrics_target(serve: Serve) -> str:
    """Where Prometheus scrapes: ``/metrics`` on serve's HTTP port, which requires the token
    (as in production); the open ``--prometheus-port`` only on a serve whose HTTP port has
    no ``/metrics`` yet (before issue 15)."""
    http = serve.addrs["http"]
    try:
        get(http + "/metrics", token=TOKEN)
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise
        return urllib.parse.urlsplit(serve.addrs["prometheus"]).netloc
    with pytest.raises(urllib.error.HTTPError) as denied:
        get(http + "/metrics")
    assert denied.value.code == 401
    return urllib.parse.urlsplit(http).netloc


class Prometheus:
    def __init__(self, tmp, config: str):
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(self._ready, 60, "prometheus to be ready")

    def _ready(self) -> bool:
        assert self.proc.poll() is None, (self.log.name, open(self.log.name).read())
        try:
            return "Ready" in get(self.url + "/-/ready", timeout_s=2)
        except OSError:
            return False

    def api(self, path: str, **params) -> dict:
        body = json.loads(get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"))
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """Prometheus after the restart: the disruption alert fired (the alert is returned)."""
    tmp = tmp_path_factory.mktemp("prometheus")
    run = tmp / "run"
    (tmp / "serve-token").write_text(TOKEN + "\n")
    serve = Serve(tmp, "--grpc-port", "off", "--http-port", "0", "--spool-dir", str(run),
                  "--prometheus-port", "0", "--windows", "60",
                  "--token-file", str(tmp / "serve-token"))
    prom = Prometheus(tmp, _prometheus_config(tmp, _metrics_target(serve)))
    children = []
    try:
        first = training_child(JOB, run)
        children.append(first)
        sel = f'{{goodput_job_name="{JOB}"}}'
        # Prometheus has the job with no disruption (twice) and its first checkpoint
        wait_for(lambda: prom.query(f"count_over_time(goodput_disruptions{sel}[1m]) >= 2")
                 and prom.query(f"goodput_disruptions{sel} == 0")
                 and prom.query(f"goodput_max_productive_step{sel} >= 20"),
                 60, "prometheus to see the first attempt")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        saved = [int(line.split()[1]) for line in first.stdout.read().splitlines()]
        assert saved and saved[0] == 10, saved
        second = training_child(JOB, run, "--first", str(saved[-1] + 1), "--restore",
                                "--steps", "30")
        children.append(second)
        (alert,) = wait_for(lambda: prom.query(
            f'ALERTS{{alertname="GoodputDisruption",alertstate="firing",'
            f'goodput_job_name="{JOB}"}}'), 60, "GoodputDisruption to fire")
        assert second.wait(60) == 0
        yield prom, alert
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
            child.stdout.close()
        prom.stop()
        serve.stop()


def test_disruption_alert_fires(crashed):
    prom, alert = crashed
    assert alert["metric"]["severity"] == "warning"
    sel = f'{{goodput_job_name="{JOB}"}}'
    (disruptions,) = prom.query(f"goodput_disruptions{sel}")
    assert disruptions["value"][1] == "1"
    (goodput,) = prom.query(f"goodput_goodput{sel}")
    assert 0 < float(goodput["value"][1]) < 1
    assert goodput["metric"]["job"] == "goodput-serve"  # the scrape job of prometheus.yml


def test_every_rule_evaluates(crashed):
    prom, _ = crashed
    evaluated = {r["name"]: r for g in prom.api("rules")["groups"] for r in g["rules"]}
    assert set(evaluated) == {r.get("alert") or r["record"] for r in rules()}
    bad = {name: r.get("lastError") for name, r in evaluated.items() if r["health"] != "ok"}
    assert bad == {}


def test_dashboard_queries_run(crashed):
    """Every panel query is valid PromQL for a real Prometheus; those over metrics serve
    exports now return the job's series."""
    prom, _ = crashed
    present = {s["__name__"] for s in prom.api("series", **{"match[]": '{__name__=~"goodput.*"}'})}
    recorded = {r["record"] for r in rules() if "record" in r}
    empty = []
    for title, expr in dashboard_exprs(dashboard()):
        result = prom.query(grafana_to_promql(expr, job=JOB))
        if promql_metric_names(expr) <= present | recorded and not result:
            empty.append((title, expr))
    assert empty == []
