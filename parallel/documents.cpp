// Document boundaries of packed sequences.
#include "parallel/documents.h"

#include <algorithm>

#include "core/error.h"

namespace tripod {

void Documents::add_sequence(std::span<const int32_t> inputs, int32_t eod) {
  TRIPOD_CHECK(static_cast<int64_t>(inputs.size()) == T, "a sequence of {} tokens for documents of {}", inputs.size(),
               T);
  starts.push_back(0);
  // An end-of-document token at i ends its document; the next starts at i + 1 (none after the last token).
  for (int64_t i = 0; i + 1 < T; ++i)
    if (inputs[i] == eod) starts.push_back(static_cast<int32_t>(i + 1));
  first.push_back(static_cast<int64_t>(starts.size()));
  ++B;
}

int32_t Documents::start_of(int64_t b, int64_t pos) const {
  TRIPOD_CHECK(b >= 0 && b < B && pos >= 0 && pos < T, "position {} of sequence {} in documents of {} x {}", pos, b,
               B, T);
  const auto begin = starts.begin() + first[b], end = starts.begin() + first[b + 1];
  return *(std::upper_bound(begin, end, static_cast<int32_t>(pos)) - 1);
}

std::vector<int32_t> Documents::row_offsets() const {
  std::vector<int32_t> cu;
  cu.reserve(starts.size() + 1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = first[b]; i < first[b + 1]; ++i) cu.push_back(static_cast<int32_t>(b * T + starts[i]));
  cu.push_back(static_cast<int32_t>(B * T));
  return cu;
}

double Documents::squared_lengths() const {
  double sum = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = first[b]; i < first[b + 1]; ++i) {
      const double len = (i + 1 < first[b + 1] ? starts[i + 1] : T) - starts[i];
      sum += len * len;
    }
  return sum;
}

}  // namespace tripod
