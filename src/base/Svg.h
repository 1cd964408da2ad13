// Text helpers shared by the SVG renderers (plan/PlanSvg, plan/ScheduleSvg): XML escaping and
// labels cut to a box width. No drawing here; each renderer owns its geometry and colours.
#pragma once
#include <string>

namespace dhelix {

inline std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

// Text that fits `width` px at ~6.2 px per character (11 px sans-serif).
inline std::string fit_label(const std::string& s, double width) {
  size_t max_chars = width > 8 ? static_cast<size_t>((width - 4) / 6.2) : 0;
  if (s.size() <= max_chars) return s;
  if (max_chars < 2) return "";
  return s.substr(0, max_chars - 1) + "~";
}

}  // namespace dhelix
