// Open MPI process groups. Ops run on the group's comm thread, in issue order. With the gloo
// transport (the default) every op moves its data over the group's GlooTransport, whose mesh Open
// MPI bootstraps; send/recv are posted in issue order and each is completed by a waiter thread
// blocked in Gloo (so a rank may send and receive with the same peer without deadlock, and
// nothing spins). With the mpi transport every op runs on the group's own communicator: Open
// MPI's non-blocking collectives completed by a test loop, send/recv as MPI_Isend/MPI_Irecv
// completed by the thread's poll (MPI_Testsome); bf16 reduces with user ops (f32 arithmetic,
// bf16 on the wire).
#include "comm/MpiBackend.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include <exception>
#include <mutex>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include <fmt/ranges.h>

#include "base/Clock.h"
#include "base/Error.h"
#include <gloo/transport/unbound_buffer.h>

#include <condition_variable>

#include "comm/GlooTransport.h"
#include "comm/Reduce.h"

namespace dhelix {
namespace {

constexpr int kP2PTag = 7;

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError(fmt::format("{} failed: {}", what, std::string(text, static_cast<size_t>(len))));
}

template <ReduceOp kOp>
void bf16_user_op(void* in, void* inout, int* len, MPI_Datatype*) {
  bf16_combine(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len, kOp);
}

// Process-wide MPI state shared by the groups of one world: init ownership and the bf16 ops.
struct MpiRuntime {
  bool owns_init = false;
  MPI_Op bf16_ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // indexed by ReduceOp

  explicit MpiRuntime(bool owns) : owns_init(owns) {
    mpi_check(MPI_Op_create(&bf16_user_op<ReduceOp::kSum>, 1, &bf16_ops[0]), "MPI_Op_create(bf16 sum)");
    mpi_check(MPI_Op_create(&bf16_user_op<ReduceOp::kMax>, 1, &bf16_ops[1]), "MPI_Op_create(bf16 max)");
    mpi_check(MPI_Op_create(&bf16_user_op<ReduceOp::kMin>, 1, &bf16_ops[2]), "MPI_Op_create(bf16 min)");
  }
  ~MpiRuntime();
};

// What abort_world() needs: the live context make_mpi_world made, or — once an exception destroyed
// it — the rank and last collective it left behind.
struct ActiveWorld {
  std::mutex mu;
  CommContext* ctx = nullptr;
  bool left_by_exception = false;
  int rank = -1;
  std::string last_collective;
};
ActiveWorld g_active;
// Whether dhelix (not the embedding program) called MPI_Init_thread, and so must finalise.
std::atomic<bool> g_dhelix_initialised_mpi{false};

MpiRuntime::~MpiRuntime() {
  for (MPI_Op& op : bf16_ops)
    if (op != MPI_OP_NULL) MPI_Op_free(&op);
  if (owns_init) MPI_Finalize();
}

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kU16: return MPI_UINT16_T;
    case DType::kBF16: return MPI_UINT16_T;  // reduced only through MpiRuntime::bf16_ops
  }
  return MPI_DATATYPE_NULL;
}

int mpi_count(int64_t n, const WorkState& st) {
  DHX_CHECK(n >= 0 && n <= INT_MAX, CommError, "{}: {} elements exceed MPI's int count", st.describe(), n);
  return static_cast<int>(n);
}

