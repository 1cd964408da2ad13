// AxoNN's 3D grid (Lowering3D.h) as a UnitLowering: every column or row linear a grid region
// (Grid3D.h) with its weight block gathered over z, the norms exact over x, the vocabulary over y.
// The walk over model/'s steps is lower_unit's (UnitLowering.cc); Megatron's layouts are
// Lowering1D.cc.
#include "sharding/Lowering3D.h"

#include "base/Error.h"
#include "model/Params.h"
#include "model/UnitDesc.h"
#include "sharding/ExpertDispatch.h"
#include "sharding/Grid3D.h"
#include "sharding/OpFactory.h"
#include "sharding/TpRegion.h"
#include "sharding/UnitLowering.h"

namespace dhelix::sharding {

namespace {

class Axonn3D final : public UnitLowering {
 public:
  explicit Axonn3D(const Grid3D& b)
      : b_(b),
        oag_(b.lay.overlap3d.ag),
        keep_(b.lay.keep_gathered > 0 && b.gz > 1),
        ring_{b.m, b.lay, b.B, b.T, b.N, b.N, b.C, 1},
        moe_{b.m, b.lay, b.B, b.T, b.N, b.N / (b.gx * b.gy), b.C, b.gx * b.gy, "xy"} {}

  const ModelConfig& model() const override { return b_.m; }
  int64_t split() const override { return b_.gy; }
  int64_t batch() const override { return b_.B; }
  int64_t seq() const override { return b_.T; }
  double tokens() const override { return double(b_.N); }
  double stream_elems() const override { return double(b_.N * cx()); }

  // The unit's linears as grid regions (type A: column, B: row); the first block's all-gather opens
  // the unit, under the norm before its GEMM.
  void begin(const UnitDesc& d, std::vector<Op>& f) override {
    for (const UnitStep& s : d.steps)
      if (s.kind == UnitStepKind::kLinear && s.role != ShardRole::kVocab) lin_.push_back(region(s));
    fwd_blocks_.assign(lin_.size(), "");
    bwd_blocks_.assign(lin_.size(), "");
    if (lin_.empty()) return;
    fwd_blocks_[0] = gather_fwd(f, lin_[0], oag_ ? CollWait::kBackground : CollWait::kBlocking);
    if (oag_ && lin_.size() > 1) fwd_blocks_[1] = gather_fwd(f, lin_[1], CollWait::kBackground);
  }

  // Token embedding: the table's rows (vocabulary) over y and columns over x; a token outside this
  // rank's rows gives zeros, the all-reduce over y sums the one real row in: [N, C/Gx].
  void token_embed_fwd(const UnitStep& s, std::vector<Op>& f) override {
    const std::string part = b_.gy > 1 ? "e_p" : s.out;
    Op tok = compute_op(s.tag, "embed", {s.in[0]}, {part}, {s.weight});
    elem_cost(tok, stream_elems(), 0, 2);
    f.push_back(tok);
    if (b_.gy > 1)
      f.push_back(activation(collective_op("y.ar.embed", CollOp::kAllReduce, "y", {part}, s.out, kF * stream_elems())));
  }
  void token_embed_bwd(const UnitStep& s, const std::string& d_out, std::vector<Op>& g) override {
    Op eb = compute_op(s.tag + ".bwd", "embed_bwd", {s.in[0], d_out}, {}, {}, {s.weight});
    elem_cost(eb, stream_elems(), 1, 2);
    g.push_back(eb);
  }

  void norm_fwd(const UnitStep& s, std::vector<Op>& f) override { grid_norm_fwd(b_, f, s); }
  void norm_bwd(const UnitStep& s, const std::string& d_out, const std::string& d_res, const std::string& d_in,
                std::vector<Op>& g) override {
    grid_norm_bwd(b_, g, s, d_out, d_res, d_in);
  }

