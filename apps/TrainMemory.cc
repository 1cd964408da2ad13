// train's memory estimate from the step model.
#include "TrainMemory.h"

#include "schedule/Pipelines.h"
#include "sim/StepModel.h"

namespace dhelix {

MemoryEstimate estimate_rank_memory(const RunConfig& cfg) {
  const LayoutConfig lay = layout_config(cfg);
  const int64_t mb = cfg.training.micro_batch_size;
  const BatchSpec batch{mb * cfg.training.micro_batches * lay.data_replicas(), cfg.model.seq_len, mb};
  const StepSchedule schedule = make_schedule(pipeline_spec(cfg));  // the step runner's slots
  const MemoryUse m = memory_per_rank(cfg.model, lay, batch, Precision::kFp32,
                                      cfg.parallel.zero ? Zero::kZero1 : Zero::kNone,
                                      cfg.schedule.strand_interleaving ? StrandInterleaving::kOn
                                                                       : StrandInterleaving::kOff,
                                      nullptr, &schedule);
  return {m.params + m.grads + m.optimizer, m.activations + m.gathered};
}

}  // namespace dhelix
