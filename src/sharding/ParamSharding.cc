// How each parameter of model/'s list (model_params) is sharded under a layout: Megatron's tp
// (column, row and vocab shards, replicated norms whose gradients SP makes partial), expert
// parallelism's runs of whole experts, or AxoNN's 3D grid (ParamSharding.h). Shapes and roles only;
// the elements each shard holds are ShardIndex.cc's, moving gradients is parallel/'s.
#include "sharding/ParamSharding.h"

#include "base/Error.h"

namespace dhelix {

namespace {

int64_t div_tp(int64_t n, int tp, const std::string& what) {
  DHX_CHECK(n % tp == 0, ConfigError, "{}={} is not divisible by parallel.tp={}", what, n, tp);
  return n / tp;
}

// Megatron's layouts: column rows (each fused part) and row columns over tp, the vocabulary rows
// padded and split over tp, whole experts over ep; replicated tensors see the sequence shard only
// under tp (sequence parallelism), so their gradients are partial sums over tp.
ParamSpec tp_spec(ParamSpec p, const ModelConfig& m, const LayoutConfig& lay) {
  const int tp = lay.tp;
  const bool sp = tp > 1;
  switch (p.role) {
    case ShardRole::kVocab:
      p.full[0] = padded_vocab(m, tp);
      p.shard = {div_tp(p.full[0], tp, "padded vocab"), p.full[1]};
      break;
    case ShardRole::kColumn: {
      int64_t out_local = 0;
      for (int64_t q : p.parts) out_local += div_tp(q, tp, p.local + " rows");
      p.shard = p.full;
      p.shard[0] = out_local;
      break;
    }
    case ShardRole::kRow: p.shard = {p.full[0], div_tp(p.full[1], tp, p.local + " columns")}; break;
    case ShardRole::kReplicated: p.partial_grad = sp; break;
    case ShardRole::kExpert:
      DHX_CHECK(m.n_experts % lay.ep == 0, ConfigError, "model.n_experts={} is not divisible by parallel.ep={}",
                m.n_experts, lay.ep);
      p.shard = {p.full[0] / lay.ep, p.full[1]};
      p.partial_grad = sp;
      break;
    case ShardRole::kGrid: DHX_ASSERT(false, "{}: model_params gives no grid roles", p.name);
  }
  p.replicas = p.role == ShardRole::kReplicated || p.role == ShardRole::kExpert ? tp : 1;
  return p;
}

// --- 3D tensor parallelism (AxoNN) -----------------------------------------------------------
int axis_size(const LayoutConfig& lay, GridAxis a) {
  return a == GridAxis::kX ? lay.tp_x : a == GridAxis::kY ? lay.tp_y : 1;
}
const char* axis_key(GridAxis a) { return a == GridAxis::kX ? "parallel.tp_x" : "parallel.tp_y"; }

// A tensor of shape `full` split over the grid: dim 0 (by `parts`) over `rows`, dim 1 over `cols`,
// and with z_flat the block flattened over z. Replicas: the block ranks holding the same shard.
ParamSpec grid(const std::string& local, Shape full, std::vector<int64_t> parts, GridAxis rows, GridAxis cols,
               bool z_flat, const LayoutConfig& lay, ParamInit init, double std_) {
  ParamSpec p;
  p.local = local;
  p.full = full;
  p.role = ShardRole::kGrid;
  p.grid_rows = rows, p.grid_cols = full.size() > 1 ? cols : GridAxis::kNone;
  p.z_flat = z_flat && lay.tp_z > 1;
  p.parts = parts.empty() ? std::vector<int64_t>{full[0]} : std::move(parts);
  p.init = init;
  p.init_std = std_;
  int64_t rows_l = 0;
  for (int64_t q : p.parts) {
    DHX_CHECK(q % axis_size(lay, rows) == 0, ConfigError, "{}: {} rows are not divisible by {}={}", local, q,
              axis_key(rows), axis_size(lay, rows));
    rows_l += q / axis_size(lay, rows);
  }
  int64_t cols_l = 1;
  if (full.size() > 1) {
    DHX_CHECK(full[1] % axis_size(lay, p.grid_cols) == 0, ConfigError, "{}: {} columns are not divisible by {}={}",
              local, full[1], axis_key(p.grid_cols), axis_size(lay, p.grid_cols));
    cols_l = full[1] / axis_size(lay, p.grid_cols);
  }
  const int64_t block = rows_l * cols_l;
  if (p.z_flat) {
    DHX_CHECK(block % lay.tp_z == 0, ConfigError,
              "{}: its {} x {} block ({} elements) is not divisible by parallel.tp_z={} (each block is flattened and "
              "split over z); choose tp_z dividing it",
              local, rows_l, cols_l, block, lay.tp_z);
    p.shard = {block / lay.tp_z};
  } else {
    p.shard = full.size() > 1 ? Shape{rows_l, cols_l} : Shape{rows_l};
  }
  // Identical copies: over every grid axis that splits neither dimension (z unless z_flat).
  p.replicas = lay.tp_block() / (axis_size(lay, rows) * axis_size(lay, p.grid_cols) * (p.z_flat ? lay.tp_z : 1));
  p.partial_grad = !p.z_flat && lay.tp_z > 1;  // tokens are split over z: reduce unless reduce-scattered
  p.weight_decay = full.size() > 1;
  return p;
}

// The 3D grid (DESIGN.md "4D hybrid parallelism"): column weights are type A (rows = output
// features over y, by their fused parts, columns over x), row weights type B (rows over x, columns
// over y), each block flattened over z; column biases over y; the residual stream's per-feature
// tensors (norms, attention-out / MLP-down biases, positions: the replicated ones) over x; the
// vocabulary table rows over y and columns over x (not over z).
// The MoE MLP's router and experts (ParamSpec::moe_mlp) are not split over the grid: the MLP runs
// on a slice of the x-y plane's tokens with whole features (Lowering3D.cc), the experts split over
// ep only; every rank of the block sums its own tokens into their gradients.
ParamSpec grid_spec(const ParamSpec& p, const ModelConfig& m, const LayoutConfig& lay) {
  const GridAxis X = GridAxis::kX, Y = GridAxis::kY, N = GridAxis::kNone;
  if (p.moe_mlp) {
    ParamSpec q = tp_spec(p, m, lay);  // tp = 1 on the grid: replicated, or whole experts over ep
    q.replicas = lay.tp_block();
    q.partial_grad = false;
    q.partial_grad_block = lay.tp_block() > 1;
    return q;
  }
  const bool matrix = p.full.size() > 1;
  ParamSpec q;
  switch (p.role) {
    case ShardRole::kVocab:
      q = grid(p.local, {padded_vocab(m, lay.tp_y), p.full[1]}, {}, Y, X, false, lay, p.init, p.init_std);
      break;
    case ShardRole::kColumn:
      q = matrix ? grid(p.local, p.full, p.parts, Y, X, true, lay, p.init, p.init_std)
                 : grid(p.local, p.full, p.parts, Y, N, false, lay, p.init, p.init_std);
      break;
    case ShardRole::kRow: q = grid(p.local, p.full, {}, X, Y, true, lay, p.init, p.init_std); break;
    case ShardRole::kReplicated:
      q = matrix ? grid(p.local, p.full, {}, N, X, false, lay, p.init, p.init_std)
                 : grid(p.local, p.full, {}, X, N, false, lay, p.init, p.init_std);
      break;
    case ShardRole::kExpert:
    case ShardRole::kGrid: DHX_ASSERT(false, "{}: no 3D sharding for role {}", p.name, shard_role_name(p.role));
  }
  q.name = p.name;
  return q;
}

}  // namespace

std::vector<UnitSpec> model_units(const ModelConfig& m, const LayoutConfig& lay, int tp_rank) {
  std::vector<UnitSpec> units = model_params(m);
  for (UnitSpec& u : units)
    for (ParamSpec& p : u.params) p = lay.is_3d() ? grid_spec(p, m, lay) : tp_spec(p, m, lay);
  (void)tp_rank;
  return units;
}

}  // namespace dhelix
