// Staged process groups (issue 39): GPU tensors moved by a CPU process group (threads, MPI or Gloo)
// through host memory. The transport for several ranks on one GPU -- NCCL refuses two ranks on one
// device, so ranks as threads of one process sharing its GPU, or processes over Gloo on the
// emulated cluster, move their tensors this way -- and for any GPU without NCCL. Each op:
//
//   issuing thread : records an event on the producer stream (the issuing strand's stream:
//                    staged_set_producer_stream) -- the op must follow the kernels that wrote it
//   comm thread    : waits for that event; copies the op's device input to a host buffer on the
//                    group's own copy stream (the copy engines, not the SMs); runs the same op on
//                    the CPU group and waits for it; copies the result into the device output;
//                    with an emulated link rate, holds the op until bytes / rate has passed since
//                    its input existed (the producer's event passed: the link cannot carry bytes
//                    not yet written; the rank's ring bytes, as ProcessGroup's traffic counts
//                    them); done
//
// Point-to-point ops are posted on the CPU group (a receive and a send of one exchange may be
// issued in either order) and completed by the comm thread's poll. The CPU group must be this
// group's alone: its ops then follow this group's issue order on every member. A slow or dead peer
// is the CPU group's timeout, reported as this group's op (its signature and sequence number).
// Host tensors pass to the CPU group as they are (in this group's order: a step's host-side
// reductions, such as the gradient norm's parts, may share the group with its device tensors).
//
// Only in a CUDA build (DHELIX_HAVE_CUDA); elsewhere make_staged_group throws DeviceError.
#pragma once
#include <memory>

#include "comm/ProcessGroup.h"
#include "tensor/DeviceMemory.h"

namespace dhelix {

struct StagedOptions {
  // The emulated link's rate, bytes per second per rank (0: none, the staging copies and the CPU
  // transport only). An emulation, like the CPU cluster's `tc`: it makes communication take the
  // time a link of that rate would, so that how much of it SI hides can be measured on one GPU.
  double link_bytes_per_s = 0;
};

// This member's group over GPU `device`, moving its tensors with `host` (not owned; it must outlive
// the group and carry no other ops). Role, rank, size, world rank and timeout are host's.
std::unique_ptr<ProcessGroup> make_staged_group(ProcessGroup& host, int device, const StagedOptions& options = {});
// The stream whose kernels write the tensors the group's later ops read (null: none, the caller
// synchronises). InternalError when `group` is not a staged group.
void staged_set_producer_stream(ProcessGroup& group, StreamHandle stream);
// The emulated link's rate from the next op on (StagedOptions::link_bytes_per_s; a benchmark
// switches it between variants). ConfigError for a negative rate; InternalError when `group` is
// not a staged group.
void staged_set_link_rate(ProcessGroup& group, double bytes_per_s);

}  // namespace dhelix
