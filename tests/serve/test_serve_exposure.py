"""``goodput serve`` says at start when it listens beyond this machine without a token
(issue 38: ``--host 0.0.0.0`` without a token gave no warning)."""

from __future__ import annotations

from deploy_util import Serve


def _warned(workdir, *args: str) -> bool:
    workdir.mkdir(exist_ok=True)
    serve = Serve(workdir, "--grpc-port", "0", "--http-port", "0", *args)
    serve.stop()  # every line it wrote at start is in the log once it has exited
    return "without a token" in serve.log.read_text()


def test_all_interfaces_without_a_token_is_warned(tmp_path):
    assert _warned(tmp_path, "--host", "0.0.0.0")


def test_loopback_or_a_token_is_not(tmp_path):
    assert not _warned(tmp_path / "loopback")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    assert not _warned(tmp_path / "token-file", "--host", "0.0.0.0", "--token-file", str(token))
