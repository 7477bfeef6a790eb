#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# GPU checks of the copy layer: builds kvtier (unless KVT_BUILD_DIR names a finished build),
# runs the CUDA tests (which must not skip here) and the copy tests, then the copy benchmark
# with the CUDA backend (2 MiB and 16 KiB blocks against cudaMemcpy of one contiguous pinned
# buffer, per direction and both at once: as configured by default, DMA only, the
# gather/scatter kernel only) and with the CPU backend. Results land in OUTDIR.
#
#   bench/gpu/run.sh OUTDIR            KVT_GIB: GiB per direction (default 4)
#                                      KVT_VARIANTS=1: also the CUDA variants (fallback,
#                                      overlap hint, 1024-descriptor batches, the kernel's
#                                      thread blocks per multiprocessor: 1, 4, 8)
#
# Where compute-sanitizer is on the PATH, test_copy_cuda also runs under its memcheck tool.
# Last, bench/gpu/worker_kv.py puts the worker side on CUDA KV tensors allocated by torch
# (KVT_PYTHON: a Python whose torch sees the GPU; the run fails without one).
# Without the project's build dependencies on the GPU machine, build here, carry the build
# and the libraries it links (ldd) and point KVT_BUILD_DIR and LD_LIBRARY_PATH at them.
set -u
out=${1:?usage: bench/gpu/run.sh OUTDIR}
mkdir -p "$out"
build=${KVT_BUILD_DIR:-build-gpu}
if [ -z "${KVT_BUILD_DIR:-}" ]; then
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >"$out/build.txt" 2>&1 &&
        cmake --build "$build" -j"$(nproc)" >>"$out/build.txt" 2>&1 ||
        { tail -30 "$out/build.txt"; exit 1; }
fi
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current \
    --format=csv >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
status=0
export KVT_REQUIRE_CUDA=1
for t in test_copy_cuda test_cuda_frag test_copy test_copy_kernels test_copy_model test_worker \
    test_offload_procs test_disk; do
    if "$build/tests/$t" >"$out/$t.txt" 2>&1; then
        echo "$t: ok"
    else
        echo "$t: FAILED"
        tail -20 "$out/$t.txt"
        status=1
    fi
done
if command -v compute-sanitizer >/dev/null 2>&1; then
    if timeout 300 compute-sanitizer --target-processes all --tool memcheck --error-exitcode 9 \
        "$build/tests/test_copy_cuda" >"$out/memcheck_test_copy_cuda.txt" 2>&1; then
        echo "test_copy_cuda under compute-sanitizer memcheck: ok"
    else
        echo "test_copy_cuda under compute-sanitizer memcheck: FAILED"
        tail -20 "$out/memcheck_test_copy_cuda.txt"
        status=1
    fi
fi
"$build/bin/kvtier" bench copy --backend cuda --json --gib "${KVT_GIB:-4}" \
    >"$out/bench_copy_cuda.json" 2>"$out/bench_copy_cuda.err" || status=1
"$build/bin/kvtier" bench copy --json >"$out/bench_copy_cpu.json" 2>"$out/bench_copy_cpu.err" ||
    status=1
# The gather/scatter kernel against DMA: every job by DMA, then every job by the kernel (the
# default run above sends 16 KiB fragments to the kernel and 2 MiB blocks to DMA).
KVTIER_CUDA_KERNEL_MAX_BYTES=0 "$build/bin/kvtier" bench copy --backend cuda --json \
    --gib "${KVT_GIB:-4}" >"$out/bench_copy_cuda_dma.json" 2>"$out/bench_copy_cuda_dma.err" ||
    status=1
KVTIER_CUDA_KERNEL_MAX_BYTES=18446744073709551615 "$build/bin/kvtier" bench copy --backend cuda \
    --json --gib "${KVT_GIB:-4}" >"$out/bench_copy_cuda_kernel.json" \
    2>"$out/bench_copy_cuda_kernel.err" || status=1
# Variants of the CUDA path, for the record: per-descriptor cuMemcpyAsync, the driver's
# overlap-with-compute hint, and batches capped at 1024 descriptors.
if [ -n "${KVT_VARIANTS:-}" ]; then
    g=${KVT_VARIANT_GIB:-2}
    KVTIER_BENCH_FALLBACK=1 "$build/bin/kvtier" bench copy --backend cuda --json --gib "$g" \
        >"$out/variant_fallback.json" 2>&1 || status=1
    KVTIER_BENCH_PREFER_OVERLAP=1 "$build/bin/kvtier" bench copy --backend cuda --json \
        --gib "$g" >"$out/variant_overlap.json" 2>&1 || status=1
    KVTIER_MAX_BATCH_DESCRIPTORS=1024 "$build/bin/kvtier" bench copy --backend cuda --json \
        --gib "$g" >"$out/variant_cap1024.json" 2>&1 || status=1
    for b in 1 4 8; do
        KVTIER_CUDA_KERNEL_BLOCKS_PER_SM=$b "$build/bin/kvtier" bench copy --backend cuda --json \
            --gib "$g" >"$out/variant_blocks_per_sm_$b.json" 2>&1 || status=1
    done
    cat "$out"/variant_*.json
fi
cat "$out"/bench_copy_*.json "$out"/bench_copy_*.err
# The worker side on CUDA KV tensors as vLLM allocates them (bench/gpu/worker_kv.py: store,
# load, every byte compared, GB/s against a contiguous copy, a forced load error), with a
# Python whose torch sees the GPU (KVT_PYTHON; its kvtier is this tree's bindings over the
# library of $build: KVTIER_LIB).
py=${KVT_PYTHON:-python3}
if "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    if PYTHONPATH="$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}" \
        KVTIER_LIB="$build/lib/libkvtier.so" KVT_DISK_DIR="$out" "$py" bench/gpu/worker_kv.py \
        --device cuda --out "$out/worker_kv.json" >"$out/worker_kv.txt" 2>&1; then
        echo "worker_kv (CUDA KV tensors): ok"
    else
        echo "worker_kv (CUDA KV tensors): FAILED"
        status=1
    fi
    tail -30 "$out/worker_kv.txt"
else
    echo "worker_kv: not run: $py has no torch that sees a GPU (set KVT_PYTHON)"
    status=1
fi
exit $status
