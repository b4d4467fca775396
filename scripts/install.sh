#!/usr/bin/env bash
# Install eagle3-tui with the CPU training stack, for the demo and the tests.
#
#   ./scripts/install.sh          eagle3-tui + torch (CPU) + speculators
#   ./scripts/install.sh --test   the same, plus the test tools
#
# A laptop that only monitors needs `pip install .` alone (no torch). A GPU
# training host wants `pip install '.[train]'`, which lets speculators pull the
# CUDA torch it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extra=""
[ "${1:-}" = "--test" ] && extra="[test]"

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
echo "install.sh: done ($("$PY" -m eagle3_tui --version))"
