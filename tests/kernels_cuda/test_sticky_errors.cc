// A device fault (an illegal or misaligned address, a kernel's assert, a launch failure) is sticky:
// the CUDA context is unusable afterwards and every later call fails with it, so one faulting test
// would fail every test after it in this binary and tell nothing of theirs. This listener checks
// the device after each test; on a sticky error it prints
//     [ STICKY   ] Suite.Name: <the error>
// and ends the process at once with kStickyExit, so that scripts/gpu-device's test sections run the
// tests not yet run in a fresh process (their results stay their own) and name this one as the
// crasher. Without a GPU (or where no test made a context) it does nothing.
// A test that hangs (a kernel that never ends, a wait nothing will signal) would likewise hold the
// section until its timeout: a watchdog ends the process with kHungExit when a test has not ended
// after DHELIX_TEST_WATCHDOG_S seconds (default 150; 0: off), printing
//     [ HUNG     ] Suite.Name: no end after N s
// (the collectives' own timeouts, comm.timeout_s, end a stuck rank sooner and by name).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace dhelix::cuda::test {
namespace {

constexpr int kStickyExit = 86;  // scripts/gpu-device's test sections know both
constexpr int kHungExit = 87;

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

// DHELIX_TEST_WATCHDOG_S: seconds a test may run (default 150; 0 or unset-and-no-GPU: no watchdog).
int watchdog_seconds() {
  const char* v = std::getenv("DHELIX_TEST_WATCHDOG_S");
  if (v == nullptr || *v == '\0') return have_gpu() ? 150 : 0;
  char* end = nullptr;
  const long s = std::strtol(v, &end, 10);
  if (*end != '\0' || s < 0) {
    std::fprintf(stderr, "DHELIX_TEST_WATCHDOG_S='%s' is not a whole number of seconds >= 0; the watchdog is off\n", v);
    return 0;
  }
  return static_cast<int>(s);
}

// One thread for the process, armed at each test's start and disarmed at its end.
class Watchdog {
 public:
  explicit Watchdog(int seconds) : seconds_(seconds) {
    std::thread([this] { loop(); }).detach();  // lives as long as the process
  }
  void arm(std::string name) {
    std::lock_guard<std::mutex> g(mu_);
    name_ = std::move(name);
    due_ = std::chrono::steady_clock::now() + std::chrono::seconds(seconds_);
    armed_ = true;
    cv_.notify_all();
  }
  void disarm() {
    std::lock_guard<std::mutex> g(mu_);
    armed_ = false;
    cv_.notify_all();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      if (!armed_) {
        cv_.wait(l);
        continue;
      }
      if (cv_.wait_until(l, due_) == std::cv_status::timeout && armed_ && std::chrono::steady_clock::now() >= due_) {
        std::printf("[ HUNG     ] %s: no end after %d s (DHELIX_TEST_WATCHDOG_S); ending the process (exit %d)\n",
                    name_.c_str(), seconds_, kHungExit);
        std::fflush(stdout);
        std::_Exit(kHungExit);
      }
    }
  }
  const int seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string name_;
  std::chrono::steady_clock::time_point due_;
  bool armed_ = false;
};

class StickyErrorListener : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo& info) override {
    // Made at the first test, not at static initialisation (it asks the CUDA runtime for a GPU), and
    // never destroyed: its thread waits on it until the process ends.
    if (!asked_) {
      asked_ = true;
      if (const int seconds = watchdog_seconds(); seconds > 0) watchdog_ = new Watchdog(seconds);
    }
    if (watchdog_) watchdog_->arm(std::string(info.test_suite_name()) + "." + info.name());
  }
  // The device checked while the watchdog is still armed (a kernel that never ends hangs this sync).
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (have_gpu()) {
      const cudaError_t e = cudaDeviceSynchronize();
      if (sticky(e)) {
        std::printf("[ STICKY   ] %s.%s: %s (%s): the CUDA context is lost; ending the process (exit %d)\n",
                    info.test_suite_name(), info.name(), cudaGetErrorName(e), cudaGetErrorString(e), kStickyExit);
        std::fflush(stdout);
        std::_Exit(kStickyExit);
      }
    }
    if (watchdog_) watchdog_->disarm();
  }
  bool asked_ = false;
  Watchdog* watchdog_ = nullptr;  // null: no watchdog (DHELIX_TEST_WATCHDOG_S=0, or no GPU and unset)
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

// The watchdog's subject (tests/kernels_cuda/watchdog.sh runs it alone with DHELIX_TEST_WATCHDOG_S=1
// and expects the process to end with kHungExit, naming it): a test that outlives its limit.
TEST(CudaStickyErrors, DISABLED_SleepsPastTheWatchdog) { std::this_thread::sleep_for(std::chrono::seconds(5)); }

}  // namespace
}  // namespace dhelix::cuda::test
