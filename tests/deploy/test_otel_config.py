"""Structural checks of the OpenTelemetry Collector configurations in ``otel-config/``.

No Collector binary runs here, so each YAML file is checked the way ``otelcol validate`` would
reject it: every component referenced by a pipeline is defined and every defined one is used,
component types are real Collector (core + contrib) components, the keys of each component's
configuration are keys that component has, pipelines have receivers and exporters, endpoints
parse, and the ``loadbalancing`` exporter routes by a key that carries the job name.

``check_config(path)`` returns a list of problems, each naming the file, the component and the
bad key; the tests assert that list is empty for the shipped files and not empty for broken ones.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "otel-config"
DEPLOYMENT_DOC = ROOT / "docs" / "deployment.md"

ANY = None  # a key whose value is not checked further

# --- Known keys per component type -------------------------------------------------------------
# Sources (mapstructure tags of each component's Config struct and its README):
#  core  github.com/open-telemetry/opentelemetry-collector:
#        config/configgrpc (ClientConfig, ServerConfig), config/confighttp (ClientConfig,
#        ServerConfig), config/configtls, config/configretry (BackOffConfig),
#        exporter/exporterhelper (QueueBatchConfig, TimeoutConfig), receiver/otlpreceiver,
#        processor/batchprocessor, processor/memorylimiterprocessor, exporter/otlpexporter,
#        exporter/otlphttpexporter, exporter/debugexporter.
#  contrib github.com/open-telemetry/opentelemetry-collector-contrib:
#        exporter/loadbalancingexporter (config.go, README), exporter/googlecloudexporter,
#        extension/googleclientauthextension (README), extension/healthcheckextension,
#        processor/resourcedetectionprocessor, processor/resourceprocessor,
#        receiver/otlpjsonfilereceiver (fileconsumer.Config squashed), extension/storage.
TLS_CLIENT = {k: ANY for k in (
    "insecure", "insecure_skip_verify", "ca_file", "ca_pem", "cert_file", "cert_pem",
    "key_file", "key_pem", "server_name_override", "min_version", "max_version",
    "reload_interval", "include_system_ca_certs_pool", "cipher_suites", "curve_preferences")}
TLS_SERVER = {k: ANY for k in (
    "ca_file", "ca_pem", "cert_file", "cert_pem", "key_file", "key_pem", "min_version",
    "max_version", "reload_interval", "client_ca_file", "client_ca_file_reload",
    "include_system_ca_certs_pool", "cipher_suites", "curve_preferences")}
RETRY = {k: ANY for k in (
    "enabled", "initial_interval", "randomization_factor", "multiplier", "max_interval",
    "max_elapsed_time")}
QUEUE = {k: ANY for k in (
    "enabled", "num_consumers", "queue_size", "storage", "blocking", "block_on_overflow",
    "sizer", "wait_for_result", "batch")}
AUTH = {"authenticator": ANY}
GRPC_SERVER = {
    "endpoint": ANY, "transport": ANY, "tls": TLS_SERVER, "max_recv_msg_size_mib": ANY,
    "max_concurrent_streams": ANY, "read_buffer_size": ANY, "write_buffer_size": ANY,
    "keepalive": ANY, "auth": AUTH, "include_metadata": ANY}
HTTP_SERVER = {
    "endpoint": ANY, "tls": TLS_SERVER, "cors": ANY, "auth": AUTH,
    "max_request_body_size": ANY, "include_metadata": ANY, "response_headers": ANY,
    "traces_url_path": ANY, "metrics_url_path": ANY, "logs_url_path": ANY,
    "read_timeout": ANY, "read_header_timeout": ANY, "write_timeout": ANY, "idle_timeout": ANY}
OTLP_GRPC_EXPORTER = {
    "endpoint": ANY, "tls": TLS_CLIENT, "headers": ANY, "compression": ANY, "timeout": ANY,
    "retry_on_failure": RETRY, "sending_queue": QUEUE, "batcher": ANY, "balancer_name": ANY,
    "auth": AUTH, "keepalive": ANY, "read_buffer_size": ANY, "write_buffer_size": ANY,
    "wait_for_ready": ANY, "authority": ANY}
OTLP_HTTP_EXPORTER = {
    "endpoint": ANY, "traces_endpoint": ANY, "metrics_endpoint": ANY, "logs_endpoint": ANY,
    "profiles_endpoint": ANY, "tls": TLS_CLIENT, "headers": ANY, "compression": ANY,
    "compression_params": ANY, "timeout": ANY, "encoding": ANY, "retry_on_failure": RETRY,
    "sending_queue": QUEUE, "auth": AUTH, "read_buffer_size": ANY, "write_buffer_size": ANY,
    "proxy_url": ANY, "max_idle_conns": ANY, "max_idle_conns_per_host": ANY,
    "max_conns_per_host": ANY, "idle_conn_timeout": ANY, "disable_keep_alives": ANY,
    "http2_read_idle_timeout": ANY, "http2_ping_timeout": ANY, "cookies": ANY,
    "force_attempt_http2": ANY}
LOADBALANCING = {
    "routing_key": ANY, "routing_attributes": ANY, "timeout": ANY,
    "retry_on_failure": RETRY, "sending_queue": QUEUE,
    # the endpoint is filled in per backend and must not be set (README)
    "protocol": {"otlp": {k: v for k, v in OTLP_GRPC_EXPORTER.items() if k != "endpoint"}},
    "resolver": {
        "static": {"hostnames": ANY},
        "dns": {"hostname": ANY, "port": ANY, "interval": ANY, "timeout": ANY},
        "k8s": {"service": ANY, "ports": ANY, "timeout": ANY, "return_hostnames": ANY},
        "aws_cloud_map": {k: ANY for k in (
            "namespace", "service_name", "port", "health_status", "interval", "timeout")},
    },
}

KNOWN_KEYS: dict[str, dict[str, dict | None]] = {
    "receivers/otlp": {"protocols": {"grpc": GRPC_SERVER, "http": HTTP_SERVER}},
    "receivers/otlpjsonfile": {k: ANY for k in (
        "include", "exclude", "start_at", "poll_interval", "max_concurrent_files",
        "max_batches", "include_file_name", "include_file_path", "include_file_name_resolved",
        "include_file_path_resolved", "storage", "replay_file", "encoding", "multiline",
        "fingerprint_size", "max_log_size", "exclude_older_than", "ordering_criteria",
        "compression", "delete_after_read", "acquire_fs_lock", "force_flush_period")},
    "processors/batch": {k: ANY for k in (
        "timeout", "send_batch_size", "send_batch_max_size", "metadata_keys",
        "metadata_cardinality_limit")},
    "processors/memory_limiter": {k: ANY for k in (
        "check_interval", "limit_mib", "spike_limit_mib", "limit_percentage",
        "spike_limit_percentage", "min_gc_interval_when_soft_limited",
        "min_gc_interval_when_hard_limited")},
    "processors/resourcedetection": {
        "detectors": ANY, "override": ANY, "timeout": ANY, "attributes": ANY, "client": ANY,
        "refresh_interval": ANY, "env": ANY,
        "system": {"hostname_sources": ANY, "resource_attributes": ANY},
        "gcp": {"resource_attributes": ANY}},
    "processors/resource": {"attributes": ANY},
    "exporters/otlp": OTLP_GRPC_EXPORTER,
    "exporters/otlp_grpc": OTLP_GRPC_EXPORTER,
    "exporters/otlphttp": OTLP_HTTP_EXPORTER,
    "exporters/otlp_http": OTLP_HTTP_EXPORTER,
    "exporters/debug": {k: ANY for k in (
        "verbosity", "sampling_initial", "sampling_thereafter", "use_internal_logger")},
    "exporters/loadbalancing": LOADBALANCING,
    "exporters/load_balancing": LOADBALANCING,
    "exporters/googlecloud": {
        "project": ANY, "destination_project_quota": ANY, "user_agent": ANY,
        "impersonate": ANY, "metric": ANY, "log": ANY, "sending_queue": QUEUE, "timeout": ANY,
        "trace": {k: ANY for k in (
            "endpoint", "use_insecure", "grpc_pool_size", "attribute_mappings",
            "compression")}},
    "extensions/googleclientauth": {k: ANY for k in (
        "project", "scopes", "quota_project", "token_type", "audience")},
    "extensions/health_check": {k: ANY for k in (
        "endpoint", "path", "response_body", "tls", "cors", "auth", "check_collector_pipeline",
        "include_metadata", "response_headers")},
    "extensions/file_storage": {k: ANY for k in (
        "directory", "timeout", "compaction", "fsync", "create_directory")},
}

# Real component types (core + contrib distributions); only those in KNOWN_KEYS may carry config.
ALLOWED_TYPES = {
    "receivers": {"otlp", "otlpjsonfile", "filelog", "prometheus", "hostmetrics", "zipkin",
                  "jaeger", "kubeletstats"},
    "processors": {"batch", "memory_limiter", "resourcedetection", "resource", "attributes",
                   "filter", "transform", "k8sattributes", "groupbytrace", "tail_sampling",
                   "probabilistic_sampler"},
    "exporters": {"otlp", "otlp_grpc", "otlphttp", "otlp_http", "debug", "loadbalancing",
                  "load_balancing", "googlecloud", "googlemanagedprometheus", "file",
                  "prometheus", "prometheusremotewrite"},
    "extensions": {"health_check", "pprof", "zpages", "googleclientauth", "file_storage",
                   "bearertokenauth", "oauth2client", "basicauth"},
    "connectors": {"forward", "spanmetrics", "routing"},
}
SECTIONS = ("receivers", "processors", "exporters", "extensions", "connectors")
TOP_LEVEL = set(SECTIONS) | {"service"}
PIPELINE_SIGNALS = {"traces", "metrics", "logs"}
JOB_ROUTING_ATTRIBUTES = {"service.name", "goodput.job.name"}

ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# Values used for environment variables without a default when endpoints are parsed.
SAMPLE_ENV = {
    "GOODPUT_GATEWAY_HOSTNAME": "goodput-gateway.monitoring.svc.cluster.local",
    "GOOGLE_CLOUD_PROJECT": "my-project",
    "GOODPUT_RUN_DIR": "/tmp/goodput-runs/job",
}


def env_vars(text: str) -> set[str]:
    """Names of the ``${env:NAME}`` / ``${env:NAME:-default}`` references in ``text``."""
    return {m.group(1) for m in ENV_REF.finditer(text)}


def expand(value: str) -> str:
    """``value`` with each env reference replaced by its default, else by ``SAMPLE_ENV``.

    Raises ``KeyError`` naming the variable when it has neither.
    """
    def sub(m: re.Match) -> str:
        if m.group(2) is not None:
            return m.group(2)
        return SAMPLE_ENV[m.group(1)]
    return ENV_REF.sub(sub, value)


def _check_keys(where: str, conf, schema, problems: list[str]) -> None:
    if schema is ANY or conf is None:
        return
    if not isinstance(conf, dict):
        problems.append(f"{where}: expected a mapping, got {type(conf).__name__}")
        return
    for key, value in conf.items():
        if key not in schema:
            problems.append(f"{where}: unknown key {key!r} (known: {', '.join(sorted(schema))})")
        else:
            _check_keys(f"{where}.{key}", value, schema[key], problems)


def _check_host_port(where: str, raw, problems: list[str]) -> None:
    try:
        value = expand(str(raw))
    except KeyError as e:
        problems.append(f"{where}: endpoint {raw!r} uses ${{env:{e.args[0]}}} with no default "
                        f"and no sample value in SAMPLE_ENV")
        return
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        problems.append(f"{where}: endpoint {raw!r} is not host:port")


def _check_url(where: str, raw, problems: list[str]) -> None:
    value = expand(str(raw))
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        problems.append(f"{where}: endpoint {raw!r} is not an http(s) URL")


def _check_endpoints(name: str, kind: str, ctype: str, conf: dict, where: str,
                     problems: list[str]) -> None:
    if kind == "receivers" and ctype == "otlp":
        for proto, server in (conf.get("protocols") or {}).items():
            if server and "endpoint" in server:
                _check_host_port(f"{where}.protocols.{proto}.endpoint", server["endpoint"],
                                 problems)
    elif kind == "exporters" and ctype in ("otlp", "otlp_grpc"):
        if "endpoint" not in conf:
            problems.append(f"{where}: no endpoint")
        elif "://" in str(conf["endpoint"]):
            _check_url(f"{where}.endpoint", conf["endpoint"], problems)
        else:
            _check_host_port(f"{where}.endpoint", conf["endpoint"], problems)
    elif kind == "exporters" and ctype in ("otlphttp", "otlp_http"):
        if "endpoint" not in conf and "traces_endpoint" not in conf:
            problems.append(f"{where}: no endpoint")
        for key in ("endpoint", "traces_endpoint", "metrics_endpoint", "logs_endpoint"):
            if key in conf:
                _check_url(f"{where}.{key}", conf[key], problems)
    elif kind == "extensions" and ctype == "health_check" and "endpoint" in conf:
        _check_host_port(f"{where}.endpoint", conf["endpoint"], problems)
    elif kind == "exporters" and ctype in ("loadbalancing", "load_balancing"):
        _check_loadbalancing(where, conf, problems)


def _check_loadbalancing(where: str, conf: dict, problems: list[str]) -> None:
    key = conf.get("routing_key", "traceID")
    if key == "attributes":
        attrs = set(conf.get("routing_attributes") or [])
        if not attrs & JOB_ROUTING_ATTRIBUTES:
            problems.append(f"{where}.routing_attributes: {sorted(attrs)} carries no job name "
                            f"(one of {sorted(JOB_ROUTING_ATTRIBUTES)})")
    elif key != "service":
        problems.append(f"{where}.routing_key: {key!r} does not route by job; use 'service' "
                        f"(service.name is the job name) or 'attributes' with goodput.job.name")
    otlp = (conf.get("protocol") or {}).get("otlp")
    if otlp is None:
        problems.append(f"{where}.protocol.otlp: missing")
    elif "endpoint" in otlp:
        problems.append(f"{where}.protocol.otlp.endpoint: must not be set (the resolver "
                        f"provides the backends)")
    resolver = conf.get("resolver") or {}
    if not resolver:
        problems.append(f"{where}.resolver: missing (static, dns, k8s or aws_cloud_map)")
    for host in (resolver.get("static") or {}).get("hostnames") or []:
        if ":" in str(host):  # a bare host gets the default port 4317
            _check_host_port(f"{where}.resolver.static.hostnames", host, problems)
    dns = resolver.get("dns")
    if dns is not None and not dns.get("hostname"):
        problems.append(f"{where}.resolver.dns.hostname: missing")


def check_config(path: Path) -> list[str]:
    """Problems of the Collector configuration file at ``path`` (empty list: none found).

    Each problem is one line starting with the file name, then the component id and key, e.g.
    ``agent.yaml: exporters/loadbalancing.routing_key: 'traceID' does not route by job``.
    Raises ``yaml.YAMLError`` if the file is not YAML.
    """
    fname = path.name
    doc = yaml.safe_load(path.read_text())
    problems: list[str] = []
    if not isinstance(doc, dict):
        return [f"{fname}: not a mapping at the top level"]
    for key in doc:
        if key not in TOP_LEVEL:
            problems.append(f"{fname}: unknown top-level key {key!r}")
    defined: dict[str, set[str]] = {}
    for kind in SECTIONS:
        section = doc.get(kind) or {}
        defined[kind] = set(section)
        for cid, conf in section.items():
            ctype = cid.split("/", 1)[0]
            where = f"{fname}: {kind}/{cid}"
            if ctype not in ALLOWED_TYPES[kind]:
                problems.append(f"{where}: {ctype!r} is not a known Collector {kind[:-1]} type")
                continue
            schema = KNOWN_KEYS.get(f"{kind}/{ctype}")
            if schema is None:
                if conf:
                    problems.append(f"{where}: no key table for {ctype!r}; add one to "
                                    f"KNOWN_KEYS with its source")
                continue
            _check_keys(where, conf, schema, problems)
            if isinstance(conf, dict):
                _check_endpoints(cid, kind, ctype, conf, where, problems)

    service = doc.get("service") or {}
    for key in service:
        if key not in ("extensions", "pipelines", "telemetry"):
            problems.append(f"{fname}: service: unknown key {key!r}")
    used: dict[str, set[str]] = {kind: set() for kind in SECTIONS}
    for ext in service.get("extensions") or []:
        used["extensions"].add(ext)
        if ext not in defined["extensions"]:
            problems.append(f"{fname}: service.extensions: {ext!r} is not defined")
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        problems.append(f"{fname}: service.pipelines: none")
    for pname, pipe in pipelines.items():
        where = f"{fname}: service.pipelines.{pname}"
        if pname.split("/", 1)[0] not in PIPELINE_SIGNALS:
            problems.append(f"{where}: signal must be one of {sorted(PIPELINE_SIGNALS)}")
        pipe = pipe or {}
        for key in pipe:
            if key not in ("receivers", "processors", "exporters"):
                problems.append(f"{where}: unknown key {key!r}")
        for role in ("receivers", "exporters"):
            if not pipe.get(role):
                problems.append(f"{where}: no {role}")
        for role in ("receivers", "processors", "exporters"):
            for cid in pipe.get(role) or []:
                sources = (role, "connectors") if role != "processors" else (role,)
                hit = [s for s in sources if cid in defined[s]]
                if not hit:
                    problems.append(f"{where}.{role}: {cid!r} is not defined in {role}")
                for s in hit:
                    used[s].add(cid)
        procs = pipe.get("processors") or []
        if "memory_limiter" in procs and procs[0] != "memory_limiter":
            problems.append(f"{where}.processors: memory_limiter must come first")
    for kind in SECTIONS:
        for cid in sorted(defined[kind] - used[kind]):
            how = "service.extensions" if kind == "extensions" else "any pipeline"
            problems.append(f"{fname}: {kind}/{cid}: defined but not used in {how}")
    return problems


CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))


def test_configs_exist():
    names = {p.name for p in CONFIGS}
    assert {"agent.yaml", "gateway.yaml", "local-dev.yaml", "replay-spool.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_is_valid(path):
    problems = check_config(path)
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_env_vars_are_documented(path):
    doc = DEPLOYMENT_DOC.read_text()
    missing = sorted(v for v in env_vars(path.read_text()) if f"`{v}`" not in doc)
    assert missing == [], f"{path.name}: environment variables not in docs/deployment.md: {missing}"


def test_agent_routes_jobs_to_one_backend():
    doc = yaml.safe_load((CONFIG_DIR / "agent.yaml").read_text())
    lb = doc["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "service"
    traces = doc["service"]["pipelines"]["traces"]
    assert traces["exporters"] == ["loadbalancing"]
    assert traces["processors"][0] == "memory_limiter"
    assert set(doc["processors"]["resourcedetection"]["detectors"]) == {"env", "system", "gcp"}
    # node-local by default
    for proto in ("grpc", "http"):
        endpoint = expand(doc["receivers"]["otlp"]["protocols"][proto]["endpoint"])
        assert endpoint.startswith("127.0.0.1:"), endpoint


def test_gateway_feeds_goodput_serve_and_google():
    for name, google in (("gateway.yaml", "otlphttp/google"),
                         ("gateway-cloud-trace.yaml", "googlecloud")):
        doc = yaml.safe_load((CONFIG_DIR / name).read_text())
        traces = doc["service"]["pipelines"]["traces"]["exporters"]
        assert "otlp/goodput" in traces and google in traces, (name, traces)
        # goodput serve's own metrics must not loop back into it
        assert "otlp/goodput" not in doc["service"]["pipelines"]["metrics"]["exporters"], name
    doc = yaml.safe_load((CONFIG_DIR / "gateway.yaml").read_text())
    google = doc["exporters"]["otlphttp/google"]
    assert google["endpoint"] == "https://telemetry.googleapis.com"
    assert google["auth"]["authenticator"] == "googleclientauth"


def test_replay_reads_the_spool_file_names():
    doc = yaml.safe_load((CONFIG_DIR / "replay-spool.yaml").read_text())
    (pattern,) = doc["receivers"]["otlpjsonfile"]["include"]
    # the recorder's file name (src/goodput/config.py: spool_path) must match the glob
    from goodput.config import spool_path
    written = Path(spool_path("/run", 3, 1, "0123abcdef")).name
    assert Path(written).match(Path(expand(pattern)).name), (pattern, written)



def test_replay_reads_the_compacted_segments():
    """Journal segments go to the plain receiver, compacted ones (gzip) to the second."""
    doc = yaml.safe_load((CONFIG_DIR / "replay-spool.yaml").read_text())
    plain = doc["receivers"]["otlpjsonfile"]
    compact = doc["receivers"]["otlpjsonfile/compact"]
    assert compact["compression"] == "gzip" and "compression" not in plain
    assert {"otlpjsonfile", "otlpjsonfile/compact"} <= set(
        doc["service"]["pipelines"]["traces"]["receivers"])
    from goodput.config import spool_path
    from goodput.segments import segment_path
    (journal_glob,), (compact_glob,) = plain["include"], compact["include"]
    first = spool_path("/run", 3, 1, "0123abcdef")
    for k in (0, 2):
        journal = Path(segment_path(first, k))
        gz = Path(f"{journal}.gz")
        assert journal.match(Path(expand(journal_glob)).name), (journal_glob, journal)
        assert gz.match(Path(expand(compact_glob)).name), (compact_glob, gz)
        assert not gz.match(Path(expand(journal_glob)).name)
        assert not Path(f"{gz}.tmp").match(Path(expand(compact_glob)).name)

BROKEN = """
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: localhost
        max_recv_msg_size: 4
