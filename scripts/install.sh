#!/usr/bin/env bash
# Install eagle3-tui with the CPU training stack, for the demo and the tests.
#
#   ./scripts/install.sh          eagle3-tui + torch (CPU) + speculators
#   ./scripts/install.sh --test   the same, plus the test tools
#   --allow-cuda                  take torch as the package index offers it, CUDA build too
#
# torch comes first, and only as a CPU build unless told: where the package index
# offers the CUDA build (nvidia-* packages, several GB), install.sh says so and stops,
# with how to get the CPU build instead.
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
allow_cuda=${EAGLE3_TUI_ALLOW_CUDA_TORCH:-}
for arg in "$@"; do
    case "$arg" in
        --test) extra="[test]" ;;
        --allow-cuda) allow_cuda=1 ;;
        *) echo "usage: scripts/install.sh [--test] [--allow-cuda]" >&2; exit 2 ;;
    esac
done

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

# torch first, so nothing below pulls a multi-GB CUDA build. Ask pip what it would take
# (a dry run): the CUDA build brings nvidia-* packages, several GB; never take it unasked.
cuda_packages() {
    local report
    report=$(mktemp)
    if ! "$PY" -m pip install --disable-pip-version-check -q --dry-run --report "$report" \
        torch==2.13.0 >/dev/null 2>&1; then
        rm -f "$report"
        return 1
    fi
    "$PY" - "$report" <<'PYEOF'
import json, sys
names = [i["metadata"]["name"] for i in json.load(open(sys.argv[1])).get("install", [])]
print(" ".join(n for n in names if n.lower().startswith(("nvidia-", "triton"))))
PYEOF
    rm -f "$report"
}
if ! "$PY" -c "import torch" 2>/dev/null; then
    if cuda=$(cuda_packages) && [ -n "$cuda" ] && [ -z "$allow_cuda" ]; then
        n=$(wc -w <<<"$cuda")
        echo "install.sh: your package index offers torch 2.13.0 as its CUDA build: pip would" >&2
        echo "  download it and $n nvidia/triton package(s) with it ($cuda): several GB." >&2
        echo "  For the CPU build (what the demo and the tests need), give pip PyTorch's CPU" >&2
        echo "  wheel index (pytorch.org, Get Started, Compute Platform: CPU) and run again:" >&2
        echo "    PIP_EXTRA_INDEX_URL=<that index> ./scripts/install.sh $*" >&2
        echo "  or take the CUDA build as it is: ./scripts/install.sh --allow-cuda $*" >&2
        exit 3
    fi
    [ -n "$allow_cuda" ] && echo "install.sh: installing torch 2.13.0 as the index offers it" \
        "(the CUDA build: several GB)" >&2
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
# An editable install leaves its sources uncompiled (pip compiles only what it copies):
# where PYTHONDONTWRITEBYTECODE is set (container images set it) every eagle3-tui process
# would compile the package again (~0.2 s of a core per command). Compiled once here.
"$PY" -m compileall -q eagle3_tui train >/dev/null || true
prefix=$("$PY" -c 'import sys; print(sys.prefix)')
echo "install.sh: done ($("$PY" -m eagle3_tui --version), $prefix)"
if ! active_env; then
    echo "install.sh: eagle3-tui is in $prefix, not on your PATH: run it as" \
        "./scripts/in-env eagle3-tui ..., or first: . $prefix/bin/activate"
fi
