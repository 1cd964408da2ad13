// Megatron's layouts (Lowering1D.h) as a UnitLowering: the norms on the sequence shard, the
// column, row and vocabulary regions (TpRegion.h) around the linears, CP's ring (CpRing.h) around
// attention, EP's dispatch/combine (ExpertDispatch.h) around the experts. The walk over model/'s
// steps is lower_unit's (UnitLowering.cc); the 3D grid's lowering is Lowering3D.cc.
#include "sharding/Lowering1D.h"

#include "base/Error.h"
#include "model/Params.h"
#include "model/UnitDesc.h"
#include "sharding/ExpertDispatch.h"
#include "sharding/OpFactory.h"
#include "sharding/TpRegion.h"
#include "sharding/UnitLowering.h"

namespace dhelix::sharding {

namespace {

class Megatron1D final : public UnitLowering {
 public:
  explicit Megatron1D(const TpRegion& b) : b_(b) {}

  const ModelConfig& model() const override { return b_.m; }
  int64_t split() const override { return b_.tp; }
  int64_t batch() const override { return b_.B; }
  int64_t seq() const override { return b_.T; }
  double tokens() const override { return double(b_.N); }
  double stream_elems() const override { return double(b_.Ns * b_.C); }

  void token_embed_fwd(const UnitStep& s, std::vector<Op>& f) override { vocab_embed_fwd(b_, f, s.out); }
  void token_embed_bwd(const UnitStep& s, const std::string& d_out, std::vector<Op>& g) override {
    vocab_embed_bwd(b_, g, d_out);
  }

  void norm_fwd(const UnitStep& s, std::vector<Op>& f) override {
    const bool ln = s.fn == "layernorm";
    Op op = ln ? compute_op(s.tag, "layernorm", {s.in[0]}, {s.out, s.tag + ".mean", s.tag + ".rstd"}, {s.weight, s.bias})
               : compute_op(s.tag, "rmsnorm", {s.in[0]}, {s.out, s.tag + ".rstd"}, {s.weight});
    elem_cost(op, stream_elems(), 5, 2);
    f.push_back(op);
  }
  void norm_bwd(const UnitStep& s, const std::string& d_out, const std::string& d_res, const std::string& d_in,
                std::vector<Op>& g) override {
    const bool ln = s.fn == "layernorm";
    std::vector<std::string> inputs = {d_out, s.in[0]};
    if (ln) inputs.push_back(s.tag + ".mean");
    inputs.push_back(s.tag + ".rstd");
    if (!d_res.empty()) inputs.push_back(d_res);
    std::vector<std::string> grads = {s.weight};
    if (ln) grads.push_back(s.bias);
    Op op = compute_op(s.tag + ".bwd", ln ? "layernorm_bwd" : "rmsnorm_bwd", inputs, {d_in}, {s.weight}, grads);
    op.attrs["residual"] = d_res.empty() ? 0 : 1;
    elem_cost(op, stream_elems(), 10, 4);
    g.push_back(op);
  }

