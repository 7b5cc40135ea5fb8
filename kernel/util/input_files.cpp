#include "input_files.hpp"

#include <dirent.h>
#include <sys/stat.h>

#include <mutex>
#include <vector>

namespace tightfit {
namespace {

struct Input {
  const void* owner;
  std::string path;
  std::string role;
  InputKind kind;
  dev_t dev;
  ino_t ino;
  dev_t parent_dev;  // the folder holding a file
  ino_t parent_ino;
};

struct Inputs {
  std::mutex m;
  std::vector<Input> all;
};

Inputs& inputs() {
  static auto* in = new Inputs();  // never destroyed: writers may ask late
  return *in;
}

std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

void note_input(const void* owner, const std::string& path, const std::string& role,
                InputKind kind) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return;
  struct stat parent {};
  const bool has_parent = ::stat(parent_of(path).c_str(), &parent) == 0;
  const std::lock_guard<std::mutex> lock(inputs().m);
  for (const Input& in : inputs().all)
    if (in.owner == owner && in.dev == st.st_dev && in.ino == st.st_ino) return;
  inputs().all.push_back(Input{owner, path, role, S_ISDIR(st.st_mode) ? InputKind::kFolder : kind,
                               st.st_dev, st.st_ino, has_parent ? parent.st_dev : dev_t{},
                               has_parent ? parent.st_ino : ino_t{}});
}

void note_input_folder(const void* owner, const std::string& path, const std::string& role) {
  note_input(owner, path, role + " folder", InputKind::kFolder);
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return;
  // A folder of a model holds a few dozen files; a hostile one is not
  // listed past this many.
  int listed = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (++listed > 4096) break;
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string file = path + "/" + name;
    struct stat st {};
    if (::lstat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode))
      note_input(owner, file, role, InputKind::kModelFile);
  }
  ::closedir(dir);
}

void refuse_output_over_inputs(const std::string& path, bool folder, const std::string& what) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return;  // nothing there yet
  struct stat own {};
  const bool is_link = ::lstat(path.c_str(), &own) == 0 && S_ISLNK(own.st_mode);
  const std::lock_guard<std::mutex> lock(inputs().m);
  for (const Input& in : inputs().all) {
    // Still that file (an owner that never ended may have left it behind,
    // and a deleted file's inode number comes back).
    struct stat now {};
    if (::stat(in.path.c_str(), &now) != 0 || now.st_dev != in.dev || now.st_ino != in.ino)
      continue;
    std::string why;
    if (in.dev == st.st_dev && in.ino == st.st_ino)
      why = (is_link           ? " links to "
             : path == in.path ? " is "
                               : " is the same file as ") +
            in.role + " " + in.path;
    else if (folder && S_ISDIR(st.st_mode) && in.kind == InputKind::kModelFile &&
             in.parent_dev == st.st_dev && in.parent_ino == st.st_ino)
      why = " holds " + in.role + " " + in.path + ", which the files written there would replace";
    if (!why.empty())
      throw InputError("cannot write " + what + " to " + path + ": it" + why +
                       ", which this run reads, and writing there would destroy it; choose " +
                       (folder ? "another folder" : "another file name"));
  }
}

void forget_inputs(const void* owner) {
  const std::lock_guard<std::mutex> lock(inputs().m);
  std::erase_if(inputs().all, [&](const Input& in) { return in.owner == owner; });
}

}  // namespace tightfit
