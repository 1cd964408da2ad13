// The layer program: a model layer written once as an ordered list of operators for the
// forward strand and one for the backward strand. Four consumers read it: the executor runs
// it, the profiler times windows of it, the planner pairs windows of the two strands, and the
// simulator prices it. Pure data: nothing here runs anything.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dhelix {

enum class OpKind { kCompute, kCollective };

enum class CollOp { kNone, kAllReduce, kAllGather, kReduceScatter, kAllToAll, kBroadcast, kSendRecv };

enum class StrandKind { kForward, kBackward };

const char* coll_op_name(CollOp c);
const char* strand_name(StrandKind s);

// Cost terms used by the simulator, the analytical planner and MFU accounting.
struct OpCost {
  double flops = 0;       // floating-point operations (multiply-add = 2)
  double bytes = 0;       // bytes read + written from memory by a compute op
  double comm_bytes = 0;  // bytes each rank sends for a collective (per-rank buffer size)
};

struct Op {
  std::string name;   // unique within its strand program: "attn.qkv", "attn.qkv.dgrad", "tp.ag.attn"
  std::string code;   // the executor's binding: "linear", "linear_dgrad", "all_gather_seq", ...
  OpKind kind = OpKind::kCompute;
  CollOp coll = CollOp::kNone;
  std::string group;  // process-group role of a collective: "tp", "dp", "cp", "ep" ("" for compute)
  std::vector<std::string> inputs;   // buffer names read (strand environment of this layer)
  std::vector<std::string> outputs;  // buffer names written
  std::vector<std::string> params;   // parameter names of the layer read
  std::vector<std::string> grads;    // parameter names whose gradient this op accumulates into
  std::vector<std::string> frees;    // buffers released after this op (their last use)
  std::map<std::string, int64_t> attrs;  // small integer attributes (extents, flags)
  OpCost cost;

  bool is_collective() const { return kind == OpKind::kCollective; }
  // A 0/1 attribute ("blocking", "background", "last_micro_batch"): set and non-zero.
  bool flag(const std::string& key) const {
    auto it = attrs.find(key);
    return it != attrs.end() && it->second != 0;
  }
};

// One layer: forward ops, then backward ops. Buffers named in `boundary_in/out` cross layers:
// forward reads "x" and writes "y"; backward reads "dy" and writes "dx".
struct LayerProgram {
  std::string name;  // "block", "embed", "head"
  std::vector<Op> fwd;
  std::vector<Op> bwd;
};

// Segment index of every op: collectives are their own segments; maximal runs of compute ops
// between collectives form the others. Windows used by the planner never cross a segment.
std::vector<int> segment_ids(const std::vector<Op>& ops);

// Sets each op's `frees` to the buffers whose last use (forward then backward order) it is: the
// last op touching the buffer, or the last before an op that writes it without reading it (a
// recompute op: the value dies there and is made again). Buffers in `keep` (layer outputs,
// parameters) are never freed.
void annotate_lifetimes(LayerProgram& prog, const std::vector<std::string>& keep);

// Activation recomputation (layout/Layout.h Recompute): the forward ops i with recomputable[i]
// that write a buffer the backward reads -- directly, or through another such op -- are copied, in
// forward order, to the front of the backward, named "<name>.recompute" with attr "recompute" = 1
// (a cross-layer prefetch is never copied: its output is no recompute input; nor is an op with attr
// "kept", a weight block gathered for the backward, which stays saved). What they read and
// no recomputed op writes (the layer's input, a norm's output under selective) stays saved from the
// forward; what they write is made again, so annotate_lifetimes ends the forward's copy at its last
// forward use. Returns the number of ops copied.
int add_recompute(LayerProgram& prog, const std::vector<bool>& recomputable);

// The buffers the backward reads before any backward op writes them and the forward touched: what
// the forward must keep for the backward (the saved activations).
std::vector<std::string> saved_for_backward(const LayerProgram& prog);

// Activations the backward reads only as the input x of weight-gradient GEMMs (op code
// "linear_wgrad", inputs[1]), which in bf16 round x before multiplying: such a buffer may be kept
// in bf16 from its last forward use on at no change in any result. Per forward op (index into
// prog.fwd), the buffers whose last forward use it is; a buffer some other backward op reads (a
// norm's input, a collective) is never listed.
std::vector<std::vector<std::string>> bf16_saved_buffers(const LayerProgram& prog);

// Totals over a strand's ops.
OpCost total_cost(const std::vector<Op>& ops);

// A compute op that writes no buffer and accumulates parameter gradients (a weight-gradient
// GEMM): no later op can read what it does, so it may run late (SIPlan::carry).
bool only_accumulates_grads(const Op& op);

}  // namespace dhelix
