// Device: where a tensor's bytes live and where the kernels that read them run -- host memory
// (the CPU backend) or one CUDA GPU ("cuda:N"). A value type; parse_device reads the spelling a
// config or flag uses. Not here: allocators (Tensor.cc's host block cache; a CUDA build's caching
// device allocator), streams and events (runtime/Stream.h).
#pragma once
#include <string>

namespace dhelix {

enum class DeviceKind { kHost, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kHost;
  int index = 0;  // which GPU (kCuda); 0 for the host

  static Device host() { return {}; }
  static Device cuda(int i) { return {DeviceKind::kCuda, i}; }
  bool is_host() const { return kind == DeviceKind::kHost; }
  std::string str() const;  // "cpu", "cuda:0"
  friend bool operator==(const Device&, const Device&) = default;
};

// "cpu" (or "host"), "cuda" (= cuda:0), "cuda:N". ConfigError naming the text otherwise.
Device parse_device(const std::string& text);

}  // namespace dhelix
