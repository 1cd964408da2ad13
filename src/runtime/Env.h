// The runtime state of one micro-batch inside one unit (embed, a block, head): named buffers
// written by forward ops and consumed (then released at last use) by backward ops, plus the
// collectives in flight whose outputs are not yet safe to read.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "comm/Work.h"
#include "tensor/Tensor.h"

namespace dhelix {

class Event;  // runtime/Stream.h

struct PendingColl {
  Work work;
  std::string group;
  std::string name;   // op name, for the trace
  double issue_s = 0;
  // An activation collective in bf16 (RunContext::activation_wire): the rounded input it sends
  // (kept alive until it completes), the bf16 result it receives, and the fp32 buffer the result is
  // widened into when the collective is waited for (undefined tensors otherwise).
  Tensor wire_in, wire_out, widen_to;
};

// bf16 copies of the weights for one training step (GEMM precision bf16): each weight is rounded the
// first time a GEMM of the step multiplies it and the copy serves every later forward and
// input-gradient GEMM of the step, instead of rounding it again in each (2 x micro-batches times).
// The weights do not change inside a step; StepRunner makes one per step and drops it at the end.
// The copies are charged to `tracker` (the model and optimizer states: they are the 16-bit weights
// of mixed precision beside the fp32 masters). Thread-safe.
class Bf16Weights {
 public:
  explicit Bf16Weights(MemoryTracker* tracker) : tracker_(tracker) {}
  // The bf16 rounding of w (fp32, contiguous), made on first use.
  const uint16_t* get(const Tensor& w);

 private:
  MemoryTracker* tracker_;
  std::mutex mu_;
  std::map<const void*, Tensor> copies_;  // keyed by the weight's data
};

// A host copy of a small device buffer the host must read: the MoE routing's counts (the grouped
// GEMMs' row counts, the all-to-all's split sizes) and statistics (the aux loss). Made once per
// buffer and micro-batch and read by every later op that needs it, instead of a copy, and a wait
// for the stream to reach it, in each: with both strands issued by one thread, every such wait
// stopped the other strand's issue too. `ready`, where set, completes once the copy has landed (a
// copy started right behind the kernels that wrote the buffer, as moe_route's); unset: landed.
struct HostMirror {
  Tensor host;
  std::shared_ptr<Event> ready;  // (a GPU's holds `host` too until the copy has run: HostCopies.cc's CopyLanded)
};

struct UnitEnv {
  std::map<std::string, Tensor> bufs;
  // Host copies of device buffers, keyed by the buffer's name; dropped (drop_mirror) when the
  // buffer is written again (OpCall::out_new, a collective's output) or freed -- without waiting
  // for a copy still under way (its event keeps the host memory until it has run).
  std::map<std::string, HostMirror> mirrors;
  std::map<std::string, PendingColl> pending;  // keyed by the collective's output buffer
  // Outputs of last_micro_batch collectives this (earlier) micro-batch did not run; the ops that
  // read them are skipped (RunContext::micro_batches).
  std::set<std::string> deferred;

  Tensor& at(const std::string& name);
  bool has(const std::string& name) const { return bufs.count(name) > 0; }
  // Buffer `name` readable by the host: the buffer itself when it lives there, else its mirror
  // (waited for), made first, when there is none, by a copy ordered on `stream` (the reading op's:
  // it is ordered after the buffer's writer) that returns once done.
  const Tensor& host_view(const std::string& name, StreamHandle stream);
  void drop_mirror(const std::string& name);
};

}  // namespace dhelix
