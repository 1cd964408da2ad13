// The layer arrows of docs/design.md, checked against the tree: (1) every #include "layer/..." in
// src/, apps/ and bench/ names a header of its own layer or of one the table lets it use
// (transitively); (2) every dhelix_layer(...) line of CMakeLists.txt links only such layers, so the
// include roots the compiler sees (each target's own headers and those of the targets it links,
// CMakeLists.txt) never open an arrow the table lacks. The compiler rejects an include of a layer a
// target does not link; this test rejects a link (or a header-only include) the design forbids.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

using Table = std::map<std::string, std::set<std::string>>;  // layer -> the layers it may use directly
struct Design {
  Table uses;
  std::vector<std::string> order;  // table order ("everything above")
};

std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::stringstream ss(row);
  std::string c;
  std::getline(ss, c, '|');  // before the first bar
  while (std::getline(ss, c, '|')) out.push_back(c);
  return out;
}

// Oracle: docs/design.md's "Layers" table, parsed: column 1's first `name` (its first path part:
// `kernels/cpu` is layer kernels), column 3's words that name a layer of the table; "everything
// above" means every earlier row, "all" every row, "—" none.
Design read_design() {
  Design d;
  std::ifstream in(fs::path(DHELIX_SOURCE_DIR) / "docs" / "design.md");
  EXPECT_TRUE(in.good()) << "docs/design.md is missing";
  std::string line;
  bool in_table = false;
  std::vector<std::pair<std::string, std::string>> rows;  // layer, "may use" text
  while (std::getline(in, line)) {
    if (line.starts_with("## Layers")) in_table = true;
    else if (in_table && line.starts_with("## ")) break;
    if (!in_table || !line.starts_with("| `")) continue;
    const std::vector<std::string> c = cells(line);
    if (c.size() < 3) continue;
    std::smatch m;
    static const std::regex name(R"(`([a-z_]+))");
    if (!std::regex_search(c[0], m, name)) continue;
    rows.push_back({m[1].str(), c[2]});
    d.order.push_back(m[1].str());
  }
  const std::regex word(R"([a-z_]+)");
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& [layer, text] = rows[i];
    std::set<std::string>& u = d.uses[layer];
    if (text.find("everything above") != std::string::npos) {
      u.insert(d.order.begin(), d.order.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    for (auto it = std::sregex_iterator(text.begin(), text.end(), word); it != std::sregex_iterator(); ++it) {
      const std::string w = it->str();
      if (w == "all") u.insert(d.order.begin(), d.order.end());
      else if (std::find(d.order.begin(), d.order.end(), w) != d.order.end() && w != layer) u.insert(w);
    }
    u.erase(layer);
  }
  return d;
}

const Design& design() {
  static const Design d = read_design();
  return d;
}

std::set<std::string> allowed(const std::string& layer) {
  std::set<std::string> out = {layer};
  std::vector<std::string> todo = {layer};
  while (!todo.empty()) {
    std::string l = todo.back();
    todo.pop_back();
    for (const std::string& u : design().uses.at(l))
      if (out.insert(u).second) todo.push_back(u);
  }
  return out;
}

// Files of `dir` (a layer folder of src/, or apps / bench) and the layer they belong to.
void check_includes(const fs::path& dir, const std::string& fixed_layer, int& files) {
  const fs::path root = fs::path(DHELIX_SOURCE_DIR);
  const std::regex inc(R"re(^\s*#\s*include\s+"([a-z_]+)/)re");
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh") continue;
    const std::string layer = fixed_layer.empty() ? fs::relative(e.path(), dir).begin()->string() : fixed_layer;
    ASSERT_TRUE(design().uses.count(layer)) << fs::relative(e.path(), root).string() << ": '" << layer
                                            << "' is not a layer of docs/design.md's table";
    const std::set<std::string> ok = allowed(layer);
    std::ifstream in(e.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      std::smatch m;
      if (!std::regex_search(line, m, inc)) continue;
      EXPECT_TRUE(ok.count(m[1].str())) << fs::relative(e.path(), root).string() << ":" << n
                                        << " includes a header of layer '" << m[1] << "', which '" << layer
                                        << "' may not use (docs/design.md)";
    }
    ++files;
  }
}

TEST(Layering, NoSourceIncludesALayerItMayNotUse) {
  const fs::path root = fs::path(DHELIX_SOURCE_DIR);
  int files = 0;
  check_includes(root / "src", "", files);
  check_includes(root / "apps", "apps", files);
  check_includes(root / "bench", "bench", files);
  EXPECT_GT(files, 150);  // the walk found the sources
}

// Every dhelix_layer(dhelix_X src/DIR deps...) links only dhelix_ layers X may use, and every
// layer folder of src/ is a target.
TEST(Layering, CMakeLinksFollowTheTable) {
  std::ifstream in(fs::path(DHELIX_SOURCE_DIR) / "CMakeLists.txt");
  std::string line;
  const std::regex row(R"(^\s*dhelix_layer\(dhelix_([a-z_]+)\s+src/([a-z_]+)/?([a-z_]*)((\s+[A-Za-z_:]+)*)\s*\))");
  const std::regex dep(R"(dhelix_([a-z_]+))");
  std::set<std::string> targets;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, row)) continue;
    const std::string layer = m[2].str(), sub = m[3].str(), deps = m[4].str();
    // dhelix_kernels builds src/kernels/cpu, dhelix_kernels_cuda src/kernels/cuda (one layer, two
    // targets: the CUDA one exists in a CUDA build only).
    EXPECT_TRUE(m[1].str() == layer || m[1].str() == layer + "_" + sub) << "target dhelix_" << m[1] << " builds src/" << layer
                                                                        << "/" << sub;
    ASSERT_TRUE(design().uses.count(layer)) << "src/" << layer << " is not a layer of docs/design.md";
    targets.insert(layer);
    const std::set<std::string> ok = allowed(layer);
    for (auto it = std::sregex_iterator(deps.begin(), deps.end(), dep); it != std::sregex_iterator(); ++it)
      EXPECT_TRUE(ok.count((*it)[1].str())) << "CMakeLists.txt: dhelix_" << layer << " links dhelix_" << (*it)[1]
                                            << ", which docs/design.md does not let it use";
  }
  for (const auto& e : fs::directory_iterator(fs::path(DHELIX_SOURCE_DIR) / "src"))
    if (e.is_directory()) {
      EXPECT_TRUE(targets.count(e.path().filename().string())) << e.path() << " has no target";
    }
  EXPECT_GE(targets.size(), 13u);
}

// Oracle: the parsed table on known arrows, so a parser that allowed everything (or nothing) fails.
TEST(Layering, TableForbidsUpwardArrows) {
  EXPECT_FALSE(allowed("plan").count("model"));
  EXPECT_FALSE(allowed("model").count("runtime"));
  EXPECT_FALSE(allowed("model").count("comm"));
  EXPECT_FALSE(allowed("schedule").count("runtime"));
  EXPECT_FALSE(allowed("sim").count("comm"));
  EXPECT_FALSE(allowed("sharding").count("comm"));
  EXPECT_FALSE(allowed("kernels").count("comm"));
  EXPECT_FALSE(allowed("layout").count("tensor"));
  EXPECT_TRUE(allowed("train").count("base"));
  EXPECT_TRUE(allowed("runtime").count("schedule"));
  EXPECT_TRUE(allowed("parallel").count("model"));  // through sharding
  EXPECT_TRUE(allowed("apps").count("sim"));
  EXPECT_TRUE(design().uses.at("base").empty());
}

}  // namespace
