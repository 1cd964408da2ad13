// FreeBlocks: a cache of freed memory blocks by capacity, for allocations whose first touch or
// registration costs about as much as the work they serve -- the host block cache (Tensor.cc:
// glibc would munmap large blocks and page-fault them in again) and the page-locked staging
// buffers (DeviceMemory.cc: page-locking costs about as much as the copy it speeds up). A request
// takes the smallest free block that is at least its size and wastes at most an eighth of it;
// beyond `cap_bytes` of free blocks the largest are released (`release(p)`).
#pragma once
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>

namespace dhelix {

struct BlockCacheStats {
  int64_t hits = 0, misses = 0;  // requests served from the cache / not
  size_t cached_bytes = 0;       // free blocks held now
};

template <typename Release>
class FreeBlocks {
 public:
  FreeBlocks(size_t cap_bytes, Release release) : cap_(cap_bytes), release_(release) {}
  // A free block for `bytes` (its capacity in *capacity), or nullptr (a miss).
  void* take(size_t bytes, size_t* capacity) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(bytes);
    if (it == free_.end() || it->first - bytes > it->first / 8) {
      ++stats_.misses;
      return nullptr;
    }
    void* p = it->second;
    *capacity = it->first;
    stats_.cached_bytes -= it->first;
    ++stats_.hits;
    free_.erase(it);
    return p;
  }
  void give(void* p, size_t capacity) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(capacity, p);
    stats_.cached_bytes += capacity;
    while (stats_.cached_bytes > cap_) {
      auto last = std::prev(free_.end());
      stats_.cached_bytes -= last->first;
      release_(last->second);
      free_.erase(last);
    }
  }
  BlockCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  size_t cap_;
  Release release_;
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  BlockCacheStats stats_;
};

}  // namespace dhelix
