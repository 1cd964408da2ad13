// Default (one collective beside the other strand's next compute segment) and sequential plans.
#include "schedule/BasicPlans.h"

#include <algorithm>
#include <cmath>

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

namespace {

double flops_of(const std::vector<Op>& ops, int a, int b) {
  double f = 0;
  for (int i = a; i < b; ++i) f += ops[i].cost.flops;
  return f;
}

// One strand being walked: its ops, segment ends and the "small compute" threshold.
struct Walk {
  const std::vector<Op>& ops;
  std::vector<int> ends;
  double small = 0;  // compute segments below this many FLOPs cannot hide a collective
  int next = 0;

  explicit Walk(const std::vector<Op>& o) : ops(o), ends(segment_ends(o)) {
    double biggest = 0;
    for (int i = 0; i < size(); i = ends[i])
      if (!ops[i].is_collective()) biggest = std::max(biggest, flops_of(ops, i, ends[i]));
    small = 0.1 * biggest;
  }
  int size() const { return static_cast<int>(ops.size()); }
  bool done() const { return next >= size(); }
  bool at_collective() const { return ops[next].is_collective(); }
  int seg_end() const { return ends[next]; }
  // The compute run starting at `next` is followed by a collective.
  bool leads_to_collective() const { return seg_end() < size(); }
  // Collectives from the one at `next` on, up to the first big compute segment or the end; with
  // `to_end` (the other strand's compute that must cover them is its last), every one to the end.
  int collectives_to_cover(bool to_end = false) const {
    int n = 0;
    for (int i = next; i < size();) {
      if (to_end) {
        n += ops[i].is_collective() ? 1 : 0;
        i = ops[i].is_collective() ? i + 1 : ends[i];
        continue;
      }
      if (ops[i].is_collective()) {
        ++n, ++i;
      } else {
        if (flops_of(ops, i, ends[i]) >= small) break;
        i = ends[i];
      }
    }
    return n;
  }
  // The prefix of the compute run at `next` whose FLOPs come closest to 1/n of the run's (>= 1
  // op; ties: the shorter), so n collectives in a row share the run about evenly.
  int cover_end(int n) const {
    const int e = seg_end();
    const double want = flops_of(ops, next, e) / std::max(n, 1);
    int best = next + 1;
    for (int k = next + 1; k <= e; ++k)
      if (std::abs(flops_of(ops, next, k) - want) < std::abs(flops_of(ops, next, best) - want)) best = k;
    return best;
  }
};

}  // namespace

namespace {

// True when op `i` reads a buffer written by op `c`.
bool reads_output_of(const std::vector<Op>& ops, int i, int c) {
  for (const auto& in : ops[i].inputs)
    for (const auto& out : ops[c].outputs)
      if (in == out) return true;
  return false;
}

// A window that ends with a collective gets the strand's following compute ops that do not read
// the collective's output (e.g. the weight-gradient GEMM after an input-gradient reduce-scatter),
// taken from the start of the strand's next window: they run in the same block, so the collective
// hides under them too instead of the block's barrier waiting for it alone. Only where the block
// holds little compute of the other strand (below `other_small` FLOPs): where it holds more, that
// compute already covers the collective, and the ops taken would leave the next window — and
// whatever collective of the other strand it was chosen to cover — short.
void extend_tails(std::vector<Block>& blocks, const std::vector<Op>& ops, int Block::*begin, int Block::*end,
                  const std::vector<Op>& other_ops, int Block::*other_begin, int Block::*other_end,
                  double other_small) {
  for (size_t k = 0; k < blocks.size(); ++k) {
    Block& b = blocks[k];
    if (b.*end <= b.*begin || !ops[b.*end - 1].is_collective()) continue;
    if (flops_of(other_ops, b.*other_begin, b.*other_end) >= other_small) continue;
    const int c = b.*end - 1;
    size_t n = k + 1;
    while (n < blocks.size() && blocks[n].*end <= blocks[n].*begin) ++n;  // this strand's next window
    if (n == blocks.size()) continue;
    Block& next = blocks[n];
    while (next.*begin < next.*end && !ops[next.*begin].is_collective() && !reads_output_of(ops, next.*begin, c)) {
      ++(next.*begin);
      ++(b.*end);
    }
  }
  blocks.erase(std::remove_if(blocks.begin(), blocks.end(), [](const Block& b) { return !b.has_fwd() && !b.has_bwd(); }),
               blocks.end());
}

}  // namespace

