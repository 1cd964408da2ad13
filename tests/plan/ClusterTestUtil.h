// The block pricer of a cluster preset read from the source tree: the figures `dhelix plan
// --cost-model NAME` prices with (cost_model_config, StepModel.h), in the preset's native precision.
#pragma once
#include <string>

#include "sim/StepModel.h"

namespace dhelix::test {

inline CostModelConfig cluster_cost_model(const std::string& preset, const LayoutConfig& lay) {
  const ClusterPreset c = load_cluster(std::string(DHELIX_SOURCE_DIR) + "/configs/clusters/" + preset + ".toml");
  return cost_model_config(c, lay, c.native_precision());
}

inline LayoutConfig tp_only(int tp) {
  LayoutConfig l;
  l.tp = tp;
  l.sequence_parallel = tp > 1;
  return l;
}

}  // namespace dhelix::test
