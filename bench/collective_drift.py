#!/usr/bin/env python3
"""A tensor-parallel all-reduce inside a training run against the same call timed alone, as a
calibration times it. Trains GPT-2 4 x 256 (seq 256, micro-batch 2: each all-reduce 512 KiB)
on 2 ranks at tp = 2 under build/lib/libmpi_call_timer.so (bench/mpi_call_timer.cpp), RUNS
times, and prints per run:

  alone before / after / after (new buffer)  the call alone after a barrier, median of 300, in
                                              the run's own processes right after MPI_Init and
                                              right before MPI_Finalize
  in run                                     each of the run's calls of that size (past the
                                              first quarter) from the later rank's arrival to
                                              the end of the later rank's: median, p10, p90
  skew                                       the two ranks' arrival difference, median

  python3 bench/collective_drift.py [--tripod build/bin/tripod] [--timer build/lib/libmpi_call_timer.so]
                                    [--runs 3] [--steps 10]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

CONFIG = """[model]
n_layers = 4
n_heads = 4
d_model = 256
seq_len = 256
vocab_size = 2048

[train]
device = "cpu"
micro_batch_size = 2
global_batch_size = 16
steps = {steps}
log_interval = 1
trace = false
output_dir = "{out}"

[parallel]
tp = 2

[data]
synthetic = true
"""


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def read(path):
    with open(path) as f:
        head = f.readline().split()
        calls = [tuple(map(float, line.split())) for line in f]
    return [float(x) for x in head[1:]], calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tripod", default="build/bin/tripod")
    ap.add_argument("--timer", default="build/lib/libmpi_call_timer.so")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tripod_drift_")
    cfg = os.path.join(tmp, "small.toml")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(steps=a.steps, out=os.path.join(tmp, "run")))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    prefix = os.path.join(tmp, "calls")
    print(f"{'run':>3} | {'alone: before':>13} {'after':>7} {'new buf':>7} | "
          f"{'in run: median':>14} {'p10':>7} {'p90':>7} | {'skew':>6} | calls   (us)")
    for run in range(1, a.runs + 1):
        cmd = ["mpirun", "--allow-run-as-root", "--bind-to", "none", "-np", "2",
               "-x", f"LD_PRELOAD={os.path.abspath(a.timer)}", "-x", f"TRIPOD_TIMER_OUT={prefix}",
               a.tripod, "train", "--config", cfg]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
        (alone, c0), (_, c1) = read(prefix + ".0"), read(prefix + ".1")
        if len(c0) != len(c1) or not c0:
            sys.exit(f"the ranks timed {len(c0)} and {len(c1)} calls of 512 KiB")
        pairs = list(zip(c0, c1))[len(c0) // 4:]  # past the warm-up
        inside = [1e6 * (max(x[1], y[1]) - max(x[0], y[0])) for x, y in pairs]
        skew = [1e6 * abs(x[0] - y[0]) for x, y in pairs]
        print(f"{run:>3} | {alone[0]:>13.1f} {alone[1]:>7.1f} {alone[2]:>7.1f} | {statistics.median(inside):>14.1f} "
              f"{pct(inside, 0.1):>7.1f} {pct(inside, 0.9):>7.1f} | {statistics.median(skew):>6.1f} | {len(c0)}",
              flush=True)


if __name__ == "__main__":
    main()
