// The attention backward's form (kernels/cuda/Attention.h AttnBwdForm) set for a scope, the one
// before restored however the scope ends (a later test runs in it). For the attention tests.
#pragma once
#include "kernels/cuda/Attention.h"

namespace dhelix::cuda::test {

struct FormGuard {
  explicit FormGuard(AttnBwdForm f) : was(attention_bwd_form()) { set_attention_bwd_form(f); }
  ~FormGuard() { set_attention_bwd_form(was); }
  FormGuard(const FormGuard&) = delete;
  FormGuard& operator=(const FormGuard&) = delete;
  AttnBwdForm was;
};

}  // namespace dhelix::cuda::test
