// kernels/targets.cc — test/benchmark hooks to pick the SIMD target (see dispatch.h).
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "hwy/targets.h"
#include "kernels/dispatch.h"

namespace shoal::kernels::detail {

std::vector<std::string> available_targets() {
  std::vector<std::string> names;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) names.emplace_back(hwy::TargetName(t));
  return names;
}

bool force_target(const std::string& name) {
  if (name.empty()) {
    hwy::SetSupportedTargetsForTest(0);
    return true;
  }
  hwy::SetSupportedTargetsForTest(0);  // list against the real CPU, not a prior mock
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    if (name == hwy::TargetName(t)) {
      hwy::SetSupportedTargetsForTest(t);
      return true;
    }
  }
  return false;
}

}  // namespace shoal::kernels::detail
