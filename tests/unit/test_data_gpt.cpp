// GPT samples: the sample index tiles each epoch, shuffles are seeded and stable, samples depend
// on the global index alone (any number of DP ranks, any resume point), blending keeps its
// proportions, index caches are rebuilt whenever they do not match, and one rank builds them.
#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "core/error.h"
#include "data/blend.h"
#include "data/gpt_data.h"
#include "data/gpt_dataset.h"
#include "data/hash.h"
#include "data/indexed_dataset.h"
#include "data/sampler.h"
#include "parallel/comm/communicator.h"
#include "test_data_helpers.h"

namespace tripod {
namespace {

using namespace tripod::testing;

// A dataset whose every token is unique: dataset `id` holds ids id * 1e6 + 0, 1, 2, ... in
// document order, so a token tells its dataset, document and position. Returns the documents.
std::vector<std::vector<int32_t>> make_dataset(const std::string& prefix, int num_docs, int id, uint32_t seed,
                                               int max_len = 40) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> docs;
  IndexedDatasetWriter w(prefix, TokenDType::I32);
  int32_t next = id * 1000000;
  for (int d = 0; d < num_docs; ++d) {
    std::vector<int32_t> doc(1 + rng() % max_len);
    for (auto& t : doc) t = next++;
    w.add_document(doc);
    docs.push_back(doc);
  }
  w.finish();
  return docs;
}

std::vector<int32_t> sample(const SampleSource& s, int64_t i) {
  std::vector<int32_t> out(static_cast<size_t>(s.sample_tokens()));
  s.get(i, out);
  return out;
}

class DataGpt : public ::testing::Test {
 protected:
  void SetUp() override { docs_ = make_dataset(dir_ / "a", 60, 1, 7); }
  std::shared_ptr<const IndexedDataset> open(const std::string& name = "a") {
    return std::make_shared<const IndexedDataset>(dir_ / name);
  }
  GptIndexOptions options(int64_t num_samples, uint64_t seed = 1234) {
    return GptIndexOptions{.seq_len = 16, .seed = seed, .num_samples = num_samples, .doc_begin = 0,
                           .doc_end = static_cast<int64_t>(docs_.size()), .split = "train"};
  }
  TempDir dir_;
  std::vector<std::vector<int32_t>> docs_;
};

TEST_F(DataGpt, SampleIndexTilesEveryEpoch) {
  GptDataset ds(open(), options(500), nullptr);
  const int64_t L = 16, nd = static_cast<int64_t>(docs_.size());
  int64_t T = 0;
  for (const auto& d : docs_) T += static_cast<int64_t>(d.size());
  EXPECT_EQ(ds.tokens_per_epoch(), T);
  ASSERT_GE(ds.num_samples(), 500);

  // Every epoch of the document index is a permutation of the documents.
  auto di = ds.document_index();
  ASSERT_EQ(static_cast<int64_t>(di.size()) % nd, 0);
  std::vector<int32_t> stream;
  for (int64_t e = 0; e * nd < static_cast<int64_t>(di.size()); ++e) {
    std::vector<int64_t> epoch(di.begin() + e * nd, di.begin() + (e + 1) * nd);
    std::vector<int64_t> sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t k = 0; k < nd; ++k) EXPECT_EQ(sorted[k], k);
    for (int64_t doc : epoch) stream.insert(stream.end(), docs_[doc].begin(), docs_[doc].end());
  }
  EXPECT_NE(std::vector<int64_t>(di.begin(), di.begin() + nd), std::vector<int64_t>(di.begin() + nd, di.begin() + 2 * nd))
      << "each epoch is shuffled on its own";

  // Unshuffled sample j is stream tokens [j*L, j*L + L], crossing documents and epochs.
  for (int64_t j = 0; j < ds.num_samples(); ++j) {
    std::vector<int32_t> s(L + 1);
    ds.get_unshuffled(j, s);
    ASSERT_LE((j + 1) * L + 1, static_cast<int64_t>(stream.size()));
    ASSERT_EQ(s, std::vector<int32_t>(stream.begin() + j * L, stream.begin() + j * L + L + 1)) << "sample " << j;
  }
  // The inputs of the samples that start in epoch 0 hold every token of the split exactly once.
  std::vector<int32_t> inputs;
  for (int64_t j = 0; j * L < T; ++j) {
    std::vector<int32_t> s(L + 1);
    ds.get_unshuffled(j, s);
    inputs.insert(inputs.end(), s.begin(), s.end() - 1);
  }
  inputs.resize(static_cast<size_t>(T));
  std::sort(inputs.begin(), inputs.end());
  std::vector<int32_t> all;
  for (const auto& d : docs_) all.insert(all.end(), d.begin(), d.end());
  EXPECT_EQ(inputs, all);