// Completes a non-blocking collective from the comm thread. Open MPI progresses it only inside
// MPI calls, and its blocking collectives busy-poll a core that the compute thread needs (2 cores,
// 2 ranks per machine here), so the thread tests with a short yield-then-sleep backoff instead.
// Sleep between tests once the op has not finished quickly: poll_us (comm.mpi_poll_us, default
// 200 us, clamped to [1, 100000]). Each test drives Open MPI's progress (the TCP transport moves
// data only inside MPI calls); 200 us moves at most ~25 KB at 1 Gbit/s, well inside a socket
// buffer, and keeps the thread from waking thousands of times a second on cores the compute
// threads need.
void wait_request(MPI_Request& req, const char* what, int poll_us) {
  const int sleep_us = std::clamp(poll_us, 1, 100000);
  int done = 0;
  for (int spins = 0;; ++spins) {
    mpi_check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    if (spins < 16)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 64 ? 20 : sleep_us));
  }
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  MpiProcessGroup(MPI_Comm comm, std::shared_ptr<MpiRuntime> rt, const std::string& role, int world_rank,
                  const CommOptions& options)
      : ProcessGroup(role, comm_rank(comm), comm_size(comm), world_rank, options.timeout_s),
        comm_(comm),
        rt_(std::move(rt)),
        poll_us_(options.mpi_poll_us) {
    mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    if (size() > 1 && options.transport == CommTransport::kGloo)
      gloo_ = std::make_unique<GlooTransport>(
          rank(), size(), name(),
          [this](const void* mine, void* all, size_t bytes) {
            mpi_check(MPI_Allgather(mine, static_cast<int>(bytes), MPI_BYTE, all, static_cast<int>(bytes), MPI_BYTE,
                                    comm_),
                      "MPI_Allgather(gloo rendezvous)");
          },
          options);
    start_stream(options.nice, [this] { return poll(); });
  }
  std::string transport() const override { return gloo_ ? "gloo " + gloo_->address() : "mpi"; }
  ~MpiProcessGroup() override {
    stop_stream();
    {
      // Posted send/recvs still in Gloo: their waiters end when the ops do (or time out).
      std::unique_lock lk(waiters_mu_);
      waiters_cv_.wait_for(lk, std::chrono::duration<double>(timeout_s() + 5), [&] { return waiters_ == 0; });
    }
    MPI_Comm_free(&comm_);
  }

 protected:
  Task all_reduce_task(Tensor t, ReduceOp op) override {
    return [this, t, op](const std::shared_ptr<WorkState>& st) {
      if (gloo_) {
        gloo_->all_reduce(t.raw(), t.numel(), t.dtype(), op);
        return true;
      }
      MPI_Request req;
      mpi_check(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), mpi_count(t.numel(), *st), mpi_type(t.dtype()),
                               mpi_op(t.dtype(), op), comm_, &req),
                "MPI_Iallreduce");
      wait_request(req, "MPI_Iallreduce", poll_us_);
      return true;
    };
  }
  Task all_gather_task(Tensor in, Tensor out) override {
    return [this, in, out](const std::shared_ptr<WorkState>& st) {
      if (gloo_) {
        gloo_->all_gather(in.raw(), out.raw(), in.numel(), in.dtype());
        return true;
      }
      int n = mpi_count(in.numel(), *st);
      MPI_Request req;
      mpi_check(MPI_Iallgather(in.raw(), n, mpi_type(in.dtype()), out.raw(), n, mpi_type(in.dtype()), comm_, &req),
                "MPI_Iallgather");
      wait_request(req, "MPI_Iallgather", poll_us_);
      return true;
    };
  }
  Task reduce_scatter_task(Tensor in, Tensor out, ReduceOp op) override {
    return [this, in, out, op](const std::shared_ptr<WorkState>& st) {
      if (gloo_) {
        gloo_->reduce_scatter(in.raw(), out.raw(), out.numel(), in.dtype(), op);
        return true;
      }
      MPI_Request req;
      mpi_check(MPI_Ireduce_scatter_block(in.raw(), out.raw(), mpi_count(out.numel(), *st), mpi_type(in.dtype()),
                                          mpi_op(in.dtype(), op), comm_, &req),
                "MPI_Ireduce_scatter_block");
      wait_request(req, "MPI_Ireduce_scatter_block", poll_us_);
      return true;
    };
  }
  Task all_to_all_task(Tensor in, Tensor out) override {
    return [this, in, out](const std::shared_ptr<WorkState>& st) {
      if (gloo_) {
        gloo_->all_to_all(in.raw(), out.raw(), in.numel() / size(), in.dtype());
        return true;
      }
      int n = mpi_count(in.numel() / size(), *st);
      MPI_Request req;
      mpi_check(MPI_Ialltoall(in.raw(), n, mpi_type(in.dtype()), out.raw(), n, mpi_type(in.dtype()), comm_, &req),
                "MPI_Ialltoall");
      wait_request(req, "MPI_Ialltoall", poll_us_);
      return true;
    };
  }
  Task all_to_all_v_task(Tensor in, std::vector<int64_t> send, Tensor out, std::vector<int64_t> recv) override {
    return [this, in, send, out, recv](const std::shared_ptr<WorkState>& st) {
      if (gloo_) {
        gloo_->all_to_all_v(in.raw(), send, out.raw(), recv, in.dtype());
        return true;
      }
      std::vector<int> sc(send.size()), rc(recv.size()), sd(send.size()), rd(recv.size());
      int64_t so = 0, ro = 0;
      for (size_t j = 0; j < send.size(); ++j) {
        sc[j] = mpi_count(send[j], *st), rc[j] = mpi_count(recv[j], *st);
        sd[j] = mpi_count(so, *st), rd[j] = mpi_count(ro, *st);
        so += send[j], ro += recv[j];
      }
      MPI_Request req;
      mpi_check(MPI_Ialltoallv(in.raw(), sc.data(), sd.data(), mpi_type(in.dtype()), out.raw(), rc.data(), rd.data(),
                               mpi_type(in.dtype()), comm_, &req),
                "MPI_Ialltoallv");
      wait_request(req, "MPI_Ialltoallv", poll_us_);
      return true;
    };
  }
  Task broadcast_task(Tensor t, int root) override {
    return [this, t, root](const std::shared_ptr<WorkState>& st) {
      if (gloo_) {
        gloo_->broadcast(t.raw(), t.numel(), t.dtype(), root);
        return true;
      }
      MPI_Request req;
      mpi_check(MPI_Ibcast(t.raw(), mpi_count(t.numel(), *st), mpi_type(t.dtype()), root, comm_, &req), "MPI_Ibcast");
      wait_request(req, "MPI_Ibcast", poll_us_);
      return true;
    };
  }
  Task barrier_task() override {
    return [this](const std::shared_ptr<WorkState>&) {
      if (gloo_) {
        gloo_->barrier();
        return true;
      }
      // Non-blocking plus the test loop, as the other collectives: a blocking MPI_Barrier spins a
      // whole core (even with mpi_yield_when_idle) while a slower rank is still computing.
      MPI_Request req;
      mpi_check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier");
      wait_request(req, "MPI_Ibarrier", poll_us_);
      return true;
    };
  }
  Task send_task(Tensor t, int peer, int tag) override {
    return [this, t, peer, tag](const std::shared_ptr<WorkState>& st) {
      if (gloo_) {
        wait_in_background(gloo_->post_send(t.raw(), t.nbytes(), peer, static_cast<uint64_t>(tag)), true, st, t);
        return false;
      }
      MPI_Request req;
      mpi_check(MPI_Isend(t.raw(), mpi_count(t.numel(), *st), mpi_type(t.dtype()), peer, kP2PTag + tag, comm_, &req),
                "MPI_Isend");
      posted_.push_back(Posted{req, st, t, -1});
      return false;
    };
  }
  Task recv_task(Tensor t, int peer, int tag) override {
    return [this, t, peer, tag](const std::shared_ptr<WorkState>& st) {
      if (gloo_) {
        wait_in_background(gloo_->post_recv(t.raw(), t.nbytes(), peer, static_cast<uint64_t>(tag)), false, st, t);
        return false;
      }
      MPI_Request req;
      int n = mpi_count(t.numel(), *st);
      mpi_check(MPI_Irecv(t.raw(), n, mpi_type(t.dtype()), peer, kP2PTag + tag, comm_, &req), "MPI_Irecv");
      posted_.push_back(Posted{req, st, t, n});
      return false;
    };
  }

 private:
  static int comm_rank(MPI_Comm c) {
    int r = 0;
    MPI_Comm_rank(c, &r);
    return r;
  }
  static int comm_size(MPI_Comm c) {
    int s = 0;
    MPI_Comm_size(c, &s);
    return s;
  }
  MPI_Op mpi_op(DType d, ReduceOp op) const {
    if (d == DType::kBF16) return rt_->bf16_ops[static_cast<int>(op)];
    switch (op) {
      case ReduceOp::kSum: return MPI_SUM;
      case ReduceOp::kMax: return MPI_MAX;
      case ReduceOp::kMin: return MPI_MIN;
    }
    return MPI_OP_NULL;
  }

  // A posted Gloo send or recv completes in Gloo's event loop; a waiter thread per op blocks until
  // then and completes the op's Work (so ops finish in any order, and a late one never holds back
  // another). A failure or timeout fails the Work with Gloo's reason.
  void wait_in_background(std::unique_ptr<gloo::transport::UnboundBuffer> buf, bool send,
                          std::shared_ptr<WorkState> st, Tensor keep_alive) {
    {
      std::lock_guard lk(waiters_mu_);
      ++waiters_;
    }
    const auto timeout = gloo_->timeout();
    std::thread([this, b = std::move(buf), send, st = std::move(st), t = std::move(keep_alive), timeout]() mutable {
      std::string error;
      try {
        if (send) b->waitSend(timeout);
        else b->waitRecv(timeout);
      } catch (const std::exception& e) {
        error = fmt::format("gloo {} failed: {}", send ? "send" : "recv", gloo_->explain(e.what()));
      }
      b.reset();
      t = Tensor();  // release our reference before the waiter can see the op finish
      if (error.empty()) st->complete();
      else st->fail(error);
      std::lock_guard lk(waiters_mu_);
      --waiters_;
      waiters_cv_.notify_all();
    }).detach();
  }

  // Completes finished posted send/recvs; true while some are still outstanding. Stream thread only.
  bool poll() {
    if (posted_.empty()) return false;
    std::vector<MPI_Request> reqs;
    for (const Posted& p : posted_) reqs.push_back(p.req);
    std::vector<int> done(reqs.size());
    std::vector<MPI_Status> statuses(reqs.size());
    int count = 0;
    int rc = MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &count, done.data(), statuses.data());
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
      for (Posted& p : posted_) p.state->fail(fmt::format("MPI_Testsome failed (code {})", rc));
      posted_.clear();
      return false;
    }
    if (count == MPI_UNDEFINED || count == 0) return true;
    std::vector<char> finished(posted_.size(), 0);
    for (int k = 0; k < count; ++k) {
      size_t i = static_cast<size_t>(done[static_cast<size_t>(k)]);
      finished[i] = 1;
      finish(posted_[i], statuses[static_cast<size_t>(k)], rc == MPI_ERR_IN_STATUS);
    }
    std::vector<Posted> rest;
    for (size_t i = 0; i < posted_.size(); ++i)
      if (!finished[i]) rest.push_back(std::move(posted_[i]));
    posted_ = std::move(rest);
    return !posted_.empty();
  }

  struct Posted {
    MPI_Request req;
    std::shared_ptr<WorkState> state;
    Tensor keep_alive;
    int expect = -1;  // recv: elements expected; send: -1
  };

  void finish(Posted& p, const MPI_Status& status, bool check_error) {
    std::string error;
    if (check_error && status.MPI_ERROR != MPI_SUCCESS) {
      error = fmt::format("MPI error code {}", status.MPI_ERROR);
    } else if (p.expect >= 0) {
      int got = 0;
      MPI_Get_count(&status, mpi_type(p.keep_alive.dtype()), &got);
      if (got != p.expect) error = fmt::format("received {} elements, expected {}", got, p.expect);
    }
    p.keep_alive = Tensor();  // release our reference before the waiter can see the op finish
    if (error.empty())
      p.state->complete();
    else
      p.state->fail(error);
  }

  MPI_Comm comm_;
  std::shared_ptr<MpiRuntime> rt_;
  int poll_us_;  // wait_request's sleep (comm.mpi_poll_us)
  std::unique_ptr<GlooTransport> gloo_;  // every op's data path; null: Open MPI's (the mpi transport)
  std::vector<Posted> posted_;
  std::mutex waiters_mu_;
  std::condition_variable waiters_cv_;
  int waiters_ = 0;  // Gloo send/recv waiter threads still running
};

