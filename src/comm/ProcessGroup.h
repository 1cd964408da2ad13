// ProcessGroup: one rank's handle on one group of ranks (a tp, dp, cp, ep, pp or world group).
// Every op takes tensor views (counts come from the views), checks shapes here once, gets the
// next sequence number and is queued on the group's CommStream; backends only say how to run it.
// Not here: MPI or thread rendezvous (MpiBackend.cc, LocalBackend.cc), which groups exist (CommContext).
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/CommStream.h"
#include "comm/ProgressBoard.h"
#include "comm/Work.h"
#include "tensor/Tensor.h"

namespace dhelix {

enum class ReduceOp { kSum, kMax, kMin };
const char* reduce_op_name(ReduceOp op);  // "sum", "max", "min"

class ProcessGroup {
 public:
  // role: "tp", "dp", ..., "world"; name() becomes "tp[1/2]".
  ProcessGroup(const std::string& role, int rank, int size, int world_rank, double timeout_s);
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int world_rank() const { return world_rank_; }
  const std::string& name() const { return name_; }

  // t (any shape) is reduced in place across the group.
  Work all_reduce(Tensor t, ReduceOp op = ReduceOp::kSum);
  // out.dim0 = size * in.dim0; out rows [r*in.dim0, (r+1)*in.dim0) come from group rank r.
  Work all_gather(const Tensor& in, Tensor out);
  // in.dim0 = size * out.dim0; out = reduction over ranks of their in rows [rank*out.dim0, ...).
  Work reduce_scatter(const Tensor& in, Tensor out, ReduceOp op = ReduceOp::kSum);
  // in and out have one shape with dim0 divisible by size; chunk j of in goes to rank j, and
  // chunk j of out comes from rank j.
  Work all_to_all(const Tensor& in, Tensor out);
  // Uneven all-to-all over rows (dim0): `in` holds send_rows[j] rows for rank j, consecutively in
  // rank order; `out` receives recv_rows[j] rows from rank j likewise. Rows have one size and
  // dtype in both; counts may be zero; sum(send_rows) = in.dim0, sum(recv_rows) = out.dim0, and
  // recv_rows[j] must equal rank j's send_rows[rank] (the caller exchanges counts first).
  Work all_to_all_v(const Tensor& in, std::vector<int64_t> send_rows, Tensor out, std::vector<int64_t> recv_rows);
  // One step of a ring (context parallelism's key/value exchange): `in` goes to group rank
  // (rank + 1) mod size and `out` (in's shape and dtype) receives rank (rank - 1) mod size's `in`.
  Work ring_shift(const Tensor& in, Tensor out);
  Work broadcast(Tensor t, int root);
  // Point-to-point with a group rank; matched by (sender, receiver, tag), in issue order among
  // equal tags. `t` must not change until the send's Work completes. 0 <= tag <= kMaxP2PTag.
  static constexpr int kMaxP2PTag = (1 << 22) - 1;
  Work send(const Tensor& t, int peer, int tag = 0);
  Work recv(Tensor t, int peer, int tag = 0);
  // Queued like any op, then waited for.
  void barrier();

  // How the data moves: "threads" (local backend), "mpi" (Open MPI's transport) or
  // "gloo <listening address>" (GlooTransport); GPU groups: "nccl", "staged over <CPU transport>".
  virtual std::string transport() const = 0;
  // A GPU group's later ops follow the kernels issued on `stream` (a cudaStream_t; null: none, the
  // caller synchronises) before each op is issued. CPU groups read their tensors on the host after
  // the caller's own wait, and ignore it.
  virtual void set_producer_stream(void* stream) { (void)stream; }

  // The sequence number the next op will get (ops on a group are numbered 0, 1, 2, ...).
  int64_t next_seq() const;
  double timeout_s() const;
  void set_timeout_s(double seconds);  // for ops issued from now on
  // Arrival reports: this group publishes the op its comm thread starts in `slot` of `board`, and
  // a timed-out op names the members (world ranks `members`, in group-rank order) whose last
  // started op is older.
  void set_progress_board(std::shared_ptr<ProgressBoard> board, int slot, std::vector<int> members);
  // "group rank 1 (world rank 1) has not started op seq=12 (its last: seq=11)"; "" without a board.
  std::string arrivals(int64_t seq) const;

  // Traffic issued on this group: ops, and the bytes this rank sends under the ring algorithms the
  // transports run, from the tensors each op was issued with (all-reduce 2(n-1)/n of the buffer;
  // all-gather (n-1)/n of the output; reduce-scatter and all-to-all (n-1)/n of the input; broadcast,
  // ring_shift and send the buffer). Zero on a group of one. What the performance model's per-axis volumes are
  // checked against.
  struct Traffic {
    int64_t ops = 0;
    double bytes = 0;
  };
  Traffic traffic() const;
  void reset_traffic();

  // The op to blame in an abort message: the oldest unfinished one, else the last issued
  // (nullptr when nothing was ever issued).
  std::shared_ptr<WorkState> blame() const;

 protected:
  using Task = CommStream::Task;
  // Called by the backend's constructor when its members are ready (the thread may call poll);
  // nice: the comm thread's nice value (CommOptions::nice).
  void start_stream(int nice = kDefaultCommNice, CommStream::Poll poll = {});
  // Called first in the backend's destructor: drains the queue and joins the thread.
  void stop_stream();

  // How to run each op; the tasks run on the stream thread, in issue order.
  virtual Task all_reduce_task(Tensor t, ReduceOp op) = 0;
  virtual Task all_gather_task(Tensor in, Tensor out) = 0;
  virtual Task reduce_scatter_task(Tensor in, Tensor out, ReduceOp op) = 0;
  virtual Task all_to_all_task(Tensor in, Tensor out) = 0;
  // Counts in elements (rows x row size).
  virtual Task all_to_all_v_task(Tensor in, std::vector<int64_t> send_elems, Tensor out,
                                 std::vector<int64_t> recv_elems) = 0;
  // Elements of `in` to (rank + 1) mod size, `out` from (rank - 1) mod size. By default an
  // all-to-all-v with those two counts non-zero.
  virtual Task ring_shift_task(Tensor in, Tensor out);
  virtual Task broadcast_task(Tensor t, int root) = 0;
  virtual Task send_task(Tensor t, int peer, int tag) = 0;
  virtual Task recv_task(Tensor t, int peer, int tag) = 0;
  virtual Task barrier_task() = 0;

 private:
  Work issue(std::string signature, Task task, double ring_bytes = 0);
  void check_peer(const char* op, int peer) const;

  int rank_, size_, world_rank_;
  std::string name_;
  mutable std::mutex mu_;  // orders seq assignment with queueing, so seq order == stream order
  int64_t seq_ = 0;
  Traffic traffic_;
  double timeout_s_;
  std::shared_ptr<WorkState> last_issued_;
  std::unique_ptr<CommStream> stream_;
  std::shared_ptr<ProgressBoard> board_;
  int board_slot_ = -1;
  std::vector<int> members_;
};

}  // namespace dhelix
