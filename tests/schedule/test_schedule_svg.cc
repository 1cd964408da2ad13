// The step-schedule SVG (plan/ScheduleSvg) against the schedule it draws: boxes counted from the
// slots, their hover text and positions from simulate_timeline, the bubble in the title from the
// timeline and the closed form; and the shared SVG text helpers (base/Svg.h) against their rules.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "base/Error.h"
#include "base/Svg.h"
#include "plan/ScheduleSvg.h"
#include "plan/StepSchedule.h"
#include "schedule/Pipelines.h"
#include "ScheduleTestUtil.h"

namespace dhelix {
namespace {

using test::spec;

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + needle.size())) ++n;
  return n;
}

// Pass boxes in document order, as drawn.
struct Box {
  std::string strand;  // "fwd" or "bwd"
  bool co = false;
  int group = 0;
  double x = 0, y = 0, w = 0, h = 0;
};
std::vector<Box> boxes_of(const std::string& svg) {
  static const std::regex re(
      "<rect class=\"pass (fwd|bwd)( co)? vs([0-9]+)\" x=\"([0-9.]+)\" y=\"([0-9.]+)\" width=\"([0-9.]+)\" "
      "height=\"([0-9.]+)\"");
  std::vector<Box> out;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    out.push_back({m[1], m[2].matched, std::stoi(m[3]), std::stod(m[4]), std::stod(m[5]), std::stod(m[6]),
                   std::stod(m[7])});
  }
  return out;
}

