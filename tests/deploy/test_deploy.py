"""deploy/: Prometheus rules (real promtool), scrape config, Grafana dashboard, Kubernetes
manifests and the Containerfile.

The metric names in every rule and dashboard query are checked against a real scrape of
``goodput serve`` tailing a real crash-and-restart run (``examples/crash_restart.py``, a
PyTorch job killed with SIGKILL and resumed) and a job that restarts without a restore
(so its report has a warning). Metrics still being added to serve are in
``deploy_util.PENDING`` until the scrape shows them. No Kubernetes API server or container
daemon runs here: manifests are validated against the Kubernetes schemas
(``kubernetes-validate``) and rendered by ``kubectl kustomize`` where kubectl exists;
the Containerfile is checked by structure. About 10 s (serve; the crash-and-restart run
is made once per session by tests/conftest.py, shared with test_example_crash_restart).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_util import (
    DASHBOARD,
    DEPLOY,
    PROMETHEUS_YML,
    REPO,
    RULES,
    RULES_TEST,
    SYNTHETIC,
    Serve,
    dashboard,
    dashboard_exprs,
    get,
    known_names,
    promql_metric_names,
    rules,
    sample_names,
    training_child,
    wait_for,
)
from test_otel_config import check_config

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")
K8S = DEPLOY / "kubernetes"
CONTAINERFILE = DEPLOY / "Containerfile"
ALERTS = {"GoodputLow", "GoodputDisruption", "GoodputProgressStalled",
          "GoodputStepTimeDeviationHigh", "GoodputJobFailed", "GoodputJobOverLimit",
          "GoodputReportWarnings", "GoodputServeDown", "GoodputServeRefusing"}
#: Labels of metrics serve does not export yet (deploy_util.PENDING).
PENDING_LABELS = {"goodput_limit", "goodput_serve_reason"}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


# --- Prometheus rules and config -----------------------------------------------------------

@needs_promtool
def test_promtool_checks_the_rules():
    r = promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules())} rules found" in r.stdout


@needs_promtool
def test_promtool_unit_tests_pass():
    r = promtool("test", "rules", str(RULES_TEST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@needs_promtool
def test_unit_tests_catch_a_broken_alert(tmp_path):
    """A disruption alert that no longer fires on one restart fails its unit test."""
    text = RULES.read_text()
    broken = "delta(goodput_disruptions[15m])) > 5"
    assert "delta(goodput_disruptions[15m])) > 0" in text
    (tmp_path / RULES.name).write_text(text.replace("delta(goodput_disruptions[15m])) > 0",
                                                    broken))
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    r = promtool("test", "rules", str(tmp_path / RULES_TEST.name))
    assert r.returncode != 0
    assert "alertname: GoodputDisruption" in r.stdout + r.stderr


def test_every_alert_fires_and_stays_quiet_in_the_unit_tests():
    fired, quiet = set(), set()
    for case in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        for t in case.get("alert_rule_test", []):
            (fired if t.get("exp_alerts") else quiet).add(t["alertname"])
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert alerts == ALERTS
    assert fired == alerts and quiet == alerts


def test_alerts_have_severity_and_text():
    for r in rules():
        if "alert" in r:
            assert r["labels"]["severity"] in ("info", "warning", "critical"), r["alert"]
            assert {"summary", "description"} <= set(r["annotations"]), r["alert"]


@needs_promtool
def test_prometheus_yml_passes_promtool(tmp_path):
    """The example config, with a real token file, is a valid Prometheus configuration."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    conf = yaml.safe_load(PROMETHEUS_YML.read_text())
    for job in conf["scrape_configs"]:
        assert job["authorization"]["credentials_file"] == "/etc/prometheus/goodput-serve-token"
        job["authorization"]["credentials_file"] = str(token)
    assert conf["rule_files"] == [RULES.name]
    shutil.copy(RULES, tmp_path / RULES.name)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(conf))
    r = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert r.returncode == 0, r.stdout + r.stderr


# --- Metric names against a real scrape ------------------------------------------------------

