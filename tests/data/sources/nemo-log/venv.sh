#!/usr/bin/env bash
# The pinned environment that regenerate.py runs in (took 88 s on the 2-core VM):
# DLLogger is not on PyPI (the "nvidia-dllogger" there is a placeholder that warns), so it
# is installed from a checkout of NVIDIA/dllogger at 0478734ff7be75adde8d160e04872664d1c62e5f;
# NeMo is not installed at all (regenerate.py lays out its three pinned files itself, from
# a NeMo git checkout given with --nemo-repo). torch 2.13.0 and Lightning 2.6.6 come from
# the main environment through a .pth file.
#   usage: venv.sh DLLOGGER_GIT_DIR [VENV_DIR]
set -euo pipefail
DLL_REPO=${1:?a git clone or mirror of NVIDIA/dllogger}
VENV=${2:-$(cd "$(dirname "$0")/../../../.." && pwd)/.venvs/dllogger}
MAIN_PY=${MAIN_PY:-python3}
python3 -m venv "$VENV"
SRC=$(mktemp -d)
git -C "$DLL_REPO" archive 0478734ff7be75adde8d160e04872664d1c62e5f | tar -x -C "$SRC"
"$VENV/bin/pip" install -q omegaconf==2.3.0 "$SRC"
MAIN_SP=$("$MAIN_PY" -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$MAIN_SP" > "$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')/zz_main_env.pth"
"$VENV/bin/python" -c 'import dllogger, omegaconf, lightning, torch; print("ok", lightning.__version__, torch.__version__)'