  // The shuffle index permutes each epoch's block of samples among themselves.
  auto sh = ds.shuffle_index();
  for (int64_t j = 0; j < ds.num_samples(); ++j) EXPECT_EQ(sh[j] * L / T, j * L / T) << "sample " << j;
  std::vector<int64_t> perm(sh.begin(), sh.end());
  std::sort(perm.begin(), perm.end());
  for (int64_t j = 0; j < static_cast<int64_t>(perm.size()); ++j) ASSERT_EQ(perm[j], j);
  EXPECT_FALSE(std::is_sorted(sh.begin(), sh.end()));
}

TEST_F(DataGpt, SamplesLongerThanTheSplitWrapAcrossEpochs) {
  auto docs = make_dataset(dir_ / "two", 2, 5, 3, 3);  // two documents of 1 to 3 tokens
  auto two = open("two");
  GptDataset ds(two, GptIndexOptions{.seq_len = 16, .seed = 4, .num_samples = 3, .doc_begin = 0, .doc_end = 2,
                                     .split = "train"},
                nullptr);
  ASSERT_GE(ds.num_samples(), 3);
  // Each sample spans several epochs of the document index, each epoch both documents.
  std::vector<int32_t> stream;
  auto di = ds.document_index();
  for (size_t e = 0; e < di.size(); e += 2) {
    EXPECT_EQ(std::min(di[e], di[e + 1]), 0);
    EXPECT_EQ(std::max(di[e], di[e + 1]), 1);
    for (size_t k = e; k < e + 2; ++k) stream.insert(stream.end(), docs[di[k]].begin(), docs[di[k]].end());
  }
  for (int64_t j = 0; j < ds.num_samples(); ++j) {
    std::vector<int32_t> s(17);
    ds.get_unshuffled(j, s);
    ASSERT_LE(16 * j + 17, static_cast<int64_t>(stream.size()));
    EXPECT_EQ(s, std::vector<int32_t>(stream.begin() + 16 * j, stream.begin() + 16 * j + 17)) << "sample " << j;
  }
}

TEST_F(DataGpt, SeededAndStableUnderMoreSamples) {
  GptDataset small(open(), options(5), nullptr);
  GptDataset big(open(), options(5000), nullptr);
  GptDataset other(open(), options(5000, 99), nullptr);
  EXPECT_LT(small.num_samples(), big.num_samples());
  EXPECT_NE(small.cache_path(), big.cache_path());
  for (int64_t i = 0; i < small.num_samples(); ++i) EXPECT_EQ(sample(small, i), sample(big, i)) << i;
  int same = 0;
  for (int64_t i = 0; i < 100; ++i) same += sample(big, i) == sample(other, i);
  EXPECT_LT(same, 5);
  // Indices wrap at num_samples().
  EXPECT_EQ(sample(small, small.num_samples() + 3), sample(small, 3));
}

