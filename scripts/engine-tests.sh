#!/usr/bin/env bash
# Runs an adapter's conformance tests inside the real engine:
#
#   scripts/engine-tests.sh vllm|sglang [pytest args...]
#
# The engine lives in its cached venv (scripts/engine-venv.sh); mla_cache is the
# module `maturin develop` builds (up to date) into python/mla_cache (both venvs are CPython
# 3.11), put on that venv's path with PYTHONPATH, so nothing of the project is
# installed into the engine's venv. Tests: python/engine_tests/<engine>/.
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${1:?usage: scripts/engine-tests.sh vllm|sglang [pytest args...]}
shift
venv="$(scripts/engine-venv.sh "$engine")"
scripts/venv.sh
.venv/bin/maturin develop --release --quiet
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_TARGET_DEVICE=cpu
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "python/engine_tests/$engine" "$@"
