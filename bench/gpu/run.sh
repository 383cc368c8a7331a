#!/usr/bin/env bash
# Builds tripod with the CUDA backend and runs the GPU training benchmark: GPT-2 124M and 350M and
# a Llama-3.2-1B-shaped model at seq 1024 with the largest micro-batch that fits; tokens/s, MFU
# (against the GPU's dense bf16 peak: 989 TFLOP/s for H100 SXM), peak memory and the step time's
# shares (GEMM, attention, other ops, host gaps). Then, when python3 has CUDA PyTorch, the PyTorch
# baseline on the GPT-2 shapes and micro-batches, and the side-by-side table with the ratio
# (bench/gpu/summary.py).
#   bench/gpu/run.sh [tripod_gpu_bench options: --model 124M|350M|1B|all --micro-batch B --steps N --warmup N]
# Needs an NVIDIA GPU; BUILD (default build-gpu) names the build directory, RESULTS (default
# BUILD/gpu_bench) where the JSON results go.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-gpu}
RESULTS=${RESULTS:-$BUILD/gpu_bench}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTRIPOD_CUDA=ON -DBUILD_TESTING=OFF > "$BUILD.configure.log" 2>&1 ||
  { cat "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target tripod_gpu_bench
mkdir -p "$RESULTS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$BUILD/bin/tripod_gpu_bench" --json "$RESULTS/tripod.json" "$@"
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  python3 bench/gpu/torch_baseline.py --match "$RESULTS/tripod.json" --json "$RESULTS/torch.json"
  python3 bench/gpu/summary.py "$RESULTS/tripod.json" "$RESULTS/torch.json"
else
  echo "(no python3 with CUDA PyTorch: no baseline)"
  python3 bench/gpu/summary.py "$RESULTS/tripod.json"
fi
