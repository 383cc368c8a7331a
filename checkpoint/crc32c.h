// CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78; the iSCSI / ext4 / Btrfs
// checksum): the checksum of every checkpoint dataset, over its little-endian f32 bytes.
// Check value: crc32c("123456789") = 0xE3069283. Uses the SSE4.2 instruction when the build
// targets a CPU that has it, a slicing-by-8 table otherwise; both give the same value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tripod {

// Continues `crc` (0 for a fresh checksum) over `n` bytes.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The checksum of A followed by B from crc32c(A), crc32c(B) and B's length in bytes.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t n_b);

}  // namespace tripod