  // OAG: each block is gathered one GEMM ahead of its use, so its all-gather runs under the GEMM
  // before; the unit's first is prefetched by the neighbouring layer (prefetch_block) and adopted
  // here (gathered here only in the first layer). Without OAG: right before its GEMM, waited for
  // there. Backward walks the linears in reverse with the same rule. With keep_gathered (keep_) the
  // backward gathers nothing: its GEMMs read the forward's blocks, saved for it (and left out of a
  // recompute: their gathers are marked "kept", plan/Program.h add_recompute), and it prefetches
  // nothing for the layer below; the executor runs a kept gather once a step, in the first
  // micro-batch's forward, and binds its block in the later ones' (Executor::reuse_kept_block).
  void linear_fwd(const UnitStep& s, LinearSite at, std::vector<Op>& f) override {
    if (s.role == ShardRole::kVocab) return vocab_head_fwd(s, f);
    gather_ahead(at.index, at.index > 0, +1, "", fwd_blocks_, f);
    grid_linear_fwd(b_, f, lin_[size_t(at.index)], s.in[0], fwd_blocks_[size_t(at.index)], s.out);
  }
  void linear_bwd(const UnitStep& s, LinearSite at, const std::string& d_out, const std::string& d_in,
                  std::vector<Op>& g) override {
    if (s.role == ShardRole::kVocab) return vocab_head_bwd(s, d_out, d_in, g);
    const int n = at.count, j = n - 1 - at.index;  // position in the backward order
    if (keep_) {
      grid_linear_bwd(b_, g, lin_[size_t(at.index)], s.in[0], d_out, d_in, fwd_blocks_[size_t(at.index)], accum_);
      return;
    }
    if (j == 0) {
      bwd_blocks_[size_t(n - 1)] = gather_block(b_, g, lin_[size_t(n - 1)], ".bwd", oag_ ? CollWait::kBackground : CollWait::kBlocking);
      if (oag_ && n > 1) bwd_blocks_[size_t(n - 2)] = gather_block(b_, g, lin_[size_t(n - 2)], ".bwd", CollWait::kBackground);
    }
    gather_ahead(j, j > 0, -1, ".bwd", bwd_blocks_, g);
    grid_linear_bwd(b_, g, lin_[size_t(at.index)], s.in[0], d_out, d_in, bwd_blocks_[size_t(at.index)], accum_);
  }

  // Context parallelism on the grid: this rank's heads (over y) of its B sequences' two chunks run
  // CP's ring over "cp" exactly as under Megatron's layouts (CpRing.h): the grid splits heads and
  // features, cp the sequence, so the ring sees whole rows of this rank's heads.
  const TpRegion* cp_ring() const override { return b_.lay.cp > 1 ? &ring_ : nullptr; }

  // The MoE MLP on the grid runs as it does under Megatron's sequence parallelism, with the x-y
  // plane for the tp group (moe_): each of the plane's Gx*Gy ranks takes its slice of Ns = N/(Gx Gy)
  // of the plane's tokens with whole features, routes it and runs the experts on it
  // (ExpertDispatch.h: the all-to-alls over ep, the routing statistics summed over the plane); the
  // slices' outputs are gathered over the plane and each rank keeps its features. The router and
  // the experts are not split over the grid (ParamSharding.cc), their gradients summed over it.
  //   fwd: [x.ag in] -> grid_rows (slice xy, all C) -> MoE MLP -> [xy.ag] -> grid_cols (C/Gx of x)
  //   bwd: the same two moves around the MoE's backward: the stream's gradient is replicated over y
  //        as the stream is, so the slice of d_out is taken the way the input's was.
  void moe_fwd(const UnitStep& s, std::vector<Op>& f) override {
    const std::string rows = to_rows(s.tag, s.in[0], f), out_rows = sliced() ? s.out + ".rows" : s.out;
    sharding::moe_fwd(moe_, f, rows, out_rows);
    to_grid(s.tag, out_rows, s.out, f);
  }
  void moe_bwd(const UnitStep& s, const std::string& d_out, const std::string& d_in, std::vector<Op>& g) override {
    const std::string d_rows = to_rows(s.tag + ".bwd", d_out, g), d_in_rows = sliced() ? d_in + ".rows" : d_in;
    sharding::moe_bwd(moe_, g, sliced() ? s.in[0] + ".rows" : s.in[0], d_rows, d_in_rows);
    to_grid(s.tag + ".bwd", d_in_rows, d_in, g);
  }

