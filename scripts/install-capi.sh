#!/usr/bin/env bash
# Installs the C library: header, shared and static libraries, a pkg-config
# file and a CMake package config. The install is relocatable: the prefix may
# be moved or copied afterwards (the pkg-config file and the CMake package
# find everything relative to themselves).
#
#   scripts/install-capi.sh PREFIX [--no-build | --lib-dir DIR]
#
#   --no-build     install what target/release holds (built already)
#   --lib-dir DIR  install the libraries from DIR (built already, from capi/)
#
# installs
#   PREFIX/include/mla_cache.h
#   PREFIX/lib/libmla_cache.so.VERSION, its SONAME link libmla_cache.so.MAJOR
#   and the link-time name libmla_cache.so; PREFIX/lib/libmla_cache.a
#   PREFIX/lib/pkgconfig/mla_cache.pc
#   PREFIX/lib/cmake/mla_cache/mla_cacheConfig.cmake (+ ...ConfigVersion.cmake)
#
# then, in a C or C++ project:
#   g++ app.cpp $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs mla_cache)
#   cmake -DCMAKE_PREFIX_PATH=PREFIX ...   with   find_package(mla_cache REQUIRED)
#                                                 target_link_libraries(app mla_cache::mla_cache)
# Programs record the SONAME (NEEDED libmla_cache.so.MAJOR), never a path.
set -euo pipefail

cd "$(dirname "$0")/.."
if [[ $# -lt 1 || $1 == -* ]]; then
    sed -n '2,23p' "$0"
    exit 2
fi
mkdir -p "$1"
prefix="$(cd "$1" && pwd)"
lib="${CARGO_TARGET_DIR:-target}/release"
build=1
case "${2:-}" in
    "") ;;
    --no-build) build=0 ;;
    --lib-dir) build=0; lib="${3:?--lib-dir needs a directory}" ;;
    *) echo "unknown option: $2" >&2; exit 2 ;;
esac

if [[ $build == 1 ]]; then
    cargo build --release -p mla-cache-capi
fi
version="$(sed -n 's/^version = "\(.*\)"/\1/p' capi/Cargo.toml | head -n 1)"
major="${version%%.*}"
minor="$(echo "$version" | cut -d. -f2)"
so="$lib/libmla_cache.so"
# Native libraries the static library needs (rustc --print native-static-libs).
static_deps="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"

# Only the C library is installed: it exports the C ABI, has its SONAME and
# needs no libpython (the Python extension is another product, lib_native.so).
fail() { echo "install-capi.sh: $so is not the C library: $1" >&2; exit 1; }
[[ -f $so ]] || fail "not found"
nm -D --defined-only "$so" | grep -qw mla_version || fail "it does not export the C ABI (not built from capi/?)"
! nm -D --defined-only "$so" | grep -q PyInit_ || fail "it is a Python extension"
! readelf -d "$so" | grep NEEDED | grep -q libpython || fail "it needs libpython"
soname="$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
[[ $soname == "libmla_cache.so.$major" ]] || fail "its SONAME is '${soname}', not libmla_cache.so.$major"

install -Dm644 include/mla_cache.h "$prefix/include/mla_cache.h"
install -Dm755 "$so" "$prefix/lib/libmla_cache.so.$version"
ln -sfn "libmla_cache.so.$version" "$prefix/lib/libmla_cache.so.$major"
ln -sfn "libmla_cache.so.$major" "$prefix/lib/libmla_cache.so"
install -Dm644 "$lib/libmla_cache.a" "$prefix/lib/libmla_cache.a"

mkdir -p "$prefix/lib/pkgconfig"
cat > "$prefix/lib/pkgconfig/mla_cache.pc" <<PC
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: mla_cache
Description: Paged KV cache for Multi-head Latent Attention (DeepSeek-V2/V3, Kimi-K2), C API
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -lmla_cache -Wl,-rpath,\${libdir}
Libs.private: $static_deps
PC

cmake_dir="$prefix/lib/cmake/mla_cache"
mkdir -p "$cmake_dir"
cat > "$cmake_dir/mla_cacheConfig.cmake" <<CMAKE
# mla_cache $version. Imported targets:
#   mla_cache::mla_cache         the shared library (programs record its SONAME)
#   mla_cache::mla_cache_static  the static library (with its native dependencies)
# Paths are relative to this file: the install may be moved.
get_filename_component(_mla_cache_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET mla_cache::mla_cache)
  add_library(mla_cache::mla_cache SHARED IMPORTED)
  set_target_properties(mla_cache::mla_cache PROPERTIES
    IMPORTED_LOCATION "\${_mla_cache_prefix}/lib/libmla_cache.so.$version"
    IMPORTED_SONAME "libmla_cache.so.$major"
    INTERFACE_INCLUDE_DIRECTORIES "\${_mla_cache_prefix}/include")
  add_library(mla_cache::mla_cache_static STATIC IMPORTED)
  set_target_properties(mla_cache::mla_cache_static PROPERTIES
    IMPORTED_LOCATION "\${_mla_cache_prefix}/lib/libmla_cache.a"
    INTERFACE_INCLUDE_DIRECTORIES "\${_mla_cache_prefix}/include"
    INTERFACE_LINK_LIBRARIES "gcc_s;util;rt;pthread;m;dl;c")
endif()
unset(_mla_cache_prefix)
CMAKE
cat > "$cmake_dir/mla_cacheConfigVersion.cmake" <<CMAKE
# Compatible with a requested version that is not newer, of the same major
# version (and, before 1.0, the same minor version).
set(PACKAGE_VERSION "$version")
set(PACKAGE_VERSION_COMPATIBLE TRUE)
if(PACKAGE_FIND_VERSION)
  if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION
     OR NOT PACKAGE_FIND_VERSION_MAJOR EQUAL $major
     OR ($major EQUAL 0 AND NOT PACKAGE_FIND_VERSION_MINOR EQUAL $minor))
    set(PACKAGE_VERSION_COMPATIBLE FALSE)
  elseif(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE

echo "installed mla_cache $version into $prefix"
