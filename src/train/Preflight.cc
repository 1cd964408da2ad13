// Checks before the first step (Preflight.h).
#include "train/Preflight.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "base/Checksum.h"
#include "base/Error.h"
#include "base/Files.h"
#include "comm/CommContext.h"
#include "tensor/DeviceMemory.h"
#include "train/CheckpointStore.h"
#include "train/IndexedDataset.h"
#include "train/Tokenizer.h"

namespace dhelix {
namespace fs = std::filesystem;

namespace {

std::string human(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, ++i;
  return fmt::format("{:.1f} {}", b, u[i]);
}

bool nonempty_file(const std::string& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && fs::file_size(p, ec) > 0;
}

// Creates `dir` and a probe file in it; IoError naming `what` and the reason when it cannot.
void probe_dir(const std::string& dir, const std::string& what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  DHX_CHECK(!ec, IoError, "{}: cannot create directory '{}': {}", what, dir, ec.message());
  const std::string probe = dir + "/.dhelix-write-probe." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  DHX_CHECK(fd >= 0, IoError, "{}: cannot write in '{}': {}", what, dir, std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string parent_or_dot(const std::string& path) {
  const std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

}  // namespace

std::vector<std::string> prepare_run_directory(const RunConfig& cfg, bool act) {
  std::vector<std::string> log;
  CheckpointStore store(cfg.checkpoint.dir, cfg.checkpoint.keep);
  std::error_code ec;
  const bool ckdir = fs::is_directory(cfg.checkpoint.dir, ec);
  if (act && ckdir)
    for (const std::string& n : store.clean()) log.push_back(fmt::format("removed '{}/{}' (left by a crash)", cfg.checkpoint.dir, n));
  if (!cfg.checkpoint.resume.empty()) return log;
  const std::vector<int64_t> steps = ckdir ? store.steps() : std::vector<int64_t>{};
  const bool latest = file_exists(cfg.checkpoint.dir + "/latest");
  const bool metrics = nonempty_file(cfg.output.metrics);
  if (steps.empty() && !latest && !metrics) return log;
  std::string what;
  if (!steps.empty())
    what = fmt::format("{} checkpoint{} (steps {}..{}) in '{}'", steps.size(), steps.size() == 1 ? "" : "s",
                       steps.front(), steps.back(), cfg.checkpoint.dir);
  else if (latest)
    what = fmt::format("'{}/latest'", cfg.checkpoint.dir);
  if (metrics) what += fmt::format("{}metrics '{}'", what.empty() ? "" : " and ", cfg.output.metrics);
  DHX_CHECK(cfg.output.overwrite, ConfigError,
            "output.dir='{}' holds an earlier run: {}.\nhint: continue it with --checkpoint.resume latest, start "
            "over with --output.overwrite true (deletes them), or pick another --output.dir",
            cfg.output.dir, what);
  if (act) {
    for (int64_t s : steps) fs::remove_all(cfg.checkpoint.dir + "/" + CheckpointStore::step_name(s), ec);
    fs::remove(cfg.checkpoint.dir + "/latest", ec);
    fs::remove(cfg.output.metrics, ec);
    log.push_back("output.overwrite: deleted " + what);
  }
  return log;
}

int64_t truncate_metrics_after(const std::string& path, int64_t step) {
  if (!file_exists(path)) return 0;
  std::istringstream in(read_file(path));
  std::string line, kept;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    // A line that is not JSON (a torn last write) or has no step goes with the steps after.
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() <= step)
      kept += line + "\n";
    else
      ++dropped;
  }
  if (dropped > 0) write_file_atomic(path, kept);
  return dropped;
}

void check_writable_paths(const RunConfig& cfg) {
  probe_dir(cfg.output.dir, "output.dir");
  probe_dir(cfg.checkpoint.dir, "checkpoint.dir");
  probe_dir(parent_or_dot(cfg.output.metrics), "output.metrics");
  if (!cfg.output.trace.empty()) probe_dir(parent_or_dot(cfg.output.trace), "output.trace");
}

void check_tokens(const RunConfig& cfg, const IndexedDataset& data) {
  const int64_t V = cfg.model.vocab_size;
  if (cfg.training.sample_tokens > 0) {
    try {
      Tokenizer tok(cfg.data.tokenizer);
      DHX_CHECK(tok.vocab_size() <= V, ConfigError,
                "tokenizer '{}' has {} pieces but model.vocab_size={}; set model.vocab_size >= {}", cfg.data.tokenizer,
                tok.vocab_size(), V, tok.vocab_size());
    } catch (const IoError& e) {
      throw IoError(fmt::format("{}\nhint: the tokenizer is needed to print a sample at the end; set "
                                "training.sample_tokens 0 to train without one",
                                e.what()));
    }
  }
  // Every id at its stored width (an i64 id past int32 must not wrap into the vocabulary, a negative
  // one must not pass as "below the vocabulary size"), both ends.
  if (const auto bad = data.first_id_outside(0, V)) {
    const std::string fix = bad->value < 0
                                ? "token ids are never negative: rebuild the data with the model's tokenizer"
                                : fmt::format("set model.vocab_size >= {} or rebuild the data with the model's "
                                              "tokenizer",
                                              static_cast<uint64_t>(bad->value) + 1);  // no overflow at INT64_MAX
    throw ConfigError(fmt::format("dataset '{}' holds token id {} at token {} (sequence {}, stored as {}), outside "
                                  "[0, model.vocab_size={}); {}",
                                  data.prefix(), bad->value, bad->position, bad->sequence,
                                  index_dtype_name(data.dtype()), V, fix));
  }
}

void check_memory(const MemoryEstimate& e, int ranks_on_host) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0, available = -1;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") available = kib * 1024;
  if (available <= 0) return;  // not Linux, or no figure: nothing to compare with
  const double need = e.total() * ranks_on_host;
  DHX_CHECK(need <= available, ConfigError,
            "the run needs about {} per rank ({} parameters, gradients and AdamW state + {} activations, an estimate) "
            "x {} rank{} on this host = {}, but {} is available.\nhint: a smaller model, a smaller "
            "training.micro_batch_size or model.seq_len, more tp, pp or tp_x/tp_y/tp_z ranks, or parallel.zero 1",
            human(e.total()), human(e.states), human(e.activations), ranks_on_host, ranks_on_host == 1 ? "" : "s",
            human(need), human(available));
}

void check_ranks_agree(const RunConfig& cfg, CommContext& comm) {
  // One hash per resolved key (to_toml lines, in table order) and one for the data's identity.
  std::vector<std::string> keys;
  std::vector<uint32_t> hashes;
  {
    for (const auto& [key, value] : toml_entries(to_toml(cfg))) {
      if (key == "comm.gloo_host") continue;  // each host's own listening address
      keys.push_back(key);
      hashes.push_back(crc32c(value.data(), value.size()));
    }
    std::string id;
    std::error_code ec;
    for (const char* ext : {".idx", ".bin"}) id += std::to_string(fs::file_size(cfg.data.prefix + ext, ec)) + ";";
    if (file_exists(cfg.data.prefix + ".idx")) {
      const std::string idx = read_file(cfg.data.prefix + ".idx");
      id += crc32c_hex(crc32c(idx.data(), idx.size()));
    }
    keys.push_back(fmt::format("the data ({}.idx/.bin: sizes and index checksum)", cfg.data.prefix));
    hashes.push_back(crc32c(id.data(), id.size()));
  }
  const int n = comm.world_size(), k = static_cast<int>(hashes.size());
  Tensor mine = Tensor::empty({k + 1}, DType::kI64);
  mine.data<int64_t>()[0] = k;  // a different build could have a different key count
  for (int i = 0; i < k; ++i) mine.data<int64_t>()[i + 1] = hashes[static_cast<size_t>(i)];
  Tensor all = Tensor::empty({n * (k + 1)}, DType::kI64);
  comm.world().all_gather(mine, all).wait();
  const int64_t* a = all.data<int64_t>();
  std::vector<std::string> diffs;
  for (int i = 0; i <= k; ++i) {
    std::vector<int> ranks;
    for (int r = 1; r < n; ++r)
      if (a[r * (k + 1) + i] != a[i]) ranks.push_back(r);
    if (ranks.empty()) continue;
    std::string rs;
    for (int r : ranks) rs += (rs.empty() ? "" : ", ") + std::to_string(r);
    diffs.push_back(i == 0 ? fmt::format("the number of config keys (different dhelix builds?): rank{} {}",
                                         ranks.size() == 1 ? "" : "s", rs)
                           : fmt::format("{}: rank{} {} differ from rank 0", keys[static_cast<size_t>(i - 1)],
                                         ranks.size() == 1 ? "" : "s", rs));
    if (i == 0) break;  // key-by-key comparison is meaningless across builds
  }
  if (diffs.empty()) return;
  std::string msg = fmt::format("the {} ranks did not resolve the same run ({} difference{}):", n, diffs.size(),
                                diffs.size() == 1 ? "" : "s");
  for (const auto& d : diffs) msg += "\n  - " + d;
  msg += "\nhint: launch every rank with the same --config and flags (and the same data files)";
  throw ConfigError(msg);
}

int ranks_on_this_host(const CommContext* comm) {
  if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::max(1, std::atoi(v));
  return comm ? comm->world_size() : 1;
}

int threads_per_rank(const RunConfig& cfg, const CommContext* comm) {
  if (cfg.training.threads > 0) return static_cast<int>(cfg.training.threads);
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::max(1, hw / ranks_on_this_host(comm));
}

Device rank_device(const RunConfig& cfg, const CommContext* comm) {
  const Device named = parse_device(cfg.training.device);
  if (named.is_host() || cfg.comm.gpu_transport != "nccl" || !comm || comm->world_size() <= 1) return named;
  const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int local = env ? std::atoi(env) : comm->rank();
  const Device mine = Device::cuda(named.index + local);
  const std::string why = device_unavailable(mine);
  DHX_CHECK(why.empty(), ConfigError,
            "rank {}: comm.gpu_transport=\"nccl\" takes a GPU per rank, and local rank {} would take {} "
            "(training.device=\"{}\" plus {}): {}; use comm.gpu_transport=staged for ranks sharing a GPU",
            comm->rank(), local, mine.str(), cfg.training.device, local, why);
  return mine;
}

}  // namespace dhelix
