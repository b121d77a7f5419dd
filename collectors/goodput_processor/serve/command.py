"""The ``goodput serve`` subcommand (registered by :mod:`goodput_processor.cli`).

Runs :class:`~goodput_processor.serve.server.GoodputServer` until SIGTERM or SIGINT, prints
the addresses it listens on (one line on stderr: ``goodput serve: listening grpc=HOST:PORT
http=URL``), writes the current report every ``--report-interval`` seconds and the final one
at shutdown, and optionally publishes the metrics (``--prometheus-port``,
``--otlp-metrics-endpoint``). See ``docs/serve.md``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading

from goodput.links import doc_url, install_hint

from .config import mark_defaults
from .exposure import hostport, warnings
from .report_writer import ReportWriter

__all__ = ["add_serve_command", "cmd_serve"]

_TOKEN_ENV = "GOODPUT_SERVE_TOKEN"
_log = logging.getLogger(__name__)


def _number(text: str, what: str, minimum: float = 0.0, strict: bool = True) -> float:
    from ..terminal import UsageError

    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and (v > minimum if strict else v >= minimum)):
        raise UsageError(f"{what} must be a number {'>' if strict else '>='} {minimum:g}, "
                         f"got {text!r}")
    return v


def _port(text: str, what: str) -> int | None:
    from ..terminal import UsageError

    if text.lower() == "off":
        return None
    if not text.isdigit() or int(text) > 65535:
        raise UsageError(f"{what} must be a port number 0-65535 or 'off', got {text!r}")
    return int(text)


def _token(args, from_config: str | None = None) -> str | None:
    """The token: ``--token-file``'s, else the config file's ``token`` key, else
    ``$GOODPUT_SERVE_TOKEN``, else None. Raises UsageError for an unreadable or empty file."""
    from ..terminal import UsageError

    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise UsageError(f"cannot read --token-file {args.token_file!r}: "
                             f"{e.strerror or e}") from e
        if not token:
            raise UsageError(f"--token-file {args.token_file!r} is empty")
        return token
    return from_config or os.environ.get(_TOKEN_ENV) or None


def _metrics(args, store, budget=lambda: None):
    """The meter provider behind ``GET /metrics`` (always, on the HTTP port) and the metric
    readers asked for; returns ``(provider, registry, open prometheus server or None)``."""
    import prometheus_client
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    from ..exporters.metric_readers import otlp_reader, prometheus_reader
    from ..exporters.metrics import GoodputMetrics
    from .telemetry import SERVICE_NAME, add_serve_instruments

    registry = prometheus_client.CollectorRegistry()
    port = _port(str(args.prometheus_port), "--prometheus-port")
    reader, prom = prometheus_reader(port, args.prometheus_host, registry=registry)
    readers = [reader]
    if args.otlp_metrics_endpoint:
        readers.append(otlp_reader(args.otlp_metrics_endpoint, interval_s=_number(
            str(args.metrics_interval), "--metrics-interval")))
    provider = MeterProvider(metric_readers=readers,
                             resource=Resource.create({"service.name": SERVICE_NAME}))
    windows = tuple(_number(w, "--windows", 0) for w in args.windows.split(",") if w.strip())

    def jobs():
        for name in store.jobs():
            try:
                snap = store.snapshot_windows(name, windows)
            except KeyError:  # left meanwhile
                continue
            yield snap

    GoodputMetrics(jobs, provider, windows_s=windows, ideal_step_time_s=store.ideal_step_time_s)
    add_serve_instruments(provider.get_meter("goodput_serve"), store, budget)
    return provider, registry, prom


def _limits(args):
    from .limits import Limits

    try:
        return Limits(
            max_connections=int(_number(args.max_connections, "--max-connections")),
            max_inflight_bytes=int(_number(args.max_inflight_bytes, "--max-inflight-bytes")),
            max_message_bytes=int(_number(args.max_message_bytes, "--max-message-bytes")),
            request_timeout_s=_number(args.request_timeout, "--request-timeout"),
            max_jobs=int(_number(args.max_jobs, "--max-jobs")),
            max_jobs_per_client=(None if args.max_jobs_per_client is None else int(_number(
                args.max_jobs_per_client, "--max-jobs-per-client"))),
            idle_without_progress_s=_number(args.idle_without_progress,
                                            "--idle-without-progress", strict=False),
            max_custom_types=int(_number(args.max_custom_types, "--max-custom-types")),
            max_attribute_bytes=int(_number(args.max_attribute_bytes, "--max-attribute-bytes")),
            max_job_spans_per_s=_number(args.max_job_spans_per_second,
                                        "--max-job-spans-per-second"))
    except ValueError as e:
        from ..terminal import UsageError

        raise UsageError(str(e)) from e


def _workload(args, store, windows):
    """The publisher of mgm's Cloud Monitoring series asked for (None without a project)."""
    from ..terminal import UsageError

    if not args.workload_project:
        return None
    if not args.workload_location:
        raise UsageError("--workload-project needs --workload-location (the Workload "
                         "resource's location label, e.g. us-central2-b)")
    if not args.workload_accelerator_type:
        raise UsageError("--workload-project needs --workload-accelerator-type (the "
                         "accelerator_type label of every series, e.g. TPU-v5p): a "
                         "series without it is left out, so none would be written")
    from ..exporters.workload import WorkloadOptions
    from .gcm import WorkloadPublisher

    opts = WorkloadOptions(args.workload_project, args.workload_location,
                           args.workload_replica_id, args.workload_accelerator_type,
                           args.workload_cluster_name)
    return WorkloadPublisher(store, opts, interval_s=_number(args.workload_interval,
                                                             "--workload-interval"),
                             windows_s=windows, definitions=args.workload_definitions)


