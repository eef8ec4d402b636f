#!/usr/bin/env bash
# Builds, on a machine without a GPU, the self-contained GPU check: one folder
# (default target/gpu-bundle, at most 60 MiB) that a bare GPU machine runs with
# no Rust toolchain and no network:
#
#   scripts/gpu-bundle.sh [DIR]      # here
#   DIR/run.sh OUT                   # there: tests, DLPack round trip, bandwidth
#
# It holds the CUDA test binaries (cargo test --no-run) and the bandwidth
# program, stripped; the Python module as a wheel on CPython's stable ABI
# (3.11 and later) with the CUDA store; run.sh and torch_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/gpu-bundle}"
limit=$((60 * 1024 * 1024))
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
scripts/venv.sh

rm -rf "$out"
mkdir -p "$out/bin" "$out/wheel"

echo "== CUDA test binaries and the bandwidth program (release, --features cuda)"
# The executables cargo reports for the two CUDA test targets.
cargo test --release --features cuda --no-run --message-format=json \
    --test cuda_store --test nvrtc_compile 2>/dev/null |
    .venv/bin/python -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do cp "$exe" "$out/bin/$name"; done
cargo build --release --features cuda --example gpu_bandwidth
cp "$CARGO_TARGET_DIR/release/examples/gpu_bandwidth" "$out/bin/"
for b in cuda_store nvrtc_compile gpu_bandwidth; do
    [ -x "$out/bin/$b" ] || { echo "gpu-bundle: $b was not built" >&2; exit 1; }
done
strip "$out"/bin/*

echo "== the Python module (abi3 wheel with the CUDA store, no remote tier: no libssl needed)"
.venv/bin/maturin build --release --quiet --auditwheel skip --no-default-features \
    --features abi3,cuda -o "$out/wheel"

cp scripts/gpu-bundle/run.sh scripts/gpu-bundle/torch_check.py "$out/"
chmod +x "$out/run.sh"

size=$(du -sb "$out" | cut -f1)
echo "gpu-bundle: $out, $((size / 1024 / 1024)) MiB"
ls -l "$out" "$out/bin" "$out/wheel"
if [ "$size" -gt "$limit" ]; then
    echo "gpu-bundle: $size bytes is over the 60 MiB limit" >&2
    exit 1
fi
