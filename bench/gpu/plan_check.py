#!/usr/bin/env python3
"""The planner against the GPU benchmarks of the same run (run.sh's plan-check stage): for each
tripod_gpu_bench --json result, `tripod plan` predicts that model's step (one GPU, the bench's
micro-batch, one micro-batch per step, no recomputation) on the hardware file `tripod calibrate`
just wrote and on the datasheet file it was based on, beside the step the bench measured. With
--run, the table of `tripod plan --check` of a run trained with --profile-steps is added (every
family measured beside its prediction). Prints the table (and writes it to --out); the last line
is a one-line summary. Exits 1 when a calibrated prediction is off by more than --tolerance.

  plan_check.py --tripod BIN --hardware CAL.toml [--base DATASHEET.toml] [--run RUN_DIR]
                [--tolerance 0.15] [--out FILE] BENCH.json...
  plan_check.py --config-of MODEL --out FILE BENCH.json   (the config the bench trained MODEL with)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def rows(paths):
    for p in paths:
        if not os.path.exists(p):
            continue
        with open(p) as f:
            doc = json.load(f)
        for m in doc.get("models", []):
            yield m


def predict(tripod, config_toml, micro_batch, hardware):
    """The predicted step in seconds, or a reason."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(config_toml)
        path = f.name
    try:
        r = subprocess.run([tripod, "plan", "--config", path, "--hardware", hardware, "--gpus", "1",
                            "--global-batch", str(micro_batch), "--top", "1", "--json", "--layout",
                            f"tp=1,pp=1,vp=1,cp=1,mbs={micro_batch},recompute=none,sp=false,distopt=false"],
                           capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["failed"])[-1]
    layout = json.loads(r.stdout)["layouts"][0]
    return layout["step_time_s"], layout


def family_rows(m, predicted):
    """The bench's op families (shares of its step) beside the planner's breakdown (seconds)."""
    ms = lambda share: share * m["step_ms"]
    fam = m["families"]
    measured = {"gemm": ms(fam.get("gemm", 0)), "attention": ms(fam.get("attention", 0))}
    measured["other"] = ms(sum(fam.values())) - measured["gemm"] - measured["attention"]
    pred = {"gemm": 1e3 * predicted["gemm"], "attention": 1e3 * predicted["attention"],
            "other": 1e3 * (predicted["elementwise"] + predicted["optimizer"])}
    row = f"{m['model']:>6}"
    for k in ("gemm", "attention", "other"):
        row += f" {pred[k]:>7.1f}/{measured[k]:>6.1f} {100 * (pred[k] / measured[k] - 1) if measured[k] else 0:>+4.0f}%"
    rest = ", ".join(f"{k} {ms(v):.1f}" for k, v in sorted(fam.items(), key=lambda kv: -kv[1])
                     if k not in ("gemm", "attention") and ms(v) >= 0.05)
    return [row + "  " + rest]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("--tripod", default="tripod")
    ap.add_argument("--hardware", help="the calibrated hardware file")
    ap.add_argument("--base", help="the datasheet file it was calibrated from")
    ap.add_argument("--run", help="a run directory trained with --profile-steps")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--out")
    ap.add_argument("--config-of", help="write the config the bench trained this model with to --out, and exit")
    a = ap.parse_args()

    if a.config_of:
        for m in rows(a.results):
            if m["model"] == a.config_of and "config_toml" in m and m.get("precision", "bf16") == "bf16":
                with open(a.out, "w") as f:
                    f.write(m["config_toml"])
                return 0
        sys.exit(f"no {a.config_of} result with its config in {' '.join(a.results)}")

    lines = [f"the planner on {a.hardware} (calibrated){' and ' + a.base + ' (datasheet)' if a.base else ''} "
             "against tripod_gpu_bench's measured step (one GPU, seq 1024)",
             f"{'model':>6} {'B':>4} {'measured':>10} {'calibrated':>11} {'error':>7}"
             + (f" {'datasheet':>10} {'error':>7}" if a.base else "")]
    bad, summary, split = 0, [], []
    for m in rows(a.results):
        if "config_toml" not in m:
            lines.append(f"{m['model']:>6}  (no config in the result: a tripod_gpu_bench before plan-check)")
            continue
        if m.get("precision", "bf16") != "bf16":
            lines.append(f"{m['model']:>6}  ({m['precision']}: the planner times bf16 GEMMs)")
            continue
        measured = m["step_ms"] / 1e3
        row = f"{m['model']:>6} {m['micro_batch']:>4} {1e3 * measured:>8.1f}ms"
        for i, hw in enumerate([a.hardware] + ([a.base] if a.base else [])):
            step, info = predict(a.tripod, m["config_toml"], m["micro_batch"], hw)
            if step is None:
                row += f" {'-':>10}  ({info})"
                bad += i == 0
                continue
            err = step / measured - 1
            row += f" {1e3 * step:>9.1f}ms {100 * err:>+6.1f}%"
            if i == 0:
                bad += abs(err) > a.tolerance
                summary.append(f"{m['model']} {100 * err:+.1f}%")
                if m.get("families"):
                    split.append(family_rows(m, info["breakdown"]))
        lines.append(row)
    if split:
        lines += ["", "by family, calibrated prediction beside the bench's timed steps (ms per step; other: every "
                  "op but GEMMs and attention, the optimizer's included)",
                  f"{'model':>6} {'gemm':>17} {'attention':>17} {'other':>17}  measured other ops"]
        for r in split:
            lines += r
    if a.run:
        r = subprocess.run([a.tripod, "plan", "--check", a.run], capture_output=True, text=True, timeout=120)
        lines += ["", r.stdout.rstrip() if r.returncode == 0 else f"plan --check {a.run}: {r.stderr.strip()}"]
        if r.returncode == 0:
            c = json.loads(subprocess.run([a.tripod, "plan", "--check", a.run, "--json"], capture_output=True,
                                          text=True, timeout=120).stdout)
            summary.append(f"profiled run {100 * (c['step']['predicted'] / c['step']['measured'] - 1):+.1f}%")
    lines.append(f"calibrated planner vs measured step: {', '.join(summary) if summary else 'nothing to compare'}"
                 f" (target within {100 * a.tolerance:.0f}%)")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 1 if bad or not summary else 0


if __name__ == "__main__":
    sys.exit(main())
