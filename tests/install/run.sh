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
# pkg-config
cc "$src/app.c" -o "$scratch/app_pc" \
    $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs kvtier)
LD_LIBRARY_PATH="$libdir" "$scratch/app_pc"
# CMake
cmake -S "$src" -B "$scratch/cmake" -DCMAKE_PREFIX_PATH="$prefix" >"$scratch/cmake.log"
cmake --build "$scratch/cmake" >>"$scratch/cmake.log"
LD_LIBRARY_PATH="$libdir" "$scratch/cmake/app_shared"
"$scratch/cmake/app_static"
echo "install test: pkg-config and find_package builds ran"
