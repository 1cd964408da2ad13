// The profile table: measured median seconds of forward windows alone, backward windows alone,
// and (fwd, bwd) window pairs co-executed, with the metadata that says what was measured where.
// Versioned JSON. It is a BlockCost for the plan search; it does not measure anything (the
// profiler fills it by running the real executor).
#pragma once
#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "plan/BlockCost.h"
#include "plan/Program.h"
#include "plan/Windows.h"

namespace dhelix {

inline constexpr const char* kProfileFormat = "dhelix-profile";

struct ProfileMeta {
  std::string model;      // "llama-70b"
  std::string layout;     // "tp=8,sp,dp=1"
  std::string shapes;     // "b=1,s=4096,h=8192"
  std::string machine;    // "a800 x8" / hostname + backend
  std::string timestamp;  // ISO 8601
  std::string pair;       // LayerProgram name: "block"
  // What the times were measured with ("bf16 GEMMs, bf16 wire", "GPU (bf16)": describe_precision in
  // profile/LayerPairBench.h); empty in a profile written before the field, which nothing checks.
  std::string precision;
  int repeats = 0;        // timed runs per entry (the stored value is their median)
  int warmup = 0;         // untimed runs before them
  // The timing bracket's own seconds (a run of no op: LayerPairBench::local_overhead), already taken
  // out of every entry; 0 in a profile written before the field (its entries carry it).
  double timing_overhead_s = 0;
  std::vector<std::string> fwd_ops, bwd_ops;  // op names, to match the profile to a program
};

class Profile final : public BlockCost {
 public:
  static constexpr int kVersion = 1;

  ProfileMeta meta;

  // Fills meta.pair / fwd_ops / bwd_ops from `prog`.
  void describe_program(const LayerProgram& prog);
  // PlanError when meta's op lists are not `prog`'s (a profile of another program).
  void check_matches(const LayerProgram& prog) const;

  void set_solo_fwd(Window f, double seconds);
  void set_solo_bwd(Window b, double seconds);
  void set_pair(Window f, Window b, double seconds);

  std::optional<double> find_solo_fwd(Window f) const;
  std::optional<double> find_solo_bwd(Window b) const;
  std::optional<double> find_pair(Window f, Window b) const;

  // BlockCost: the stored median, or kNoCost when the entry was not measured.
  double solo_fwd(int a, int b) const override;
  double solo_bwd(int c, int d) const override;
  double pair(int a, int b, int c, int d) const override;

  size_t num_solo_fwd() const { return solo_fwd_.size(); }
  size_t num_solo_bwd() const { return solo_bwd_.size(); }
  size_t num_pairs() const { return pairs_.size(); }

  // {"format":"dhelix-profile","version":1,"meta":{...},
  //  "solo_fwd":[[a,b,s],...],"solo_bwd":[[c,d,s],...],"pairs":[[a,b,c,d,s],...]}
  nlohmann::json to_json() const;
  static Profile from_json(const nlohmann::json& j, const std::string& origin = "<json>");
  void save(const std::string& path) const;
  static Profile load(const std::string& path);

 private:
  std::map<std::array<int, 2>, double> solo_fwd_, solo_bwd_;
  std::map<std::array<int, 4>, double> pairs_;
};

}  // namespace dhelix
