#include "gguf_folder.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <tuple>

#include "file_util.hpp"
#include "gguf_model.hpp"
#include "gguf_tokenizer.hpp"
#include "sha256.hpp"

namespace tightfit::gguf {
namespace fs = std::filesystem;

namespace {

constexpr const char* kComplete = ".complete";  // written last: the folder is whole
constexpr const char* kTokenizerError = "tokenizer_error.txt";

std::string folder_name(const std::string& gguf_path, const std::string& content) {
  std::string stem = fs::path(gguf_path).stem().string();
  for (char& c : stem)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  if (stem.size() > 64) stem.resize(64);
  return stem + "-" + sha256_hex(content).substr(0, 16);
}

}  // namespace

std::string cache_root() {
  if (const char* own = std::getenv("TIGHTFIT_CACHE"); own && *own) return own;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return (fs::path(xdg) / "tightfit").string();
  if (const char* home = std::getenv("HOME"); home && *home)
    return (fs::path(home) / ".cache" / "tightfit").string();
  throw std::runtime_error(
      "no folder for tightfit's cache (a GGUF file's converted config and tokenizer go there): "
      "set TIGHTFIT_CACHE (or XDG_CACHE_HOME or HOME)");
}

namespace {

ModelFolder convert_to_folder(const std::string& gguf_path) {
  const GgufReader file(gguf_path);
  // Everything the folder holds, made first: its hash names the folder.
  std::vector<std::pair<std::string, std::string>> files;
  files.emplace_back("config.json", hf_config(file).dump(2) + "\n");
  std::string tokenizer_error;
  try {
    const TokenizerFiles t = tokenizer_files(file);
    // All three made before any is kept: a folder has the tokenizer whole or not at all.
    std::string tokenizer = t.tokenizer.dump() + "\n", config = t.tokenizer_config.dump(2) + "\n",
                generation = t.generation_config.dump(2) + "\n";
    files.emplace_back("tokenizer.json", std::move(tokenizer));
    files.emplace_back("tokenizer_config.json", std::move(config));
    files.emplace_back("generation_config.json", std::move(generation));
  } catch (const GgufError& e) {
    tokenizer_error = e.what();
  } catch (const std::invalid_argument& e) {  // the SentencePiece conversion's refusals
    tokenizer_error = e.what();
  } catch (const nlohmann::json::exception& e) {
    tokenizer_error =
        gguf_path + ": its tokenizer does not convert to tokenizer.json (" + e.what() + ")";
  }
  if (!tokenizer_error.empty()) files.emplace_back(kTokenizerError, tokenizer_error + "\n");
  std::string content;
  for (const auto& [name, text] : files) content += name + '\n' + text + '\0';

  ModelFolder out;
  out.tokenizer_error = tokenizer_error;
  const fs::path root = fs::path(cache_root()) / "gguf";
  const fs::path dir = root / folder_name(gguf_path, content);
  out.path = dir.string();
  std::error_code ec;
  if (fs::exists(dir / kComplete, ec)) return out;

  fs::create_directories(root, ec);
  if (ec)
    throw std::runtime_error("cannot create tightfit's cache folder " + root.string() + ": " +
                             ec.message() + " (set TIGHTFIT_CACHE to a writable folder)");
  // Written beside its final name, then renamed into place in one step.
  const fs::path partial = dir.string() + ".partial-" + std::to_string(::getpid());
  remove_tree(partial.string());
  if (!fs::create_directory(partial, ec) || ec)
    throw std::runtime_error("cannot create " + partial.string() + ": " + ec.message());
  try {
    for (const auto& [name, text] : files) write_file_synced((partial / name).string(), text);
    write_file_synced((partial / "source.txt").string(),
                      fs::absolute(gguf_path).lexically_normal().string() + "\n");
    create_empty_file((partial / kComplete).string());
    fsync_path(partial.string());
  } catch (...) {
    remove_tree(partial.string());
    throw;
  }
  fs::rename(partial, dir, ec);
  if (ec) {
    // Another process wrote the same folder first: theirs is identical.
    remove_tree(partial.string());
    if (!fs::exists(dir / kComplete))
      throw std::runtime_error("cannot move " + partial.string() + " to " + dir.string() + ": " +
                               ec.message());
  }
  fsync_path(root.string());
  return out;
}

}  // namespace

// One conversion per file and process: a session asks for the folder once
// per key that names the file (plugin = "auto", [model] config, the
// tokenizer), and `fit` builds a session per stack it plans. The file is
// known by its device, inode, size and modification time, so a file changed
// in place is converted again; a folder removed from the cache meanwhile is
// made again.
ModelFolder model_folder(const std::string& gguf_path) {
  struct stat st {};
  if (::stat(gguf_path.c_str(), &st) != 0) return convert_to_folder(gguf_path);  // it says why
  using Key = std::tuple<std::string, dev_t, ino_t, off_t, int64_t, int64_t>;
  const Key key{cache_root(), st.st_dev,         st.st_ino,
                st.st_size,   st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
  static std::mutex mutex;
  static std::map<Key, ModelFolder> made;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto it = made.find(key);
    std::error_code ec;
    if (it != made.end() && fs::exists(fs::path(it->second.path) / kComplete, ec))
      return it->second;
  }
  ModelFolder folder = convert_to_folder(gguf_path);
  const std::lock_guard<std::mutex> lock(mutex);
  made[key] = folder;
  return folder;
}

}  // namespace tightfit::gguf
