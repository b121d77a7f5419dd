"""Probes of ``goodput serve`` while idle connections hold every ingest slot.

    python benchmarks/serve_health.py [--idle-health 1000] [--probes 100]

Starts a real :class:`~goodput_processor.serve.GoodputServer` on loopback with the default
limits and a health port (``health_port=0``), holds ``--max-connections`` (256) idle
connections to the OTLP/HTTP port and ``--idle-health`` idle connections to the health
port, then probes: ``/healthz`` on the OTLP/HTTP port (20 times), ``/healthz`` on the
health port (``--probes`` times) and ``/readyz`` there (20 times). Prints the answers by
status (``reset``: the connection was closed before an answer). Exit status 1 unless every
probe of the health port got 200.
"""

from __future__ import annotations

import argparse
import resource
import socket
import sys
import urllib.error
import urllib.request

from goodput_processor.serve import GoodputServer, LiveStore


def _address(url: str) -> tuple[str, int]:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    return host, int(port)


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return "reset"


def _count(answers: list) -> dict:
    return {str(s): answers.count(s) for s in sorted(set(answers), key=str)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--idle-health", type=int, default=1000,
                   help="idle connections held to the health port (default 1000)")
    p.add_argument("--probes", type=int, default=100, help="health port probes (default 100)")
    args = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * (256 + args.idle_health) + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    srv = GoodputServer(LiveStore(), grpc_port=None, http_port=0, health_port=0)
    where, held = srv.addresses(), []
    try:
        cap = srv.limits.max_connections
        held += [socket.create_connection(_address(where["http"])) for _ in range(cap)]
        ingest = [_get(where["http"] + "/healthz") for _ in range(20)]
        held += [socket.create_connection(_address(where["health"]))
                 for _ in range(args.idle_health)]
        health = [_get(where["health"] + "/healthz") for _ in range(args.probes)]
        ready = [_get(where["health"] + "/readyz") for _ in range(20)]
    finally:
        for s in held:
            s.close()
        srv.stop(5, final=False)
    print(f"idle connections: {cap} to the OTLP/HTTP port (--max-connections), "
          f"{args.idle_health} to the health port")
    print(f"OTLP/HTTP port /healthz: {_count(ingest)}")
    print(f"health port /healthz: {_count(health)}  /readyz: {_count(ready)}")
    return 0 if set(health) | set(ready) == {200} else 1


if __name__ == "__main__":
    sys.exit(main())
