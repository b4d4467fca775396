# Sourced by install.sh and in-env: which Python environment the project uses.
# The active one (a venv, virtualenv or conda environment) when there is one,
# else .venv/ in the clone. One rule, so both scripts always agree.

PROJECT_VENV="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv"

# Whether python3 on PATH is an activated environment's (not a system or pyenv one).
active_env() {
    command -v python3 >/dev/null || return 1
    python3 -c 'import os, sys
conda = os.environ.get("CONDA_PREFIX")
in_conda = bool(conda) and os.path.realpath(conda) == os.path.realpath(sys.prefix)
sys.exit(not (sys.prefix != sys.base_prefix or in_conda))'
}