def _wal(args, receivers_on: bool):
    """The write-ahead log asked for (None with ``--wal-dir off`` or no receiver)."""
    from ..terminal import UsageError
    from .wal import WriteAheadLog

    if args.wal_dir.lower() == "off" or not receivers_on:
        return None
    fsync = _number(args.wal_fsync_interval, "--wal-fsync-interval", strict=False)
    try:
        return WriteAheadLog(args.wal_dir, fsync_interval_s=fsync)
    except OSError as e:
        raise UsageError(f"cannot use --wal-dir {args.wal_dir!r}: {e.strerror or e}") from e


def _spill(args, packing: bool):
    """Where packed rows go (None: in memory, with ``--spill-dir off`` or no packing)."""
    from ..terminal import UsageError
    from .spill import Spill

    if args.spill_dir.lower() == "off" or not packing:
        return None
    try:
        return Spill(None if args.spill_dir.lower() == "auto" else args.spill_dir)
    except OSError as e:
        raise UsageError(f"cannot use --spill-dir {args.spill_dir!r}: {e.strerror or e}") from e


def cmd_serve(args: argparse.Namespace) -> int:
    """Run ``goodput serve`` until SIGTERM/SIGINT; returns the exit status. Raises UsageError
    (printed as one line by ``goodput``) for a bad flag or config file, naming the flag (and
    the key and file when the config file set it), or a missing extra with its install line."""
    from ..terminal import UsageError
    from . import config, extras

    loaded = config.apply(args, add_serve_command) if args.config else None
    try:
        extras.require(args)
        return _serve(args, loaded)
    except UsageError as e:
        raise config.blame(e, loaded) from e


