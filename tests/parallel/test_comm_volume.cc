// The performance model's communication volume per axis equals what a real run moves. Oracle: the
// comm layer's own count (ProcessGroup::traffic: the ring bytes of every collective, from the
// tensors it was issued with) over one step's forward and backward of every micro-batch and the
// gradient reductions (compute_gradients: program collectives on x, y, z and tp, the partial-
// gradient all-reduces, the data-parallel buckets; 3D weight gradients reduce-scattered over z once
// per step or once per micro-batch; a layer keeping its gathered blocks: none in its backward), against
// sim's predict() for the same model,
// layout and batch. Equality is exact up to double rounding of the byte sums (relative 1e-12): both
// sides count the same buffers. Not counted on either side: the loss and gradient-norm scalars
// reduced after compute_gradients. The tiny model's shards are all even, so the dp buckets carry no
// padding (ParamStore pads a bucket to a multiple of dp; the model counts unpadded bytes). With the
// sparse embedding exchange the model prices the table's bucket and the gathered rows and ids.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../train/TempDir.h"
#include "ParallelHarness.h"
#include "sim/ClusterPreset.h"
#include "sim/StepModel.h"
#include "train/Trainer.h"

namespace dhelix::testing {
namespace {

// combination: 3d si
// combination: 3d ep si
// combination: dp 3d si
// combination: dp tp si
// combination: dp si
// combination: tp cp si
TEST(CommVolume, ModelEqualsCountedBytesPerAxis) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  const ClusterPreset cluster = load_cluster(std::string(DHELIX_SOURCE_DIR) + "/configs/clusters/cpu-emulated.toml");
  struct Case {
    const char* name;
    RunConfig cfg;
  };
  std::vector<Case> cases;
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {
    cases.push_back({"3D 2x2x2", tiny_config_3d(f, 1, 2, 2, 2, prefix, dir / "a")});
    cases.push_back({"3D 1x2x2 dp2", tiny_config_3d(f, 2, 1, 2, 2, prefix, dir / "b")});
    cases.push_back({"3D 2x1x1 dp2", tiny_config_3d(f, 2, 2, 1, 1, prefix, dir / "c")});
    RunConfig per_mb = tiny_config_3d(f, 1, 2, 2, 2, prefix, dir / "e");
    per_mb.parallel.accumulate_z_grads = false;  // a z reduce-scatter per micro-batch
    cases.push_back({"3D 2x2x2 reduce-scatter per micro-batch", per_mb});
    // AxoNN's weight caching on the first layer, with full recompute: the model prices each layer by
    // the block it runs (the first keeps its blocks, the second gathers them again and recomputes).
    RunConfig kept = tiny_config_3d(f, 1, 2, 2, 2, prefix, dir / "k");
    kept.parallel.keep_gathered = 1;
    kept.training.recompute = "full";
    kept.training.micro_batches = 3;  // the first micro-batch gathers, two more reuse
    cases.push_back({"3D 2x2x2 first layer's blocks kept, full recompute", kept});
    RunConfig mega = tiny_config(f, 2, 2, 0, prefix, dir / "d", 2, 8);
    mega.parallel.sparse_embed_grad = false;  // the model prices the dense embedding all-reduce
    cases.push_back({"Megatron tp2 dp2", mega});
  }
  {  // MoE: replicated experts in the dp buckets, router statistics summed over tp
    RunConfig moe = tiny_config(ModelFamily::kMoE, 2, 2, 0, prefix, dir / "m", 2, 8);
    moe.parallel.sparse_embed_grad = false;
    cases.push_back({"MoE tp2 dp2", moe});
    // On the 3D grid: the stream gathered over x and the slices over the plane, the statistics
    // summed over it, the router's and experts' gradients over the whole block (ep = 1: the
    // all-to-alls' bytes follow the routing, which the model prices balanced).
    RunConfig grid = tiny_config_3d(ModelFamily::kMoE, 1, 2, 2, 2, prefix, dir / "mg");
    grid.parallel.sparse_embed_grad = false;
    cases.push_back({"MoE 3D 2x2x2", grid});
  }
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {
    // Data parallelism with the sparse embedding exchange (on by default; 4 x 32 tokens a rank x
    // dp 2 < 2 x 256 vocabulary): the table's bucket plus the last micro-batch's rows and ids.
    cases.push_back({"dp2 sparse embedding", tiny_config(f, 2, 1, 0, prefix, dir / "sp", 2, 8)});
    // The buckets in bf16 (comm.grad_precision): 2 bytes a gradient element, the gathered rows fp32.
    RunConfig b16 = tiny_config(f, 2, 1, 0, prefix, dir / "sp16", 2, 8);
    b16.comm.grad_precision = "bf16";
    cases.push_back({"dp2 sparse embedding, bf16 gradients", b16});
    RunConfig t16 = tiny_config(f, 2, 2, 0, prefix, dir / "t16", 2, 8);
    t16.comm.grad_precision = "bf16";
    t16.parallel.sparse_embed_grad = false;
    cases.push_back({"Megatron tp2 dp2, bf16 gradients", t16});
  }
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {
    // Context parallelism: the ring's key/value and dK/dV exchanges on cp, gradients over dp x cp.
    RunConfig cp = tiny_config(f, 2, 2, 0, prefix, dir / "cp", 2, 8);
    cp.parallel.cp = 2;
    cp.parallel.dp = 1;
    cp.training.micro_batch_size = 8;  // dp 1 holds the 8-sequence global micro-batch
    cp.parallel.sparse_embed_grad = false;
    cases.push_back({"Megatron tp2 cp2", cp});
  }
  for (const Case& c : cases) {
    const LayoutConfig lay = layout_config(c.cfg);
    BatchSpec batch{c.cfg.global_batch(), c.cfg.model.seq_len, c.cfg.training.micro_batch_size};
    PredictOptions po;
    po.sparse_embed = c.cfg.parallel.sparse_embed_grad ? SparseEmbedGrad::kOn : SparseEmbedGrad::kOff;
    po.grad_wire_bytes = c.cfg.comm.grad_precision == "bf16" ? 2 : 4;
    const StepPrediction pred = predict(c.cfg.model, lay, batch, cluster, po);
    const std::map<std::string, double> got = counted_step_bytes(c.cfg);
    for (const auto& [axis, bytes] : got) {
      auto it = pred.axes.find(axis);
      const double want = it == pred.axes.end() ? 0.0 : it->second.bytes;
      fmt::print("[measured] {} {} axis {}: counted {:.0f} B, model {:.0f} B\n", family_name(c.cfg.model.family),
                 c.name, axis, bytes, want);
      EXPECT_NEAR(bytes, want, 1e-12 * want + 1e-9) << c.name << " axis " << axis;
    }
    for (const auto& [axis, a] : pred.axes) {
      if (a.bytes > 0 && axis != "pp") {
        EXPECT_TRUE(got.count(axis)) << c.name << ": model moves bytes on " << axis;
      }
    }
  }
}

}  // namespace
}  // namespace dhelix::testing
