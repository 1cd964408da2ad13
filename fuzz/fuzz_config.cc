// Fuzz target: the TOML run config (load_config_text with the real model hooks). Oracles: the
// reader's contract (FuzzCommon.h), and for accepted input the writer against the reader --
// to_toml's text loads back, and writing that again gives the same text.
#include <cstdint>
#include <string>

#include "FuzzCommon.h"
#include "train/Config.h"

using namespace dhelix;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  RunConfig cfg;
  if (!fuzz::accepts("config", [&] { cfg = load_config_text(text, "<fuzz>", {}); })) return 0;
  fuzz::must_hold("config", [&] {
    const std::string written = to_toml(cfg);
    const std::string again = to_toml(load_config_text(written, "<to_toml>", {}));
    if (again != written) fuzz::fail("config", "to_toml -> load -> to_toml changed the text:\n" + written + "\n---\n" + again);
  });
  return 0;
}
