// SVG timeline of an SI plan. Geometry (pixels):
//   x: 110 px of lane labels, then time scaled to kPlotW; y: title, block-index row, lanes
//   (fwd, bwd, then one per group in order of first appearance), time axis.
// Inside a block each strand's ops are laid end to end from the block start, each as wide as
// its single-op solo price (shrunk if the strand's chain would overrun the block); a
// collective is drawn in its group's lane at its place in the chain.
#include "plan/PlanSvg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/Svg.h"
#include "plan/PlanRender.h"

namespace dhelix {

namespace {

constexpr double kLeft = 110, kPlotW = 1100, kTop = 48, kLaneH = 34, kGap = 6;

struct Palette {
  const char* compute;
  const char* collective;
};
constexpr Palette kFwd{"#cfe2f3", "#1f6fb2"};
constexpr Palette kBwd{"#fde2c8", "#d9661f"};

}  // namespace

std::string render_plan_svg(const SIPlan& plan, const LayerProgram& prog, const BlockCost* cost) {
  // Lanes: fwd, bwd, then each group role in order of first appearance.
  std::vector<std::string> lanes = {"fwd", "bwd"};
  for (const auto* ops : {&prog.fwd, &prog.bwd})
    for (const Op& op : *ops)
      if (op.is_collective() &&
          std::find(lanes.begin() + 2, lanes.end(), op.group) == lanes.end())
        lanes.push_back(op.group);
  auto lane_y = [&](const std::string& lane) {
    auto it = std::find(lanes.begin(), lanes.end(), lane);
    return kTop + 20 + static_cast<double>(it - lanes.begin()) * (kLaneH + kGap);
  };

  // Block durations: priced when every block is finite, else one unit each.
  const size_t nb = plan.blocks.size();
  std::vector<double> dur(nb, 1.0);
  bool timed = cost != nullptr && nb > 0;
  for (size_t k = 0; timed && k < nb; ++k) {
    dur[k] = cost->block(plan.blocks[k]);
    timed = std::isfinite(dur[k]) && dur[k] > 0;
  }
  if (!timed) std::fill(dur.begin(), dur.end(), 1.0);
  double total = 0;
  for (double d : dur) total += d;
  if (total <= 0) total = 1;
  const double scale = kPlotW / total;
  const double axis_y = lane_y(lanes.back()) + kLaneH + 14;
  const double height = axis_y + 40;

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
      kLeft + kPlotW + 20, height,
      xml_escape(fmt::format("SI plan '{}' (source {}): {} blocks, {} {}", plan.pair, plan.source,
                             nb, timed ? "predicted" : "untimed",
                             timed ? format_seconds(total) : "")));
  for (const std::string& lane : lanes)
    svg += fmt::format("<text x=\"10\" y=\"{:.1f}\">{}</text>\n", lane_y(lane) + kLaneH / 2 + 4,
                       xml_escape(lane == "fwd" || lane == "bwd" ? lane + " compute"
                                                                 : "comm " + lane));

  double t0 = 0;
  for (size_t k = 0; k < nb; ++k) {
    const Block& b = plan.blocks[k];
    const double x0 = kLeft + t0 * scale, w = dur[k] * scale;
    svg += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\" "
        "stroke=\"#999\" stroke-width=\"0.5\"/>\n",
        x0, kTop, w, axis_y - kTop - 8, k % 2 ? "#f4f4f4" : "#ffffff");
    if (w >= 8.0 * std::to_string(k).size())  // block index, where it fits
      svg += fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\" fill=\"#555\">{}</text>\n", x0 + 2,
                         kTop + 13, k);
    // One strand's window, ops end to end from the block start.
    auto draw = [&](const std::vector<Op>& ops, int lo, int hi, const char* sname,
                    const Palette& pal) {
      if (hi <= lo) return;
      std::vector<double> ow;
      double sum = 0;
      for (int i = lo; i < hi; ++i) {
        double t = 1;
        if (timed) {
          t = sname[0] == 'f' ? cost->solo_fwd(i, i + 1) : cost->solo_bwd(i, i + 1);
          if (!std::isfinite(t) || t <= 0) t = dur[k] / (hi - lo);
        }
        ow.push_back(t);
        sum += t;
      }
      const double unit = timed ? std::min(1.0, dur[k] / sum) * scale : w / sum;
      double x = x0;
      for (int i = lo; i < hi; ++i) {
        const Op& op = ops[i];
        const double bw = ow[i - lo] * unit;
        const bool coll = op.is_collective();
        const double y = lane_y(coll ? op.group : std::string(sname)) + 2;
        std::string tip = fmt::format("{} {} #{}{}{}", sname, op.name, i,
                                      coll ? fmt::format(" ({} on {})", coll_op_name(op.coll), op.group) : "",
                                      timed ? ", alone " + format_seconds(ow[i - lo]) : "");
        svg += fmt::format(
            "<g><title>{}</title><rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" "
            "height=\"{:.1f}\" rx=\"2\" fill=\"{}\" stroke=\"{}\" stroke-width=\"0.8\"/>"
            "<text x=\"{:.2f}\" y=\"{:.1f}\" fill=\"{}\">{}</text></g>\n",
            xml_escape(tip), x, y, std::max(bw - 1, 0.5), kLaneH - 4,
            coll ? pal.collective : pal.compute, pal.collective, x + 3, y + kLaneH / 2 + 2,
            coll ? "white" : "black", xml_escape(fit_label(op.name, bw)));
        x += bw;
      }
    };
    draw(prog.fwd, b.fwd_begin, b.fwd_end, "fwd", kFwd);
    draw(prog.bwd, b.bwd_begin, b.bwd_end, "bwd", kBwd);
    t0 += dur[k];
  }

  // Time axis: ~8 ticks.
  svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
                     "stroke=\"black\"/>\n",
                     kLeft, axis_y, kLeft + kPlotW, axis_y);
  for (int t = 0; t <= 8; ++t) {
    double v = total * t / 8, x = kLeft + v * scale;
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"black\"/>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
        x, axis_y, x, axis_y + 4, x, axis_y + 16,
        timed ? format_seconds(v) : fmt::format("{:.1f} blk", v));
  }
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#555\">fwd: blue, bwd: orange; dark "
                     "boxes are collectives</text>\n</svg>\n",
                     kLeft, axis_y + 32);
  return svg;
}

}  // namespace dhelix
