// Data benchmarks, printed as tables: preprocess throughput of `tripod data preprocess` against
// SentencePiece's own `spm_encode` on the same corpus and model (and a check that both give the
// same token ids), and the sample fetch rate of the GPT dataset.
//   bench_data [--corpus build/corpus] [--repeat 4] [--workers 1,2] [--runs 3]
// Needs scripts/prepare_corpus.sh to have run (build/corpus/kjv.txt and the tokenizer).
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include "data/blend.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"

namespace fs = std::filesystem;
using namespace tripod;
using Clock = std::chrono::steady_clock;

namespace {

struct Timing {
  double wall = 1e30, cpu = 1e30;  // seconds: elapsed, and user + system of the command
};

double children_cpu() {
  struct rusage ru {};
  ::getrusage(RUSAGE_CHILDREN, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// Runs `cmd` once and keeps the best wall and CPU times seen.
void time_into(Timing& t, const std::string& cmd) {
  double cpu0 = children_cpu();
  auto t0 = Clock::now();
  int st = std::system(cmd.c_str());
  double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fmt::print(stderr, "error: command failed: {}\n", cmd);
    std::exit(1);
  }
  t.wall = std::min(t.wall, wall);
  t.cpu = std::min(t.cpu, children_cpu() - cpu0);
}

double load_average() {
  double l = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

std::string q(const std::string& s) { return "'" + s + "'"; }

// Token ids of spm_encode's output (one line of ids per document) against the dataset's documents.
bool same_ids(const std::string& ids_file, const IndexedDataset& d) {
  std::ifstream f(ids_file);
  std::string line;
  int64_t doc = 0;
  while (std::getline(f, line)) {
    if (doc >= d.num_documents()) return false;
    std::vector<int32_t> want;
    std::istringstream ss(line);
    for (int32_t id; ss >> id;) want.push_back(id);
    if (want != d.document(doc)) return false;
    ++doc;
  }
  return doc == d.num_documents();
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);  // no "building index" lines inside the tables
  std::string corpus = "build/corpus", workers_list = "1,2";
  int repeat = 4, runs = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--corpus") corpus = argv[i + 1];
    else if (a == "--repeat") repeat = std::atoi(argv[i + 1]);
    else if (a == "--workers") workers_list = argv[i + 1];
    else if (a == "--runs") runs = std::atoi(argv[i + 1]);
    else {
      fmt::print(stderr, "error: unknown option {} (valid: --corpus --repeat --workers --runs)\n", a);
      return 2;
    }
  }
  const std::string text = corpus + "/kjv.txt", model = corpus + "/kjv_bpe4096.model";
  if (!fs::exists(text) || !fs::exists(model)) {
    fmt::print(stderr, "error: {} or {} missing: run scripts/prepare_corpus.sh first\n", text, model);
    return 2;
  }
  const fs::path self = fs::read_symlink("/proc/self/exe");
  const std::string tripod = (self.parent_path() / "tripod").string();
  char tmpl[] = "/tmp/bench_data_XXXXXX";
  const std::string tmp = ::mkdtemp(tmpl);

  // The corpus repeated, so that each run takes seconds rather than start-up time.
  const std::string input = tmp + "/corpus.txt";
  {
    std::ifstream in(text, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::ofstream out(input, std::ios::binary);
    for (int r = 0; r < repeat; ++r) out << ss.str();
  }
  const double mb = static_cast<double>(fs::file_size(input)) / 1e6;
  int64_t docs = 0;
  {
    std::ifstream in(input);
    for (std::string l; std::getline(in, l);) ++docs;
  }

  std::vector<int> workers;
  for (size_t at = 0; at < workers_list.size();) {
    size_t end = workers_list.find(',', at);
    if (end == std::string::npos) end = workers_list.size();
    workers.push_back(std::atoi(workers_list.substr(at, end - at).c_str()));
    at = end + 1;
  }
  // The tools take turns in every round, so a change in the machine's load hits them alike.
  const std::string spm_ids = tmp + "/spm.ids";
  const std::string spm_cmd =
      fmt::format("spm_encode --model={} --output_format=id < {} > {}", q(model), q(input), q(spm_ids));
  // Each worker count with the word cache (the default) and without (every document encoded
  // whole, as spm_encode does).
  struct Variant {
    int workers;
    bool cache;
    std::string prefix() const { return fmt::format("w{}{}", workers, cache ? "" : "-nocache"); }
    std::string name() const {
      return fmt::format("tripod data preprocess --workers {}{}", workers, cache ? "" : " --no-word-cache");
    }
  };
  std::vector<Variant> variants;
  for (bool cache : {false, true})
    for (int w : workers) variants.push_back({w, cache});
  auto ours_cmd = [&](const Variant& v) {
    return fmt::format("{} data preprocess --input {} --tokenizer-model {} --output-prefix {}/{} --workers {} "
                       "--no-eod --no-progress --overwrite{} 2>/dev/null", q(tripod), q(input), q(model), tmp,
                       v.prefix(), v.workers, v.cache ? "" : " --no-word-cache");
  };
  const double load_before = load_average();
  Timing spm;
  std::vector<Timing> ours(variants.size());
  for (int r = 0; r < runs; ++r) {
    time_into(spm, spm_cmd);
    for (size_t i = 0; i < variants.size(); ++i) time_into(ours[i], ours_cmd(variants[i]));
  }
  fmt::print("preprocess throughput: {} x{} ({:.1f} MB, {} documents, one per line), model {}\n", text, repeat, mb,
             docs, model);
  fmt::print("best of {} interleaved runs on {} cores; load average {:.2f} before, {:.2f} after (other work slows "
             "the wall times)\n", runs, std::thread::hardware_concurrency(), load_before, load_average());
  fmt::print("{:<54} {:>8} {:>8} {:>13} {:>8} {:>13}\n", "tool", "wall s", "MB/s", "vs spm_encode", "CPU s",
             "MB per CPU s");
  auto row = [&](const std::string& name, const Timing& t) {
    fmt::print("{:<54} {:>8.2f} {:>8.2f} {:>12.2f}x {:>8.2f} {:>13.2f}\n", name, t.wall, mb / t.wall, spm.wall / t.wall,
               t.cpu, mb / t.cpu);
  };
  row("spm_encode (one thread)", spm);
  bool identical = true;
  for (size_t i = 0; i < variants.size(); ++i) {
    row(variants[i].name(), ours[i]);
    identical = identical && same_ids(spm_ids, IndexedDataset(tmp + "/" + variants[i].prefix()));
  }
  fmt::print("token ids identical to spm_encode's: {}\n\n", identical ? "yes" : "NO");

  // Sample fetch: what the trainer calls, in its order (consecutive global indices).
  const std::string data_prefix = corpus + "/kjv_text_document";
  const std::string fetch_prefix = fs::exists(data_prefix + ".idx") ? data_prefix : fmt::format("{}/w{}", tmp, workers[0]);
  auto data = std::make_shared<const IndexedDataset>(fetch_prefix);
  fmt::print("sample fetch rate: GptDataset over {} ({} documents, {} tokens)\n", fetch_prefix, data->num_documents(),
             data->num_tokens());
  fmt::print("{:<28} {:>10} {:>12} {:>14} {:>14}\n", "source", "seq_len", "samples", "samples/s", "tokens/s");
  for (int64_t L : {128, 1024, 2048}) {
    const int64_t n = 200000 * 128 / L;
    auto t0 = Clock::now();
    GptDataset ds(data, GptIndexOptions{.seq_len = L, .seed = 1, .num_samples = n, .doc_begin = 0,
                                        .doc_end = data->num_documents(), .split = "bench"},
                  nullptr);
    double build = std::chrono::duration<double>(Clock::now() - t0).count();
    std::vector<int32_t> out(static_cast<size_t>(L + 1));
    int64_t checksum = 0;
    t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) {
      ds.get(i, out);
      checksum += out[static_cast<size_t>(i % (L + 1))];
    }
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    fmt::print("{:<28} {:>10} {:>12} {:>14.0f} {:>14.3g}   (indices {:.2f} s{}, checksum {})\n", "GptDataset", L, n,
               n / s, n * L / s, build, ds.built_cache() ? " built" : " cached", checksum);
  }
  {
    const int64_t L = 1024, n = 20000;
    std::vector<std::unique_ptr<SampleSource>> parts;
    const int64_t half = data->num_documents() / 2;
    parts.push_back(std::make_unique<GptDataset>(
        data, GptIndexOptions{.seq_len = L, .seed = 1, .num_samples = n, .doc_begin = 0, .doc_end = half, .split = "bench-a"},
        nullptr));
    parts.push_back(std::make_unique<GptDataset>(
        data, GptIndexOptions{.seq_len = L, .seed = 1, .num_samples = n, .doc_begin = half, .doc_end = data->num_documents(),
                              .split = "bench-b"},
        nullptr));
    BlendedSource blend(std::move(parts), {0.7, 0.3}, n, tmp + "/blend", nullptr);
    std::vector<int32_t> out(static_cast<size_t>(L + 1));
    auto t0 = Clock::now();
    for (int64_t i = 0; i < n; ++i) blend.get(i, out);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    fmt::print("{:<28} {:>10} {:>12} {:>14.0f} {:>14.3g}\n", "BlendedSource (2 sources)", L, n, n / s, n * L / s);
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
  for (const auto& e : fs::directory_iterator(fs::path(fetch_prefix).parent_path(), ec))
    if (e.path().filename().string().find(".bench") != std::string::npos) fs::remove(e.path(), ec);
  return identical ? 0 : 1;
}
