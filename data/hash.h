// A fast 64-bit hash of bytes, for naming and checking the index caches (not cryptographic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace tripod {

inline uint64_t mix64(uint64_t x) {
  // splitmix64's finaliser: every input bit affects every output bit.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Four independent lanes over 32-byte blocks keep the multiplies in flight (several GB/s).
inline uint64_t hash_bytes(const void* data, size_t n, uint64_t seed = 0) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {seed ^ 0x243f6a8885a308d3ull, seed ^ 0x13198a2e03707344ull, seed ^ 0xa4093822299f31d0ull,
                      seed ^ 0x082efa98ec4e6c89ull};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = (lane[k] ^ (w * 0x9e3779b97f4a7c15ull));
      lane[k] = ((lane[k] << 31) | (lane[k] >> 33)) * 0xc2b2ae3d27d4eb4full;
    }
  }
  uint64_t h = mix64(lane[0]) ^ mix64(lane[1] + 1) ^ mix64(lane[2] + 2) ^ mix64(lane[3] + 3) ^ mix64(n);
  for (; i < n; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, n - i < 8 ? n - i : 8);
    h = mix64(h ^ (w * 0x9e3779b97f4a7c15ull));
  }
  return h;
}

inline uint64_t hash_string(std::string_view s, uint64_t seed = 0) { return hash_bytes(s.data(), s.size(), seed); }

}  // namespace tripod
