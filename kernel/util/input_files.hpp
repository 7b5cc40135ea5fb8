// The files and folders a run reads — the recipe, the base weights, the
// data, the tokenizer, the checkpoint it resumes or exports — so that no
// output of the run replaces one, or writes through a link to one.
// (`tightfit export --adapter --out model.gguf` once replaced the run's own
// base GGUF with its adapter, exit 0: the base was gone.)
//
// The session notes its inputs as it resolves them; every writer of an
// output (the GGUF and safetensors writers, write_file_replacing, the export
// commands up front) asks before it creates or replaces a path. Inputs are
// known by device and inode, so a hard link, a symlink or another spelling
// of the same file is the same input.
#pragma once

#include <stdexcept>
#include <string>

namespace tightfit {

// An input the user named in a way that cannot work (the host exits 2):
// here, an output that would replace or write through an input.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// How an input is put at risk by a folder of outputs written beside it.
enum class InputKind {
  kModelFile,  // weights, config or tokenizer file: an export into its folder rewrites such names
  kOtherFile,  // the recipe, the data: only an output at its own path (or a link to it) clobbers it
  kFolder,     // a model or tokenizer folder: an export into it rewrites its files
};

// Notes `path` as read by `owner` (a session) in the role `role` ("the base
// weights", "the data"). A path that does not exist is not noted (its reader
// reports it).
void note_input(const void* owner, const std::string& path, const std::string& role,
                InputKind kind);

// Notes a model folder ("the base weights") and the regular files directly
// in it (at most 4096 entries are looked at).
void note_input_folder(const void* owner, const std::string& path, const std::string& role);

// Refuses (InputError, naming both and the fix) an output at `path` that is
// an input of any live owner or a link to one; with `folder` (an export's folder), also a
// folder that is an input folder or holds a model file the run reads.
// `what` names the output ("the exported model", "the adapter").
void refuse_output_over_inputs(const std::string& path, bool folder, const std::string& what);

// Forgets what `owner` noted (a session that ends: its files may go, and
// their inode numbers be reused).
void forget_inputs(const void* owner);

}  // namespace tightfit
