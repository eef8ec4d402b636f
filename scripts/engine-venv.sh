#!/usr/bin/env bash
# Creates (once) a virtual environment holding one real serving engine, for the
# conformance tests, and prints its path. The environments live in a cache folder
# outside the clone (MLA_CACHE_ENGINE_CACHE, default ~/.cache/mla-cache/engines), so
# a second run on the same machine reuses them; they are never the project's .venv.
#
#   scripts/engine-venv.sh vllm-0.33   # vllm==0.33.0 with its own torch (CPU use only)
#   scripts/engine-venv.sh vllm-0.34   # vllm==0.34.0 over vllm 0.33.0's dependency set
#   scripts/engine-venv.sh sglang      # sglang==0.5.23, its scheduler-side imports, torch
#
# A requirements stamp in each environment makes a changed list reinstall only
# what changed. No GPU is needed: the engines' scheduler sides run on the CPU.
set -euo pipefail
engine=${1:?usage: scripts/engine-venv.sh vllm-0.33|vllm-0.34|sglang}
root="${MLA_CACHE_ENGINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mla-cache/engines}"
test_tools="pytest>=8 pyzmq>=25 msgpack>=1.0 maturin>=1.9.4,<2"
case "$engine" in
vllm-0.33)
    dir="$root/vllm-0.33.0"
    # xxhash: vLLM's optional dependency for its xxhash_cbor block hash.
    want="vllm==0.33.0 xxhash>=3.5 $test_tools"
    nodeps=""
    ;;
vllm-0.34)
    dir="$root/vllm-0.34.0"
    # vllm 0.34.0 pins flashinfer-python==0.7.3, which the package index does
    # not serve. flashinfer is a GPU attention kernel library that the
    # scheduler side never imports, so 0.34.0 goes in without its dependencies
    # over 0.33.0's set (the same torch, transformers and the rest; 0.34's
    # scheduler, KV cache manager, offloading connector and config modules
    # import with it).
    want="vllm==0.33.0 xxhash>=3.5 $test_tools"
    nodeps="vllm==0.34.0"
    ;;
sglang)
    dir="$root/sglang-0.5.23"
    # SGLang's full dependency list pulls GPU kernels; the scheduler-side
    # modules (radix cache, allocators, req_to_token pool, Req, schedule
    # policy, KV events, backend registry) import only these (found by
    # importing them in a bare venv until nothing was missing).
    want="torch==2.14.1 torchvision==0.29.2 numpy psutil requests pydantic msgspec orjson packaging tqdm"
    want="$want pybase64 pillow starlette ipython aiohttp transformers dill apache-tvm-ffi"
    want="$want sentencepiece compressed-tensors gguf openai partial-json-parser $test_tools"
    # HiCache's page hashes are a C++ extension SGLang builds at first use
    # with torch's extension loader, which needs ninja (and g++, libcrypto).
    want="$want ninja"
    nodeps="sglang==0.5.23"
    ;;
*)
    echo "unknown engine: $engine (vllm-0.33, vllm-0.34 or sglang)" >&2
    exit 2
    ;;
esac
mkdir -p "$root"
exec 9>"$dir.lock"
flock 9
if [ ! -x "$dir/bin/python" ]; then
    python3 -m venv "$dir" >&2
fi
stamp="$dir/.requirements"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want | $nodeps" ]; then
    export VLLM_TARGET_DEVICE=cpu
    "$dir/bin/python" -m pip install -q --disable-pip-version-check $want >&2
    if [ -n "$nodeps" ]; then
        "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps $nodeps >&2
    fi
    echo "$want | $nodeps" >"$stamp"
fi
echo "$dir"