TEST_F(DataGpt, CacheIsReusedAndNeverTrustedWhenItDiffers) {
  std::vector<std::vector<int32_t>> want;
  std::string path;
  {
    GptDataset ds(open(), options(300), nullptr);
    EXPECT_TRUE(ds.built_cache());
    path = ds.cache_path();
    EXPECT_EQ(path.rfind(dir_ / "a.train-", 0), 0u) << path;  // beside the data
    for (int64_t i = 0; i < ds.num_samples(); ++i) want.push_back(sample(ds, i));
  }
  auto check = [&](bool expect_built, const char* what) {
    GptDataset ds(open(), options(300), nullptr);
    EXPECT_EQ(ds.built_cache(), expect_built) << what;
    EXPECT_EQ(ds.cache_path(), path);
    for (int64_t i = 0; i < ds.num_samples(); ++i) ASSERT_EQ(sample(ds, i), want[i]) << what << " sample " << i;
  };
  check(false, "reused");
  auto bytes = read_bytes(path);
  write_bytes(path, std::vector<uint8_t>(bytes.begin(), bytes.end() - 8));
  check(true, "truncated");
  bytes = read_bytes(path);
  bytes[40 + 40 * 5 + 10] ^= 1;  // a byte of the description (after the header and 5 array entries)
  write_bytes(path, bytes);
  check(true, "description changed");
  // Arrays damaged under an intact header: the payload checksum finds it; and when the checksum
  // is made right again (damage it cannot see), the range check of every entry does.
  const auto good = read_bytes(path);
  auto entry = [&](const std::vector<uint8_t>& b, const char* name) {  // byte offset of array `name`
    for (int i = 0; i < 5; ++i)
      if (std::string(reinterpret_cast<const char*>(b.data()) + 40 + 40 * i) == name) {
        uint64_t off = 0;
        std::memcpy(&off, b.data() + 40 + 40 * i + 32, 8);
        return static_cast<size_t>(off);
      }
    ADD_FAILURE() << "no array " << name;
    return size_t{0};
  };
  for (auto [name, value] : std::vector<std::pair<const char*, int64_t>>{
           {"shuffle_index", int64_t{1} << 40}, {"sample_document", -5}, {"sample_offset", 1 << 20},
           {"document_index", 999}}) {
    for (bool fix_checksum : {false, true}) {
      bytes = good;
      std::memcpy(bytes.data() + entry(bytes, name) + 8, &value, 8);  // the array's second entry
      if (fix_checksum) {
        const uint64_t h = hash_bytes(bytes.data() + 40, bytes.size() - 40);
        std::memcpy(bytes.data() + 32, &h, 8);
      }
      write_bytes(path, bytes);
      check(true, fix_checksum ? "entry out of range, checksum right" : "entry damaged");
      write_bytes(path, good);
    }
  }
  {
    GptDataset foreign(open(), options(300, 77), nullptr);
    fs::copy_file(foreign.cache_path(), path, fs::copy_options::overwrite_existing);
  }
  check(true, "foreign");
  write_bytes(path, {});
  check(true, "empty");
  // New data under the same name gets another cache.
  make_dataset(dir_ / "a", 60, 1, 8);
  GptDataset changed(open(), options(300), nullptr);
  EXPECT_NE(changed.cache_path(), path);
  EXPECT_TRUE(changed.built_cache());
}

TEST_F(DataGpt, UnwritableCacheLivesInMemory) {
  std::string path;
  std::vector<int32_t> first;
  {
    GptDataset ds(open(), options(100), nullptr);
    path = ds.cache_path();
    first = sample(ds, 0);
  }
  // A directory where the cache file would go: it can be neither read nor replaced.
  fs::remove(path);
  fs::create_directory(path);
  GptDataset ds(open(), options(100), nullptr);
  EXPECT_TRUE(ds.built_cache());
  EXPECT_TRUE(fs::is_directory(path));
  EXPECT_EQ(sample(ds, 0), first);
}

// Ranks as threads: barrier() meets the other threads and all_reduce() (f32) folds every
// thread's values into a shared buffer; nothing else is used.
struct ThreadGroup {
  explicit ThreadGroup(int size) : barrier(size) {}
  std::barrier<> barrier;
  std::mutex mutex;
  std::vector<float> acc;
};

