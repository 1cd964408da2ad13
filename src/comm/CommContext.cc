// CommContext: group lookup, blame for abort messages, and the transport names.
#include "comm/CommContext.h"

#include "base/Error.h"

namespace dhelix {

const char* comm_transport_name(CommTransport t) { return t == CommTransport::kGloo ? "gloo" : "mpi"; }

CommTransport parse_comm_transport(const std::string& name) {
  if (name == "gloo") return CommTransport::kGloo;
  if (name == "mpi") return CommTransport::kMpi;
  throw ConfigError(fmt::format("comm.transport=\"{}\" is not a transport; use gloo (default) or mpi", name));
}

CommContext::CommContext(std::string backend, Layout layout, RoleGroups groups, std::unique_ptr<ProcessGroup> world,
                         AbortFn abort_fn, std::shared_ptr<void> backend_state, TeardownFn teardown_fn)
    : backend_state_(std::move(backend_state)),
      backend_(std::move(backend)),
      layout_(std::move(layout)),
      groups_(std::move(groups)),
      world_(std::move(world)),
      abort_fn_(std::move(abort_fn)),
      teardown_fn_(std::move(teardown_fn)) {
  for (size_t i = 0; i < groups_.size(); ++i) DHX_ASSERT(groups_[i] != nullptr, "group {} missing", i);
  DHX_ASSERT(world_ != nullptr, "world group missing");
}

CommContext::~CommContext() {
  if (teardown_fn_ && teardown_fn_(last_collective())) {
    // Deliberate leak: the process is about to abort; joining threads stuck in MPI would hang.
    (void)world_.release();
    for (auto& g : groups_) (void)g.release();
    new std::shared_ptr<void>(std::move(backend_state_));  // keeps MPI unfinalised
    return;
  }
  world_.reset();
  for (auto& g : groups_) g.reset();
}

ProcessGroup& CommContext::group(GroupRole role) { return *groups_.at(static_cast<size_t>(role)); }

std::string CommContext::last_collective() const {
  std::shared_ptr<WorkState> oldest_open, newest;
  auto consider = [&](const ProcessGroup& g) {
    auto s = g.blame();
    if (!s) return;
    if (!s->is_completed() && (!oldest_open || s->issue_time() < oldest_open->issue_time())) oldest_open = s;
    if (!newest || s->issue_time() > newest->issue_time()) newest = s;
  };
  for (const auto& g : groups_) consider(*g);
  consider(*world_);
  if (oldest_open) return oldest_open->describe() + " (unfinished)";
  return newest ? newest->describe() : "none";
}

void CommContext::abort(const std::string& why) {
  abort_fn_(fmt::format("rank {}: {}; last collective: {}", rank(), why, last_collective()));
  std::abort();  // an AbortFn that returns is a bug
}

}  // namespace dhelix
