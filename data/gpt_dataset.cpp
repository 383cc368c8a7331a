// Building, caching and reading the GPT sample indices.
#include "data/gpt_dataset.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "core/rng.h"
#include "data/hash.h"

namespace tripod {

void shuffle_in_place(std::span<int64_t> v, uint64_t seed, uint64_t stream) {
  const std::array<uint32_t, 2> key{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  for (size_t i = v.size(); i > 1; --i) {
    auto r = philox4x32({static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), static_cast<uint32_t>(stream),
                         static_cast<uint32_t>(stream >> 32)},
                        key);
    uint64_t x = (static_cast<uint64_t>(r[0]) << 32) | r[1];
    // Multiply-shift maps 64 random bits onto [0, i) with a bias below i / 2^64.
    auto j = static_cast<size_t>((static_cast<unsigned __int128>(x) * i) >> 64);
    std::swap(v[i - 1], v[j]);
  }
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

uint64_t stream_of(const std::string& split, std::string_view what, int64_t epoch) {
  return hash_name(split) ^ mix64(hash_name(what) + static_cast<uint64_t>(epoch));
}

// Stats array layout.
enum Stat { kDocEpochs, kBlocks, kTokensPerEpoch, kMaxToken, kMaxTokenDoc, kMinToken, kMinTokenDoc, kNumStats };

std::vector<CacheArray> build_indices(const IndexedDataset& data, const GptIndexOptions& o) {
  const int64_t nd = o.doc_end - o.doc_begin, L = o.seq_len;
  std::vector<int64_t> doc_len(static_cast<size_t>(nd));
  int64_t T = 0;
  for (int64_t k = 0; k < nd; ++k) T += doc_len[k] = data.document_tokens(o.doc_begin + k);

  // Blocks (epochs of sample starts) until there are num_samples samples: sample j starts at
  // stream token j*L and belongs to block floor(j*L / T), so E blocks hold ceil(E*T / L).
  TRIPOD_CHECK((o.num_samples - 1) <= std::numeric_limits<int64_t>::max() / L / 2, "too many samples");
  const int64_t E = (o.num_samples - 1) * L / T + 1;
  const int64_t S = ceil_div(E * T, L);
  // The last sample ends at stream token S*L (inclusive): the document index spans enough
  // epochs for it, shuffled one epoch at a time.
  const int64_t doc_epochs = ceil_div(S * L + 1, T);
  std::vector<int64_t> doc_index(static_cast<size_t>(doc_epochs * nd));
  for (int64_t e = 0; e < doc_epochs; ++e) {
    std::span<int64_t> epoch(doc_index.data() + e * nd, static_cast<size_t>(nd));
    for (int64_t k = 0; k < nd; ++k) epoch[k] = o.doc_begin + k;
    shuffle_in_place(epoch, o.seed, stream_of(o.split, "documents", e));
  }

  // Sample index: where stream token j*L lies, for j = 0..S (the last entry closes sample S-1).
  std::vector<int64_t> sample_doc(static_cast<size_t>(S + 1)), sample_offset(static_cast<size_t>(S + 1));
  int64_t pos = 0, before = 0;  // document-index position, and stream tokens before it
  for (int64_t j = 0; j <= S; ++j) {
    const int64_t t = j * L;
    while (before + doc_len[doc_index[pos] - o.doc_begin] <= t) before += doc_len[doc_index[pos++] - o.doc_begin];
    sample_doc[j] = pos;
    sample_offset[j] = t - before;
  }

  // Shuffle index: each block's samples permuted among themselves.
  std::vector<int64_t> shuffle(static_cast<size_t>(S));
  for (int64_t j = 0; j < S; ++j) shuffle[j] = j;
  for (int64_t e = 0; e < E; ++e) {
    int64_t a = ceil_div(e * T, L), b = std::min(ceil_div((e + 1) * T, L), S);
    if (b - a > 1) shuffle_in_place(std::span<int64_t>(shuffle.data() + a, b - a), o.seed, stream_of(o.split, "samples", e));
  }

  // The largest and smallest ids, checked against the model's vocabulary by whoever uses them.
  std::vector<int64_t> stats(kNumStats);
  stats[kDocEpochs] = doc_epochs;
  stats[kBlocks] = E;
  stats[kTokensPerEpoch] = T;
  stats[kMaxToken] = std::numeric_limits<int64_t>::min();
  stats[kMinToken] = std::numeric_limits<int64_t>::max();
  std::vector<int32_t> buf;
  for (int64_t k = 0; k < nd; ++k) {
    buf.resize(static_cast<size_t>(doc_len[k]));
    data.read_document(o.doc_begin + k, 0, buf);
    for (int32_t t : buf) {
      if (t > stats[kMaxToken]) stats[kMaxToken] = t, stats[kMaxTokenDoc] = o.doc_begin + k;
      if (t < stats[kMinToken]) stats[kMinToken] = t, stats[kMinTokenDoc] = o.doc_begin + k;
    }
  }
  std::vector<CacheArray> arrays;
  arrays.push_back({"document_index", std::move(doc_index)});
  arrays.push_back({"sample_document", std::move(sample_doc)});
  arrays.push_back({"sample_offset", std::move(sample_offset)});
  arrays.push_back({"shuffle_index", std::move(shuffle)});
  arrays.push_back({"stats", std::move(stats)});
  return arrays;
}

// Every entry of the indices within range, so that serving any sample reads only this split's
// documents: "" when usable, else the first problem found.
std::string check_indices(const IndexCache& c, const IndexedDataset& data, const GptIndexOptions& o) {
  auto doc_index = c.array("document_index"), sample_doc = c.array("sample_document");
  auto sample_offset = c.array("sample_offset"), shuffle = c.array("shuffle_index"), stats = c.array("stats");
  const auto S = static_cast<int64_t>(shuffle.size()), D = static_cast<int64_t>(doc_index.size());
  if (stats.size() != kNumStats || S < o.num_samples || D == 0 || sample_doc.size() != shuffle.size() + 1 ||
      sample_offset.size() != sample_doc.size())
    return fmt::format("array sizes: {} documents, {} + 1 sample starts, {} offsets, {} shuffled, {} stats", D,
                       sample_doc.size(), sample_offset.size(), S, stats.size());
  for (int64_t k = 0; k < D; ++k)
    if (doc_index[k] < o.doc_begin || doc_index[k] >= o.doc_end)
      return fmt::format("document_index[{}] = {} is outside the split's documents [{}, {})", k, doc_index[k],
                         o.doc_begin, o.doc_end);
  for (int64_t j = 0; j <= S; ++j) {
    const int64_t pos = sample_doc[j], off = sample_offset[j];
    if (pos < 0 || pos >= D || (j > 0 && pos < sample_doc[j - 1]) || off < 0 || off >= data.document_tokens(doc_index[pos]))
      return fmt::format("sample {} starts at document_index position {}, offset {}: out of range", j, pos, off);
  }
  // Sample j's seq_len + 1 tokens must lie within the document index: it ends at or before the
  // start of sample j + 1 plus one token, which the loop above placed inside it.
  std::vector<bool> seen(static_cast<size_t>(S), false);
  for (int64_t j = 0; j < S; ++j) {
    const int64_t v = shuffle[j];
    if (v < 0 || v >= S || seen[v]) return fmt::format("shuffle_index[{}] = {} is not a permutation entry", j, v);
    seen[v] = true;
  }
  if (stats[kDocEpochs] < 1 || stats[kTokensPerEpoch] < 1 || stats[kMinToken] > stats[kMaxToken])
    return "stats out of range";
  for (Stat s : {kMaxTokenDoc, kMinTokenDoc})
    if (stats[s] < o.doc_begin || stats[s] >= o.doc_end) return "stats name a document outside the split";
  return "";
}

}  // namespace

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> data, const GptIndexOptions& o, Communicator* sync)
    : data_(std::move(data)), seq_len_(o.seq_len) {
  const IndexedDataset& d = *data_;
  TRIPOD_CHECK(o.seq_len >= 1 && o.num_samples >= 1, "seq_len {} num_samples {}", o.seq_len, o.num_samples);
  TRIPOD_CHECK(o.doc_begin >= 0 && o.doc_begin < o.doc_end && o.doc_end <= d.num_documents(),
               "{}: document range [{}, {}) of {}", d.prefix(), o.doc_begin, o.doc_end, d.num_documents());
  int64_t tokens = 0;
  for (int64_t k = o.doc_begin; k < o.doc_end; ++k) tokens += d.document_tokens(k);
  TRIPOD_INPUT_CHECK(tokens > 0, "{}: the {} split (documents {} to {}) holds no tokens", d.prefix(), o.split,
                     o.doc_begin, o.doc_end - 1);
  // Everything the indices depend on: the data (the whole .idx and the .bin size) and the options.
  const std::string description = fmt::format(
      "tripod GPT sample indices, format 1\n"
      "index content hash: {:016x}\nbin bytes: {}\nsplit: {}\ndocuments: [{}, {})\nseq_len: {}\nseed: {}\n"
      "samples requested: {}\n",
      d.content_hash(), d.bin_bytes(), o.split, o.doc_begin, o.doc_end, o.seq_len, o.seed, o.num_samples);
  cache_path_ = fmt::format("{}.{}-{:016x}.gptidx", d.prefix(), o.split, hash_string(description));
  cache_ = load_or_build_cache(
      cache_path_, description, sync, [&] { return build_indices(d, o); },
      [&](const IndexCache& c) { return check_indices(c, d, o); }, &built_);
  doc_index_ = cache_->array("document_index");
  sample_doc_ = cache_->array("sample_document");
  sample_offset_ = cache_->array("sample_offset");
  shuffle_ = cache_->array("shuffle_index");
  stats_ = cache_->array("stats");
  TRIPOD_CHECK(stats_.size() == kNumStats && sample_doc_.size() == shuffle_.size() + 1 &&
                   sample_offset_.size() == sample_doc_.size() && shuffle_.size() >= static_cast<size_t>(o.num_samples),
               "{}: inconsistent index arrays", cache_path_);
}

void GptDataset::get_unshuffled(int64_t raw, std::span<int32_t> out) const {
  TRIPOD_CHECK(static_cast<int64_t>(out.size()) == seq_len_ + 1 && raw >= 0 && raw < num_samples(),
               "sample {} of {} into {} tokens", raw, num_samples(), out.size());
  int64_t pos = sample_doc_[raw], offset = sample_offset_[raw];
  size_t done = 0;
  while (done < out.size()) {
    TRIPOD_CHECK(pos < static_cast<int64_t>(doc_index_.size()), "{}: sample {} runs past the document index",
                 cache_path_, raw);
    const int64_t doc = doc_index_[pos];
    const int64_t take = std::min<int64_t>(data_->document_tokens(doc) - offset, static_cast<int64_t>(out.size() - done));
    if (take > 0) {
      data_->read_document(doc, offset, out.subspan(done, static_cast<size_t>(take)));
      done += static_cast<size_t>(take);
    }
    offset = 0;
    ++pos;
  }
}

void GptDataset::get(int64_t index, std::span<int32_t> out) const {
  TRIPOD_CHECK(index >= 0, "negative sample index {}", index);
  get_unshuffled(shuffle_[index % num_samples()], out);
}

}  // namespace tripod
