#!/usr/bin/env python3
"""Calibrate -> predict -> measure on this machine's CPU. For tp, pp and dp layouts on 2 ranks
and the single rank, two micro-batch sizes, with and without full recomputation:
`tripod calibrate --model` measures the model's own kernel shapes and the collectives on that
many ranks, `tripod plan --layout ... --json` predicts the step time from that file, and
`tripod train` measures it (median over the steps after the first two). The machine is shared
and its load drifts, so each row calibrates just before and just after it trains and predicts
with each file; the prediction is the mean of the two. Prints predicted vs measured side by
side; exits 1 when a row is off by more than --tolerance (15%).

  python3 bench/plan_cpu.py [--tripod build/bin/tripod] [--steps 8] [--tolerance 0.15]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODEL = """[model]
n_layers = 4
n_heads = 4
d_model = 256
seq_len = 128
vocab_size = 2048

[train]
device = "cpu"
global_batch_size = 16
steps = {steps}
log_interval = 1
trace = false
output_dir = "{out}"

[data]
synthetic = true
"""

# (ranks, tp, pp, micro-batch, recompute)
LAYOUTS = [(1, 1, 1, mbs, rc) for mbs in (2, 8) for rc in ("none", "full")] + [
    (2, tp, pp, mbs, rc)
    for (tp, pp) in ((2, 1), (1, 2), (1, 1))
    for mbs in (2, 8)
    for rc in ("none", "full")
]


def run(cmd, env):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout


def mpirun(ranks):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tripod", default="build/bin/tripod")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5, help="timings per calibration point")
    ap.add_argument("--tolerance", type=float, default=0.15)
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    tmp = tempfile.mkdtemp(prefix="tripod_plan_cpu_")

    print(f"{'ranks':>5} {'tp':>3} {'pp':>3} {'dp':>3} {'mbs':>4} {'recompute':>9} | "
          f"{'predicted':>10} {'measured':>10} {'error':>7}   (median step time, s)")
    bad = 0
    for ranks, tp, pp, mbs, rc in LAYOUTS:
        out = os.path.join(tmp, f"run_{ranks}_{tp}_{pp}_{mbs}_{rc}")
        cfg = os.path.join(tmp, "model.toml")
        with open(cfg, "w") as f:
            f.write(MODEL.format(steps=a.steps, out=out))
        layout = f"tp={tp},pp={pp},vp=1,mbs={mbs},recompute={rc},sp=false,distopt=false"

        def predict(tag):
            hw = os.path.join(tmp, f"hw_{tag}.toml")
            run(mpirun(ranks) + [a.tripod, "calibrate", "--out", hw, "--force", "--repeats", str(a.repeats),
                                 "--model", cfg, "--micro-batches", str(mbs)], env)
            plan = json.loads(run([a.tripod, "plan", "--config", cfg, "--hardware", hw, "--gpus", str(ranks),
                                   "--layout", layout, "--json", "--top", "1"], env))
            return plan["layouts"][0]

        before = predict("before")
        run(mpirun(ranks) + [a.tripod, "train", "--config", cfg, "--set", f"parallel.tp={tp}",
                             "--set", f"parallel.pp={pp}", "--set", f"train.micro_batch_size={mbs}",
                             "--set", f"recompute.mode=\"{rc}\""], env)
        after = predict("after")
        predicted = (before["step_time_s"] + after["step_time_s"]) / 2
        with open(os.path.join(out, "metrics.jsonl")) as f:
            steps = [json.loads(l) for l in f if l.strip()]
        times = [s["step_time_s"] for s in steps if "step_time_s" in s][2:]
        measured = statistics.median(times)
        err = predicted / measured - 1
        bad += abs(err) > a.tolerance
        print(f"{ranks:>5} {tp:>3} {pp:>3} {before['dp']:>3} {mbs:>4} {rc:>9} | {predicted:>10.4f} "
              f"{measured:>10.4f} {100 * err:>+6.1f}%{'  <- off' if abs(err) > a.tolerance else ''}", flush=True)
    print(f"{len(LAYOUTS) - bad} of {len(LAYOUTS)} layouts within {100 * a.tolerance:.0f}%")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
