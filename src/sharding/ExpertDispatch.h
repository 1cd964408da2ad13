// Expert parallelism's conjugate pair for the Mixture-of-Experts MLP: dispatch (rows to the ranks
// holding their experts, an all-to-all over "ep") and combine (back, gate-weighted), forward and
// backward, around the router and the grouped expert GEMMs. Comm-free: the all-to-alls are ops on
// group "ep"; with ep = 1 the MLP is the single-rank one. Reads Megatron's context (TpRegion.h).
#pragma once
#include <vector>

#include "plan/Program.h"
#include "sharding/TpRegion.h"

namespace dhelix::sharding {

// --- the Mixture-of-Experts MLP (dropless top-k routing over stacked SwiGLU experts) -------------
// It reads `in` [Ns, C] (the norm's output: this rank's tokens, the sequence shard under tp) and
// writes `out`; backward reads d_out and writes d_in. Under tp each rank routes its sequence shard and the router's statistics are summed
// over tp. Under expert parallelism (ep = G > 1) this rank holds E / G whole experts: the token
// counts per expert are exchanged first (an even all-to-all), then the rows themselves (an uneven
// all-to-all over ep) go to the ranks holding their experts and come back after the expert GEMMs;
// backward moves the gradients the same two ways. The expert ops' costs assume balanced routing.
//   fwd: router -> route (softmax, top-k, gates, grouping by expert, statistics) -> dispatch (rows by
//        expert) [-> counts a2a -> rows a2a -> regroup by local expert] -> grouped up-GEMM -> SwiGLU ->
//        grouped down-GEMM [-> regroup by rank -> rows a2a back] -> aux -> combine (gate-weighted sum)
//   bwd: the reverse; the router's input gradient and the dispatch's sum into d_in.
void moe_fwd(const TpRegion& b, std::vector<Op>& f, const std::string& in, const std::string& out);
void moe_bwd(const TpRegion& b, std::vector<Op>& g, const std::string& in, const std::string& d_out,
             const std::string& d_in);

}  // namespace dhelix::sharding