def _serve(args: argparse.Namespace, loaded) -> int:
    from ..terminal import UsageError

    try:
        from .server import GoodputServer
        from .store import LiveStore
    except ImportError as exc:
        raise UsageError(
            f"goodput serve needs the serve extra ({exc}): {install_hint('serve')}"
        ) from exc

    interval = None if args.report_interval is None else _number(args.report_interval,
                                                                  "--report-interval")
    ideal = None if args.ideal_step_time is None else _number(args.ideal_step_time,
                                                             "--ideal-step-time")
    timeout = _number(args.shutdown_timeout, "--shutdown-timeout")
    poll = _number(args.poll_interval, "--poll-interval")
    retention = (None if args.retention.lower() == "off"
                 else _number(args.retention, "--retention"))
    pack_after = (None if args.pack_after.lower() == "off"
                  else _number(args.pack_after, "--pack-after", strict=False))
    limits = _limits(args)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    grpc_port, http_port = _port(args.grpc_port, "--grpc-port"), _port(args.http_port,
                                                                        "--http-port")
    health_port = _port(args.health_port, "--health-port")
    if grpc_port is None and http_port is None and not args.spool_dir:
        raise UsageError("nothing to serve: both receivers are off and no --spool-dir given")
    wal = _wal(args, grpc_port is not None or http_port is not None)
    store = LiveStore(ideal, min_interval_s=min(interval or 1.0, 1.0), limits=limits, wal=wal,
                      retention_s=retention, pack_after_s=pack_after,
                      spill=_spill(args, pack_after is not None))
    token = _token(args, loaded.token if loaded is not None else None)
    reports = ReportWriter(args.format, args.report_file)
    holder: list = []  # the server, once started: its byte budget for the telemetry
    provider, registry, prom = _metrics(args, store, lambda: holder[0].budget if holder else None)

    def metrics_text():
        import prometheus_client

        return prometheus_client.generate_latest(registry), prometheus_client.CONTENT_TYPE_LATEST

    def retired(result):
        try:
            reports.write([result], final=True)  # (retirement is final: .slots)
        except Exception:  # noqa: BLE001 - a report that cannot be written is logged
            _log.exception("goodput serve: cannot write the final report of a retired job")

    try:
        server = GoodputServer(store, host=args.host, grpc_port=grpc_port, http_port=http_port,
                               spool_dirs=args.spool_dir or (), token=token,
                               tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
                               poll_s=poll, limits=limits, metrics=metrics_text,
                               on_retire=retired, health_port=health_port)
    except (OSError, RuntimeError) as e:
        provider.shutdown(timeout_millis=1000)
        if prom is not None:
            prom.shutdown()
        raise UsageError(f"cannot start: {e}") from e
    holder.append(server)
    windows = tuple(_number(w, "--windows", 0) for w in args.windows.split(",") if w.strip())
    try:
        publisher = _workload(args, store, windows)
    except BaseException:
        server.stop(1.0, final=False)
        raise
    if publisher is not None:
        publisher.start()
    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        where = " ".join(f"{k}={v}" for k, v in server.addresses().items())
        if prom is not None:
            where += f" prometheus=http://{hostport(args.prometheus_host, prom.server_port)}" \
                "/metrics"
        if wal is not None:
            r = store.replayed
            where += (f" wal={wal.root} (replayed {r.lines} lines of {len(store.jobs())} "
                      f"jobs in {r.seconds:.2f} s)")
        print(f"goodput serve: listening {where}".rstrip(), file=sys.stderr, flush=True)
        for line in warnings(args.host, token, _TOKEN_ENV, args.prometheus_host,
                             None if prom is None else prom.server_port):
            print(f"goodput serve: warning: {line}", file=sys.stderr, flush=True)
        while not stop.wait(interval or 3600):
            if interval:
                try:
                    reports.write(store.results())
                except Exception:  # noqa: BLE001 - the service carries on
                    _log.exception("goodput serve: writing the periodic report failed")
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if publisher is not None:
            publisher.stop(timeout / 4)
        final = server.stop(timeout)
        if final is not None:
            try:
                reports.write(final, final=True)
            except Exception:  # noqa: BLE001
                _log.exception("goodput serve: writing the final report failed")
        provider.shutdown(timeout_millis=timeout * 1000)
        if prom is not None:
            prom.shutdown()
        if store.spill is not None:
            store.spill.close()
    print("goodput serve: stopped" + ("" if final is not None else
                                      " (final report timed out)"), file=sys.stderr)
    return 0


