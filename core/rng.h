// Counter-based random numbers (Philox4x32-10): the value for element i of stream `key` is a pure
// function of (seed, key, i), so a tensor shard initialises exactly as the same rows of the whole
// tensor would, on any grid, and recomputation redraws the same numbers.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace tripod {

inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(M0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(M1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
    key[0] += W0;
    key[1] += W1;
  }
  return ctr;
}

// FNV-1a, for turning names into stream keys.
constexpr uint64_t hash_name(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

class CounterRng {
 public:
  CounterRng(uint64_t seed, uint64_t stream) : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
                                               stream_(stream) {}
  // Uniform in (0, 1) for element i.
  double uniform(uint64_t i) const {
    auto r = draw(i);
    return (static_cast<double>(r[0]) + 0.5) / 4294967296.0;
  }
  // Standard normal for element i (Box-Muller on two 32-bit draws).
  double normal(uint64_t i) const {
    auto r = draw(i);
    double u1 = (static_cast<double>(r[0]) + 0.5) / 4294967296.0;
    double u2 = (static_cast<double>(r[1]) + 0.5) / 4294967296.0;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::array<uint32_t, 4> draw(uint64_t i) const {
    return philox4x32({static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), static_cast<uint32_t>(stream_),
                       static_cast<uint32_t>(stream_ >> 32)},
                      key_);
  }
  std::array<uint32_t, 2> key_;
  uint64_t stream_;
};

}  // namespace tripod
