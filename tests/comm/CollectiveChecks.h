// Backend-independent collective checks, run by the local-backend GTest and by the mpirun test.
// Oracle: closed forms. Group rank r contributes v(r, i) (integers, exact in every dtype, bf16
// included, and so are their sums), so every result is known exactly and compared with ==.
// Not here: backend-specific failure tests (mismatched ops, killed ranks).
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/Error.h"
#include "comm/CommContext.h"

namespace dhelix::testing {

// Collects failures with their context; a run fails when any was recorded.
struct CheckLog {
  int rank = 0;
  int checks = 0;
  std::vector<std::string> failures;
  void expect(bool ok, const std::string& what) {
    ++checks;
    if (!ok && failures.size() < 50) failures.push_back(fmt::format("rank {}: {}", rank, what));
  }
};

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> kAll = {DType::kF32, DType::kF64, DType::kBF16, DType::kI32, DType::kI64};
  return kAll;
}

// v(r, i): rank-dependent, exact. bf16 keeps |sums| <= 4*(4+6) = 40 (exact up to 256).
inline double contribution(DType d, int r, int64_t i) {
  if (d == DType::kBF16) return (r + 1) + static_cast<double>(i % 7);
  return r * 1000.0 + static_cast<double>(i);
}

inline double get(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32: return t.data<float>()[i];
    case DType::kF64: return t.data<double>()[i];
    case DType::kBF16: return bf16_to_f32(t.data<uint16_t>()[i]);
    case DType::kI32: return t.data<int32_t>()[i];
    case DType::kI64: return static_cast<double>(t.data<int64_t>()[i]);
    case DType::kU16: return t.data<uint16_t>()[i];
  }
  return NAN;
}

inline void set(const Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::kF32: t.data<float>()[i] = static_cast<float>(v); return;
    case DType::kF64: t.data<double>()[i] = v; return;
    case DType::kBF16: t.data<uint16_t>()[i] = f32_to_bf16(static_cast<float>(v)); return;
    case DType::kI32: t.data<int32_t>()[i] = static_cast<int32_t>(v); return;
    case DType::kI64: t.data<int64_t>()[i] = static_cast<int64_t>(v); return;
    case DType::kU16: t.data<uint16_t>()[i] = static_cast<uint16_t>(v); return;
  }
}

// t[i] = v(r, first + i)
inline Tensor filled(const Shape& shape, DType d, int r, int64_t first = 0) {
  Tensor t = Tensor::empty(shape, d);
  for (int64_t i = 0; i < t.numel(); ++i) set(t, i, contribution(d, r, first + i));
  return t;
}

inline double fold(DType d, int size, int64_t i, ReduceOp op) {
  double acc = contribution(d, 0, i);
  for (int q = 1; q < size; ++q) {
    double v = contribution(d, q, i);
    acc = op == ReduceOp::kSum ? acc + v : op == ReduceOp::kMax ? std::max(acc, v) : std::min(acc, v);
  }
  return acc;
}

// Compares t[i] with want(i) for all i; records the first mismatch only.
inline void expect_all(CheckLog& log, const std::string& what, const Tensor& t,
                       const std::function<double(int64_t)>& want) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (get(t, i) != want(i)) {
      log.expect(false, fmt::format("{}: element {} is {} but the closed form gives {}", what, i, get(t, i), want(i)));
      return;
    }
  }
  log.expect(true, what);
}

