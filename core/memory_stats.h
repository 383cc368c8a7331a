// Bytes charged per category: current and peak, so the peak of each category is known exactly.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace tripod {

enum class MemCategory : uint8_t { Params, Grads, Optimizer, Activations, Workspace, Comm };
inline constexpr int kNumMemCategories = 6;

constexpr std::string_view mem_category_name(MemCategory c) {
  constexpr std::string_view names[] = {"params", "grads", "optimizer", "activations", "workspace", "comm"};
  return names[static_cast<int>(c)];
}

class MemoryStats {
 public:
  void charge(MemCategory c, int64_t bytes) {
    auto i = static_cast<int>(c);
    current_[i] += bytes;
    if (current_[i] > peak_[i]) peak_[i] = current_[i];
    total_ += bytes;
    if (total_ > total_peak_) total_peak_ = total_;
  }
  void release(MemCategory c, int64_t bytes) {
    current_[static_cast<int>(c)] -= bytes;
    total_ -= bytes;
  }
  int64_t current(MemCategory c) const { return current_[static_cast<int>(c)]; }
  int64_t peak(MemCategory c) const { return peak_[static_cast<int>(c)]; }
  int64_t total() const { return total_; }
  int64_t total_peak() const { return total_peak_; }
  // Starts a new measuring window: peaks become the current values.
  void reset_peaks() {
    peak_ = current_;
    total_peak_ = total_;
  }

 private:
  std::array<int64_t, kNumMemCategories> current_{}, peak_{};
  int64_t total_ = 0, total_peak_ = 0;
};

}  // namespace tripod
