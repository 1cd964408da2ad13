// Device names (see Device.h).
#include "tensor/Device.h"

#include <fmt/format.h>

#include <cstdlib>

#include "base/Error.h"

namespace dhelix {

std::string Device::str() const { return is_host() ? std::string("cpu") : fmt::format("cuda:{}", index); }

Device parse_device(const std::string& text) {
  if (text == "cpu" || text == "host") return Device::host();
  if (text == "cuda") return Device::cuda(0);
  if (text.starts_with("cuda:") && text.size() > 5) {
    const std::string n = text.substr(5);
    char* end = nullptr;
    const long i = std::strtol(n.c_str(), &end, 10);
    if (end && *end == '\0' && n.find_first_not_of("0123456789") == std::string::npos && i >= 0 && i < 1024)
      return Device::cuda(static_cast<int>(i));
  }
  throw ConfigError(fmt::format("device '{}' is not one of cpu, cuda, cuda:N (N a GPU index)", text));
}

}  // namespace dhelix