// Every collective, every dtype, on group g. Rows of 3 elements; R rows per rank.
inline void check_group_collectives(CheckLog& log, ProcessGroup& g) {
  const int S = g.size(), r = g.rank();
  const int64_t R = 5;
  for (DType d : all_dtypes()) {
    std::string where = fmt::format("{} {}", g.name(), dtype_name(d));
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      Tensor t = filled({R, 3}, d, r);
      g.all_reduce(t, op).wait();
      expect_all(log, fmt::format("all_reduce({}) {}", reduce_op_name(op), where), t,
                 [&](int64_t i) { return fold(d, S, i, op); });
    }
    {
      Tensor in = filled({R, 3}, d, r), out = Tensor::zeros({S * R, 3}, d);
      g.all_gather(in, out).wait();
      expect_all(log, "all_gather " + where, out, [&](int64_t j) { return contribution(d, static_cast<int>(j / (R * 3)), j % (R * 3)); });
    }
    {
      Tensor in = filled({S * R, 3}, d, r), out = Tensor::zeros({R, 3}, d);
      g.reduce_scatter(in, out).wait();
      expect_all(log, "reduce_scatter " + where, out, [&](int64_t i) { return fold(d, S, r * R * 3 + i, ReduceOp::kSum); });
    }
    {
      Tensor in = filled({S * R, 3}, d, r), out = Tensor::zeros({S * R, 3}, d);
      g.all_to_all(in, out).wait();
      // out chunk q = chunk r of rank q's input
      expect_all(log, "all_to_all " + where, out, [&](int64_t j) {
        int64_t q = j / (R * 3), k = j % (R * 3);
        return contribution(d, static_cast<int>(q), r * R * 3 + k);
      });
    }
    {
      // Uneven, zero counts included: rank q sends (q + 2j) % 3 rows to rank j, row k of them
      // holding contribution(q, 1000 j + 3 k + c) in column c.
      auto rows = [](int q, int j) { return static_cast<int64_t>((q + 2 * j) % 3); };
      std::vector<int64_t> send(S), recv(S);
      int64_t ns = 0, nr = 0;
      for (int j = 0; j < S; ++j) ns += send[j] = rows(r, j), nr += recv[j] = rows(j, r);
      Tensor in = Tensor::empty({ns, 3}, d), out = Tensor::zeros({nr, 3}, d);
      int64_t at = 0;
      for (int j = 0; j < S; ++j)
        for (int64_t k = 0; k < send[j]; ++k, ++at)
          for (int c = 0; c < 3; ++c) set(in, at * 3 + c, contribution(d, r, 1000 * j + 3 * k + c));
      g.all_to_all_v(in, send, out, recv).wait();
      std::vector<std::pair<int, int64_t>> from;  // out row -> (source rank, its row index k)
      for (int q = 0; q < S; ++q)
        for (int64_t k = 0; k < recv[q]; ++k) from.push_back({q, k});
      expect_all(log, "all_to_all_v (uneven) " + where, out, [&](int64_t i) {
        auto [q, k] = from[static_cast<size_t>(i / 3)];
        return contribution(d, q, 1000 * r + 3 * k + i % 3);
      });
    }
    {
      // One ring step: out = the previous group rank's in (this rank's own on a group of one).
      Tensor in = filled({R, 3}, d, r), out = Tensor::zeros({R, 3}, d);
      g.ring_shift(in, out).wait();
      const int prev = (r + S - 1) % S;
      expect_all(log, "ring_shift " + where, out, [&](int64_t i) { return contribution(d, prev, i); });
    }
    {
      Tensor t = filled({R, 3}, d, r);
      g.broadcast(t, S - 1).wait();
      expect_all(log, "broadcast(root=last) " + where, t, [&](int64_t i) { return contribution(d, S - 1, i); });
    }
    if (S > 1) {  // ring: both posted before either is waited on; 64 Ki rows: beyond eager sizes
      int next = (r + 1) % S, prev = (r + S - 1) % S;
      Tensor out = filled({1 << 16}, d, r), in = Tensor::zeros({1 << 16}, d);
      Work s = g.send(out, next);
      Work rv = g.recv(in, prev);
      rv.wait();
      s.wait();
      expect_all(log, "send/recv ring " + where, in, [&](int64_t i) { return contribution(d, prev, i); });
      // Tags: receives posted in the opposite order of the sends are matched by tag, not order
      // (a pipeline's activation and gradient messages between two ranks interleave).
      Tensor a = filled({5}, d, r), b = filled({7}, d, r + 1);
      Tensor ia = Tensor::zeros({5}, d), ib = Tensor::zeros({7}, d);
      Work rb = g.recv(ib, prev, 2), ra = g.recv(ia, prev, 1);
      Work sa = g.send(a, next, 1), sb = g.send(b, next, 2);
      ra.wait();
      rb.wait();
      sa.wait();
      sb.wait();
      expect_all(log, "send/recv tag 1 " + where, ia, [&](int64_t i) { return contribution(d, prev, i); });
      expect_all(log, "send/recv tag 2 " + where, ib, [&](int64_t i) { return contribution(d, prev + 1, i); });
    }
  }
  g.barrier();
  // Sizes around the ring's block split: 1 element (empty blocks on every rank but one) and a
  // buffer larger than a socket's buffers, not divisible by the group size (partial sends); f64 keeps
  // the closed-form sums exact at these indices.
  for (int64_t n : {int64_t{1}, int64_t{(1 << 19) + 3}}) {
    Tensor t = filled({n}, DType::kF64, r);
    g.all_reduce(t).wait();
    expect_all(log, fmt::format("all_reduce(sum) {} f64[{}]", g.name(), n), t,
               [&](int64_t i) { return fold(DType::kF64, S, i, ReduceOp::kSum); });
    Tensor in = filled({S * n}, DType::kF64, r), rs = Tensor::zeros({n}, DType::kF64),
           ag = Tensor::zeros({S * n}, DType::kF64);
    g.reduce_scatter(in, rs).wait();
    expect_all(log, fmt::format("reduce_scatter {} f64[{}]", g.name(), S * n), rs,
               [&](int64_t i) { return fold(DType::kF64, S, r * n + i, ReduceOp::kSum); });
    g.all_gather(filled({n}, DType::kF64, r), ag).wait();
    expect_all(log, fmt::format("all_gather {} f64[{}]", g.name(), n), ag,
               [&](int64_t j) { return contribution(DType::kF64, static_cast<int>(j / n), j % n); });
  }
}

