// Fuzz target: the MMIDIDX reader (IndexedDataset). Input layout, so that one input decides both
// files: u32 little-endian L | the .idx bytes (the rest). The .bin is L bytes (L taken modulo
// 64 KiB) of a fixed pattern -- its contents are any token values; only its length is checked
// against the index. Oracles: the reader's contract (FuzzCommon.h), and for an accepted pair the
// accessors' own promises: every document's token range lies inside the stream and every
// sequence reads back with its indexed size.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "FuzzCommon.h"
#include "train/IndexedDataset.h"

using namespace dhelix;

namespace {

void walk(const IndexedDataset& ds) {
  for (int64_t d = 0; d < ds.num_documents(); ++d) {
    auto [begin, end] = ds.document_token_range(d, d + 1);
    if (begin < 0 || begin > end || end > ds.num_tokens()) fuzz::fail("index", "document range outside the stream");
  }
  int64_t total = 0;
  for (int64_t i = 0; i < ds.num_sequences(); ++i) {
    if (ds.sequence_start(i) != total) fuzz::fail("index", "sequences are not contiguous");
    if (static_cast<int64_t>(ds.sequence(i).size()) != ds.sizes()[i]) fuzz::fail("index", "sequence size differs");
    total += ds.sizes()[i];
  }
  if (total != ds.num_tokens()) fuzz::fail("index", "sizes do not add up to num_tokens");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t bin_bytes = 0;
  std::memcpy(&bin_bytes, data, 4);
  bin_bytes %= 1u << 16;
  std::vector<uint8_t> bin(bin_bytes);
  for (size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<uint8_t>(i * 131 + 7);
  fuzz::write_scratch("in.bin", bin.data(), bin.size());
  fuzz::write_scratch("in.idx", data + 4, size - 4);
  const std::string prefix = (fuzz::scratch_dir() / "in").string();
  fuzz::accepts("index", [&] {
    IndexedDataset ds(prefix);
    fuzz::must_hold("index", [&] { walk(ds); });
  });
  return 0;
}
