// Fuzz target: the safetensors reader. read_safetensors takes a path, so each input is written
// to a scratch file first. Oracles: the reader's contract (FuzzCommon.h), and for an accepted
// file the writer against the reader -- write_safetensors of what was read reads back to the same
// names, dtypes, shapes, bytes and metadata.
#include <cstdint>
#include <cstring>
#include <string>

#include "FuzzCommon.h"
#include "train/Safetensors.h"

using namespace dhelix;

namespace {

void expect_same(const SafetensorsFile& a, const SafetensorsFile& b) {
  if (a.metadata != b.metadata) fuzz::fail("safetensors", "metadata changed in the round trip");
  if (a.tensors.size() != b.tensors.size()) fuzz::fail("safetensors", "tensor count changed in the round trip");
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& [na, ta] = a.tensors[i];
    const auto& [nb, tb] = b.tensors[i];
    if (na != nb || ta.dtype() != tb.dtype() || ta.shape() != tb.shape() || ta.nbytes() != tb.nbytes() ||
        std::memcmp(ta.raw(), tb.raw(), ta.nbytes()) != 0)
      fuzz::fail("safetensors", "tensor '" + na + "' changed in the round trip");
  }
  if (b.checksummed != b.tensors.size()) fuzz::fail("safetensors", "a written tensor has no verified checksum");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_scratch("in.safetensors", data, size);
  SafetensorsFile file;
  if (!fuzz::accepts("safetensors", [&] { file = read_safetensors(path); })) return 0;
  fuzz::must_hold("safetensors", [&] {
    const std::string again = (fuzz::scratch_dir() / "again.safetensors").string();
    write_safetensors(again, file.tensors, file.metadata);
    expect_same(file, read_safetensors(again));
  });
  return 0;
}
