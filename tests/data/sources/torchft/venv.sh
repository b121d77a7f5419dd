#!/bin/sh
# The tool venv for torchft 0.2.0 (tests/importers/test_source_torchft.py's live test, regenerate.py).
# torchft 0.2.0 needs opentelemetry 1.39.1: with 1.45, `import torchft` fails under
# TORCHFT_USE_OTEL=true (TeeLogExporter lacks force_flush). torch is NOT reinstalled: a .pth
# appends the main environment's site-packages (torch 2.13.0 CPU there), so the venv's own
# pins win. importlib_metadata/zipp: opentelemetry-api 1.39.1 imports them; the main env has
# none. Took 13 s (pip, from PyPI) + 2 s on a 2-core VM.
# Usage: sh venv.sh [DIR] (default .venvs/torchft), with the main env's python on PATH.
set -eu
DIR=${1:-$(cd "$(dirname "$0")/../../../.." && pwd)/.venvs/torchft}
MAIN=$(python -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
python3 -m venv "$DIR"
"$DIR/bin/pip" install -q --no-deps torchft==0.2.0 \
  opentelemetry-api==1.39.1 opentelemetry-sdk==1.39.1 \
  opentelemetry-exporter-otlp-proto-http==1.39.1 \
  opentelemetry-exporter-otlp-proto-common==1.39.1 opentelemetry-proto==1.39.1 \
  opentelemetry-semantic-conventions==0.60b1 importlib_metadata==8.7.0 zipp==3.23.0
SP=$("$DIR/bin/python" -c 'import site; print(site.getsitepackages()[0])')
echo "$MAIN" > "$SP/zz_main_env.pth"
"$DIR/bin/python" -c 'import torch, torchft; print("torchft ok, torch", torch.__version__)'
