// IssueOrder: the block issue rule as a list of steps (see IssueOrder.h).
#include "plan/IssueOrder.h"

#include <algorithm>
#include <utility>

#include "base/Error.h"

namespace dhelix {

IssueOrder::IssueOrder(const PairStrands& s, const std::vector<Block>& blocks) {
  const int nb = s.bwd ? static_cast<int>(s.bwd->size()) : 0;
  DHX_CHECK(s.carry_out >= 0 && s.carry_out <= nb, ConfigError,
            "carry_out={} is outside [0, {}] (the backward strand's ops)", s.carry_out, nb);
  DHX_CHECK(s.carried_in >= 0, ConfigError, "carried_in={} is negative", s.carried_in);
  const int bwd_stop = nb - s.carry_out;
  bool carried_done = s.carried_in == 0;
  auto carried = [&](int block) {
    for (int i = 0; i < s.carried_in; ++i) steps_.push_back({IssueStep::Kind::kCarried, StrandKind::kBackward, i, block});
    carried_done = true;
  };
  for (int k = 0; k < static_cast<int>(blocks.size()); ++k) {
    const Block& blk = blocks[static_cast<size_t>(k)];
    struct Win {
      StrandKind kind;
      const std::vector<Op>* ops;
      int next, end;
      bool waits = false;
    };
    Win wins[2] = {{StrandKind::kForward, s.fwd, blk.fwd_begin, blk.fwd_end},
                   {StrandKind::kBackward, s.bwd, blk.bwd_begin, std::min(blk.bwd_end, bwd_stop)}};
    bool leading = false;
    // 1) Leading collectives, forward strand first.
    for (Win& w : wins) {
      if (w.end <= w.next) continue;
      DHX_CHECK(w.ops != nullptr, ConfigError, "plan block {} has {} ops but that strand is idle", k,
                strand_name(w.kind));
      DHX_CHECK(w.next >= 0 && w.end <= static_cast<int>(w.ops->size()), ConfigError,
                "plan block {}: {} window [{}, {}) is outside the strand's {} ops", k, strand_name(w.kind), w.next,
                w.end, w.ops->size());
      const int begin = w.next;
      for (; w.next < w.end && (*w.ops)[static_cast<size_t>(w.next)].is_collective(); ++w.next) {
        steps_.push_back({IssueStep::Kind::kOp, w.kind, w.next, k});
        leading = true;
      }
      for (int i = w.next; i < w.end; ++i) w.waits = w.waits || (*w.ops)[static_cast<size_t>(i)].is_collective();
      if (w.next > begin && w.next < w.end) w.waits = true;
    }
    // 2) Carried-in ops right after the first leading collective they can hide.
    if (!carried_done && leading) carried(k);
    // 3) The strand that does not wait first; ties: backward.
    Win* order[2] = {&wins[1], &wins[0]};
    if (wins[1].waits && !wins[0].waits) std::swap(order[0], order[1]);
    for (Win* w : order)
      for (; w->next < w->end; ++w->next) steps_.push_back({IssueStep::Kind::kOp, w->kind, w->next, k});
    // 4) The block completes.
    steps_.push_back({IssueStep::Kind::kBlockEnd, StrandKind::kForward, 0, k});
  }
  if (!carried_done) carried(static_cast<int>(blocks.size()));
}

}  // namespace dhelix
