// Layer-program helpers: segments, buffer lifetimes, cost totals.
#include "plan/Program.h"

#include <algorithm>
#include <set>

namespace dhelix {

const char* coll_op_name(CollOp c) {
  switch (c) {
    case CollOp::kNone: return "none";
    case CollOp::kAllReduce: return "all_reduce";
    case CollOp::kAllGather: return "all_gather";
    case CollOp::kReduceScatter: return "reduce_scatter";
    case CollOp::kAllToAll: return "all_to_all";
    case CollOp::kBroadcast: return "broadcast";
    case CollOp::kSendRecv: return "send_recv";
  }
  return "?";
}

const char* strand_name(StrandKind s) { return s == StrandKind::kForward ? "fwd" : "bwd"; }

std::vector<int> segment_ids(const std::vector<Op>& ops) {
  std::vector<int> seg(ops.size());
  int cur = -1;
  bool prev_compute = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    bool compute = !ops[i].is_collective();
    if (!compute || !prev_compute) ++cur;
    seg[i] = cur;
    prev_compute = compute;
  }
  return seg;
}

void annotate_lifetimes(LayerProgram& prog, const std::vector<std::string>& keep) {
  std::set<std::string> kept(keep.begin(), keep.end());
  // Walk forward then backward; remember the last op touching each buffer.
  std::vector<Op*> order;
  for (auto& op : prog.fwd) order.push_back(&op);
  for (auto& op : prog.bwd) order.push_back(&op);
  std::map<std::string, size_t> last;
  for (size_t i = 0; i < order.size(); ++i) {
    order[i]->frees.clear();
    for (auto& b : order[i]->inputs) last[b] = i;
    for (auto& b : order[i]->outputs) last[b] = i;
  }
  for (auto& [buf, i] : last)
    if (!kept.count(buf)) order[i]->frees.push_back(buf);
  for (auto* op : order) std::sort(op->frees.begin(), op->frees.end());
}

bool only_accumulates_grads(const Op& op) {
  return !op.is_collective() && op.outputs.empty() && !op.grads.empty();
}

OpCost total_cost(const std::vector<Op>& ops) {
  OpCost c;
  for (auto& op : ops) {
    c.flops += op.cost.flops;
    c.bytes += op.cost.bytes;
    c.comm_bytes += op.cost.comm_bytes;
  }
  return c;
}

}  // namespace dhelix
