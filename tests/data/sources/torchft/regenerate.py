"""Regenerate this directory's test data from a real torchft 0.2.0 run on CPU.

    python tests/data/sources/torchft/regenerate.py   (main env; the tool venv of venv.sh)

What it runs (``run_torchft.run``): torchft's own lighthouse (``torchft_lighthouse
--min_replicas 1 --join_timeout_ms 1000 --heartbeat_timeout_ms 2000 --quorum_tick_ms
100``) and two replica groups (``replica.py``: Manager, OptimizerWrapper,
ProcessGroupGloo, ``Manager.allreduce``; a 8-16-2 MLP, SGD, 0.25 s of work a step),
``TORCHFT_USE_OTEL=true``, ``JOB_ID=torchft-demo``, the ``torchft_*`` loggers at INFO.
Replica 1 is SIGKILLed inside its step after committing step 12 and started again 1 s
later; it heals from replica 0; both stop 8 steps after it committed again. Pins:
torchft 0.2.0, opentelemetry-sdk/-exporter-otlp-proto-http 1.39.1, torch 2.13.0 (CPU).
CPU shims: none (gloo on CPU is torchft's own path); torchft's DistributedDataParallel is
not used (its comm hook asserts when a peer dies: see replica.py).

A second run SIGKILLs replica 0 instead (the primary of its quorum: the lowest process
index), kept in ``kill-primary/`` as OTLP JSON lines only (no ``.pb``), with its truth.

Kept here: ``requests/NNNN.pb`` (each OTLP/HTTP body torchft sent, as received),
``otlp-logs.jsonl`` (the same requests as OTLP JSON lines, ``json_format.MessageToJson``),
``truth-r0.jsonl``/``truth-r1.jsonl`` (each replica's fsync'd steps) and ``driver.jsonl``
(the kill and the restart). Each run takes about 80 s on a loaded 2-core VM.
"""

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run_torchft import requests_to_jsonl, run, truth, venv_ok  # noqa: E402


def main() -> None:
    why = venv_ok()
    if why:
        sys.exit(why)
    with tempfile.TemporaryDirectory() as tmp:
        print(run(tmp))
        shutil.rmtree(HERE / "requests", ignore_errors=True)
        shutil.copytree(Path(tmp) / "requests", HERE / "requests")
        for name in ("truth-r0.jsonl", "truth-r1.jsonl", "driver.jsonl"):
            shutil.copy(Path(tmp) / name, HERE / name)
    print(requests_to_jsonl(HERE / "requests", HERE / "otlp-logs.jsonl"), "log records")
    print(truth(HERE))
    primary = HERE / "kill-primary"
    with tempfile.TemporaryDirectory() as tmp:
        print(run(tmp, kill_replica=0))
        primary.mkdir(exist_ok=True)
        for name in ("truth-r0.jsonl", "truth-r1.jsonl", "driver.jsonl"):
            shutil.copy(Path(tmp) / name, primary / name)
        print(requests_to_jsonl(Path(tmp) / "requests", primary / "otlp-logs.jsonl"),
              "log records")
    print(truth(primary))


if __name__ == "__main__":
    main()
