// Shared-memory arrival board (ProgressBoard.h).
#include "comm/ProgressBoard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>

namespace dhelix {

namespace {
constexpr const char* kDir = "/dev/shm";
// "dhelix-<token>-r<rank>-p<pid>" -> pid, or 0 for other names.
long board_pid(const std::string& name) {
  if (name.rfind("dhelix-", 0) != 0) return 0;
  const size_t p = name.rfind("-p");
  if (p == std::string::npos || name.find("-r") == std::string::npos) return 0;
  char* end = nullptr;
  const long pid = std::strtol(name.c_str() + p + 2, &end, 10);
  return end && *end == '\0' ? pid : 0;
}
}  // namespace

std::string ProgressBoard::path_of(int world_rank) const {
  // Another process's file: found by its prefix (its pid is part of the name).
  const std::string prefix = fmt::format("dhelix-{:016x}-r{}-p", token_, world_rank);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kDir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(prefix, 0) == 0) return e.path().string();
  }
  return "";
}

ProgressBoard::ProgressBoard(uint64_t job_token, int world_rank) : token_(job_token), rank_(world_rank) {
  // Boards of processes that are gone (a job killed before its destructors ran) are removed.
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kDir, ec)) {
    const long pid = board_pid(e.path().filename().string());
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) std::filesystem::remove(e.path(), ec);
  }
  own_path_ = fmt::format("{}/dhelix-{:016x}-r{}-p{}", kDir, token_, rank_, ::getpid());
  const std::string& p = own_path_;
  const int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return;  // no /dev/shm: the board stays dark; diagnosis says "unknown"
  const size_t bytes = sizeof(int64_t) * kSlots;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
      slots_ = static_cast<int64_t*>(m);
      for (int i = 0; i < kSlots; ++i) std::atomic_ref<int64_t>(slots_[i]).store(-1, std::memory_order_relaxed);
    }
  }
  ::close(fd);
}

ProgressBoard::~ProgressBoard() {
  if (!slots_) return;
  ::munmap(slots_, sizeof(int64_t) * kSlots);
  ::unlink(own_path_.c_str());
}

void ProgressBoard::publish(int slot, int64_t seq) {
  if (slots_ && slot >= 0 && slot < kSlots) std::atomic_ref<int64_t>(slots_[slot]).store(seq, std::memory_order_release);
}

std::optional<int64_t> ProgressBoard::read(int world_rank, int slot) const {
  if (slot < 0 || slot >= kSlots) return std::nullopt;
  if (world_rank == rank_) {
    if (!slots_) return std::nullopt;
    return std::atomic_ref<int64_t>(slots_[slot]).load(std::memory_order_acquire);
  }
  const std::string p = path_of(world_rank);
  const int fd = p.empty() ? -1 : ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return std::nullopt;
  int64_t v = 0;
  const ssize_t n = ::pread(fd, &v, sizeof v, static_cast<off_t>(slot * sizeof(int64_t)));
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof v)) return std::nullopt;
  return v;
}

}  // namespace dhelix
