// Fuzzes the sample-index cache: the input replaces the .gptidx file of a fixed small dataset
// (its payload checksum recomputed, so that the range checks behind it are reached). Whatever
// the file holds, the dataset must serve every sample from its own documents: a damaged cache
// is rebuilt, never trusted.
#include <cstring>
#include <vector>

#include "data/gpt_dataset.h"
#include "data/hash.h"
#include "data/indexed_dataset.h"
#include "tests/fuzz/fuzz_util.h"

using namespace tripod;

namespace {

constexpr size_t kHeaderBytes = 40;  // data/index_cache.cpp's layout: the payload hash at byte 32

struct Fixture {
  std::shared_ptr<const IndexedDataset> data;
  GptIndexOptions opts{.seq_len = 5, .seed = 3, .num_samples = 6, .doc_begin = 0, .doc_end = 4};
  std::string cache;
  std::vector<std::vector<int32_t>> want;  // every sample as the built cache serves it
  Fixture() {
    const std::string prefix = (fuzz::scratch() / "fixed").string();
    {
      IndexedDatasetWriter w(prefix, TokenDType::U16);
      for (int d = 0; d < 4; ++d) {
        std::vector<int32_t> doc(3 + 2 * d);
        for (size_t i = 0; i < doc.size(); ++i) doc[i] = 10 * d + static_cast<int32_t>(i);
        w.add_document(doc);
      }
      w.finish();
    }
    data = std::make_shared<const IndexedDataset>(prefix);
    GptDataset g(data, opts, nullptr);
    cache = g.cache_path();
    if (const char* seeds = std::getenv("TRIPOD_FUZZ_SEED_DIR"))  // the seed corpus: this valid cache
      std::filesystem::copy_file(cache, std::filesystem::path(seeds) / "built.gptidx",
                                 std::filesystem::copy_options::overwrite_existing);
    for (int64_t i = 0; i < g.num_samples(); ++i) {
      want.emplace_back(opts.seq_len + 1);
      g.get(i, want.back());
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture fx;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.size() >= kHeaderBytes) {
    const uint64_t h = hash_bytes(bytes.data() + kHeaderBytes, bytes.size() - kHeaderBytes);
    std::memcpy(bytes.data() + 32, &h, 8);
  }
  {
    std::ofstream(fx.cache, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  fuzz::expect_only_input_errors([&] {
    GptDataset g(fx.data, fx.opts, nullptr);
    std::vector<int32_t> sample(fx.opts.seq_len + 1);
    for (int64_t i = 0; i < g.num_samples(); ++i) {
      g.get(i, sample);
      for (int32_t t : sample)  // a token of one of the four documents
        if (t < 0 || t >= 40 || t % 10 >= 3 + 2 * (t / 10)) std::abort();
    }
    // A cache that passes every check serves some permutation of valid samples; a rebuilt one
    // serves exactly the original samples.
    if (g.built_cache())
      for (int64_t i = 0; i < g.num_samples(); ++i) {
        g.get(i, sample);
        if (sample != fx.want[i]) std::abort();
      }
  });
  return 0;
}
