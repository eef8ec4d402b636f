#!/usr/bin/env bash
# Creates (or updates) the project's virtual environment in .venv with the Python
# tools the tests need: maturin, pytest, mypy (its stubtest checks _native.pyi),
# numpy, ml_dtypes, cmake (scripts/c-tests.sh builds a CMake consumer of the
# installed C library), and NVIDIA's NVRTC and CUDA runtime wheels (for compiling the
# CUDA kernels without a CUDA toolkit).
# Prints nothing but errors when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
stamp=.venv/.requirements
want="maturin>=1.7,<2 cmake>=3.20,<5 pytest>=8 mypy>=1.11 numpy>=1.26 ml_dtypes>=0.4 nvidia-cuda-nvrtc-cu12==12.8.* nvidia-cuda-runtime-cu12==12.8.*"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check $want
    echo "$want" > "$stamp"
fi
