// Writes the seed corpus of the fuzz targets with dhelix's own writers, so every seed is a file
// the readers must accept: make_seeds <corpus dir> (fuzz/corpus). Run by hand when a format
// changes; the output is committed. Each seed stays small (a few KB) so the fuzzers mutate it fast.
// The crash_* (found by a fuzzer) and regress_* (hand-made) inputs beside them are not made here:
// each once exposed a bug, and every fuzz run replays them.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "base/Files.h"
#include "model/ModelConfig.h"
#include "plan/PlanIO.h"
#include "plan/Profile.h"
#include "schedule/BasicPlans.h"
#include "schedule/PlanSearch.h"
#include "sharding/ModelPrograms.h"
#include "train/Config.h"
#include "train/IndexedDataset.h"
#include "train/Safetensors.h"

using namespace dhelix;
namespace fs = std::filesystem;

namespace {

// A toy price table for the search seed: a window costs its op count; a co-executed pair costs
// the longer side, so the search pairs collectives with the other strand's compute.
class OpCountCost final : public BlockCost {
 public:
  double solo_fwd(int a, int b) const override { return b - a; }
  double solo_bwd(int c, int d) const override { return d - c; }
  double pair(int a, int b, int c, int d) const override { return std::max(b - a, d - c) + 0.5; }
};

Tensor filled(const Shape& shape, DType dtype, uint8_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(seed + 37 * i);
  return t;
}

void safetensors_seeds(const fs::path& dir) {
  write_safetensors((dir / "tiny.safetensors").string(),
                    {{"embed.weight", filled({2, 3}, DType::kF32, 1)},
                     {"norm.bf16", filled({4}, DType::kBF16, 2)},
                     {"step", filled({1}, DType::kI64, 3)},
                     {"ids", filled({3}, DType::kU16, 4)},
                     {"f64", filled({1, 1}, DType::kF64, 5)},
                     {"empty", filled({0, 4}, DType::kI32, 6)}},
                    {{"format", "pt"}, {"step", "7"}});
  write_safetensors((dir / "none.safetensors").string(), {});
}

// The fuzz_index input layout: u32 .bin length | .idx bytes.
void index_seed(const fs::path& dir, const std::string& name, IndexDType dtype,
                const std::vector<std::vector<int32_t>>& docs) {
  const std::string prefix = (dir / ("tmp_" + name)).string();
  {
    IndexedDatasetWriter w(prefix, dtype);
    for (const auto& d : docs) w.add_document(d);
    w.finish();
  }
  const std::string idx = read_file(prefix + ".idx");
  const uint32_t bin_bytes = static_cast<uint32_t>(fs::file_size(prefix + ".bin"));
  std::string seed(4, '\0');
  std::memcpy(seed.data(), &bin_bytes, 4);
  write_file_atomic((dir / name).string(), seed + idx);
  fs::remove(prefix + ".idx");
  fs::remove(prefix + ".bin");
}

void plan_seeds(const fs::path& dir) {
  LayoutConfig lay;
  lay.tp = 2;
  lay.sequence_parallel = true;
  const ModelConfig m = model_preset("demo");
  const LayerProgram prog = build_programs(m, lay, MicroBatchShape{2, m.seq_len}).block;  // as fuzz_plan.cc
  SIPlan def = default_plan(prog);
  def.predicted_s = std::numeric_limits<double>::infinity();  // unpriced: written without the field
  save_plan((dir / "default.json").string(), def, prog);
  save_plan((dir / "search.json").string(), best_plan(prog, OpCountCost()), prog);
  nlohmann::json old = plan_to_json(def, prog);
  old["predicted_s"] = nullptr;  // what builds before the NaN fix wrote
  write_file_atomic((dir / "null_time.json").string(), old.dump(2) + "\n");

  Profile p;
  p.describe_program(prog);
  p.meta.model = "demo";
  p.meta.layout = "tp=2,sp";
  p.meta.repeats = 5;
  p.set_solo_fwd({0, 1}, 1.5e-4);
  p.set_solo_fwd({1, 3}, 2.25e-3);
  p.set_solo_bwd({0, 2}, 3e-4);
  p.set_pair({1, 2}, {0, 1}, 4e-4);
  p.save((dir / "profile.json").string());
}

void config_seeds(const fs::path& dir, const fs::path& source) {
  for (const char* name : {"demo.toml", "gpt2-124m.toml"}) fs::copy_file(source / "configs" / name, dir / name,
                                                                          fs::copy_options::overwrite_existing);
  const RunConfig demo = load_config((source / "configs" / "demo.toml").string(), {});
  write_file_atomic((dir / "resolved.toml").string(), to_toml(demo));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <corpus dir>\n");
    return 2;
  }
  const fs::path out = argv[1];
  for (const char* t : {"config", "safetensors", "index", "plan"}) fs::create_directories(out / t);
  config_seeds(out / "config", DHELIX_SOURCE_DIR);
  safetensors_seeds(out / "safetensors");
  index_seed(out / "index", "tiny_u16", IndexDType::kU16, {{1, 2, 3}, {4}, {5, 6, 65535}});
  index_seed(out / "index", "small_i32", IndexDType::kI32, {{7}, {}, {8, 9}});
  index_seed(out / "index", "empty_u16", IndexDType::kU16, {});
  plan_seeds(out / "plan");
  std::printf("seeds written under %s\n", out.c_str());
  return 0;
}
