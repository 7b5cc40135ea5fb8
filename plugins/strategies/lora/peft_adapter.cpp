// LoRA adapters as Hugging Face PEFT writes and reads them, so an adapter
// trained here loads with PeftModel.from_pretrained and one trained with PEFT
// starts a run here:
//   adapter_model.safetensors  base_model.model.<module>.lora_A.weight [r, in]
//                              base_model.model.<module>.lora_B.weight [out, r]
//   adapter_config.json        peft_type LORA, r, lora_alpha, target_modules, ...
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "lora.hpp"
#include "tightfit/hf_config.hpp"

namespace lora {
namespace {

constexpr const char* kPrefix = "base_model.model.";

std::string module_of(const std::string& weight) {
  return weight.substr(0, weight.size() - 7);
}  // drop ".weight"
std::string leaf_of(const std::string& module) {
  return module.substr(module.rfind('.') + 1);
}

// The block linear modules of the model (where LoRA can go).
std::vector<std::string> linear_modules(const Lora& s) {
  std::vector<std::string> out;
  for (const auto& name : s.host.param_names()) {
    const tf_param_info info = s.host.param_info(name);
    if (info.ndim == 2 && info.stage >= 0 && !(info.flags & TF_PARAM_ADAPTER) && name.size() > 7 &&
        name.compare(name.size() - 7, 7, ".weight") == 0)
      out.push_back(module_of(name));
  }
  return out;
}

// PEFT's target_modules: the leaf names when they pick exactly the adapted
// modules (["q_proj", "v_proj"]), else a regular expression PEFT full-matches
// against module names (GPT-2's attn.c_proj and mlp.c_proj share a leaf).
nlohmann::json target_modules(const Lora& s) {
  std::set<std::string> adapted, leaves;
  for (const auto& [weight, ad] : s.adapters) {
    adapted.insert(module_of(weight));
    leaves.insert(leaf_of(module_of(weight)));
  }
  std::set<std::string> picked;
  for (const auto& m : linear_modules(s))
    if (leaves.count(leaf_of(m))) picked.insert(m);
  if (picked == adapted) return std::vector<std::string>(leaves.begin(), leaves.end());
  std::string regex;
  for (const auto& m : adapted) {
    if (!regex.empty()) regex += '|';
    for (char c : m) {
      if (c == '.') regex += '\\';
      regex += c;
    }
  }
  return regex;
}

// A new file beside `path` (O_EXCL | O_NOFOLLOW: never an existing file,
// never through a planted symlink), renamed over it: a link at `path` is
// replaced, not written through.
void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error("cannot create " + tmp + ": " + std::strerror(errno) +
                             (errno == EEXIST ? " (something is in the way: remove it)" : ""));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool ok = done == text.size() && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw std::runtime_error("cannot write " + path + ": " + err);
  }
}

// The base model's folder (ABI 1.8's run_info.model_source), so that
// AutoPeftModelForCausalLM.from_pretrained finds it; null when the model
// started from the recipe's init or the host is older.
nlohmann::json base_model(const Lora& s) {
  const tf_run_info info = s.host.run_info();
  if (info.struct_size < offsetof(tf_run_info, model_source) + sizeof info.model_source ||
      !info.model_source || !*info.model_source)
    return nullptr;
  return info.model_source;
}

}  // namespace

void write_peft_adapter(const Lora& s, const std::string& dir) {
  at::NoGradGuard no_grad;
  std::vector<std::string> names;
  std::vector<at::Tensor> values;
  bool transposed = false;  // GPT-2's Conv1D layout: PEFT's fan_in_fan_out
  for (const auto& [weight, ad] : s.adapters) {
    transposed |= (s.host.param_info(weight).flags & TF_PARAM_HF_TRANSPOSED) != 0;
    for (const std::string& p : {ad.a, ad.b}) {
      names.push_back(kPrefix + p);
      values.push_back(s.host.weight(p).detach().contiguous());
    }
  }
  const std::string file = dir + "/adapter_model.safetensors";
  s.host.save_tensors(file, names, values, "{\"format\": \"pt\"}");
  const nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", s.rank},
      {"lora_alpha", s.alpha},
      {"lora_dropout", s.dropout},
      {"target_modules", target_modules(s)},
      {"fan_in_fan_out", transposed},
      {"bias", "none"},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"use_rslora", false},
      {"use_dora", false},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"base_model_name_or_path", base_model(s)},
      {"revision", nullptr},
  };
  write_text_atomically(dir + "/adapter_config.json", config.dump(2) + "\n");
}

void read_peft_adapter(const Lora& s, const std::string& dir) {
  const std::string config_path = dir + "/adapter_config.json";
  tf_sdk::HfConfig config;
  try {
    config = tf_sdk::read_hf_json(config_path, size_t{16} << 20, "PEFT adapter config");
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("lora.adapter: ") + e.what() +
                                " (a PEFT adapter folder has adapter_config.json and "
                                "adapter_model.safetensors)");
  }
  if (config.text("peft_type", "") != "LORA")
    throw std::invalid_argument("lora.adapter: " + config_path +
                                " is not a LoRA adapter (peft_type \"" +
                                config.text("peft_type", "") + "\")");
  if (config.flag("use_dora", false))
    throw std::invalid_argument("lora.adapter: " + config_path +
                                " is a DoRA adapter, which this plugin does not run");
  const int64_t r = config.need("r", 1, int64_t{1} << 20);
  const double alpha = config.real("lora_alpha", 8.0, 0, 1e9);
  if (r != s.rank || std::abs(alpha - s.alpha) > 1e-9 * std::max(1.0, s.alpha)) {
    std::ostringstream msg;
    msg << "lora.adapter: " << config_path << " has r = " << r << ", lora_alpha = " << alpha
        << "; the recipe says rank = " << s.rank << ", alpha = " << s.alpha << " — set rank = " << r
        << " and alpha = " << alpha << " in this [[strategy]] table";
    throw std::invalid_argument(msg.str());
  }
  if (config.flag("use_rslora", false))
    throw std::invalid_argument("lora.adapter: " + config_path +
                                " uses rsLoRA scaling (alpha / sqrt(r)), which "
                                "this plugin does not; retrain without use_rslora");
  // For messages: the modules the adapter names, cut short.
  std::string targets = config.has("target_modules") ? config.json["target_modules"].dump() : "?";
  if (targets.size() > 200) targets = targets.substr(0, 200) + "...";
  const std::string file = dir + "/adapter_model.safetensors";
  struct Release {
    const tf_sdk::Host& host;
    ~Release() { host.release_tensor_file(); }
  } release{s.host};
  at::NoGradGuard no_grad;
  for (const auto& [weight, ad] : s.adapters) {
    for (const std::string& p : {ad.a, ad.b}) {
      const std::optional<at::Tensor> found = s.host.load_tensor(file, kPrefix + p);
      if (!found)
        throw std::invalid_argument(
            "lora.adapter: " + file + " has no " + kPrefix + p +
            ": the adapter was trained on other modules (its target_modules: " + targets +
            "); set targets to match");
      const at::Tensor& loaded = *found;
      const at::Tensor storage = s.host.param_storage(p);
      if (loaded.sizes() != storage.sizes()) {
        std::ostringstream msg;
        msg << "lora.adapter: " << kPrefix << p << " in " << file << " has shape " << loaded.sizes()
            << ", this model needs " << storage.sizes();
        throw std::invalid_argument(msg.str());
      }
      storage.detach().copy_(loaded);
    }
  }
}

}  // namespace lora
