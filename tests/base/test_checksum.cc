// CRC-32C. Oracles: the check value of the CRC catalogue ("123456789" -> 0xE3069283), the test
// vectors of RFC 3720 appendix B.4 (32 bytes of 0x00, of 0xFF, ascending 0..31), and a bit-at-a-
// time reference written from the polynomial's definition for every length 0..300 at every
// alignment 0..7 (the hardware path handles 8-byte words and a byte tail).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "base/Checksum.h"

namespace dhelix {
namespace {

uint32_t crc_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(Checksum, KnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  unsigned char b[32];
  std::memset(b, 0, 32);
  EXPECT_EQ(crc32c(b, 32), 0x8A9136AAu);
  std::memset(b, 0xFF, 32);
  EXPECT_EQ(crc32c(b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) b[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(b, 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  EXPECT_EQ(crc32c_hex(0xE3069283u), "e3069283");
}

TEST(Checksum, EqualsBitwiseReferenceAtEveryLengthAndAlignment) {
  std::mt19937 rng(5);
  std::vector<unsigned char> buf(320);
  for (auto& x : buf) x = static_cast<unsigned char>(rng());
  for (size_t off = 0; off < 8; ++off)
    for (size_t n = 0; n <= 300; ++n) ASSERT_EQ(crc32c(buf.data() + off, n), crc_bitwise(buf.data() + off, n)) << off << " " << n;
}

TEST(Checksum, ChainsAcrossPieces) {
  const char* s = "the quick brown fox jumps over the lazy dog";
  const size_t n = std::strlen(s);
  for (size_t cut = 0; cut <= n; ++cut) EXPECT_EQ(crc32c(s + cut, n - cut, crc32c(s, cut)), crc32c(s, n));
}

}  // namespace
}  // namespace dhelix
