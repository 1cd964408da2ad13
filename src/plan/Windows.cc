// Window enumeration and the block legality rule (one collective per process group).
#include "plan/Windows.h"

#include <fmt/format.h>

#include <algorithm>

namespace dhelix {

std::vector<int> segment_ends(const std::vector<Op>& ops) {
  std::vector<int> seg = segment_ids(ops);
  const int n = static_cast<int>(ops.size());
  std::vector<int> ends(n);
  for (int i = n - 1; i >= 0; --i)
    ends[i] = (i + 1 < n && seg[i + 1] == seg[i]) ? ends[i + 1] : i + 1;
  return ends;
}

std::vector<Window> strand_windows(const std::vector<Op>& ops, WindowRule rule, int max_len) {
  const int n = static_cast<int>(ops.size());
  std::vector<int> ends = segment_ends(ops);
  std::vector<Window> out;
  for (int a = 0; a < n; ++a) {
    int last = rule == WindowRule::kWithinSegments ? ends[a] : n;
    if (max_len > 0) last = std::min(last, a + max_len);
    for (int b = a + 1; b <= last; ++b) out.push_back({a, b});
  }
  return out;
}

std::vector<std::string> window_groups(const std::vector<Op>& ops, Window w) {
  std::vector<std::string> groups;
  for (int i = w.begin; i < w.end; ++i)
    if (ops[i].is_collective()) groups.push_back(ops[i].group);
  return groups;
}

bool block_groups_legal(const LayerProgram& prog, Window f, Window b) {
  std::vector<std::string> g = window_groups(prog.fwd, f);
  std::vector<std::string> gb = window_groups(prog.bwd, b);
  g.insert(g.end(), gb.begin(), gb.end());
  std::sort(g.begin(), g.end());
  return std::adjacent_find(g.begin(), g.end()) == g.end();
}

std::string window_label(const std::vector<Op>& ops, Window w) {
  std::string s = fmt::format("[{},{})", w.begin, w.end);
  for (int i = w.begin; i < w.end && i < static_cast<int>(ops.size()); ++i)
    if (i >= 0) s += " " + ops[i].name;
  return s;
}

}  // namespace dhelix

namespace dhelix {

std::vector<std::pair<Window, Window>> legal_pairs(const LayerProgram& prog, WindowRule rule,
                                                   int max_len) {
  std::vector<std::pair<Window, Window>> out;
  std::vector<Window> fw = strand_windows(prog.fwd, rule, max_len);
  std::vector<Window> bw = strand_windows(prog.bwd, rule, max_len);
  for (const Window& f : fw)
    for (const Window& b : bw)
      if (block_groups_legal(prog, f, b)) out.emplace_back(f, b);
  return out;
}

}  // namespace dhelix
