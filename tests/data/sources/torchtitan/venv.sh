#!/usr/bin/env bash
# Build the pinned torchtitan 0.3.0 environment the LIVE test of tests/importers/test_source_torchtitan.py
# and regenerate.py run in, without reinstalling torch: a tool venv whose .pth file appends
# the main environment's site-packages (torch 2.13.0+cpu comes from there; the tool's own
# pins win because they come first on sys.path).
#
# Usage: tests/data/sources/torchtitan/venv.sh [DIR]   (default .venvs/torchtitan)
# Then:  DIR/bin/python tests/data/sources/torchtitan/regenerate.py --workdir /tmp/tt-run \
#            --out tests/data/sources/torchtitan
# or:    TORCHTITAN_PYTHON=DIR/bin/python python -m pytest tests/importers/test_source_torchtitan.py
#
# Run it with the main environment active (its python3 has torch), or set MAIN_PY.
# Took 2 min 17 s on the shared 2-core machine of 2026-12-07 while two torchtitan runs went
# on (pip from PyPI; triton's wheel is the largest part).
set -euo pipefail
DIR=${1:-$(cd "$(dirname "$0")/../../../.." && pwd)/.venvs/torchtitan}
MAIN_PY=${MAIN_PY:-python3}   # the main environment's python (it has torch)

MAIN_SITE=$("$MAIN_PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
python3 -m venv "$DIR"
SITE=$("$DIR/bin/python" -c 'import site; print(site.getsitepackages()[0])')
echo "$MAIN_SITE" > "$SITE/zz_main_env.pth"

# torchtitan itself without its dependencies (they would pull torch and wandb).
"$DIR/bin/pip" install -q --no-deps torchtitan==0.3.0
# What it imports at import time: triton (no GPU needed to import it), the packages that
# depend on torch (--no-deps), then the pure-Python ones with their own dependencies.
"$DIR/bin/pip" install -q --no-deps triton==3.8.0 torchdata==0.11.0 spmd_types==0.2.3 \
    torch_checkpointing==0.1.1
"$DIR/bin/pip" install -q tyro==1.0.17 einops==0.8.2 safetensors==0.8.0 tokenizers==0.23.3 \
    datasets==4.7.0
"$DIR/bin/python" -c 'import torchtitan.train, torch; print("torchtitan ok, torch", torch.__version__)'
