// Megatron-compatible indexed datasets: validation on open, token reads, and the writer.
#include "data/indexed_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "data/hash.h"

namespace tripod {

int dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::U8:
    case TokenDType::I8: return 1;
    case TokenDType::I16:
    case TokenDType::U16: return 2;
    case TokenDType::I32: return 4;
    case TokenDType::I64: return 8;
  }
  TRIPOD_FAIL("unknown token dtype {}", static_cast<int>(t));
}

std::string_view dtype_name(TokenDType t) {
  switch (t) {
    case TokenDType::U8: return "uint8";
    case TokenDType::I8: return "int8";
    case TokenDType::I16: return "int16";
    case TokenDType::U16: return "uint16";
    case TokenDType::I32: return "int32";
    case TokenDType::I64: return "int64";
  }
  TRIPOD_FAIL("unknown token dtype {}", static_cast<int>(t));
}

TokenDType dtype_for_vocab(int64_t vocab_size) { return vocab_size < 65500 ? TokenDType::U16 : TokenDType::I32; }

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

// ---- reading -------------------------------------------------------------------------------

IndexedDataset::IndexedDataset(const std::string& prefix)
    : prefix_(prefix), idx_(idx_path(prefix)), bin_(bin_path(prefix)) {
  validate();
}

void IndexedDataset::validate() {
  const std::string& ip = idx_.path();
  const std::string& bp = bin_.path();
  const int64_t size = idx_.size();
  TRIPOD_INPUT_CHECK(size >= kIndexHeaderBytes,
                     "{}: {} bytes, too short for the {}-byte header of a Megatron indexed dataset index", ip, size,
                     kIndexHeaderBytes);
  const uint8_t* p = idx_.data();
  TRIPOD_INPUT_CHECK(std::memcmp(p, kIndexMagic, sizeof(kIndexMagic)) == 0,
                     "{}: not a Megatron indexed dataset index (wrong magic: it does not start with \"MMIDIDX\")", ip);
  uint64_t version = load_unaligned<uint64_t>(p + 9);
  TRIPOD_INPUT_CHECK(version == 1, "{}: index version {}; only version 1 (MMIDIDX) is supported", ip, version);
  uint8_t code = p[17];
  TRIPOD_INPUT_CHECK(code == 1 || code == 2 || code == 3 || code == 4 || code == 5 || code == 8,
                     "{}: dtype code {} is not a token type (valid: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, "
                     "8 uint16)", ip, code);
  dtype_ = static_cast<TokenDType>(code);
  uint64_t n = load_unaligned<uint64_t>(p + 18), m = load_unaligned<uint64_t>(p + 26);
  // Bound the counts by the file size before any arithmetic can overflow.
  TRIPOD_INPUT_CHECK(n <= static_cast<uint64_t>(size) / 12 && m <= static_cast<uint64_t>(size) / 8,
                     "{}: header claims {} sequences and {} document-index entries, more than its {} bytes can hold "
                     "(truncated or corrupt)", ip, n, m, size);
  num_sequences_ = static_cast<int64_t>(n);
  num_doc_entries_ = static_cast<int64_t>(m);
  const int64_t expected = kIndexHeaderBytes + 12 * num_sequences_ + 8 * num_doc_entries_;
  // Multimodal indices append one mode byte per sequence; they read the same otherwise.
  TRIPOD_INPUT_CHECK(size == expected || size == expected + num_sequences_,
                     "{}: {} bytes, but its header ({} sequences, {} document-index entries) needs {} (truncated or "
                     "corrupt)", ip, size, num_sequences_, num_doc_entries_, expected);
  TRIPOD_INPUT_CHECK(num_doc_entries_ >= 1, "{}: the document index is empty (it needs at least the leading 0)", ip);
  TRIPOD_INPUT_CHECK(document_index(0) == 0, "{}: document index starts at {}, not 0", ip, document_index(0));
  for (int64_t i = 1; i < num_doc_entries_; ++i) {
    int64_t a = document_index(i - 1), b = document_index(i);
    TRIPOD_INPUT_CHECK(b >= a && b <= num_sequences_,
                       "{}: document index entry {} = {} after {} (entries must be non-decreasing sequence numbers "
                       "up to {})", ip, i, b, a, num_sequences_);
  }
  TRIPOD_INPUT_CHECK(document_index(num_doc_entries_ - 1) == num_sequences_,
                     "{}: the document index ends at sequence {} but there are {} sequences", ip,
                     document_index(num_doc_entries_ - 1), num_sequences_);

  // Every sequence's bytes must lie inside the .bin. When the pointers are the usual running
  // sum, a failure means the .bin is short; otherwise the pointer itself is bad.
  const int64_t item = dtype_size(dtype_), bin_size = bin_.size();
  int64_t running = 0, first_bad = -1;
  bool contiguous = true;
  for (int64_t s = 0; s < num_sequences_; ++s) {
    int64_t len = sequence_length(s), ptr = sequence_pointer(s);
    TRIPOD_INPUT_CHECK(len >= 0, "{}: sequence {} has negative length {}", ip, s, len);
    contiguous = contiguous && ptr == running;
    running += len * item;
    num_tokens_ += len;
    if (first_bad < 0 && (ptr < 0 || ptr > bin_size || len * item > bin_size - ptr)) first_bad = s;
  }
  if (first_bad >= 0) {
    TRIPOD_INPUT_CHECK(!contiguous, "{}: {} bytes, shorter than the {} bytes of tokens that {} describes (truncated, "
                       "or from another dataset?)", bp, bin_size, running, ip);
    int64_t ptr = sequence_pointer(first_bad), len = sequence_length(first_bad);
    throw InputError(fmt::format("{}: sequence {} points at bytes [{}, {}), outside {} ({} bytes)", ip, first_bad, ptr,
                                 ptr + len * item, bp, bin_size));
  }
}