void mpi_abort_with(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void init_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  DHX_CHECK(!finalized, CommError, "MPI was already finalised; one MPI world per process");
  int inited = 0, provided = 0;
  MPI_Initialized(&inited);
  if (inited) {
    MPI_Query_thread(&provided);
  } else {
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    g_dhelix_initialised_mpi.store(true);
  }
  DHX_CHECK(provided == MPI_THREAD_MULTIPLE, CommError,
            "MPI provides thread level {} but dhelix's comm threads need MPI_THREAD_MULTIPLE ({})", provided,
            MPI_THREAD_MULTIPLE);
}

// Completes `req` or gives up at `deadline` (false), with wait_request's backoff.
bool wait_request_until(MPI_Request& req, double deadline, const char* what) {
  int done = 0;
  for (int spins = 0;; ++spins) {
    mpi_check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
    if (done) return true;
    if (now_seconds() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 64 ? 20 : 1000));
  }
}

// Every rank of the world checks in with rank 0 before any collective: rank 0 names the ranks
// that did not arrive within timeout_s (a rank stuck or started late), the others give up with
// a message saying so, instead of every rank waiting forever in the first blocking collective.
constexpr int kJoinTag = 31000;
void await_world(int rank, int size, double timeout_s) {
  const double deadline = now_seconds() + timeout_s;
  if (rank == 0) {
    std::vector<int> hello(static_cast<size_t>(size));
    std::vector<MPI_Request> reqs(static_cast<size_t>(size), MPI_REQUEST_NULL);
    for (int r = 1; r < size; ++r)
      mpi_check(MPI_Irecv(&hello[r], 1, MPI_INT, r, kJoinTag, MPI_COMM_WORLD, &reqs[r]), "MPI_Irecv(join)");
    std::vector<int> missing;
    for (int r = 1; r < size; ++r)
      if (!wait_request_until(reqs[r], deadline, "MPI_Test(join)")) missing.push_back(r);
    if (!missing.empty())
      throw CommError(fmt::format("rank{} {} of the world did not join within {:.3g} s (comm.timeout_s): started "
                                  "late, stuck before its first collective, or gone",
                                  missing.size() == 1 ? "" : "s", fmt::join(missing, ", "), timeout_s));
  } else {
    int hello = rank;
    mpi_check(MPI_Send(&hello, 1, MPI_INT, 0, kJoinTag, MPI_COMM_WORLD), "MPI_Send(join)");
  }
  MPI_Request barrier;
  mpi_check(MPI_Ibarrier(MPI_COMM_WORLD, &barrier), "MPI_Ibarrier(join)");
  DHX_CHECK(wait_request_until(barrier, now_seconds() + timeout_s, "MPI_Test(join barrier)"), CommError,
            "rank {}: the world did not assemble within {:.3g} s (comm.timeout_s); rank 0 names the ranks missing",
            rank, timeout_s);
}

}  // namespace