void extend_over_independent_tails(SIPlan& plan, const LayerProgram& prog) {
  const double fwd_small = Walk(prog.fwd).small, bwd_small = Walk(prog.bwd).small;
  extend_tails(plan.blocks, prog.fwd, &Block::fwd_begin, &Block::fwd_end, prog.bwd, &Block::bwd_begin,
               &Block::bwd_end, bwd_small);
  extend_tails(plan.blocks, prog.bwd, &Block::bwd_begin, &Block::bwd_end, prog.fwd, &Block::fwd_begin,
               &Block::fwd_end, fwd_small);
}

SIPlan cover_plan(const LayerProgram& prog) {
  SIPlan plan;
  plan.pair = prog.name;
  plan.source = "cover";
  Walk f(prog.fwd), b(prog.bwd);
  auto emit = [&](int fe, int be) {
    plan.blocks.push_back({f.next, fe, b.next, be});
    f.next = fe;
    b.next = be;
  };
  auto one = [](const Walk& w) { return w.at_collective() ? w.next + 1 : w.seg_end(); };
  while (!f.done() || !b.done()) {
    if (b.done()) {
      emit(one(f), b.next);
    } else if (f.done()) {
      emit(f.next, one(b));
    } else if (f.at_collective() && b.at_collective()) {
      emit(f.next + 1, b.next);
    } else if (f.at_collective()) {  // fwd collective over a share of the bwd compute
      emit(f.next + 1, b.cover_end(f.collectives_to_cover(!b.leads_to_collective())));
    } else if (b.at_collective()) {
      // The forward's last compute is the only cover left for all the backward's remaining
      // collectives (context parallelism's ring has several after the forward's one).
      emit(f.cover_end(b.collectives_to_cover(!f.leads_to_collective())), b.next + 1);
    } else {  // both compute
      const bool fl = f.leads_to_collective(), bl = b.leads_to_collective();
      if (fl && bl) {
        if (flops_of(f.ops, f.next, f.seg_end()) < flops_of(b.ops, b.next, b.seg_end()))
          emit(f.seg_end(), b.next);
        else
          emit(f.next, b.seg_end());
      } else if (fl) {
        emit(f.seg_end(), b.next);
      } else if (bl) {
        emit(f.next, b.seg_end());
      } else {
        emit(f.seg_end(), b.seg_end());
      }
    }
  }
  extend_over_independent_tails(plan, prog);
  carry_trailing_wgrads(plan, prog);
  return plan;
}

void carry_trailing_wgrads(SIPlan& plan, const LayerProgram& prog) {
  const std::vector<Op>& bwd = prog.bwd;
  const int n = static_cast<int>(bwd.size());
  int c = 0;
  while (c < n && only_accumulates_grads(bwd[n - 1 - c])) ++c;
  plan.carry = 0;
  if (c == 0) return;
  const Walk fw(prog.fwd), bw(prog.bwd);
  for (const Block& b : plan.blocks) {
    const bool fc = !window_groups(prog.fwd, {b.fwd_begin, b.fwd_end}).empty();
    const bool bc = !window_groups(bwd, {b.bwd_begin, b.bwd_end}).empty();
    if (!fc && !bc) continue;
    // The pair's first collective: carry when the other strand gives it only small compute.
    const double beside = fc ? flops_of(bwd, b.bwd_begin, b.bwd_end) : flops_of(prog.fwd, b.fwd_begin, b.fwd_end);
    if (beside < (fc ? bw.small : fw.small)) plan.carry = c;
    return;
  }
}

SIPlan sequential_plan(const LayerProgram& prog) {
  SIPlan plan;
  plan.pair = prog.name;
  plan.source = "sequential";
  for (const Segment& s : segments_of(prog.fwd)) plan.blocks.push_back(fwd_block(s));
  for (const Segment& s : segments_of(prog.bwd)) plan.blocks.push_back(bwd_block(s));
  return plan;
}

SIPlan pair_default_plan(const std::vector<Op>& fwd, const std::vector<Op>& bwd) {
  bool any_coll = std::any_of(fwd.begin(), fwd.end(), [](const Op& o) { return o.is_collective(); }) ||
                  std::any_of(bwd.begin(), bwd.end(), [](const Op& o) { return o.is_collective(); });
  LayerProgram p;
  p.name = "pair";
  p.fwd = fwd;
  p.bwd = bwd;
  if (any_coll) return cover_plan(p);
  SIPlan plan;
  plan.pair = "pair";
  plan.source = "default";
  Block b;
  b.bwd_end = static_cast<int>(bwd.size());
  if (b.has_bwd()) plan.blocks.push_back(b);
  Block f;
  f.fwd_end = static_cast<int>(fwd.size());
  if (f.has_fwd()) plan.blocks.push_back(f);
  return plan;
}

}  // namespace dhelix