int64_t IndexedDataset::document_tokens(int64_t doc) const {
  int64_t total = 0;
  for (int64_t s = document_index(doc), e = document_index(doc + 1); s < e; ++s) total += sequence_length(s);
  return total;
}

namespace {

template <typename T>
void convert(const uint8_t* src, std::span<int32_t> out) {
  if constexpr (std::is_same_v<T, int32_t>) {
    std::memcpy(out.data(), src, out.size() * 4);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    // Saturate: an id beyond int32 is out of any vocabulary and must stay detectably so.
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t v = load_unaligned<int64_t>(src + 8 * i);
      out[i] = static_cast<int32_t>(std::clamp<int64_t>(v, std::numeric_limits<int32_t>::min(),
                                                        std::numeric_limits<int32_t>::max()));
    }
  } else {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int32_t>(load_unaligned<T>(src + sizeof(T) * i));
  }
}

}  // namespace

void IndexedDataset::read_sequence(int64_t seq, int64_t offset, std::span<int32_t> out) const {
  const int64_t count = static_cast<int64_t>(out.size());
  TRIPOD_CHECK(seq >= 0 && seq < num_sequences_ && offset >= 0 && offset + count <= sequence_length(seq),
               "{}: read of tokens [{}, {}) of sequence {} ({} tokens)", prefix_, offset, offset + count, seq,
               seq >= 0 && seq < num_sequences_ ? sequence_length(seq) : -1);
  if (count == 0) return;
  const uint8_t* src = bin_.data() + sequence_pointer(seq) + offset * dtype_size(dtype_);
  switch (dtype_) {
    case TokenDType::U8: convert<uint8_t>(src, out); break;
    case TokenDType::I8: convert<int8_t>(src, out); break;
    case TokenDType::I16: convert<int16_t>(src, out); break;
    case TokenDType::U16: convert<uint16_t>(src, out); break;
    case TokenDType::I32: convert<int32_t>(src, out); break;
    case TokenDType::I64: convert<int64_t>(src, out); break;
  }
}

