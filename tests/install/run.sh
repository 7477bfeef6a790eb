#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs the build into a scratch prefix, then builds and runs tests/install/app.c against
# it twice: with pkg-config, and with CMake's find_package (shared and static).
#   tests/install/run.sh BUILD_DIR SCRATCH_DIR
set -eu
build=$1
scratch=$2
src=$(cd "$(dirname "$0")" && pwd)
rm -rf "$scratch"
mkdir -p "$scratch"
prefix=$scratch/prefix
cmake --install "$build" --prefix "$prefix" >"$scratch/install.log"
libdir=$(ls -d "$prefix"/lib*/pkgconfig | head -1 | xargs dirname)
# pkg-config, as the README shows it: an rpath to the prefix's libdir, so the program starts
# without LD_LIBRARY_PATH; and no dependency's private include paths in --cflags
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cflags=$(pkg-config --cflags kvtier)
case "$cflags" in
*pgm* | *krb5* | *libxml2* | *isystem*)
    echo "install test: pkg-config --cflags kvtier leaks private include paths: $cflags" >&2
    exit 1
    ;;
esac
cc "$src/app.c" -o "$scratch/app_pc" $cflags $(pkg-config --libs kvtier) \
    -Wl,-rpath,"$(pkg-config --variable=libdir kvtier)"
env -u LD_LIBRARY_PATH "$scratch/app_pc"
pkg-config --static --libs kvtier | grep -q -- -lzmq ||
    { echo "install test: pkg-config --static --libs kvtier lacks the dependencies" >&2; exit 1; }
# CMake
cmake -S "$src" -B "$scratch/cmake" -DCMAKE_PREFIX_PATH="$prefix" >"$scratch/cmake.log"
cmake --build "$scratch/cmake" >>"$scratch/cmake.log"
LD_LIBRARY_PATH="$libdir" "$scratch/cmake/app_shared"
"$scratch/cmake/app_static"
echo "install test: pkg-config and find_package builds ran"
