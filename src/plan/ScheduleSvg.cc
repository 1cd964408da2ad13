// SVG timeline of a step schedule. Geometry (pixels), the look of plan/PlanSvg:
//   x: 110 px of lane labels, then time [0, makespan] scaled to kPlotW;
//   y: title, then one lane per pp rank (phase names in the gap above each lane), time axis, legend.
// A slot is one box over its [start, end); a co-executed slot is two boxes over the same span,
// forward in the lane's top half, backward in its bottom half.
#include "plan/ScheduleSvg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "base/Svg.h"

namespace dhelix {

namespace {

constexpr double kLeft = 110, kPlotW = 1100, kTop = 52, kLaneH = 40, kGap = 16;

struct Palette {
  const char* fill;
  const char* stroke;
};
// [backward][odd virtual-stage group]: odd groups (the W's up chunks) lighter, with a dashed edge.
constexpr Palette kPalette[2][2] = {{{"#cfe2f3", "#1f6fb2"}, {"#edf4fb", "#1f6fb2"}},
                                    {{"#fde2c8", "#d9661f"}, {"#fef3e9", "#d9661f"}}};

double lane_y(int rank) { return kTop + kGap + rank * (kLaneH + kGap); }

// "units 3-4" (inclusive), "unit 3".
std::string units_of(const Chunk& c) {
  return c.size() == 1 ? fmt::format("unit {}", c.unit_begin) : fmt::format("units {}-{}", c.unit_begin, c.unit_end - 1);
}

std::string pass_desc(const StepSchedule& s, const Pass& p, const char* dir) {
  return fmt::format("micro-batch {} {}, chunk {} ({})", p.mb, dir, p.chunk, units_of(s.chunks.at(p.chunk)));
}

// A tick step of 1, 2 or 5 x 10^k giving at most ~8 intervals over `span`.
double tick_step(double span) {
  const double raw = span / 8, mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

// One pass box (with hover title and label) over [x, x + w) x [y, y + h).
std::string pass_box(const StepSchedule& s, const Slot& sl, const SlotTime& t, int backward, double x, double w,
                     double y, double h) {
  const Pass& p = backward ? sl.bwd : sl.fwd;
  const int group = p.chunk / s.pp;
  const Palette& pal = kPalette[backward][group % 2];
  std::string tip = fmt::format("{}, phase {}, t {:g}-{:g}", pass_desc(s, p, backward ? "backward" : "forward"),
                                sl.phase, t.start, t.end);
  if (sl.co_executed())
    tip += ", co-executed with " + (backward ? pass_desc(s, sl.fwd, "forward") : pass_desc(s, sl.bwd, "backward"));
  const std::string label = fmt::format("{}{}", backward ? 'B' : 'F', p.mb);
  return fmt::format(
      "<g><title>{}</title><rect class=\"pass {}{} vs{}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" "
      "height=\"{:.1f}\" rx=\"2\" fill=\"{}\" stroke=\"{}\" stroke-width=\"0.8\"{}/>"
      "<text x=\"{:.2f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text></g>\n",
      xml_escape(tip), backward ? "bwd" : "fwd", sl.co_executed() ? " co" : "", group, x, y, std::max(w - 1, 0.5),
      h - 2, pal.fill, pal.stroke, group % 2 ? " stroke-dasharray=\"3,2\"" : "", x + w / 2, y + h / 2 + 3,
      xml_escape(fit_label(label, w)));
}

}  // namespace

std::string render_schedule_svg(const StepSchedule& s, const PassCost& cost) {
  const ScheduleTimeline tl = simulate_timeline(s, cost);
  const int P = static_cast<int>(s.ranks.size());
  const double span = tl.makespan > 0 ? tl.makespan : 1.0;
  const double scale = kPlotW / span;
  const double axis_y = lane_y(P) - kGap / 2 + 6;
  const double height = axis_y + 62;
  auto x_of = [&](double t) { return kLeft + t * scale; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>\n"
      "<text x=\"10\" y=\"38\" fill=\"#555\">{}</text>\n",
      kLeft + kPlotW + 20, height,
      xml_escape(fmt::format("step schedule '{}': pp={}, {} micro-batches, bubble {:.1f}% (most idle rank)", s.name,
                             s.pp, s.micro_batches, 100 * tl.max_bubble())),
      xml_escape(fmt::format("{} chunks over {} units; makespan {:g} (cost units, no communication time)",
                             s.chunks.size(), s.num_units, tl.makespan)));

  for (int r = 0; r < P; ++r) {
    const double y = lane_y(r);
    svg += fmt::format(
        "<text x=\"10\" y=\"{:.1f}\">rank {}</text>"
        "<text x=\"10\" y=\"{:.1f}\" font-size=\"9\" fill=\"#555\">idle {:.1f}%</text>\n"
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#f7f7f7\"/>\n",
        y + kLaneH / 2 - 2, r, y + kLaneH / 2 + 10, 100 * tl.bubble(r), kLeft, y, kPlotW, kLaneH);
    const auto& slots = s.ranks[r];
    for (size_t k = 0; k < slots.size(); ++k) {
      const Slot& sl = slots[k];
      const SlotTime& t = tl.ranks[r][k];
      const double x = x_of(t.start), w = (t.end - t.start) * scale;
      if (k == 0 || sl.phase != slots[k - 1].phase) {
        // The phase's name above the lane, cut at the next phase's start.
        size_t next = k + 1;
        while (next < slots.size() && slots[next].phase == sl.phase) ++next;
        const double until = next < slots.size() ? x_of(tl.ranks[r][next].start) : kLeft + kPlotW;
        svg += fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\" font-size=\"9\" fill=\"#555\">{}</text>\n", x + 2, y - 3,
                           xml_escape(fit_label(sl.phase, until - x)));
        if (k > 0)
          svg += fmt::format(
              "<g><title>{}</title><line class=\"phase\" x1=\"{:.2f}\" y1=\"{:.1f}\" x2=\"{:.2f}\" y2=\"{:.1f}\" "
              "stroke=\"#555\" stroke-width=\"1\" stroke-dasharray=\"2,2\"/></g>\n",
              xml_escape(fmt::format("rank {}: {} from slot {}", r, sl.phase, k)), x, y - 12, x, y + kLaneH + 3);
      }
      if (sl.co_executed()) {
        svg += pass_box(s, sl, t, 0, x, w, y + 1, kLaneH / 2);
        svg += pass_box(s, sl, t, 1, x, w, y + 1 + kLaneH / 2, kLaneH / 2);
      } else {
        svg += pass_box(s, sl, t, sl.bwd.active() ? 1 : 0, x, w, y + 1, kLaneH);
      }
    }
  }

  // Time axis: ticks at a round step.
  svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"black\"/>\n", kLeft,
                     axis_y, kLeft + kPlotW, axis_y);
  const double step = tick_step(span);
  for (int i = 0; i * step <= span * (1 + 1e-9); ++i) {
    const double v = i * step, x = x_of(v);
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"black\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:g}</text>\n",
        x, axis_y, x, axis_y + 4, x, axis_y + 16, v);
  }
  svg += fmt::format(
      "<text x=\"{0:.1f}\" y=\"{1:.1f}\" fill=\"#555\">forward: blue, backward: orange; a box split in halves is a "
      "co-executed slot (forward top, backward bottom)</text>\n"
      "<text x=\"{0:.1f}\" y=\"{2:.1f}\" fill=\"#555\">lighter dashed boxes: chunks of odd virtual-stage groups "
      "(chunk / pp odd: the W's up chunks); dashed grey lines: phase changes</text>\n</svg>\n",
      kLeft, axis_y + 32, axis_y + 46);
  return svg;
}

}  // namespace dhelix
