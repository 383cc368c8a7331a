// One tokenizer's encoding speed on one thread, for bench/tokenizer_bench.sh (which sets it beside
// tiktoken and Hugging Face tokenizers): every line of the input (a document) encoded, `runs`
// times, each run with a fresh cache (its warm-up is part of every run); prints one JSON line
// with the median.
//   bench_tokenizer --tokenizer-model T [--tokenizer-pattern P] --input TEXT [--runs 5]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"

using namespace tripod;

int main(int argc, char** argv) {
  std::string model, pattern, input;
  int runs = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokenizer-model") model = argv[i + 1];
    else if (a == "--tokenizer-pattern") pattern = argv[i + 1];
    else if (a == "--input") input = argv[i + 1];
    else if (a == "--runs") runs = std::max(1, std::atoi(argv[i + 1]));
    else {
      fmt::print(stderr, "error: unknown option {}\n", a);
      return 2;
    }
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    Tokenizer tok(model, "", pattern);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ifstream f(input, std::ios::binary);
    TRIPOD_INPUT_CHECK(f.good(), "--input {}: no such file", input);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    std::vector<std::string_view> docs;
    size_t bytes = 0;
    for (size_t at = 0; at < text.size();) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      if (end > at) docs.push_back(std::string_view(text).substr(at, end - at));
      bytes += end - at;
      at = end + 1;
    }
    std::vector<double> mbps;
    std::vector<int> ids;
    size_t n_ids = 0;
    for (int r = 0; r < runs; ++r) {
      WordCache cache;
      n_ids = 0;
      auto s = std::chrono::steady_clock::now();
      for (std::string_view d : docs) {
        tok.encode(d, ids, &cache);
        n_ids += ids.size();
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
      mbps.push_back(static_cast<double>(bytes) / 1e6 / secs);
    }
    std::sort(mbps.begin(), mbps.end());
    fmt::print("{{\"kind\": \"{}\", \"bytes\": {}, \"ids\": {}, \"load_s\": {:.3f}, \"median_mb_s\": {:.3f}, "
               "\"min_mb_s\": {:.3f}, \"max_mb_s\": {:.3f}, \"runs\": {}}}\n",
               tok.kind(), bytes, n_ids, load_s, mbps[mbps.size() / 2], mbps.front(), mbps.back(), runs);
  } catch (const InputError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  return 0;
}
