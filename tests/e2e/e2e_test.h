// The shared fixture of the end-to-end tests: the small config they train (with overrides), a
// scratch directory per test, the run directory's metrics, and the checks of a refusal.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.h"

namespace tripod::test {

// {"section.key", TOML value}: sets the key (adding its section when missing); an empty value
// removes it. E.g. {"parallel.pp", "2"}, {"model.arch", "\"llama\""}, {"data.synthetic", ""}.
using ConfigOverrides = std::vector<std::pair<std::string, std::string>>;

// The small GPT-2 run the end-to-end tests start from, as TOML: 2 layers, 4 heads, d_model 32,
// seq_len 16, vocab 64; 3 steps of 8 sequences in micro-batches of 2, a log line every step,
// synthetic data.
inline std::string tiny_config(const ConfigOverrides& overrides = {}) {
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> sections = {
      {"model", {{"n_layers", "2"}, {"n_heads", "4"}, {"d_model", "32"}, {"seq_len", "16"}, {"vocab_size", "64"}}},
      {"train", {{"micro_batch_size", "2"}, {"global_batch_size", "8"}, {"steps", "3"}, {"log_interval", "1"}}},
      {"data", {{"synthetic", "true"}}},
  };
  for (const auto& [path, value] : overrides) {
    const size_t dot = path.find('.');
    const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
    auto s = std::find_if(sections.begin(), sections.end(), [&](const auto& x) { return x.first == section; });
    if (s == sections.end()) {
      sections.push_back({section, {}});
      s = std::prev(sections.end());
    }
    auto k = std::find_if(s->second.begin(), s->second.end(), [&](const auto& x) { return x.first == key; });
    if (value.empty()) {
      if (k != s->second.end()) s->second.erase(k);
    } else if (k != s->second.end()) {
      k->second = value;
    } else {
      s->second.emplace_back(key, value);
    }
  }
  std::string toml;
  for (const auto& [section, keys] : sections) {
    if (keys.empty()) continue;
    toml += "[" + section + "]\n";
    for (const auto& [key, value] : keys) toml += key + " = " + value + "\n";
  }
  return toml;
}

// The records of run_dir/metrics.jsonl, in order.
inline std::vector<nlohmann::json> metrics(const std::filesystem::path& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The training loss of each logged step of a run (evaluation records left out).
inline std::map<int64_t, double> losses(const std::filesystem::path& run_dir) {
  std::map<int64_t, double> out;
  for (const auto& j : metrics(run_dir))
    if (!j.value("eval", false)) out[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
  return out;
}

// A refusal of bad input: exit status 2 and one line on stderr starting "error: ", naming `what`.
inline void expect_refused(const CmdResult& r, const std::string& what) {
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(count_lines_starting(r.err, "error: "), 1) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
}

// A test with a scratch directory of its own (dir_), removed afterwards.
class E2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = scratch_dir(std::string(info->test_suite_name()) + "_" + info->name());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // tiny_config(overrides) written to dir_/name.
  std::filesystem::path write_config(const ConfigOverrides& overrides = {}, const std::string& name = "c.toml") {
    write_file(dir_ / name, tiny_config(overrides));
    return dir_ / name;
  }

  std::filesystem::path dir_;
};

}  // namespace tripod::test
