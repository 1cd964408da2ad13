// A one-line progress bar on stderr, drawn only when stderr is a terminal (isatty), redrawn at
// most 10 times a second. In logs and CI it prints nothing. Not a logger.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace dhelix {

class ProgressBar {
 public:
  ProgressBar(int64_t total, std::string label);
  ~ProgressBar();  // finishes the line if one was drawn
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `done` of `total` finished; `status` (e.g. "loss 3.21") is shown after the bar.
  void update(int64_t done, std::string_view status = {});
  void finish();
  bool enabled() const { return enabled_; }

  // The text of one frame (exposed for tests): "label [#####.....]  50/100  status".
  static std::string render(std::string_view label, int64_t done, int64_t total, std::string_view status,
                            int width = 30);

 private:
  int64_t total_;
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  double last_draw_ = -1.0;
};

}  // namespace dhelix