void IndexedDataset::read_document(int64_t doc, int64_t offset, std::span<int32_t> out) const {
  TRIPOD_CHECK(doc >= 0 && doc < num_documents(), "{}: document {} of {}", prefix_, doc, num_documents());
  size_t done = 0;
  for (int64_t s = document_index(doc), e = document_index(doc + 1); s < e && done < out.size(); ++s) {
    int64_t len = sequence_length(s);
    if (offset >= len) {
      offset -= len;
      continue;
    }
    size_t take = std::min<size_t>(out.size() - done, static_cast<size_t>(len - offset));
    read_sequence(s, offset, out.subspan(done, take));
    done += take;
    offset = 0;
  }
  TRIPOD_CHECK(done == out.size(), "{}: document {} has fewer tokens than the {} requested", prefix_, doc,
               out.size());
}

std::vector<int32_t> IndexedDataset::document(int64_t doc) const {
  std::vector<int32_t> out(static_cast<size_t>(document_tokens(doc)));
  read_document(doc, 0, out);
  return out;
}

uint64_t IndexedDataset::content_hash() const {
  return hash_bytes(idx_.data(), static_cast<size_t>(idx_.size()), static_cast<uint64_t>(bin_.size()));
}

// ---- writing -------------------------------------------------------------------------------

namespace {

std::FILE* open_for_write(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw InputError(fmt::format("{}: cannot create ({})", path, std::strerror(errno)));
  return f;
}

void write_all(std::FILE* f, const void* data, size_t bytes, const std::string& path) {
  if (bytes && std::fwrite(data, 1, bytes, f) != bytes)
    throw InputError(fmt::format("{}: write failed ({})", path, std::strerror(errno)));
}

template <typename T>
void append(std::vector<uint8_t>& buf, T v) {
  size_t at = buf.size();
  buf.resize(at + sizeof(T));
  std::memcpy(buf.data() + at, &v, sizeof(T));
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, TokenDType dtype)
    : prefix_(std::move(prefix)), dtype_(dtype) {
  std::string tag = fmt::format(".tmp-{}", ::getpid());
  bin_tmp_ = bin_path(prefix_) + tag;
  idx_tmp_ = idx_path(prefix_) + tag;
  bin_ = open_for_write(bin_tmp_);
  buffer_.reserve(1 << 22);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_) std::fclose(bin_);
  if (!finished_) {
    std::error_code ec;
    std::filesystem::remove(bin_tmp_, ec);
    std::filesystem::remove(idx_tmp_, ec);
  }
}

void append_tokens(TokenDType dtype, std::span<const int32_t> tokens, std::vector<uint8_t>& out) {
  const size_t item = static_cast<size_t>(dtype_size(dtype));
  const size_t at = out.size();
  out.resize(at + tokens.size() * item);
  uint8_t* dst = out.data() + at;
  auto put = [&]<typename T>(T lo, T hi) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      TRIPOD_CHECK(tokens[i] >= lo && tokens[i] <= hi, "token {} does not fit {}", tokens[i], dtype_name(dtype));
      T v = static_cast<T>(tokens[i]);
      std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
    }
  };
  switch (dtype) {
    case TokenDType::U8: put(uint8_t{0}, uint8_t{255}); break;
    case TokenDType::I8: put(int8_t{-128}, int8_t{127}); break;
    case TokenDType::I16: put(int16_t{-32768}, int16_t{32767}); break;
    case TokenDType::U16: put(uint16_t{0}, uint16_t{65535}); break;
    case TokenDType::I32: std::memcpy(dst, tokens.data(), tokens.size() * 4); break;
    case TokenDType::I64:
      for (size_t i = 0; i < tokens.size(); ++i) {
        int64_t v = tokens[i];
        std::memcpy(dst + 8 * i, &v, 8);
      }
      break;
  }
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) {
  TRIPOD_CHECK(!finished_, "{}: add_sequence after finish", prefix_);
  TRIPOD_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
               "sequence of {} tokens does not fit the index's int32 lengths", tokens.size());
  append_tokens(dtype_, tokens, buffer_);
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  num_tokens_ += static_cast<int64_t>(tokens.size());
  if (buffer_.size() >= (1u << 22)) flush();
}