  // Cross-entropy vocab-parallel over y (max, then sum-exp and the target logit, all-reduced over y).
  void xent_fwd(const UnitStep& s, std::vector<Op>& f) override {
    DHX_ASSERT(s.in == std::vector<std::string>({"logits", "targets"}) && s.out == "loss",
               "{}: the 3D cross-entropy reads logits and targets and writes loss", s.tag);
    const double N = double(b_.N), Vl = double(vocab_local());
    if (b_.gy == 1) {
      Op x = compute_op("xent", "cross_entropy", {"logits", "targets"}, {"loss", "dlogits"});
      elem_cost(x, N * Vl, 6, 3);
      f.push_back(x);
      return;
    }
    Op mx = compute_op("xent.max", "xent_max", {"logits"}, {"xent.m"});
    elem_cost(mx, N * Vl, 1, 1);
    f.push_back(mx);
    Op ar1 = collective_op("y.ar.xent.max", CollOp::kAllReduce, "y", {"xent.m"}, "xent.m", kF * N);
    ar1.attrs["reduce_max"] = 1;
    f.push_back(ar1);
    Op st = compute_op("xent.stats", "xent_stats", {"logits", "targets", "xent.m"}, {"xent.s"});
    elem_cost(st, N * Vl, 3, 1);
    f.push_back(st);
    f.push_back(collective_op("y.ar.xent.sum", CollOp::kAllReduce, "y", {"xent.s"}, "xent.s", kF * 2 * N));
    Op fin = compute_op("xent.loss", "xent_finish", {"logits", "targets", "xent.m", "xent.s"}, {"loss", "dlogits"});
    elem_cost(fin, N * Vl, 4, 2);
    f.push_back(fin);
  }

  void end_bwd(std::vector<Op>& g) override {
    for (Op& a : accum_) g.push_back(std::move(a));  // the reduce-scattered weight gradients (ORS: here)
    accum_.clear();
  }

 private:
  int64_t cx() const { return b_.C / b_.gx; }
  int64_t vocab_local() const { return padded_vocab(b_.m, b_.gy) / b_.gy; }

  // The block of a column linear is type A ([out/Gy, in/Gx], each fused part over y), a row's type B
  // ([out/Gx, in/Gy]).
  GridLinear region(const UnitStep& s) const {
    GridLinear l{s.tag, s.weight, s.bias, GridType::kA, 0, 0};
    if (s.role == ShardRole::kRow) {
      l.type = GridType::kB;
      l.rows = s.out_features / b_.gx;
      l.cols = s.in_features / b_.gy;
    } else {
      for (int64_t q : s.parts) l.rows += q / b_.gy;
      l.cols = s.in_features / b_.gx;
    }
    return l;
  }

  // At the k-th linear of a direction (dir +1 forward, -1 backward; k > 0, or k = 0 after begin):
  // without OAG its own block, blocking; with OAG the next one's, in the background, and at the
  // last linear the neighbouring layer's first (prefetch_block).
  void gather_ahead(int k, bool here, int dir, const std::string& suffix, std::vector<std::string>& blocks,
                    std::vector<Op>& ops) {
    const int n = int(lin_.size());
    auto linear = [&](int j) { return size_t(dir > 0 ? j : n - 1 - j); };  // j-th in this direction
    auto gather = [&](const GridLinear& l, CollWait wait) {
      return dir > 0 ? gather_fwd(ops, l, wait) : gather_block(b_, ops, l, suffix, wait);
    };
    if (here) {
      if (!oag_)
        blocks[linear(k)] = gather(lin_[linear(k)], CollWait::kBlocking);
      else if (k + 1 < n)
        blocks[linear(k + 1)] = gather(lin_[linear(k + 1)], CollWait::kBackground);
    }
    if (k == n - 1) prefetch_block(b_, ops, lin_[linear(0)], suffix, dir);
  }

  // A forward gather of `l`'s block; with keep_ marked "kept": its block is saved for the backward,
  // never gathered again by a recompute, and gathered once a step (the first micro-batch's).
  std::string gather_fwd(std::vector<Op>& ops, const GridLinear& l, CollWait wait) {
    const std::string buf = gather_block(b_, ops, l, "", wait);
    if (keep_ && !buf.empty()) ops.back().attrs["kept"] = 1;
    return buf;
  }

