// Checks a training run makes before its first step, so that bad input costs seconds, not a
// training run: the run directory (a fresh run never silently replaces an earlier one), the paths
// it will write, the tokenizer and the data against the model's vocabulary, the memory the layout
// needs, and (multi-rank) that every rank resolved the same configuration and data. Every rank
// runs them on identical inputs and so fails alike; only `act` (rank 0) changes the file system.
// Errors are ConfigError or IoError (exit 2), each naming the values and a way out.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/Device.h"
#include "train/Config.h"

namespace dhelix {

class CommContext;
class IndexedDataset;

// The run directory's state for a run that does not resume: an earlier run's checkpoints (any
// step directory or `latest`) or a non-empty metrics file refuse the run, unless
// output.overwrite, which deletes them (when `act`). With checkpoint.resume set nothing is refused.
// In every case, when `act`, the leftovers of crashed saves and prunes are removed (CheckpointStore::
// clean). Returns lines for the log ("removed ...", "overwrote ...").
std::vector<std::string> prepare_run_directory(const RunConfig& cfg, bool act);

// Keeps the metrics lines whose "step" is at most `step` (a resumed run re-logs what follows).
// Atomic (rewrite + rename); a missing file is left missing. Returns the lines dropped.
int64_t truncate_metrics_after(const std::string& path, int64_t step);

// The output, checkpoint, metrics and trace paths can be created and written (IoError naming the
// path and the reason otherwise; a probe file is created and removed in each directory).
void check_writable_paths(const RunConfig& cfg);

// The tokenizer (needed when training.sample_tokens > 0) loads and fits in model.vocab_size; every
// token id of the dataset, read at its stored width, is in [0, model.vocab_size) (ConfigError
// naming the first one outside, its position and sequence, otherwise).
void check_tokens(const RunConfig& cfg, const IndexedDataset& data);

// Bytes one rank needs, estimated (by the step model `dhelix tune` uses: apps/TrainMemory.h).
struct MemoryEstimate {
  double states = 0, activations = 0;  // activations: saved buffers and gathered blocks
  double total() const { return states + activations; }
};
// The estimate against this machine's MemAvailable shared by the ranks on this host; ConfigError
// with the figures when it does not fit.
void check_memory(const MemoryEstimate& e, int ranks_on_host);

// The ranks that share this host's cores and memory: OMPI_COMM_WORLD_LOCAL_SIZE under mpirun (the
// launcher says), else `comm`'s world when its ranks are threads of this process (local backend),
// else 1. The one reading of the launcher's local size.
int ranks_on_this_host(const CommContext* comm);
// Compute threads per rank: training.threads, else this host's cores shared by its ranks (at least 1).
int threads_per_rank(const RunConfig& cfg, const CommContext* comm);
// The device this rank runs on: training.device, except that under comm.gpu_transport = "nccl" with
// more than one rank each rank takes a GPU of its own: rank i of this host the GPU after the named
// one by i (Open MPI's local rank under mpirun; the world rank for ranks as threads of one process).
// ConfigError naming the rank and the GPU when that GPU is not there (ranks sharing a GPU use
// comm.gpu_transport = "staged"). The trainer and `dhelix profile` / `plan` place their ranks with it.
Device rank_device(const RunConfig& cfg, const CommContext* comm);

// Multi-rank: every rank's resolved configuration (key by key) and data identity (the .idx and
// .bin sizes and the index's checksum) are compared; a difference -> ConfigError naming the keys
// and the ranks that differ from rank 0 (the same message on every rank). Collective over the world.
void check_ranks_agree(const RunConfig& cfg, CommContext& comm);

}  // namespace dhelix
