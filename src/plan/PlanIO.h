// The SI plan as a versioned JSON file. Blocks name their ops (readable, and robust to a
// program whose indices moved); loading maps names back to windows against a LayerProgram and
// runs the checker. Not the executor's business how the file got here (search, default, hand).
//
// {"format":"dhelix-si-plan","version":2,"pair":"block","source":"search","predicted_s":1e-3,
//  "fwd_ops":[...all fwd op names...],"bwd_ops":[...],"carry_bwd":[...],
//  "blocks":[{"fwd":["attn.qkv","attn.core"],"bwd":["tp.ag.mlp.bwd"]}, ...]}
//
// An unknown predicted time (NaN, or +inf when a block was not priced) is not a JSON number: the
// writer leaves "predicted_s" out, and the reader reads a missing "predicted_s" -- or a null,
// which older builds wrote for NaN/inf -- as NaN, "unknown". So every file the writer makes
// loads back; a finite time round-trips exactly.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "plan/Program.h"
#include "plan/SIPlan.h"

namespace dhelix {

inline constexpr const char* kPlanFormat = "dhelix-si-plan";

nlohmann::json plan_to_json(const SIPlan& plan, const LayerProgram& prog);

// Throws PlanError on a wrong format or version, op lists that differ from `prog`, unknown op
// names, a block's names that are not a contiguous increasing run, or a plan that fails
// check_plan. `origin` names the input in messages (a path, "<string>").
SIPlan plan_from_json(const nlohmann::json& j, const LayerProgram& prog,
                      const std::string& origin = "<json>");

// Parses `text` as JSON, then plan_from_json (PlanError when it is not JSON).
SIPlan plan_from_text(const std::string& text, const LayerProgram& prog,
                      const std::string& origin = "<string>");

// File wrappers (atomic write; IoError when unreadable, PlanError when unparsable/illegal).
void save_plan(const std::string& path, const SIPlan& plan, const LayerProgram& prog);
SIPlan load_plan(const std::string& path, const LayerProgram& prog);

}  // namespace dhelix
