// GlooTransport: one process group's data plane on Gloo (the library PyTorch's CPU collectives
// use): a full mesh of TCP pairs driven by Gloo's event loop, which sleeps until a socket is ready,
// so a comm thread waiting on it does not spin a core. Open MPI stays the launcher and the
// rendezvous: the pairs' addresses are exchanged with the group's MPI_Allgather (the `exchange`
// callback). Collectives run Gloo's own algorithms (ring all-reduce, all-gather, all-to-all(-v),
// broadcast, barrier); reduce-scatter, which Gloo lacks in the block form we need, is a ring on
// Gloo's unbound buffers. Every op splits messages larger than CommOptions::max_message_bytes
// (comm.max_message_bytes: 1 GiB; lower in tests) into pieces. Not here: queuing and sequence numbers (ProcessGroup, CommStream).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/ProcessGroup.h"
#include "tensor/Tensor.h"

namespace gloo {
class Context;
namespace transport {
class UnboundBuffer;
}
}  // namespace gloo

namespace dhelix {

struct CommOptions;

class GlooTransport {
 public:
  // All-gathers `bytes` bytes from every group rank in rank order (MPI_Allgather on the group).
  using Exchange = std::function<void(const void* mine, void* all, size_t bytes)>;
  // Collective over the group. Ranks sharing one network namespace of one machine meet over
  // loopback; otherwise each listens on its first non-loopback IPv4 address (options.gloo_host
  // overrides). Throws CommError naming the group when the mesh cannot be connected within
  // options.timeout_s (e.g. a rank that never joins). options.max_message_bytes bounds each piece.
  GlooTransport(int rank, int size, std::string what, const Exchange& exchange, const CommOptions& options);
  ~GlooTransport();
  GlooTransport(const GlooTransport&) = delete;
  GlooTransport& operator=(const GlooTransport&) = delete;

  // Comm thread only; each throws CommError naming the group and the op when a peer fails, closes
  // its connections or does not take part within the timeout. Every rank ends with bitwise the
  // same result (ring: each block reduced once, by one rank, in a fixed order).
  void all_reduce(void* buf, int64_t n, DType dtype, ReduceOp op);
  // in: size * n elements; out: n elements, the reduction of every rank's block `rank`.
  void reduce_scatter(const void* in, void* out, int64_t n, DType dtype, ReduceOp op);
  // in: n elements; out: size * n elements, block r from rank r.
  void all_gather(const void* in, void* out, int64_t n, DType dtype);
  // in and out: size blocks of n elements; block j of in goes to rank j, block j of out is rank j's.
  void all_to_all(const void* in, void* out, int64_t n, DType dtype);
  // Uneven: send_counts[j] elements to rank j (in consecutive blocks of `in`), recv_counts[j] from
  // rank j (consecutive blocks of `out`).
  void all_to_all_v(const void* in, const std::vector<int64_t>& send_counts, void* out,
                    const std::vector<int64_t>& recv_counts, DType dtype);
  void broadcast(void* buf, int64_t n, DType dtype, int root);
  void barrier();

  // Point-to-point, non-blocking: the returned buffer's waitSend()/waitRecv() completes it. Slots
  // below 2^32 are the caller's tags (Gloo's collectives use slots above).
  std::unique_ptr<gloo::transport::UnboundBuffer> post_send(const void* buf, size_t bytes, int peer, uint64_t slot);
  std::unique_ptr<gloo::transport::UnboundBuffer> post_recv(void* buf, size_t bytes, int peer, uint64_t slot);
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Gloo's error text plus the peer it points at: "(group rank 1 of dp[0/2] exited)" when a peer
  // process of this machine is gone, else the peer whose listening address the text names.
  std::string explain(const std::string& gloo_error) const;

  // Where this rank listens ("127.0.0.1" or its address), for logs and tests.
  const std::string& address() const { return host_; }

 private:
  void check_alive(const char* op) const;
  // Elements per piece so that one piece of `esize`-byte elements (times per_rank_multiplier, for
  // ops whose piece is sent to every rank) stays within max_message_bytes_.
  int64_t piece_elems(size_t esize, int64_t per_rank_multiplier = 1) const;
  template <typename F>
  void run(const char* op, F&& body);

  int rank_, size_;
  std::string what_, host_;
  std::chrono::milliseconds timeout_;
  size_t max_message_bytes_;
  std::shared_ptr<gloo::Context> ctx_;
  std::vector<char> scratch_;  // reduce-scatter's two partial buffers, kept across calls
  uint32_t tag_ = 0;  // Gloo collective tag, advanced per op (stale messages never match a new op)
  std::vector<std::pair<int, int64_t>> same_machine_pids_;  // (group rank, pid) of peers on this machine
  std::vector<std::pair<std::string, int>> peer_addresses_;  // "[ip]:port" of each peer's listener -> group rank
  bool failed_ = false;
  std::string failure_;
};

}  // namespace dhelix
