// CRC32C: hardware (SSE4.2, three interleaved streams) or slicing-by-8.
#include "checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace tripod {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected

// table[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
      t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k)
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
};

[[maybe_unused]] uint32_t crc32c_table(const unsigned char* p, size_t n, uint32_t c) {
  static const Tables tables;
  const auto& t = tables.t;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^
        t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return c;
}

// a * b modulo the polynomial (reflected bit order: bit 31 is x^0); a must not be 0.
uint32_t mult_mod_p(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8n) modulo the polynomial: multiplying the raw CRC register by it appends n zero bytes.
uint32_t x8n_mod_p(size_t n) {
  uint32_t p = 1u << 31;  // x^0
  uint32_t sq = 1u << 23;  // x^8
  for (; n; n >>= 1) {
    if (n & 1) p = mult_mod_p(sq, p);
    sq = mult_mod_p(sq, sq);
  }
  return p;
}

#if defined(__SSE4_2__)
uint64_t crc_words(uint64_t c, const unsigned char* p, size_t words) {
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    c = _mm_crc32_u64(c, w);
  }
  return c;
}

// The crc32 instruction has a latency of 3 cycles and a throughput of 1: three independent
// streams over consecutive blocks, joined by shifting the earlier ones' registers over the later
// blocks (the raw register is linear: crc(A B, r) = shift_|B|(crc(A, r)) ^ crc(B, 0)).
constexpr size_t kBlock = 4096;

struct Shift {  // multiplying a register by x^(8 kBlock), a byte at a time
  std::array<std::array<uint32_t, 256>, 4> t{};
  Shift() {
    const uint32_t x = x8n_mod_p(kBlock);
    for (int k = 0; k < 4; ++k)
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = mult_mod_p(x, b << (8 * k));
  }
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

uint32_t crc32c_hw(const unsigned char* p, size_t n, uint32_t c) {
  static const Shift shift;
  while (n >= 3 * kBlock) {
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < kBlock / 8; ++i) {
      uint64_t wa, wb, wd;
      std::memcpy(&wa, p + 8 * i, 8);
      std::memcpy(&wb, p + kBlock + 8 * i, 8);
      std::memcpy(&wd, p + 2 * kBlock + 8 * i, 8);
      a = _mm_crc32_u64(a, wa);
      b = _mm_crc32_u64(b, wb);
      d = _mm_crc32_u64(d, wd);
    }
    c = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(d);
    p += 3 * kBlock;
    n -= 3 * kBlock;
  }
  c = static_cast<uint32_t>(crc_words(c, p, n / 8));
  p += n / 8 * 8;
  for (n %= 8; n--;) c = _mm_crc32_u8(c, *p++);
  return c;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__SSE4_2__)
  return ~crc32c_hw(p, n, ~crc);
#else
  return ~crc32c_table(p, n, ~crc);
#endif
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t n_b) {
  return mult_mod_p(x8n_mod_p(n_b), crc_a) ^ crc_b;
}

}  // namespace tripod
