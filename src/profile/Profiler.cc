// Profiler: the measurement loop over windows and window pairs, and the profile's identity strings.
#include "profile/Profiler.h"

#include <algorithm>

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <thread>

#include "base/Error.h"
#include "base/Signals.h"

namespace dhelix {

namespace {

std::string iso_now() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string default_machine(CommContext* comm, Device d) {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
  return fmt::format("{} ({} cores{}), backend {}, {} rank(s)", host, std::thread::hardware_concurrency(),
                     d.is_host() ? "" : ", ops on " + d.str(), comm ? comm->backend() : "single",
                     comm ? comm->world_size() : 1);
}

}  // namespace

int64_t profile_entry_count(const LayerProgram& prog, WindowRule rule, int max_window) {
  return static_cast<int64_t>(strand_windows(prog.fwd, rule, max_window).size() +
                              strand_windows(prog.bwd, rule, max_window).size() +
                              legal_pairs(prog, rule, max_window).size());
}

Profile profile_layer_pair(LayerPairBench& bench, const ModelConfig& model, const LayoutConfig& layout,
                           CommContext* comm, const ProfileOptions& opts) {
  const LayerProgram& prog = bench.program();
  const auto fw = strand_windows(prog.fwd, opts.windows, opts.max_window);
  const auto bw = strand_windows(prog.bwd, opts.windows, opts.max_window);
  const auto pairs = legal_pairs(prog, opts.windows, opts.max_window);
  const int64_t total = static_cast<int64_t>(fw.size() + bw.size() + pairs.size());

  // Every rank walks the same list in the same order; medians are agreed once at the end.
  std::vector<double> local;
  local.reserve(total);
  auto time_block = [&](const Block& b) {
    // A first stop signal on any rank ends the profile on every rank after the same entry (one small
    // all-reduce per entry); nothing is written.
    if (const int sig = static_cast<int>(bench.agree_max({double(stop_signal())}).front()); sig != 0)
      throw StopRequested(sig, fmt::format("profiling (after {} of {} entries; no profile written)", local.size(), total));
    local.push_back(bench.local_median({b}, opts.timing));
    if (opts.progress) opts.progress(static_cast<int64_t>(local.size()), total);
  };
  for (const Window& w : fw) time_block(Block{w.begin, w.end, 0, 0});
  for (const Window& w : bw) time_block(Block{0, 0, w.begin, w.end});
  for (const auto& [f, b] : pairs) time_block(Block{f.begin, f.end, b.begin, b.end});
  // The bracket's own cost, measured last (everything warm) and taken out of every entry: a pair
  // and each solo window carry it once, so summed solo windows would be charged it once per window
  // where the pair they are set against carries it once (on a GPU it is the size of a small op).
  // An entry under it by noise keeps a nanosecond (a time is > 0).
  local.push_back(bench.local_overhead(opts.timing));
  std::vector<double> agreed = bench.agree_max(local);
  const double overhead = agreed.back();
  agreed.pop_back();
  for (double& t : agreed) t = std::max(t - overhead, 1e-9);

  Profile p;
  p.describe_program(prog);
  p.meta.model = describe_model(model);
  p.meta.layout = describe_layout(layout);
  p.meta.shapes = describe_shapes(bench.micro_batch());
  p.meta.machine = opts.machine.empty() ? default_machine(comm, bench.device()) : opts.machine;
  p.meta.timestamp = iso_now();
  p.meta.repeats = opts.timing.repeats;
  p.meta.warmup = opts.timing.warmup;
  p.meta.precision = describe_precision(bench.run());
  p.meta.timing_overhead_s = overhead;
  size_t i = 0;
  for (const Window& w : fw) p.set_solo_fwd(w, agreed[i++]);
  for (const Window& w : bw) p.set_solo_bwd(w, agreed[i++]);
  for (const auto& [f, b] : pairs) p.set_pair(f, b, agreed[i++]);
  return p;
}

std::string describe_model(const ModelConfig& m) {
  return fmt::format("{} {} C={} L={} H={}/{} F={} V={}", m.name, family_name(m.family), m.d_model, m.n_layers,
                     m.n_heads, m.n_kv_heads, m.ffn_hidden, m.vocab_size);
}

std::string describe_layout(const LayoutConfig& l) {
  std::string s = l.is_3d() ? fmt::format("x={},y={},z={}{}", l.tp_x, l.tp_y, l.tp_z,
                                          l.tp_order == "xyz" ? "" : ",order=" + l.tp_order)
                            : fmt::format("tp={}", l.tp);
  if (l.tp > 1 && l.sequence_parallel) s += ",sp";
  s += fmt::format(",dp={}", l.dp);
  if (l.pp > 1) s += fmt::format(",pp={}", l.pp);
  if (l.cp > 1) s += fmt::format(",cp={}", l.cp);
  if (l.ep > 1) s += fmt::format(",ep={}", l.ep);
  if (l.recompute != Recompute::kNone) s += fmt::format(",recompute={}", recompute_name(l.recompute));
  if (l.recompute != Recompute::kNone && l.recompute_layers > 0) s += fmt::format(",first={}", l.recompute_layers);
  if (l.fuse_epilogues) s += ",fused-epilogues";
  return s;
}

std::string describe_shapes(const MicroBatchShape& mb) { return fmt::format("B={},T={}", mb.B, mb.T); }

void check_profile_fits(const Profile& p, const ModelConfig& m, const LayoutConfig& l, const MicroBatchShape& mb,
                        const LayerProgram& prog, const std::string& precision) {
  std::vector<std::string> bad;
  auto field = [&](const char* name, const std::string& have, const std::string& want) {
    if (have != want) bad.push_back(fmt::format("  {}: profile has '{}', this run is '{}'", name, have, want));
  };
  field("model", p.meta.model, describe_model(m));
  field("layout", p.meta.layout, describe_layout(l));
  field("shapes", p.meta.shapes, describe_shapes(mb));
  if (!p.meta.precision.empty()) field("precision", p.meta.precision, precision);
  try {
    p.check_matches(prog);
  } catch (const PlanError& e) {
    bad.push_back(fmt::format("  ops: {}", e.what()));
  }
  if (!bad.empty()) {
    std::string msg = "the profile was measured for another run (profile it again for this config):";
    for (auto& b : bad) msg += "\n" + b;
    throw PlanError(msg);
  }
}

}  // namespace dhelix
