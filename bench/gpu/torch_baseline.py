#!/usr/bin/env python3
"""The PyTorch baseline of bench/gpu: the same GPT-2 (pre-LN, learned positions, tied embedding
with the vocabulary padded to a multiple of 128, GELU tanh, biases on every linear, LayerNorm eps
1e-5) trained the way a tuned PyTorch run does it: bf16 autocast, scaled_dot_product_attention
(flash), fused AdamW, gradient-norm clipping at 1.0 and torch.compile. Same shapes, micro-batch and
sequence as tripod_gpu_bench (--match reads them from its --json), same FLOPs convention
(6N + 6LCT per token, DESIGN.md) and the same peak for MFU.

  torch_baseline.py [--model 124M|350M|all] [--micro-batch B] [--match tripod.json]
                    [--steps N] [--warmup N] [--no-compile] [--json FILE]
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {"124M": (12, 12, 768), "350M": (24, 16, 1024)}
SEQ, VOCAB = 1024, 50257
# Dense bf16 TFLOP/s by name, as kernels/backend.cpp's gpu_peak_flops (used without --match).
PEAKS = [("H100 PCIe", 756), ("H100 NVL", 835), ("H100", 989), ("H800 PCIe", 756), ("H800", 989),
         ("H200 NVL", 835), ("H200", 989), ("H20", 148), ("GB200", 2500), ("B200", 2250),
         ("A100", 312), ("A800", 312), ("L40S", 362), ("L40", 181), ("L4", 121)]


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fc_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layers, n_heads, c):
        super().__init__()
        self.vocab_padded = (VOCAB + 127) // 128 * 128
        self.wte, self.wpe = nn.Embedding(self.vocab_padded, c), nn.Embedding(SEQ, c)
        self.blocks = nn.ModuleList(Block(c, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(c)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() > 1:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("proj.weight",)) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)[..., :VOCAB]  # tied head, padding excluded
        return F.cross_entropy(logits.float().view(-1, VOCAB), targets.reshape(-1))


def peak_flops(name):
    for key, tf in PEAKS:
        if key in name:
            return tf * 1e12
    return 989e12


def run(shape_name, batch, steps, warmup, compile_model, peak):
    n_layers, n_heads, c = SHAPES[shape_name]
    torch.manual_seed(0)
    model = GPT(n_layers, n_heads, c).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if compile_model else model
    gen = torch.Generator(device="cuda").manual_seed(1)
    data = torch.randint(0, VOCAB, (warmup + steps, batch, SEQ + 1), device="cuda", generator=gen)

    def step(i):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(data[i, :, :-1], data[i, :, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    with flash_only():
        t0 = time.perf_counter()
        for i in range(warmup):
            step(i)
        torch.cuda.synchronize()
        warm_s = time.perf_counter() - t0
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for i in range(warmup, warmup + steps):
            loss = step(i)
        loss.item()  # (the host sees the last loss, as tripod's logging does)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    tokens_per_s = batch * SEQ * steps / dt
    flops_per_token = 6 * n_params + 6 * n_layers * c * SEQ
    result = {"model": shape_name, "params": n_params, "micro_batch": batch, "tokens_per_s": tokens_per_s,
              "mfu": flops_per_token * tokens_per_s / peak, "step_ms": 1e3 * dt / steps,
              "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
              "reserved_gib": torch.cuda.max_memory_reserved() / 2**30, "warmup_s": warm_s,
              "compiled": compile_model}
    del model, opt, step_model, data
    torch.cuda.empty_cache()
    return result


def flash_only():
    """Attention through the flash kernel only (an error rather than a silent slower fallback)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:  # PyTorch < 2.3
        return torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="all", choices=["124M", "350M", "all"])
    ap.add_argument("--micro-batch", type=int, default=0, help="0: tripod's (--match) or the largest that fits")
    ap.add_argument("--match", help="tripod_gpu_bench --json output: its micro-batches and peak")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3, help="steps before measuring (compilation happens here)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", help="also write the results as one JSON object here")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: torch_baseline.py needs a CUDA GPU and PyTorch sees none", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0)
    peak, batches = peak_flops(name), {}
    if a.match:
        with open(a.match) as f:
            tj = json.load(f)
        peak = tj["peak_tflops"] * 1e12
        batches = {m["model"]: m["micro_batch"] for m in tj["models"]}
    out = {"bench": "torch", "gpu": name, "peak_tflops": peak / 1e12, "seq_len": SEQ, "torch": torch.__version__,
           "models": []}
    print(f"GPU 0: {name}, PyTorch {torch.__version__}, MFU against {peak / 1e12:.0f} TFLOP/s dense bf16")
    print(f"{'model':>6} {'params':>8} {'B':>5} {'tokens/s':>11} {'MFU':>6} {'step ms':>9} {'peak GiB':>10} "
          f"{'warmup s':>9}  compiled")
    for shape in SHAPES:
        if a.model not in ("all", shape):
            continue
        cands = [a.micro_batch] if a.micro_batch else [batches[shape]] if shape in batches else [64, 48, 32, 24, 16, 12, 8, 4, 2, 1]
        r = None
        for b in cands:
            try:
                try:
                    r = run(shape, b, a.steps, a.warmup, not a.no_compile, peak)
                except torch.cuda.OutOfMemoryError:
                    raise
                except Exception as e:  # a compiler failure: the eager model still gives a baseline
                    if a.no_compile:
                        raise
                    print(f"{shape}: torch.compile failed ({type(e).__name__}: {e}); measuring eager",
                          file=sys.stderr)
                    torch.cuda.empty_cache()
                    r = run(shape, b, a.steps, a.warmup, False, peak)
                break
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                print(f"{shape}: micro-batch {b} does not fit", file=sys.stderr)
        if r is None:
            print(f"{shape:>6}  does not fit")
            continue
        out["models"].append(r)
        print(f"{shape:>6} {r['params'] / 1e6:>7.1f}M {r['micro_batch']:>5} {r['tokens_per_s']:>11.0f} "
              f"{100 * r['mfu']:>5.1f}% {r['step_ms']:>9.1f} {r['peak_gib']:>10.2f} {r['warmup_s']:>9.1f}  "
              f"{r['compiled']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
