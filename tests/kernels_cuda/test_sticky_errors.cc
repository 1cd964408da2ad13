// A device fault (an illegal or misaligned address, a kernel's assert, a launch failure) is sticky:
// the CUDA context is unusable afterwards and every later call fails with it, so one faulting test
// would fail every test after it in this binary and tell nothing of theirs. This listener checks
// the device after each test; on a sticky error it prints
//     [ STICKY   ] Suite.Name: <the error>
// and ends the process at once with kStickyExit, so that scripts/gpu-device's test sections run the
// tests not yet run in a fresh process (their results stay their own) and name this one as the
// crasher. Without a GPU (or where no test made a context) it does nothing.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

namespace dhelix::cuda::test {
namespace {

constexpr int kStickyExit = 86;  // scripts/gpu-device's test sections know it

// The errors after which the context cannot be used (CUDA runtime API: "the process must be
// terminated and relaunched").
bool sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
    case cudaErrorIllegalInstruction:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

bool have_gpu() {
  static const bool yes = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return yes;
}

class StickyErrorListener : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!have_gpu()) return;
    const cudaError_t e = cudaDeviceSynchronize();
    if (!sticky(e)) return;
    std::printf("[ STICKY   ] %s.%s: %s (%s): the CUDA context is lost; ending the process (exit %d)\n",
                info.test_suite_name(), info.name(), cudaGetErrorName(e), cudaGetErrorString(e), kStickyExit);
    std::fflush(stdout);
    std::_Exit(kStickyExit);
  }
};

// Registered before main (gtest_main) runs the tests; appended after the default printer, so for a
// test's end it runs first and a sticky test's own OK/FAILED line is never printed (it stays RUN in
// the log: the crasher).
const bool kRegistered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new StickyErrorListener);
  return true;
}();

// Oracle: the CUDA runtime API's list of errors that leave the context unusable; an ordinary
// error (a bad argument, no device, out of memory) is not one.
TEST(CudaStickyErrors, OnlyContextLosingErrorsAreSticky) {
  EXPECT_TRUE(kRegistered);
  for (cudaError_t e : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorMisalignedAddress, cudaErrorAssert})
    EXPECT_TRUE(sticky(e)) << cudaGetErrorName(e);
  for (cudaError_t e : {cudaSuccess, cudaErrorInvalidValue, cudaErrorMemoryAllocation, cudaErrorNoDevice,
                        cudaErrorInsufficientDriver, cudaErrorNotReady})
    EXPECT_FALSE(sticky(e)) << cudaGetErrorName(e);
}

}  // namespace
}  // namespace dhelix::cuda::test
