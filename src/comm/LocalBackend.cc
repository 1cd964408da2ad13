// Threads-as-ranks backend. A collective: every rank's comm thread deposits a clone of its input
// in the (group, seq) slot, waits until all `size` arrived, then computes its own output from the
// clones (folded in rank order, so all ranks agree bitwise). Mismatched ops at one seq are a
// CommError naming both. send is buffered (completes at once); recv completes when matched.
#include "comm/LocalBackend.h"

#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <tuple>

#include <fmt/ranges.h>

#include "base/Error.h"
#include "comm/Reduce.h"

namespace dhelix {
namespace {

struct LocalWorld {
  struct Slot {
    std::string signature;
    int first_rank = -1;
    std::vector<Tensor> contrib;
    std::vector<char> present;
    int arrived = 0, departed = 0;
  };
  struct PendingRecv {
    Tensor dst;
    std::shared_ptr<WorkState> state;
  };
  struct Mailbox {
    std::deque<Tensor> sent;
    std::deque<PendingRecv> waiting;
  };

  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  std::string reason;
  std::map<std::pair<std::string, int64_t>, Slot> slots;             // (group key, seq)
  std::map<std::tuple<std::string, int, int, int>, Mailbox> boxes;   // (group key, src, dst, tag)

  void abort(const std::string& why) {
    std::lock_guard lk(mu);
    if (!aborted) {
      aborted = true;
      reason = why;
    }
    for (auto& [key, box] : boxes) {
      for (auto& p : box.waiting) p.state->fail("local world aborted: " + reason);
      box.waiting.clear();
    }
    cv.notify_all();
  }
  void check_alive() const { DHX_CHECK(!aborted, CommError, "local world aborted: {}", reason); }
};

class LocalProcessGroup final : public ProcessGroup {
 public:
  LocalProcessGroup(std::shared_ptr<LocalWorld> world, std::string key, const std::string& role, int rank, int size,
                    int world_rank, const CommOptions& options)
      : ProcessGroup(role, rank, size, world_rank, options.timeout_s), w_(std::move(world)), key_(std::move(key)) {
    start_stream(options.nice);
  }
  ~LocalProcessGroup() override { stop_stream(); }
  std::string transport() const override { return "threads"; }

