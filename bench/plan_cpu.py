#!/usr/bin/env python3
"""Calibrate -> train -> plan --check on this machine's CPU: is the planner's prediction what the
machine measures? For GPT-2-shaped models at two sizes and a Llama-shaped one, on 1 rank and on
2 ranks (one per core) as pp = 2, tp = 2 and dp = 2:

  1. `tripod calibrate --model` measures that model's own shapes (GEMMs, attention calls,
     memory-bound ops, and the collectives on that many ranks);
  2. `tripod train --profile-steps N` trains it with that file as parallel.hardware and writes
     the profiled steps' breakdown (GEMM, attention, elementwise, exposed communication,
     pipeline idle, optimizer) beside the prediction into RUN/plan_check.json;
  3. `tripod calibrate` again, and `tripod plan --check RUN --hardware F --json` with each file:
     the prediction for the schedule the run used, on the calibration just before and just
     after it (the machine is shared and its load drifts); the mean of the two is compared with
     the measured step and families.

Prints one row per run: the step predicted vs measured and each family's error (relative for a
family of at least 5% of the step, else the difference as a share of the step, in parentheses).
Exits 1 unless every step is within --step-tolerance (15%) and every family within
--family-tolerance (25%) of max(its measured time, 5% of the step).

  python3 bench/plan_cpu.py [--tripod build/bin/tripod] [--steps 4] [--sizes small,medium,llama]
                            [--layouts 1,pp2,tp2,dp2] [--repeats 3] [--json OUT]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

# GPT-2-shaped (learned positions, LayerNorm, GELU, tied embeddings, head dimension 64), and a
# Llama-shaped one (RMSNorm, rope, SwiGLU, 8 query heads over 2 key/value heads of 32).
SIZES = {
    "small": dict(n_layers=4, n_heads=4, d_model=256, seq_len=256, vocab_size=2048, micro_batch=2, global_batch=16),
    "medium": dict(n_layers=6, n_heads=6, d_model=384, seq_len=256, vocab_size=8192, micro_batch=2, global_batch=8),
    "llama": dict(n_layers=4, n_heads=8, d_model=256, seq_len=256, vocab_size=2048, micro_batch=2, global_batch=16,
                  extra='arch = "llama"\nn_kv_heads = 2\nffn_hidden = 704\n'),
}
# name: (ranks, tp, pp)
LAYOUTS = {"1": (1, 1, 1), "pp2": (2, 1, 2), "tp2": (2, 2, 1), "dp2": (2, 1, 1)}
FAMILIES = ["gemm", "attention", "elementwise", "communication", "pipeline_idle", "optimizer"]
SHORT = {"gemm": "gemm", "attention": "attn", "elementwise": "elem", "communication": "comm",
         "pipeline_idle": "idle", "optimizer": "optim"}
SMALL_SHARE = 0.05

MODEL = """[model]
{extra}n_layers = {n_layers}
n_heads = {n_heads}
d_model = {d_model}
seq_len = {seq_len}
vocab_size = {vocab_size}

[train]
device = "cpu"
micro_batch_size = {micro_batch}
global_batch_size = {global_batch}
steps = {steps}
log_interval = 1
trace = false
output_dir = "{out}"

[data]
synthetic = true
"""


def run(cmd, env):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-3000:]}")
    return r.stdout


def launcher(ranks):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] if ranks > 1 else []


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def judge(predicted, measured, step):
    """(text, within?) of a family: relative error when it is at least 5% of the step."""
    if measured >= SMALL_SHARE * step:
        err = predicted / measured - 1
        return f"{100 * err:+.0f}%", err
    return f"({100 * (predicted - measured) / step:+.1f})", (predicted - measured) / (SMALL_SHARE * step)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tripod", default="build/bin/tripod")
    ap.add_argument("--steps", type=int, default=4, help="profiled steps per run (after one warm-up step)")
    ap.add_argument("--repeats", type=int, default=3, help="timings per calibration point")
    ap.add_argument("--sizes", default="small,medium,llama")
    ap.add_argument("--layouts", default="1,pp2,tp2,dp2")
    ap.add_argument("--step-tolerance", type=float, default=0.15)
    ap.add_argument("--family-tolerance", type=float, default=0.25)
    ap.add_argument("--json", help="also write every run's check here")
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    tmp = tempfile.mkdtemp(prefix="tripod_plan_cpu_")

    print(f"{'model':>6} {'layout':>6} {'sched':>5} | {'predicted':>9} {'measured':>9} {'error':>6} | "
          + " ".join(f"{SHORT[f]:>7}" for f in FAMILIES) + " | load")
    bad, rows, results = 0, 0, []
    for size in a.sizes.split(","):
        shape = SIZES[size]
        for layout in a.layouts.split(","):
            ranks, tp, pp = LAYOUTS[layout]
            out = os.path.join(tmp, f"run_{size}_{layout}")
            cfg = os.path.join(tmp, f"{size}.toml")
            with open(cfg, "w") as f:
                f.write(MODEL.format(steps=a.steps + 1, out=out, **{"extra": "", **shape}))

            def calibrate(tag):
                hw = os.path.join(tmp, f"hw_{size}_{layout}_{tag}.toml")
                run(launcher(ranks) + [a.tripod, "calibrate", "--out", hw, "--force", "--repeats", str(a.repeats),
                                       "--model", cfg, "--micro-batches", str(shape["micro_batch"])], env)
                return hw

            load0 = load()
            before = calibrate("before")
            run(launcher(ranks) + [a.tripod, "train", "--config", cfg, "--set", f"parallel.tp={tp}",
                                   "--set", f"parallel.pp={pp}", "--set", f"parallel.hardware=\"{before}\"",
                                   "--profile-steps", str(a.steps)], env)
            after = calibrate("after")
            checks = [json.loads(run([a.tripod, "plan", "--check", out, "--hardware", hw, "--json"], env))
                      for hw in (before, after)]
            c = checks[0]
            step_m = c["step"]["measured"]
            step_p = sum(x["step"]["predicted"] for x in checks) / 2
            err = step_p / step_m - 1
            ok = abs(err) <= a.step_tolerance
            cells, fam = [], {}
            for f in FAMILIES:
                p = sum(x[f]["predicted"] for x in checks) / 2
                m = c[f]["measured"]
                text, e = judge(p, m, step_m)
                within = abs(e) <= a.family_tolerance
                ok &= within
                cells.append(f"{text + ('' if within else '!'):>7}")
                fam[f] = {"predicted": p, "measured": m}
            bad += not ok
            rows += 1
            results.append({"model": size, "layout": layout, "schedule": c["layout"]["schedule"],
                            "step": {"predicted": step_p, "measured": step_m}, **fam})
            print(f"{size:>6} {layout:>6} {c['layout']['schedule']:>5} | {step_p:>8.3f}s {step_m:>8.3f}s "
                  f"{100 * err:>+5.1f}% | " + " ".join(cells) + f" | {load0:.1f}-{load():.1f}"
                  + ("" if ok else "  <- off"), flush=True)
    print(f"{rows - bad} of {rows} runs within {100 * a.step_tolerance:.0f}% (step) and "
          f"{100 * a.family_tolerance:.0f}% (every family; in parentheses: a family under "
          f"{100 * SMALL_SHARE:.0f}% of the step, its difference in % of the step; ! marks a miss)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
