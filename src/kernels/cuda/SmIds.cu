// sm_ids_of_blocks (SmPartition.h): which SM each block of a spinning kernel ran on.
#include "kernels/cuda/Cuda.h"
#include "kernels/cuda/SmPartition.h"

namespace dhelix::cuda {
namespace {

__global__ void sm_ids_kernel(int32_t* out, long long spin_cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < spin_cycles) {
  }
  if (threadIdx.x == 0) {
    unsigned id = 0;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    out[blockIdx.x] = static_cast<int32_t>(id);
  }
}

}  // namespace

void sm_ids_of_blocks(int32_t* out, int blocks, int threads, int spin_us, cudaStream_t stream) {
  DHX_CUDA_ASSERT(blocks >= 1 && threads >= 1 && threads <= 1024 && spin_us >= 0, "sm_ids_of_blocks: blocks ",
                  blocks, ", threads ", threads, ", spin ", spin_us, " us");
  int dev = 0, khz = 0;
  DHX_CUDA(cudaGetDevice(&dev));
  DHX_CUDA(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  sm_ids_kernel<<<blocks, threads, 0, stream>>>(out, static_cast<long long>(spin_us) * khz / 1000);
  DHX_CUDA_LAUNCHED("sm_ids_kernel");
}

}  // namespace dhelix::cuda
