// Tokenizer speed on one core, text -> ids, tripod beside tiktoken (its Rust core built to WASM)
// and Hugging Face tokenizers (the Rust library's Node binding) on the same text in the same run;
// then `tripod data preprocess` with 1 and 2 workers. Prints tables (medians of --runs).
// Run through bench/tokenizer_bench.sh, which installs the references and makes the files.
// Usage: node tokenizer_bench.mjs REFS_DIR BUILD_DIR FILES_DIR TEXT RUNS
import { createRequire } from "node:module";
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const [refs, build, files, bibleFile, runsArg] = process.argv.slice(2);
const runs = Number(runsArg || 5);
const require = createRequire(path.join(refs, "node_modules", "x.js"));
const tiktoken = require("tiktoken");
const hf = require("tokenizers");
// Documents as preprocess sees them: the Bible's blocks (a heading, a chapter's verses), one per
// line. Every encoder encodes each document separately (the references slow down badly on one
// 4 MB string: HF tokenizers takes minutes).
const textFile = path.join(files, "kjv_docs.txt");
if (!fs.existsSync(textFile))
  fs.writeFileSync(textFile, fs.readFileSync(bibleFile, "utf8").split("\n\n").map((b) => b.trim().replace(/\n/g, " "))
    .filter((b) => b.length > 0).join("\n") + "\n");
const docs = fs.readFileSync(textFile, "utf8").split("\n").filter((d) => d.length > 0);
const mb = docs.reduce((n, d) => n + Buffer.byteLength(d), 0) / 1e6;
const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];

// cl100k as a Hugging Face tokenizer.json, the way transformers converts tiktoken files: every
// split of a token into two tokens is a merge, in the merged token's rank order; ignore_merges.
function cl100kJson(out) {
  if (fs.existsSync(out)) return out;
  fs.mkdirSync(path.dirname(out), { recursive: true });
  const printable = (b) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const bc = [];
  let shifted = 256;
  for (let b = 0; b < 256; ++b) bc[b] = String.fromCodePoint(printable(b) ? b : shifted++);
  const vocab = {};
  const rankOf = new Map();
  for (const line of fs.readFileSync(path.join(files, "cl100k_base.tiktoken"), "utf8").split("\n")) {
    if (!line) continue;
    const [b64, r] = line.split(" ");
    const s = Array.from(Buffer.from(b64, "base64"), (b) => bc[b]).join("");
    vocab[s] = Number(r);
    rankOf.set(s, Number(r));
  }
  const merges = [];
  for (const [tok, r] of rankOf) {
    const chars = Array.from(tok);
    const local = [];
    for (let i = 1; i < chars.length; ++i) {
      const a = chars.slice(0, i).join(""), b = chars.slice(i).join("");
      if (rankOf.has(a) && rankOf.has(b)) local.push([a, b, r]);
    }
    local.sort((x, y) => rankOf.get(x[0]) - rankOf.get(y[0]) || rankOf.get(x[1]) - rankOf.get(y[1]));
    merges.push(...local);
  }
  merges.sort((x, y) => x[2] - y[2]);
  const pattern = JSON.parse(fs.readFileSync(path.join(path.dirname(require.resolve("tiktoken")), "encoders",
                                                       "cl100k_base.json"), "utf8")).pat_str;
  fs.writeFileSync(out, JSON.stringify({
    version: "1.0", truncation: null, padding: null, normalizer: null, post_processor: null,
    added_tokens: [{ id: 100257, content: "<|endoftext|>", single_word: false, lstrip: false, rstrip: false,
                     normalized: false, special: true }],
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: pattern }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges: merges.map((m) => [m[0], m[1]]) },
  }));
  return out;
}

async function timeRuns(fn) {
  const speeds = [];
  let ids = null;
  for (let r = 0; r < runs; ++r) {
    const t0 = process.hrtime.bigint();
    ids = await fn();
    speeds.push(mb / (Number(process.hrtime.bigint() - t0) / 1e9));
  }
  return { mbs: median(speeds), ids };
}

function tripodBench(model) {
  const out = execFileSync(path.join(build, "bin", "bench_tokenizer"),
                           ["--tokenizer-model", model, "--input", textFile, "--runs", String(runs)], { encoding: "utf8" });
  return JSON.parse(out);
}

