// One walk over model/'s unit description (UnitDesc.h) for every layout: lower_unit writes the
// steps no layout splits differently (rope, attention's op, activation, residual, positions, the
// residual biases' gradients) and asks the layout's UnitLowering for the ones it shards (norms,
// linears, attention's placement, the MoE MLP, the token embedding, cross-entropy). The backward is
// the description walked in reverse, each buffer's gradient named "d<buffer>" unless a step passes
// its output's gradient through. Megatron's 1D layouts implement it in Lowering1D.cc, AxoNN's 3D
// grid in Lowering3D.cc. Internal to sharding/: callers use build_programs (ModelPrograms.h).
#pragma once
#include <string>
#include <vector>

#include "layout/Layout.h"
#include "model/UnitDesc.h"
#include "plan/Program.h"
#include "sharding/TpRegion.h"

namespace dhelix::sharding {

// Where a linear sits among the unit's column and row linears (forward order): the layouts place
// weight gathers and weight-gradient GEMMs by it. A vocabulary linear is not counted (index -1).
struct LinearSite {
  int index = -1;
  int count = 0;
};

class UnitLowering {
 public:
  virtual ~UnitLowering() = default;

  // The extents the shared steps are priced with.
  virtual const ModelConfig& model() const = 0;
  virtual int64_t split() const = 0;        // attention heads and MLP features are split over it
  virtual int64_t batch() const = 0;        // B sequences of the micro-batch
  virtual int64_t seq() const = 0;          // T tokens of each, on this rank
  virtual double tokens() const = 0;        // rows the attention, rope and activation steps see
  virtual double stream_elems() const = 0;  // elements of the residual stream this rank holds

  // Called once before a unit's forward steps, with all of them (the 3D grid gathers its first
  // weight block here, under the norm).
  virtual void begin(const UnitDesc& d, std::vector<Op>& f) {}
  virtual void token_embed_fwd(const UnitStep& s, std::vector<Op>& f) = 0;
  virtual void norm_fwd(const UnitStep& s, std::vector<Op>& f) = 0;
  virtual void linear_fwd(const UnitStep& s, LinearSite at, std::vector<Op>& f) = 0;
  // The extents CP's ring runs with (CpRing.h), or null when the layout has no context parallelism.
  virtual const TpRegion* cp_ring() const { return nullptr; }
  // `attn`: the attention op over this rank's heads; under context parallelism (cp_ring()) it runs
  // as CP's ring of steps.
  virtual void attention_fwd(const UnitStep& s, Op attn, std::vector<Op>& f);
  virtual void moe_fwd(const UnitStep& s, std::vector<Op>& f) = 0;
  virtual void xent_fwd(const UnitStep& s, std::vector<Op>& f) = 0;

  virtual void token_embed_bwd(const UnitStep& s, const std::string& d_out, std::vector<Op>& g) = 0;
  // d_in = d_res + norm_bwd(d_out); d_res is "" where the norm's input is no residual's skip.
  virtual void norm_bwd(const UnitStep& s, const std::string& d_out, const std::string& d_res,
                        const std::string& d_in, std::vector<Op>& g) = 0;
  virtual void linear_bwd(const UnitStep& s, LinearSite at, const std::string& d_out, const std::string& d_in,
                          std::vector<Op>& g) = 0;
  virtual void attention_bwd(const UnitStep& s, Op attn_b, std::vector<Op>& g);
  virtual void moe_bwd(const UnitStep& s, const std::string& d_out, const std::string& d_in, std::vector<Op>& g) = 0;
  // After the unit's last backward step: ops a layout held back to trail the unit (weight
  // gradients that nothing in the unit reads).
  virtual void end_bwd(std::vector<Op>& g) {}
};

// The unit's program under the layout `lw` (lifetimes not yet annotated). A transformer layer
// ("block") under `recompute` gets its recompute ops (plan/Program.h add_recompute): selective, the
// ops the attention step wrote; full, every forward op the backward needs.
LayerProgram lower_unit(const UnitDesc& d, UnitLowering& lw, Recompute recompute);

}  // namespace dhelix::sharding
