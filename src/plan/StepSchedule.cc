// Step schedules: transfers from the placement, the checker (static rules, then all ranks'
// slot lists simulated together), the cost timeline and the text rendering.
#include "plan/StepSchedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "base/Error.h"

namespace dhelix {

const char* transfer_kind_name(TransferKind k) { return k == TransferKind::kActivation ? "act" : "grad"; }

std::vector<int> StepSchedule::chunks_of(int rank) const {
  std::vector<int> out;
  for (int c = 0; c < static_cast<int>(chunks.size()); ++c)
    if (chunks[c].rank == rank) out.push_back(c);
  return out;
}

namespace {

// A pass of the step, as (kind, mb, chunk); kind 0 forward, 1 backward.
struct PassId {
  int kind = 0, mb = 0, chunk = 0;
  auto key() const { return std::make_tuple(kind, mb, chunk); }
  friend bool operator<(const PassId& a, const PassId& b) { return a.key() < b.key(); }
  std::string str() const {
    return fmt::format("micro-batch {}'s {} of chunk {}", mb, kind == 0 ? "forward" : "backward", chunk);
  }
};

// At most two passes, without a heap allocation (the walks below ask for them slot by slot).
struct TwoPasses {
  PassId at[2];
  int n = 0;
  void push_back(const PassId& p) { at[n++] = p; }
  const PassId* begin() const { return at; }
  const PassId* end() const { return at + n; }
};

// The passes whose outputs `p` reads: the previous chunk's forward, or the next chunk's backward
// and the chunk's own forward.
TwoPasses inputs_of(const PassId& p, int num_chunks) {
  TwoPasses in;
  if (p.kind == 0) {
    if (p.chunk > 0) in.push_back({0, p.mb, p.chunk - 1});
  } else {
    in.push_back({0, p.mb, p.chunk});
    if (p.chunk + 1 < num_chunks) in.push_back({1, p.mb, p.chunk + 1});
  }
  return in;
}

TwoPasses passes_of(const Slot& sl) {
  TwoPasses out;
  if (sl.fwd.active()) out.push_back({0, sl.fwd.mb, sl.fwd.chunk});
  if (sl.bwd.active()) out.push_back({1, sl.bwd.mb, sl.bwd.chunk});
  return out;
}

// The transfers the placement requires of one slot.
void required_transfers(const StepSchedule& s, const Slot& sl, std::vector<Transfer>& recvs,
                        std::vector<Transfer>& sends) {
  const int S = static_cast<int>(s.chunks.size());
  auto rank_of = [&](int c) { return s.chunks[c].rank; };
  if (sl.fwd.active()) {
    const int c = sl.fwd.chunk;
    if (c > 0 && rank_of(c - 1) != rank_of(c))
      recvs.push_back({TransferKind::kActivation, sl.fwd.mb, c, rank_of(c - 1)});
    if (c + 1 < S && rank_of(c + 1) != rank_of(c))
      sends.push_back({TransferKind::kActivation, sl.fwd.mb, c + 1, rank_of(c + 1)});
  }
  if (sl.bwd.active()) {
    const int c = sl.bwd.chunk;
    if (c + 1 < S && rank_of(c + 1) != rank_of(c))
      recvs.push_back({TransferKind::kGradient, sl.bwd.mb, c + 1, rank_of(c + 1)});
    if (c > 0 && rank_of(c - 1) != rank_of(c))
      sends.push_back({TransferKind::kGradient, sl.bwd.mb, c, rank_of(c - 1)});
  }
}

std::string transfer_str(const Transfer& t) {
  return fmt::format("{} of micro-batch {} across boundary {} (peer rank {})", transfer_kind_name(t.kind), t.mb,
                     t.boundary, t.peer);
}

// Elements of `a` not matched one-to-one in `b`.
std::vector<Transfer> missing_from(std::vector<Transfer> a, std::vector<Transfer> b) {
  std::vector<Transfer> out;
  for (const Transfer& t : a) {
    auto it = std::find(b.begin(), b.end(), t);
    if (it == b.end()) out.push_back(t);
    else b.erase(it);
  }
  return out;
}

// Runs all ranks' slot lists together in a legal order (a slot runs once every input pass has run);
// calls `on_run(rank, slot)` for each slot as it runs. `stuck` ends up with the first slot of each
// rank that could not run (empty when every rank finished), `done` with the passes that ran.
// The passes that ran: a table over the schedule's micro-batches and chunks, and a set for any pass
// outside them (a schedule not yet checked may name one).
class PassSet {
 public:
  PassSet(int micro_batches, int chunks)
      : M_(std::max(0, micro_batches)), S_(std::max(0, chunks)), table_(static_cast<size_t>(2 * M_ * S_), 0) {}
  bool count(const PassId& p) const { return inside(p) ? table_[index(p)] != 0 : rest_.count(p) > 0; }
  void insert(const PassId& p) {
    if (inside(p)) table_[index(p)] = 1;
    else rest_.insert(p);
  }

