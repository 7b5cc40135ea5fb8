// The kernel's include graph, read from the sources: the layers stay one-way.
// Each file pair (name.hpp with its name.cpp) is one node; a node that
// includes another's header depends on it. No two nodes may depend on each
// other, however long the way round (a cycle ties them into one piece a
// newcomer cannot read bottom-up); no kernel file includes a header from the
// layers above it (plugins/, hosts/); and each kernel folder is a library
// (kernel/CMakeLists.txt's tightfit_kernel_library lines) whose files include
// only its own headers and those of the libraries it names, directly or
// through them. The build enforces the last rule too (an upward header is not
// on the include path); this test names the include that broke it.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
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

// Every .hpp and .cpp under kernel/, each folder a library.
std::vector<fs::path> kernel_files(const fs::path& kernel) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(kernel))
    if (e.path().extension() == ".hpp" || e.path().extension() == ".cpp") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The file's name under kernel/ ("train/executor.cpp").
std::string under_kernel(const fs::path& file, const fs::path& kernel) {
  return fs::relative(file, kernel).string();
}

IncludeGraph kernel_graph(const fs::path& kernel) {
  IncludeGraph g;
  std::set<std::string> nodes;
  for (const fs::path& f : kernel_files(kernel)) nodes.insert(f.stem().string());
  for (const fs::path& f : kernel_files(kernel)) {
    const std::string from = f.stem().string();
    g.edges[from];
    for (const std::string& inc : quoted_includes(f)) {
      const fs::path p(inc);
      if (p.has_parent_path() || p.extension() != ".hpp") continue;
      const std::string to = p.stem().string();
      if (to == from || !nodes.count(to)) continue;
      g.edges[from].insert(to);
      g.why.emplace(std::make_pair(from, to), under_kernel(f, kernel) + " includes " + inc);
    }
  }
  return g;
}

// The kernel's libraries as kernel/CMakeLists.txt declares them:
// "tightfit_kernel_library(name below...)" -> name: every library it may
// include from (itself, the ones it names and theirs).
using Layers = std::map<std::string, std::set<std::string>>;

Layers declared_layers(const std::string& cmake_text) {
  Layers direct;
  std::istringstream in(cmake_text);
  const std::string call = "tightfit_kernel_library(";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(call, 0) != 0) continue;
    const auto close = line.find(')');
    std::istringstream words(line.substr(call.size(), close - call.size()));
    std::string name, below;
    words >> name;
    direct[name];
    while (words >> below) direct[name].insert(below);
  }
  Layers reach;
  std::function<void(const std::string&, std::set<std::string>&)> add =
      [&](const std::string& lib, std::set<std::string>& into) {
        if (!into.insert(lib).second) return;
        if (auto it = direct.find(lib); it != direct.end())
          for (const std::string& b : it->second) add(b, into);
      };
  for (const auto& [name, below] : direct) add(name, reach[name]);
  return reach;
}

// Each include of a header in a library the including file's library may
// not see: "text/x.cpp includes session.hpp (session)".
std::vector<std::string> upward_includes(
    const Layers& layers, const std::map<std::string, std::string>& library_of_header,
    const std::vector<std::pair<std::string, std::vector<std::string>>>& files) {
  std::vector<std::string> out;
  for (const auto& [file, includes] : files) {
    const std::string lib = fs::path(file).parent_path().string();
    const auto allowed = layers.find(lib);
    for (const std::string& inc : includes) {
      const auto to = library_of_header.find(inc);
      if (to == library_of_header.end()) continue;
      if (allowed == layers.end() || !allowed->second.count(to->second))
        out.push_back(file + " includes " + inc + " (" + to->second + ")");
    }
  }
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
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
  for (const fs::path& f : kernel_files(kKernel))
    for (const std::string& inc : quoted_includes(f)) {
      const bool abi = inc == "tightfit/plugin_api.h";
      const bool above = inc.rfind("tightfit/", 0) == 0 ||
                         inc.find("plugins/") != std::string::npos ||
                         inc.find("hosts/") != std::string::npos;
      EXPECT_TRUE(abi || !above) << under_kernel(f, kKernel) << " includes " << inc
                                 << ": the kernel is below the plugins, their SDK and the hosts";
    }
}

TEST(KernelIncludes, EveryKernelFileIsInADeclaredLibrary) {
  const Layers layers = declared_layers(read_text(kKernel / "CMakeLists.txt"));
  ASSERT_GE(layers.size(), 5u) << "no tightfit_kernel_library lines in kernel/CMakeLists.txt";
  for (const fs::path& f : kernel_files(kKernel)) {
    const fs::path rel = fs::relative(f, kKernel);
    EXPECT_EQ(std::distance(rel.begin(), rel.end()), 2)
        << "kernel/" << rel.string()
        << " is not in a library's folder: put it in the folder of the library it belongs to";
    EXPECT_TRUE(layers.count(rel.begin()->string()))
        << "kernel/" << rel.string() << ": its folder is not a tightfit_kernel_library in "
        << "kernel/CMakeLists.txt";
  }
}

TEST(KernelIncludes, NoLibraryIncludesALibraryAboveIt) {
  const Layers layers = declared_layers(read_text(kKernel / "CMakeLists.txt"));
  std::map<std::string, std::string> library_of_header;
  std::vector<std::pair<std::string, std::vector<std::string>>> files;
  for (const fs::path& f : kernel_files(kKernel)) {
    const std::string rel = under_kernel(f, kKernel);
    if (f.extension() == ".hpp")
      library_of_header[f.filename().string()] = fs::path(rel).parent_path().string();
    files.emplace_back(rel, quoted_includes(f));
  }
  ASSERT_GT(files.size(), 100u) << "the kernel's sources were not found in " << kKernel;
  for (const std::string& bad : upward_includes(layers, library_of_header, files))
    ADD_FAILURE() << bad << ": a library includes only its own headers and those of the "
                  << "libraries it names in kernel/CMakeLists.txt; move what it needs down, "
                  << "or the file up";
}

// The layer check itself: "b" names "a", so b may include a's headers and
// not the other way round; a library not declared may include nothing.
TEST(KernelIncludes, TheLayerCheckFindsAnUpwardInclude) {
  const Layers layers = declared_layers(
      "tightfit_kernel_library(a)   # bottom\n"
      "tightfit_kernel_library(b a)\n"
      "tightfit_kernel_library(c b)\n");
  EXPECT_EQ(layers.at("c"), (std::set<std::string>{"a", "b", "c"}));
  const std::map<std::string, std::string> headers = {
      {"x.hpp", "a"}, {"y.hpp", "b"}, {"z.hpp", "c"}};
  EXPECT_TRUE(upward_includes(layers, headers, {{"c/z.cpp", {"x.hpp", "y.hpp", "z.hpp"}}}).empty());
  EXPECT_EQ(upward_includes(layers, headers, {{"a/x.cpp", {"y.hpp"}}}),
            std::vector<std::string>{"a/x.cpp includes y.hpp (b)"});
  EXPECT_EQ(upward_includes(layers, headers, {{"d/w.cpp", {"x.hpp"}}}).size(), 1u);
}

}  // namespace