 protected:
  Task all_reduce_task(Tensor t, ReduceOp op) override {
    return [this, t, op](const std::shared_ptr<WorkState>& st) {
      auto c = exchange(*st, t.clone());
      reduce_buffers(raw_all(c, 0, 0), t.raw(), t.numel(), t.dtype(), op);
      return true;
    };
  }
  Task all_gather_task(Tensor in, Tensor out) override {
    return [this, in, out](const std::shared_ptr<WorkState>& st) {
      auto c = exchange(*st, in.clone());
      for (int r = 0; r < size(); ++r) out.narrow0(r * in.dim(0), in.dim(0)).copy_from(c[static_cast<size_t>(r)]);
      return true;
    };
  }
  Task reduce_scatter_task(Tensor in, Tensor out, ReduceOp op) override {
    return [this, in, out, op](const std::shared_ptr<WorkState>& st) {
      auto c = exchange(*st, in.clone());
      reduce_buffers(raw_all(c, rank() * out.dim(0), out.dim(0)), out.raw(), out.numel(), out.dtype(), op);
      return true;
    };
  }
  Task all_to_all_task(Tensor in, Tensor out) override {
    return [this, in, out](const std::shared_ptr<WorkState>& st) {
      auto c = exchange(*st, in.clone());
      int64_t chunk = in.dim(0) / size();
      for (int j = 0; j < size(); ++j)
        out.narrow0(j * chunk, chunk).copy_from(c[static_cast<size_t>(j)].narrow0(rank() * chunk, chunk));
      return true;
    };
  }
  Task all_to_all_v_task(Tensor in, std::vector<int64_t> send, Tensor out, std::vector<int64_t> recv) override {
    return [this, in, send, out, recv](const std::shared_ptr<WorkState>& st) {
      // Every rank publishes its send counts followed by its input's bytes, in one i64 tensor.
      const size_t es = dtype_size(in.dtype()), bytes = static_cast<size_t>(in.numel()) * es;
      Tensor pack = Tensor::zeros({size() + static_cast<int64_t>((bytes + 7) / 8)}, DType::kI64);
      for (int j = 0; j < size(); ++j) pack.data<int64_t>()[j] = send[static_cast<size_t>(j)];
      if (bytes > 0) std::memcpy(pack.data<int64_t>() + size(), in.raw(), bytes);
      auto c = exchange(*st, pack);
      int64_t at = 0;
      for (int j = 0; j < size(); ++j) {
        const int64_t* sc = c[static_cast<size_t>(j)].data<int64_t>();
        const char* src = reinterpret_cast<const char*>(sc + size());
        int64_t off = 0;
        for (int q = 0; q < rank(); ++q) off += sc[q];
        DHX_CHECK(sc[rank()] == recv[static_cast<size_t>(j)], CommError,
                  "{}: rank {} sends {} elements here but {} were expected", st->describe(), j, sc[rank()],
                  recv[static_cast<size_t>(j)]);
        std::memcpy(static_cast<char*>(out.raw()) + static_cast<size_t>(at) * es,
                    src + static_cast<size_t>(off) * es, static_cast<size_t>(sc[rank()]) * es);
        at += sc[rank()];
      }
      return true;
    };
  }
  Task broadcast_task(Tensor t, int root) override {
    return [this, t, root](const std::shared_ptr<WorkState>& st) {
      auto c = exchange(*st, rank() == root ? t.clone() : Tensor());
      Tensor dst = t;  // the captured view is const; its storage is not
      if (rank() != root) dst.copy_from(c[static_cast<size_t>(root)]);
      return true;
    };
  }
  Task barrier_task() override {
    return [this](const std::shared_ptr<WorkState>& st) {
      exchange(*st, Tensor());
      return true;
    };
  }
  Task send_task(Tensor t, int peer, int tag) override {
    return [this, t, peer, tag](const std::shared_ptr<WorkState>&) {
      std::lock_guard lk(w_->mu);
      w_->check_alive();
      auto& box = w_->boxes[{key_, rank(), peer, tag}];
      if (box.waiting.empty()) {
        box.sent.push_back(t.clone());
        return true;
      }
      LocalWorld::PendingRecv p = std::move(box.waiting.front());
      box.waiting.pop_front();
      if (p.dst.dtype() != t.dtype() || p.dst.numel() != t.numel()) {
        std::string msg = fmt::format("{} on {} was matched by a send of {}", p.state->signature(), name(), t.describe());
        p.state->fail(msg);
        throw CommError(msg);
      }
      p.dst.copy_from(t);
      p.dst = Tensor();  // release the receiver's buffer before it can see the recv finish
      p.state->complete();
      return true;
    };
  }
  Task recv_task(Tensor t, int peer, int tag) override {
    return [this, t, peer, tag](const std::shared_ptr<WorkState>& st) {
      std::lock_guard lk(w_->mu);
      w_->check_alive();
      auto& box = w_->boxes[{key_, peer, rank(), tag}];
      if (box.sent.empty()) {
        box.waiting.push_back({t, st});
        return false;  // the matching send completes it
      }
      Tensor src = std::move(box.sent.front());
      box.sent.pop_front();
      DHX_CHECK(src.dtype() == t.dtype() && src.numel() == t.numel(), CommError,
                "{} on {} was matched by a send of {}", st->signature(), name(), src.describe());
      Tensor dst = t;
      dst.copy_from(src);
      return true;
    };
  }

