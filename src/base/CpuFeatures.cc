// CPU feature detection by cpuid (CpuFeatures.h).
#include "base/CpuFeatures.h"

#include <cpuid.h>

namespace dhelix::cpu {

std::string Bf16Support::describe() const {
  std::string s;
  if (amx_bf16) s += "amx_bf16";
  if (avx512_bf16) s += std::string(s.empty() ? "" : " ") + "avx512_bf16";
  return s.empty() ? "none" : s;
}

Bf16Support bf16_support() {
  static const Bf16Support s = [] {
    Bf16Support r;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
      r.amx_bf16 = ((d >> 22) & 1u) && ((d >> 24) & 1u);
      if (a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) r.avx512_bf16 = (a >> 5) & 1u;
    }
    return r;
  }();
  return s;
}

}  // namespace dhelix::cpu
