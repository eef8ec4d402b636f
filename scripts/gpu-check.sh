#!/usr/bin/env bash
# Checks the CUDA store on a machine with an NVIDIA GPU, in a few minutes:
# builds with --features cuda (release), compiles the kernels with NVRTC,
# runs the CUDA store tests against the CPU codec with MLA_CACHE_REQUIRE_GPU=1
# (so a missing GPU, driver or libnvrtc fails instead of skipping), then
# prints the write/gather bandwidth report.
#
# libnvrtc: MLA_CACHE_NVRTC if set, else the nvidia-cuda-nvrtc-cu12 wheel in
# .venv (created by scripts/venv.sh when missing), else the system's.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi

find_wheel_nvrtc() {
    ls -d "$PWD"/.venv/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib 2>/dev/null | head -n 1 || true
}
if [ -z "${MLA_CACHE_NVRTC:-}" ]; then
    dir="$(find_wheel_nvrtc)"
    if [ -z "$dir" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then
        scripts/venv.sh
        dir="$(find_wheel_nvrtc)"
    fi
    if [ -n "$dir" ]; then
        export MLA_CACHE_NVRTC="$dir"
    fi
fi
echo "libnvrtc: ${MLA_CACHE_NVRTC:-from the system library path}"

export MLA_CACHE_REQUIRE_GPU=1 MLA_CACHE_REQUIRE_NVRTC=1
jobs="$(nproc)"

echo "== build (release, --features cuda)"
cargo build --release --features cuda -j "$jobs" --lib --example gpu_bandwidth

echo "== CUDA tests"
cargo test --release --features cuda -j "$jobs" --test nvrtc_compile --test cuda_store

echo "== bandwidth"
cargo run --release --features cuda -j "$jobs" --example gpu_bandwidth
