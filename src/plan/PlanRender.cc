// Text rendering of an SI plan:
//   SI plan 'block' (source search): 9 blocks, predicted 1.234 ms
//    #  | forward ops        | backward ops       | collectives                  | time
//    0  | ln_attn            |                    | bwd tp all_gather tp.ag.bwd  | 12.0 us
#include "plan/PlanRender.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace dhelix {

std::string format_seconds(double s) {
  if (!std::isfinite(s)) return "-";
  double a = std::fabs(s);
  if (a >= 1) return fmt::format("{:.3f} s", s);
  if (a >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

namespace {

void describe_window(const std::vector<Op>& ops, int a, int b, const char* sname,
                     std::string& compute, std::string& colls) {
  for (int i = std::max(a, 0); i < b && i < static_cast<int>(ops.size()); ++i) {
    const Op& op = ops[i];
    if (op.is_collective()) {
      if (!colls.empty()) colls += ", ";
      colls += fmt::format("{} {} {} {}", sname, op.group, coll_op_name(op.coll), op.name);
    } else {
      if (!compute.empty()) compute += " ";
      compute += op.name;
    }
  }
}

}  // namespace

std::string render_plan(const SIPlan& plan, const LayerProgram& prog, const BlockCost* cost) {
  struct Row {
    std::string idx, fwd, bwd, colls, time;
  };
  std::vector<Row> rows;
  rows.push_back({"#", "forward ops", "backward ops", "collectives", "time"});
  for (size_t k = 0; k < plan.blocks.size(); ++k) {
    const Block& b = plan.blocks[k];
    Row r;
    r.idx = std::to_string(k);
    describe_window(prog.fwd, b.fwd_begin, b.fwd_end, "fwd", r.fwd, r.colls);
    describe_window(prog.bwd, b.bwd_begin, b.bwd_end, "bwd", r.bwd, r.colls);
    if (cost) r.time = format_seconds(cost->block(b));
    rows.push_back(r);
  }
  size_t w0 = 0, w1 = 0, w2 = 0, w3 = 0;
  for (const Row& r : rows) {
    w0 = std::max(w0, r.idx.size());
    w1 = std::max(w1, r.fwd.size());
    w2 = std::max(w2, r.bwd.size());
    w3 = std::max(w3, r.colls.size());
  }
  std::string out = fmt::format("SI plan '{}' (source {}): {} blocks, predicted {}", plan.pair,
                                plan.source.empty() ? "?" : plan.source, plan.blocks.size(),
                                plan.predicted_s > 0 ? format_seconds(plan.predicted_s) : "-");
  if (cost) out += fmt::format(", cost model total {}", format_seconds(cost->plan(plan)));
  out += "\n";
  for (const Row& r : rows) {
    std::string line = fmt::format(" {:<{}} | {:<{}} | {:<{}} | {:<{}}", r.idx, w0, r.fwd, w1,
                                   r.bwd, w2, r.colls, w3);
    if (cost) line += " | " + r.time;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  if (plan.carry > 0) {
    std::string names;
    for (size_t i = prog.bwd.size() - static_cast<size_t>(plan.carry); i < prog.bwd.size(); ++i)
      names += (names.empty() ? "" : " ") + prog.bwd[i].name;
    out += fmt::format(" carry: bwd {} runs in the next pair, after its first collective is issued\n", names);
  }
  return out;
}

}  // namespace dhelix
