#!/usr/bin/env bash
# Builds the C library (the package capi/), then builds and runs the C/C++ tests of its C ABI
# (tests/c/) and the C++ example (examples/cpp/), and checks that an install
# (scripts/install-capi.sh) is relocatable: installed to a temporary prefix,
# moved, the example built against it with CMake records the SONAME and runs.
#
#   scripts/c-tests.sh [--release] [--features LIST] [--valgrind] [--asan]
#
#   --release   test the release build (target/release) instead of the debug one
#   --features  build the library with these Cargo features (cuda,
#               remote-redis; a `capi` in the list is ignored)
#   --valgrind  run the C test and the example under valgrind memcheck
#               (--error-exitcode=1 --leak-check=full); any error or leak fails
#   --asan      build the test programs with AddressSanitizer and UBSan
#               (-fsanitize=address,undefined); any report fails
#
# `cargo test -p mla-cache-capi --test c_abi` runs the same programs without valgrind.
set -euo pipefail

cd "$(dirname "$0")/.."
profile=debug
cargo_flags=(-p mla-cache-capi)
defines=()
static_deps=()
valgrind=0
asan=0
while [[ $# -gt 0 ]]; do
    arg="$1"
    shift
    case "$arg" in
        --release) profile=release; cargo_flags+=(--release) ;;
        --features)
            # `capi`, once the core's feature for the C ABI, is no feature any more: drop it.
            features="$(echo ",$1," | sed 's/,capi,/,/g; s/^,//; s/,$//')"
            [[ -n $features ]] && cargo_flags+=(--features "$features")
            # The C test expects a CUDA store to be creatable (or to fail for want of a GPU).
            [[ ",$1," == *,cuda,* ]] && defines+=(-DMLA_TEST_CUDA_FEATURE)
            # The remote tier's TLS comes from the system's OpenSSL.
            [[ ",$1," == *,remote-redis,* ]] && static_deps+=(-lssl -lcrypto) && defines+=(-DMLA_TEST_REMOTE_FEATURE)
            shift ;;
        --valgrind) valgrind=1 ;;
        --asan) asan=1 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown option: $arg" >&2; exit 2 ;;
    esac
done

[[ $asan == 1 && $valgrind == 1 ]] && { echo "--asan and --valgrind exclude each other" >&2; exit 2; }
cargo build "${cargo_flags[@]}"
target_dir="${CARGO_TARGET_DIR:-target}"
lib="$target_dir/$profile"
out="$target_dir/c-tests/$profile"
mkdir -p "$out"

# The programs record the library's SONAME (libmla_cache.so.MAJOR), which
# they find through a link next to them.
major="$(sed -n 's/^version = "\([0-9]*\)\..*"/\1/p' capi/Cargo.toml | head -n 1)"
mkdir -p "$out/lib"
ln -sfn "$(cd "$lib" && pwd)/libmla_cache.so" "$out/lib/libmla_cache.so.$major"
warn=(-Wall -Wextra -Werror -g -O1 "${defines[@]}")
if [[ $asan == 1 ]]; then
    warn+=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
fi
shared=(-Iinclude "-L$lib" -lmla_cache "-Wl,-rpath,$(cd "$out/lib" && pwd)" -lm)
static=(-Iinclude "$lib/libmla_cache.a" "${static_deps[@]}" -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc)

gcc -std=c11 -pedantic "${warn[@]}" tests/c/test_abi.c "${shared[@]}" -o "$out/test_abi"
gcc -std=c11 -pedantic "${warn[@]}" tests/c/test_hardening.c "${shared[@]}" -o "$out/test_hardening"
gcc -std=c11 -pedantic "${warn[@]}" tests/c/test_oom.c "${shared[@]}" -o "$out/test_oom"
gcc -std=c11 -pedantic "${warn[@]}" tests/c/test_batch.c "${shared[@]}" -o "$out/test_batch"
g++ -std=c++17 -pedantic -pthread "${warn[@]}" tests/c/test_wrapper.cpp "${shared[@]}" -o "$out/test_wrapper"
g++ -std=c++17 -pthread "${warn[@]}" tests/c/test_threads.cpp "${shared[@]}" -o "$out/test_threads"
g++ -std=c++17 -pedantic "${warn[@]}" examples/cpp/example.cpp "${static[@]}" -o "$out/example"

run=()
if [[ $valgrind == 1 ]]; then
    command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
    run=(valgrind --quiet --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible
         --suppressions=tests/c/valgrind.supp)
fi

"${run[@]}" "$out/test_abi"
"${run[@]}" "$out/test_batch"
"${run[@]}" "$out/test_wrapper"
"${run[@]}" "$out/test_hardening"
# An address-space limit would break valgrind's and ASan's own mappings: run
# it bare, and not in the sanitizer build.
[[ $asan == 1 ]] || "$out/test_oom"
"${run[@]}" "$out/test_threads"
"${run[@]}" "$out/example" >/dev/null
echo "example: passed"

echo "== relocatable install: install, move, build the example with CMake, run it"
cmake="$(command -v cmake || echo .venv/bin/cmake)"
[[ -x $cmake ]] || { echo "cmake is not installed (scripts/venv.sh puts one in .venv)" >&2; exit 1; }
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
scripts/install-capi.sh "$stage/installed" --lib-dir "$lib" >/dev/null
mv "$stage/installed" "$stage/moved"
rm -rf "$out/cmake-example"
"$cmake" -S examples/cpp -B "$out/cmake-example" -DCMAKE_PREFIX_PATH="$stage/moved" >/dev/null
"$cmake" --build "$out/cmake-example" >/dev/null
needed="$(readelf -d "$out/cmake-example/example" | sed -n 's/.*(NEEDED).*\[\(.*mla_cache.*\)\]/\1/p')"
[[ $needed == "libmla_cache.so.$major" ]] || { echo "the example needs '$needed', not libmla_cache.so.$major" >&2; exit 1; }
"$out/cmake-example/example" | grep -q "bit-exact" || { echo "the CMake-built example failed" >&2; exit 1; }
pc_libs="$(PKG_CONFIG_PATH="$stage/moved/lib/pkgconfig" pkg-config --libs mla_cache)"
[[ $pc_libs == *"$stage/moved/"* ]] || { echo "pkg-config gives '$pc_libs', not the moved prefix" >&2; exit 1; }
echo "relocatable install: passed (NEEDED $needed)"
