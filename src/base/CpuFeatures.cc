// CPU feature detection by cpuid (CpuFeatures.h).
#include "base/CpuFeatures.h"

#include <atomic>

#include <cpuid.h>

namespace dhelix::cpu {

std::string Bf16Support::describe() const {
  std::string s;
  if (amx_bf16) s += "amx_bf16";
  if (avx512_bf16) s += std::string(s.empty() ? "" : " ") + "avx512_bf16";
  return s.empty() ? "none" : s;
}

namespace {
std::atomic<bool> g_overridden{false};
Bf16Support g_override;
}  // namespace

void set_bf16_support_for_tests(const Bf16Support& s) {
  g_override = s;
  g_overridden = true;
}

void reset_bf16_support_for_tests() { g_overridden = false; }

Bf16Support bf16_support() {
  if (g_overridden) return g_override;
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
