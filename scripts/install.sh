#!/usr/bin/env bash
# Install eagle3-tui with the CPU training stack, for the demo and the tests.
#
#   ./scripts/install.sh          eagle3-tui + torch (CPU) + speculators
#   ./scripts/install.sh --test   the same, plus the test tools
#
# Where it installs: the active virtual environment (venv, virtualenv, conda) when
# there is one; otherwise a project environment, .venv/ in the clone, created with
# python3 (a stock Debian/Ubuntu python3 refuses `pip install` outside one: PEP 668).
# scripts/in-env runs a command in that same environment.
#
# A laptop that only monitors needs `pip install .` alone (no torch). A GPU
# training host wants `pip install '.[train]'`, which lets speculators pull the
# CUDA torch it needs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
extra=""
[ "${1:-}" = "--test" ] && extra="[test]"

# shellcheck source=scripts/project-env.sh
. "$root/scripts/project-env.sh"
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
elif active_env; then
    PY=python3
else
    base=${EAGLE3_TUI_BASE_PYTHON:-python3}
    command -v "$base" >/dev/null || { echo "install.sh: no $base on PATH" >&2; exit 2; }
    if ! "$base" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "install.sh: eagle3-tui needs Python 3.11 or newer; $base is $("$base" -V 2>&1)" >&2
        exit 2
    fi
    if [ ! -x "$PROJECT_VENV/bin/python" ]; then
        echo "install.sh: no virtual environment is active; creating $PROJECT_VENV" >&2
        if ! "$base" -m venv "$PROJECT_VENV"; then
            rm -rf "$PROJECT_VENV"
            echo "install.sh: '$base -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2
            exit 2
        fi
    fi
    PY=$PROJECT_VENV/bin/python
fi

pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

# torch first, so nothing below pulls a multi-GB CUDA build.
if ! "$PY" -c "import torch" 2>/dev/null; then
    pip_install torch==2.13.0
fi
for bad in torchvision torchaudio; do
    if "$PY" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('$bad') is None)"; then
        echo "install.sh: warning: $bad is installed; beside a CPU torch it breaks 'import speculators.train'" >&2
    fi
done
pip_install -r requirements/speculators-cpu.txt
pip_install --no-deps speculators==0.9.0
pip_install -e ".$extra"
echo "install.sh: done ($("$PY" -m eagle3_tui --version), $("$PY" -c 'import sys; print(sys.prefix)'))"
