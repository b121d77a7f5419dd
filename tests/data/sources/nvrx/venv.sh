#!/usr/bin/env bash
# Builds the NVRx tool environment for tests/importers/test_source_nvrx.py's live test and
# regenerate.py: nvidia-resiliency-ext 0.7.0 in a Python 3.11 venv, torch (and goodput) from
# the main environment through a .pth file (the tool's own pins win: its site-packages come
# first on sys.path).
#
#   . .venv/bin/activate               # the main environment: torch 2.13.0 CPU, goodput
#   bash tests/data/sources/nvrx/venv.sh [DIR]      # DIR default: $NVRX_VENV or .venvs/nvrx
#
# pip cannot install nvidia-resiliency-ext 0.7.0 on Python 3.11 / glibc 2.36: PyPI has only
# cp312/cp314 wheels for manylinux_2_39. Its Python code runs on 3.11 (its one extension,
# nvrx_cupti_module, is CUDA profiling, never imported by the launcher), so the cp312 wheel
# is downloaded and unpacked, and its declared dependencies (METADATA Requires-Dist, less
# torch and the "attribution" extra) are installed by pip.
# Took 54 s in all on this 2-core VM (shared with other jobs; PyPI cache warm).
set -euo pipefail
DIR=${1:-${NVRX_VENV:-$(cd "$(dirname "$0")/../../../.." && pwd)/.venvs/nvrx}}
MAIN_PY=${MAIN_PY:-python}
MAIN_SITE=$("$MAIN_PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
"$MAIN_PY" -m venv "$DIR"
"$DIR/bin/pip" install -q defusedxml 'fastapi>=0.100.0' 'grpcio>=1.76.0,<2' \
    'grpcio-tools>=1.76.0,<2' 'httpx>=0.24.0' 'numpy>=1.26' 'nvidia-ml-py>=12.570.86' \
    packaging 'protobuf>=4.22.0' 'psutil>=6.0.0' 'pydantic>=2' 'pydantic-settings>=2' pyyaml \
    'slowapi>=0.1.9' 'uvicorn[standard]>=0.20.0'
TMP=$(mktemp -d)
"$DIR/bin/pip" download -q --python-version 3.12 --platform manylinux_2_39_x86_64 \
    --only-binary=:all: --no-deps nvidia-resiliency-ext==0.7.0 -d "$TMP"
SITE=$("$DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
(cd "$TMP" && "$DIR/bin/python" -m zipfile -e nvidia_resiliency_ext-0.7.0-*.whl unpacked)
cp -r "$TMP/unpacked/nvidia_resiliency_ext" "$TMP/unpacked/nvidia_resiliency_ext-0.7.0.dist-info" "$SITE/"
# the main environment's site-packages after the tool's own (site.addsitedir also runs its
# .pth files: the editable goodput install)
echo "import site; site.addsitedir('$MAIN_SITE')" > "$SITE/zz_main_env.pth"
rm -rf "$TMP"
"$DIR/bin/python" -c 'import torch, goodput, nvidia_resiliency_ext.fault_tolerance.launcher; print("ok: torch", torch.__version__)'
