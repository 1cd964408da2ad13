// fuse_epilogues (Epilogues.h): each pair found by its GEMM, checked, replaced by one op.
#include "sharding/Epilogues.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#include "sharding/OpFactory.h"

namespace dhelix {

namespace {

bool reads(const Op& op, const std::string& b) {
  return std::find(op.inputs.begin(), op.inputs.end(), b) != op.inputs.end();
}
bool writes(const Op& op, const std::string& b) {
  return std::find(op.outputs.begin(), op.outputs.end(), b) != op.outputs.end();
}

// Whether the pair (first, second) may drop buffer b: over the whole program (forward, then
// backward), b's writes and reads alternate -- each write read by exactly one op before the next
// write, no read without a write -- and first and second are one such write and read. (A recompute
// copy writes b again: its own pair, fused like the forward's.)
bool only_link(const LayerProgram& p, const Op* first, const Op* second, const std::string& b) {
  const Op* pending = nullptr;  // the last write not yet read
  bool read_since_write = true, ours = false;
  for (const auto* list : {&p.fwd, &p.bwd})
    for (const Op& op : *list) {
      const bool r = reads(op, b), w = writes(op, b);
      if (r && w) return false;
      if (r) {
        if (pending == nullptr || read_since_write) return false;
        read_since_write = true;
        ours = ours || (pending == first && &op == second);
      }
      if (w) {
        if (!read_since_write) return false;  // a value nothing read
        pending = &op;
        read_since_write = false;
      }
    }
  return ours && read_since_write;
}

// A GEMM op that may take an epilogue: a plain compute op writing one buffer and no gradient
// (weight-gradient GEMMs and the vocabulary head's linear are never fused).
bool plain_gemm(const Op& op, const char* code) {
  return op.code == code && !op.is_collective() && op.outputs.size() == 1 && op.grads.empty() &&
         !op.attrs.count("vocab_rows");
}

// Elements of the GEMM's output (gemm_rows x gemm_out; OpFactory's gemm_cost), 0 when unpriced.
double gemm_out_elems(const Op& op) {
  auto r = op.attrs.find("gemm_rows"), o = op.attrs.find("gemm_out");
  return r == op.attrs.end() || o == op.attrs.end() ? 0.0 : double(r->second) * double(o->second);
}

// The fused op of ops[i] and ops[j] (i < j), whose connecting buffer is `link`: ops[j] moves up to
// ops[i]'s place, so nothing between them may read or write what ops[j] writes, or write what it
// reads. `dropped`: the link is never made, so no op but these two may touch it.
bool movable(const LayerProgram& p, const std::vector<Op>& ops, size_t i, size_t j, const std::string& link,
             bool dropped) {
  const Op& second = ops[j];
  for (size_t k = i + 1; k < j; ++k) {
    for (const std::string& b : second.outputs)
      if (reads(ops[k], b) || writes(ops[k], b)) return false;
    for (const std::string& b : second.inputs)
      if (writes(ops[k], b)) return false;
  }
  return !dropped || only_link(p, &ops[i], &second, link);
}

// The first op after i that reads `b`, if any.
std::optional<size_t> next_reader(const std::vector<Op>& ops, size_t i, const std::string& b) {
  for (size_t j = i + 1; j < ops.size(); ++j)
    if (reads(ops[j], b)) return j;
  return std::nullopt;
}

// What pair starting at ops[i] fuses, as the fused op and the index of its second op.
std::optional<std::pair<Op, size_t>> fused_at(const LayerProgram& p, const std::vector<Op>& ops, size_t i,
                                              EpilogueFusions& n) {
  const Op& first = ops[i];
  const bool fwd_gemm = plain_gemm(first, "linear"), dgrad = plain_gemm(first, "linear_dgrad");
  if (!fwd_gemm && !dgrad) return std::nullopt;
  const std::string& link = first.outputs[0];
  const std::optional<size_t> at = next_reader(ops, i, link);
  if (!at) return std::nullopt;
  const size_t j = *at;
  const Op& second = ops[j];
  const double elems = gemm_out_elems(first);
  // The GEMM's FLOPs only (the epilogue's few per element run inside it; a pricer counts a grouped
  // GEMM's parts as flops over one part's, CostModel.cc's gemm_groups), its bytes less the link's
  // traffic the fusion saves.
  Op f = first;
  if (fwd_gemm && second.code == "gelu" && second.inputs == std::vector<std::string>{link} &&
      second.outputs.size() == 1 && movable(p, ops, i, j, link, false)) {
    // act and pre both written (pre: cuBLASLt's GELU_AUX output); pre's read is saved.
    f.code = "linear_gelu";
    f.outputs = {second.outputs[0], link};
    f.cost.bytes = first.cost.bytes + second.cost.bytes - sharding::kF * elems;
    ++n.gelu;
    return std::make_pair(std::move(f), j);
  }
  if (dgrad && second.code == "gelu_bwd" && second.inputs.size() == 2 && second.inputs[0] == link &&
      second.inputs[1] != link && second.outputs.size() == 1 && movable(p, ops, i, j, link, true)) {
    f.code = "linear_dgrad_gelu";
    f.inputs = {first.inputs[0], second.inputs[1]};
    f.outputs = second.outputs;
    f.cost.bytes = first.cost.bytes + second.cost.bytes - 2 * sharding::kF * elems;  // da written and read
    ++n.dgelu;
    return std::make_pair(std::move(f), j);
  }
  if (fwd_gemm && first.params.size() == 1 && second.code == "residual_add" && second.inputs.size() == 2 &&
      second.inputs[1] == link && second.inputs[0] != link && second.outputs.size() == 1 &&
      movable(p, ops, i, j, link, true)) {
    f.code = "linear_residual";
    f.inputs = {first.inputs[0], second.inputs[0]};
    f.outputs = second.outputs;
    f.params.insert(f.params.end(), second.params.begin(), second.params.end());
    f.cost.bytes = first.cost.bytes + second.cost.bytes - 2 * sharding::kF * elems;  // the branch's
    ++n.residual;
    return std::make_pair(std::move(f), j);
  }
  return std::nullopt;
}

EpilogueFusions fuse_list(LayerProgram& p, std::vector<Op>& ops) {
  EpilogueFusions n;
  for (size_t i = 0; i < ops.size(); ++i) {
    auto fused = fused_at(p, ops, i, n);
    if (!fused) continue;
    ops[i] = std::move(fused->first);
    ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(fused->second));
  }
  return n;
}

}  // namespace

EpilogueFusions fuse_epilogues(LayerProgram& prog) {
  EpilogueFusions n = fuse_list(prog, prog.fwd);
  n += fuse_list(prog, prog.bwd);
  return n;
}

EpilogueFusions fuse_epilogues(ModelPrograms& progs) {
  EpilogueFusions n;
  for (LayerProgram* p : progs.all())
    if (!p->fwd.empty()) n += fuse_epilogues(*p);
  progs.fusions = n;
  return n;
}

}  // namespace dhelix
