// SocketRing: the bulk data path of the MPI backend's all-reduce, reduce-scatter and all-gather —
// a ring of TCP connections (each rank connects to its right neighbour and accepts its left one)
// driven with blocking poll(). Open MPI's TCP transport moves bytes only inside MPI calls, so a
// comm thread must either spin (taking a core from compute) or sleep between MPI_Test calls
// (leaving the wire idle); here the kernel wakes the thread exactly when a socket can move data,
// as NCCL's socket transport does. MPI stays the bootstrap (address exchange) and runs every other
// op. Not here: which ops use the ring (MpiBackend.cc), queuing (CommStream).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/ProcessGroup.h"
#include "tensor/Tensor.h"

namespace dhelix {

// How the MPI backend moves collective data: DHELIX_COMM_TRANSPORT = socket (default) | mpi.
// A bad value is a ConfigError.
enum class CommTransport { kSocket, kMpi };
CommTransport comm_transport_from_env();

class SocketRing {
 public:
  // Collective over the ranks of one group: `exchange(mine, all, bytes)` must all-gather `bytes`
  // bytes from every group rank in rank order (the backend passes MPI_Allgather on the group's
  // communicator). `what` names the group in errors ("dp[0/2]"). Throws CommError naming the peer
  // and every address tried when the ring cannot be connected within connect_timeout_s.
  SocketRing(int rank, int size, std::string what,
             const std::function<void(const void* mine, void* all, size_t bytes)>& exchange,
             double connect_timeout_s);
  ~SocketRing();
  SocketRing(const SocketRing&) = delete;
  SocketRing& operator=(const SocketRing&) = delete;

  // Ring algorithms, bandwidth-optimal: every rank sends and receives 2(n-1)/n of the buffer for
  // all_reduce, (n-1)/n for the others. Every rank ends with bitwise the same result. Comm thread
  // only; throw CommError when a peer closes its connection or the socket fails.
  void all_reduce(void* buf, int64_t n, DType dtype, ReduceOp op);
  // in: size * n elements; out: n elements, the reduction of every rank's block `rank`.
  void reduce_scatter(const void* in, void* out, int64_t n, DType dtype, ReduceOp op);
  // in: n elements; out: size * n elements, block r from rank r.
  void all_gather(const void* in, void* out, int64_t n, DType dtype);

  // Which address reached the right neighbour ("127.0.0.1:40123"), for logs and tests.
  const std::string& right_address() const { return right_addr_; }

 private:
  // Sends `sbytes` from `sbuf` to the right while receiving `rbytes` into `rbuf` from the left.
  void exchange_step(const void* sbuf, size_t sbytes, void* rbuf, size_t rbytes);

  int rank_, size_;
  std::string what_;
  int right_fd_ = -1, left_fd_ = -1;
  int rcvlowat_ = 1;  // the left socket's SO_RCVLOWAT as last set
  std::string right_addr_;
  std::vector<char> scratch_;
};

}  // namespace dhelix