@pytest.fixture(scope="module")
def scrape(tmp_path_factory, crash_restart_truth: dict) -> dict[str, list[dict]]:
    """Sample name -> label sets scraped from goodput serve tailing two real runs."""
    work = tmp_path_factory.mktemp("deploy-scrape")
    # the real crash-and-restart run (examples/crash_restart.py, once per session:
    # tests/conftest.py), its spool files as it left them (not the reader's cache)
    shutil.copytree(crash_restart_truth["run_dir"], work / "runs" / "digits-crash",
                    ignore=shutil.ignore_patterns(".goodput-cache"))
    # a second job restarts at step 1 without a restore: a report warning
    for args in (("--steps", "12"), ("--first", "1", "--steps", "5")):
        child = training_child("warned", work / "runs" / "warned", *args)
        assert child.wait(60) == 0
    serve = Serve(work, "--grpc-port", "0", "--http-port", "0", "--spool-dir",
                  str(work / "runs"), "--prometheus-port", "0", "--windows", "60")
    try:
        def complete():
            names = sample_names(get(serve.addrs["prometheus"]))
            jobs = {labels.get("goodput_job_name") for labels in names.get("goodput_goodput", [])}
            return names if {"digits-crash", "warned"} <= jobs and "goodput_warnings" in names \
                else None
        return wait_for(complete, 60, "both jobs and a warning in the scrape")
    finally:
        serve.stop()


def test_scrape_has_the_documented_metrics(scrape):
    for name in ("goodput_goodput", "goodput_productive_time_seconds",
                 "goodput_badput_time_seconds", "goodput_elapsed_time_seconds",
                 "goodput_disruptions", "goodput_max_productive_step",
                 "goodput_ideal_step_time_seconds", "goodput_step_time_deviation_seconds",
                 "goodput_anomalous_steps", "goodput_warnings", "goodput_window_goodput",
                 "goodput_window_badput_time_seconds"):
        assert scrape.get(name), name
        assert all("goodput_job_name" in labels for labels in scrape[name]), name
    codes = {(s["goodput_job_name"], s["goodput_warning_code"]) for s in scrape["goodput_warnings"]}
    assert ("warned", "steps_restart_without_restore") in codes
    stats = {s["goodput_statistic"] for s in scrape["goodput_step_time_deviation_seconds"]}
    assert {"p50", "p90", "p99"} <= stats


def _unknown(exprs, scrape) -> list[str]:
    recorded = {r["record"] for r in rules() if "record" in r}
    known = known_names(set(scrape)) | recorded | SYNTHETIC
    return [f"{where}: {sorted(promql_metric_names(e) - known)}" for where, e in exprs
            if promql_metric_names(e) - known]


def test_rules_use_only_exported_metrics(scrape):
    exprs = [(r.get("alert") or r["record"], r["expr"]) for r in rules()]
    assert _unknown(exprs, scrape) == []


def test_dashboard_uses_only_exported_metrics(scrape):
    assert _unknown(dashboard_exprs(dashboard()), scrape) == []


def test_label_names_exist(scrape):
    """Every goodput_* label in a matcher or a by (...) list is a label serve exports."""
    labels = {k for sets in scrape.values() for s in sets for k in s} | PENDING_LABELS
    exprs = [r["expr"] for r in rules()] + [e for _, e in dashboard_exprs(dashboard())]
    used = set()
    for e in exprs:
        for group in re.findall(r"\{([^}]*)\}|(?:by|on)\s*\(([^)]*)\)", e):
            used |= set(re.findall(r"\bgoodput_\w+", " ".join(group)))
    assert used - labels == set()


def test_name_extraction():
    assert promql_metric_names(
        'sum by (goodput_job_name) (delta(goodput_disruptions{goodput_job_name=~"$job"}'
        '[15m])) > 0 unless goodput_x offset 15m and on (a) goodput_job:goodput:ratio_1h'
    ) == {"goodput_disruptions", "goodput_x", "goodput_job:goodput:ratio_1h"}


# --- Grafana dashboard -----------------------------------------------------------------------

PANELS = {"Goodput", "Goodput over time", "Rolling-window goodput", "Badput by bucket",
          "Disruptions", "Max productive step", "Step-time deviation p50 / p90 / p99",
          "Ideal step time", "Report warnings", "Job errors and limits", "Ingest", "Refused",
          "Write-ahead log"}


