// Default (one collective beside the other strand's next compute segment) and sequential plans.
#include "schedule/BasicPlans.h"

#include "plan/Windows.h"

namespace dhelix {

namespace {

struct Segment {
  int begin, end;
  bool collective;
};

std::vector<Segment> segments_of(const std::vector<Op>& ops) {
  std::vector<int> ends = segment_ends(ops);
  std::vector<Segment> segs;
  for (int i = 0; i < static_cast<int>(ops.size()); i = ends[i])
    segs.push_back({i, ends[i], ops[i].is_collective()});
  return segs;
}

Block fwd_block(const Segment& s) { return {s.begin, s.end, 0, 0}; }
Block bwd_block(const Segment& s) { return {0, 0, s.begin, s.end}; }

}  // namespace

SIPlan default_plan(const LayerProgram& prog) {
  SIPlan plan;
  plan.pair = prog.name;
  plan.source = "default";
  std::vector<Segment> fs = segments_of(prog.fwd), bs = segments_of(prog.bwd);
  size_t i = 0, j = 0;
  while (i < fs.size() && j < bs.size()) {
    const Segment& f = fs[i];
    const Segment& b = bs[j];
    if (f.collective != b.collective) {  // one collective beside the other strand's compute
      plan.blocks.push_back({f.begin, f.end, b.begin, b.end});
      ++i, ++j;
    } else {  // both compute or both collective: the forward segment goes alone
      plan.blocks.push_back(fwd_block(f));
      ++i;
    }
  }
  for (; i < fs.size(); ++i) plan.blocks.push_back(fwd_block(fs[i]));
  for (; j < bs.size(); ++j) plan.blocks.push_back(bwd_block(bs[j]));
  return plan;
}

SIPlan sequential_plan(const LayerProgram& prog) {
  SIPlan plan;
  plan.pair = prog.name;
  plan.source = "sequential";
  for (const Segment& s : segments_of(prog.fwd)) plan.blocks.push_back(fwd_block(s));
  for (const Segment& s : segments_of(prog.bwd)) plan.blocks.push_back(bwd_block(s));
  return plan;
}

}  // namespace dhelix
