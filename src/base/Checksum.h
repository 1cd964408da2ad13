// CRC-32C (Castagnoli, the polynomial of iSCSI, ext4 and RocksDB): the per-tensor checksum a
// checkpoint carries. Hardware crc32 instructions where the CPU has SSE4.2, a table otherwise;
// both give the same value. crc32c("123456789") = 0xE3069283.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace dhelix {

// CRC of `n` bytes continuing from `crc` (0 to start): crc32c(b, crc32c(a)) = crc32c(a ++ b).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// "e3069283": eight lower-case hex digits, the form checkpoints store.
std::string crc32c_hex(uint32_t crc);

}  // namespace dhelix
