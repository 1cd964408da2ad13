// Shape checks, sequence numbering and queuing shared by every backend.
#include "comm/ProcessGroup.h"

#include <optional>

#include "base/Error.h"

namespace dhelix {
namespace {

bool overlaps(const Tensor& a, const Tensor& b) {
  auto* a0 = static_cast<const char*>(a.raw());
  auto* b0 = static_cast<const char*>(b.raw());
  return a.nbytes() && b.nbytes() && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

int64_t row_elems(const Tensor& t) { return t.dim(0) == 0 ? 0 : t.numel() / t.dim(0); }

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

ProcessGroup::ProcessGroup(const std::string& role, int rank, int size, int world_rank, double timeout_s)
    : rank_(rank),
      size_(size),
      world_rank_(world_rank),
      name_(fmt::format("{}[{}/{}]", role, rank, size)),
      timeout_s_(timeout_s) {
  DHX_CHECK(size >= 1 && rank >= 0 && rank < size, InternalError, "group {} rank {} of size {}", role, rank, size);
  DHX_CHECK(timeout_s > 0, ConfigError, "comm timeout {} s must be > 0", timeout_s);
}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::start_stream(int nice, CommStream::Poll poll) {
  stream_ = std::make_unique<CommStream>(name_, nice, std::move(poll));
}

void ProcessGroup::stop_stream() { stream_.reset(); }

int64_t ProcessGroup::next_seq() const {
  std::lock_guard lk(mu_);
  return seq_;
}

double ProcessGroup::timeout_s() const {
  std::lock_guard lk(mu_);
  return timeout_s_;
}

void ProcessGroup::set_timeout_s(double seconds) {
  DHX_CHECK(seconds > 0, ConfigError, "comm timeout {} s must be > 0", seconds);
  std::lock_guard lk(mu_);
  timeout_s_ = seconds;
}

std::shared_ptr<WorkState> ProcessGroup::blame() const {
  std::lock_guard lk(mu_);
  if (stream_) {
    if (auto s = stream_->oldest_unfinished()) return s;
  }
  return last_issued_;
}

void ProcessGroup::set_progress_board(std::shared_ptr<ProgressBoard> board, int slot, std::vector<int> members) {
  std::lock_guard lk(mu_);
  board_ = std::move(board);
  board_slot_ = slot;
  members_ = std::move(members);
}

std::string ProcessGroup::arrivals(int64_t seq) const {
  if (!board_) return "";
  std::vector<std::string> late;
  int unknown = 0;
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    if (r == rank_) continue;
    const std::optional<int64_t> at = board_->read(members_[static_cast<size_t>(r)], board_slot_);
    if (!at) ++unknown;
    else if (*at < seq)
      late.push_back(fmt::format("group rank {} (world rank {}) has not started it (its last: seq={})", r,
                                 members_[static_cast<size_t>(r)], *at));
  }
  std::string out;
  for (const auto& l : late) out += (out.empty() ? "" : "; ") + l;
  if (out.empty() && unknown == 0) out = "every other member started it (one of them is stuck inside it)";
  if (unknown > 0) out += fmt::format("{}{} member(s) on other machines not visible", out.empty() ? "" : "; ", unknown);
  return out;
}

ProcessGroup::Traffic ProcessGroup::traffic() const {
  std::lock_guard lk(mu_);
  return traffic_;
}

void ProcessGroup::reset_traffic() {
  std::lock_guard lk(mu_);
  traffic_ = Traffic{};
}

Work ProcessGroup::issue(std::string signature, Task task, double ring_bytes) {
  std::lock_guard lk(mu_);
  if (size_ > 1) ++traffic_.ops, traffic_.bytes += ring_bytes;
  DHX_ASSERT(stream_ != nullptr, "group {} has no comm stream", name_);
  const int64_t seq = seq_++;
  auto state = std::make_shared<WorkState>(std::move(signature), name_, seq, world_rank_, timeout_s_);
  last_issued_ = state;
  if (board_) {
    state->set_diagnose([this, seq] { return arrivals(seq); });
    // The comm thread publishes the op as it starts it; a transport timeout inside it gets the
    // same arrival report.
    task = [this, seq, inner = std::move(task)](const std::shared_ptr<WorkState>& st) {
      board_->publish(board_slot_, seq);
      try {
        return inner(st);
      } catch (const std::exception& e) {
        const std::string m = e.what();
        if (m.find("imed out") == std::string::npos) throw;
        throw CommError(m + "; " + arrivals(seq));
      }
    };
  }
  stream_->submit(state, std::move(task));
  return Work(std::move(state));
}

void ProcessGroup::check_peer(const char* op, int peer) const {
  DHX_CHECK(peer >= 0 && peer < size_ && peer != rank_, CommError, "{} on {}: peer {} is not another rank of 0..{}",
            op, name_, peer, size_ - 1);
}

Work ProcessGroup::all_reduce(Tensor t, ReduceOp op) {
  DHX_CHECK(t.defined(), CommError, "all_reduce on {}: undefined tensor", name_);
  std::string sig = op == ReduceOp::kSum ? fmt::format("all_reduce {}", t.describe())
                                         : fmt::format("all_reduce({}) {}", reduce_op_name(op), t.describe());
  const double ring = 2.0 * (size_ - 1) / size_ * double(t.nbytes());
  return issue(std::move(sig), all_reduce_task(std::move(t), op), ring);
}

Work ProcessGroup::all_gather(const Tensor& in, Tensor out) {
  DHX_CHECK(in.defined() && out.defined() && in.ndim() >= 1 && out.ndim() >= 1, CommError,
            "all_gather on {}: needs defined tensors with a dim0", name_);
  DHX_CHECK(in.dtype() == out.dtype() && out.dim(0) == size_ * in.dim(0) && row_elems(in) == row_elems(out),
            CommError, "all_gather on {}: out {} must be {} x in {} along dim0", name_, out.describe(), size_,
            in.describe());
  DHX_CHECK(!overlaps(in, out), CommError, "all_gather on {}: in {} and out {} overlap", name_, in.describe(),
            out.describe());
  std::string sig = fmt::format("all_gather {}", in.describe());
  const double ring = double(size_ - 1) / size_ * double(out.nbytes());
  return issue(std::move(sig), all_gather_task(in, std::move(out)), ring);
}

Work ProcessGroup::reduce_scatter(const Tensor& in, Tensor out, ReduceOp op) {
  DHX_CHECK(in.defined() && out.defined() && in.ndim() >= 1 && out.ndim() >= 1, CommError,
            "reduce_scatter on {}: needs defined tensors with a dim0", name_);
  DHX_CHECK(in.dtype() == out.dtype() && in.dim(0) == size_ * out.dim(0) && row_elems(in) == row_elems(out),
            CommError, "reduce_scatter on {}: in {} must be {} x out {} along dim0", name_, in.describe(), size_,
            out.describe());
  DHX_CHECK(!overlaps(in, out), CommError, "reduce_scatter on {}: in {} and out {} overlap", name_, in.describe(),
            out.describe());
  std::string sig = op == ReduceOp::kSum ? fmt::format("reduce_scatter {}", in.describe())
                                         : fmt::format("reduce_scatter({}) {}", reduce_op_name(op), in.describe());
  return issue(std::move(sig), reduce_scatter_task(in, std::move(out), op), double(size_ - 1) / size_ * double(in.nbytes()));
}

Work ProcessGroup::all_to_all(const Tensor& in, Tensor out) {
  DHX_CHECK(in.defined() && out.defined() && in.ndim() >= 1, CommError,
            "all_to_all on {}: needs defined tensors with a dim0", name_);
  DHX_CHECK(in.dtype() == out.dtype() && in.shape() == out.shape() && in.dim(0) % size_ == 0, CommError,
            "all_to_all on {}: in {} and out {} must have one shape with dim0 divisible by {}", name_,
            in.describe(), out.describe(), size_);
  DHX_CHECK(!overlaps(in, out), CommError, "all_to_all on {}: in {} and out {} overlap", name_, in.describe(),
            out.describe());
  std::string sig = fmt::format("all_to_all {}", in.describe());
  return issue(std::move(sig), all_to_all_task(in, std::move(out)), double(size_ - 1) / size_ * double(in.nbytes()));
}

Work ProcessGroup::all_to_all_v(const Tensor& in, std::vector<int64_t> send_rows, Tensor out,
                                std::vector<int64_t> recv_rows) {
  DHX_CHECK(in.defined() && out.defined() && in.ndim() >= 1 && out.ndim() >= 1, CommError,
            "all_to_all_v on {}: needs defined tensors with a dim0", name_);
  const int64_t row = in.dim(0) > 0 ? in.numel() / in.dim(0) : shape_numel(Shape(in.shape().begin() + 1, in.shape().end()));
  const int64_t orow = out.dim(0) > 0 ? out.numel() / out.dim(0) : shape_numel(Shape(out.shape().begin() + 1, out.shape().end()));
  DHX_CHECK(in.dtype() == out.dtype() && row == orow, CommError,
            "all_to_all_v on {}: in {} and out {} need one dtype and row size", name_, in.describe(), out.describe());
  DHX_CHECK(static_cast<int>(send_rows.size()) == size_ && static_cast<int>(recv_rows.size()) == size_, CommError,
            "all_to_all_v on {}: {} send and {} receive counts for {} ranks", name_, send_rows.size(), recv_rows.size(),
            size_);
  int64_t ssum = 0, rsum = 0;
  for (int j = 0; j < size_; ++j) {
    DHX_CHECK(send_rows[j] >= 0 && recv_rows[j] >= 0, CommError, "all_to_all_v on {}: negative count for rank {}",
              name_, j);
    ssum += send_rows[j], rsum += recv_rows[j];
  }
  DHX_CHECK(ssum == in.dim(0) && rsum == out.dim(0), CommError,
            "all_to_all_v on {}: send counts sum to {} rows but in has {}, receive counts to {} but out has {}", name_,
            ssum, in.dim(0), rsum, out.dim(0));
  DHX_CHECK(!overlaps(in, out), CommError, "all_to_all_v on {}: in {} and out {} overlap", name_, in.describe(),
            out.describe());
  for (auto& c : send_rows) c *= row;
  for (auto& c : recv_rows) c *= row;
  // The same on every rank (the local backend compares signatures): the row shape, not the counts.
  std::string sig = fmt::format("all_to_all_v {} rows of {}", dtype_name(in.dtype()), row);
  double sent = 0;  // the elements that leave this rank (counts are in elements here)
  for (int j = 0; j < size_; ++j)
    if (j != rank_) sent += double(send_rows[static_cast<size_t>(j)]);
  sent *= double(dtype_size(in.dtype()));
  return issue(std::move(sig), all_to_all_v_task(in, std::move(send_rows), std::move(out), std::move(recv_rows)), sent);
}

Work ProcessGroup::ring_shift(const Tensor& in, Tensor out) {
  DHX_CHECK(in.defined() && out.defined() && in.ndim() >= 1 && in.dtype() == out.dtype() && in.shape() == out.shape(),
            CommError, "ring_shift on {}: in {} and out {} need one dtype and shape", name_, in.describe(), out.describe());
  DHX_CHECK(!overlaps(in, out), CommError, "ring_shift on {}: in {} and out {} overlap", name_, in.describe(),
            out.describe());
  std::string sig = fmt::format("ring_shift {}", in.describe());
  const double sent = size_ > 1 ? double(in.nbytes()) : 0.0;
  return issue(std::move(sig), ring_shift_task(in, std::move(out)), sent);
}

ProcessGroup::Task ProcessGroup::ring_shift_task(Tensor in, Tensor out) {
  // One step of a ring: every element to the next rank, from the previous (an all-to-all-v whose
  // only non-zero counts are those two peers; for two ranks they are the same peer).
  std::vector<int64_t> send(static_cast<size_t>(size_), 0), recv(static_cast<size_t>(size_), 0);
  send[static_cast<size_t>((rank_ + 1) % size_)] = in.numel();
  recv[static_cast<size_t>((rank_ + size_ - 1) % size_)] = out.numel();
  return all_to_all_v_task(std::move(in), std::move(send), std::move(out), std::move(recv));
}

Work ProcessGroup::broadcast(Tensor t, int root) {
  DHX_CHECK(t.defined(), CommError, "broadcast on {}: undefined tensor", name_);
  DHX_CHECK(root >= 0 && root < size_, CommError, "broadcast on {}: root {} outside 0..{}", name_, root, size_ - 1);
  std::string sig = fmt::format("broadcast(root={}) {}", root, t.describe());
  const double bytes = double(t.nbytes());
  return issue(std::move(sig), broadcast_task(std::move(t), root), bytes);
}

Work ProcessGroup::send(const Tensor& t, int peer, int tag) {
  DHX_CHECK(t.defined(), CommError, "send on {}: undefined tensor", name_);
  check_peer("send", peer);
  DHX_CHECK(tag >= 0 && tag <= kMaxP2PTag, CommError, "send on {}: tag {} outside [0, {}]", name_, tag, kMaxP2PTag);
  std::string sig = fmt::format("send(to={}{}) {}", peer, tag ? fmt::format(" tag={}", tag) : "", t.describe());
  return issue(std::move(sig), send_task(t, peer, tag), double(t.nbytes()));
}

Work ProcessGroup::recv(Tensor t, int peer, int tag) {
  DHX_CHECK(t.defined(), CommError, "recv on {}: undefined tensor", name_);
  check_peer("recv", peer);
  DHX_CHECK(tag >= 0 && tag <= kMaxP2PTag, CommError, "recv on {}: tag {} outside [0, {}]", name_, tag, kMaxP2PTag);
  // before t is moved
  std::string sig = fmt::format("recv(from={}{}) {}", peer, tag ? fmt::format(" tag={}", tag) : "", t.describe());
  return issue(std::move(sig), recv_task(std::move(t), peer, tag));
}

void ProcessGroup::barrier() { issue("barrier", barrier_task()).wait(); }

}  // namespace dhelix
