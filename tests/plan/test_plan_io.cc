// Plan JSON, profile JSON, text and SVG rendering. Oracles: round trips (save -> load gives
// the same plan / table), hand-written bad files whose error is known, and substrings the
// rendering must contain.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "PlanTestUtil.h"
#include "base/Error.h"
#include "plan/PlanIO.h"
#include "plan/PlanRender.h"
#include "plan/PlanSvg.h"
#include "plan/Profile.h"
#include "schedule/BasicPlans.h"
#include "schedule/PlanSearch.h"

namespace dhelix {
namespace {

using nlohmann::json;

std::string error_of(const json& j, const LayerProgram& prog) {
  try {
    plan_from_json(j, prog, "t.json");
  } catch (const PlanError& e) {
    return e.what();
  }
  return "";
}

TEST(PlanIO, RoundTripKeepsBlocksAndHeader) {
  LayerProgram prog = test::llama_like_pair();
  test::HashCost cost(7, 100);
  SIPlan plan = search_plans(prog, cost, {.top_k = 3}).plans[2];
  json j = plan_to_json(plan, prog);
  EXPECT_EQ(j["format"], "dhelix-si-plan");
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["fwd_ops"].size(), 13u);
  SIPlan back = plan_from_json(json::parse(j.dump()), prog);
  EXPECT_EQ(back.blocks, plan.blocks);
  EXPECT_EQ(back.pair, "block");
  EXPECT_EQ(back.source, "search");
  EXPECT_DOUBLE_EQ(back.predicted_s, plan.predicted_s);
}

// carry_bwd (version 2) round-trips; version-1 files (no carry) still load, as carry 0; a
// carry_bwd that is not the program's trailing ops is rejected. Oracle: the plan written.
TEST(PlanIO, CarryRoundTripsAndVersionOneLoads) {
  LayerProgram prog = test::program_from("c tp c c", "tp c c");
  prog.bwd[2].grads = {"w"};
  SIPlan plan = default_plan(prog);
  plan.carry = 1;
  json j = plan_to_json(plan, prog);
  EXPECT_EQ(j["carry_bwd"], json::array({"b2"}));
  EXPECT_EQ(plan_from_json(json::parse(j.dump()), prog).carry, 1);
  json v1 = j;
  v1["version"] = 1;
  v1.erase("carry_bwd");
  EXPECT_EQ(plan_from_json(v1, prog).carry, 0);
  j["carry_bwd"] = json::array({"b1"});
  EXPECT_NE(error_of(j, prog).find("'carry_bwd'[0] is \"b1\", expected 'b2': carried ops must be the last 1 "
                                   "backward ops"),
            std::string::npos)
      << error_of(j, prog);
}

TEST(PlanIO, FileRoundTrip) {
  LayerProgram prog = test::llama_like_pair();
  SIPlan plan = default_plan(prog);
  std::string path = (std::filesystem::temp_directory_path() / "dhelix_test_plan.json").string();
  save_plan(path, plan, prog);
  EXPECT_EQ(load_plan(path, prog).blocks, plan.blocks);
  std::filesystem::remove(path);
}

// The predicted time compared as the format promises (PlanIO.h): a finite time comes back with the
// same bits; an unknown one (NaN or +-inf, which JSON cannot hold) comes back as NaN.
void expect_same_time(double written, double read) {
  if (std::isfinite(written))
    EXPECT_EQ(std::bit_cast<uint64_t>(read), std::bit_cast<uint64_t>(written)) << written << " read as " << read;
  else
    EXPECT_TRUE(std::isnan(read)) << written << " read as " << read;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

// The reported bug: the default plan kept by validation had a block the profile did not price, so
// its predicted time was unknown (cost.plan = +inf), the file said "predicted_s": null, and
// load_plan refused it ("bad plan header: type must be number, but is null"). Oracle: write then
// read round trip through the file -- the same blocks, carry and header, the unknown time as NaN.
TEST(PlanIO, UnknownPredictedTimeRoundTripsThroughFile) {
  const LayerProgram prog = test::llama_like_pair();
  SIPlan unpriced = default_plan(prog);
  test::HashCost cost(11, 1000);  // every window longer than one op is unpriced
  unpriced.predicted_s = cost.plan(unpriced);
  ASSERT_TRUE(std::isinf(unpriced.predicted_s)) << "the default plan should have an unpriced block";
  const std::string path = temp_path("dhelix_test_plan_unknown.json");
  for (double t : {unpriced.predicted_s, std::numeric_limits<double>::quiet_NaN(),
                   -std::numeric_limits<double>::infinity(), 0.0, 1.25e-3}) {
    SIPlan plan = unpriced;
    plan.predicted_s = t;
    save_plan(path, plan, prog);
    SIPlan back;
    ASSERT_NO_THROW(back = load_plan(path, prog)) << "predicted_s = " << t;
    EXPECT_EQ(back.blocks, plan.blocks);
    EXPECT_EQ(back.carry, plan.carry);
    EXPECT_EQ(back.pair, plan.pair);
    EXPECT_EQ(back.source, plan.source);
    expect_same_time(t, back.predicted_s);
  }
  std::filesystem::remove(path);
}

// Files that builds before this fix wrote (NaN / inf as null), and files without the field
// (unknown by the format). Oracle: the format's rule -- both read as NaN; any other non-number
// is refused as a PlanError naming the field.
TEST(PlanIO, NullOrMissingPredictedTimeReadsAsUnknown) {
  const LayerProgram prog = test::program_from("c tp c c", "tp c c");
  json j = plan_to_json(default_plan(prog), prog);
  j["predicted_s"] = nullptr;
  EXPECT_TRUE(std::isnan(plan_from_json(j, prog).predicted_s));
  EXPECT_TRUE(std::isnan(plan_from_text(j.dump(), prog).predicted_s));
  j.erase("predicted_s");
  EXPECT_TRUE(std::isnan(plan_from_json(j, prog).predicted_s));
  j["predicted_s"] = "fast";
  EXPECT_NE(error_of(j, prog).find("'predicted_s' is \"fast\", expected a number of seconds"),
            std::string::npos)
      << error_of(j, prog);
  EXPECT_THROW(plan_from_text("{\"format\": ", prog), PlanError);
}

// Oracle: write-then-read round trip for any double (every bit pattern, NaN payloads and
// infinities included): finite values come back bitwise, the rest as NaN.
RC_GTEST_PROP(PlanIO, AnyPredictedTimeRoundTrips, ()) {
  static const LayerProgram prog = test::program_from("c tp c", "tp c");
  SIPlan plan = default_plan(prog);
  plan.predicted_s = std::bit_cast<double>(*rc::gen::arbitrary<uint64_t>());
  const SIPlan back = plan_from_text(plan_to_json(plan, prog).dump(2), prog);
  if (std::isfinite(plan.predicted_s))
    RC_ASSERT(std::bit_cast<uint64_t>(back.predicted_s) == std::bit_cast<uint64_t>(plan.predicted_s));
  else
    RC_ASSERT(std::isnan(back.predicted_s));
  RC_ASSERT(back.blocks == plan.blocks);
}

TEST(PlanIO, RejectsBadFiles) {
  LayerProgram prog = test::program_from("c tp c c", "tp c c");
  SIPlan plan = default_plan(prog);
  const json good = plan_to_json(plan, prog);
  ASSERT_EQ(error_of(good, prog), "");

  json j = good;
  j["format"] = "other";
  EXPECT_NE(error_of(j, prog).find("format is 'other'"), std::string::npos);
  j = good;
  j["version"] = 3;
  EXPECT_NE(error_of(j, prog).find("plan version 3 is not supported"), std::string::npos);
  j = good;
  j["blocks"][1]["fwd"] = json::array({"f2", "nope"});
  EXPECT_NE(error_of(j, prog).find("block 1: unknown fwd op 'nope'"), std::string::npos);
  j = good;
  j["blocks"][1]["fwd"] = json::array({"f3", "f2"});
  EXPECT_NE(error_of(j, prog).find("block 1: fwd op 'f2' (#2) does not follow 'f3' (#3)"),
            std::string::npos);
  j = good;
  j["fwd_ops"][0] = "g0";
  EXPECT_NE(error_of(j, prog).find("'fwd_ops'[0] is \"g0\", the program has 'f0'"),
            std::string::npos);
  j = good;
  j["blocks"].erase(0);  // f0 alone: now missing
  EXPECT_NE(error_of(j, prog).find("rule 'each op exactly once': fwd op #0 'f0' is in no block"),
            std::string::npos);
  EXPECT_THROW(load_plan("/nonexistent/plan.json", prog), IoError);
}

TEST(Profile, RoundTripAndLookup) {
  LayerProgram prog = test::program_from("c tp c", "tp c");
  Profile p;
  p.meta.model = "tiny";
  p.meta.layout = "tp=2";
  p.meta.repeats = 20;
  p.describe_program(prog);
  p.set_solo_fwd({0, 1}, 1e-3);
  p.set_solo_bwd({1, 2}, 2e-3);
  p.set_pair({1, 2}, {1, 2}, 2.5e-3);
  Profile q = Profile::from_json(json::parse(p.to_json().dump()));
  EXPECT_EQ(q.meta.model, "tiny");
  EXPECT_EQ(q.meta.repeats, 20);
  EXPECT_EQ(q.meta.fwd_ops, (std::vector<std::string>{"f0", "f1.tp", "f2"}));
  EXPECT_DOUBLE_EQ(q.solo_fwd(0, 1), 1e-3);
  EXPECT_DOUBLE_EQ(q.solo_bwd(1, 2), 2e-3);
  EXPECT_DOUBLE_EQ(q.pair(1, 2, 1, 2), 2.5e-3);
  EXPECT_EQ(q.solo_fwd(0, 2), kNoCost);
  EXPECT_EQ(q.num_pairs(), 1u);
  EXPECT_NO_THROW(q.check_matches(prog));
  EXPECT_THROW(q.check_matches(test::program_from("c tp c c", "tp c")), PlanError);
  json bad = p.to_json();
  bad["version"] = 9;
  EXPECT_THROW(Profile::from_json(bad), PlanError);
  EXPECT_THROW(p.set_pair({0, 1}, {0, 1}, -1), PlanError);
}

// The profile's writer against its reader, through the file. A profile holds only measured,
// finite times (set_* refuses NaN / inf / negative); a window that was not measured is absent and
// reads as unknown (kNoCost), so no unknown time is ever written as a number. Oracle: write then
// read round trip -- every stored time bitwise, every absent entry still absent.
TEST(Profile, FileRoundTripKeepsTimesAndUnknowns) {
  const LayerProgram prog = test::program_from("c tp c", "tp c");
  Profile p;
  p.describe_program(prog);
  p.meta.machine = "test \"box\"\n";
  p.set_solo_fwd({0, 1}, 0.1 + 0.2);
  p.set_solo_fwd({0, 2}, std::numeric_limits<double>::denorm_min());
  p.set_solo_bwd({0, 1}, std::numeric_limits<double>::max());
  p.set_pair({1, 2}, {0, 1}, 0.0);
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(), -1.0})
    EXPECT_THROW(p.set_solo_bwd({1, 2}, bad), PlanError) << bad;
  const std::string path = temp_path("dhelix_test_profile_roundtrip.json");
  p.save(path);
  const Profile q = Profile::load(path);
  std::filesystem::remove(path);
  EXPECT_EQ(q.meta.machine, p.meta.machine);
  EXPECT_EQ(q.to_json(), p.to_json());
  EXPECT_EQ(std::bit_cast<uint64_t>(q.solo_fwd(0, 1)), std::bit_cast<uint64_t>(0.1 + 0.2));
  EXPECT_EQ(q.solo_fwd(0, 2), std::numeric_limits<double>::denorm_min());
  EXPECT_EQ(q.solo_bwd(0, 1), std::numeric_limits<double>::max());
  EXPECT_EQ(q.pair(1, 2, 0, 1), 0.0);
  EXPECT_FALSE(q.find_solo_bwd({1, 2}).has_value());  // the refused NaN / inf / -1 left no entry
  EXPECT_EQ(q.solo_bwd(1, 2), kNoCost);
  EXPECT_EQ(q.pair(0, 1, 0, 1), kNoCost);
  EXPECT_EQ(q.num_solo_fwd(), 2u);
  EXPECT_EQ(q.num_solo_bwd(), 1u);
  EXPECT_EQ(q.num_pairs(), 1u);
}

