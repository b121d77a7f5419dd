"""What ``goodput serve`` lets other machines reach without a token: the warnings it prints
at start (issue 38).

- The receivers bound beyond loopback (``--host``) with no token: anyone who reaches the
  ports can send spans and read every job's report.
- ``--prometheus-port``'s ``/metrics`` (never behind the token) bound beyond loopback
  (``--prometheus-host``, default ``127.0.0.1`` whatever ``--host`` is): anyone who reaches
  it reads every job's name and goodput.
"""

from __future__ import annotations

import ipaddress

__all__ = ["hostport", "loopback", "warnings"]


def loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or name (only this machine can connect)."""
    if host.strip().lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def hostport(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def warnings(host: str, token: str | None, token_env: str, prometheus_host: str,
             prometheus_port: int | None) -> list[str]:
    """The warning lines (without the ``goodput serve: warning:`` prefix) for receivers bound
    on ``host`` with ``token`` (None: none), and the open ``/metrics`` on
    ``prometheus_host:prometheus_port`` (port None: not served)."""
    out = []
    if not loopback(host) and token is None:
        out.append(f"listening on {host} (beyond this machine) without a token: anyone who "
                   "reaches the port can send spans and read every job's report; give "
                   f"--token-file or ${token_env} (and --tls-cert/--tls-key)")
    if prometheus_port is not None and not loopback(prometheus_host):
        where = hostport(prometheus_host, prometheus_port)
        out.append(f"--prometheus-port serves /metrics on {where} "
                   "(beyond this machine) with no token: anyone who reaches it reads every "
                   "job's name and goodput; keep that port inside (a firewall, a "
                   "NetworkPolicy), or scrape GET /metrics on the HTTP port with the token")
    return out
