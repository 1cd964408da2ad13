// Chrome trace-event recorder (opens in Perfetto / chrome://tracing): one lane per strand's
// compute and one per process group's communication, every op named. Thread-safe appends;
// written as {"traceEvents": [...]} with "X" (complete) events in microseconds.
#pragma once
#include <mutex>
#include <string>
#include <vector>

namespace dhelix {

class Trace {
 public:
  explicit Trace(int rank) : rank_(rank), t0_(0) {}
  void set_origin(double t0_s) { t0_ = t0_s; }
  // lane: "compute fwd", "compute bwd", "comm tp[0/2]", ...
  void add(const std::string& lane, const std::string& name, double start_s, double end_s,
           const std::string& args_json = "{}");
  // Writes this rank's events; when several ranks write, each writes its own file.
  void write(const std::string& path) const;
  size_t size() const;
  struct Event {
    std::string lane, name, args;  // args: a JSON object's text
    double start_s, end_s;
  };
  // The events added so far, in the order added.
  std::vector<Event> events() const;

 private:
  int rank_;
  double t0_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
  std::vector<std::string> lanes_;
};

}  // namespace dhelix
