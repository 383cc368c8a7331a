#!/usr/bin/env bash
# Builds everything (installing what is missing; CUDA when nvcc is found) and runs the whole test
# suite with ctest.
#   scripts/test.sh [ctest args...]      e.g. scripts/test.sh -R Kernels
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --all
# The fuzz harnesses (clang-14 + sanitizers) that ctest's fuzz_harnesses test runs.
if command -v clang++-14 >/dev/null; then scripts/fuzz.sh --build-only; fi
# As many tests at once as there are cores (CTEST_PARALLEL_LEVEL overrides): most of the suite
# waits on processes starting, timeouts and restarts rather than computing. (nproc answers
# OMP_NUM_THREADS when it is set: count the cores before it is.)
jobs=${CTEST_PARALLEL_LEVEL:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ctest --preset release --timeout 600 -j "$jobs" "$@"
