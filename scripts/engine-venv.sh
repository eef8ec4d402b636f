#!/usr/bin/env bash
# Creates (once) a virtual environment holding one real serving engine, for the
# conformance tests, and prints its path. The environments live in a cache folder
# outside the clone (MLA_CACHE_ENGINE_CACHE, default ~/.cache/mla-cache/engines), so
# a second run on the same machine reuses them; they are never the project's .venv.
#
#   scripts/engine-venv.sh vllm     # vllm==0.33.0 with its own torch (CPU use only)
#   scripts/engine-venv.sh sglang   # sglang==0.5.23, its scheduler-side imports, torch
#
# A requirements stamp in each environment makes a changed list reinstall only
# what changed. No GPU is needed: the engines' scheduler sides run on the CPU.
set -euo pipefail
engine=${1:?usage: scripts/engine-venv.sh vllm|sglang}
root="${MLA_CACHE_ENGINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mla-cache/engines}"
test_tools="pytest>=8 pyzmq>=25 msgpack>=1.0 maturin>=1.9.4,<2"
case "$engine" in
vllm)
    dir="$root/vllm-0.33.0"
    # xxhash: vLLM's optional dependency for its xxhash_cbor block hash.
    want="vllm==0.33.0 xxhash>=3.5 $test_tools"
    nodeps=""
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
    nodeps="sglang==0.5.23"
    ;;
*)
    echo "unknown engine: $engine (vllm or sglang)" >&2
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