  void linear_fwd(const UnitStep& s, LinearSite, std::vector<Op>& f) override {
    if (s.role == ShardRole::kRow)
      row_fwd(b_, f, region(s), s.in[0], s.out);
    else
      column_fwd(b_, f, region(s), s.in[0], s.out);
  }
  // Where each weight-gradient GEMM goes (WgradPolicy; results do not depend on it). A row linear's
  // is held for the column linear below it in the backward, which issues it after its input
  // gradient's reduce-scatter, under that collective; with tp = 1 there is no collective and it
  // runs inline, unless that column is the unit's first linear. The first linear's own (and
  // what it holds) trails the unit, after the input gradient of its norm, so the unit below gets
  // dx two GEMMs earlier; with tp > 1 half of it stays under the reduce-scatter that norm waits for.
  // (In a GPT-2 124M SI trace at 1 Gbit/s, attn.out's wgrad alone under that reduce-scatter left
  // 2.4-3.5 ms per layer of gaps; the trailing half is what a Strand-Interleaving plan may carry
  // into the next layer pair, under its first collective: SIPlan::carry.)
  void linear_bwd(const UnitStep& s, LinearSite at, const std::string& d_out, const std::string& d_in,
                  std::vector<Op>& g) override {
    if (s.role == ShardRole::kVocab) {
      column_bwd(b_, g, region(s), s.in[0], d_out, d_in, WgradPolicy::kInline);
    } else if (s.role == ShardRole::kRow) {
      const bool below_is_first = at.index == 1;
      held_ = row_bwd(b_, g, region(s), s.in[0], d_out, d_in, below_is_first ? WgradPolicy::kHold : WgradPolicy::kHoldIfTp);
    } else {
      const WgradPolicy own =
          at.index == 0 ? (b_.tp > 1 ? WgradPolicy::kSplit : WgradPolicy::kDefer) : WgradPolicy::kInline;
      column_bwd(b_, g, region(s), s.in[0], d_out, d_in, own, std::move(held_), &deferred_);
      held_.clear();
    }
  }

  const TpRegion* cp_ring() const override { return b_.lay.cp > 1 ? &b_ : nullptr; }

  void moe_fwd(const UnitStep& s, std::vector<Op>& f) override { sharding::moe_fwd(b_, f, s.in[0], s.out); }
  void moe_bwd(const UnitStep& s, const std::string& d_out, const std::string& d_in, std::vector<Op>& g) override {
    sharding::moe_bwd(b_, g, s.in[0], d_out, d_in);
  }

  void xent_fwd(const UnitStep& s, std::vector<Op>& f) override {
    DHX_ASSERT(s.in == std::vector<std::string>({"logits", "targets"}) && s.out == "loss",
               "{}: vocab_xent_fwd reads logits and targets and writes loss", s.tag);
    vocab_xent_fwd(b_, f, vocab_local());
  }

  void end_bwd(std::vector<Op>& g) override {
    for (Op& w : held_) g.push_back(std::move(w));  // a row linear with no column below it
    for (Op& w : deferred_) g.push_back(std::move(w));
    held_.clear();
    deferred_.clear();
  }

 private:
  int64_t vocab_local() const { return padded_vocab(b_.m, int(b_.tp)) / b_.tp; }  // the vocabulary over tp
  // The linear's local extent: a column's output features (each fused part split over tp), a row's
  // input features, the vocabulary head's padded rows.
  TpLinear region(const UnitStep& s) const {
    TpLinear l{s.tag, s.weight, s.bias, 0};
    if (s.role == ShardRole::kVocab)
      l.local = vocab_local();
    else if (s.role == ShardRole::kRow)
      l.local = s.in_features / b_.tp;
    else
      for (int64_t q : s.parts) l.local += q / b_.tp;
    return l;
  }

  const TpRegion& b_;
  std::vector<Op> held_, deferred_;
};

}  // namespace

ModelPrograms lower_1d(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb) {
  DHX_CHECK(lay.cp == 1 || mb.T % 2 == 0, ConfigError,
            "context parallelism (parallel.cp={}) needs an even number of local rows per sequence (T/cp = {}): "
            "model.seq_len divisible by 2*cp",
            lay.cp, mb.T);
  TpRegion b{m, lay, mb.B, mb.T, mb.tokens(), 0, m.d_model, lay.tp};
  DHX_CHECK(b.N % lay.tp == 0, ConfigError, "micro-batch tokens {} (B={} x T={}) are not divisible by parallel.tp={}",
            b.N, mb.B, mb.T, lay.tp);
  b.Ns = b.N / lay.tp;
  ModelPrograms out;
  for (auto [prog, desc] : {std::pair{&out.embed, describe_embed(m)}, std::pair{&out.block, describe_block(m)},
                            std::pair{&out.head, describe_head(m)}}) {
    Megatron1D lw(b);
    *prog = lower_unit(desc, lw, lay.recompute);
  }
  return out;
}

}  // namespace dhelix::sharding