  // LM head: logits = a type-A GEMM with the vocabulary over y (all-reduced over x).
  void vocab_head_fwd(const UnitStep& s, std::vector<Op>& f) {
    const std::string logits_p = b_.gx > 1 ? s.out + "_p" : s.out;
    Op lg = compute_op(s.tag, "linear", {s.in[0]}, {logits_p}, {s.weight});
    lg.attrs["vocab_rows"] = 1;
    gemm_cost(lg, double(b_.N), double(cx()), double(vocab_local()));
    f.push_back(lg);
    if (b_.gx > 1)
      f.push_back(activation(collective_op("x.ar." + s.tag, CollOp::kAllReduce, "x", {logits_p}, s.out,
                                           kF * double(b_.N * vocab_local()))));
  }
  // Its input gradient all-reduced over y (under the weight-gradient GEMM with overlap3d.ar).
  void vocab_head_bwd(const UnitStep& s, const std::string& d_out, const std::string& d_in, std::vector<Op>& g) {
    const std::string d_in_p = b_.gy > 1 ? d_in + "_p" : d_in;
    Op dg = compute_op(s.tag + ".dgrad", "linear_dgrad", {d_out}, {d_in_p}, {s.weight});
    dg.attrs["vocab_rows"] = 1;
    gemm_cost(dg, double(b_.N), double(vocab_local()), double(cx()));
    g.push_back(dg);
    if (b_.gy > 1)
      g.push_back(activation(collective_op("y.ar." + s.tag + ".bwd", CollOp::kAllReduce, "y", {d_in_p}, d_in,
                                           kF * double(b_.N * cx()),
                                           b_.lay.overlap3d.ar ? CollWait::kBlockEnd : CollWait::kBlocking)));
    Op wg = compute_op(s.tag + ".wgrad", "linear_wgrad", {d_out, s.in[0]}, {}, {}, {s.weight});
    wg.attrs["vocab_rows"] = 1;
    gemm_cost(wg, double(b_.N), double(vocab_local()), double(cx()));
    g.push_back(wg);
  }

  // The MoE MLP's token slices: with a plane of one rank its input is the stream itself.
  bool sliced() const { return b_.gx * b_.gy > 1; }
  // [N, C/Gx] (features over x) -> this rank's slice of the tokens with all features [Ns, C]:
  // gathered over x ([Gx N, C/Gx], x-major), then grid_rows takes rows [xy Ns, (xy+1) Ns) of every
  // x piece side by side. Returns the slice's buffer.
  std::string to_rows(const std::string& tag, const std::string& in, std::vector<Op>& ops) const {
    if (!sliced()) return in;
    std::string g = in;
    if (b_.gx > 1) {
      g = in + "_xg";
      ops.push_back(activation(
          collective_op("x.ag." + tag, CollOp::kAllGather, "x", {in}, g, kF * double(b_.N * b_.C))));
    }
    const std::string rows = in + ".rows";
    Op op = compute_op(tag + ".rows", "grid_rows", {g}, {rows});
    elem_cost(op, double(moe_.Ns * b_.C), 0, 2);
    ops.push_back(op);
    return rows;
  }
  // This rank's slice [Ns, C] -> the stream's layout [N, C/Gx]: gathered over the plane (the slices
  // in xy order are the N tokens in order), then grid_cols keeps the features of x.
  void to_grid(const std::string& tag, const std::string& rows, const std::string& out, std::vector<Op>& ops) const {
    if (!sliced()) return;
    const std::string g = rows + "_g";
    ops.push_back(activation(
        collective_op("xy.ag." + tag, CollOp::kAllGather, "xy", {rows}, g, kF * double(b_.N * b_.C))));
    Op op = compute_op(tag + ".cols", "grid_cols", {g}, {out});
    elem_cost(op, double(b_.N * cx()), 0, 2);
    ops.push_back(op);
  }

  const Grid3D& b_;
  const bool oag_;
  const bool keep_;  // the backward reads the forward's gathered blocks (LayoutConfig::keep_gathered)
  std::vector<GridLinear> lin_;                        // the unit's column and row linears, forward order
  std::vector<std::string> fwd_blocks_, bwd_blocks_;   // their gathered blocks ("" reads the shard)
  std::vector<Op> accum_;
  const TpRegion ring_;  // the ring's extents (CpRing.h reads Megatron's context; tp = 1 here)
  const TpRegion moe_;   // the MoE MLP's: the plane's tokens split over "xy" as tp splits them
};

}  // namespace

ModelPrograms lower_3d(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb) {
  Grid3D b{m, lay, mb.B, mb.T, mb.tokens(), m.d_model, lay.tp_x, lay.tp_y, lay.tp_z};
  DHX_CHECK(!m.is_moe() || b.N % (b.gx * b.gy) == 0, ConfigError,
            "micro-batch tokens {} (B={} x T={}) are not divisible by the x-y plane's tp_x*tp_y={}: the MoE MLP on the "
            "3D grid splits them over the plane",
            b.N, mb.B, mb.T, b.gx * b.gy);
  ModelPrograms out;
  for (auto [prog, desc] : {std::pair{&out.embed, describe_embed(m)}, std::pair{&out.block, describe_block(m)},
                            std::pair{&out.head, describe_head(m)}}) {
    Axonn3D lw(b);
    *prog = lower_unit(desc, lw, lay.recompute);
  }
  return out;
}

}  // namespace dhelix::sharding
