// The op and cost helpers of sharding/OpFactory.h: plain constructors and the cost formulas; no
// op knows here which lowering or region it belongs to.
#include "sharding/OpFactory.h"

namespace dhelix::sharding {

Op compute_op(std::string name, std::string code, std::vector<std::string> in, std::vector<std::string> out,
              std::vector<std::string> params, std::vector<std::string> grads) {
  Op op;
  op.name = std::move(name);
  op.code = std::move(code);
  op.inputs = std::move(in);
  op.outputs = std::move(out);
  op.params = std::move(params);
  op.grads = std::move(grads);
  return op;
}

Op collective_op(std::string name, CollOp c, std::string group, std::vector<std::string> in, std::string out,
                 double bytes, CollWait wait) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::kCollective;
  op.coll = c;
  op.group = std::move(group);
  op.code = coll_op_name(c);
  op.inputs = std::move(in);
  op.outputs = {std::move(out)};
  op.cost.comm_bytes = bytes;
  op.cost.bytes = bytes;
  if (wait == CollWait::kBlocking) op.attrs["blocking"] = 1;
  if (wait == CollWait::kBackground) op.attrs["background"] = 1;
  return op;
}

void gemm_cost(Op& op, double rows, double in, double out) {
  op.cost.flops = 2 * rows * in * out;
  op.cost.bytes = kF * (rows * in + in * out + rows * out);
  op.attrs["gemm_rows"] = int64_t(rows), op.attrs["gemm_in"] = int64_t(in), op.attrs["gemm_out"] = int64_t(out);
}

void elem_cost(Op& op, double elems, double flops_per, double passes) {
  op.cost.flops = elems * flops_per;
  op.cost.bytes = kF * elems * passes;
}

}  // namespace dhelix::sharding