// A profile file whose time is null (what a NaN would have become) or not a number is refused as
// a PlanError naming the entry, never taken as a time. Oracle: hand-edited files.
TEST(Profile, NonNumberTimesAreRefused) {
  Profile p;
  p.describe_program(test::program_from("c tp c", "tp c"));
  p.set_solo_fwd({0, 1}, 1e-3);
  for (const json& bad : {json(nullptr), json("1e-3"), json(-1.0)}) {
    json j = p.to_json();
    j["solo_fwd"][0][2] = bad;
    EXPECT_THROW(Profile::from_json(j), PlanError) << bad.dump();
  }
}

// meta.timing_overhead_s (the profiler's timing bracket, taken out of every entry): written and read
// back bitwise, absent in an older profile (read as 0), and refused as a PlanError naming the field
// where it is not a finite number >= 0. Oracle: hand-edited files.
TEST(Profile, TimingOverheadRoundTripsAndBadValuesAreRefused) {
  Profile p;
  p.describe_program(test::program_from("c tp c", "tp c"));
  p.set_solo_fwd({0, 1}, 1e-3);
  p.meta.timing_overhead_s = 3.7e-5;
  EXPECT_EQ(Profile::from_json(json::parse(p.to_json().dump())).meta.timing_overhead_s, 3.7e-5);
  json old = p.to_json();
  old["meta"].erase("timing_overhead_s");
  EXPECT_EQ(Profile::from_json(old).meta.timing_overhead_s, 0.0);
  for (const json& bad : {json(-1e-6), json("1e-5"), json(nullptr)}) {
    json j = p.to_json();
    j["meta"]["timing_overhead_s"] = bad;
    try {
      Profile::from_json(j, "p.json");
      ADD_FAILURE() << "accepted timing_overhead_s " << bad.dump();
    } catch (const PlanError& e) {
      EXPECT_NE(std::string(e.what()).find("timing_overhead_s"), std::string::npos) << e.what();
    }
  }
}

