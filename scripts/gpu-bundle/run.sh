#!/usr/bin/env bash
# The GPU check, run from the bundle scripts/gpu-bundle.sh builds, on a GPU
# machine that has no Rust toolchain and no network:
#
#   run.sh OUT
#
# It needs an NVIDIA GPU with its driver, libnvrtc from CUDA 13 or 12 (the
# toolkit, or NVIDIA's Python wheels), and python3 with PyTorch (CUDA). It runs
# the CUDA kernels against the CPU codec for every format, the indexer keys and
# copy_blocks, with a GPU required (a missing GPU, driver or libnvrtc fails,
# never skips); a torch round trip through DLPack; and the bandwidth report
# (write, gather and copy_blocks beside torch's device-to-device copy of the
# same bytes). Logs and OUT/summary.txt go to OUT. It first checks the bundle
# is whole and finds libnvrtc; without a GPU it then stops, exit status 3.
set -uo pipefail
bundle="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: run.sh OUT}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# 1. The bundle is whole and its programs load.
for f in bin/cuda_store bin/nvrtc_compile bin/gpu_bandwidth torch_check.py; do
    [ -e "$bundle/$f" ] || { note "FAIL: the bundle lacks $f"; exit 1; }
done
ls "$bundle"/wheel/*.whl >/dev/null 2>&1 || { note "FAIL: the bundle lacks its wheel"; exit 1; }
for t in cuda_store nvrtc_compile; do
    "$bundle/bin/$t" --list >/dev/null 2>&1 || { note "FAIL: bin/$t does not start on this machine"; exit 1; }
done

# 2. libnvrtc: MLA_CACHE_NVRTC (the library or its folder), else the toolkit
# or NVIDIA's wheels, the newest major the driver runs (CUDA 13, then 12).
driver_major="$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)"
find_nvrtc() {
    local v d
    if [ -n "${MLA_CACHE_NVRTC:-}" ]; then
        [ -f "$MLA_CACHE_NVRTC" ] && { echo "$MLA_CACHE_NVRTC"; return; }
        for v in libnvrtc.so.13 libnvrtc.so.12 libnvrtc.so; do
            [ -e "$MLA_CACHE_NVRTC/$v" ] && { echo "$MLA_CACHE_NVRTC/$v"; return; }
        done
        return 1
    fi
    local dirs=("${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda-13*/lib64 /usr/local/cuda-12*/lib64
        /usr/lib/x86_64-linux-gnu)
    local site
    site="$(python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)"
    while read -r d; do
        [ -n "$d" ] && dirs+=("$d/nvidia/cu13/lib" "$d/nvidia/cuda_nvrtc/lib")
    done <<<"$site"
    for v in 13 12; do
        [ -n "$driver_major" ] && [ "$v" -gt "$driver_major" ] && continue
        for d in "${dirs[@]}"; do
            [ -e "$d/libnvrtc.so.$v" ] && { echo "$d/libnvrtc.so.$v"; return; }
        done
    done
    return 1
}
nvrtc="$(find_nvrtc)" || nvrtc=""
note "libnvrtc: ${nvrtc:-not found}"

# 3. A GPU, or stop at once.
if ! gpus="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)" ||
    [ -z "$gpus" ]; then
    note "no GPU: nvidia-smi finds no NVIDIA GPU or driver on this machine; the GPU check needs one"
    exit 3
fi
note "gpu: $gpus"
if [ -z "$nvrtc" ]; then
    note "FAIL: libnvrtc (CUDA 13 or 12) not found: set MLA_CACHE_NVRTC, CUDA_HOME, or install NVIDIA's nvrtc wheel"
    exit 1
fi
# cudarc opens `libnvrtc.so` by name: a folder of links to the library found
# and its builtins, alone on the search path (not the toolkit's whole folder,
# whose other libraries would come before torch's own).
links="$out/.nvrtc"
rm -rf "$links"
mkdir -p "$links"
ln -s "$nvrtc" "$links/libnvrtc.so"
ln -s "$nvrtc" "$links/$(basename "$nvrtc")"
for b in "$(dirname "$nvrtc")"/libnvrtc-builtins*; do
    [ -e "$b" ] && ln -s "$b" "$links/"
done
export MLA_CACHE_NVRTC="$links"
export LD_LIBRARY_PATH="$links${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MLA_CACHE_REQUIRE_GPU=1 MLA_CACHE_REQUIRE_NVRTC=1

status=0
step() {
    local name="$1"
    shift
    local start=$SECONDS
    if "$@" >"$out/$name.log" 2>&1; then
        note "ok   $name ($((SECONDS - start)) s)"
    else
        note "FAIL $name ($((SECONDS - start)) s): see $out/$name.log"
        tail -n 30 "$out/$name.log"
        status=1
    fi
}

# 4. The kernels against the CPU codec, bit for bit.
step nvrtc_compile "$bundle/bin/nvrtc_compile" --test-threads=1
step cuda_store "$bundle/bin/cuda_store" --test-threads=1
grep -h "test result" "$out"/nvrtc_compile.log "$out"/cuda_store.log | sed 's/^/     /' | tee -a "$summary"

# 5. The bandwidth program (kernels beside cuMemcpy of the same bytes).
step gpu_bandwidth "$bundle/bin/gpu_bandwidth"

# 6. The Python module in torch: DLPack round trip, bandwidth beside torch's copy.
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    note "FAIL python: the wheel needs CPython 3.11 or later; python3 is $(python3 --version 2>&1)"
    status=1
fi
py="$out/.python"
rm -rf "$py"
step install_wheel python3 -m pip install --quiet --no-deps --no-index --target "$py" "$bundle"/wheel/*.whl
step torch_check env PYTHONPATH="$py" python3 "$bundle/torch_check.py" "$out"
if [ -f "$out/torch_check.txt" ]; then
    sed 's/^/     /' "$out/torch_check.txt" | tee -a "$summary"
fi

if [ $status -eq 0 ]; then note "GPU check passed"; else note "GPU check FAILED"; fi
exit $status
