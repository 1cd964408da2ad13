// `dhelix profile` and `dhelix plan`: the automatic half of Strand Interleaving (profiling the
// operator windows of the folded layer pair, then the DP plan search).
#include <fmt/format.h>

#include "Commands.h"
#include "base/Error.h"

namespace dhelix {

int cmd_profile(int argc, char** argv) {
  throw ConfigError("dhelix profile: not available in this build yet");
}

int cmd_plan(int argc, char** argv) {
  throw ConfigError("dhelix plan: not available in this build yet");
}

}  // namespace dhelix