// Oracle: the schedule's own slots (one box per single-pass slot, two per co-executed slot), its
// pp (one "rank r" lane each), and the bubble of simulate_timeline and of bubble_formula
// (W co-executed, N > p: (p-1)/(N+p-1) = 1/5). Well-formed here means: opens with <svg, closes
// with </svg>, every <rect> self-closed, <g>/<text> tags balanced.
TEST(ScheduleSvg, WCoExecutedBoxesLanesAndBubble) {
  const PipelineSpec sp = spec(PipelineKind::kW, 2, 4, 8, CoExecute::kOn);
  const StepSchedule sch = make_schedule(sp);
  const std::string svg = render_schedule_svg(sch, uniform_layer_cost(sch.num_units));

  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  ASSERT_GE(svg.size(), 7u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<g>"), count(svg, "</g>"));
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  for (size_t at = svg.find("<rect"); at != std::string::npos; at = svg.find("<rect", at + 1))
    EXPECT_EQ(svg.substr(svg.find('>', at) - 1, 2), "/>") << svg.substr(at, 80);

  size_t single = 0, co = 0;
  for (const auto& slots : sch.ranks)
    for (const Slot& sl : slots) (sl.co_executed() ? co : single) += 1;
  ASSERT_GT(co, 0u);
  EXPECT_EQ(count(svg, "<rect class=\"pass "), single + 2 * co);
  EXPECT_EQ(count(svg, "<rect class=\"pass fwd co "), co);
  EXPECT_EQ(count(svg, "<rect class=\"pass bwd co "), co);
  for (int r = 0; r < sch.pp; ++r) EXPECT_NE(svg.find(fmt::format(">rank {}</text>", r)), std::string::npos) << r;
  EXPECT_EQ(svg.find(fmt::format(">rank {}</text>", sch.pp)), std::string::npos);

  const ScheduleTimeline tl = simulate_timeline(sch, uniform_layer_cost(sch.num_units));
  EXPECT_NE(svg.find(fmt::format("bubble {:.1f}%", 100 * tl.max_bubble())), std::string::npos);
  EXPECT_NEAR(bubble_formula(sp, 2.0), 0.2, 1e-12);
  EXPECT_NE(svg.find("step schedule 'w+si'"), std::string::npos);
  EXPECT_NE(svg.find("pp=2, 4 micro-batches, bubble 20.0%"), std::string::npos);
}

// Oracle: simulate_timeline. Each pass's hover text names its micro-batch, direction, chunk,
// units, phase and [start, end); the boxes, read back in slot order, sit at x = a + b * start with
// one a and b for the whole picture (a linear time axis), are as wide as their slot lasts, and a
// co-executed slot's two boxes share that span, the forward above the backward, each half a lane.
TEST(ScheduleSvg, BoxesFollowTheTimeline) {
  for (CoExecute co : {CoExecute::kOff, CoExecute::kOn}) {
    const StepSchedule sch = make_schedule(spec(PipelineKind::kW, 3, 6, 12, co));
    const ScheduleTimeline tl = simulate_timeline(sch, uniform_layer_cost(sch.num_units));
    const std::string svg = render_schedule_svg(sch, uniform_layer_cost(sch.num_units));
    const std::vector<Box> boxes = boxes_of(svg);
    // The axis, read off rank 0's first box (at time 0) and its last.
    ASSERT_FALSE(boxes.empty());
    const SlotTime& last = tl.ranks[0].back();
    ASSERT_EQ(tl.ranks[0][0].start, 0.0);
    ASSERT_GT(last.start, 0.0);
    size_t last_box = 0;
    for (const Slot& sl : sch.ranks[0]) last_box += sl.co_executed() ? 2 : 1;
    const double a = boxes[0].x, b = (boxes[last_box - 1].x - a) / last.start;
    size_t i = 0;
    double lane_h = 0;
    for (int r = 0; r < sch.pp; ++r)
      for (size_t k = 0; k < sch.ranks[r].size(); ++k) {
        const Slot& sl = sch.ranks[r][k];
        const SlotTime& t = tl.ranks[r][k];
        for (const Pass* p : {&sl.fwd, &sl.bwd}) {
          if (!p->active()) continue;
          const Chunk& ch = sch.chunks[p->chunk];
          const std::string tip = fmt::format("micro-batch {} {}, chunk {} (units {}-{}), phase {}, t {:g}-{:g}", p->mb,
                                              p == &sl.bwd ? "backward" : "forward", p->chunk, ch.unit_begin,
                                              ch.unit_end - 1, sl.phase, t.start, t.end);
          EXPECT_NE(svg.find("<title>" + tip), std::string::npos) << tip;
        }
        const size_t n = sl.co_executed() ? 2 : 1;
        ASSERT_LE(i + n, boxes.size());
        for (size_t j = i; j < i + n; ++j) {
          EXPECT_NEAR(boxes[j].x, a + b * t.start, 0.01) << "rank " << r << " slot " << k;
          // As wide as the slot lasts, less a pixel of gap between neighbours.
          EXPECT_LE(boxes[j].w, (t.end - t.start) * b + 0.01) << "rank " << r << " slot " << k;
          EXPECT_GE(boxes[j].w, (t.end - t.start) * b - 1.01) << "rank " << r << " slot " << k;
          EXPECT_EQ(boxes[j].co, sl.co_executed());
          EXPECT_EQ(boxes[j].group, (j == i && sl.fwd.active() ? sl.fwd.chunk : sl.bwd.chunk) / sch.pp);
        }
        if (n == 2) {
          EXPECT_EQ(boxes[i].strand, "fwd");
          EXPECT_EQ(boxes[i + 1].strand, "bwd");
          EXPECT_GE(boxes[i + 1].y, boxes[i].y + boxes[i].h);
          EXPECT_EQ(boxes[i + 1].h, boxes[i].h);
          if (lane_h > 0) {
            EXPECT_NEAR(2 * (boxes[i].h + 2), lane_h + 2, 0.01);  // two halves, one lane
          }
        } else {
          EXPECT_EQ(boxes[i].strand, sl.fwd.active() ? "fwd" : "bwd");
          lane_h = boxes[i].h;
        }
        i += n;
      }
    EXPECT_EQ(i, boxes.size());
  }
}

// Oracle: the schedule's slot lists: one separator per phase change on a rank, and the lighter
// shade (class vs1) on exactly the passes over the W's up chunks (chunk index >= pp).
TEST(ScheduleSvg, PhaseSeparatorsAndUpChunkShade) {
  const StepSchedule sch = make_schedule(spec(PipelineKind::kW, 4, 8, 16, CoExecute::kOff));
  const std::string svg = render_schedule_svg(sch, uniform_layer_cost(sch.num_units));
  size_t changes = 0, up = 0;
  for (const auto& slots : sch.ranks)
    for (size_t k = 0; k < slots.size(); ++k) {
      if (k > 0 && slots[k].phase != slots[k - 1].phase) ++changes;
      for (const Pass* p : {&slots[k].fwd, &slots[k].bwd}) up += p->active() && p->chunk >= sch.pp;
    }
  ASSERT_GT(changes, 0u);
  ASSERT_GT(up, 0u);
  EXPECT_EQ(count(svg, "<line class=\"phase\""), changes);
  EXPECT_EQ(count(svg, " vs1\""), up);
  EXPECT_EQ(count(svg, " vs0\"") + up, count(svg, "<rect class=\"pass "));
}

// Oracle: 1F1B without co-execution has only single-pass slots: one box each, none marked co.
TEST(ScheduleSvg, OneFOneBHasOneBoxPerSlot) {
  const StepSchedule sch = make_schedule(spec(PipelineKind::k1F1B, 4, 8, 8, CoExecute::kOff));
  const std::string svg = render_schedule_svg(sch, uniform_layer_cost(sch.num_units));
  size_t slots = 0;
  for (const auto& r : sch.ranks) slots += r.size();
  EXPECT_EQ(count(svg, "<rect class=\"pass "), slots);
  EXPECT_EQ(count(svg, " co "), 0u);
  EXPECT_EQ(count(svg, ">F0</text>"), 4u);  // micro-batch 0's forward on each of the 4 ranks
  EXPECT_EQ(count(svg, ">B7</text>"), 4u);
}

// Oracle: check_schedule (simulate_timeline runs it): a schedule missing a pass is not drawn.
TEST(ScheduleSvg, IllegalScheduleThrowsPlanError) {
  StepSchedule sch = make_schedule(spec(PipelineKind::k1F1B, 2, 2, 2, CoExecute::kOff));
  sch.ranks[1].pop_back();
  EXPECT_THROW(render_schedule_svg(sch, uniform_layer_cost(sch.num_units)), PlanError);
}

// Oracle: XML's escapes for the four characters markup gives meaning to, in the schedule's name
// and in the helper itself; fit_label's rule of (width - 4) / 6.2 characters, '~' marking a cut.
TEST(Svg, EscapesAndFitsLabels) {
  EXPECT_EQ(xml_escape("a<b&c>\"d'"), "a&lt;b&amp;c&gt;&quot;d'");
  EXPECT_EQ(fit_label("abcdefgh", 30), "abc~");      // (30 - 4) / 6.2 = 4.19 -> 4 characters
  EXPECT_EQ(fit_label("abcd", 30), "abcd");
  EXPECT_EQ(fit_label("abcdefgh", 8), "");           // no room for any
  StepSchedule sch = make_schedule(spec(PipelineKind::k1F1B, 2, 2, 2, CoExecute::kOff));
  sch.name = "x<&>y";
  const std::string svg = render_schedule_svg(sch, uniform_layer_cost(sch.num_units));
  EXPECT_NE(svg.find("x&lt;&amp;&gt;y"), std::string::npos);
  EXPECT_EQ(svg.find("x<&>y"), std::string::npos);
}

}  // namespace
}  // namespace dhelix
