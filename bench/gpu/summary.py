#!/usr/bin/env python3
"""Side-by-side table of tripod_gpu_bench --json and torch_baseline.py --json results: tokens/s,
MFU, peak memory and tripod's time split per model, PyTorch's tokens/s (compiled when there is a
compiled run, else eager) and the ratio, and the targets (MFU >= 40% at 124M and >= 50% at 350M,
then >= 1.15x the compiled PyTorch baseline's tokens/s). Any number of files, each a tripod or a
torch result (their "bench" field); models from several tripod files (one per run.sh bench stage)
are merged, and an eager and a compiled torch run of one model both show.

  summary.py RESULT.json [RESULT.json ...]
  summary.py --ncu NCU_CSV_LOG      (the per-kernel times of run.sh's profile stage, top 25)
  summary.py --fp8 RESULT.json ...  (tripod_gpu_bench --precision both: fp8 against bf16 per model and
                                     the targets, 1.3x at the Llama-3.2-1B shape and 1.15x at 350M)
"""
import csv
import json
import sys
from collections import defaultdict

MFU_TARGET = {"124M": 0.40, "350M": 0.50}
RATIO_TARGET = 1.15
FP8_TARGET = {"1B": 1.30, "350M": 1.15}


def merge(docs):
    """(tripod, torch runs by model {"eager": row, "compiled": row}) from a list of result files."""
    tripod, torch = None, defaultdict(dict)
    for d in docs:
        if d.get("bench") == "torch":
            for m in d["models"]:
                m = dict(m, torch=d.get("torch", "?"))
                torch[m["model"]]["compiled" if m.get("compiled", True) else "eager"] = m
        elif tripod is None:
            tripod = dict(d, models=[m for m in d["models"] if m.get("precision", "bf16") == "bf16"])
        else:
            tripod["models"] += [m for m in d["models"] if m.get("precision", "bf16") == "bf16"]
    return tripod, torch


def bench_table(tripod, torch_runs):
    versions = sorted({r["torch"] for runs in torch_runs.values() for r in runs.values()})
    lines = [f"GPU: {tripod['gpu']} (MFU against {tripod['peak_tflops']:.0f} TFLOP/s dense bf16), seq {tripod['seq_len']}"
             + (f"; PyTorch {', '.join(versions)}" if versions else "; no PyTorch baseline")]
    head = (f"{'model':>6} {'B':>4} {'tripod tok/s':>13} {'MFU':>6} {'peak GiB':>9} {'GEMM':>6} {'attn':>6} "
            f"{'other':>6} {'gap':>6} {'torch B':>7} {'torch tok/s':>12} {'MFU':>6} {'peak GiB':>9} {'ratio':>6}  targets")
    lines.append(head)
    for m in tripod["models"]:
        runs = torch_runs.get(m["model"], {})
        t = runs.get("compiled") or runs.get("eager")
        goal = MFU_TARGET.get(m["model"])
        notes = [f"MFU {'ok' if m['mfu'] >= goal else 'below'} ({goal:.0%})"] if goal else []
        row = (f"{m['model']:>6} {m['micro_batch']:>4} {m['tokens_per_s']:>13.0f} {100 * m['mfu']:>5.1f}% "
               f"{m['peak_gib']:>9.2f} {100 * m['gemm']:>5.1f}% {100 * m['attention']:>5.1f}% "
               f"{100 * m['other']:>5.1f}% {100 * m['host_gap']:>5.1f}%")
        if t:
            ratio = m["tokens_per_s"] / t["tokens_per_s"]
            if t is runs.get("compiled"):
                notes.append(f"ratio {'ok' if ratio >= RATIO_TARGET else 'below'} ({RATIO_TARGET}x compiled)")
            else:
                notes.append("vs torch eager (no compiled run)")
            e = runs.get("eager")
            if e and e is not t:
                notes.append(f"eager {e['tokens_per_s']:.0f} tok/s, {m['tokens_per_s'] / e['tokens_per_s']:.2f}x")
            row += (f" {t['micro_batch']:>7} {t['tokens_per_s']:>12.0f} {100 * t['mfu']:>5.1f}% {t['peak_gib']:>9.2f} "
                    f"{ratio:>5.2f}x")
        else:
            row += f" {'-':>7} {'-':>12} {'-':>6} {'-':>9} {'-':>6}"
        lines.append(row + "  " + ", ".join(notes))
    return "\n".join(lines)


