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
  // Walk forward then backward; a buffer's life ends at the last op touching it before an op that
  // writes it without reading it, or at the last op touching it at all.
  std::vector<Op*> order;
  for (auto& op : prog.fwd) order.push_back(&op);
  for (auto& op : prog.bwd) order.push_back(&op);
  std::map<std::string, size_t> last;
  for (size_t i = 0; i < order.size(); ++i) {
    Op& op = *order[i];
    op.frees.clear();
    for (auto& b : op.outputs) {
      const bool reads = std::find(op.inputs.begin(), op.inputs.end(), b) != op.inputs.end();
      auto it = last.find(b);
      if (!reads && it != last.end()) {  // written again: the earlier value died at its last use
        if (!kept.count(b)) order[it->second]->frees.push_back(b);
        last.erase(it);
      }
    }
    for (auto& b : op.inputs) last[b] = i;
    for (auto& b : op.outputs) last[b] = i;
  }
  for (auto& [buf, i] : last)
    if (!kept.count(buf)) order[i]->frees.push_back(buf);
  for (auto* op : order) {
    std::sort(op->frees.begin(), op->frees.end());
    op->frees.erase(std::unique(op->frees.begin(), op->frees.end()), op->frees.end());
  }
}

int add_recompute(LayerProgram& prog, const std::vector<bool>& recomputable_in) {
  const size_t n = prog.fwd.size();
  // An op marked "kept" (a weight block gathered for the backward to read: LayoutConfig::keep_gathered)
  // is never made again: its output stays saved from the forward.
  std::vector<bool> recomputable(n);
  for (size_t i = 0; i < n; ++i) recomputable[i] = recomputable_in.at(i) && !prog.fwd[i].flag("kept");
  std::set<std::string> remade;  // buffers a recomputable op writes
  for (size_t i = 0; i < n; ++i)
    if (recomputable.at(i)) remade.insert(prog.fwd[i].outputs.begin(), prog.fwd[i].outputs.end());
  std::set<std::string> needed;  // of those, the ones the backward (or a copied op) reads
  for (const std::string& b : saved_for_backward(prog))
    if (remade.count(b)) needed.insert(b);
  std::vector<bool> take(n, false);
  for (size_t i = n; i-- > 0;) {
    const Op& op = prog.fwd[i];
    if (!recomputable[i] || op.attrs.count("prefetch_unit")) continue;
    if (std::none_of(op.outputs.begin(), op.outputs.end(), [&](const std::string& b) { return needed.count(b) > 0; }))
      continue;
    take[i] = true;
    for (const std::string& b : op.inputs)
      if (remade.count(b)) needed.insert(b);
  }
  std::vector<Op> front;
  for (size_t i = 0; i < n; ++i) {
    if (!take[i]) continue;
    Op c = prog.fwd[i];
    c.name += ".recompute";
    c.attrs["recompute"] = 1;
    c.frees.clear();
    front.push_back(std::move(c));
  }
  const int copied = static_cast<int>(front.size());
  prog.bwd.insert(prog.bwd.begin(), std::make_move_iterator(front.begin()), std::make_move_iterator(front.end()));
  return copied;
}

std::vector<std::string> saved_for_backward(const LayerProgram& prog) {
  std::set<std::string> fwd_bufs, written, saved;
  for (const Op& op : prog.fwd) {
    fwd_bufs.insert(op.inputs.begin(), op.inputs.end());
    fwd_bufs.insert(op.outputs.begin(), op.outputs.end());
  }
  for (const Op& op : prog.bwd) {
    for (const std::string& b : op.inputs)
      if (fwd_bufs.count(b) && !written.count(b)) saved.insert(b);
    written.insert(op.outputs.begin(), op.outputs.end());
  }
  return {saved.begin(), saved.end()};
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
