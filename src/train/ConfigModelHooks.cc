// Binds load_config's ModelHooks to the model layer (presets, ModelConfig::validate). Kept in its
// own file so tests of the config table can link without the model layer (they pass fake hooks).
#include "model/ModelConfig.h"
#include "train/Config.h"

namespace dhelix {

ModelHooks default_model_hooks() {
  ModelHooks h;
  h.preset = [](const std::string& name) { return model_preset(name); };
  h.validate = [](const ModelConfig& m) { return m.validate(); };
  return h;
}

}  // namespace dhelix
