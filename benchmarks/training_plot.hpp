// benchmarks/training_plot.hpp: an SVG of training curves (loss and accuracy per epoch), for
// petra-train --plot. Plain SVG 1.1, no scripts, readable in any browser.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace petra::tools {

struct Curve {
  std::string label;
  std::string color;  // any SVG color
  std::vector<double> values;  // one per epoch
};

struct Panel {
  std::string title;
  std::vector<Curve> curves;
};

// Panels side by side; x is the epoch (1-based). Returns the SVG text.
std::string render_svg(const std::vector<Panel>& panels, const std::string& caption);

}  // namespace petra::tools
