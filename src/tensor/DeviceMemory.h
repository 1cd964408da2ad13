// Device memory for tensors. A CUDA build (DHELIX_ENABLE_CUDA) has one caching, stream-ordered
// allocator per GPU, over a CUDA memory pool whose release threshold keeps every freed block
// cached: a block freed on stream S is reused by S's later allocations in stream order (no device
// sync), and by another stream only after S's work before the free (the pool's event dependencies:
// done already, or waited for -- the driver may make the other stream wait for S, which is why the
// executor holds a pair's frees until its strands join, and the kernels' scratch pool, whose frees
// are not held, has that reuse off), so a tensor one strand frees is never overwritten under it.
// A host build has none: every call names the device and says the build has no CUDA (DeviceError).
//
//   strand A stream: [op writes t][op reads t] free(t, A) [alloc u, A: may reuse t's block at once]
//   strand B stream:                 [alloc w, B: reuses t's block only after A's free is reached]
//
// Not here: kernels (kernels/cuda), streams' creation and ordering (runtime/Stream.h). StreamHandle
// is a cudaStream_t (nullptr: the default stream) so that this layer's headers need no CUDA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tensor/BlockCache.h"
#include "tensor/Device.h"

namespace dhelix {

using StreamHandle = void*;

bool cuda_built();  // whether this build has the CUDA backend
// Why `d` cannot hold tensors here ("" when it can, and for the host): no CUDA in this build, no GPU
// on this machine (with the driver's reason), or no GPU of that index. Never throws.
std::string device_unavailable(Device d);

// `bytes` on GPU d.index, ordered on stream s. DeviceError (naming the device and the bytes) when
// the build has no CUDA, the machine no such GPU, or the GPU is out of memory.
void* device_alloc(Device d, size_t bytes, StreamHandle s);
// Gives the unused blocks cached by GPU `device`'s pools back to the driver: the tensors' pool (where
// it exists) and the device's default pool, which the kernels' scratch comes from (cudaMallocAsync).
// Both keep what is freed into them, so memory one needs may sit unused in the other; device_alloc
// and cuda::scratch_malloc call this when an allocation fails, then try once more. Blocks whose
// stream-ordered free has not run yet stay where they are. Never throws; nothing without CUDA.
void trim_device_pools(int device);
// Returns p (of `bytes`, as allocated) to its GPU's cache once the work issued on s so far has completed.
// While this thread holds frees (hold_device_frees), the free is held and done at the release.
void device_free(Device d, void* p, StreamHandle s, size_t bytes);
// Frees issued by this thread between hold_device_frees() and the matching release_device_frees()
// (they nest: the outermost release counts) are held, then done at the release, each on the stream
// it named. The executor holds them for a pair of strands on two streams: a buffer one strand
// frees may still be read by the other strand's kernels in flight, and only at the pair's end,
// where the two streams join, is every use ordered before the free.
//
//   strand F stream: [op reads t] (t dropped: held) .......... join | free(t, F)
//   strand B stream: [op reads t ..............]               join |
//
// The hold is per thread: a comm thread that drops the last reference to a collective's buffer (an
// NCCL op's kept tensors, a staged group's captured ones) frees it at once, ordered on the buffer's
// allocation stream only. That is safe while no collective's buffer is read by the other strand's
// stream within a pair (true of every program today: a collective's inputs and outputs belong to the
// strand that issued it); a program that shares one across strands must hold those frees too.
void hold_device_frees();
void release_device_frees();
// Frees held by this thread now (0 when none is held).
size_t held_device_frees();
// Copies `bytes` between any two of host memory and GPUs. Ordered on s; returns once the copy is
// done when either end is host memory (a host buffer may be reused at once), else asynchronous.
void device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes, StreamHandle s);
void device_zero(Device d, void* p, size_t bytes, StreamHandle s);
// `bytes` of host memory `src` to GPU memory `dst`, ordered on s, without waiting for s: the bytes
// are copied at once into page-locked memory that is kept until the copy has run (an event; looked
// at on later uploads), so `src` may be reused on return (device_copy from the host waits for the
// stream to reach the copy instead: with both strands issued by one thread, a wait for both).
void device_upload(void* dst, Device d, const void* src, size_t bytes, StreamHandle s);
// Explicit order between stream s and the calling thread's default (null) stream on GPU d, through
// an event (no host wait): default_stream_after(s) -- work issued later on the default stream starts
// after what s has issued so far; stream_after_default(s) -- the reverse. The legacy default stream
// orders itself against blocking streams already, but inside an SM partition (a green context,
// kernels/cuda/SmPartition.h) that is not documented to hold, so the code that moves between the two
// (the parameter store's zeroing on the default stream, a step's strands, the optimizer) says so.
void default_stream_after(Device d, StreamHandle s);
void stream_after_default(Device d, StreamHandle s);
// Makes GPU d.index the calling thread's device (cudaSetDevice) unless the thread's current context
// is already on that GPU: an SM partition entered on this thread (kernels/cuda/SmPartition.h) is
// such a context, and cudaSetDevice would replace it with the device's primary context (all SMs).
// DeviceError as cudaSetDevice's. Every CUDA layer sets its device through this.
void use_device(Device d);

// Page-locked (pinned) host memory for staging copies (a GPU copies it by DMA, at the link's full
// rate, where pageable memory goes through the driver's bounce buffers): at least `bytes`, its
// capacity in *capacity, from a cache of freed blocks (the smallest that wastes at most an eighth;
// beyond 1 GiB of free blocks the largest are released), portable to every context of the process.
// nullptr when it cannot be had (a build without CUDA, a machine without a GPU, the driver out of
// page-locked memory): the caller uses ordinary memory instead. Give the block back with
// pinned_free(p, capacity).
void* pinned_alloc(size_t bytes, size_t* capacity);
void pinned_free(void* p, size_t capacity);
using PinnedStats = BlockCacheStats;  // hits: blocks served from the cache; misses: newly page-locked
PinnedStats pinned_stats();

struct DeviceMemoryStats {
  int64_t in_use = 0, peak_in_use = 0;  // bytes handed out by device_alloc, now and at most
  int64_t reserved = 0;                 // bytes the pool holds from the driver (in use + cached)
  // The kernels' scratch (the device's default pool: cuda::scratch_malloc), outside the counts
  // above: its bytes in use now and at most since the last reset_device_peak (the pool's own
  // high-water mark; it need not coincide with peak_in_use, so their sum bounds the step's peak).
  int64_t scratch_in_use = 0, scratch_peak = 0;
};
DeviceMemoryStats device_memory_stats(Device d);
void reset_device_peak(Device d);  // both peaks: the tensors' and the scratch's

}  // namespace dhelix