// Numbers that are not ints where the formats want one: a float (get<int> of 5e50 was undefined
// behaviour, found by fuzz/fuzz_plan) or an integer wider than int (a plan version 2^32 + 1 read
// as version 1). Oracle: hand-edited files; each is refused as a PlanError naming the field.
TEST(PlanIO, NonIntFieldsAreRefused) {
  Profile p;
  p.describe_program(test::program_from("c tp c", "tp c"));
  p.set_solo_fwd({0, 1}, 1e-3);
  p.set_pair({0, 1}, {0, 1}, 2e-3);
  const json good = p.to_json();
  ASSERT_NO_THROW(Profile::from_json(good));
  auto profile_error = [](const json& j) -> std::string {
    try {
      Profile::from_json(j, "p.json");
    } catch (const PlanError& e) {
      return e.what();
    }
    return "";
  };
  json j = good;
  j["meta"]["repeats"] = 5e50;
  EXPECT_NE(profile_error(j).find("meta 'repeats' is 5e+50, expected an integer"), std::string::npos) << profile_error(j);
  j = good;
  j["version"] = 1.0;
  EXPECT_NE(profile_error(j).find("'version' is 1.0, expected an integer"), std::string::npos) << profile_error(j);
  j = good;
  j["solo_fwd"][0][1] = 4294967297ull;
  EXPECT_NE(profile_error(j).find("solo_fwd b is 4294967297"), std::string::npos) << profile_error(j);
  j = good;
  j["pairs"][0][2] = -1e300;
  EXPECT_NE(profile_error(j).find("pairs c is -1e+300"), std::string::npos) << profile_error(j);

  const LayerProgram prog = test::program_from("c tp c c", "tp c c");
  json plan = plan_to_json(default_plan(prog), prog);
  plan["version"] = 4294967297ull;
  EXPECT_NE(error_of(plan, prog).find("plan version 4294967297 is not supported"), std::string::npos)
      << error_of(plan, prog);
}

