// Chrome trace-event JSON writer.
#include "base/Trace.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/Files.h"

namespace dhelix {

void Trace::add(const std::string& lane, const std::string& name, double start_s, double end_s,
                const std::string& args_json) {
  std::lock_guard<std::mutex> lk(mu_);
  if (std::find(lanes_.begin(), lanes_.end(), lane) == lanes_.end()) lanes_.push_back(lane);
  events_.push_back({lane, name, args_json, start_s, end_s});
}

size_t Trace::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return events_.size();
}

std::vector<Trace::Event> Trace::events() const {
  std::lock_guard<std::mutex> lk(mu_);
  return events_;
}

void Trace::write(const std::string& path) const {
  std::lock_guard<std::mutex> lk(mu_);
  nlohmann::json ev = nlohmann::json::array();
  for (size_t i = 0; i < lanes_.size(); ++i) {
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", i}, {"args", {{"name", lanes_[i]}}}});
    ev.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", rank_}, {"tid", i}, {"args", {{"sort_index", i}}}});
  }
  ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  for (const auto& e : events_) {
    size_t tid = std::find(lanes_.begin(), lanes_.end(), e.lane) - lanes_.begin();
    nlohmann::json j = {{"name", e.name},
                        {"ph", "X"},
                        {"pid", rank_},
                        {"tid", tid},
                        {"ts", (e.start_s - t0_) * 1e6},
                        {"dur", std::max(0.0, e.end_s - e.start_s) * 1e6}};
    j["args"] = nlohmann::json::parse(e.args);
    ev.push_back(j);
  }
  nlohmann::json doc = {{"traceEvents", ev}, {"displayTimeUnit", "ms"}};
  write_file_atomic(path, doc.dump());
}

}  // namespace dhelix
