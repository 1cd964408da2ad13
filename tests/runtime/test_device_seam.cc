// The device seam (tensor/Device.h, runtime/Stream.h, runtime/KernelRegistry.h). Oracles: the
// contracts written in those headers -- device spellings parse to what they name and bad ones
// throw ConfigError naming the text; the host stream runs launched work in issue order before
// launch returns, and waiting on a collective's event returns only once the collective completed
// (its result is there: the sum of the ranks' values); the host registry binds exactly the CPU op
// codes; a CUDA device is refused with DeviceError (never a silent fallback to the host) in a
// build without the CUDA backend; a host buffer's host view is the buffer itself (Env.h).
#include <gtest/gtest.h>

#include <functional>

#include <string>
#include <vector>

#include "base/Error.h"
#include "comm/LocalBackend.h"
#include "runtime/Env.h"
#include "runtime/KernelRegistry.h"
#include "runtime/Stream.h"
#include "tensor/DeviceMemory.h"
#include "tensor/Tensor.h"

namespace dhelix {
namespace {

TEST(Device, ParsesItsSpellings) {
  EXPECT_EQ(parse_device("cpu"), Device::host());
  EXPECT_EQ(parse_device("host"), Device::host());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(parse_device("cuda:3").str(), "cuda:3");
  EXPECT_EQ(Device::host().str(), "cpu");
  for (const std::string bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "CPU"}) {
    try {
      parse_device(bad);
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(Device, TensorsKnowTheirDevice) {
  EXPECT_EQ(Tensor::empty({4, 3}).device(), Device::host());
  EXPECT_EQ(Tensor().device(), Device::host());
  // No GPU 4096 anywhere; without CUDA no GPU at all (tests/kernels_cuda allocates on a real one).
  EXPECT_THROW(Tensor::empty({4}, DType::kF32, nullptr, Device::cuda(4096)), DeviceError);
  if (!cuda_built()) {
    EXPECT_THROW(Tensor::empty({4}, DType::kF32, nullptr, Device::cuda(0)), DeviceError);
  }
}

TEST(HostStream, RunsLaunchedWorkInIssueOrder) {
  auto s = make_stream(Device::host());
  EXPECT_EQ(s->device(), Device::host());
  std::vector<int> ran;
  for (int i = 0; i < 5; ++i) {
    s->launch([&ran, i] { ran.push_back(i); });
    EXPECT_EQ(static_cast<int>(ran.size()), i + 1);  // finished when launch returned
  }
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2, 3, 4}));
  auto e = s->record();
  EXPECT_TRUE(e->ready());
  s->wait(*e);
}

// A host event keeps no device time: asking for the seconds between two is a DeviceError (the GPU
// trace reads only CUDA events recorded with timing), never a made-up figure.
TEST(HostStream, ItsEventsKeepNoDeviceTime) {
  auto s = make_stream(Device::host());
  auto a = s->record(/*timed=*/true), b = s->record(true);
  EXPECT_THROW((void)b->seconds_since(*a), DeviceError);
}

// The executor's bracket of a pair's device frees (tensor/DeviceMemory.h): holds nest per thread,
// and a release without a hold is an InternalError in every build (a bracketing bug surfaces).
// Nothing is held on the host: host memory is never given back through device_free.
TEST(DeviceFreeHolds, NestAndAnUnmatchedReleaseIsAnError) {
  hold_device_frees();
  hold_device_frees();
  { Tensor t = Tensor::empty({1024}); }
  EXPECT_EQ(held_device_frees(), 0u);
  release_device_frees();
  release_device_frees();
  EXPECT_THROW(release_device_frees(), InternalError);
}

TEST(HostStream, WaitOnACollectiveJoinsIt) {
  run_local_ranks(2, [](CommContext& comm) {
    auto s = make_stream(Device::host());
    Tensor t = Tensor::empty({1024});
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(comm.rank() + 1);
    Work w = comm.world().all_reduce(t);
    WorkEvent done(w);
    s->wait(done);
    EXPECT_TRUE(done.ready());
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.f32()[i], 3.0f) << i;  // 1 + 2, exact in fp32
  });
}

