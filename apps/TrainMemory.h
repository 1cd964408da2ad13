// The memory `dhelix train` checks before its first step, counted by the step model `dhelix tune`
// ranks by (sim's memory_per_rank): one cost vocabulary. In apps because the train layer does not
// use sim (DESIGN.md's layers); the check itself is train/Preflight's check_memory.
#pragma once
#include "train/Config.h"
#include "train/Preflight.h"

namespace dhelix {

// Parameters, gradients and AdamW state of this rank's shard (AdamW over dp with ZeRO-1) as
// `states`; the most saved-for-backward buffers a stage holds at once over its slots of the config's
// pipeline schedule (1F1B, interleaved or W; Strand Interleaving's co-executed slots) and the
// gathered 3D weight blocks as `activations`. The batch is the config's: micro-batch size x micro-batches x data replicas.
MemoryEstimate estimate_rank_memory(const RunConfig& cfg);

}  // namespace dhelix
