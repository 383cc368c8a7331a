#!/usr/bin/env python3
"""tripod's Hugging Face exports judged by transformers itself (run.sh's hf stage).

For each family (a GPT-2, a Llama and a Mixtral-shaped mixture of experts, the tiny configs with
the KJV corpus and its tokenizer): tripod trains it a few steps, `tripod ckpt convert --to
safetensors` exports the checkpoint, and two things score the same validation chapters in
rolling windows (lm-evaluation-harness's rules, as `tripod eval --task bits_per_byte` does):
  - tripod:        `tripod eval --task bits_per_byte --samples-out` on the CPU (f32), per chapter
                   its log-likelihood;
  - transformers:  AutoModelForCausalLM.from_pretrained(the exported folder) in float32 (TF32 off,
                   eager attention) on the GPU when there is one, on the token ids of
                   `tripod data encode`, with the end-of-document id the corpus ends its
                   chapters with as the first window's prefix.
Each chapter's log-likelihoods must agree within --tolerance (relative, default 1e-5). A GPT-2
export is one safetensors file; its folder gets the config.json of the same model
(GPT2LMHeadModel: tanh GELU, tied head).

  hf_check.py --tripod BIN --configs DIR --corpus PREFIX --tokenizer MODEL --work DIR
              [--device cuda|cpu] [--families gpt2,llama,mixtral] [--steps 30] [--chapters 3]
              [--out FILE] [--tripod-only]

--corpus is an indexed dataset whose documents end with the tokenizer's end-of-document id (the
bundle's KJV corpus, build/corpus/kjv_text_document with kjv_bpe4096.model); its last --chapters
documents are scored.

Prints one table row per family and chapter (and writes it to --out); the last line is a
one-line summary. Exits 1 when a family fails or disagrees. --tripod-only runs tripod's half
(training, export, encoding, evaluation) without transformers.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

FAMILIES = {
    # name: (config, extra --set values)
    "gpt2": ("tiny_kjv.toml", []),
    "llama": ("tiny_llama.toml", ["model.vocab_size=4096"]),
    "mixtral": ("tiny_moe.toml", ["model.vocab_size=4096"]),
}


def run(cmd, log):
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    r = subprocess.run(cmd, capture_output=True, text=True)
    log.write(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"{os.path.basename(cmd[0])} {cmd[1]} failed (exit {r.returncode}): "
                           + ((r.stderr.strip().splitlines() or ["no message"])[-1]))
    return r.stdout


def rolling_windows(tokens, eot, L):
    """get_rolling_token_windows(context_len=1) made disjoint: (row, n) with the last n of row[1:] scored."""
    out = []
    first = min(L, len(tokens))
    out.append(([eot] + tokens[:first], first))
    done = first
    while done < len(tokens):
        n = min(len(tokens) - done, L)
        end = done + n
        out.append((tokens[end - L - 1:end], n))
        done = end
    return out


def model_section(metadata):
    """The scalar keys of the [model] section of the checkpoint's resolved config."""
    with open(metadata) as f:
        toml = json.load(f)["config_toml"]
    m, section = {}, None
    for line in toml.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[model]" and "=" in line:
            k, v = (x.strip() for x in line.split("=", 1))
            m[k] = v.strip("'\"") if v[0] in "'\"" else (v == "true" if v in ("true", "false") else float(v) if "." in v or "e" in v else int(v))
    return m


