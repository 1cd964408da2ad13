// k-best DP over (i, j) for the SI plan, and the brute-force oracle.
//
//   D[0][0] = {0}
//   D[i][j] = k-min over  D[a][j] + T_f(a,i)            for fwd windows [a,i)
//                         D[i][c] + T_b(c,j)            for bwd windows [c,j)
//                         D[a][c] + T_fb(a,i,c,j)       for legal pairs
// Each cell keeps its k cheapest (cost, predecessor cell, predecessor rank, block) entries;
// a path to (P, Q) is a plan, and distinct paths are distinct plans. Work O(P·Q·w²·k) for
// windows of at most w ops.
#include "schedule/PlanSearch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>

#include "base/Error.h"
#include "base/Signals.h"
#include "schedule/BasicPlans.h"

namespace dhelix {

namespace {

// Windows of one strand ending at each index, with their collective-group bitmask.
struct StrandWindows {
  std::vector<std::vector<int>> begins_ending_at;  // [end] -> begins a (window [a,end))
  std::vector<std::vector<uint64_t>> masks;        // same shape: groups of the window's colls
};

StrandWindows index_windows(const std::vector<Op>& ops, const SearchOptions& opts,
                            std::map<std::string, int>& group_bits) {
  StrandWindows sw;
  sw.begins_ending_at.resize(ops.size() + 1);
  sw.masks.resize(ops.size() + 1);
  for (const Window& w : strand_windows(ops, opts.windows, opts.max_window)) {
    uint64_t mask = 0;
    bool dup = false;
    for (int i = w.begin; i < w.end; ++i) {
      if (!ops[i].is_collective()) continue;
      auto [it, fresh] = group_bits.emplace(ops[i].group, static_cast<int>(group_bits.size()));
      DHX_CHECK(it->second < 64, PlanError, "more than 64 process-group roles");
      uint64_t bit = uint64_t{1} << it->second;
      dup |= (mask & bit) != 0;
      mask |= bit;
    }
    if (dup) continue;  // two collectives of one group in one window: never a legal block
    sw.begins_ending_at[w.end].push_back(w.begin);
    sw.masks[w.end].push_back(mask);
  }
  return sw;
}

struct Entry {
  double cost;
  int prev_cell;  // -1 at the origin
  int prev_rank;
  Block block;
};

}  // namespace

SearchResult search_plans(const LayerProgram& prog, const BlockCost& cost,
                          const SearchOptions& opts) {
  DHX_CHECK(opts.top_k >= 1, PlanError, "search top_k={} must be >= 1", opts.top_k);
  const int P = static_cast<int>(prog.fwd.size()), Q = static_cast<int>(prog.bwd.size());
  const size_t k = static_cast<size_t>(opts.top_k);
  std::map<std::string, int> bits;
  StrandWindows fw = index_windows(prog.fwd, opts, bits);
  StrandWindows bw = index_windows(prog.bwd, opts, bits);
  auto cell = [Q](int i, int j) { return i * (Q + 1) + j; };
  std::vector<std::vector<Entry>> D((P + 1) * (Q + 1));
  D[0].push_back({0.0, -1, -1, {}});
  SearchResult res;
  std::vector<Entry> cand;
  auto extend = [&](int from, const Block& b, double t) {
    if (!std::isfinite(t)) return;
    const auto& src = D[from];
    for (size_t r = 0; r < src.size(); ++r)
      cand.push_back({src[r].cost + t, from, static_cast<int>(r), b});
  };
  // Solo prices are reused by many cells: cache them per window.
  std::vector<std::vector<double>> tf(P + 1), tb(Q + 1);
  for (int i = 1; i <= P; ++i)
    for (int a : fw.begins_ending_at[i]) tf[i].push_back(cost.solo_fwd(a, i)), ++res.blocks_priced;
  for (int j = 1; j <= Q; ++j)
    for (int c : bw.begins_ending_at[j]) tb[j].push_back(cost.solo_bwd(c, j)), ++res.blocks_priced;
  for (int i = 0; i <= P; ++i) {
    if (stop_signal() != 0) stop_point(fmt::format("plan search ({} of {} forward ops; no plan written)", i, P));
    for (int j = 0; j <= Q; ++j) {
      if (i == 0 && j == 0) continue;
      cand.clear();
      // Order of generation breaks ties: fwd alone, bwd alone, then pairs (as §5.1).
      for (size_t x = 0; i > 0 && x < fw.begins_ending_at[i].size(); ++x) {
        int a = fw.begins_ending_at[i][x];
        extend(cell(a, j), Block{a, i, 0, 0}, tf[i][x]);
      }
      for (size_t y = 0; j > 0 && y < bw.begins_ending_at[j].size(); ++y) {
        int c = bw.begins_ending_at[j][y];
        extend(cell(i, c), Block{0, 0, c, j}, tb[j][y]);
      }
      for (size_t x = 0; i > 0 && j > 0 && x < fw.begins_ending_at[i].size(); ++x) {
        for (size_t y = 0; y < bw.begins_ending_at[j].size(); ++y) {
          if (fw.masks[i][x] & bw.masks[j][y]) continue;  // same group on both sides
          int a = fw.begins_ending_at[i][x], c = bw.begins_ending_at[j][y];
          if (D[cell(a, c)].empty()) continue;
          ++res.blocks_priced;
          extend(cell(a, c), Block{a, i, c, j}, cost.pair(a, i, c, j));
        }
      }
      size_t keep = std::min(k, cand.size());
      std::partial_sort(cand.begin(), cand.begin() + keep, cand.end(),
                        [](const Entry& x, const Entry& y) { return x.cost < y.cost; });
      // partial_sort is not stable: restore generation order among equal costs.
      std::stable_sort(cand.begin(), cand.begin() + keep,
                       [](const Entry& x, const Entry& y) { return x.cost < y.cost; });
      D[cell(i, j)].assign(cand.begin(), cand.begin() + keep);
    }
  }
  const auto& end = D[cell(P, Q)];
  DHX_CHECK(!end.empty(), PlanError,
            "SI search for '{}' ({} fwd x {} bwd ops): no plan has a finite cost; the cost table "
            "must price at least every single-op solo window",
            prog.name, P, Q);
  for (size_t r = 0; r < end.size(); ++r) {
    SIPlan plan;
    plan.pair = prog.name;
    plan.source = "search";
    plan.predicted_s = end[r].cost;
    for (int c = cell(P, Q), rank = static_cast<int>(r); D[c][rank].prev_cell >= 0;) {
      const Entry& e = D[c][rank];
      plan.blocks.push_back(e.block);
      c = e.prev_cell;
      rank = e.prev_rank;
    }
    std::reverse(plan.blocks.begin(), plan.blocks.end());
    carry_trailing_wgrads(plan, prog);  // not priced: it only moves independent ops into the next pair
    res.plans.push_back(std::move(plan));
  }
  return res;
}

SIPlan best_plan(const LayerProgram& prog, const BlockCost& cost, const SearchOptions& opts) {
  SearchOptions one = opts;
  one.top_k = 1;
  return search_plans(prog, cost, one).plans.front();
}

namespace {

// Depth-first enumeration of every block sequence from (i, j) to the end.
struct BruteForce {
  const LayerProgram& prog;
  const BlockCost& cost;
  size_t k;
  std::vector<std::vector<Window>> fw, bw;  // [begin] -> allowed windows starting there
  std::vector<Block> path;
  SearchResult res;
  // Max-heap on cost holding the k best complete plans seen so far.
  std::vector<std::pair<double, std::vector<Block>>> heap;

