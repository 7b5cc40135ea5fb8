#include "jsonl_rows.hpp"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "file_util.hpp"
#include "json_input.hpp"
#include "progress.hpp"

namespace tightfit {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {
constexpr size_t kMaxDataFileBytes = size_t{16} << 30;
}  // namespace

size_t for_each_jsonl_row(const std::string& spec, const std::string& base_dir,
                          const std::function<void(const ojson&, const std::string&)>& row_fn) {
  fs::path p = spec;
  if (p.is_relative() && !base_dir.empty()) p = fs::path(base_dir) / p;
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    for (auto it = fs::recursive_directory_iterator(p, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file(ec) && it->path().extension() == ".jsonl")
        files.push_back(it->path());
    std::sort(files.begin(), files.end());
    if (files.empty())
      throw std::invalid_argument("data folder " + p.string() + " holds no .jsonl file");
  } else {
    files.push_back(p);
  }
  size_t rows = 0;
  for (const fs::path& file : files) {
    std::string text;
    try {
      text = read_regular_file(file.string(), kMaxDataFileBytes);
    } catch (const std::bad_alloc&) {
      std::error_code ec;
      throw DataOutOfMemory("reading " + file.string() + " (" +
                            std::to_string(fs::file_size(file, ec)) + " bytes)");
    } catch (const std::exception& e) {
      throw std::invalid_argument(std::string("data: ") + e.what());
    }
    size_t line = 0, pos = 0;
    // The rows are tokenized (and templates rendered) as they are read.
    Progress progress("reading " + file.filename().string(), static_cast<int64_t>(text.size()),
                      "bytes");
    while (pos < text.size()) {
      progress.set(static_cast<int64_t>(pos));
      ++line;
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      const std::string row_text = text.substr(pos, nl - pos);
      pos = nl + 1;
      if (row_text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
      const std::string where = file.string() + ":" + std::to_string(line);
      ojson row;
      try {
        row = parse_ordered_json(row_text, where);
      } catch (const std::bad_alloc&) {
        throw DataOutOfMemory(where + ": parsing the row as JSON (" +
                              std::to_string(row_text.size()) + " bytes)");
      }
      row_fn(row, where);
      ++rows;
    }
  }
  if (rows == 0) throw std::invalid_argument("data " + p.string() + " holds no rows");
  return rows;
}

}  // namespace tightfit
