#!/usr/bin/env bash
# Packs the GPU bundle (scripts/bundle.sh; it reuses build-bundle/, so only the first run builds
# everything) and checks, without a GPU:
#   - with only the bundle's lib/ on the library path (and no other environment), every
#     dependency of every binary, library and MPI plugin resolves inside the bundle, except glibc
#     and the NVIDIA libraries (driver, CUDA toolkit, cuDNN, NCCL) that run.sh finds on the target
#     (each file's own DT_NEEDED, whose union is the closure; ldd for the main binaries);
#   - run.sh --dry-run --budget 540 finds the NVIDIA libraries here and plans the stages in their
#     order with their caps (and --budget 200 a shorter plan);
#   - --quick picks the right stages from a fabricated first-run summary, and from the one a run
#     left in the bundle's last/; bad arguments are one error line and exit 2;
#   - run.sh probe mpi: the probe fails here (no GPU) and the mpi stage after it still trains 2
#     CPU ranks through the bundled mpirun without opening any file of this machine's Open MPI or
#     PMIx installation, leaving run.log, summary.txt, details.tar.gz;
#   - the archive is small (under 45 MB: the device tool carries 64 MiB in all).
# BUNDLE_BUILD overrides the build folder (default build-bundle in the source tree);
# BUNDLE_NO_BUILD=1 packs that folder as it is (ctest: its own build).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d /tmp/tripod_bundle_test.XXXXXX)
trap 'rm -rf "$T"' EXIT
OUT=$T/tripod-bundle
fail() { echo "FAIL: $*" >&2; exit 1; }

no_build=()
[ "${BUNDLE_NO_BUILD:-0}" = 1 ] && no_build=(--no-build)
BUILD=${BUNDLE_BUILD:-$SRC/build-bundle} "$SRC/scripts/bundle.sh" "${no_build[@]}" --archive "$T/tripod-bundle.tar.gz" "$OUT"