// Every key of a good plan and a good profile (top level and one level down) replaced by a value
// of each JSON type. Oracle: the readers' contract (as fuzz/FuzzCommon.h) -- they return or throw
// PlanError; "format": [[1, 2]] escaped plan_from_json as a json::exception (found by fuzz_plan).
TEST(PlanIO, WrongJsonTypesArePlanErrors) {
  const LayerProgram prog = test::program_from("c tp c c", "tp c c");
  SIPlan plan = default_plan(prog);
  plan.predicted_s = 1.0;
  Profile prof;
  prof.describe_program(prog);
  prof.set_solo_fwd({0, 1}, 1e-3);
  prof.set_pair({0, 1}, {0, 1}, 2e-3);
  const json values[] = {nullptr, true, -3, 1.5, "x", json::array({json::array({1, 2})}), json::object({{"a", 1}})};
  auto mutants = [&](const json& good) {
    std::vector<json> out;
    for (auto& [key, v] : good.items()) {
      for (const json& x : values) {
        json j = good;
        j[key] = x;
        out.push_back(j);
      }
      if (v.is_object() || v.is_array())
        for (size_t i = 0; i < v.size(); ++i)
          for (const json& x : values) {
            json j = good;
            if (v.is_array()) j[key][i] = x;
            else j[key][std::next(v.items().begin(), static_cast<long>(i)).key()] = x;
            out.push_back(j);
          }
    }
    return out;
  };
  for (const json& j : mutants(plan_to_json(plan, prog))) {
    try {
      plan_from_json(j, prog);
    } catch (const PlanError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "plan_from_json threw " << e.what() << " on " << j.dump();
    }
  }
  for (const json& j : mutants(prof.to_json())) {
    try {
      Profile::from_json(j);
    } catch (const PlanError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "Profile::from_json threw " << e.what() << " on " << j.dump();
    }
  }
}

