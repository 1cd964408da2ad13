// NCCL process groups (issue 39): one GPU per rank, each group's collectives on a CUDA stream of
// its own, ordered after the compute stream that produced their inputs by an event recorded when
// the op is issued. Completion is polled on the group's comm thread (the CommStream), which also
// keeps the watchdog: an op still unfinished after the group's timeout, or an asynchronous NCCL
// error (a peer died), aborts the communicator and fails that op and every later one with a
// CommError naming the op, its sequence number and the group -- so a dead GPU rank ends the job as a
// dead CPU rank does. Only in a CUDA build (DHELIX_HAVE_CUDA); elsewhere nccl_available() is false
// and the functions throw DeviceError. The id reaches every member over a CPU group of the same
// members (nccl_id_over). Not here: which groups exist (CommContext).
#pragma once
#include <array>
#include <memory>
#include <string>

#include "comm/ProcessGroup.h"
#include "tensor/DeviceMemory.h"

namespace dhelix {

// ncclUniqueId's 128 bytes: what the bootstrap hands from the group's rank 0 to every member.
struct NcclId {
  std::array<char, 128> bytes{};
};

bool nccl_available();
// A fresh id (rank 0 of a group calls it once, before the group exists on any member).
NcclId nccl_unique_id();

// This rank's handle on a group of `size` ranks, one GPU each (`device`): every member passes the
// same id. Tensors must live on that GPU; f32, bf16, f64, i32 and i64 travel. Point-to-point ops
// match in issue order per peer (NCCL has no tags: both sides must issue a peer's sends and
// receives in one order). transport() is "nccl".
// `max_ctas` > 0 caps the thread blocks (CTAs) each of the group's collective kernels occupies
// (ncclConfig_t::maxCTAs; 0: NCCL's own choice): the SMs a collective takes from the strands'
// kernels beside it -- what DHeLlam caps with libsmctrl, which Hopper does not allow.
std::unique_ptr<ProcessGroup> make_nccl_group(const std::string& role, int rank, int size, int world_rank,
                                              double timeout_s, const NcclId& id, int device, int max_ctas = 0);
// The bootstrap, as c10d's store does it over TCP: `host` is a group over a CPU transport (MPI,
// Gloo, threads) with the same members in the same order; its rank 0 makes the id and broadcasts
// it over `host`, so every member returns the same id. A collective over `host`: every member calls
// it. DeviceError (on rank 0, whose broadcast then never starts: the others time out naming it)
// when NCCL is missing.
NcclId nccl_id_over(ProcessGroup& host);
// This member's NCCL group with `host`'s role, rank and size on GPU `device`, its id bootstrapped
// over `host` (nccl_id_over), its timeout `host`'s; host tensors given to its all-reduce,
// all-gather and broadcast pass through to `host` (nccl_set_host_group), which must outlive it.
std::unique_ptr<ProcessGroup> make_nccl_group_over(ProcessGroup& host, int device, int max_ctas = 0);
// The compute stream whose kernels write the tensors the group's later ops read: each op waits for
// an event recorded on it when the op is issued (null: none, the caller synchronises).
void nccl_set_producer_stream(ProcessGroup& group, StreamHandle stream);
// Host tensors given to `group`'s all-reduce, all-gather and broadcast run on `host` (a CPU group
// of the same members), in `group`'s op order; null (make_nccl_group's default): refused.
void nccl_set_host_group(ProcessGroup& group, ProcessGroup* host);
// The stream a group's ops run on (a consumer's stream may wait on it instead of the host).
StreamHandle nccl_stream(ProcessGroup& group);

}  // namespace dhelix
