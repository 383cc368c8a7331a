// Helpers for the data tests: temporary directories, a test-only writer of Megatron indexed
// datasets that follows the format byte for byte (independently of data/indexed_dataset.cpp),
// the fixture tokenizer, and running the tripod executable.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "test_util.h"

#include "data/tokenizer.h"

namespace tripod::testing {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tripod_data_XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    if (!p) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}
inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}
inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Appends `v` as `bytes` little-endian bytes.
inline void put_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Documents as lists of sequences of token ids.
using Docs = std::vector<std::vector<std::vector<int64_t>>>;

struct MegatronFiles {
  std::vector<uint8_t> idx, bin;
};

// Megatron-LM's _IndexWriter layout: "MMIDIDX\0\0", <Q version 1, <B dtype code, <Q sequence
// count, <Q document-index length (documents + 1), int32 lengths, int64 byte pointers (running
// sum of length * itemsize), int64 document index starting at 0.
inline MegatronFiles megatron_files(const Docs& docs, uint8_t dtype_code, int itemsize) {
  MegatronFiles f;
  std::vector<int64_t> lengths, doc_index{0};
  for (const auto& doc : docs) {
    for (const auto& seq : doc) {
      lengths.push_back(static_cast<int64_t>(seq.size()));
      for (int64_t t : seq) put_le(f.bin, static_cast<uint64_t>(t), itemsize);
    }
    doc_index.push_back(static_cast<int64_t>(lengths.size()));
  }
  const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  f.idx.insert(f.idx.end(), magic, magic + 9);
  put_le(f.idx, 1, 8);
  put_le(f.idx, dtype_code, 1);
  put_le(f.idx, lengths.size(), 8);
  put_le(f.idx, doc_index.size(), 8);
  for (int64_t len : lengths) put_le(f.idx, static_cast<uint64_t>(len), 4);
  int64_t ptr = 0;
  for (int64_t len : lengths) {
    put_le(f.idx, static_cast<uint64_t>(ptr), 8);
    ptr += len * itemsize;
  }
  for (int64_t d : doc_index) put_le(f.idx, static_cast<uint64_t>(d), 8);
  return f;
}

inline void write_megatron(const std::string& prefix, const Docs& docs, uint8_t dtype_code, int itemsize) {
  MegatronFiles f = megatron_files(docs, dtype_code, itemsize);
  write_bytes(prefix + ".idx", f.idx);
  write_bytes(prefix + ".bin", f.bin);
}

inline std::string fixture(const std::string& name) {
  return tripod::test::source_dir() + "/tests/fixtures/data/" + name;
}

// A 400-piece BPE tokenizer trained on Genesis 1-8 (in well under a second) into `dir`.
inline std::string train_fixture_tokenizer(const TempDir& dir) {
  TokenizerTrainOptions o;
  o.inputs = {fixture("genesis_1_8.jsonl")};
  o.vocab_size = 400;
  o.model_prefix = dir / "genesis400";
  o.threads = 1;
  train_tokenizer(o);
  return o.model_prefix + ".model";
}

using CliResult = tripod::test::CmdResult;

// Runs the tripod executable with `args` (already shell-quoted).
inline CliResult run_tripod(const std::string& args, const TempDir&) {
  return tripod::test::run_cmd("'" + tripod::test::tripod_bin() + "' " + args + " </dev/null");
}

inline std::string quote(const std::string& s) { return "'" + s + "'"; }

}  // namespace tripod::testing
