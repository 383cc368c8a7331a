// The documents packed into a micro-batch's sequences ([data] reset_position_ids,
// reset_attention_mask, eod_mask_loss), with Megatron's rule (_get_ltor_masks_and_position_ids): a
// document ends with an end-of-document input token, which belongs to it, and the next one starts
// after it; a sequence's first document starts at position 0 (a sample may begin inside one).
// They travel with the micro-batch as the positions where each sequence's documents start (the
// varlen / THD form: cumulative lengths), not as a T x T mask; every rank derives from them what
// its own tokens need (positions, where each token's document starts, which attention blocks and
// key rows matter).
//
// Worked example, T = 8, one sequence with inputs a a E b b E c c (E the end-of-document token):
// starts {0, 3, 6}, documents [0, 3) [3, 6) [6, 8); reset positions 0 1 2 0 1 2 0 1; token 4 sees
// keys 3 and 4; the documents as cumulative row offsets of the sequence: {0, 3, 6, 8}.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace tripod {

struct Documents {
  int64_t B = 0, T = 0;        // sequences of the micro-batch and their whole length (model.seq_len)
  bool reset_positions = false;  // data.reset_position_ids
  bool mask = false;             // data.reset_attention_mask
  // Sequence b's document starts: starts[first[b] .. first[b + 1]), 0 first, increasing, < T.
  std::vector<int32_t> starts{};
  std::vector<int64_t> first{0};
  // On the device, for this rank's N tokens in the micro-batch's slot-major order (MicroShape):
  Tensor positions{};  // (N) i32: each token's position in its document (reset_positions only)
  Tensor doc_start{};  // (N) i32: the position in its sequence where its document starts (mask only)
  std::vector<int32_t> row_cu{};  // row_offsets(), kept for the attention op (cp = 1, mask only)

  // Appends a sequence from its T input tokens.
  void add_sequence(std::span<const int32_t> inputs, int32_t eod);
  int64_t count(int64_t b) const { return first[b + 1] - first[b]; }
  // Where the document holding position `pos` of sequence b starts.
  int32_t start_of(int64_t b, int64_t pos) const;
  // The documents of all B sequences as cumulative offsets over their B T rows (b-major):
  // {0, ..., B T}, every sequence end a document end.
  std::vector<int32_t> row_offsets() const;
  // Sum over the documents of length^2: the (query, key) pairs attention needs under the mask,
  // counted as llm.c counts T^2 per sequence (model/config.h: flops_per_token).
  double squared_lengths() const;
};

}  // namespace tripod
