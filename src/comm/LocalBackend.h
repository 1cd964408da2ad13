// The local backend: N threads of one process act as N ranks; each group's ops meet in a
// shared-memory rendezvous keyed by (group, seq), with the MPI backend's semantics (issue order per
// group, non-blocking send/recv, bounded waits). For unit tests without mpirun; not for speed.
#pragma once
#include <functional>

#include "comm/CommContext.h"

namespace dhelix {

// Runs fn(ctx) on one thread per rank of `layout` and returns when all finished. The first
// exception any rank throws stops the others (their pending ops fail with CommError) and is
// rethrown here, unchanged, after every thread joined.
void run_local_ranks(const LayoutConfig& layout, const std::function<void(CommContext&)>& fn,
                     const CommOptions& options = {});
// Same with layout dp = n.
void run_local_ranks(int n, const std::function<void(CommContext&)>& fn, const CommOptions& options = {});

}  // namespace dhelix
