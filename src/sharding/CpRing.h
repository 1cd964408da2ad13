// Context parallelism's ring: causal attention over the "cp" group as ring steps, the keys and
// values (forward) and their gradients (backward) passed round as send_recv ops. Comm-free: the
// lowering writes the steps, the executor moves the buffers. Reads Megatron's context (TpRegion.h);
// the attention kernels' math is in kernels/.
#pragma once
#include <string>
#include <vector>

#include "plan/Program.h"
#include "sharding/TpRegion.h"

namespace dhelix::sharding {

// Each rank holds two of the sequence's 2cp chunks (r and 2cp-1-r: B * Tl local rows, Tl = T / cp).
// The keys and values travel the ring: ring step i computes this rank's queries against the
// keys/values of rank (r - i) mod cp (cp_ring_step: the mask variant and the rows) and merges the
// partial result by its log-sum-exp; the next step's keys/values move (a send_recv on "cp") under
// it. Backward: the keys/values travel the ring again (re-packed from the saved qkv, not kept
// per step), each step adds its share to dQ and to the travelling dK/dV of the keys it saw, which
// follows one step behind (the dK/dV that arrives is added after the step's own GEMMs, so its
// transfer runs under them) and ends at the rank that owns those keys, which adds its own share.
//   fwd: pack kv0 -> [ring kv0 -> kv1] -> step 0 -> [ring kv1 -> kv2] -> step 1 ... -> step cp-1 (att, lse)
//   bwd: pack -> [ring] -> step 0 (own dkv) -> [ring] -> step 1 -> ring dkv1 -> [ring] -> step 2 -> add
//        -> ring dkv2 ... -> finish (dq, own dkv + the dkv that came round)
// `attn` is the unsharded attention op (its attrs: heads, kv_heads, head_dim; its bytes); qkv the
// packed rows it reads. fwd writes "att", "att.lse"; bwd (attn_b: the attention_bwd op) writes dqkv.
void cp_attention_fwd(const TpRegion& b, std::vector<Op>& f, const std::string& qkv, const Op& attn);
void cp_attention_bwd(const TpRegion& b, std::vector<Op>& g, const std::string& qkv, const std::string& dqkv,
                      const Op& attn_b);

}  // namespace dhelix::sharding