 private:
  // Deposits `mine` in the (group, seq) slot and returns every rank's deposit once all arrived.
  std::vector<Tensor> exchange(const WorkState& st, Tensor mine) {
    // Slots are keyed by the count of collectives (not of all ops): send/recv take sequence
    // numbers only on their two ranks. Touched only by this group's stream thread.
    int64_t coll = collectives_issued_++;
    std::unique_lock lk(w_->mu);
    w_->check_alive();
    auto slot_key = std::make_pair(key_, coll);
    auto& slot = w_->slots[slot_key];
    if (slot.first_rank < 0) {
      slot.signature = st.signature();
      slot.first_rank = rank();
      slot.contrib.resize(static_cast<size_t>(size()));
      slot.present.assign(static_cast<size_t>(size()), 0);
    }
    DHX_CHECK(slot.signature == st.signature(), CommError,
              "ranks disagree on collective #{} of {}: group rank {} issued '{}' but group rank {} issued '{}'",
              coll, name(), rank(), st.signature(), slot.first_rank, slot.signature);
    slot.contrib[static_cast<size_t>(rank())] = std::move(mine);
    slot.present[static_cast<size_t>(rank())] = 1;
    ++slot.arrived;
    w_->cv.notify_all();
    bool all = w_->cv.wait_for(lk, std::chrono::duration<double>(timeout_s()),
                               [&] { return w_->aborted || slot.arrived == size(); });
    w_->check_alive();
    if (!all) {
      std::string missing;
      for (int r = 0; r < size(); ++r)
        if (!slot.present[static_cast<size_t>(r)]) missing += fmt::format("{}{}", missing.empty() ? "" : ",", r);
      throw CommError(fmt::format("{}: group ranks {} never joined within {:.3g} s", st.describe(), missing, timeout_s()));
    }
    std::vector<Tensor> result = slot.contrib;
    if (++slot.departed == size()) w_->slots.erase(slot_key);
    return result;
  }

  // Pointers to rows [row0, row0+rows) of each deposit (rows == 0: the whole tensor).
  static std::vector<const void*> raw_all(const std::vector<Tensor>& c, int64_t row0, int64_t rows) {
    std::vector<const void*> out;
    for (const Tensor& t : c) out.push_back(rows ? t.narrow0(row0, rows).raw() : t.raw());
    return out;
  }

  std::shared_ptr<LocalWorld> w_;
  std::string key_;
  int64_t collectives_issued_ = 0;
};

std::unique_ptr<CommContext> make_local_context(const std::shared_ptr<LocalWorld>& world, const LayoutConfig& cfg,
                                                int rank, const CommOptions& options) {
  Layout layout(cfg, rank);
  CommContext::RoleGroups groups;
  for (GroupRole role : all_group_roles()) {
    auto all = layout.all_groups(role);
    for (size_t gi = 0; gi < all.size(); ++gi) {
      for (size_t pos = 0; pos < all[gi].size(); ++pos) {
        if (all[gi][pos] != rank) continue;
        groups[static_cast<size_t>(role)] = std::make_unique<LocalProcessGroup>(
            world, fmt::format("{}#{}", group_role_name(role), gi), group_role_name(role), static_cast<int>(pos),
            static_cast<int>(all[gi].size()), rank, options);
      }
    }
  }
  auto world_group =
      std::make_unique<LocalProcessGroup>(world, "world#0", "world", rank, cfg.world(), rank, options);
  auto abort_fn = [](const std::string& message) { throw CommError(message); };
  return std::make_unique<CommContext>("local", std::move(layout), std::move(groups), std::move(world_group),
                                       abort_fn, world);
}

}  // namespace

void run_local_ranks(const LayoutConfig& cfg, const std::function<void(CommContext&)>& fn,
                     const CommOptions& options) {
  auto errors = validate_layout(cfg, cfg.world());
  DHX_CHECK(errors.empty(), ConfigError, "bad layout: {}", fmt::join(errors, "; "));
  auto world = std::make_shared<LocalWorld>();
  std::mutex first_mu;
  std::exception_ptr first;
  auto run_rank = [&](int rank) {
    std::unique_ptr<CommContext> ctx;
    try {
      ctx = make_local_context(world, cfg, rank, options);
      fn(*ctx);
    } catch (const std::exception& e) {
      {
        std::lock_guard lk(first_mu);
        if (!first) first = std::current_exception();
      }
      world->abort(fmt::format("rank {} failed: {}", rank, e.what()));
    } catch (...) {
      {
        std::lock_guard lk(first_mu);
        if (!first) first = std::current_exception();
      }
      world->abort(fmt::format("rank {} failed with a non-standard exception", rank));
    }
    ctx.reset();  // drains the rank's streams; after an abort their ops fail at once
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < cfg.world(); ++r) threads.emplace_back(run_rank, r);
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

void run_local_ranks(int n, const std::function<void(CommContext&)>& fn, const CommOptions& options) {
  DHX_CHECK(n >= 1, ConfigError, "run_local_ranks needs n >= 1, got {}", n);
  LayoutConfig cfg;
  cfg.dp = n;
  run_local_ranks(cfg, fn, options);
}

}  // namespace dhelix
