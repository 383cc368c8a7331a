#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz (the `fuzz` preset: clang-14, ASan + UBSan, in
# build-fuzz/) and runs each one: first over its checked-in corpus (tests/fuzz/corpus/NAME, the
# seeds and every past finding, which must all pass), then fuzzing for SECONDS.
#   scripts/fuzz.sh [--no-build | --build-only] [SECONDS [NAME...]]   SECONDS: 60, NAME: all
# A finding (crash, sanitizer report, an escaping non-tripod exception, a hang over 10 s, an
# allocation over 1 GB) is saved as build-fuzz/findings/NAME/...; the script then exits 1.
# With --no-build and no harnesses built it exits 77 (ctest's "skipped").
set -euo pipefail
cd "$(dirname "$0")/.."
build=1 run=1
if [ "${1:-}" = "--no-build" ]; then build=0; shift; fi
if [ "${1:-}" = "--build-only" ]; then run=0; shift; fi
secs=${1:-60}
[ $# -gt 0 ] && shift
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(indexed_dataset index_cache safetensors checkpoint_metadata piece_attributes config
                                  schedule_csv hf_config tokenizer_json tiktoken gpt2_bpe jsonl_line)
if [ $build = 1 ]; then
  command -v clang++-14 >/dev/null || { echo "fuzz.sh: clang++-14 is needed (apt-get install clang-14 libclang-rt-14-dev)"; exit 1; }
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  [ -f build-fuzz/CMakeCache.txt ] || cmake --preset fuzz "${launcher[@]}" >/dev/null
  cmake --build build-fuzz --target fuzz -j "${FUZZ_BUILD_JOBS:-2}" >/dev/null
fi
[ $run = 1 ] || exit 0
for n in "${names[@]}"; do
  [ -x build-fuzz/bin/fuzz_$n ] || { [ $build = 0 ] && { echo "fuzz.sh: build-fuzz/bin/fuzz_$n is not built; skipped"; exit 77; }; exit 1; }
done
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
status=0
for n in "${names[@]}"; do
  seeds=tests/fuzz/corpus/$n work=build-fuzz/corpus/$n findings=build-fuzz/findings/$n
  mkdir -p "$work" "$findings"
  opts=(-rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 -artifact_prefix="$findings/")
  # Regression: every checked-in input once.
  if ! build-fuzz/bin/fuzz_$n "${opts[@]}" -runs=0 "$seeds" >"$findings/regression.log" 2>&1; then
    echo "fuzz $n: a checked-in input fails (see $findings/regression.log)"; status=1; continue
  fi
  if build-fuzz/bin/fuzz_$n "${opts[@]}" -max_total_time="$secs" -print_final_stats=1 "$work" "$seeds" \
      >"$findings/run.log" 2>&1; then
    echo "fuzz $n: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$findings/run.log" | grep -o '[0-9]*$') inputs in ${secs} s, no finding"
  else
    echo "fuzz $n: FINDING (see $findings/run.log; the input is saved in $findings/)"
    tail -n 30 "$findings/run.log"
    status=1
  fi
done
exit $status
