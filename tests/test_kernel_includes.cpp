// The kernel's include graph, read from the sources: the layers stay one-way.
// Each file pair (name.hpp with its name.cpp) is one node; a node that
// includes another's header depends on it. No two nodes may depend on each
// other, however long the way round (a cycle ties them into one piece a
// newcomer cannot read bottom-up), and no kernel file includes a header from
// the layers above it (plugins/, hosts/).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// The quoted includes of a file, as written.
std::vector<std::string> quoted_includes(const fs::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line.compare(first, 8, "#include") != 0) continue;
    const auto open = line.find('"', first);
    const auto close = open == std::string::npos ? open : line.find('"', open + 1);
    if (close != std::string::npos) out.push_back(line.substr(open + 1, close - open - 1));
  }
  return out;
}

struct IncludeGraph {
  std::map<std::string, std::set<std::string>> edges;              // node -> the nodes it includes
  std::map<std::pair<std::string, std::string>, std::string> why;  // edge -> "a.cpp includes b.hpp"
};

IncludeGraph kernel_graph(const fs::path& kernel) {
  IncludeGraph g;
  std::set<std::string> nodes;
  for (const auto& e : fs::directory_iterator(kernel))
    if (e.path().extension() == ".hpp" || e.path().extension() == ".cpp")
      nodes.insert(e.path().stem().string());
  for (const auto& e : fs::directory_iterator(kernel)) {
    const std::string ext = e.path().extension().string();
    if (ext != ".hpp" && ext != ".cpp") continue;
    const std::string from = e.path().stem().string();
    g.edges[from];
    for (const std::string& inc : quoted_includes(e.path())) {
      const fs::path p(inc);
      if (p.has_parent_path() || p.extension() != ".hpp") continue;
      const std::string to = p.stem().string();
      if (to == from || !nodes.count(to)) continue;
      g.edges[from].insert(to);
      g.why.emplace(std::make_pair(from, to), e.path().filename().string() + " includes " + inc);
    }
  }
  return g;
}

// Tarjan's strongly connected components: each cycle's nodes.
std::vector<std::vector<std::string>> cycles(const IncludeGraph& g) {
  std::map<std::string, int> index, low;
  std::vector<std::string> stack;
  std::set<std::string> on_stack;
  std::vector<std::vector<std::string>> out;
  int next = 0;
  std::function<void(const std::string&)> visit = [&](const std::string& v) {
    index[v] = low[v] = next++;
    stack.push_back(v);
    on_stack.insert(v);
    for (const std::string& w : g.edges.at(v)) {
      if (!index.count(w)) {
        visit(w);
        low[v] = std::min(low[v], low[w]);
      } else if (on_stack.count(w)) {
        low[v] = std::min(low[v], index[w]);
      }
    }
    if (low[v] != index[v]) return;
    std::vector<std::string> component;
    std::string w;
    do {
      w = stack.back();
      stack.pop_back();
      on_stack.erase(w);
      component.push_back(w);
    } while (w != v);
    if (component.size() > 1) out.push_back(component);
  };
  for (const auto& [v, to] : g.edges)
    if (!index.count(v)) visit(v);
  return out;
}

const fs::path kKernel = fs::path(TIGHTFIT_SOURCE_DIR) / "kernel";

TEST(KernelIncludes, NoTwoFilesDependOnEachOther) {
  const IncludeGraph g = kernel_graph(kKernel);
  ASSERT_GT(g.edges.size(), 100u) << "the kernel's sources were not found in " << kKernel;
  for (const auto& component : cycles(g)) {
    std::string detail;
    for (const std::string& a : component)
      for (const std::string& b : component)
        if (auto it = g.why.find({a, b}); it != g.why.end()) detail += "\n  " + it->second;
    ADD_FAILURE() << "these kernel files depend on each other in a cycle; move what both need "
                     "into a header below them:"
                  << detail;
  }
}

// The check itself finds a cycle (a graph of three files that include each
// other round, and one that does not).
TEST(KernelIncludes, TheCycleCheckFindsACycle) {
  IncludeGraph g;
  g.edges = {{"a", {"b"}}, {"b", {"c"}}, {"c", {"a"}}, {"d", {"a"}}};
  const auto found = cycles(g);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(std::set<std::string>(found[0].begin(), found[0].end()),
            (std::set<std::string>{"a", "b", "c"}));
  g.edges["c"].clear();
  EXPECT_TRUE(cycles(g).empty());
}

TEST(KernelIncludes, NoKernelFileIncludesALayerAboveIt) {
  // Below the kernel: the C ABI. Above it: the plugins' SDK (also under
  // tightfit/), the plugins and the hosts.
  for (const auto& e : fs::directory_iterator(kKernel))
    for (const std::string& inc : quoted_includes(e.path())) {
      const bool abi = inc == "tightfit/plugin_api.h";
      const bool above = inc.rfind("tightfit/", 0) == 0 ||
                         inc.find("plugins/") != std::string::npos ||
                         inc.find("hosts/") != std::string::npos;
      EXPECT_TRUE(abi || !above) << e.path().filename().string() << " includes " << inc
                                 << ": the kernel is below the plugins, their SDK and the hosts";
    }
}

}  // namespace
