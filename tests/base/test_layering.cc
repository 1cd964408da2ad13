// The layer arrows of DESIGN.md, checked on the sources: a file under src/<layer>/ may include
// headers of its own layer and of the layers DESIGN.md's table lets it use (transitively), never one
// above. The CMake link graph catches a call across a missing arrow only when a symbol is needed; a
// header-only include slips through it, this test does not.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

namespace {

namespace fs = std::filesystem;

// Oracle: DESIGN.md's "Layers" table ("may use"), with "runtime: everything above" spelled out;
// comm also reads layout's rank maps (process groups from the rank grid), as its CMake target does.
const std::map<std::string, std::set<std::string>>& direct_uses() {
  static const std::map<std::string, std::set<std::string>> m = {
      {"base", {}},
      {"tensor", {"base"}},
      {"kernels", {"tensor"}},
      {"comm", {"tensor", "layout"}},
      {"layout", {"base"}},
      {"plan", {"base"}},
      {"model", {"tensor", "layout", "plan"}},
      {"parallel", {"model", "layout", "comm", "kernels"}},
      {"schedule", {"plan", "model", "layout"}},
      {"runtime", {"base", "tensor", "kernels", "comm", "layout", "plan", "model", "parallel", "schedule"}},
      {"profile", {"runtime", "plan"}},
      {"sim", {"plan", "layout", "model"}},
      {"train", {"runtime"}},
  };
  return m;
}

std::set<std::string> allowed(const std::string& layer) {
  std::set<std::string> out = {layer};
  std::vector<std::string> todo = {layer};
  while (!todo.empty()) {
    std::string l = todo.back();
    todo.pop_back();
    for (const std::string& u : direct_uses().at(l))
      if (out.insert(u).second) todo.push_back(u);
  }
  return out;
}

TEST(Layering, NoSourceIncludesAHigherLayer) {
  const fs::path src = fs::path(DHELIX_SOURCE_DIR) / "src";
  const std::regex inc(R"re(^\s*#\s*include\s+"([a-z_]+)/)re");
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext != ".h" && ext != ".cc" && ext != ".cu") continue;
    const std::string layer = fs::relative(e.path(), src).begin()->string();
    ASSERT_TRUE(direct_uses().count(layer)) << "src/" << layer << " is not a layer of DESIGN.md";
    const std::set<std::string> ok = allowed(layer);
    std::ifstream in(e.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      std::smatch m;
      if (!std::regex_search(line, m, inc)) continue;
      EXPECT_TRUE(ok.count(m[1].str())) << fs::relative(e.path(), src.parent_path()).string() << ":" << n
                                        << " includes a header of layer '" << m[1] << "', above '" << layer << "'";
    }
    ++files;
  }
  EXPECT_GT(files, 50);  // the walk found the sources
}

// Oracle: the rule itself on two known cases, so a table that allowed everything would fail here.
TEST(Layering, TableForbidsUpwardArrows) {
  EXPECT_FALSE(allowed("plan").count("model"));
  EXPECT_FALSE(allowed("model").count("runtime"));
  EXPECT_FALSE(allowed("schedule").count("runtime"));
  EXPECT_FALSE(allowed("sim").count("comm"));
  EXPECT_TRUE(allowed("train").count("base"));
}

}  // namespace