def add_serve_command(subparsers) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "serve", help="live goodput from OTLP spans and spool files",
        description="Receive goodput spans over OTLP (gRPC and HTTP) and/or tail spool "
        "directories; account each job live, as `goodput report` does. Other tools' OTLP "
        "spans and log records (one-logger, Megatron-LM, torchft, ...) are read through "
        "the sources (`goodput import --help` lists them). Needs the serve "
        "extra: " + install_hint("serve") + ".",
        epilog="Example, one machine, no receiver: goodput serve --grpc-port off "
        "--http-port off --spool-dir goodput-runs/my-run --report-interval 10. "
        "Stop it with SIGTERM or Ctrl-C: it writes the final report. See "
        + doc_url("serve.md"))
    p.add_argument("--config", metavar="FILE", default=None,
                   help="read flags from this YAML file: keys are the flags below without "
                   "their dashes (max-jobs: 2000), flags given here win over it; an unknown "
                   "key or a bad value is an error: " + doc_url("serve.md", "Config file"))
    ing = p.add_argument_group("ingest", "Where serve listens and spans come in: the OTLP "
                               "receivers, the health port, the spool directories.")
    ing.add_argument("--host", default="127.0.0.1",
                     help="address to bind (default 127.0.0.1; 0.0.0.0 for all interfaces: "
                     "give a token, see security)")
    ing.add_argument("--grpc-port", default="4317", metavar="PORT",
                     help="OTLP/gRPC port: TraceService and LogsService (default 4317; 0: "
                     "any free port; off: no gRPC receiver)")
    ing.add_argument("--http-port", default="4318", metavar="PORT",
                     help="OTLP/HTTP (/v1/traces, /v1/logs), /v1/report and /metrics port "
                     "(default 4318; 0: any free port; off: no HTTP receiver)")
    ing.add_argument("--health-port", default="off", metavar="PORT",
                     help="/healthz and /readyz on a port of their own, on --host, which "
                     "ingest connections cannot starve: point liveness and readiness probes "
                     "at it (default off: answered on --http-port only; 0: any free port)")
    ing.add_argument("--spool-dir", action="append", metavar="DIR",
                     help="tail *.jsonl spool files under DIR (repeatable)")
    ing.add_argument("--poll-interval", default="0.5", metavar="SECONDS",
                     help="seconds between spool polls (default 0.5)")
    lim = p.add_argument_group(
        "limits", "Past one, a request gets the retryable status, or the job an over_limit "
        "warning: " + doc_url("serve.md", "Limits"))
    lim.add_argument("--max-message-bytes", default=str(16 << 20), metavar="N",
                     help="largest request accepted, after gzip (default 16777216)")
    lim.add_argument("--max-connections", default="256", metavar="N",
                     help="HTTP connections and gRPC calls served at once (default 256)")
    lim.add_argument("--max-inflight-bytes", default=str(256 << 20), metavar="N",
                     help="request bytes held in memory across all requests (default "
                     "268435456)")
    lim.add_argument("--request-timeout", default="30", metavar="SECONDS",
                     help="time a client may take to send one request (default 30)")
    lim.add_argument("--max-jobs", default="1000", metavar="N",
                     help="jobs tracked at once (default 1000)")
    lim.add_argument("--max-jobs-per-client", default=None, metavar="N",
                     help="jobs one client (peer address) may hold of --max-jobs (default: "
                     "half of --max-jobs)")
    lim.add_argument("--idle-without-progress", default="300", metavar="SECONDS",
                     help="when job slots are short, a job with no step yet leaves (final) "
                     "after SECONDS without spans (default 300)")
    lim.add_argument("--max-custom-types", default="64", metavar="N",
                     help="distinct custom badput types per job (default 64)")
    lim.add_argument("--max-attribute-bytes", default="1024", metavar="N",
                     help="longest string attribute kept, and longest job name (default 1024)")
    lim.add_argument("--max-job-spans-per-second", default="100000", metavar="N",
                     help="spans per second one job may send, over 10 s bursts (default "
                     "100000)")
    sto = p.add_argument_group("storage", "What is kept, where, and for how long: the "
                               "write-ahead log, retention, compaction.")
    sto.add_argument("--wal-dir", default="goodput-serve-wal", metavar="DIR",
                     help="write-ahead log: requests are appended here before they are "
                     "acknowledged and replayed at start (default ./goodput-serve-wal; off: "
                     "none; not used when both receivers are off)")
    sto.add_argument("--wal-fsync-interval", default="1", metavar="SECONDS",
                     help="fsync the log every SECONDS: a machine crash loses at most that "
                     "much acknowledged data; 0 = before every acknowledgement (default 1)")
    sto.add_argument("--retention", default="604800", metavar="SECONDS",
                     help="a job with no new span for SECONDS leaves: its final report is "
                     "written (report file, WAL_DIR/results) and its log removed (default "
                     "604800 = 7 days; off: never)")
    sto.add_argument("--pack-after", default="60", metavar="SECONDS",
                     help="a process with no new span for SECONDS (a finished attempt's) is "
                     "compacted: its rows packed, what the accounting keeps of it let go or "
                     "shared (default 60; off: never)")
    sto.add_argument("--spill-dir", default="auto", metavar="DIR",
                     help="compacted processes' packed rows are kept in files here, not in "
                     "memory, removed when their job leaves or the server stops (default "
                     "auto: a new directory under the system's temporary directory; off: in "
                     "memory)")
    pub = p.add_argument_group("publish", "The reports and the metrics: where they go and "
                               "how often.")
    pub.add_argument("--report-interval", default=None, metavar="SECONDS",
                     help="write the current report every SECONDS (default: only at exit)")
    pub.add_argument("--format", choices=("table", "json"), default="table",
                     help="report format: rich table or JSON lines (default table)")
    pub.add_argument("--report-file", metavar="PATH", default=None,
                     help="append reports to PATH instead of stdout")
    pub.add_argument("--ideal-step-time", metavar="SECONDS", default=None,
                     help="ideal step time in seconds (default: median of kept step times)")
    pub.add_argument("--shutdown-timeout", default="10", metavar="SECONDS",
                     help="bound on drain + final report at SIGTERM/SIGINT (default 10)")
    pub.add_argument("--prometheus-port", default="off", metavar="PORT",
                     help="also serve /metrics on PORT with NO token (0 = any free port; "
                     "default off); GET /metrics on the HTTP port always serves them, with "
                     "the token when one is set")
    pub.add_argument("--prometheus-host", default="127.0.0.1", metavar="ADDRESS",
                     help="address of --prometheus-port (default 127.0.0.1, whatever --host "
                     "is: this endpoint has no token; serve warns when it is beyond loopback)")
    pub.add_argument("--otlp-metrics-endpoint", default=None, metavar="HOST:PORT",
                     help="export the goodput metrics over OTLP/gRPC to this endpoint (needs "
                     "the otlp extra)")
    pub.add_argument("--metrics-interval", default="60", metavar="SECONDS",
                     help="OTLP metric export interval (default 60)")
    pub.add_argument("--windows", default="60,300,900", metavar="S,S,...",
                     help="rolling windows in seconds for the metrics (default 60,300,900)")
    gcm = p.add_argument_group(
        "publish: ml-goodput-measurement's Cloud Monitoring series",
        "The compute.googleapis.com/workload/* series, so that existing dashboards keep "
        "working (needs the gcp extra): " + doc_url("metrics.md",
                                                   "The incumbent's Cloud Monitoring series"))
    gcm.add_argument("--workload-project", metavar="PROJECT", default=None,
                     help="write them to this Google Cloud project (Application Default "
                     "Credentials); off without it")
    gcm.add_argument("--workload-location", metavar="ZONE", default=None,
                     help="the Workload resource's location label (GCPOptions' location)")
    gcm.add_argument("--workload-replica-id", default="0", metavar="ID",
                     help="the Workload resource's replica_id label (default 0)")
    gcm.add_argument("--workload-accelerator-type", default=None, metavar="TYPE",
                     help="the accelerator_type label (GCPOptions' acc_type, e.g. TPU-v5p); "
                     "required with --workload-project")
    gcm.add_argument("--workload-cluster-name", default=None, metavar="NAME",
                     help="a cluster_name label on every series")
    gcm.add_argument("--workload-definitions", choices=("mgm", "goodput"), default="mgm",
                     help="their numbers: ml-goodput-measurement's (default) or this "
                     "project's")
    gcm.add_argument("--workload-interval", default="60", metavar="SECONDS",
                     help="seconds between uploads (default 60)")
    sec = p.add_argument_group("security", "Who may send spans and read reports: keep serve "
                               "on loopback, or give a token and TLS: "
                               + doc_url("serve.md", "Security"))
    sec.add_argument("--token-file", metavar="PATH", default=None,
                     help=f"require 'Authorization: Bearer <token>' with the token in PATH "
                     f"(or in ${_TOKEN_ENV}, or the config file's token key)")
    sec.add_argument("--tls-cert", metavar="PEM", default=None, help="TLS certificate chain")
    sec.add_argument("--tls-key", metavar="PEM", default=None, help="TLS private key")
    p.set_defaults(func=cmd_serve)
    mark_defaults(p)  # last: a flag given on the command line is told from its default
    return p
