// The GPT data factory: open, split, index, blend.
#include "data/gpt_data.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/error.h"
#include "data/blend.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "parallel/comm/communicator.h"

namespace tripod {

const char* split_name(Split s) {
  switch (s) {
    case Split::Train: return "train";
    case Split::Valid: return "valid";
    case Split::Test: return "test";
  }
  return "?";
}

std::array<double, 3> parse_split(const std::string& split) {
  auto bad = [&](std::string_view what) {
    return InputError(fmt::format("data.split '{}': {}; give up to three non-negative weights for train, valid and "
                                  "test, e.g. \"969,30,1\"", split, what));
  };
  std::array<double, 3> w{0, 0, 0};
  size_t start = 0;
  int k = 0;
  while (true) {
    size_t end = split.find_first_of(",/", start);
    std::string_view part(split.data() + start, (end == std::string::npos ? split.size() : end) - start);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    if (k == 3) throw bad("more than three parts");
    double v = 0;
    auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || ptr != part.data() + part.size() || !std::isfinite(v) || v < 0)
      throw bad(fmt::format("'{}' is not a non-negative number", part));
    w[k++] = v;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  double sum = w[0] + w[1] + w[2];
  if (!(sum > 0)) throw bad("the weights sum to 0");
  for (double& x : w) x /= sum;
  return w;
}

std::pair<int64_t, int64_t> split_documents(const std::array<double, 3>& w, int64_t num_documents, Split split) {
  int64_t bounds[4] = {0, 0, 0, num_documents};
  double cum = 0;
  for (int i = 1; i < 3; ++i) {
    cum += w[i - 1];
    bounds[i] = std::min<int64_t>(num_documents, std::llround(cum * static_cast<double>(num_documents)));
  }
  int s = static_cast<int>(split);
  return {bounds[s], bounds[s + 1]};
}

namespace {

// The split's documents must hold the end-of-document token that packed documents are cut at:
// its first documents (whole ones, up to about a million tokens: where a dataset made without the
// token, or with another, shows it at once) are searched for it.
void check_documents_end(const IndexedDataset& d, std::pair<int64_t, int64_t> docs, int64_t eod,
                         const std::string& bin, const char* split) {
  constexpr int64_t kScan = 1 << 20;
  std::vector<int32_t> buf;
  int64_t read = 0, k = docs.first;
  for (; k < docs.second && read < kScan; ++k) {
    buf.resize(static_cast<size_t>(d.document_tokens(k)));
    d.read_document(k, 0, buf);
    if (std::find(buf.begin(), buf.end(), static_cast<int32_t>(eod)) != buf.end()) return;
    read += static_cast<int64_t>(buf.size());
  }
  throw InputError(fmt::format(
      "data.eod_token: token id {} does not occur in the first {} documents ({} tokens) of the {} split of {}: "
      "data.reset_position_ids, data.reset_attention_mask and data.eod_mask_loss cut sequences into documents at "
      "that token; preprocess the data with it (without --no-eod) or set data.eod_token to the token the documents "
      "end with",
      eod, k - docs.first, read, split, bin));
}

}  // namespace

std::unique_ptr<SampleSource> make_gpt_source(const GptDataOptions& o, Split split, Communicator* sync) {
  TRIPOD_INPUT_CHECK(!o.prefixes.empty(), "data.prefixes: name at least one indexed dataset (PREFIX for PREFIX.bin "
                     "and PREFIX.idx, as written by `tripod data preprocess`)");
  TRIPOD_INPUT_CHECK(o.weights.empty() || o.weights.size() == o.prefixes.size(),
                     "data.weights: {} weights for {} data.prefixes; give one per prefix", o.weights.size(),
                     o.prefixes.size());
  for (double w : o.weights)
    TRIPOD_INPUT_CHECK(w > 0 && std::isfinite(w), "data.weights: {} is not a positive weight", w);
  TRIPOD_CHECK(o.seq_len >= 1 && o.num_samples >= 1, "GPT data of seq_len {} and {} samples", o.seq_len,
               o.num_samples);
  const std::array<double, 3> sw = parse_split(o.split);
  const char* name = split_name(split);
  TRIPOD_INPUT_CHECK(sw[static_cast<int>(split)] > 0, "data.split '{}' gives the {} split no documents; give it a "
                     "non-zero weight", o.split, name);

  std::vector<std::shared_ptr<const IndexedDataset>> datasets;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<double> tokens;
  // Every rank opens the files itself (a node-local copy, a relative path from another working
  // directory): the ranks agree before the collective index builds, so that a file one rank
  // lacks ends every rank at once, reported by that rank.
  std::string error;
  try {
    for (const std::string& prefix : o.prefixes) {
      try {
        datasets.push_back(std::make_shared<const IndexedDataset>(prefix));
      } catch (const InputError& e) {
        throw InputError(fmt::format("data.prefixes: {}", e.what()));
      }
      const IndexedDataset& d = *datasets.back();
      auto [begin, end] = split_documents(sw, d.num_documents(), split);
      TRIPOD_INPUT_CHECK(begin < end, "data.split '{}' leaves the {} split of {} empty: it has {} documents; give the "
                         "split more weight or the dataset more documents", o.split, name, prefix, d.num_documents());
      ranges.emplace_back(begin, end);
      double t = 0;
      for (int64_t k = begin; k < end; ++k) t += static_cast<double>(d.document_tokens(k));
      tokens.push_back(t);
    }
  } catch (const InputError& e) {
    if (!sync) throw;
    error = e.what();
  }
  if (sync) throw_if_any_failed(error, *sync);
  const std::vector<double> weights = o.weights.empty() ? tokens : o.weights;
  const std::vector<int64_t> counts =
      datasets.size() == 1 ? std::vector<int64_t>{o.num_samples} : blend_source_samples(weights, o.num_samples);

  std::vector<std::unique_ptr<SampleSource>> sources;
  for (size_t i = 0; i < datasets.size(); ++i) {
    GptIndexOptions io{.seq_len = o.seq_len, .seed = o.seed, .num_samples = counts[i], .doc_begin = ranges[i].first,
                       .doc_end = ranges[i].second, .split = name};
    auto ds = std::make_unique<GptDataset>(datasets[i], io, sync);
    const std::string bin = bin_path(o.prefixes[i]);
    TRIPOD_INPUT_CHECK(ds->min_token() >= 0, "data.prefixes: {}: document {} holds the negative token id {}", bin,
                       ds->min_token_document(), ds->min_token());
    TRIPOD_INPUT_CHECK(o.vocab_size <= 0 || ds->max_token() < o.vocab_size,
                       "data.prefixes: {}: document {} holds token id {}, but model.vocab_size is {} (was the data "
                       "made with another tokenizer?)", bin, ds->max_token_document(), ds->max_token(), o.vocab_size);
    if (o.eod_token >= 0) check_documents_end(*datasets[i], ranges[i], o.eod_token, bin, name);
    sources.push_back(std::move(ds));
  }
  if (sources.size() == 1) return std::move(sources[0]);
  return std::make_unique<BlendedSource>(std::move(sources), weights, o.num_samples,
                                         fmt::format("{}.{}", o.prefixes[0], name), sync);
}

}  // namespace tripod
