#!/bin/sh
# Build the one-logger tool venv for tests/importers/test_source_onelogger.py's live test and
# regenerate.py. torch and opentelemetry come from the main environment through a .pth
# (appended to sys.path, so this venv's own pins win). Pins: nv-one-logger-* 2.3.1 and
# lightning 2.5.6 (Lightning 2.6 breaks the integration's import), with --no-deps so that
# torch is not reinstalled; overrides, toml and StrEnum are one-logger's small dependencies
# missing from the main environment (pydantic, fsspec, lightning-utilities, torchmetrics,
# opentelemetry-sdk 1.45.2 are taken from there).
# Took 10 s on a quiet 2-core VM, 72 s on a loaded one (pip from the local index; 2026-12-07).
# Usage: sh venv.sh [DIR] [MAIN_PYTHON]   (defaults: .venvs/onelogger, python3)
set -eu
DIR=${1:-$(cd "$(dirname "$0")/../../../.." && pwd)/.venvs/onelogger}
MAIN_PY=${2:-python3}
python3 -m venv "$DIR"
"$DIR/bin/pip" install -q --no-deps nv-one-logger-core==2.3.1 nv-one-logger-otel==2.3.1 \
    nv-one-logger-training-telemetry==2.3.1 \
    nv-one-logger-pytorch-lightning-integration==2.3.1 lightning==2.5.6 \
    overrides==7.7.0 toml==0.10.2 StrEnum==0.5.0
MAIN_SITE=$("$MAIN_PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
SITE=$("$DIR/bin/python" -c 'import site; print(site.getsitepackages()[0])')
echo "import sys; sys.path.append('$MAIN_SITE')" > "$SITE/zz_main_env.pth"
"$DIR/bin/python" -c 'import lightning, nv_one_logger.otel.exporter.otel_exporter, nv_one_logger.training_telemetry.integration.pytorch_lightning; print("one-logger venv ok, lightning", lightning.__version__)'
