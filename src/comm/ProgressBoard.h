// ProgressBoard: which op each process of a job last started, per process group, readable by the
// other processes of the same machine -- so a rank whose op times out can name the group members
// that never arrived at it. Each process owns one small shared-memory file,
// /dev/shm/dhelix-<job token>-r<world rank>, holding one sequence number per group slot (-1 until
// the first op); the comm thread writes it as it starts each op. Removed with the board; a new
// board removes those whose process is gone (a job killed before its destructors ran).
// Processes on other machines are not visible (read() says so); their arrival stays unknown.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "layout/Layout.h"

namespace dhelix {

class ProgressBoard {
 public:
  static constexpr int kSlots = kNumGroupRoles + 1;  // one per group role, and the world
  ProgressBoard(uint64_t job_token, int world_rank);
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  // This process started op `seq` of the group in `slot`.
  void publish(int slot, int64_t seq);
  // What process `world_rank` of the job last published for `slot`; nullopt when its board is not
  // on this machine (or gone).
  std::optional<int64_t> read(int world_rank, int slot) const;

 private:
  std::string path_of(int world_rank) const;
  uint64_t token_;
  int rank_;
  std::string own_path_;
  int64_t* slots_ = nullptr;  // mmapped kSlots values
};

}  // namespace dhelix
