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

std::vector<std::vector<std::string>> bf16_saved_buffers(const LayerProgram& prog) {
  std::map<std::string, int> last_fwd;  // buffer -> last forward op touching it
  for (size_t i = 0; i < prog.fwd.size(); ++i) {
    for (const auto& b : prog.fwd[i].inputs) last_fwd[b] = static_cast<int>(i);
    for (const auto& b : prog.fwd[i].outputs) last_fwd[b] = static_cast<int>(i);
  }
  std::map<std::string, bool> only_wgrad_x;  // read by the backward; only as a wgrad GEMM's x so far
  for (const Op& op : prog.bwd) {
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      const bool x_of_wgrad = !op.is_collective() && op.code == "linear_wgrad" && k == 1;
      auto [it, fresh] = only_wgrad_x.try_emplace(op.inputs[k], x_of_wgrad);
      if (!fresh) it->second = it->second && x_of_wgrad;
    }
    for (const auto& b : op.outputs) only_wgrad_x[b] = false;  // written again in the backward
  }
  std::vector<std::vector<std::string>> out(prog.fwd.size());
  for (const auto& [buf, ok] : only_wgrad_x)
    if (ok && last_fwd.count(buf)) out[static_cast<size_t>(last_fwd[buf])].push_back(buf);
  return out;
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
