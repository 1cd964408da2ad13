// Fuzz target: the SI plan JSON reader (plan_from_text, against the demo model's block program
// with tp = 2, which has collectives) and, on the same JSON, the profile reader
// (Profile::from_json). Oracles: the readers' contract (FuzzCommon.h), and for accepted input the
// writers against the readers: plan_to_json / to_json of what was read loads back to the same
// plan (an unknown predicted time as NaN, PlanIO.h) and the same profile.
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "FuzzCommon.h"
#include "model/ModelConfig.h"
#include "plan/PlanIO.h"
#include "plan/Profile.h"
#include "sharding/ModelPrograms.h"

using namespace dhelix;

namespace {

const LayerProgram& program() {
  static const LayerProgram prog = [] {
    LayoutConfig lay;
    lay.tp = 2;
    lay.sequence_parallel = true;
    const ModelConfig m = model_preset("demo");
    return build_programs(m, lay, MicroBatchShape{2, m.seq_len}).block;
  }();
  return prog;
}

bool same_time(double a, double b) {
  return std::isfinite(a) ? a == b : std::isnan(b);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const LayerProgram& prog = program();
  SIPlan plan;
  if (fuzz::accepts("plan", [&] { plan = plan_from_text(text, prog, "<fuzz>"); }))
    fuzz::must_hold("plan", [&] {
      const SIPlan back = plan_from_text(plan_to_json(plan, prog).dump(2), prog, "<plan_to_json>");
      if (back.blocks != plan.blocks || back.carry != plan.carry || back.pair != plan.pair ||
          back.source != plan.source || !same_time(plan.predicted_s, back.predicted_s))
        fuzz::fail("plan", "plan_to_json -> plan_from_text changed the plan");
    });

  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  Profile profile;
  if (fuzz::accepts("profile", [&] { profile = Profile::from_json(j, "<fuzz>"); })) {
    fuzz::accepts("profile", [&] { profile.check_matches(prog); });
    fuzz::must_hold("profile", [&] {
      const nlohmann::json written = profile.to_json();
      if (Profile::from_json(nlohmann::json::parse(written.dump(1)), "<to_json>").to_json() != written)
        fuzz::fail("profile", "to_json -> from_json -> to_json changed the profile");
    });
  }
  return 0;
}