// Sequence numbers and describe(): exact text, one more per op.
inline void check_seq_and_describe(CheckLog& log, ProcessGroup& g) {
  int64_t s0 = g.next_seq();
  Tensor t = Tensor::zeros({4096});
  Work w = g.all_reduce(t);
  std::string want = fmt::format("all_reduce f32[4096] on {} seq={}", g.name(), s0);
  log.expect(w.describe() == want, fmt::format("describe() is '{}', want '{}'", w.describe(), want));
  log.expect(w.seq() == s0 && g.next_seq() == s0 + 1, fmt::format("seq {} next {} after starting at {}", w.seq(), g.next_seq(), s0));
  w.wait();
  log.expect(w.is_completed(), "is_completed() after wait()");
  Tensor m = Tensor::zeros({2, 8}, DType::kBF16);
  Work w2 = g.all_reduce(m, ReduceOp::kMax);
  want = fmt::format("all_reduce(max) bf16[2,8] on {} seq={}", g.name(), s0 + 1);
  log.expect(w2.describe() == want, fmt::format("describe() is '{}', want '{}'", w2.describe(), want));
  w2.wait();
}

// Many ops in flight at once on one group, waited in reverse: issue order is run order.
inline void check_many_in_flight(CheckLog& log, ProcessGroup& g) {
  std::vector<Tensor> ts;
  std::vector<Work> ws;
  for (int k = 0; k < 8; ++k) {
    ts.push_back(filled({257 + k}, DType::kF32, g.rank(), k));
    ws.push_back(g.all_reduce(ts.back()));
  }
  for (int k = 7; k >= 0; --k) {
    ws[static_cast<size_t>(k)].wait();
    expect_all(log, fmt::format("in-flight all_reduce #{} on {}", k, g.name()), ts[static_cast<size_t>(k)],
               [&](int64_t i) { return fold(DType::kF32, g.size(), k + i, ReduceOp::kSum); });
  }
}

