#!/usr/bin/env bash
# Builds tripod with the CUDA backend and runs the GPU training benchmark: GPT-2 124M and 350M at
# seq 1024 with the largest micro-batch that fits; prints tokens/s, MFU (989 TFLOP/s peak, H100
# SXM bf16 dense), peak memory and the shares of the step time in GEMM, attention and the rest.
#   bench/gpu/run.sh [--model 124M|350M|all] [--micro-batch B] [--steps N] [--warmup N]
# Needs an NVIDIA GPU; BUILD (default build-gpu) names the build directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-gpu}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTRIPOD_CUDA=ON -DBUILD_TESTING=OFF > "$BUILD.configure.log" 2>&1 ||
  { cat "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target tripod_gpu_bench
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$BUILD/bin/tripod_gpu_bench" "$@"
