#!/usr/bin/env bash
# One entry point: sets up a venv on first use (or when pyproject.toml or its lock changes), then runs a task.
# The install is pinned by a lock of exact versions that install together, chosen by the interpreter:
# constraints.txt on Python 3.11 (jax 0.10), constraints-py313.txt on Python >= 3.12 (the newest jax line).
#   ./dev.sh train [FLAGS...]   train all_taper at the CPU preset on the offline corpus (flags go to the trainer)
#   ./dev.sh test  [ARGS...]    run the test suite (what CI runs)
#   ./dev.sh lint               ruff's checks and its format check ([tool.ruff] in pyproject.toml; CI runs them first)
#   ./dev.sh format             ruff's formatter, applied
#   ./dev.sh python ARGS...     run the venv's python
# PYTHON=/path/to/python picks the interpreter; TAPERNORM_VENV=DIR the venv (default .venv).
set -euo pipefail
cd "$(dirname "$0")"
venv=${TAPERNORM_VENV:-.venv}

pick_python() {
  for p in "${PYTHON:-}" python3.11 python3.13 python3.12 python3; do
    [ -n "$p" ] && command -v "$p" >/dev/null 2>&1 || continue
    if "$p" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then echo "$p"; return; fi
  done
  echo "error: tapernorm_jax needs Python >= 3.11 (jax 0.10 requires it); set PYTHON=/path/to/python3.11" >&2
  exit 1
}

lock_for() {  # the lock file for an interpreter
  if "$1" -c 'import sys; sys.exit(sys.version_info >= (3, 12))'; then echo constraints.txt; else echo constraints-py313.txt; fi
}

if [ -x "$venv/bin/python" ]; then lock=$(lock_for "$venv/bin/python"); fi
if [ ! -x "$venv/bin/python" ] || [ pyproject.toml -nt "$venv/.installed" ] || [ "$lock" -nt "$venv/.installed" ]; then
  py=$(pick_python)
  lock=$(lock_for "$py")
  echo "setting up $venv with $py and $lock (one-time, ~1 minute)..." >&2
  "$py" -m venv --clear "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$venv/bin/python" -m pip install -q -e '.[test]' -c "$lock"
  touch "$venv/.installed"
fi

# The venv's jaxlib is the CPU one, beside libtpu (the TPU compiler, for compile checks of TPU programs): jax runs
# on this CPU, and is not left to probe for a TPU at every start (on a host without one, libtpu says so at length).
export JAX_PLATFORMS=${JAX_PLATFORMS-cpu}

task=${1:-train}; shift || true
case "$task" in
  train) exec "$venv/bin/python" -m experiments.tinystories --config=configs/all_taper.py:size=cpu "$@" ;;
  test) exec "$venv/bin/python" -m pytest -q "$@" ;;
  lint) "$venv/bin/ruff" check . "$@" && exec "$venv/bin/ruff" format --check . ;;
  format) exec "$venv/bin/ruff" format . "$@" ;;
  python) exec "$venv/bin/python" "$@" ;;
  *) echo "usage: ./dev.sh {train|test|lint|format|python} [args...]" >&2; exit 2 ;;
esac
