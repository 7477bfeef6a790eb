#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the build into a scratch prefix, then builds and runs programs against it: app.c
# (the pool alone) and app_io.c (the disk tier and a link endpoint), with pkg-config and with
# CMake's find_package (shared and static). A program that moves no bytes must not load
# ZeroMQ, UCX or liburing, and a find_package of the shared libraries must need nothing else.
#   tests/install/run.sh BUILD_DIR SCRATCH_DIR
set -eu
build=$1
scratch=$2
src=$(cd "$(dirname "$0")" && pwd)
rm -rf "$scratch"
mkdir -p "$scratch"
prefix=$scratch/prefix
cmake --install "$build" --prefix "$prefix" >"$scratch/install.log"
pcdirs=("$prefix"/lib*/pkgconfig)
libdir=$(dirname "${pcdirs[0]}")
fail() {
    echo "install test: $*" >&2
    exit 1
}
# pkg-config, as the README shows it: an rpath to the prefix's libdir, so the program starts
# without LD_LIBRARY_PATH; and no dependency's private include paths in --cflags. The scratch
# directory may have spaces in its path (a clone in "sp test/kvtier"): pkg-config writes them
# escaped with a backslash, as a shell reads them, so its output is read as a shell would (pc).
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pc() { # pc ARGS...: pkg-config ARGS's output split into words as a shell reads it, in $pcw
    local out
    out=$(pkg-config "$@") || fail "pkg-config $* failed"
    eval "pcw=($out)"
}
for m in kvtier kvtier-disk kvtier-net; do
    cflags=$(pkg-config --cflags $m)
    case "$cflags" in
    *pgm* | *krb5* | *libxml2* | *isystem*) fail "pkg-config --cflags $m leaks private include paths: $cflags" ;;
    esac
done
pc --variable=libdir kvtier
rpath="-Wl,-rpath,${pcw[0]}"
pc --cflags --libs kvtier
cc "$src/app.c" -o "$scratch/app_pc" "${pcw[@]}" "$rpath"
env -u LD_LIBRARY_PATH "$scratch/app_pc"
pc --cflags --libs kvtier-disk kvtier-net
cc "$src/app_io.c" -o "$scratch/app_io_pc" "${pcw[@]}" "$rpath"
env -u LD_LIBRARY_PATH "$scratch/app_io_pc" "$scratch"
# a program built against an older header (abi0: 3e4dc23's, a shorter kvt_offload_stats)
pc --cflags --libs kvtier
cc -I"$src/abi0" "$src/app_abi0.c" -o "$scratch/app_abi0" "${pcw[@]}" "$rpath"
env -u LD_LIBRARY_PATH "$scratch/app_abi0"
# what each program loads: the pool program none of the transports' libraries
loads() { env -u LD_LIBRARY_PATH ldd "$1"; }
if loads "$scratch/app_pc" | grep -E 'libzmq|libucp|libucs|liburing|libkvtier_(disk|net)'; then
    fail "app.c (the pool alone) loads a transport's library (above)"
fi
loads "$scratch/app_io_pc" | grep -q liburing || fail "app_io does not load liburing"
loads "$scratch/app_io_pc" | grep -q libzmq || fail "app_io does not load libzmq"
# static linking: each module names its own dependencies, and only those
if pkg-config --static --libs kvtier | grep -qE -- '-lzmq|-lucp|-luring'; then
    fail "pkg-config --static --libs kvtier names a transport: $(pkg-config --static --libs kvtier)"
fi
pkg-config --static --libs kvtier-net | grep -q -- -lzmq ||
    fail "pkg-config --static --libs kvtier-net lacks ZeroMQ"
pkg-config --static --libs kvtier-disk | grep -q -- -luring ||
    fail "pkg-config --static --libs kvtier-disk lacks liburing"
# CMake: the shared libraries need nothing found beyond the package (pkg-config finds nothing
# here), the static ones find their dependencies
PKG_CONFIG_LIBDIR=/nonexistent PKG_CONFIG_PATH='' \
    cmake -S "$src" -B "$scratch/cmake-shared" -DCMAKE_PREFIX_PATH="$prefix" -DKVT_STATIC=OFF \
    >"$scratch/cmake-shared.log" ||
    fail "find_package(kvtier) needs more than the package: $scratch/cmake-shared.log"
cmake --build "$scratch/cmake-shared" >>"$scratch/cmake-shared.log"
LD_LIBRARY_PATH="$libdir" "$scratch/cmake-shared/app_shared"
LD_LIBRARY_PATH="$libdir" "$scratch/cmake-shared/app_io_shared" "$scratch"
cmake -S "$src" -B "$scratch/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DKVT_STATIC=ON >"$scratch/cmake.log"
cmake --build "$scratch/cmake" >>"$scratch/cmake.log"
"$scratch/cmake/app_static"
"$scratch/cmake/app_io_static" "$scratch"
echo "install test: pkg-config and find_package builds ran; the pool program loads no transport"