void IndexedDatasetWriter::add_documents(std::span<const uint8_t> tokens, std::span<const int32_t> lengths) {
  TRIPOD_CHECK(!finished_, "{}: add_documents after finish", prefix_);
  TRIPOD_CHECK(doc_index_.back() == static_cast<int64_t>(lengths_.size()), "{}: add_documents inside a document",
               prefix_);
  int64_t n = 0;
  for (int32_t len : lengths) {
    TRIPOD_CHECK(len >= 0, "{}: a document of {} tokens", prefix_, len);
    n += len;
  }
  TRIPOD_CHECK(static_cast<uint64_t>(n) * static_cast<uint64_t>(dtype_size(dtype_)) == tokens.size(),
               "{}: {} tokens in {} bytes of {}", prefix_, n, tokens.size(), dtype_name(dtype_));
  // In order after anything buffered, then straight from the caller's buffer (no copy).
  if (!buffer_.empty()) flush();
  write_all(bin_, tokens.data(), tokens.size(), bin_tmp_);
  const int64_t first = static_cast<int64_t>(lengths_.size());
  lengths_.insert(lengths_.end(), lengths.begin(), lengths.end());
  for (size_t i = 1; i <= lengths.size(); ++i) doc_index_.push_back(first + static_cast<int64_t>(i));
  num_tokens_ += n;
}

void IndexedDatasetWriter::end_document() { doc_index_.push_back(static_cast<int64_t>(lengths_.size())); }

void IndexedDatasetWriter::flush() {
  write_all(bin_, buffer_.data(), buffer_.size(), bin_tmp_);
  buffer_.clear();
}

void IndexedDatasetWriter::finish() {
  TRIPOD_CHECK(!finished_, "{}: finish called twice", prefix_);
  TRIPOD_CHECK(doc_index_.back() == static_cast<int64_t>(lengths_.size()),
               "{}: the last document was not ended", prefix_);
  flush();
  if (std::fclose(bin_) != 0) {
    bin_ = nullptr;
    throw InputError(fmt::format("{}: write failed ({})", bin_tmp_, std::strerror(errno)));
  }
  bin_ = nullptr;

  std::vector<uint8_t> idx;
  const uint64_t n = lengths_.size(), m = doc_index_.size();
  idx.reserve(static_cast<size_t>(kIndexHeaderBytes + 12 * n + 8 * m));
  idx.insert(idx.end(), kIndexMagic, kIndexMagic + sizeof(kIndexMagic));
  append<uint64_t>(idx, 1);
  append<uint8_t>(idx, static_cast<uint8_t>(dtype_));
  append<uint64_t>(idx, n);
  append<uint64_t>(idx, m);
  for (int32_t len : lengths_) append<int32_t>(idx, len);
  int64_t ptr = 0;
  for (int32_t len : lengths_) {
    append<int64_t>(idx, ptr);
    ptr += static_cast<int64_t>(len) * dtype_size(dtype_);
  }
  for (int64_t d : doc_index_) append<int64_t>(idx, d);
  std::FILE* f = open_for_write(idx_tmp_);
  try {
    write_all(f, idx.data(), idx.size(), idx_tmp_);
  } catch (...) {
    std::fclose(f);
    throw;
  }
  if (std::fclose(f) != 0) throw InputError(fmt::format("{}: write failed ({})", idx_tmp_, std::strerror(errno)));

  // The .idx goes last: a reader never sees a new index over an old .bin.
  std::filesystem::rename(bin_tmp_, bin_path(prefix_));
  std::filesystem::rename(idx_tmp_, idx_path(prefix_));
  finished_ = true;
}

}  // namespace tripod
