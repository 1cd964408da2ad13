// JSON text written by hand (fmt): what a writer of such text needs to keep it parseable.
#pragma once
#include <cctype>
#include <string>

namespace dhelix {

// `json` (e.g. a benchmark's result line, built with fmt) with every non-finite number -- fmt writes inf,
// -inf, nan -- replaced by null, so that one bad timing does not make the whole line unparseable.
// Text inside strings is left alone.
inline std::string json_finite(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < json.size()) out += json[++i];
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      continue;
    }
    const size_t word = i + (c == '-' || c == '+' ? 1 : 0);
    if (json.compare(word, 3, "inf") == 0 || json.compare(word, 3, "nan") == 0) {
      size_t end = word + 3;
      while (end < json.size() && std::isalpha(static_cast<unsigned char>(json[end]))) ++end;  // "infinity"
      out += "null";
      i = end - 1;
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace dhelix
