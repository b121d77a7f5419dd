"""goodput serve SIGKILLed 20 times at random moments while 4 real training processes
export to it over OTLP/gRPC (the SDK exporter with its retries): after the last restart,
its write-ahead log holds every span of the processes' spools and its report equals
``goodput report`` of those spools (``benchmarks/serve_chaos.py``)."""

from __future__ import annotations

import pytest
from instr_util import load_benchmark

pytest.importorskip("grpc")
pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
chaos = load_benchmark("serve_chaos")


def test_twenty_kills_lose_nothing_acknowledged(tmp_path):
    s = chaos.run(kills=20, procs=4, seed=7, base=tmp_path)
    print(s)
    assert s["serve_starts"] == 21 and s["flushed"]
    assert s["missing_from_wal"] == 0 and s["extra_in_wal"] == 0, s
    assert s["spool_spans"] > 4 * 100  # the processes really trained meanwhile
    assert s["report_fields_differing"] == [], s
    assert s["steps_reported"] == s["steps_in_spools"] and s["ok"]
