// The shard arithmetic (ShardIndex.h): which elements of a full tensor a rank's shard holds, for
// each sharding role, and the copies between the two.
#include "sharding/ShardIndex.h"

#include <algorithm>

#include "base/Error.h"

namespace dhelix {

ShardIndex ShardIndex::of(const LayoutConfig& lay, const RankCoord& c) {
  ShardIndex s;
  s.tp_rank = c.tp, s.tp = lay.tp;
  s.x = c.x, s.y = c.y, s.z = c.z;
  s.gx = lay.tp_x, s.gy = lay.tp_y, s.gz = lay.tp_z;
  s.ep_rank = c.ep, s.ep = lay.ep;
  s.xy = group_index(lay, GroupRole::kXY, c);
  return s;
}

namespace {

// Row ranges [begin, len) in `full` that make up a column/vocab shard, in shard order.
std::vector<std::pair<int64_t, int64_t>> shard_rows(const ParamSpec& s, int r, int tp) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (s.role == ShardRole::kVocab || s.role == ShardRole::kExpert) {
    int64_t n = s.shard[0];
    out.push_back({r * n, n});
  } else {
    int64_t off = 0;
    for (int64_t q : s.parts) {
      int64_t n = q / tp;
      out.push_back({off + r * n, n});
      off += q;
    }
  }
  return out;
}

// kGrid: the block's rows (parts split over grid_rows) x columns (a contiguous slice over
// grid_cols), row-major; with z_flat only the elements of the block's flat piece z.
template <typename Fn>
void for_each_grid_piece(const ParamSpec& s, const ShardIndex& at, Fn fn) {
  auto size_of = [&](GridAxis a) { return a == GridAxis::kX ? at.gx : a == GridAxis::kY ? at.gy : 1; };
  auto coord_of = [&](GridAxis a) { return a == GridAxis::kX ? at.x : a == GridAxis::kY ? at.y : 0; };
  const int64_t cols_full = s.full.size() > 1 ? s.full[1] : 1;
  const int64_t cb = cols_full / size_of(s.grid_cols), c0 = coord_of(s.grid_cols) * cb;
  int64_t rows_l = 0;
  for (int64_t q : s.parts) rows_l += q / size_of(s.grid_rows);
  const int64_t block = rows_l * cb;
  const int64_t len = s.z_flat ? block / at.gz : block, lo = s.z_flat ? at.z * len : 0, hi = lo + len;
  int64_t brow = 0, off = 0;
  for (int64_t q : s.parts) {
    const int64_t n = q / size_of(s.grid_rows), r0 = off + coord_of(s.grid_rows) * n;
    for (int64_t i = 0; i < n; ++i, ++brow) {
      const int64_t b = brow * cb, a = std::max(b, lo), e = std::min(b + cb, hi);
      if (a < e) fn((r0 + i) * cols_full + c0 + (a - b), a - lo, e - a);
    }
    off += q;
  }
}

template <typename Fn>
void for_each_shard_piece(const ParamSpec& s, const ShardIndex& at, Fn fn) {
  // fn(full_offset_elems, shard_offset_elems, count_elems)
  if (s.role == ShardRole::kGrid) return for_each_grid_piece(s, at, fn);
  const int r = s.role == ShardRole::kExpert ? at.ep_rank : at.tp_rank, tp = s.role == ShardRole::kExpert ? at.ep : at.tp;
  if (s.role == ShardRole::kReplicated) {
    fn(0, 0, shape_numel(s.full));
    return;
  }
  int64_t row_len = s.full.size() > 1 ? s.full[1] : 1;
  if (s.role == ShardRole::kRow) {
    int64_t out = s.full[0], in = s.full[1], in_l = s.shard[1];
    for (int64_t o = 0; o < out; ++o) fn(o * in + r * in_l, o * in_l, in_l);
    return;
  }
  int64_t shard_off = 0;
  for (auto [b, n] : shard_rows(s, r, tp)) {
    fn(b * row_len, shard_off, n * row_len);
    shard_off += n * row_len;
  }
}

}  // namespace

void extract_shard(const ParamSpec& spec, const Tensor& full, Tensor& shard, const ShardIndex& at) {
  DHX_ASSERT(full.numel() == shape_numel(spec.full) && shard.numel() == shape_numel(spec.shard), "{}", spec.name);
  const float* f = full.f32();
  float* s = shard.f32();
  for_each_shard_piece(spec, at, [&](int64_t fo, int64_t so, int64_t n) {
    std::copy(f + fo, f + fo + n, s + so);
  });
}

void insert_shard(const ParamSpec& spec, const Tensor& shard, Tensor& full, const ShardIndex& at) {
  DHX_ASSERT(full.numel() == shape_numel(spec.full) && shard.numel() == shape_numel(spec.shard), "{}", spec.name);
  float* f = full.f32();
  const float* s = shard.f32();
  for_each_shard_piece(spec, at, [&](int64_t fo, int64_t so, int64_t n) {
    std::copy(s + so, s + so + n, f + fo);
  });
}

}  // namespace dhelix
