// The host's Stream and Event (see Stream.h): inline work, joins.
#include "runtime/Stream.h"

#include "base/Error.h"

namespace dhelix {
namespace {

// Work launched on the host stream has finished by the time launch() returns.
class ReachedEvent final : public Event {
 public:
  bool ready() const override { return true; }
  void host_wait() override {}
};

class HostStream final : public Stream {
 public:
  Device device() const override { return Device::host(); }
  void launch(const std::function<void()>& work) override { work(); }
  void wait(Event& e) override { e.host_wait(); }
  std::unique_ptr<Event> record() override { return std::make_unique<ReachedEvent>(); }
};

}  // namespace

std::unique_ptr<Stream> make_stream(Device d) {
  DHX_CHECK(d.is_host(), DeviceError,
            "device {} asked for, but this build has no CUDA backend (configure with -DDHELIX_ENABLE_CUDA=ON on a "
            "machine with the CUDA toolkit); run on cpu",
            d.str());
  return std::make_unique<HostStream>();
}

}  // namespace dhelix
