// Indexed datasets: the Megatron layout byte for byte, reading hand-made files, our writer, and
// every kind of broken file failing with an InputError that names it.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "test_data_helpers.h"

namespace tripod {
namespace {

using namespace tripod::testing;

// The test writer against the layout spelled out byte by byte: two documents of 3 and 1
// tokens, uint16 (the example in data/indexed_dataset.h).
TEST(DataIndexed, TestWriterMatchesTheMegatronLayout) {
  MegatronFiles f = megatron_files({{{7, 8, 9}}, {{300}}}, 8, 2);
  std::vector<uint8_t> idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0,  // magic
                              1, 0, 0, 0, 0, 0, 0, 0,                   // version 1
                              8,                                        // dtype uint16
                              2, 0, 0, 0, 0, 0, 0, 0,                   // 2 sequences
                              3, 0, 0, 0, 0, 0, 0, 0,                   // 3 document-index entries
                              3, 0, 0, 0, 1, 0, 0, 0,                   // lengths (int32)
                              0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0,  // pointers (int64)
                              0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(f.idx, idx);
  EXPECT_EQ(f.bin, (std::vector<uint8_t>{7, 0, 8, 0, 9, 0, 44, 1}));
}

void expect_documents(const IndexedDataset& d, const Docs& docs) {
  ASSERT_EQ(d.num_documents(), static_cast<int64_t>(docs.size()));
  int64_t seq = 0, tokens = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    std::vector<int32_t> want;
    EXPECT_EQ(d.document_index(static_cast<int64_t>(i)), seq);
    for (const auto& s : docs[i]) {
      EXPECT_EQ(d.sequence_length(seq), static_cast<int32_t>(s.size()));
      std::vector<int32_t> got(s.size());
      d.read_sequence(seq, 0, got);
      EXPECT_EQ(got, std::vector<int32_t>(s.begin(), s.end()));
      want.insert(want.end(), s.begin(), s.end());
      ++seq;
      tokens += static_cast<int64_t>(s.size());
    }
    EXPECT_EQ(d.document(static_cast<int64_t>(i)), want) << "document " << i;
    EXPECT_EQ(d.document_tokens(static_cast<int64_t>(i)), static_cast<int64_t>(want.size()));
    // Any slice of the document, across its sequences.
    for (size_t off = 0; off < want.size(); ++off) {
      std::vector<int32_t> part(want.size() - off);
      d.read_document(static_cast<int64_t>(i), static_cast<int64_t>(off), part);
      EXPECT_EQ(part, std::vector<int32_t>(want.begin() + static_cast<std::ptrdiff_t>(off), want.end()));
    }
  }
  EXPECT_EQ(d.num_sequences(), seq);
  EXPECT_EQ(d.num_tokens(), tokens);
}

// Several sequences per document, one-token documents, a document with no sequences.
const Docs kDocs = {{{5, 6, 7}, {8}, {9, 10}}, {{11}}, {{12}}, {}, {{13, 14, 15, 16}}, {{17}, {18}}};

TEST(DataIndexed, ReadsHandMadeUint16) {
  TempDir dir;
  Docs docs = kDocs;
  docs[1][0][0] = 65535;  // the whole uint16 range
  write_megatron(dir / "u16", docs, 8, 2);
  IndexedDataset d(dir / "u16");
  EXPECT_EQ(d.dtype(), TokenDType::U16);
  expect_documents(d, docs);
}

TEST(DataIndexed, ReadsHandMadeInt32) {
  TempDir dir;
  Docs docs = kDocs;
  docs[0][1][0] = 1 << 20;  // beyond uint16
  write_megatron(dir / "i32", docs, 4, 4);
  IndexedDataset d(dir / "i32");
  EXPECT_EQ(d.dtype(), TokenDType::I32);
  expect_documents(d, docs);
}

TEST(DataIndexed, EmptyDatasetLoads) {
  TempDir dir;
  write_megatron(dir / "empty", {}, 8, 2);
  IndexedDataset d(dir / "empty");
  EXPECT_EQ(d.num_documents(), 0);
  EXPECT_EQ(d.num_tokens(), 0);
}

TEST(DataIndexed, WriterIsByteIdenticalToTheMegatronLayout) {
  TempDir dir;
  for (auto [dtype, code, size] : {std::tuple{TokenDType::U16, 8, 2}, std::tuple{TokenDType::I32, 4, 4}}) {
    const std::string prefix = dir / std::string(dtype_name(dtype));
    {
      IndexedDatasetWriter w(prefix, dtype);
      for (const auto& doc : kDocs) {
        for (const auto& s : doc) {
          std::vector<int32_t> t(s.begin(), s.end());
          w.add_sequence(t);
        }
        w.end_document();
      }
      w.finish();
    }
    MegatronFiles want = megatron_files(kDocs, static_cast<uint8_t>(code), size);
    EXPECT_EQ(read_bytes(prefix + ".idx"), want.idx);
    EXPECT_EQ(read_bytes(prefix + ".bin"), want.bin);
  }
  EXPECT_EQ(dtype_for_vocab(4096), TokenDType::U16);
  EXPECT_EQ(dtype_for_vocab(65499), TokenDType::U16);
  EXPECT_EQ(dtype_for_vocab(65500), TokenDType::I32);
  EXPECT_EQ(dtype_for_vocab(50257), TokenDType::U16);
}

TEST(DataIndexed, UnfinishedWriterLeavesNothing) {
  TempDir dir;
  write_megatron(dir / "old", {{{1, 2}}}, 8, 2);
  auto before = read_bytes(dir / "old.idx");
  {
    IndexedDatasetWriter w(dir / "old", TokenDType::U16);
    std::vector<int32_t> t = {3, 4, 5};
    w.add_document(t);
  }  // destroyed before finish(): as if preprocess failed
  EXPECT_EQ(read_bytes(dir / "old.idx"), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 2);  // old.bin and old.idx, no temporaries
}

// Expects an InputError whose message names `file` and contains `what`.
void expect_input_error(const std::string& prefix, const std::string& file, const std::string& what) {
  try {
    IndexedDataset d(prefix);
    FAIL() << "no error for " << prefix;
  } catch (const InputError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

class DataIndexedBad : public ::testing::Test {
 protected:
  void SetUp() override {
    good_ = megatron_files({{{1, 2, 3}}, {{4}, {5, 6}}}, 8, 2);
    prefix_ = dir_ / "bad";
  }
  void write(const MegatronFiles& f) {
    write_bytes(prefix_ + ".idx", f.idx);
    write_bytes(prefix_ + ".bin", f.bin);
  }
  TempDir dir_;
  MegatronFiles good_;
  std::string prefix_;
};

TEST_F(DataIndexedBad, MissingFiles) {
  write_bytes(prefix_ + ".bin", good_.bin);
  expect_input_error(prefix_, prefix_ + ".idx", "no such file");
  fs::remove(prefix_ + ".bin");
  write_bytes(prefix_ + ".idx", good_.idx);
  expect_input_error(prefix_, prefix_ + ".bin", "no such file");
}

TEST_F(DataIndexedBad, WrongMagic) {
  good_.idx[0] = 'X';
  write(good_);
  expect_input_error(prefix_, prefix_ + ".idx", "wrong magic");
}

TEST_F(DataIndexedBad, WrongVersion) {
  good_.idx[9] = 2;
  write(good_);
  expect_input_error(prefix_, prefix_ + ".idx", "version 2");
}

TEST_F(DataIndexedBad, FloatDtype) {
  good_.idx[17] = 7;
  write(good_);
  expect_input_error(prefix_, prefix_ + ".idx", "dtype code 7");
}

TEST_F(DataIndexedBad, TooShortForHeader) {
  good_.idx.resize(20);
  write(good_);
  expect_input_error(prefix_, prefix_ + ".idx", "too short");
}

TEST_F(DataIndexedBad, TruncatedIndex) {
  good_.idx.pop_back();
  write(good_);
  expect_input_error(prefix_, prefix_ + ".idx", "truncated");
}

TEST_F(DataIndexedBad, HugeCountsInHeader) {
  good_.idx[18 + 7] = 0x40;  // 2^62 sequences
  write(good_);
  expect_input_error(prefix_, prefix_ + ".idx", "more than its");
}

TEST_F(DataIndexedBad, BinShorterThanIndexClaims) {
  good_.bin.resize(good_.bin.size() - 2);
  write(good_);
  expect_input_error(prefix_, prefix_ + ".bin", "shorter than the 12 bytes");
}

TEST_F(DataIndexedBad, PointerOutOfRange) {
  // Sequence 1's pointer (8 bytes after the 3 lengths) moved far past the end of the .bin.
  const size_t ptr1 = 34 + 4 * 3 + 8 * 1;
  good_.idx[ptr1 + 1] = 0x10;
  write(good_);
  expect_input_error(prefix_, prefix_ + ".idx", "sequence 1 points at bytes");
}

TEST_F(DataIndexedBad, NegativePointer) {
  const size_t ptr2 = 34 + 4 * 3 + 8 * 2;
  for (int i = 0; i < 8; ++i) good_.idx[ptr2 + i] = 0xff;
  write(good_);
  expect_input_error(prefix_, prefix_ + ".idx", "sequence 2 points at bytes [-1");
}

TEST_F(DataIndexedBad, NegativeLength) {
  for (int i = 0; i < 4; ++i) good_.idx[34 + 4 + i] = 0xff;
  write(good_);
  expect_input_error(prefix_, prefix_ + ".idx", "negative length");
}

TEST_F(DataIndexedBad, DocumentIndexNotIncreasing) {
  const size_t di1 = 34 + 12 * 3 + 8;
  good_.idx[di1] = 3;  // {0, 3, 3}: fine; now {0, 3, 1}
  good_.idx[di1 + 8] = 1;
  write(good_);
  expect_input_error(prefix_, prefix_ + ".idx", "document index entry 2 = 1 after 3");
}

TEST_F(DataIndexedBad, DocumentIndexEndsEarly) {
  const size_t di2 = 34 + 12 * 3 + 16;
  good_.idx[di2] = 2;
  write(good_);
  expect_input_error(prefix_, prefix_ + ".idx", "ends at sequence 2 but there are 3");
}

}  // namespace
}  // namespace tripod