  static bool heap_less(const std::pair<double, std::vector<Block>>& x,
                        const std::pair<double, std::vector<Block>>& y) {
    return x.first < y.first;
  }

  void record(double total) {
    ++res.paths;
    if (heap.size() < k) {
      heap.emplace_back(total, path);
      std::push_heap(heap.begin(), heap.end(), heap_less);
    } else if (total < heap.front().first) {
      std::pop_heap(heap.begin(), heap.end(), heap_less);
      heap.back() = {total, path};
      std::push_heap(heap.begin(), heap.end(), heap_less);
    }
  }

  void step(int i, int j, double acc, int P, int Q) {
    if (i == P && j == Q) return record(acc);
    auto go = [&](const Block& b, double t) {
      ++res.blocks_priced;
      if (!std::isfinite(t)) return;
      path.push_back(b);
      step(b.has_fwd() ? b.fwd_end : i, b.has_bwd() ? b.bwd_end : j, acc + t, P, Q);
      path.pop_back();
    };
    const std::vector<Window> none;
    const auto& fs = i < P ? fw[i] : none;
    const auto& bs = j < Q ? bw[j] : none;
    for (const Window& f : fs)
      if (block_groups_legal(prog, f, {}))
        go(Block{f.begin, f.end, 0, 0}, cost.solo_fwd(f.begin, f.end));
    for (const Window& b : bs)
      if (block_groups_legal(prog, {}, b))
        go(Block{0, 0, b.begin, b.end}, cost.solo_bwd(b.begin, b.end));
    for (const Window& f : fs)
      for (const Window& b : bs)
        if (block_groups_legal(prog, f, b))
          go(Block{f.begin, f.end, b.begin, b.end}, cost.pair(f.begin, f.end, b.begin, b.end));
  }
};

}  // namespace

SearchResult brute_force_search(const LayerProgram& prog, const BlockCost& cost,
                                const SearchOptions& opts) {
  DHX_CHECK(opts.top_k >= 1, PlanError, "search top_k={} must be >= 1", opts.top_k);
  const int P = static_cast<int>(prog.fwd.size()), Q = static_cast<int>(prog.bwd.size());
  auto by_begin = [&](const std::vector<Op>& ops) {
    std::vector<std::vector<Window>> v(ops.size());
    for (const Window& w : strand_windows(ops, opts.windows, opts.max_window))
      v[w.begin].push_back(w);
    return v;
  };
  BruteForce bf{prog, cost, static_cast<size_t>(opts.top_k), by_begin(prog.fwd),
                by_begin(prog.bwd), {}, {}, {}};
  bf.step(0, 0, 0.0, P, Q);
  DHX_CHECK(!bf.heap.empty(), PlanError, "brute force for '{}': no plan has a finite cost",
            prog.name);
  std::sort_heap(bf.heap.begin(), bf.heap.end(), BruteForce::heap_less);
  for (auto& [total, blocks] : bf.heap) {
    SIPlan plan;
    plan.pair = prog.name;
    plan.source = "brute-force";
    plan.predicted_s = total;
    plan.blocks = std::move(blocks);
    bf.res.plans.push_back(std::move(plan));
  }
  return bf.res;
}

}  // namespace dhelix
