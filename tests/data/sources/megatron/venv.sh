#!/usr/bin/env bash
# Build the environment tests/importers/test_source_megatron.py's live test runs Megatron-LM in.
#
#   tests/data/sources/megatron/venv.sh [VENV_DIR]        (default .venvs/megatron)
#
# - Python 3.11 venv; torch, the OTel SDK (1.45.2) and the rest come from the main
#   environment through a .pth file (no torch reinstall).
# - nemo-lens 0.1.0 from PyPI, --no-deps --ignore-requires-python (it declares Python >= 3.13
#   but is pure Python): its one line of 3.12 syntax, `type ExportStrategy = ...` in
#   nemo/lens/strategies.py, is patched to a plain assignment (the same alias at runtime).
# - Megatron-LM main at the pinned commit (regenerate.py's MEGATRON_LM_COMMIT): only its
#   megatron/ tree, put on the path by a .pth file. Taken from $MEGATRON_LM_GIT (a clone or
#   bare mirror) when set, else cloned from GitHub.
# The CPU shims (typing.override, a triton stub) are applied by cpu_shims.py at run time.
#
# Took 9 s on an idle machine, 75 s on a loaded 2-core one (nemo-lens from PyPI,
# Megatron-LM from a local mirror; a GitHub clone adds its download); the live test then
# runs about 80 s on a loaded 2-core machine.
set -euo pipefail
VENV=${1:-$(cd "$(dirname "$0")/../../../.." && pwd)/.venvs/megatron}
HERE=$(cd "$(dirname "$0")" && pwd)
COMMIT=$(sed -n 's/^MEGATRON_LM_COMMIT = "\([0-9a-f]*\)"/\1/p' "$HERE/regenerate.py")
MAIN_PY=${MAIN_PY:-python3}

python3 -m venv "$VENV"
SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
MAIN_SP=$("$MAIN_PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$MAIN_SP" > "$SP/zz_main_env.pth"

"$VENV/bin/pip" install --no-deps --ignore-requires-python nemo-lens==0.1.0
sed -i 's/^type ExportStrategy = /ExportStrategy = /' "$SP/nemo/lens/strategies.py"

SRC="$VENV/src/Megatron-LM"
rm -rf "$SRC" && mkdir -p "$SRC"
if [ -n "${MEGATRON_LM_GIT:-}" ]; then
  git --git-dir="$MEGATRON_LM_GIT" archive "$COMMIT" megatron | tar -x -C "$SRC" \
    || git -C "$MEGATRON_LM_GIT" archive "$COMMIT" megatron | tar -x -C "$SRC"
else
  TMP=$(mktemp -d)
  git clone --filter=blob:none --no-checkout https://github.com/NVIDIA/Megatron-LM.git "$TMP/m"
  git -C "$TMP/m" archive "$COMMIT" megatron | tar -x -C "$SRC"
  rm -rf "$TMP"
fi
echo "$SRC" > "$SP/megatron_lm.pth"
"$VENV/bin/python" -c "import nemo.lens, importlib.util as u; assert u.find_spec('megatron'); print('megatron venv ok')"