class ThreadComm final : public Communicator {
 public:
  ThreadComm(ThreadGroup& g, int rank, int size) : g_(g), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  void barrier() override { g_.barrier.arrive_and_wait(); }
  void all_reduce(Tensor& t, ReduceOp op) override {
    TRIPOD_CHECK(t.dtype() == DType::F32, "ThreadComm reduces f32 only");
    float* v = t.data<float>();
    const auto n = static_cast<size_t>(t.numel());
    if (rank_ == 0) g_.acc.assign(n, op == ReduceOp::Max ? -std::numeric_limits<float>::infinity() : 0.f);
    barrier();  // the buffer is reset
    {
      std::lock_guard lock(g_.mutex);
      for (size_t i = 0; i < n; ++i) g_.acc[i] = op == ReduceOp::Max ? std::max(g_.acc[i], v[i]) : g_.acc[i] + v[i];
    }
    barrier();  // every rank folded in
    std::copy(g_.acc.begin(), g_.acc.end(), v);
    barrier();  // every rank read it before the next reset
  }
  void reduce_scatter(const Tensor&, Tensor&) override { TRIPOD_FAIL("unused"); }
  void all_gather(const Tensor&, Tensor&) override { TRIPOD_FAIL("unused"); }
  void broadcast(Tensor&, int) override { TRIPOD_FAIL("unused"); }
  void all_to_all_v(const Tensor&, std::span<const int64_t>, Tensor&, std::span<const int64_t>) override {
    TRIPOD_FAIL("unused");
  }
  std::unique_ptr<CommRequest> iall_reduce(Tensor&) override { TRIPOD_FAIL("unused"); }
  std::unique_ptr<CommRequest> ireduce_scatter(const Tensor&, Tensor&) override { TRIPOD_FAIL("unused"); }
  std::unique_ptr<CommRequest> iall_gather(const Tensor&, Tensor&) override { TRIPOD_FAIL("unused"); }
  std::unique_ptr<CommRequest> isend(const Tensor&, int, int) override { TRIPOD_FAIL("unused"); }
  std::unique_ptr<CommRequest> irecv(Tensor&, int, int) override { TRIPOD_FAIL("unused"); }

 private:
  ThreadGroup& g_;
  int rank_, size_;
  std::string name_ = "threads";
};

TEST_F(DataGpt, OneRankBuildsTheOthersWaitAndLoad) {
  make_dataset(dir_ / "b", 30, 2, 9);
  GptDataOptions o{.prefixes = {dir_ / "a", dir_ / "b"}, .weights = {2, 1}, .split = "90,10,0", .seq_len = 16,
                   .seed = 5, .num_samples = 400};
  constexpr int kRanks = 4;
  ThreadGroup group(kRanks);
  std::vector<std::unique_ptr<SampleSource>> sources(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      ThreadComm comm(group, r, kRanks);
      sources[r] = make_gpt_source(o, Split::Train, &comm);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    auto* blend = dynamic_cast<const BlendedSource*>(sources[r].get());
    ASSERT_NE(blend, nullptr);
    for (int d = 0; d < 2; ++d)
      EXPECT_EQ(dynamic_cast<const GptDataset&>(blend->source(d)).built_cache(), r == 0) << "rank " << r;
    for (int64_t i = 0; i < 400; i += 7) ASSERT_EQ(sample(*sources[r], i), sample(*sources[0], i));
  }
}

// The tokens of every global sample index that DP ranks read over `steps` steps.
std::map<int64_t, std::vector<int32_t>> draw(const GptDataOptions& o, int dp, int64_t micro_batch, int64_t global,
                                             int64_t first_step, int64_t steps) {
  SampleOrder order{.global_batch = global, .micro_batch = micro_batch, .dp = dp};
  std::vector<std::unique_ptr<SampleSource>> ranks;  // each rank builds its own source
  for (int r = 0; r < dp; ++r) ranks.push_back(make_gpt_source(o, Split::Train, nullptr));
  std::map<int64_t, std::vector<int32_t>> got;
  for (int64_t step = first_step; step < first_step + steps; ++step)
    for (int r = 0; r < dp; ++r)
      for (int m = 0; m < order.micro_steps(); ++m)
        for (int64_t b = 0; b < micro_batch; ++b) {
          int64_t idx = order.index(step * global, m, r, b);
          EXPECT_TRUE(got.emplace(idx, sample(*ranks[r], idx)).second) << "index " << idx << " drawn twice";
        }
  return got;
}

