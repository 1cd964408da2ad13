// CheckpointStore: a directory of checkpoints, one subdirectory per step:
//   <dir>/step_00000123/{model.safetensors, optimizer.safetensors, state.json}
//   <dir>/latest                    text file naming the newest complete checkpoint ("step_00000123")
// A save writes into step_00000123.tmp-<pid>/, fsyncs every file and the directory, renames it
// into place, then replaces `latest` atomically; a crash at any point leaves `latest` naming the
// previous good checkpoint (a stale .tmp-<pid> directory is ignored and cleaned up later). Pruning
// renames a step directory to .del-<pid> before deleting it, so a kill mid-prune never leaves a
// half-deleted step directory that looks like a checkpoint.
// Not here: which tensors exist (the trainer names them), multi-rank coordination (rank 0 saves
// replicated state and the caller barriers; per-rank shards of TP/PP/ZeRO state are not yet handled).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "train/Safetensors.h"

namespace dhelix {

// 2: every tensor carries a CRC-32C (Safetensors.h), verified at load. Version 1 (none) still loads.
constexpr int kCheckpointFormatVersion = 2;

// What state.json holds besides the format fields.
struct TrainState {
  int64_t step = 0;                   // optimizer steps completed
  nlohmann::json rng = nullptr;       // the trainer's RNG state (opaque here)
  nlohmann::json data_loader = nullptr;  // DataLoader::state()
  std::string config_toml;            // to_toml(RunConfig) of the run that saved it
  nlohmann::json extra = nlohmann::json::object();
};

struct Checkpoint {
  std::string path;  // the step directory
  TrainState state;
  SafetensorsFile model, optimizer;
};

class CheckpointStore {
 public:
  // keep = checkpoints retained after each save (0 = all). The directory is created on save.
  CheckpointStore(std::string dir, int64_t keep);

  // Writes a checkpoint for state.step and returns its directory. Re-saving a step replaces it.
  std::string save(const TrainState& state, const NamedTensors& model, const NamedTensors& optimizer);

  // The directory `latest` names, if the file exists and that directory holds a state.json.
  std::optional<std::string> latest() const;
  // checkpoint.resume: "" -> nullopt; "latest" -> latest() (nullopt when there is none yet);
  // anything else is a path that must exist (ConfigError otherwise).
  std::optional<std::string> resolve(const std::string& resume) const;
  // Steps of the complete checkpoints present, ascending.
  std::vector<int64_t> steps() const;
  // The checkpoints to try for checkpoint.resume, in order: for "latest", the one `latest` names
  // when it is there, then every other complete one, newest first (the caller falls back along the
  // list when one fails to load); otherwise the path given (ConfigError when it is no checkpoint).
  // `note` says why the first is not the one `latest` names ("" when it is).
  struct ResumePlan {
    std::vector<std::string> candidates;
    std::string note;
  };
  ResumePlan resume_plan(const std::string& resume) const;

  // Loads and validates a step directory: files present, format/version, step matches the name.
  // IoError on anything missing or corrupt.
  // `with_optimizer` false: the model file only (sampling; `optimizer` stays empty).
  static Checkpoint load(const std::string& step_dir, bool with_optimizer = true);

  // Removes what crashed saves and prunes left (stale .tmp-/.old-/.del-<pid> directories, step
  // directories without a state.json); returns their names. Called by save and at run start.
  std::vector<std::string> clean() const;

  const std::string& dir() const { return dir_; }
  static std::string step_name(int64_t step);  // "step_00000123"

 private:
  void prune(const std::string& keep_name);

  std::string dir_;
  int64_t keep_;
};

// One line per tensor whose name or shape differs between what the model expects and what the
// checkpoint holds: "tensor 'x' has shape [256,256] in the checkpoint but [512,512] in the model",
// "tensor 'y' is missing from the checkpoint", "tensor 'z' in the checkpoint is not in the model",
// and dtype differences. Empty = compatible. `what` names the file in the messages.
std::vector<std::string> compare_tensors(const NamedTensors& expected, const NamedTensors& loaded,
                                         const std::string& what = "the checkpoint");
// Throws ConfigError listing every difference (no-op when compatible).
void check_tensors_match(const NamedTensors& expected, const NamedTensors& loaded,
                         const std::string& what = "the checkpoint");

}  // namespace dhelix
