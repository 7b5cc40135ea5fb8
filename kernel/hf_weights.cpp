#include "hf_weights.hpp"

#include <filesystem>
#include <stdexcept>

#include "safetensors.hpp"

namespace tightfit {
namespace fs = std::filesystem;

void import_hf_weights(ParamStore& store, const std::map<std::string, at::Tensor>& tensors,
                       const std::string& source) {
  at::NoGradGuard no_grad;
  for (Param& p : store.all()) {
    auto it = tensors.find(p.name);
    if (it == tensors.end()) {
      const auto dot = p.name.find('.');
      if (dot != std::string::npos) it = tensors.find(p.name.substr(dot + 1));
    }
    if (it == tensors.end())
      throw std::runtime_error(source + " has no tensor \"" + p.name + "\" (is it a checkpoint of this model?)");
    at::Tensor t = it->second;
    if ((p.flags & TF_PARAM_HF_TRANSPOSED) && t.dim() == 2) t = t.t();
    if (t.sizes() != at::IntArrayRef(p.shape))
      throw std::runtime_error(source + ": \"" + it->first + "\" has shape " + c10::str(it->second.sizes()) +
                               ", the recipe's model needs " + c10::str(at::IntArrayRef(p.shape)) +
                               ((p.flags & TF_PARAM_HF_TRANSPOSED) ? " (transposed)" : ""));
    p.value.copy_(t);
  }
}

void load_hf_weights(ParamStore& store, const std::string& path) {
  std::string file = path;
  if (fs::is_directory(path)) file = (fs::path(path) / "model.safetensors").string();
  if (!fs::exists(file))
    throw std::runtime_error("weights \"" + path + "\" not found (give a .safetensors file or a folder with model.safetensors)");
  import_hf_weights(store, read_safetensors(file).tensors, file);
}

std::map<std::string, at::Tensor> export_hf_weights(const ParamStore& store) {
  std::map<std::string, at::Tensor> out;
  for (const Param& p : store.all()) {
    at::Tensor t = p.value.detach();
    if ((p.flags & TF_PARAM_HF_TRANSPOSED) && t.dim() == 2) t = t.t().contiguous();
    out[p.name] = t;
  }
  return out;
}

}  // namespace tightfit