TEST(Profile, SearchOnMeasuredTable) {
  // Oracle: a table where pairing the collective with the other strand's compute is cheaper
  // than running either alone; the search must find that block.
  LayerProgram prog = test::program_from("tp", "c");
  Profile p;
  p.describe_program(prog);
  p.set_solo_fwd({0, 1}, 1.0);
  p.set_solo_bwd({0, 1}, 1.0);
  p.set_pair({0, 1}, {0, 1}, 1.2);
  SIPlan best = best_plan(prog, p);
  ASSERT_EQ(best.blocks.size(), 1u);
  EXPECT_EQ(best.blocks[0], (Block{0, 1, 0, 1}));
  EXPECT_DOUBLE_EQ(best.predicted_s, 1.2);
  Profile empty;
  EXPECT_THROW(best_plan(prog, empty), PlanError);
}

TEST(PlanRender, TableNamesOpsAndCollectives) {
  LayerProgram prog = test::llama_like_pair();
  test::HashCost cost(3, 0);
  SIPlan plan = default_plan(prog);
  plan.predicted_s = cost.plan(plan);
  std::string text = render_plan(plan, prog, &cost);
  EXPECT_NE(text.find("SI plan 'block' (source default)"), std::string::npos) << text;
  EXPECT_NE(text.find("forward ops"), std::string::npos);
  EXPECT_NE(text.find("fwd tp all_gather tp.ag.attn"), std::string::npos) << text;
  EXPECT_NE(text.find("attn.qkv attn.core attn.proj"), std::string::npos) << text;
  // One header line, one column-title line, one line per block.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'),
            static_cast<long>(plan.blocks.size()) + 2);
}

TEST(PlanSvg, TimelineHasLanesBlocksAndLabels) {
  LayerProgram prog = test::program_from("c tp c c cp", "tp c c cp");
  test::HashCost cost(5, 0);
  SIPlan plan = best_plan(prog, cost);
  for (const BlockCost* c : {static_cast<const BlockCost*>(&cost), static_cast<const BlockCost*>(nullptr)}) {
    std::string svg = render_plan_svg(plan, prog, c);
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
    EXPECT_NE(svg.find("comm tp"), std::string::npos);
    EXPECT_NE(svg.find("comm cp"), std::string::npos);
    EXPECT_NE(svg.find("<title>fwd f1.tp #1 (all_gather on tp)"), std::string::npos);
    // Every op of both strands is drawn once.
    size_t boxes = 0;
    for (size_t at = 0; (at = svg.find("<g><title>", at)) != std::string::npos; ++at) ++boxes;
    EXPECT_EQ(boxes, prog.fwd.size() + prog.bwd.size());
  }
}

}  // namespace
}  // namespace dhelix
