// What the CPU offers for bf16 arithmetic, read from cpuid once. In base so that the config can
// refuse bf16 on a CPU without it (train/Config.cc) without depending on the kernels; the bf16
// GEMMs themselves are kernels/cpu/Bf16.h. Not here: any arithmetic.
#pragma once
#include <string>

namespace dhelix::cpu {

struct Bf16Support {
  bool avx512_bf16 = false;  // CPUID.(EAX=7,ECX=1):EAX[5]
  bool amx_bf16 = false;     // CPUID.(EAX=7,ECX=0):EDX[22] and AMX-TILE EDX[24]
  bool usable() const { return avx512_bf16 || amx_bf16; }
  std::string describe() const;  // "amx_bf16 avx512_bf16", or "none"
};
// What this CPU offers (read once), or what set_bf16_support_for_tests put in its place.
Bf16Support bf16_support();
// TEST HOOK: makes bf16_support() return `s` (a CPU without bf16, on a machine that has it) until
// reset_bf16_support_for_tests(); the refusals that read it can then be tested anywhere.
void set_bf16_support_for_tests(const Bf16Support& s);
void reset_bf16_support_for_tests();

}  // namespace dhelix::cpu