// Two (or more) groups driven concurrently from their own threads.
inline void check_concurrent_groups(CheckLog& log, std::vector<ProcessGroup*> groups, int iters) {
  std::vector<CheckLog> logs(groups.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < groups.size(); ++k) {
    logs[k].rank = log.rank;
    threads.emplace_back([&, k] {
      try {
        for (int it = 0; it < iters; ++it) {
          ProcessGroup& g = *groups[k];
          Tensor t = filled({4099}, DType::kF32, g.rank(), it);
          g.all_reduce(t).wait();
          expect_all(logs[k], fmt::format("concurrent all_reduce it {} on {}", it, g.name()), t,
                     [&](int64_t i) { return fold(DType::kF32, g.size(), it + i, ReduceOp::kSum); });
        }
      } catch (const std::exception& e) {
        logs[k].expect(false, fmt::format("concurrent thread for {} threw: {}", groups[k]->name(), e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& l : logs) {
    log.checks += l.checks;
    log.failures.insert(log.failures.end(), l.failures.begin(), l.failures.end());
  }
}

// World ranks 0 and 1: rank 0's recv times out (CommError naming the op), then rank 1 is told
// (through `signal`, a group holding both) to send, and the same Work then completes.
inline void check_timeout_names_op(CheckLog& log, CommContext& ctx, ProcessGroup& signal) {
  ProcessGroup& w = ctx.world();
  if (ctx.rank() > 1) {  // another member of `signal`: only joins its barrier
    signal.barrier();
    return;
  }
  double saved = w.timeout_s();
  if (ctx.rank() == 0) {
    w.set_timeout_s(0.3);
    Tensor t = Tensor::zeros({4});
    Work rv = w.recv(t, 1);
    std::string want = fmt::format("recv(from=1) f32[4] on {} seq={}", w.name(), rv.seq());
    try {
      rv.wait();
      log.expect(false, "recv with no sender completed");
    } catch (const CommError& e) {
      std::string msg = e.what();
      log.expect(msg.find(want) != std::string::npos && msg.find("rank 0") != std::string::npos,
                 fmt::format("timeout message '{}' should name 'rank 0' and '{}'", msg, want));
    }
    w.set_timeout_s(saved);
    signal.barrier();
    rv.wait();
    expect_all(log, "recv after timeout", t, [](int64_t i) { return 7.0 + static_cast<double>(i); });
  } else {
    signal.barrier();
    Tensor t = Tensor::empty({4});
    for (int i = 0; i < 4; ++i) t.f32()[i] = 7.0f + static_cast<float>(i);
    w.send(t, 0).wait();
  }
}

// The role whose group holds world ranks 0 and 1 (for check_timeout_names_op); false if none.
inline bool role_with_ranks_0_1(const Layout& layout, GroupRole* out) {
  for (GroupRole role : {GroupRole::kTP, GroupRole::kEP, GroupRole::kCP, GroupRole::kPP, GroupRole::kDP}) {
    auto ranks = layout.group_ranks(role, 0);
    if (std::find(ranks.begin(), ranks.end(), 1) != ranks.end()) {
      *out = role;
      return true;
    }
  }
  return false;
}

// Everything above, for one rank of any backend.
inline void run_all_checks(CheckLog& log, CommContext& ctx) {
  log.rank = ctx.rank();
  check_group_collectives(log, ctx.world());
  for (GroupRole role : {GroupRole::kTP, GroupRole::kEP, GroupRole::kCP, GroupRole::kPP, GroupRole::kDP})
    if (ctx.group(role).size() > 1) check_group_collectives(log, ctx.group(role));
  check_seq_and_describe(log, ctx.world());
  check_many_in_flight(log, ctx.world());
  std::vector<ProcessGroup*> concurrent = {&ctx.world()};
  for (GroupRole role : {GroupRole::kTP, GroupRole::kDP})
    if (ctx.group(role).size() > 1) concurrent.push_back(&ctx.group(role));
  check_concurrent_groups(log, concurrent, 20);
  GroupRole role;
  if (ctx.world_size() > 1 && role_with_ranks_0_1(ctx.layout(), &role)) {
    // Members of the group holding ranks 0 and 1 run the timeout check; the rest wait below.
    auto members = ctx.layout().group_ranks(role, 0);
    if (std::find(members.begin(), members.end(), ctx.rank()) != members.end())
      check_timeout_names_op(log, ctx, ctx.group(role));
  }
  ctx.world().barrier();
}

}  // namespace dhelix::testing