 private:
  bool inside(const PassId& p) const { return p.mb >= 0 && p.mb < M_ && p.chunk >= 0 && p.chunk < S_; }
  size_t index(const PassId& p) const { return static_cast<size_t>((p.kind * M_ + p.mb) * S_ + p.chunk); }
  int M_, S_;
  std::vector<char> table_;
  std::set<PassId> rest_;
};

struct SimResult {
  std::vector<std::pair<int, int>> stuck;
  PassSet done;
};
SimResult simulate(const StepSchedule& s, const std::function<void(int, int)>& on_run) {
  const int S = static_cast<int>(s.chunks.size());
  const int P = static_cast<int>(s.ranks.size());
  SimResult res{{}, PassSet(s.micro_batches, S)};
  std::vector<size_t> pc(P, 0);
  for (;;) {
    bool progress = false, finished = true;
    for (int r = 0; r < P; ++r) {
      for (; pc[r] < s.ranks[r].size(); ++pc[r]) {
        const Slot& sl = s.ranks[r][pc[r]];
        bool ready = true;
        for (const PassId& p : passes_of(sl))
          for (const PassId& in : inputs_of(p, S)) ready = ready && res.done.count(in) > 0;
        if (!ready) break;
        for (const PassId& p : passes_of(sl)) res.done.insert(p);
        on_run(r, static_cast<int>(pc[r]));
        progress = true;
      }
      finished = finished && pc[r] == s.ranks[r].size();
    }
    if (finished) return res;
    if (!progress) {
      for (int r = 0; r < P; ++r)
        if (pc[r] < s.ranks[r].size()) res.stuck.push_back({r, static_cast<int>(pc[r])});
      return res;
    }
  }
}

}  // namespace

void attach_transfers(StepSchedule& s) {
  for (auto& slots : s.ranks)
    for (Slot& sl : slots) {
      sl.recvs.clear();
      sl.sends.clear();
      required_transfers(s, sl, sl.recvs, sl.sends);
    }
}

std::vector<StuckSlot> find_deadlock(const StepSchedule& s) {
  const int S = static_cast<int>(s.chunks.size());
  SimResult sim = simulate(s, [](int, int) {});
  std::vector<StuckSlot> out;
  for (auto [r, k] : sim.stuck) {
    const Slot& sl = s.ranks[r][k];
    StuckSlot st{r, k, false};
    if (sl.bwd.active())
      for (const PassId& in : inputs_of({1, sl.bwd.mb, sl.bwd.chunk}, S))
        st.waits_on_backward_input = st.waits_on_backward_input || !sim.done.count(in);
    out.push_back(st);
  }
  return out;
}

std::string ScheduleViolation::message() const {
  std::string where = rank < 0 ? "schedule" : slot < 0 ? fmt::format("rank {}", rank)
                                                       : fmt::format("rank {} slot {}", rank, slot);
  return fmt::format("{}: rule '{}': {}", where, rule, detail);
}

std::vector<ScheduleViolation> find_schedule_violations(const StepSchedule& s) {
  std::vector<ScheduleViolation> v;
  auto add = [&](int r, int k, const char* rule, std::string d) { v.push_back({r, k, rule, std::move(d)}); };
  const int S = static_cast<int>(s.chunks.size());
  const int P = s.pp;

  // chunks
  if (S == 0) add(-1, -1, kRuleChunks, "the schedule has no chunks");
  if (static_cast<int>(s.ranks.size()) != P)
    add(-1, -1, kRuleChunks, fmt::format("{} ranks of slots for pp={}", s.ranks.size(), P));
  for (int c = 0; c < S; ++c) {
    const Chunk& ch = s.chunks[c];
    const int want_begin = c == 0 ? 0 : s.chunks[c - 1].unit_end;
    if (ch.unit_begin != want_begin || ch.size() <= 0)
      add(-1, -1, kRuleChunks,
          fmt::format("chunk {} holds units [{}, {}); it must be non-empty and begin at {}", c, ch.unit_begin,
                      ch.unit_end, want_begin));
    if (ch.rank < 0 || ch.rank >= P) add(-1, -1, kRuleChunks, fmt::format("chunk {} is on rank {} of pp={}", c, ch.rank, P));
  }
  if (S > 0 && s.chunks.back().unit_end != s.num_units)
    add(-1, -1, kRuleChunks, fmt::format("chunks end at unit {}, the model has {}", s.chunks.back().unit_end, s.num_units));
  if (!v.empty()) return v;

  // placement and once
  std::map<PassId, std::pair<int, int>> where;  // pass -> (rank, slot)
  for (int r = 0; r < P; ++r)
    for (int k = 0; k < static_cast<int>(s.ranks[r].size()); ++k) {
      const Slot& sl = s.ranks[r][k];
      if (!sl.fwd.active() && !sl.bwd.active()) add(r, k, kRulePlacement, "the slot runs nothing");
      for (const Pass* ps : {&sl.fwd, &sl.bwd}) {
        if (!ps->active()) continue;
        const PassId id{ps == &sl.bwd ? 1 : 0, ps->mb, ps->chunk};
        if (ps->mb >= s.micro_batches || ps->chunk < 0 || ps->chunk >= S) {
          add(r, k, kRulePlacement, fmt::format("{} is outside micro-batches [0, {}) or chunks [0, {})", id.str(),
                                                s.micro_batches, S));
          continue;
        }
        if (s.chunks[ps->chunk].rank != r)
          add(r, k, kRulePlacement, fmt::format("{} runs here but chunk {} is on rank {}", id.str(), ps->chunk,
                                                s.chunks[ps->chunk].rank));
        auto [it, fresh] = where.insert({id, {r, k}});
        if (!fresh)
          add(r, k, kRuleOnce, fmt::format("{} runs again (first in rank {} slot {})", id.str(), it->second.first,
                                           it->second.second));
      }
    }
  for (int mb = 0; mb < s.micro_batches; ++mb)
    for (int c = 0; c < S; ++c)
      for (int kind = 0; kind < 2; ++kind) {
        PassId id{kind, mb, c};
        if (!where.count(id)) add(s.chunks[c].rank, -1, kRuleOnce, fmt::format("{} never runs", id.str()));
      }
  if (!v.empty()) return v;

  // dependency (same rank) and transfer
  for (int r = 0; r < P; ++r)
    for (int k = 0; k < static_cast<int>(s.ranks[r].size()); ++k) {
      const Slot& sl = s.ranks[r][k];
      for (const PassId& p : passes_of(sl))
        for (const PassId& in : inputs_of(p, S)) {
          auto [ir, ik] = where.at(in);
          if (ir != r || ik < k) continue;
          add(r, k, kRuleDependency,
              ik == k ? fmt::format("{} is co-executed with {}, whose output it reads", p.str(), in.str())
                      : fmt::format("{} runs before {} (slot {}), whose output it reads", p.str(), in.str(), ik));
        }
      std::vector<Transfer> want_r, want_s;
      required_transfers(s, sl, want_r, want_s);
      for (const Transfer& t : missing_from(want_r, sl.recvs))
        add(r, k, kRuleTransfer, "no receive posted for the " + transfer_str(t));
      for (const Transfer& t : missing_from(sl.recvs, want_r))
        add(r, k, kRuleTransfer, "a receive no rank sends: " + transfer_str(t));
      for (const Transfer& t : missing_from(want_s, sl.sends))
        add(r, k, kRuleTransfer, "no send of the " + transfer_str(t));
      for (const Transfer& t : missing_from(sl.sends, want_s))
        add(r, k, kRuleTransfer, "a send no rank receives: " + transfer_str(t));
    }
  if (!v.empty()) return v;

  // deadlock
  for (auto [r, k] : simulate(s, [](int, int) {}).stuck) {
    std::string waits;
    const Slot& sl = s.ranks[r][k];
    std::vector<PassId> in;
    for (const PassId& p : passes_of(sl))
      for (const PassId& i : inputs_of(p, S)) in.push_back(i);
    for (const PassId& i : in) {
      auto [ir, ik] = where.at(i);
      if (ir == r) continue;
      const Transfer* t = nullptr;
      for (const Transfer& x : sl.recvs)
        if (x.mb == i.mb && (i.kind == 0 ? x.kind == TransferKind::kActivation && x.boundary == i.chunk + 1
                                         : x.kind == TransferKind::kGradient && x.boundary == i.chunk))
          t = &x;
      waits += fmt::format("{}waits for the {}, which rank {} sends in its slot {}", waits.empty() ? "" : "; ",
                           t ? transfer_str(*t) : i.str(), ir, ik);
    }
    add(r, k, kRuleDeadlock, fmt::format("stuck: {} (every rank is blocked)", waits));
  }
  return v;
}

void check_schedule(const StepSchedule& s) {
  std::vector<ScheduleViolation> v = find_schedule_violations(s);
  if (v.empty()) return;
  std::string msg = fmt::format("step schedule '{}' (pp={}, {} micro-batches) breaks {} rule{}:", s.name, s.pp,
                                s.micro_batches, v.size(), v.size() == 1 ? "" : "s");
  for (const auto& x : v) msg += "\n  " + x.message();
  throw PlanError(msg);
}

PassCost uniform_layer_cost(int num_units, double bwd_over_fwd) {
  return [num_units, bwd_over_fwd](const Chunk& ch, bool backward) {
    const int layers = ch.size() - (ch.unit_begin == 0 ? 1 : 0) - (ch.unit_end == num_units ? 1 : 0);
    return (backward ? bwd_over_fwd : 1.0) * layers;
  };
}

double ScheduleTimeline::bubble(int rank) const { return makespan > 0 ? 1.0 - busy.at(rank) / makespan : 0.0; }

double ScheduleTimeline::max_bubble() const {
  double b = 0;
  for (size_t r = 0; r < busy.size(); ++r) b = std::max(b, bubble(static_cast<int>(r)));
  return b;
}

ScheduleTimeline simulate_timeline(const StepSchedule& s, const PassCost& cost, const TransferCost& transfer) {
  return simulate_slots(
      s,
      [&](int, int, const Slot& sl) {
        double d = 0;
        for (const PassId& p : passes_of(sl)) d += cost(s.chunks[p.chunk], p.kind == 1);
        return d;
      },
      transfer);
}

ScheduleTimeline simulate_slots(const StepSchedule& s, const SlotCost& cost, const TransferCost& transfer) {
  check_schedule(s);
  const int S = static_cast<int>(s.chunks.size());
  ScheduleTimeline tl;
  tl.ranks.resize(s.ranks.size());
  tl.busy.assign(s.ranks.size(), 0.0);
  std::vector<double> free_at(s.ranks.size(), 0.0);
  // Per pass (a checked schedule's passes index a table: kind, micro-batch, chunk): when its output
  // exists on its own rank, and when it has crossed to the consuming rank (with transfers).
  const size_t M = static_cast<size_t>(s.micro_batches), P = s.ranks.size();
  auto at = [&](const PassId& p) { return (static_cast<size_t>(p.kind) * M + static_cast<size_t>(p.mb)) * S + p.chunk; };
  std::vector<double> end_of(2 * M * S, 0.0), arrive_of(2 * M * S, 0.0);
  std::vector<double> link_free(P * P, 0.0);  // [from * P + to]: when the link is idle again
  auto rank_of = [&](const PassId& p) { return s.chunks[p.chunk].rank; };
  simulate(s, [&](int r, int k) {
    const Slot& sl = s.ranks[r][k];
    double start = free_at[r];
    for (const PassId& p : passes_of(sl))
      for (const PassId& in : inputs_of(p, S)) {
        const bool remote = transfer && rank_of(in) != r;
        start = std::max(start, remote ? arrive_of[at(in)] : end_of[at(in)]);
      }
    const double dur = cost(r, k, sl);
    const double end = start + dur;
    for (const PassId& p : passes_of(sl)) end_of[at(p)] = end;
    if (transfer)
      for (const Transfer& t : sl.sends) {
        double& link = link_free[static_cast<size_t>(r) * P + static_cast<size_t>(t.peer)];
        link = std::max(link, end) + transfer(t);
        arrive_of[at(t.kind == TransferKind::kActivation ? PassId{0, sl.fwd.mb, sl.fwd.chunk}
                                                         : PassId{1, sl.bwd.mb, sl.bwd.chunk})] = link;
      }
    tl.ranks[r].push_back({start, end});
    free_at[r] = end;
    tl.busy[r] += dur;
    tl.makespan = std::max(tl.makespan, end);
  });
  return tl;
}

std::string render_schedule(const StepSchedule& s) {
  std::string out = fmt::format("step schedule '{}': pp={}, {} micro-batches, {} chunks over {} units\n", s.name, s.pp,
                                s.micro_batches, s.chunks.size(), s.num_units);
  for (int c = 0; c < static_cast<int>(s.chunks.size()); ++c)
    out += fmt::format("  chunk {:>2}: units [{}, {}) on rank {}\n", c, s.chunks[c].unit_begin, s.chunks[c].unit_end,
                       s.chunks[c].rank);
  auto pass = [](const char* k, const Pass& p) {
    return p.active() ? fmt::format("{}{}/c{}", k, p.mb, p.chunk) : std::string("-");
  };
  auto xfers = [](const char* dir, const std::vector<Transfer>& ts, const char* arrow) {
    std::string o;
    for (const Transfer& t : ts)
      o += fmt::format(" {} {} mb{} {}r{}", dir, transfer_kind_name(t.kind), t.mb, arrow, t.peer);
    return o;
  };
  for (int r = 0; r < static_cast<int>(s.ranks.size()); ++r) {
    out += fmt::format("rank {} ({} slots)\n", r, s.ranks[r].size());
    std::string phase;
    for (int k = 0; k < static_cast<int>(s.ranks[r].size()); ++k) {
      const Slot& sl = s.ranks[r][k];
      if (sl.phase != phase) out += fmt::format("  [{}]\n", phase = sl.phase);
      out += fmt::format("  {:>3}  {:<8} {} {:<8}{}{}\n", k, pass("F", sl.fwd), sl.co_executed() ? "||" : "  ",
                         pass("B", sl.bwd), xfers("recv", sl.recvs, "<-"), xfers("send", sl.sends, "->"));
    }
  }
  return out;
}

}  // namespace dhelix