def test_dashboard_structure():
    d = dashboard()
    assert d["schemaVersion"] >= 36
    (ds,) = d["__inputs"]
    assert (ds["name"], ds["type"], ds["pluginId"]) == ("DS_PROMETHEUS", "datasource",
                                                        "prometheus")
    source = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    panels = d["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        assert 0 <= p["gridPos"]["x"] and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == source and p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == source and t["expr"], p["title"]
            job_metrics = {n for n in promql_metric_names(t["expr"])
                           if n.startswith("goodput_") and not n.startswith("goodput_serve_")}
            if job_metrics:  # a job's series follow the job variable
                assert 'goodput_job_name=~"$job"' in t["expr"], (p["title"], t["expr"])
    assert PANELS <= {p["title"] for p in panels}
    (badput,) = [p for p in panels if p["title"] == "Badput by bucket"]
    assert badput["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    job = variables["job"]
    assert job["definition"] == "label_values(goodput_goodput, goodput_job_name)"
    assert job["multi"] and job["includeAll"] and job["datasource"] == source
    exprs = " ".join(e for _, e in dashboard_exprs(d))
    for name in ("goodput_goodput", "goodput_badput_time_seconds", "goodput_window_goodput",
                 "goodput_disruptions", "goodput_max_productive_step",
                 "goodput_step_time_deviation_seconds", "goodput_ideal_step_time_seconds",
                 "goodput_warnings", "goodput_job_errors_total", "goodput_job_over_limit",
                 "goodput_serve_spans_total", "goodput_serve_refused_total",
                 "goodput_serve_wal_size_bytes"):
        assert name in exprs, name
    assert DASHBOARD.read_text() == json.dumps(d, indent=2) + "\n"  # stays diff-friendly


# --- Kubernetes ------------------------------------------------------------------------------

def manifests() -> list[dict]:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for name in kust["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def one(kind: str, name: str) -> dict:
    (doc,) = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def flags(container: dict) -> dict[str, str]:
    """``--name=value`` / ``--name value`` arguments of a container."""
    args, out = container.get("command", []) + container.get("args", []), {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            key, eq, value = a.partition("=")
            out[key] = value if eq else (args[i + 1] if i + 1 < len(args) else "")
    return out


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(
        p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert kust["namespace"] == "goodput"
    for d in manifests():
        assert d["apiVersion"] and d["kind"] and d["metadata"]["name"], d


def test_manifests_match_the_kubernetes_schemas():
    kv = pytest.importorskip("kubernetes_validate")
    for d in manifests():
        kv.validate(d, kv.latest_version(), strict=True)  # raises on an unknown field


def test_selectors_ports_and_probes_match():
    docs = manifests()
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    for w in workloads:
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert w["spec"]["selector"]["matchLabels"].items() <= labels.items()
        (c,) = w["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe in c:
                assert c[probe]["httpGet"]["port"] in ports, (w["metadata"]["name"], probe)
        assert c["resources"]["requests"] and c["resources"]["limits"]
    for d in docs:
        if d["kind"] in ("Service", "PodDisruptionBudget"):
            sel = d["spec"]["selector"]
            sel = sel.get("matchLabels", sel)
            (w,) = [w for w in workloads
                    if sel.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
            if d["kind"] == "Service":
                (c,) = w["spec"]["template"]["spec"]["containers"]
                names = {p["name"] for p in c["ports"]}
                for p in d["spec"]["ports"]:
                    assert p["targetPort"] == p["name"] and p["name"] in names, p


def test_serve_statefulset():
    svc, sts = one("Service", "goodput-serve"), one("StatefulSet", "goodput-serve")
    assert svc["spec"]["clusterIP"] == "None"
    assert {(p["name"], p["port"]) for p in svc["spec"]["ports"]} >= {
        ("otlp-grpc", 4317), ("otlp-http", 4318)}
    spec = sts["spec"]
    assert spec["serviceName"] == "goodput-serve"
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    f = flags(c)
    assert f["--host"] == "0.0.0.0" and f["--wal-dir"] == "/var/lib/goodput/wal"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["otlp-grpc"] == int(f["--grpc-port"]) == 4317
    assert ports["otlp-http"] == int(f["--http-port"]) == 4318
    assert "--prometheus-port" not in f  # its /metrics would have no token
    # the probes go to the health port, which ingest connections cannot starve
    assert ports["health"] == int(f["--health-port"]) == 13133
    probes = {k: (c[k]["httpGet"]["path"], ports[c[k]["httpGet"]["port"]])
              for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes == {"startupProbe": ("/healthz", 13133), "livenessProbe": ("/healthz", 13133),
                      "readinessProbe": ("/readyz", 13133)}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    (claim,) = spec["volumeClaimTemplates"]
    assert mounts[f["--wal-dir"]] == claim["metadata"]["name"]
    token_dir, _, token_file = f["--token-file"].rpartition("/")
    (secret,) = [v for v in pod["volumes"] if v["name"] == mounts[token_dir]]
    assert secret["secret"]["items"] == [{"key": "token", "path": token_file}]
    assert pod["terminationGracePeriodSeconds"] > float(f["--shutdown-timeout"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    pdb = one("PodDisruptionBudget", "goodput-serve")
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]


def test_gateway_routes_jobs_to_the_headless_service(tmp_path):
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    svc = one("Service", "goodput-serve")
    config_text = one("ConfigMap", "goodput-gateway")["data"]["config.yaml"]
    path = tmp_path / "gateway-k8s.yaml"
    path.write_text(config_text)
    assert check_config(path) == []
    lb = yaml.safe_load(config_text)["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "service"
    dns = lb["resolver"]["dns"]
    assert dns["hostname"] == f"{svc['metadata']['name']}.{kust['namespace']}.svc.cluster.local"
    assert dns["port"] == next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "otlp-grpc")
    assert lb["protocol"]["otlp"]["headers"]["authorization"] == \
        "Bearer ${env:GOODPUT_SERVE_TOKEN}"
    dep = one("Deployment", "goodput-gateway")["spec"]["template"]["spec"]
    (c,) = dep["containers"]
    (env,) = [e for e in c["env"] if e["name"] == "GOODPUT_SERVE_TOKEN"]
    serve_pod = one("StatefulSet", "goodput-serve")["spec"]["template"]["spec"]
    (token,) = [v for v in serve_pod["volumes"] if "secret" in v]
    assert env["valueFrom"]["secretKeyRef"] == {"name": token["secret"]["secretName"],
                                                "key": "token"}
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["config"]
    assert flags(c)["--config"] == f"{mount}/config.yaml"
    prom = yaml.safe_load(PROMETHEUS_YML.read_text())
    (k8s_job,) = [j for j in prom["scrape_configs"] if "dns_sd_configs" in j]
    (sd,) = k8s_job["dns_sd_configs"]
    assert sd["names"] == [dns["hostname"]]
    # /metrics on the HTTP port, where the token applies
    assert sd["port"] == next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "otlp-http")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kubectl_kustomize_renders():
    r = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    rendered = [d for d in yaml.safe_load_all(r.stdout) if d]
    key = [(d["kind"], d["metadata"]["name"]) for d in manifests()]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == sorted(key)
    for d in rendered:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "goodput", d["metadata"]
    (sts,) = [d for d in rendered if d["kind"] == "StatefulSet"]
    image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith("/goodput-serve:0.1.0"), image


# --- Containerfile ---------------------------------------------------------------------------

def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return [tuple(line.split(None, 1)) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_containerfile():
    ins = instructions(CONTAINERFILE)
    kinds = [k for k, _ in ins]
    assert kinds[0] == "FROM" and re.fullmatch(r"python:3\.\d+-slim", ins[0][1])
    (user,) = [v for k, v in ins if k == "USER"]
    assert user.split(":")[0] not in ("root", "0")
    assert kinds.index("USER") < kinds.index("ENTRYPOINT")
    (entry,) = [v for k, v in ins if k == "ENTRYPOINT"]
    entry = json.loads(entry)
    assert entry[:2] == ["goodput", "serve"] and entry[entry.index("--host") + 1] == "0.0.0.0"
    wal = entry[entry.index("--wal-dir") + 1]
    (volume,) = [v for k, v in ins if k == "VOLUME"]
    assert volume == wal == flags(one("StatefulSet", "goodput-serve")["spec"]["template"]
                                  ["spec"]["containers"][0])["--wal-dir"]
    (expose,) = [v.split() for k, v in ins if k == "EXPOSE"]
    assert {"4317", "4318"} <= set(expose)
    assert any(k == "RUN" and "pip install" in v and "[serve" in v for k, v in ins)
    # what is copied exists and gets past .dockerignore
    admitted = set((REPO / ".dockerignore").read_text().split())
    for src in [s for k, v in ins if k == "COPY" for s in v.split()[:-1]]:
        assert (REPO / src).exists() and {f"!{src}", f"!{src}/"} & admitted, src


def test_deployment_doc_names_the_files_and_alerts():
    doc = (REPO / "docs" / "deployment.md").read_text()
    for path in ("deploy/prometheus/goodput-rules.yml", "deploy/prometheus/prometheus.yml",
                 "deploy/grafana/goodput-dashboard.json", "deploy/kubernetes/",
                 "deploy/Containerfile"):
        assert path in doc, path
    for alert in ALERTS:
        assert f"`{alert}`" in doc, alert
    assert "serve.md#write-ahead-log" in doc  # the disk sizing of the log