// UnitEnv::host_view (Env.h) on the host: the buffer itself, no copy (a GPU's mirrors are
// tests/kernels_cuda/test_stream.cc's); a buffer the environment lacks is an InternalError naming it.
TEST(UnitEnv, TheHostViewOfAHostBufferIsTheBufferItself) {
  UnitEnv env;
  Tensor t = Tensor::empty({4}, DType::kI32);
  env.bufs["moe.counts"] = t;
  const Tensor& h = env.host_view("moe.counts", nullptr);
  EXPECT_EQ(h.raw(), t.raw());
  EXPECT_TRUE(env.mirrors.empty());
  try {
    env.host_view("moe.rcounts", nullptr);
    ADD_FAILURE() << "a missing buffer was read";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("moe.rcounts"), std::string::npos) << e.what();
  }
}

TEST(KernelRegistry, HostBindsTheCpuKernels) {
  const KernelRegistry& r = kernel_registry(Device::host());
  EXPECT_EQ(r.device(), Device::host());
  EXPECT_EQ(r.codes(), op_codes());
  EXPECT_GT(r.codes().size(), 20u);
  for (const std::string& c : r.codes()) EXPECT_TRUE(static_cast<bool>(r.find(c))) << c;
  EXPECT_THROW(r.find("no_such_op"), InternalError);
}

// Without the CUDA backend, a CUDA stream and registry are refused naming the build option; a CUDA
// build refuses a stream on a machine without a GPU (saying so) and, for the ops not yet bound to
// CUDA kernels, the registry (saying that).
TEST(DeviceSeam, CudaIsRefusedWithoutTheBackend) {
  auto refused = [](const std::function<void()>& f, const std::string& says) {
    try {
      f();
      ADD_FAILURE() << "a CUDA device was accepted; expected an error saying '" << says << "'";
    } catch (const DeviceError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  if (!cuda_built()) {
    refused([] { make_stream(Device::cuda(0)); }, "DHELIX_ENABLE_CUDA");
    refused([] { kernel_registry(Device::cuda(1)); }, "DHELIX_ENABLE_CUDA");
    return;
  }
  // A CUDA build binds the GPT-2 / Llama / MoE ops, tensor parallelism's vocabulary-parallel loss,
  // expert parallelism's regrouping, context parallelism's ring steps and the 3D grid's ops (the
  // MoE MLP's token slices too) to the CUDA kernels, and refuses an op it has none for by name.
  const KernelRegistry& gpu = kernel_registry(Device::cuda(1));
  EXPECT_TRUE(static_cast<bool>(gpu.find("attention_bwd")));
  EXPECT_TRUE(static_cast<bool>(gpu.find("moe_route")));
  EXPECT_TRUE(static_cast<bool>(gpu.find("xent_max")));
  EXPECT_TRUE(static_cast<bool>(gpu.find("moe_ep_sort")));
  EXPECT_TRUE(static_cast<bool>(gpu.find("moe_ep_unsort")));
  for (const char* op : {"cp_kv_pack", "ring_attention", "ring_attention_bwd", "cp_dkv_add", "cp_ring_bwd_finish"})
    EXPECT_TRUE(static_cast<bool>(gpu.find(op))) << op;
  for (const char* op : {"linear3d", "linear3d_wgrad", "grad_accum", "ln_stats", "ln_bwd_apply", "rms_apply"})
    EXPECT_TRUE(static_cast<bool>(gpu.find(op))) << op;
  for (const char* op : {"grid_rows", "grid_cols"}) EXPECT_TRUE(static_cast<bool>(gpu.find(op))) << op;
  refused([&] { gpu.find("no_such_op"); }, "op 'no_such_op' has no CUDA kernel binding yet");
  refused([] { make_stream(Device::cuda(4096)); }, "cuda:4096");
}

}  // namespace
}  // namespace dhelix