allowed='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libutil\.so|libcuda\.so|libcudart|libcublas|libcublasLt|libcudnn|libnccl|libnvrtc|libnvJitLink|libnvidia)'
# check_ldd FILE ENV...: every dependency of FILE (under env -i ENV) is allowed or inside $OUT/lib.
check_ldd() {
  local f=$1; shift
  env -i "$@" ldd "$f" | while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    echo "$name" | grep -Eq "$allowed" && continue
    case $(realpath -m "$path") in "$OUT"/lib/*) ;; *) echo "$f: $name => $path" ;; esac
  done
}
# Every library a file of the bundle names (DT_NEEDED) is allowed or in $OUT/lib, where
# LD_LIBRARY_PATH finds it first (an old-style DT_RPATH outside the bundle would come before it).
# Over every file of the bundle this is the closure ldd would walk, without mapping cuBLAS a few
# hundred times (ldd takes about a second a file here): one readelf over all of them.
bad=$(readelf -d "$OUT"/bin/* "$OUT"/lib/*.so* "$OUT"/lib/openmpi3/*.so "$OUT"/lib/pmix/*.so 2>/dev/null |
  awk -v allowed="$allowed" 'NR == FNR { have[$0] = 1; next }
    /^File: / { file = $2 }
    /\(NEEDED\)/ { name = $NF; gsub(/[][]/, "", name)
                   if (name !~ allowed && !(name in have)) print file ": " name " not in lib/" }
    /\(RPATH\)/ { rp = $NF; gsub(/[][]/, "", rp); n = split(rp, parts, ":")
                  for (i = 1; i <= n; i++) if (parts[i] !~ /^\$ORIGIN/) print file ": RPATH " parts[i] " outside the bundle" }' \
    <(ls "$OUT/lib") -
# and the loader agrees, for the binaries that load the most
for f in "$OUT"/bin/tripod "$OUT"/bin/cuda_kernels_test "$OUT"/bin/mpirun; do check_ldd "$f" LD_LIBRARY_PATH="$OUT/lib"; done)
[ -z "$bad" ] || fail "dependencies outside the bundle:"$'\n'"$bad"
n_libs=$(ls "$OUT"/lib/*.so* | wc -l)
[ "$n_libs" -ge 10 ] || fail "only $n_libs libraries in lib/"
for f in tripod tripod_gpu_bench cuda_kernels_test cuda_model_test cuda_train_test cuda_comm_test cuda_grid_test \
         cuda_cli_test mpirun; do
  [ -x "$OUT/bin/$f" ] || fail "bin/$f missing"
done
for f in src/configs/quickstart.toml src/configs/tiny.toml src/configs/hardware/h100_sxm.toml \
         src/configs/hardware/h200_sxm.toml src/bench/gpu/plan_check.py src/bench/gpu/hf_check.py \
         src/configs/tiny_kjv.toml src/configs/tiny_llama.toml src/configs/tiny_moe.toml \
         src/build/corpus/kjv_text_document.bin src/build/corpus/kjv_bpe4096.model \
         src/bench/gpu/torch_baseline.py src/bench/gpu/summary.py run.sh GLIBC_REQUIRED; do
  [ -s "$OUT/$f" ] || fail "$f missing"
done

# The plan of a dry run (as if every stage took its estimate): the stages in priority order, each
# capped by min(its own cap, what is left - 25 s); those that would get less than their minimum
# are "no-time", and later, smaller ones still run.
dry=$("$OUT/run.sh" --dry-run --budget 540 --results "$T/dry") || fail "run.sh --dry-run failed:"$'\n'"$dry"
for want in "libcudnn.so.9: /" "libnccl.so.2: /" "libcublasLt.so.13: /" "-- ops/cuda_kernels_test: " \
            "-- step/cuda_model_test: " "--gtest_filter=CudaTrain.OneStepMatchesCpu" "-- train/train: " \
            "--gtest_filter=CudaTrain.GridOnOneGpuMatchesSingleRank" "-- comm/cuda_comm_test: mpirun" \
            "tripod_gpu_bench --model 124M --steps 20 --warmup 3" "torch_baseline.py --model 124M --steps 20 --warmup 3" \
            "--no-compile" "tripod_gpu_bench --model 350M" "calibrate --device cuda" "--profile-steps 4" \
            "plan_check.py --tripod" "hf_check.py --tripod" "dry run: nothing ran" \
            "--gtest_filter=CudaTrain.Fp8FollowsTheBf16Curve" "tripod_gpu_bench --model 1B --seq 2048 --micro-batch 4 --precision both" \
            "-- fp8/fp8-ops: " "--profile-from-start off" "--no-split --profile-last"; do
  grep -qF -- "$want" <<< "$dry" || fail "run.sh --dry-run does not show '$want':"$'\n'"$dry"
done
plan=$(grep '^plan: ' <<< "$dry")
want_plan="plan: probe est=10 cap=30 start=0
plan: ops est=15 cap=120 start=10
plan: step est=10 cap=120 start=25
plan: train est=15 cap=180 start=35
plan: bench-124m est=15 cap=150 start=50
plan: torch-compile est=70 cap=180 start=65
plan: torch-eager est=30 cap=120 start=135
plan: bench-1b est=30 cap=150 start=165
plan: bench-350m est=20 cap=120 start=195
plan: hf est=30 cap=120 start=215
plan: grid est=10 cap=150 start=245
plan: comm est=5 cap=120 start=255
plan: calibrate est=25 cap=120 start=260
plan: plan-check est=10 cap=90 start=285
plan: fp8 est=65 cap=220 start=295
plan: sanitize est=15 cap=155 start=360
plan: profile est=90 cap=140 start=375"
[ "$plan" = "$want_plan" ] || fail "the 540 s plan changed:"$'\n'"$plan"$'\n'"(expected)"$'\n'"$want_plan"
# Every cap keeps 25 s back, and the checks of correctness and the comparisons (through grid) end by 540 - 20 s.
awk -v budget=540 '
  /est=/ { split($0, f, /[ =]/); est = f[4]; cap = f[6]; start = f[8]
           if (cap > budget - start - 25) { print "cap " cap " beyond what is left at " start ": " $0; bad = 1 }
           if ($2 == "grid" && start + est > budget - 20) { print "grid does not fit: " $0; bad = 1 } }
  END { exit bad }' <<< "$plan" || fail "caps"
# A smaller budget: caps shrink and the later stages get no time.
plan200=$("$OUT/run.sh" --dry-run --budget 200 --results "$T/dry" | grep '^plan: ')
want200="plan: probe est=10 cap=30 start=0
plan: ops est=15 cap=120 start=10
plan: step est=10 cap=120 start=25
plan: train est=15 cap=140 start=35
plan: bench-124m est=15 cap=125 start=50
plan: torch-compile est=70 cap=110 start=65
plan: torch-eager est=30 cap=40 start=135
plan: bench-1b no-time left=35 min=20
plan: bench-350m no-time left=35 min=15"
[ "$(head -9 <<< "$plan200")" = "$want200" ] || fail "the 200 s plan:"$'\n'"$plan200"
[ "$(grep -c 'no-time' <<< "$plan200")" = 9 ] || fail "the 200 s plan should leave 9 stages without time:"$'\n'"$plan200"
grep -q '^plan: grid est=10 cap=10 start=165$' <<< "$plan200" || fail "the 200 s plan should still run grid:"$'\n'"$plan200"

# --quick on a first run's summary: probe, then the stages that failed, timed out, had no time,
# were pending (the run was cut off) or are absent; not those ok or skipped.
cat > "$T/first_summary.txt" <<'END'
tripod bundle abc; GPU: NVIDIA H100 80GB HBM3, 570.86, 81559 MiB; budget 540s, 538s used
stage          status     time   cap   est  notes
probe          ok           3s   30s    5s  NVIDIA H100 80GB HBM3
ops            ok          25s  120s   30s  passed 30, failed 0, skipped 0
step           FAILED      20s  120s   30s  passed 1, failed 1, skipped 0: CudaTrain.OneStepMatchesCpu ; exit 1
train          TIMED_OUT  180s  180s   60s  killed at its 180s cap
bench-124m     ok          50s  150s   60s  124M B=64: 100000 tok/s, MFU 10.0%, peak 40.0 GiB
torch-eager    skipped      0s  120s   45s  no python3 with CUDA PyTorch
grid           ok          40s  150s   60s  passed 1, failed 0, skipped 0
torch-compile  no-time       -     -   90s  60s left, needs 60s
comm           FAILED      10s  120s   45s  exit 1
bench-350m     pending       -     -   50s
calibrate      ok          30s   40s   60s  hardware_cuda.toml (base h100_sxm.toml)
sanitize       skipped      0s  300s  120s  no compute-sanitizer
profile        FAILED       5s  240s   90s  exit 1

stage status lines after the table's blank line do not count:
stage          status
grid           FAILED
END
quick=$("$OUT/run.sh" --quick --previous "$T/first_summary.txt" --dry-run --budget 300 --results "$T/dry") ||
  fail "run.sh --quick --dry-run failed:"$'\n'"$quick"
got=$(grep '^plan: ' <<< "$quick" | awk '{print $2}' | tr '\n' ' ')
[ "$got" = "probe step train torch-compile bench-1b bench-350m hf comm plan-check fp8 profile " ] || fail "--quick picked: $got"$'\n'"$quick"
"$OUT/run.sh" --quick --previous "$T/missing.txt" > "$T/bad.out" 2>&1 && fail "--quick with no summary ran"
[ "$(cat "$T/bad.out")" = "error: --quick: no earlier summary at $T/missing.txt (give the first run's summary.txt with --previous FILE)" ] ||
  fail "--quick with no summary: $(cat "$T/bad.out")"
echo "x" > "$T/not_a_summary.txt"
for args in "--quick --previous $T/not_a_summary.txt" "--budget 30" "--budget 5x" "--quick ops" "nosuchstage" "--previous $T/first_summary.txt"; do
  rc=0
  # shellcheck disable=SC2086
  "$OUT/run.sh" $args > "$T/bad.out" 2>&1 || rc=$?
  [ $rc = 2 ] && [ "$(wc -l < "$T/bad.out")" = 1 ] && grep -q '^error: ' "$T/bad.out" ||
    fail "run.sh $args: exit $rc, $(cat "$T/bad.out")"
done

# The bundled Open MPI, relocated: 2 ranks train, and no file of /usr's Open MPI or PMIx is opened
# (libmpi's RUNPATH still makes the loader probe its build folder for glibc: those opens fail).
# The probe stage before it fails here (no GPU), and the mpi stage still runs.
strace -f -qq -e trace=open,openat,execve -o "$T/strace" "$OUT/run.sh" --results "$T/mpi" probe mpi > "$T/mpi.out" 2>&1 &&
  fail "run.sh probe mpi passed without a GPU:"$'\n'"$(tail -30 "$T/mpi.out")"
grep -qE '^mpi +ok ' "$T/mpi/summary.txt" || fail "no mpi ok in summary.txt: $(cat "$T/mpi/summary.txt")"
grep -qE '^probe +FAILED .*no GPU' "$T/mpi/summary.txt" || fail "no 'probe FAILED ... no GPU' in summary.txt: $(cat "$T/mpi/summary.txt")"
leaks=$(grep -E '= [0-9]+$' "$T/strace" | grep -oE '"/(usr/lib/x86_64-linux-gnu/(openmpi|pmix2|libmpi|libopen-|libpmix)|usr/share/(openmpi|pmix)|etc/openmpi)[^"]*"' | sort -u | head || true)
[ -z "$leaks" ] || fail "the bundled mpirun read the system's Open MPI files:"$'\n'"$leaks"
[ "$(ls "$T/mpi" | tr '\n' ' ')" = "details.tar.gz run.log summary.txt " ] ||
  fail "the results folder should hold details.tar.gz run.log summary.txt, not: $(ls "$T/mpi")"
tar -tzf "$T/mpi/details.tar.gz" > "$T/details.list"
grep -q 'details/mpi-run/metrics.jsonl' "$T/details.list" || fail "details.tar.gz lacks the mpi run's metrics"
grep -q 'details/probe.txt' "$T/details.list" || fail "details.tar.gz lacks probe.txt"
# A second command on the same machine: --quick reads the summary the run left in the bundle's
# last/ and reruns probe, then every default stage (none of them ran).
quick=$("$OUT/run.sh" --quick --dry-run --results "$T/dry") || fail "run.sh --quick after a run failed:"$'\n'"$quick"
grep -qF -- "(--quick from $OUT/last/summary.txt)" <<< "$quick" || fail "--quick did not read last/summary.txt:"$'\n'"$quick"
[ "$(grep '^plan: ' <<< "$quick" | head -3 | awk '{print $2}' | tr '\n' ' ')" = "probe ops step " ] ||
  fail "--quick after probe and mpi should rerun probe, then the stages that never ran:"$'\n'"$quick"

size=$(stat -c %s "$T/tripod-bundle.tar.gz")
unpacked=$(du -sb "$OUT" | cut -f1)
echo "bundle: $((unpacked / 1000000)) MB unpacked, archive $((size / 1000000)) MB, $n_libs libraries"
# A build with ICU (TRIPOD_ICU=ON, ctest packs its own build) carries ICU's libraries, which
# scripts/bundle.sh's own build leaves out: the limit is on the rest.
icu=0
for f in "$OUT"/lib/libicu*; do [ -e "$f" ] && icu=$((icu + $(gzip -c "$f" | wc -c))); done
[ "$icu" = 0 ] || echo "bundle: ICU's libraries (not in scripts/bundle.sh's own build) $((icu / 1000000)) MB packed"
[ $((size - icu)) -lt 45000000 ] || fail "archive is $((size - icu)) bytes without ICU (limit 45 MB)"
echo "bundle_test: ok"
