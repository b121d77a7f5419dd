"""``goodput serve``'s flags in groups and in a config file, its missing extras named at
start, and its token-free ``--prometheus-port`` on loopback unless asked (issue 38, items 7
and 9).

The servers are real ``goodput serve`` processes; what a config file sets is checked by its
effect (a port not opened, a request refused for the file's size limit, the file's token
required, the address a port answers on). 127.0.0.2 is a loopback address too, but a socket
bound to 127.0.0.1 does not answer on it: a port that answers there is bound to all
interfaces.
"""

from __future__ import annotations

import re
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from deploy_util import Serve, get

from goodput_processor.cli import build_parser, main
from goodput_processor.serve import config
from goodput_processor.serve.command import add_serve_command

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "serve-config.yaml"
GROUPS = ("ingest", "limits", "storage", "publish", "security")


def _flags() -> set[str]:
    parser = build_parser()
    top = set(vars(parser.parse_args([])))
    return {"--" + d.replace("_", "-") for d in vars(parser.parse_args(["serve"]))
            if d not in top and d != "func"}


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError:
        return False
    return True


def _port(url: str) -> int:
    return urllib.parse.urlsplit(url).port


def _write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_help_puts_every_flag_in_a_group(capsys):
    assert main(["serve", "--help"]) == 0
    text = capsys.readouterr().out
    section, where = None, {}
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            section = line[:-1]
        m = re.match(r"  (--[a-z0-9-]+)", line)
        if m and section is not None:
            where[m.group(1)] = section
    flags = _flags()
    assert flags <= set(where), flags - set(where)
    assert {f for f, s in where.items() if s == "options"} == {"--config"}  # and -h
    assert {s.split(":")[0] for f, s in where.items() if f in flags - {"--config"}} == set(GROUPS)
    assert where["--max-jobs"] == "limits" and where["--wal-dir"] == "storage"
    assert where["--token-file"] == "security" and where["--host"] == "ingest"
    assert where["--prometheus-host"] == where["--prometheus-port"] == "publish"


def test_config_file_sets_flags_and_the_command_line_wins(tmp_path):
    conf = _write(tmp_path / "serve.yaml", "host: 0.0.0.0\ngrpc-port: 0\nhttp_port: 0\n"
                  "wal-dir: off\nmax-message-bytes: 1000\nprometheus-port: 0\n"
                  "token: s3cret\n")
    serve = Serve(tmp_path, "--config", str(conf), "--grpc-port", "off")
    try:
        assert "grpc" not in serve.addrs  # the command line's off won over the file's 0
        assert "wal" not in serve.addrs  # the file's wal-dir: off
        http = _port(serve.addrs["http"])
        body = urllib.request.Request(f"http://127.0.0.1:{http}/v1/traces", data=b"\0" * 2000,
                                      headers={"Content-Type": "application/x-protobuf",
                                               "Authorization": "Bearer s3cret"})
        with pytest.raises(urllib.error.HTTPError) as big:
            urllib.request.urlopen(body, timeout=10)
        assert big.value.code == 413  # the file's max-message-bytes
        with pytest.raises(urllib.error.HTTPError) as anon:
            get(f"http://127.0.0.1:{http}/v1/report")
        assert anon.value.code == 401  # the file's token
        assert '"jobs"' in get(f"http://127.0.0.2:{http}/v1/report?limit=1", token="s3cret")
        # the file's host 0.0.0.0 opened the receiver on 127.0.0.2; the open /metrics is on
        # 127.0.0.1 only
        prom = _port(serve.addrs["prometheus"])
        assert urllib.parse.urlsplit(serve.addrs["prometheus"]).hostname == "127.0.0.1"
        assert _answers("127.0.0.1", prom) and not _answers("127.0.0.2", prom)
    finally:
        serve.stop()
    assert "warning" not in serve.log.read_text()  # the file's token counts as a token


