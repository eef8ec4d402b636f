#!/usr/bin/env bash
# Builds the library, then builds and runs the C/C++ tests of its C ABI
# (tests/c/) and the C++ example (examples/cpp/).
#
#   scripts/c-tests.sh [--release] [--features LIST] [--valgrind]
#
#   --release   test the release build (target/release) instead of the debug one
#   --features  build the library with these Cargo features (e.g. cuda), on
#               top of `capi` (the C ABI itself), which is always on
#   --valgrind  run the C test and the example under valgrind memcheck
#               (--error-exitcode=1 --leak-check=full); any error or leak fails
#
# `cargo test --test c_abi` runs the same programs without valgrind.
set -euo pipefail

cd "$(dirname "$0")/.."
profile=debug
cargo_flags=(--features capi)
defines=()
static_deps=()
valgrind=0
while [[ $# -gt 0 ]]; do
    arg="$1"
    shift
    case "$arg" in
        --release) profile=release; cargo_flags+=(--release) ;;
        --features)
            cargo_flags+=(--features "$1")
            # The C test expects a CUDA store to be creatable (or to fail for want of a GPU).
            [[ ",$1," == *,cuda,* ]] && defines+=(-DMLA_TEST_CUDA_FEATURE)
            # The remote tier's TLS comes from the system's OpenSSL.
            [[ ",$1," == *,remote-redis,* ]] && static_deps+=(-lssl -lcrypto) && defines+=(-DMLA_TEST_REMOTE_FEATURE)
            shift ;;
        --valgrind) valgrind=1 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "unknown option: $arg" >&2; exit 2 ;;
    esac
done

cargo build --lib "${cargo_flags[@]}"
target_dir="${CARGO_TARGET_DIR:-target}"
lib="$target_dir/$profile"
out="$target_dir/c-tests/$profile"
mkdir -p "$out"

warn=(-Wall -Wextra -Werror -g -O1 "${defines[@]}")
shared=(-Iinclude "-L$lib" -lmla_cache "-Wl,-rpath,$lib" -lm)
static=(-Iinclude "$lib/libmla_cache.a" "${static_deps[@]}" -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc)

gcc -std=c11 -pedantic "${warn[@]}" tests/c/test_abi.c "${shared[@]}" -o "$out/test_abi"
gcc -std=c11 -pedantic "${warn[@]}" tests/c/test_hardening.c "${shared[@]}" -o "$out/test_hardening"
gcc -std=c11 -pedantic "${warn[@]}" tests/c/test_oom.c "${shared[@]}" -o "$out/test_oom"
g++ -std=c++17 -pthread "${warn[@]}" tests/c/test_threads.cpp "${shared[@]}" -o "$out/test_threads"
g++ -std=c++17 -pedantic "${warn[@]}" examples/cpp/example.cpp "${static[@]}" -o "$out/example"

run=()
if [[ $valgrind == 1 ]]; then
    command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
    run=(valgrind --quiet --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible
         --suppressions=tests/c/valgrind.supp)
fi

"${run[@]}" "$out/test_abi"
"${run[@]}" "$out/test_hardening"
# An address-space limit would break valgrind's own mappings: run it bare.
"$out/test_oom"
"${run[@]}" "$out/test_threads"
"${run[@]}" "$out/example" >/dev/null
echo "example: passed"
