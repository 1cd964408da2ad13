// StepGroups (see StepGroups.h).
#include "runtime/StepGroups.h"

#include "base/Error.h"

namespace dhelix {

StepGroups StepGroups::of(CommContext* comm) {
  StepGroups s;
  if (comm)
    for (GroupRole r : all_group_roles())
      if (comm->layout().size(r) > 1) s.set(r, &comm->group(r));
  return s;
}

GroupRole group_role_of(const std::string& name) {
  for (GroupRole r : all_group_roles())
    if (name == group_role_name(r)) return r;
  throw InternalError(fmt::format("'{}' names no process-group role (tp, ep, cp, pp, dp, x, y, z, ...)", name));
}

ProcessGroup* StepGroups::by_name(const std::string& name) const { return get(group_role_of(name)); }

}  // namespace dhelix