def fp8_table(docs):
    """fp8 against bf16 tokens/s per (model, seq) of tripod_gpu_bench --precision both results."""
    runs = defaultdict(dict)
    gpu = "?"
    for d in docs:
        gpu = d.get("gpu", gpu)
        for m in d["models"]:
            runs[(m["model"], m.get("seq_len", d.get("seq_len")))][m.get("precision", "bf16")] = m
    lines = [f"FP8 against bf16 on {gpu} (the same process, micro-batch and steps)",
             f"{'model':>6} {'seq':>5} {'B':>4} {'bf16 tok/s':>11} {'fp8 tok/s':>10} {'ratio':>6} {'peak GiB bf16/fp8':>18}"
             "  target"]
    for (model, seq), r in runs.items():
        b, f = r.get("bf16"), r.get("fp8")
        if not b or not f:
            lines.append(f"{model:>6} {seq:>5}  incomplete: {', '.join(sorted(r))} only")
            continue
        ratio = f["tokens_per_s"] / b["tokens_per_s"]
        goal = FP8_TARGET.get(model)
        note = f"{'ok' if ratio >= goal else 'below'} ({goal:.2f}x)" if goal else ""
        recipe = f.get("fp8_recipe") or "?"
        lines.append(f"{model:>6} {seq:>5} {f['micro_batch']:>4} {b['tokens_per_s']:>11.0f} {f['tokens_per_s']:>10.0f} "
                     f"{ratio:>5.2f}x {b['peak_gib']:>8.2f} / {f['peak_gib']:<7.2f}  {note} [{recipe}]")
    return "\n".join(lines)


def ncu_table(path, top=25):
    """Kernel time per kernel name from `ncu --csv --metrics gpu__time_duration.sum,...` output."""
    # to microseconds; ncu 2025 writes "ns" (older versions "nsecond")
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
    rows = []
    with open(path, errors="replace") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    for r in csv.DictReader(lines):
        if "Metric Name" in r and r.get("Kernel Name"):
            rows.append(r)
    us, sm, dram, count = defaultdict(float), defaultdict(list), defaultdict(list), defaultdict(set)
    for r in rows:
        k, name = r["Kernel Name"][:90], r["Metric Name"]
        v = float(r["Metric Value"].replace(",", "")) if r["Metric Value"] not in ("", "n/a") else 0.0
        count[k].add(r["ID"])
        if name == "gpu__time_duration.sum":
            if r["Metric Unit"] not in scale:
                raise SystemExit(f"error: {path}: unknown time unit {r['Metric Unit']!r} of {name}")
            us[k] += v * scale[r["Metric Unit"]]
        elif name.startswith("sm__throughput"):
            sm[k].append(v)
        elif name.startswith("dram__throughput"):
            dram[k].append(v)
    total = sum(us.values()) or 1.0
    out = [f"ncu: {sum(len(c) for c in count.values())} kernels, {total / 1e3:.2f} ms of GPU time; top {top} by time",
           f"{'share':>6} {'ms':>8} {'calls':>6} {'SM %':>6} {'DRAM %':>7}  kernel"]
    for k in sorted(us, key=us.get, reverse=True)[:top]:
        avg = lambda xs: sum(xs) / len(xs) if xs else 0.0
        out.append(f"{100 * us[k] / total:>5.1f}% {us[k] / 1e3:>8.3f} {len(count[k]):>6} {avg(sm[k]):>6.1f} "
                   f"{avg(dram[k]):>7.1f}  {k}")
    return "\n".join(out)


def main(argv):
    if len(argv) == 2 and argv[0] == "--ncu":
        print(ncu_table(argv[1]))
        return 0
    if len(argv) >= 2 and argv[0] == "--fp8":
        docs = []
        for p in argv[1:]:
            with open(p) as f:
                docs.append(json.load(f))
        print(fp8_table(docs))
        return 0
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__, file=sys.stderr)
        return 2
    docs = []
    for p in argv:
        with open(p) as f:
            docs.append(json.load(f))
    tripod, torch = merge(docs)
    if tripod is None:
        print("error: no tripod_gpu_bench result among " + " ".join(argv), file=sys.stderr)
        return 2
    print(bench_table(tripod, torch))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