def test_prometheus_host_beyond_loopback_is_warned(tmp_path):
    serve = Serve(tmp_path, "--grpc-port", "off", "--http-port", "0", "--wal-dir", "off",
                  "--prometheus-port", "0", "--prometheus-host", "0.0.0.0")
    try:
        prom = _port(serve.addrs["prometheus"])
        assert "goodput_serve" in get(f"http://127.0.0.2:{prom}/metrics")
    finally:
        serve.stop()
    (line,) = [s for s in serve.log.read_text().splitlines() if "warning" in s]
    assert "--prometheus-port serves /metrics on 0.0.0.0" in line and "no token" in line


@pytest.mark.parametrize("text, fragments", [
    ("max-jobz: 5\n", ["unknown key 'max-jobz'", "did you mean max-jobs"]),
    ("max-jobs: abc\n", ["--max-jobs must be a number", "set by max-jobs in"]),
    ("format: xml\n", [": format: argument --format: invalid choice: 'xml'"]),
    ("host: [a, b]\n", [": host: --host takes one value, not a list"]),
    ("max-jobs: true\n", [": max-jobs: true is not a value of --max-jobs"]),
    ("limits:\n  max-jobs: 5\n", ["unknown key 'limits'", "at the top level"]),
    ("- max-jobs\n", ["must be a mapping of flag names to values"]),
    ("max-jobs: [5\n", ["is not YAML (line"]),
    ("config: other.yaml\n", [": config: a config file cannot name another"]),
    ("token-file: t\ntoken: s3cret\n", ["give token-file or token, not both"]),
])
def test_a_bad_config_file_names_the_key_and_the_file(tmp_path, monkeypatch, capsys, text,
                                                      fragments):
    monkeypatch.chdir(tmp_path)
    conf = _write(tmp_path / "serve.yaml", text)
    assert main(["serve", "--config", str(conf), "--wal-dir", "off"]) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert err.startswith("goodput: error: ") and str(conf) in err, err
    for fragment in fragments:
        assert fragment in err, err


def test_a_token_in_a_file_others_can_read_is_refused(tmp_path, capsys):
    conf = _write(tmp_path / "serve.yaml", "token: s3cret\n", mode=0o644)
    assert main(["serve", "--config", str(conf)]) == 2
    err = capsys.readouterr().err
    assert "other users can read or write it (mode 0644)" in err and f"chmod 600 {conf}" in err
    assert "s3cret" not in err


def test_the_command_line_wins_over_a_bad_file_value(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    conf = _write(tmp_path / "serve.yaml", "max-jobs: 10\nmax-connections: abc\n")
    # the file's bad max-connections is overridden; the command line's own bad value is not
    # blamed on the file
    assert main(["serve", "--config", str(conf), "--max-connections", "0"]) == 2
    err = capsys.readouterr().err
    assert "--max-connections must be a number > 0, got '0'" in err and "set by" not in err


def test_the_example_config_file_is_valid():
    args = build_parser().parse_args(["serve", "--config", str(EXAMPLE)])
    loaded = config.apply(args, add_serve_command)
    assert args.wal_dir == "/var/lib/goodput/wal" and args.prometheus_port == "off"
    assert args.host == "0.0.0.0" and args.token_file == "/etc/goodput/token"
    assert len(loaded.sources) >= 20


def test_missing_extras_are_named_with_their_install_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    conf = _write(tmp_path / "serve.yaml", "wal-dir: off\n")
    monkeypatch.setitem(sys.modules, "yaml", None)
    assert main(["serve", "--config", str(conf)]) == 2
    err = capsys.readouterr().err
    assert "needs PyYAML" in err and "pip install '.[serve]'" in err
    monkeypatch.delitem(sys.modules, "yaml")
    for module in ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
                   "google.cloud.monitoring_v3"):
        monkeypatch.setitem(sys.modules, module, None)
    assert main(["serve", "--config", str(conf), "--otlp-metrics-endpoint", "127.0.0.1:9",
                 "--workload-project", "p"]) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert "the otlp extra for --otlp-metrics-endpoint" in err
    assert "the gcp extra for --workload-project" in err
    assert "pip install '.[otlp,gcp]'" in err and "Traceback" not in err
