// The runtime state of one micro-batch inside one unit (embed, a block, head): named buffers
// written by forward ops and consumed (then released at last use) by backward ops, plus the
// collectives in flight whose outputs are not yet safe to read.
#pragma once
#include <map>
#include <set>
#include <string>

#include "comm/Work.h"
#include "tensor/Tensor.h"

namespace dhelix {

struct PendingColl {
  Work work;
  std::string group;
  std::string name;   // op name, for the trace
  double issue_s = 0;
};

struct UnitEnv {
  std::map<std::string, Tensor> bufs;
  std::map<std::string, PendingColl> pending;  // keyed by the collective's output buffer
  // Outputs of last_micro_batch collectives this (earlier) micro-batch did not run; the ops that
  // read them are skipped (RunContext::micro_batches).
  std::set<std::string> deferred;

  Tensor& at(const std::string& name);
  bool has(const std::string& name) const { return bufs.count(name) > 0; }
};

}  // namespace dhelix