TEST_F(DataGpt, SamplesDependOnTheGlobalIndexAloneForAnyDpAndResume) {
  GptDataOptions o{.prefixes = {dir_ / "a"}, .weights = {}, .split = "1,0,0", .seq_len = 16, .seed = 3, .num_samples = 8 * 30};
  auto serial = draw(o, 1, 2, 8, 0, 30);
  ASSERT_EQ(serial.size(), 240u);
  EXPECT_EQ(serial.begin()->first, 0);
  EXPECT_EQ(serial.rbegin()->first, 239);
  EXPECT_EQ(draw(o, 2, 2, 8, 0, 30), serial);
  EXPECT_EQ(draw(o, 4, 2, 8, 0, 30), serial);
  EXPECT_EQ(draw(o, 4, 1, 8, 0, 30), serial);
  // Resuming at consumed_samples = 13 * 8, even with a longer run requested, continues exactly.
  GptDataOptions longer = o;
  longer.num_samples = 8 * 50;
  auto resumed = draw(longer, 2, 2, 8, 13, 17);
  for (const auto& [idx, tokens] : resumed) EXPECT_EQ(tokens, serial.at(idx)) << "index " << idx;
  EXPECT_EQ(resumed.size(), 17u * 8);
  EXPECT_EQ(resumed.begin()->first, 13 * 8);
  SampleOrder order{.global_batch = 8, .micro_batch = 2, .dp = 2};
  EXPECT_EQ(order.index(16, 1, 0, 0), 20);
  EXPECT_EQ(order.index(16, 1, 1, 1), 23);
}

TEST_F(DataGpt, BlendingHoldsItsProportions) {
  make_dataset(dir_ / "b", 25, 2, 10);
  make_dataset(dir_ / "c", 90, 3, 11, 10);
  const std::vector<double> w = {0.5, 0.3, 0.2};
  GptDataOptions o{.prefixes = {dir_ / "a", dir_ / "b", dir_ / "c"}, .weights = {5, 3, 2}, .split = "1",
                   .seq_len = 16, .seed = 1, .num_samples = 10000};
  auto src = make_gpt_source(o, Split::Train, nullptr);
  auto* blend = dynamic_cast<const BlendedSource*>(src.get());
  ASSERT_NE(blend, nullptr);
  ASSERT_EQ(blend->num_samples(), 10000);
  std::vector<int64_t> count(3, 0);
  double worst = 0;
  for (int64_t i = 0; i < 10000; ++i) {
    int64_t d = blend->source_index()[i];
    EXPECT_EQ(blend->source_sample_index()[i], count[d]);
    ++count[d];
    for (int k = 0; k < 3; ++k) worst = std::max(worst, std::abs(count[k] - w[k] * static_cast<double>(i + 1)));
    if (i % 97 == 0) {
      auto s = sample(*src, i);
      EXPECT_EQ(s[0] / 1000000, d + 1) << "blended sample " << i << " comes from dataset " << d;
      EXPECT_EQ(s, sample(blend->source(static_cast<int>(d)), blend->source_sample_index()[i]));
    }
  }
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(count[k] / 10000.0, w[k], 0.01);
  EXPECT_LE(worst, 1.0 + 1e-9) << "every prefix of the blend is within one sample of its share";
  // Without weights: in proportion to each dataset's tokens.
  GptDataOptions by_size = o;
  by_size.weights.clear();
  auto src2 = make_gpt_source(by_size, Split::Train, nullptr);
  auto* b2 = dynamic_cast<const BlendedSource*>(src2.get());
  std::vector<double> tokens(3, 0);
  for (int k = 0; k < 3; ++k) tokens[k] = static_cast<double>(IndexedDataset(o.prefixes[k]).num_tokens());
  double total = tokens[0] + tokens[1] + tokens[2];
  std::vector<int64_t> c2(3, 0);
  for (int64_t d : b2->source_index()) ++c2[d];
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(c2[k] / 10000.0, tokens[k] / total, 0.001);
  // The greedy index itself, against hand-worked values: weights 0.75 / 0.25.
  BlendIndex bi = build_blend_index(std::vector<double>{3, 1}, 8);
  EXPECT_EQ(bi.source, (std::vector<int64_t>{0, 1, 0, 0, 0, 1, 0, 0}));
}