def chapters(a, work, log):
    """The last --chapters chapters of the corpus (valid and test live at its end): their text (as
    the tokenizer decodes it) and the end-of-document id they end with."""
    prefix, model = a.corpus, a.tokenizer
    n = json.loads(run([a.tripod, "data", "inspect", prefix, "--json"], log))["documents"]
    texts, eot = [], None
    for i in range(n - a.chapters, n):
        doc = json.loads(run([a.tripod, "data", "inspect", prefix, "--json", "--tokenizer-model", model,
                              "--show-document", str(i)], log))["document"]
        eot = doc["ids"][-1]
        texts.append(doc["text"])
    tasks = os.path.join(work, "chapters.jsonl")
    with open(tasks, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    ids = []
    for k, t in enumerate(texts):
        path = os.path.join(work, f"chapter{k}.txt")
        with open(path, "w") as f:
            f.write(t)
        ids.append(json.loads(run([a.tripod, "data", "encode", "--tokenizer-model", model, "--input", path], log)))
    return tasks, ids, eot, model


def tripod_side(a, family, tasks, model, log):
    """Trains, exports and scores one family: (exported folder, seq_len, per-chapter log-likelihoods, token counts)."""
    config, sets = FAMILIES[family]
    d = os.path.join(a.work, family)
    if os.path.exists(d):
        shutil.rmtree(d)
    ckpt = os.path.join(d, "ckpt")
    common = ["--set", f'data.prefixes=["{a.corpus}"]', "--set", f'data.tokenizer="{model}"', "--set", "data.synthetic=false",
              "--set", 'data.split="969,30,1"']
    for s in sets:
        common += ["--set", s]
    run([a.tripod, "train", "--config", os.path.join(a.configs, config), *common, "--set", f"train.steps={a.steps}",
         "--set", f"train.device={a.device}", "--set", "train.log_interval=10", "--set", "train.eval_interval=0",
         "--set", f"train.output_dir={d}/run", "--set", f"checkpoint.dir={ckpt}", "--set",
         f"checkpoint.interval={a.steps}", "--set", "checkpoint.overwrite=true"], log)
    it = os.path.join(ckpt, f"iter_{a.steps:07d}")
    hf = os.path.join(d, "hf")
    if family == "gpt2":
        os.makedirs(hf, exist_ok=True)
    run([a.tripod, "ckpt", "convert", it, "--to", "safetensors", os.path.join(hf, "model.safetensors") if family == "gpt2" else hf], log)
    m = model_section(os.path.join(it, "metadata.json"))
    seq_len = m["seq_len"]
    if family == "gpt2":
        # GPT2LMHeadModel's config for the file (the export writes the weights only).
        with open(os.path.join(hf, "config.json"), "w") as f:
            json.dump({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": m["vocab_size"],
                       "n_positions": m["max_positions"], "n_embd": m["d_model"], "n_layer": m["n_layers"],
                       "n_head": m["n_heads"], "n_inner": m.get("ffn_hidden") or 4 * m["d_model"],
                       "activation_function": "gelu_new", "layer_norm_epsilon": m.get("norm_eps", 1e-5),
                       "tie_word_embeddings": True, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}, f)
    samples = os.path.join(d, "samples.jsonl")
    run([a.tripod, "eval", "--load", it, "--set", "train.device=cpu", "--task", "bits_per_byte", "--task-file", tasks,
         "--samples-out", samples, "--json"], log)
    lls, counts = [], []
    with open(samples) as f:
        for line in f:
            s = json.loads(line)
            lls.append(s["loglikelihood"])
            counts.append(s["tokens"])
    return hf, seq_len, lls, counts


def hf_side(hf, ids, eot, seq_len, device):
    import torch
    from transformers import AutoModelForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32, attn_implementation="eager")
    model = model.to(device).eval()
    out = []
    with torch.no_grad():
        for tokens in ids:
            total = 0.0
            for row, n in rolling_windows(tokens, eot, seq_len):
                x = torch.tensor([row[:-1]], device=device)
                logp = torch.log_softmax(model(x).logits[0].double(), dim=-1)
                y = torch.tensor(row[1:], device=device)
                total += logp[torch.arange(len(row) - 1, device=device), y][-n:].sum().item()
            out.append(total)
    return type(model).__name__, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tripod", default="tripod")
    ap.add_argument("--configs", required=True, help="tripod's configs/ folder")
    ap.add_argument("--corpus", required=True, help="an indexed dataset's prefix (PREFIX.bin, PREFIX.idx)")
    ap.add_argument("--tokenizer", required=True, help="the tokenizer it was made with")
    ap.add_argument("--work", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where tripod trains and transformers runs")
    ap.add_argument("--families", default="gpt2,llama,mixtral")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--chapters", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=1e-5)
    ap.add_argument("--tripod-only", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    families = [f for f in a.families.split(",") if f]
    for f in families:
        if f not in FAMILIES:
            print(f"error: --families: unknown family '{f}' (valid: {', '.join(FAMILIES)})", file=sys.stderr)
            return 2
    os.makedirs(a.work, exist_ok=True)
    lines, bad, worst = [], [], 0.0
    with open(os.path.join(a.work, "hf_check.log"), "a") as log:
        tasks, ids, eot, model = chapters(a, a.work, log)
        lines.append(f"{'family':8} {'class':22} {'chapter':>7} {'tokens':>6} {'tripod ll':>14} {'transformers ll':>16} {'rel diff':>9}")
        for family in families:
            try:
                hf, seq_len, lls, counts = tripod_side(a, family, tasks, model, log)
                if [len(t) for t in ids] != counts:
                    raise RuntimeError(f"tripod eval scored {counts} tokens, tripod data encode gave {[len(t) for t in ids]}")
                cls, ref = ("-", [math.nan] * len(lls)) if a.tripod_only else hf_side(hf, ids, eot, seq_len, a.device)
            except Exception as e:  # one family's failure is reported, the others still run
                lines.append(f"{family:8} FAILED: {e}")
                bad.append(family)
                continue
            for k, (mine, theirs) in enumerate(zip(lls, ref)):
                rel = abs(mine - theirs) / max(abs(theirs), 1e-30)
                if not a.tripod_only:
                    worst = max(worst, rel)
                    if not rel <= a.tolerance:
                        bad.append(f"{family} chapter {k}")
                lines.append(f"{family:8} {cls:22} {k:>7} {counts[k]:>6} {mine:>14.6f} {theirs:>16.6f} {rel:>9.2e}")
    if a.tripod_only:
        summary = f"hf: tripod's half only ({len(families) - len(bad)} of {len(families)} families trained, exported and scored)"
    elif bad:
        summary = f"hf: FAILED {', '.join(bad)} (tolerance {a.tolerance:g}; worst rel diff {worst:.2e})"
    else:
        summary = f"hf: {', '.join(families)} equal to transformers, worst rel diff {worst:.2e} (tolerance {a.tolerance:g})"
    lines.append(summary)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
