// Terminal progress bar (see ProgressBar.h).
#include "train/ProgressBar.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "base/Clock.h"

namespace dhelix {

ProgressBar::ProgressBar(int64_t total, std::string label)
    : total_(std::max<int64_t>(total, 1)), label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) == 1) {}

ProgressBar::~ProgressBar() { finish(); }

std::string ProgressBar::render(std::string_view label, int64_t done, int64_t total, std::string_view status,
                                int width) {
  total = std::max<int64_t>(total, 1);
  done = std::clamp<int64_t>(done, 0, total);
  int filled = static_cast<int>(width * done / total);
  return fmt::format("{} [{}{}] {}/{}  {}", label, std::string(filled, '#'), std::string(width - filled, '.'), done,
                     total, status);
}

void ProgressBar::update(int64_t done, std::string_view status) {
  if (!enabled_) return;
  double now = now_seconds();
  if (done < total_ && now - last_draw_ < 0.1) return;
  last_draw_ = now;
  std::fprintf(stderr, "\r%s\x1b[K", render(label_, done, total_, status).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (enabled_ && drawn_) {
    std::fputc('\n', stderr);
    std::fflush(stderr);
  }
  drawn_ = false;
}

}  // namespace dhelix