processors:
  batch: {}
  memory_limiter: {check_interval: 1s, limit_mib: 100}
  frobnicate: {}
exporters:
  loadbalancing:
    routing_key: traceID
    protocol:
      otlp:
        endpoint: backend:4317
    resolver:
      static:
        hostnames: [backend-0, 'backend-1:otlp']
  otlphttp/unused:
    endpoint: telemetry.googleapis.com
extensions:
  googleclientauth: {}
service:
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch, memory_limiter]
      exporters: [loadbalancing, otlp/missing]
    metrics:
      receivers: [otlp]
"""


def test_broken_config_fails_with_named_problems(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    text = "\n".join(check_config(path))
    expected = [
        "broken.yaml: receivers/otlp.protocols.grpc: unknown key 'max_recv_msg_size'",
        "broken.yaml: receivers/otlp.protocols.grpc.endpoint: endpoint 'localhost' is not "
        "host:port",
        "broken.yaml: processors/frobnicate: 'frobnicate' is not a known Collector processor",
        "broken.yaml: exporters/loadbalancing.routing_key: 'traceID' does not route by job",
        "broken.yaml: exporters/loadbalancing.protocol.otlp.endpoint: must not be set",
        "broken.yaml: exporters/loadbalancing.resolver.static.hostnames: endpoint 'backend-1:otlp' "
        "is not host:port",
        "broken.yaml: exporters/otlphttp/unused.endpoint: endpoint 'telemetry.googleapis.com' "
        "is not an http(s) URL",
        "broken.yaml: exporters/otlphttp/unused: defined but not used in any pipeline",
        "broken.yaml: extensions/googleclientauth: defined but not used in service.extensions",
        "broken.yaml: service.pipelines.traces.exporters: 'otlp/missing' is not defined",
        "broken.yaml: service.pipelines.traces.processors: memory_limiter must come first",
        "broken.yaml: service.pipelines.metrics: no exporters",
    ]
    for line in expected:
        assert line in text, f"missing problem:\n  {line}\nin:\n{text}"


def test_unknown_key_in_shipped_config_is_caught(tmp_path):
    """A typo in a copy of agent.yaml is reported with file, component and key."""
    text = (CONFIG_DIR / "agent.yaml").read_text().replace("spike_limit_mib", "spike_limit_mb")
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    problems = check_config(path)
    assert any(p.startswith("agent.yaml: processors/memory_limiter: unknown key "
                            "'spike_limit_mb'") for p in problems), problems
