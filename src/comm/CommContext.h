// CommContext: one rank's process groups for a Layout — tp, ep, cp, pp, dp and world — plus the
// abort path. Backends build it: make_mpi_world (MpiBackend.h) or run_local_ranks (LocalBackend.h).
// Not here: which collectives a model needs (parallel/), MPI types.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/ProcessGroup.h"
#include "layout/Layout.h"

namespace dhelix {

// How the MPI backend moves data (comm.transport): gloo (default: Gloo's TCP mesh, bootstrapped by
// Open MPI) or mpi (Open MPI's own transport for every op).
enum class CommTransport { kGloo, kMpi };
const char* comm_transport_name(CommTransport t);  // "gloo", "mpi"
// "gloo" | "mpi" -> the transport; anything else -> ConfigError naming the value.
CommTransport parse_comm_transport(const std::string& name);

// The backend's knobs; the trainer fills them from the [comm] config keys (train/Config.h), whose
// defaults these are.
struct CommOptions {
  double timeout_s = 120.0;  // comm.timeout_s: bound on every Work::wait(), > 0
  CommTransport transport = CommTransport::kGloo;
  // comm.nice: the comm threads' nice value, clamped to [-20, 19]; 0 leaves the default weight.
  // Best effort: without the privilege the threads keep the default weight.
  int nice = kDefaultCommNice;
  int mpi_poll_us = 200;  // comm.mpi_poll_us: mpi transport, sleep between tests of an op in flight
  // comm.max_message_bytes: the largest single message an op hands to Gloo (tests set a small one
  // to exercise the splitting that messages over 2 GiB need).
  int64_t max_message_bytes = int64_t{1} << 30;
  // comm.gloo_host: the address Gloo listens on; empty: loopback when every rank of the group shares
  // one network namespace of one machine, else the first non-loopback IPv4 address.
  std::string gloo_host;
};

class CommContext {
 public:
  // Prints or throws the finished abort message; must not return normally.
  using AbortFn = std::function<void(const std::string& message)>;
  // Called first by the destructor with last_collective(); returns true to leave the groups (and
  // their comm threads, perhaps blocked inside MPI) alive for an abort that is about to follow.
  using TeardownFn = std::function<bool(const std::string& last_collective)>;
  using RoleGroups = std::array<std::unique_ptr<ProcessGroup>, kNumGroupRoles>;  // indexed by GroupRole

  CommContext(std::string backend, Layout layout, RoleGroups groups, std::unique_ptr<ProcessGroup> world,
              AbortFn abort_fn, std::shared_ptr<void> backend_state, TeardownFn teardown_fn = {});
  // Groups first (their comm threads drain), then the backend state — unless teardown_fn asks to
  // leave them (MPI, when destroyed by an exception on its way to abort_world).
  ~CommContext();
  CommContext(const CommContext&) = delete;
  CommContext& operator=(const CommContext&) = delete;

  const std::string& backend() const { return backend_; }  // "mpi" or "local"
  const Layout& layout() const { return layout_; }
  int rank() const { return layout_.rank(); }
  int world_size() const { return layout_.world(); }
  ProcessGroup& group(GroupRole role);
  ProcessGroup& world() { return *world_; }

  // describe() of the oldest unfinished op over all groups, else of the last one issued, else "none".
  std::string last_collective() const;
  // "rank R: <why>; last collective: <last_collective()>", then: MPI prints it and calls
  // MPI_Abort(world, 1); local throws it as CommError (run_local_ranks then stops every rank).
  [[noreturn]] void abort(const std::string& why);

 private:
  std::shared_ptr<void> backend_state_;  // declared first: destroyed last
  std::string backend_;
  Layout layout_;
  RoleGroups groups_;
  std::unique_ptr<ProcessGroup> world_;
  AbortFn abort_fn_;
  TeardownFn teardown_fn_;
};

// Aborts the process's MPI world (the context make_mpi_world made, if any) with the message above,
// so that every rank exits non-zero. Call it from main's catch block: if the exception already
// destroyed the context, its last collective was kept for this message and MPI was left
// unfinalised. Without an MPI world: prints and exits 1. This is the one place a process-wide
// pointer is consulted (the crash path).
[[noreturn]] void abort_world(const std::string& why);

}  // namespace dhelix
