#!/usr/bin/env bash
# Runs an adapter's conformance tests inside the real engine:
#
#   scripts/engine-tests.sh vllm-0.33|vllm-0.34|sglang [pytest args...]
#
# The engine lives in its cached venv (scripts/engine-venv.sh). For vLLM, mla_cache
# is the module `maturin develop` builds (up to date) into python/mla_cache (the
# venvs are CPython 3.11), put on that venv's path with PYTHONPATH; for SGLang it is
# the freshly built wheel installed into the engine's venv (its plug-in entry point
# needs an installed distribution). Tests: python/engine_tests/vllm/ (for either
# vLLM version) or python/engine_tests/sglang/.
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${1:?usage: scripts/engine-tests.sh vllm-0.33|vllm-0.34|sglang [pytest args...]}
shift
venv="$(scripts/engine-venv.sh "$engine")"
scripts/venv.sh
case "$engine" in
sglang)
    # The backend reaches SGLang through its plug-in entry point, which only
    # an installed distribution has: build the wheel and install it there.
    wheels=target/wheels/sglang
    rm -rf "$wheels"
    # A local wheel, linked to this machine's libssl: no manylinux repair.
    .venv/bin/maturin build --release --quiet --auditwheel skip -o "$wheels"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
        --force-reinstall "$wheels"/mla_cache-*.whl
    # The replay tests compare with the simulator: MLA_CACHE_BIN (scripts/test.sh
    # passes the one its tests built), or one built now.
    if [[ -z ${MLA_CACHE_BIN:-} ]]; then
        cargo build --release --quiet --bin mla-cache
        MLA_CACHE_BIN="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/release/mla-cache"
        export MLA_CACHE_BIN
    fi
    ;;
*)
    .venv/bin/maturin develop --release --quiet
    export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
    ;;
esac
export VLLM_TARGET_DEVICE=cpu
# The engine's tools (SGLang builds its page hashing with ninja at first use).
export PATH="$venv/bin:$PATH"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "python/engine_tests/${engine%%-*}" "$@"
