// The operator-overlap profiler (§4): on a LayerPairBench, times every forward window alone,
// every backward window alone and every legal (forward, backward) window pair co-executed as one
// SI block, and fills a Profile (medians, agreed across ranks as the slowest rank's). Also the
// strings that say what a profile is of, so `dhelix plan` can refuse a profile of another run.
// It measures; the search (schedule/PlanSearch) and the CLI live elsewhere.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "layout/Layout.h"
#include "model/ModelConfig.h"
#include "sharding/ModelPrograms.h"
#include "plan/Profile.h"
#include "plan/Windows.h"
#include "profile/LayerPairBench.h"

namespace dhelix {

struct ProfileOptions {
  BenchTiming timing;
  WindowRule windows = WindowRule::kWithinSegments;
  int max_window = 0;       // longest window in ops; 0 = no limit (as the search's max_window)
  std::string machine;      // written to meta.machine ("" = hostname, cores, backend, ranks)
  // Called on every rank after each entry: (entries done, entries total).
  std::function<void(int64_t, int64_t)> progress;
};

// Number of entries profile_layer_pair will time for `prog` (solo fwd + solo bwd + pairs).
int64_t profile_entry_count(const LayerProgram& prog, WindowRule rule, int max_window);

// Times every entry on `bench` (collective over the world: every rank calls it). The result is
// identical on every rank.
Profile profile_layer_pair(LayerPairBench& bench, const ModelConfig& model, const LayoutConfig& layout,
                           CommContext* comm, const ProfileOptions& opts);

// What meta.model / meta.layout / meta.shapes say for a run, e.g.
//   "gpt2-124m gpt C=768 L=12 H=12/12 F=3072 V=8192", "tp=2,sp,dp=1", "B=4,T=1024".
std::string describe_model(const ModelConfig& m);
std::string describe_layout(const LayoutConfig& l);
std::string describe_shapes(const MicroBatchShape& mb);

// PlanError naming every field (model, layout, shapes, op lists, precision) where `p` was not
// measured for this run: the profile of another model, layout or precision. `precision`: the run's
// describe_precision; a profile without one (written before the field) is not checked for it.
void check_profile_fits(const Profile& p, const ModelConfig& m, const LayoutConfig& l, const MicroBatchShape& mb,
                        const LayerProgram& prog, const std::string& precision);

}  // namespace dhelix
