// Megatron-LM's indexed dataset (MMIDIDX, version 1): PREFIX.bin holds the tokens of every
// sequence back to back; PREFIX.idx describes them. Byte layout of the .idx (little-endian):
//
//   offset 0   9 bytes  "MMIDIDX\0\0"
//          9   uint64   version = 1
//         17   uint8    dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16)
//         18   uint64   sequence count n
//         26   uint64   document index length m (= documents + 1)
//         34   int32[n] tokens per sequence
//     34+4n    int64[n] byte offset of each sequence in the .bin
//    34+12n    int64[m] document index: document d is sequences [di[d], di[d+1]); di[0] = 0,
//                       di[m-1] = n
//
// e.g. two documents of 3 and 1 tokens, uint16: n = 2, m = 3, lengths {3, 1}, pointers {0, 6},
// document index {0, 1, 2}; the .bin has 8 bytes. Files written by either tool load in the other.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/mapped_file.h"

namespace tripod {

// Megatron's dtype codes (6 float64 and 7 float32 are not token types and are refused).
enum class TokenDType : uint8_t { U8 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, U16 = 8 };

int dtype_size(TokenDType t);
std::string_view dtype_name(TokenDType t);
// Megatron's choice: uint16 for vocabularies under 65500 ids, else int32.
TokenDType dtype_for_vocab(int64_t vocab_size);

std::string idx_path(const std::string& prefix);
std::string bin_path(const std::string& prefix);

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr int64_t kIndexHeaderBytes = 34;

// Reads an indexed dataset through memory maps; nothing is copied. The constructor checks the
// whole index against the .bin (magic, version, dtype, sizes, document index, every sequence's
// byte range) and throws an InputError naming the file and the fault.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_doc_entries_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t bin_bytes() const { return bin_.size(); }
  int64_t idx_bytes() const { return idx_.size(); }

  int32_t sequence_length(int64_t seq) const {
    return load_unaligned<int32_t>(idx_.data() + kIndexHeaderBytes + 4 * seq);
  }
  int64_t sequence_pointer(int64_t seq) const {
    return load_unaligned<int64_t>(idx_.data() + kIndexHeaderBytes + 4 * num_sequences_ + 8 * seq);
  }
  // Entry i of the document index, 0 <= i <= num_documents().
  int64_t document_index(int64_t i) const {
    return load_unaligned<int64_t>(idx_.data() + kIndexHeaderBytes + 12 * num_sequences_ + 8 * i);
  }
  // Tokens in document `doc` (all its sequences).
  int64_t document_tokens(int64_t doc) const;

  // Copies tokens [offset, offset + out.size()) of sequence `seq` into `out`.
  void read_sequence(int64_t seq, int64_t offset, std::span<int32_t> out) const;
  // Copies tokens [offset, offset + out.size()) of document `doc` (its sequences concatenated).
  void read_document(int64_t doc, int64_t offset, std::span<int32_t> out) const;
  std::vector<int32_t> document(int64_t doc) const;

  // A hash of the whole .idx and the .bin size: what cached sample indices depend on.
  uint64_t content_hash() const;

 private:
  void validate();
  std::string prefix_;
  MappedFile idx_, bin_;
  TokenDType dtype_ = TokenDType::U16;
  int64_t num_sequences_ = 0, num_doc_entries_ = 0, num_tokens_ = 0;
};

// Appends `tokens` to `out` as the .bin stores them in `dtype` (little-endian); a token outside
// the dtype's range is an error.
void append_tokens(TokenDType dtype, std::span<const int32_t> tokens, std::vector<uint8_t>& out);

// Writes an indexed dataset: tokens stream into PREFIX.bin.tmp-PID, the index is written at
// finish(), and both files are renamed into place only then. Destroyed before finish(), it
// removes its temporary files and leaves any existing dataset untouched.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, TokenDType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One sequence of a document; end_document() closes the document.
  void add_sequence(std::span<const int32_t> tokens);
  void end_document();
  // A document of one sequence.
  void add_document(std::span<const int32_t> tokens) {
    add_sequence(tokens);
    end_document();
  }
  // Documents of one sequence each, `lengths[i]` tokens, their tokens already in the dataset's
  // dtype and back to back in `tokens` (append_tokens): written as they are.
  void add_documents(std::span<const uint8_t> tokens, std::span<const int32_t> lengths);
  void finish();

  int64_t num_documents() const { return static_cast<int64_t>(doc_index_.size()) - 1; }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  void flush();
  std::string prefix_, bin_tmp_, idx_tmp_;
  TokenDType dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<uint8_t> buffer_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_index_{0};
  int64_t num_tokens_ = 0;
  bool finished_ = false;
};

}  // namespace tripod
