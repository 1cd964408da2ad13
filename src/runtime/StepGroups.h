// StepGroups: the process groups one rank's step runs collectives on, typed by role (layout's
// GroupRole) instead of looked up by string; null for a role whose group has one rank (nothing to
// move) or that this rank's step does not use. Layer programs name a collective's group by the
// role's name (Op::group: "tp", "cp", "ep", "x", "y", "z"); by_name resolves it. Not here: which
// collective runs on which group (sharding/ writes that into the programs).
#pragma once
#include <array>
#include <string>

#include "comm/CommContext.h"
#include "comm/ProcessGroup.h"
#include "layout/Layout.h"

namespace dhelix {

class StepGroups {
 public:
  // Every role of `comm` whose group has more than one rank (empty for a single process).
  static StepGroups of(CommContext* comm);

  ProcessGroup* get(GroupRole r) const { return g_[static_cast<size_t>(r)]; }
  void set(GroupRole r, ProcessGroup* g) { g_[static_cast<size_t>(r)] = g; }
  // The group a program's collective names; null when this step has none for it. InternalError
  // when `name` is no role's name.
  ProcessGroup* by_name(const std::string& name) const;

 private:
  std::array<ProcessGroup*, kNumGroupRoles> g_{};
};

// The role named `name` (group_role_name's inverse); InternalError naming it otherwise.
GroupRole group_role_of(const std::string& name);

}  // namespace dhelix
