// benchmarks/training_plot.cpp: SVG line charts and atomic text files for petra-train.
#include "benchmarks/training_plot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "petra/error.hpp"

namespace petra::tools {

namespace {

constexpr double kPanelWidth = 420, kPanelHeight = 300, kMargin = 50;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

std::string render_panel(const Panel& panel, double x0) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  std::size_t epochs = 1;
  for (const Curve& c : panel.curves)
    for (double v : c.values)
      if (std::isfinite(v)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
  for (const Curve& c : panel.curves) epochs = std::max(epochs, c.values.size());
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi - lo < 1e-12) hi = lo + 1;
  const double plot_w = kPanelWidth - 2 * kMargin, plot_h = kPanelHeight - 2 * kMargin;
  auto px = [&](std::size_t i) { return x0 + kMargin + (epochs == 1 ? plot_w / 2 : plot_w * double(i) / double(epochs - 1)); };
  auto py = [&](double v) { return kMargin + plot_h * (1 - (v - lo) / (hi - lo)); };

  std::string svg = fmt::format("<text x=\"{:.1f}\" y=\"20\" font-size=\"14\" text-anchor=\"middle\">{}</text>\n",
                                x0 + kPanelWidth / 2, escape(panel.title));
  svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" stroke=\"#888\"/>\n",
                     x0 + kMargin, kMargin, plot_w, plot_h);
  for (int t = 0; t <= 4; ++t) {  // y ticks
    const double v = lo + (hi - lo) * t / 4.0;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"10\" text-anchor=\"end\">{:.4g}</text>\n",
                       x0 + kMargin - 4, py(v) + 3, v);
  }
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"middle\">epoch (1 to {})</text>\n",
                     x0 + kPanelWidth / 2, kPanelHeight - 12, epochs);
  for (std::size_t k = 0; k < panel.curves.size(); ++k) {
    const Curve& c = panel.curves[k];
    std::string points;
    for (std::size_t i = 0; i < c.values.size(); ++i)
      if (std::isfinite(c.values[i])) points += fmt::format("{:.1f},{:.1f} ", px(i), py(c.values[i]));
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n", c.color, points);
    for (std::size_t i = 0; i < c.values.size(); ++i)
      if (std::isfinite(c.values[i]))
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n", px(i), py(c.values[i]), c.color);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" fill=\"{}\">{}</text>\n", x0 + kMargin + 8,
                       kMargin + 14 + 14 * double(k), c.color, escape(c.label));
  }
  return svg;
}

}  // namespace

std::string render_svg(const std::vector<Panel>& panels, const std::string& caption) {
  const double width = kPanelWidth * double(std::max<std::size_t>(panels.size(), 1));
  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" "
      "height=\"{:.0f}\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, kPanelHeight + 20);
  for (std::size_t i = 0; i < panels.size(); ++i) svg += render_panel(panels[i], kPanelWidth * double(i));
  svg += fmt::format("<text x=\"8\" y=\"{:.0f}\" font-size=\"10\" fill=\"#555\">{}</text>\n</svg>\n", kPanelHeight + 12,
                     escape(caption));
  return svg;
}

}  // namespace petra::tools