const rows = [];
const tokenizers = [
  { name: "GPT-2", tripod: path.join(files, "gpt2", "vocab.json"), tiktoken: "gpt2",
    hf: path.join(files, "gpt2-hf", "tokenizer.json") },
  { name: "cl100k", tripod: path.join(files, "cl100k_base.tiktoken"), tiktoken: "cl100k_base",
    hf: cl100kJson(path.join(files, "cl100k-hf", "tokenizer.json")) },
];
for (const t of tokenizers) {
  const mine = tripodBench(t.tripod);
  const enc = tiktoken.get_encoding(t.tiktoken);
  const tk = await timeRuns(() => {
    let n = 0;
    for (const d of docs) n += enc.encode_ordinary(d).length;
    return n;
  });
  const tok = hf.Tokenizer.fromFile(t.hf);
  const h = await timeRuns(async () => {
    let n = 0;
    for (const d of docs) n += (await tok.encode(d, null, { addSpecialTokens: false })).getIds().length;
    return n;
  });
  const faster = Math.max(tk.mbs, h.mbs);
  rows.push([t.name, mine.median_mb_s, tk.mbs, h.mbs, mine.median_mb_s / faster,
             mine.ids === tk.ids && tk.ids === h.ids ? "yes" : `NO: ${mine.ids} ${tk.ids} ${h.ids}`]);
}

const fmtRow = (cells) => "| " + cells.join(" | ") + " |";
console.log(`\ntext -> ids on one thread: ${docs.length} documents (${path.basename(textFile)}), ${mb.toFixed(2)} MB, ` +
            `median of ${runs} runs ` +
            `(load average ${os.loadavg()[0].toFixed(2)} on ${os.cpus().length} cores)\n`);
console.log(fmtRow(["tokenizer", "tripod MB/s", "tiktoken (WASM) MB/s", "HF tokenizers MB/s", "tripod / faster",
                    "same number of ids"]));
console.log(fmtRow(["---", "---:", "---:", "---:", "---:", "---"]));
for (const r of rows)
  console.log(fmtRow([r[0], r[1].toFixed(2), r[2].toFixed(2), r[3].toFixed(2), r[4].toFixed(2) + "x", r[5]]));

// preprocess: the documents sixteen times over (69 MB), one per line, with 1 and 2 encoding
// threads; tripod's own figures (reading, encoding, writing; the tokenizer's loading apart): MB/s
// and CPU seconds of all threads per MB (the same for both when nothing serial is added).
// bench/preprocess_workers.sh measures the scaling alone, without the npm references.
const bigFile = path.join(files, "kjv_docs_x16.txt");
if (!fs.existsSync(bigFile)) fs.writeFileSync(bigFile, fs.readFileSync(textFile, "utf8").repeat(16));
// The worker counts take turns (1, 2, 1, 2, ...), so a change in the machine's load hits both.
const counts = [1, 2];
const speeds = counts.map(() => []), cpus = counts.map(() => []);
for (let r = 0; r < Math.max(3, runs); ++r) {
  counts.forEach((workers, i) => {
    // A new dataset each run: replacing the last one would free its page cache inside the timed span.
    for (const ext of [".bin", ".idx"]) fs.rmSync(path.join(files, "bench_pre" + ext), { force: true });
    const p = spawnSync(path.join(build, "bin", "tripod"), ["data", "preprocess", "--input", bigFile,
      "--input-format", "text", "--tokenizer-model", path.join(files, "cl100k_base.tiktoken"), "--output-prefix",
      path.join(files, "bench_pre"), "--workers", String(workers), "--overwrite", "--no-progress"], { encoding: "utf8" });
    const m = /from ([0-9.]+) MB in [0-9.]+ s \(([0-9.]+) MB\/s, ([0-9.]+) CPU s/.exec(p.stdout + p.stderr);
    if (p.status !== 0 || !m) throw new Error(`tripod data preprocess failed: ${p.stderr}`);
    speeds[i].push(Number(m[2]));
    cpus[i].push(Number(m[3]) / Number(m[1]));
  });
}
const pre = counts.map((w, i) => [w, median(speeds[i]), median(cpus[i])]);
console.log(`\ndata preprocess (cl100k, ${path.basename(bigFile)}, one document per line; MB/s as tripod reports it, ` +
            `loading the ranks apart; load average ${os.loadavg()[0].toFixed(2)} on ${os.cpus().length} cores)\n`);
console.log(fmtRow(["workers", "MB/s", "vs 1 worker", "CPU s per MB"]));
console.log(fmtRow(["---:", "---:", "---:", "---:"]));
for (const [w, s, c] of pre) console.log(fmtRow([w, s.toFixed(2), (s / pre[0][1]).toFixed(2) + "x", c.toFixed(4)]));
