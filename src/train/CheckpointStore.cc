// Atomic checkpoint directories, `latest`, retention and shape comparison.
#include "train/CheckpointStore.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "base/Error.h"
#include "base/Files.h"

namespace dhelix {
namespace {

namespace fs = std::filesystem;
constexpr const char* kFormat = "dhelix-checkpoint";

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  DHX_CHECK(fd >= 0, IoError, "cannot open '{}' to fsync: {}", path, std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  DHX_CHECK(rc == 0, IoError, "fsync of '{}' failed: {}", path, std::strerror(errno));
}

// "step_00000123" -> 123; anything else -> nullopt.
std::optional<int64_t> parse_step_name(const std::string& name) {
  if (name.size() != 13 || name.rfind("step_", 0) != 0) return std::nullopt;
  int64_t v = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace

CheckpointStore::CheckpointStore(std::string dir, int64_t keep) : dir_(std::move(dir)), keep_(keep) {
  DHX_CHECK(!dir_.empty() && keep >= 0, ConfigError, "checkpoint.dir='{}' must be set and checkpoint.keep={} >= 0",
            dir_, keep);
}

std::string CheckpointStore::step_name(int64_t step) { return fmt::format("step_{:08d}", step); }

std::string CheckpointStore::save(const TrainState& state, const NamedTensors& model, const NamedTensors& optimizer) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  DHX_CHECK(!ec, IoError, "cannot create checkpoint directory '{}': {}", dir_, ec.message());
  clean();
  const std::string name = step_name(state.step);
  const std::string final_dir = dir_ + "/" + name;
  const std::string tmp = final_dir + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  DHX_CHECK(!ec, IoError, "cannot create '{}': {}", tmp, ec.message());

  write_safetensors(tmp + "/model.safetensors", model, {{"format", kFormat}, {"step", std::to_string(state.step)}});
  write_safetensors(tmp + "/optimizer.safetensors", optimizer, {{"format", kFormat}});
  nlohmann::json j = {{"format", kFormat},
                      {"version", kCheckpointFormatVersion},
                      {"step", state.step},
                      {"rng", state.rng},
                      {"data_loader", state.data_loader},
                      {"config", state.config_toml},
                      {"extra", state.extra}};
  write_file_atomic(tmp + "/state.json", j.dump(2) + "\n");
  fsync_path(tmp);

  // Replace an existing checkpoint of the same step (a resumed run re-saving): move it aside first,
  // since rename() cannot replace a non-empty directory.
  std::string old;
  if (fs::exists(final_dir)) {
    old = final_dir + ".old-" + std::to_string(::getpid());
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    DHX_CHECK(!ec, IoError, "cannot move '{}' aside: {}", final_dir, ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  DHX_CHECK(!ec, IoError, "cannot rename '{}' to '{}': {}", tmp, final_dir, ec.message());
  fsync_path(dir_);
  write_file_atomic(dir_ + "/latest", name + "\n");
  fsync_path(dir_);
  if (!old.empty()) fs::remove_all(old, ec);
  prune(name);
  return final_dir;
}

std::optional<std::string> CheckpointStore::latest() const {
  const std::string f = dir_ + "/latest";
  if (!file_exists(f)) return std::nullopt;
  std::string name = read_file(f);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const std::string path = dir_ + "/" + name;
  if (!parse_step_name(name) || !file_exists(path + "/state.json")) return std::nullopt;
  return path;
}

std::optional<std::string> CheckpointStore::resolve(const std::string& resume) const {
  if (resume.empty()) return std::nullopt;
  if (resume == "latest") return latest();
  DHX_CHECK(file_exists(resume + "/state.json"), ConfigError,
            "checkpoint.resume='{}' is not a checkpoint directory (no state.json there)", resume);
  return resume;
}

CheckpointStore::ResumePlan CheckpointStore::resume_plan(const std::string& resume) const {
  ResumePlan plan;
  if (resume.empty()) return plan;
  if (resume != "latest") {
    plan.candidates.push_back(*resolve(resume));
    return plan;
  }
  const std::optional<std::string> named = latest();
  if (named) plan.candidates.push_back(*named);
  const std::vector<int64_t> all = steps();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string path = dir_ + "/" + step_name(*it);
    if (!named || path != *named) plan.candidates.push_back(path);
  }
  if (!named && !plan.candidates.empty()) {
    const std::string f = dir_ + "/latest";
    std::string name = file_exists(f) ? read_file(f) : "";
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    plan.note = file_exists(f) ? fmt::format("'{}/latest' names '{}', which is {}", dir_, name,
                                             file_exists(dir_ + "/" + name) ? "incomplete (no state.json)" : "missing")
                               : fmt::format("'{}' has no 'latest' pointer", dir_);
  }
  return plan;
}

std::vector<int64_t> CheckpointStore::steps() const {
  std::vector<int64_t> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    auto s = parse_step_name(e.path().filename().string());
    if (s && e.is_directory() && file_exists(e.path().string() + "/state.json")) out.push_back(*s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void CheckpointStore::prune(const std::string& keep_name) {
  if (keep_ == 0) return;
  std::vector<int64_t> all = steps();
  const int64_t excess = static_cast<int64_t>(all.size()) - keep_;
  std::error_code ec;
  for (int64_t i = 0; i < excess; ++i) {
    const std::string name = step_name(all[static_cast<size_t>(i)]);
    if (name == keep_name) continue;
    // Renamed first (atomic), then deleted: a kill mid-delete leaves a ".del-<pid>" directory that
    // clean() removes, never a half-deleted step directory.
    const std::string doomed = dir_ + "/" + name + ".del-" + std::to_string(::getpid());
    fs::rename(dir_ + "/" + name, doomed, ec);
    if (!ec) fs::remove_all(doomed, ec);
  }
}

std::vector<std::string> CheckpointStore::clean() const {
  // Leftovers of crashed saves and prunes: "<step>.tmp-<pid>" / ".old-<pid>" / ".del-<pid>" whose
  // process is gone, and step directories without a state.json (an older build's interrupted
  // prune). A complete checkpoint is never touched.
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string n = e.path().filename().string();
    size_t at = std::string::npos;
    for (const char* tag : {".tmp-", ".old-", ".del-"})
      if (at == std::string::npos) at = n.find(tag);
    bool stale = false;
    if (at != std::string::npos) {
      const int pid = std::atoi(n.c_str() + at + 5);
      stale = pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH;
    } else if (parse_step_name(n) && e.is_directory(ec) && !file_exists(e.path().string() + "/state.json")) {
      stale = true;
    }
    if (stale) {
      std::error_code rec;
      fs::remove_all(e.path(), rec);
      if (!rec) removed.push_back(n);
    }
  }
  return removed;
}

Checkpoint CheckpointStore::load(const std::string& step_dir, bool with_optimizer) {
  Checkpoint c;
  c.path = step_dir;
  int version = 0;
  const std::string state_path = step_dir + "/state.json";
  DHX_CHECK(file_exists(state_path), IoError, "checkpoint '{}' has no state.json", step_dir);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(state_path));
    DHX_CHECK(j.at("format") == kFormat, IoError, "'{}' is not a dhelix checkpoint (format {})", state_path,
              j.at("format").dump());
    version = j.at("version").get<int>();
    DHX_CHECK(version == 1 || version == kCheckpointFormatVersion, IoError,
              "'{}' has checkpoint format version {}; this build reads versions 1 and {}", state_path, version,
              kCheckpointFormatVersion);
    c.state.step = j.at("step").get<int64_t>();
    c.state.rng = j.at("rng");
    c.state.data_loader = j.at("data_loader");
    c.state.config_toml = j.at("config").get<std::string>();
    c.state.extra = j.value("extra", nlohmann::json::object());
  } catch (const nlohmann::json::exception& e) {
    throw IoError(fmt::format("checkpoint state '{}' is malformed: {}", state_path, e.what()));
  }
  auto named = parse_step_name(fs::path(step_dir).lexically_normal().filename().string());
  if (!named) named = parse_step_name(fs::path(step_dir).lexically_normal().parent_path().filename().string());
  DHX_CHECK(!named || *named == c.state.step, IoError, "checkpoint '{}' says step {} in state.json", step_dir,
            c.state.step);
  for (const char* f : {"/model.safetensors", "/optimizer.safetensors"})
    DHX_CHECK(file_exists(step_dir + f) || (!with_optimizer && std::string(f) == "/optimizer.safetensors"), IoError,
              "checkpoint '{}' has no {}", step_dir, f + 1);
  c.model = read_safetensors(step_dir + "/model.safetensors");
  if (with_optimizer) c.optimizer = read_safetensors(step_dir + "/optimizer.safetensors");
  // Version 2 writes a checksum for every tensor (read_safetensors verified those present); one
  // missing means the header was edited or the file replaced.
  if (version >= 2)
    for (const auto* f : {&c.model, &c.optimizer})
      DHX_CHECK((f == &c.optimizer && !with_optimizer) || f->checksummed == f->tensors.size(), IoError,
                "checkpoint '{}': {} of the {} tensors of its {} carry no checksum; the file was not written by "
                "this checkpoint's save",
                step_dir, f->tensors.size() - f->checksummed, f->tensors.size(),
                f == &c.model ? "model.safetensors" : "optimizer.safetensors");
  return c;
}

std::vector<std::string> compare_tensors(const NamedTensors& expected, const NamedTensors& loaded,
                                         const std::string& what) {
  std::map<std::string, const Tensor*> have;
  for (const auto& [n, t] : loaded) have[n] = &t;
  std::vector<std::string> out;
  for (const auto& [n, t] : expected) {
    auto it = have.find(n);
    if (it == have.end()) {
      out.push_back(fmt::format("tensor '{}' ({}) is missing from {}", n, t.describe(), what));
      continue;
    }
    const Tensor& l = *it->second;
    if (l.shape() != t.shape())
      out.push_back(fmt::format("tensor '{}' has shape {} in {} but {} in the model", n, shape_str(l.shape()), what,
                                shape_str(t.shape())));
    else if (l.dtype() != t.dtype())
      out.push_back(fmt::format("tensor '{}' has dtype {} in {} but {} in the model", n, dtype_name(l.dtype()), what,
                                dtype_name(t.dtype())));
    have.erase(it);
  }
  for (const auto& [n, t] : have)
    out.push_back(fmt::format("tensor '{}' ({}) in {} is not in the model", n, t->describe(), what));
  return out;
}

void check_tensors_match(const NamedTensors& expected, const NamedTensors& loaded, const std::string& what) {
  auto diffs = compare_tensors(expected, loaded, what);
  if (diffs.empty()) return;
  std::string msg = fmt::format("{} does not fit the model ({} difference{}):", what, diffs.size(),
                                diffs.size() == 1 ? "" : "s");
  for (const auto& d : diffs) msg += "\n  - " + d;
  throw ConfigError(msg);
}

}  // namespace dhelix
