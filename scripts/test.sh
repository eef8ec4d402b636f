#!/usr/bin/env bash
# Runs every test of the project on a fresh machine (Rust, Python 3.11 with pip, gcc):
# Rust unit, integration and doc tests (the CUDA code included: its kernels are
# compiled with NVRTC from NVIDIA's wheels and checked bit for bit on a CPU
# emulation), the remote tier against real Valkey/Redis servers (a single node
# and a 3-node cluster on 127.0.0.1, started here), the loom models, the C/C++
# ABI tests under valgrind, the Python suite, inside SGLang the backend's
# conformance tests and the remote tier as its HiCache storage backend, and
# inside vLLM 0.33 and 0.34 the adapter's conformance
# tests and the remote tier as vLLM's secondary offload tier (against the
# servers above). Installs what it needs into .venv, the engines into cached
# venvs of their own (scripts/engine-venv.sh), and redis-server, valgrind from
# Debian's packages when missing.
# A GPU is not needed (scripts/gpu-check.sh runs the kernels on one).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage is announced with the seconds spent so far, so that slow stages show in CI logs.
stage() { echo "== [${SECONDS} s] $*"; }

stage "python environment (.venv)"
scripts/venv.sh

# NVRTC from the nvidia-cuda-nvrtc-cu12 wheel: the kernels must compile in CI.
MLA_CACHE_NVRTC="$(ls -d "$PWD"/.venv/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib | head -n 1)"
export MLA_CACHE_NVRTC MLA_CACHE_REQUIRE_NVRTC=1 MLA_CACHE_REQUIRE_EMULATION=1

features=cuda,remote-redis
# maturin builds the extension (pyext/, a workspace of its own) here too, so it
# reuses the dependencies the tests built rather than building them again.
export CARGO_TARGET_DIR="$PWD/target"

stage "rustfmt and clippy"
cargo fmt --check
cargo fmt --check --manifest-path pyext/Cargo.toml
cargo clippy --release --workspace --features "$features" --all-targets -- -D warnings
cargo clippy --release --manifest-path pyext/Cargo.toml --features cuda --all-targets -- -D warnings

stage "redis servers for the remote tier"
eval "$(scripts/redis.sh start)"
trap 'scripts/redis.sh stop' EXIT
export MLA_CACHE_REQUIRE_REDIS=1

stage "cargo test (unit, integration, CLI, codecs, stores, tiers, CUDA compile + emulation)"
cargo test --release --workspace --features "$features" --all-targets
cargo test --release -p mla-cache -p mla-cache-sim --features "$features" --doc

stage "eviction policies with debug assertions and overflow checks (the contract's checks)"
# Only the library (and the workspace's packages built on it: ffi/, capi/,
# sim/) is rebuilt with them; their dependencies stay as built above.
cargo test --release --workspace --features "$features" --lib \
    --config 'profile.release.package.mla-cache.debug-assertions=true' \
    --config 'profile.release.package.mla-cache.overflow-checks=true' policy::

stage "loom models"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="$CARGO_TARGET_DIR/loom" \
    cargo test --release -p mla-cache --test 'loom_*'

stage "python module (maturin) and its tests"
.venv/bin/maturin develop --release --quiet
PYO3_PYTHON="$PWD/.venv/bin/python" cargo test --release --manifest-path pyext/Cargo.toml --lib
# The hand-written stubs must match the module (names, signatures, defaults).
.venv/bin/python -m mypy.stubtest mla_cache._native --allowlist python/stubtest-allowlist.txt
.venv/bin/python -m pytest -q python/tests

stage "the vLLM adapter replays the Mooncake trace exactly as simulate does"
# The binary `cargo test` built for the CLI's tests (the engine tests use it too).
export MLA_CACHE_BIN="$CARGO_TARGET_DIR/release/mla-cache"
.venv/bin/python python/bench/replay_vllm_adapter.py --compare "$MLA_CACHE_BIN"

stage "C ABI tests under valgrind (memcheck)"
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
scripts/c-tests.sh --release --features "$features" --valgrind
stage "C ABI tests under AddressSanitizer and UBSan"
scripts/c-tests.sh --release --features "$features" --asan

stage "GPU check bundle: built here; complete, finds libnvrtc, stops at once without a GPU"
scripts/gpu-bundle.sh target/gpu-bundle
rc=0
target/gpu-bundle/run.sh target/gpu-bundle-out >target/gpu-bundle-out.log 2>&1 || rc=$?
cat target/gpu-bundle-out.log
if [ "$rc" -ne 3 ] || ! grep -q "^no GPU" target/gpu-bundle-out.log ||
    ! grep -q "^libnvrtc: /" target/gpu-bundle-out.log; then
    echo "the GPU bundle's run.sh should find libnvrtc, then stop with 'no GPU' (exit 3); exit $rc" >&2
    exit 1
fi

stage "SGLang 0.5.23: the backend against its RadixCache; the remote tier as its HiCache storage backend"
scripts/engine-tests.sh sglang

stage "vLLM 0.33: its real scheduler on mla_cache vs its own manager; the remote tier as its secondary offload tier"
scripts/engine-tests.sh vllm-0.33
stage "vLLM 0.34: its real scheduler on mla_cache vs its own manager; the remote tier as its secondary offload tier"
scripts/engine-tests.sh vllm-0.34
stage "done"