TEST(DataSplit, ParseAndDocumentRanges) {
  auto w = parse_split("969,30,1");
  EXPECT_NEAR(w[0], 0.969, 1e-12);
  EXPECT_NEAR(w[2], 0.001, 1e-12);
  EXPECT_EQ(parse_split("98/2")[2], 0.0);
  EXPECT_EQ(parse_split(" 1 , 1 ")[1], 0.5);
  for (const char* bad : {"a,b", "-1,2", "0,0,0", "1,2,3,4", "", "1,,2", "1e400"}) {
    try {
      parse_split(bad);
      ADD_FAILURE() << bad;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("data.split"), std::string::npos) << e.what();
    }
  }
  for (int64_t n = 1; n <= 60; ++n)
    for (const char* s : {"969,30,1", "1,1,1", "1,0,1", "7,3"}) {
      auto sw = parse_split(s);
      int64_t at = 0;
      for (Split sp : {Split::Train, Split::Valid, Split::Test}) {
        auto [b, e] = split_documents(sw, n, sp);
        EXPECT_EQ(b, at) << s << " n=" << n;
        EXPECT_LE(b, e);
        at = e;
      }
      EXPECT_EQ(at, n);
    }
}

TEST_F(DataGpt, TrainAndValidNeverShareADocument) {
  GptDataOptions o{.prefixes = {dir_ / "a"}, .weights = {}, .split = "80,20,0", .seq_len = 16, .seed = 2, .num_samples = 300};
  auto [tb, te] = split_documents(parse_split(o.split), 60, Split::Train);
  auto doc_of = [&](int32_t token) {
    for (size_t d = 0; d < docs_.size(); ++d)
      if (token >= docs_[d].front() && token <= docs_[d].back()) return static_cast<int64_t>(d);
    return int64_t{-1};
  };
  std::set<int64_t> train_docs, valid_docs;
  auto train = make_gpt_source(o, Split::Train, nullptr);
  auto valid = make_gpt_source(o, Split::Valid, nullptr);
  for (int64_t i = 0; i < 300; ++i) {
    for (int32_t t : sample(*train, i)) train_docs.insert(doc_of(t));
    for (int32_t t : sample(*valid, i)) valid_docs.insert(doc_of(t));
  }
  EXPECT_EQ(static_cast<int64_t>(train_docs.size()), te - tb);
  EXPECT_EQ(*train_docs.begin(), tb);
  EXPECT_EQ(*train_docs.rbegin(), te - 1);
  for (int64_t d : valid_docs) EXPECT_EQ(train_docs.count(d), 0u) << "document " << d << " in both";
  EXPECT_EQ(static_cast<int64_t>(valid_docs.size()), 60 - te);
  EXPECT_THROW(make_gpt_source(o, Split::Test, nullptr), InputError);  // weight 0
}

TEST_F(DataGpt, FactoryErrorsNameKeyAndFile) {
  auto expect = [](const GptDataOptions& o, Split s, std::vector<std::string> parts) {
    try {
      make_gpt_source(o, s, nullptr);
      ADD_FAILURE() << "no error";
    } catch (const InputError& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  GptDataOptions o{.prefixes = {dir_ / "a"}, .weights = {}, .split = "9,1,0", .seq_len = 16, .seed = 2, .num_samples = 10};
  GptDataOptions v = o;
  v.vocab_size = 1000000 + 50;  // dataset a's ids go up to about 1e6 + 1200
  expect(v, Split::Train, {"data.prefixes", dir_ / "a.bin", "holds token id", "model.vocab_size is 1000050"});
  GptDataOptions m = o;
  m.prefixes = {dir_ / "missing"};
  expect(m, Split::Train, {"data.prefixes", dir_ / "missing.idx", "no such file"});
  GptDataOptions w = o;
  w.weights = {1, 2};
  expect(w, Split::Train, {"data.weights", "2 weights for 1"});
  make_dataset(dir_ / "tiny", 3, 4, 1);
  GptDataOptions t = o;
  t.prefixes = {dir_ / "tiny"};
  t.split = "969,30,1";
  expect(t, Split::Valid, {"data.split '969,30,1'", "valid split", dir_ / "tiny", "3 documents"});
  expect(o, Split::Test, {"data.split '9,1,0'", "test split no documents"});
  // A dataset of empty documents only.
  write_megatron(dir_ / "hollow", {{{}}, {}}, 8, 2);
  GptDataOptions h = o;
  h.prefixes = {dir_ / "hollow"};
  h.split = "1";
  expect(h, Split::Train, {dir_ / "hollow", "holds no tokens"});
}

}  // namespace
}  // namespace tripod