bool launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK"); }

int mpi_world_size() {
  init_mpi();
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

std::vector<int64_t> mpi_world_allgather(int64_t value) {
  const int n = mpi_world_size();
  std::vector<int64_t> all(static_cast<size_t>(n));
  mpi_check(MPI_Allgather(&value, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, MPI_COMM_WORLD), "MPI_Allgather(start-up)");
  return all;
}

void mpi_finalize_early() {
  {
    std::lock_guard lk(g_active.mu);
    if (g_active.ctx != nullptr) return;
  }
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized && g_dhelix_initialised_mpi.load()) MPI_Finalize();
}

std::unique_ptr<CommContext> make_mpi_world(const LayoutConfig& cfg, const CommOptions& options) {
  init_mpi();
  {
    std::lock_guard lk(g_active.mu);
    DHX_CHECK(g_active.ctx == nullptr, CommError, "make_mpi_world called twice; one MPI world per process");
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Before anything that finalises MPI on the way out (MPI_Finalize waits for every rank, the
  // missing one too): a rank that does not join ends the job at once.
  try {
    await_world(rank, size, options.timeout_s);
  } catch (const CommError& e) {
    // Rank 0's words about others ("rank 1 of the world did not join") get its own name in front;
    // one that already starts with it ("rank 0: the world did not assemble") is passed as it is.
    const std::string what = e.what();
    mpi_abort_with(rank == 0 && what.rfind("rank 0:", 0) != 0 ? fmt::format("rank 0: {}", what) : what);
  }
  auto rt = std::make_shared<MpiRuntime>(g_dhelix_initialised_mpi.load());
  // The job's arrival board: rank 0's random token names the shared-memory files of this job.
  uint64_t token = 0;
  if (rank == 0) token = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ static_cast<uint64_t>(::getpid()) ^
                         static_cast<uint64_t>(now_seconds() * 1e6);
  mpi_check(MPI_Bcast(&token, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast(job token)");
  auto board = std::make_shared<ProgressBoard>(token, rank);
  auto errors = validate_layout(cfg, size);
  DHX_CHECK(errors.empty(), ConfigError, "layout does not fit the MPI world (rank {}): {}\nhint: launch with mpirun -np {}",
            rank, fmt::join(errors, "; "), cfg.world());
  Layout layout(cfg, rank);

  CommContext::RoleGroups groups;
  for (GroupRole role : all_group_roles()) {
    auto all = layout.all_groups(role);
    int color = -1, key = -1;
    for (size_t gi = 0; gi < all.size(); ++gi)
      for (size_t pos = 0; pos < all[gi].size(); ++pos)
        if (all[gi][pos] == rank) color = static_cast<int>(gi), key = static_cast<int>(pos);
    DHX_ASSERT(color >= 0, "rank {} is in no {} group", rank, group_role_name(role));
    MPI_Comm comm;
    mpi_check(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm), "MPI_Comm_split");
    groups[static_cast<size_t>(role)] =
        std::make_unique<MpiProcessGroup>(comm, rt, group_role_name(role), rank, options);
    groups[static_cast<size_t>(role)]->set_progress_board(board, static_cast<int>(role), all[static_cast<size_t>(color)]);
  }
  MPI_Comm world_comm;
  mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &world_comm), "MPI_Comm_dup");
  auto world = std::make_unique<MpiProcessGroup>(world_comm, rt, "world", rank, options);
  std::vector<int> everyone(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) everyone[static_cast<size_t>(r)] = r;
  world->set_progress_board(board, ProgressBoard::kSlots - 1, everyone);
  auto teardown = [rank](const std::string& last) {
    std::lock_guard lk(g_active.mu);
    g_active.ctx = nullptr;
    if (std::uncaught_exceptions() == 0) return false;
    g_active.left_by_exception = true;
    g_active.rank = rank;
    g_active.last_collective = last;
    return true;
  };
  auto ctx = std::make_unique<CommContext>("mpi", std::move(layout), std::move(groups), std::move(world),
                                           mpi_abort_with, rt, teardown);
  std::lock_guard lk(g_active.mu);
  g_active.ctx = ctx.get();
  return ctx;
}

void abort_world(const std::string& why) {
  std::unique_lock lk(g_active.mu);
  if (CommContext* ctx = g_active.ctx) {
    lk.unlock();
    ctx->abort(why);
  }
  if (g_active.left_by_exception)
    mpi_abort_with(fmt::format("rank {}: {}; last collective: {}", g_active.rank, why, g_active.last_collective));
  int inited = 0, finalized = 0, rank = -1;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    mpi_abort_with(fmt::format("rank {}: {}; last collective: none", rank, why));
  }
  std::fprintf(stderr, "rank ?: %s; last collective: none\n", why.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace dhelix
