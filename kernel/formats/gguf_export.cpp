#include "gguf_export.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>

#include "file_util.hpp"
#include "gguf_experts.hpp"
#include "gguf_folder.hpp"
#include "gguf_model.hpp"
#include "gguf_quants.hpp"
#include "gguf_tokenizer_export.hpp"
#include "json_input.hpp"
#include "logging.hpp"
#include "model_families.hpp"
#include "safetensors.hpp"

namespace tightfit::gguf {
namespace fs = std::filesystem;
namespace {

// llama_ftype, as general.file_type records the type most tensors have.
uint32_t file_type(const TensorType& t) {
  switch (t.id) {
    case 0:
      return 0;  // ALL_F32
    case 1:
      return 1;  // MOSTLY_F16
    case 8:
      return 7;  // MOSTLY_Q8_0
    default:
      return 32;  // MOSTLY_BF16
  }
}

int64_t config_int(const nlohmann::json& c, const char* key) {
  if (!c.contains(key) || !c[key].is_number_integer())
    throw GgufError(std::string("config.json has no integer ") + key +
                    ", which a GGUF model's metadata needs");
  return c[key].get<int64_t>();
}

// The rows of LLaMA's q (or k) projection reordered per head, [n_head, 2,
// d/2] -> [n_head, d/2, 2] (convert_hf_to_gguf's LlamaModel.permute): the
// inverse of what read_hf_tensor undoes.
at::Tensor permute_rows(const at::Tensor& w, int64_t n_head, const std::string& name) {
  const int64_t rows = w.size(0);
  if (n_head <= 0 || rows % (2 * n_head) != 0)
    throw GgufError(name + " has " + std::to_string(rows) + " rows, not a multiple of 2 x " +
                    std::to_string(n_head) + " heads");
  std::vector<int64_t> split{n_head, 2, rows / n_head / 2};
  const auto rest = w.sizes().slice(1);
  split.insert(split.end(), rest.begin(), rest.end());
  return w.reshape(split).transpose(1, 2).reshape(w.sizes()).contiguous();
}

// The heads whose rows llama's q or k projection permutes; 0 for another
// tensor or architecture.
int64_t permuted_heads(const std::string& arch, const nlohmann::json& c,
                       const std::string& gguf_name) {
  const ModelFamily* written_as = family_of_gguf(arch, false);
  if (written_as == nullptr || !written_as->permuted_qk) return 0;
  if (gguf_name.find(".attn_q.") != std::string::npos) return config_int(c, "num_attention_heads");
  if (gguf_name.find(".attn_k.") != std::string::npos)
    return c.contains("num_key_value_heads") ? config_int(c, "num_key_value_heads")
                                             : config_int(c, "num_attention_heads");
  return 0;
}

// Encodes `t` (any float dtype, any shape) as `type` and hands it to `out`.
void add_encoded(GgufWriter& out, const std::string& name, const at::Tensor& t,
                 const TensorType& type) {
  const at::Tensor f = t.detach().to(at::kCPU, at::kFloat).contiguous();
  std::vector<uint8_t> bytes(static_cast<size_t>(f.numel() / type.block * type.bytes));
  quantize(type, f.data_ptr<float>(), f.numel(), bytes.data());
  out.add_tensor(name, f.sizes().vec(), type, bytes.data(), bytes.size());
}

// general.* keys every file tightfit writes has.
void add_general(GgufWriter& out, const std::string& arch, const std::string& kind,
                 const std::string& name, const TensorType& type) {
  out.set_string("general.architecture", arch);
  out.set_string("general.type", kind);
  out.set_string("general.name", name);
  out.set_u32("general.file_type", file_type(type));
  out.set_u32("general.quantization_version", 2);  // GGML_QNT_VERSION
}

}  // namespace

const TensorType& out_type(const std::string& name) {
  static const std::pair<const char*, uint32_t> names[] = {
      {"f32", 0}, {"f16", 1}, {"bf16", 30}, {"q8_0", 8}};
  for (const auto& [n, id] : names)
    if (name == n) return *tensor_type(id);
  throw GgufError("GGUF output type \"" + name + "\": tightfit writes f32, f16, bf16 or q8_0 " +
                  "(llama.cpp's llama-quantize makes Q4_K_M and the others from an f16 file)");
}

std::string gguf_architecture(const nlohmann::json& config) {
  const std::string type = config.value("model_type", "");
  // Mistral and Mixtral are written as llama, as convert_hf_to_gguf does.
  if (const ModelFamily* f = family_of_model_type(type); f != nullptr && f->gguf_writes != nullptr)
    return f->gguf_writes;
  throw GgufError("a model of model_type \"" + type + "\" is not written as GGUF by tightfit (it " +
                  "writes " + gguf_written_model_types() +
                  " models); export it as a Hugging Face folder and convert that with "
                  "llama.cpp's convert_hf_to_gguf.py");
}

void write_tokenizer_keys(const std::string& tokenizer_source_file, GgufWriter& out) {
  if (tokenizer_source_file.empty())
    throw GgufError(
        "the run's tokenizer is tightfit's byte tokenizer, which has no GGUF form (llama.cpp "
        "reads gpt2 and llama tokenizers); export a Hugging Face folder (--format hf) and "
        "convert it with llama.cpp's convert_hf_to_gguf.py");
  const fs::path folder = fs::path(tokenizer_source_file).parent_path();
  std::error_code ec;
  if (!fs::is_regular_file(folder / "source.txt", ec)) {
    write_hf_tokenizer_keys(tokenizer_source_file, out);
    return;
  }
  std::string source = read_regular_file((folder / "source.txt").string(), 1 << 16);
  while (!source.empty() && (source.back() == '\n' || source.back() == '\r')) source.pop_back();
  // The file must still be the one the tokenizer was converted from: the
  // folder it makes now is the same folder (named by a hash of its content).
  bool same = false;
  try {
    same = fs::equivalent(model_folder(source).path, folder, ec);
  } catch (const std::exception&) {
    same = false;
  }
  if (!same)
    throw GgufError("the run's tokenizer was converted from " + source +
                    ", which is gone or has changed since; put that GGUF file back to export the "
                    "model as GGUF");
  const GgufReader file(source);
  for (const std::string& key : file.keys())
    if (key.rfind("tokenizer.", 0) == 0) out.set(key, file.get(key));
}

GgufModelWriter::GgufModelWriter(const std::string& path, const nlohmann::json& config,
                                 const TensorType& type, const std::string& tokenizer_source_file,
                                 const std::string& model_name)
    : config_(config),
      arch_(gguf_architecture(config)),
      type_(type),
      out_(path),
      experts_(routed_expert_count(config)) {
  if (!can_quantize(type)) out_type(type.name);  // throws, naming the types written
  if (config.contains("rope_scaling") && !config["rope_scaling"].is_null())
    throw GgufError("config.json has rope_scaling " + json_excerpt(config["rope_scaling"]) +
                    ", which tightfit does not write as GGUF yet; export a Hugging Face folder "
                    "and convert it with llama.cpp's convert_hf_to_gguf.py");
  add_general(out_, arch_, "model", model_name, type);
  const std::string a = arch_ + ".";
  out_.set_u32(a + "block_count", static_cast<uint32_t>(config_int(config, "num_hidden_layers")));
  out_.set_u32(a + "context_length",
               static_cast<uint32_t>(config_int(config, "max_position_embeddings")));
  const int64_t hidden = config_int(config, "hidden_size");
  const int64_t heads = config_int(config, "num_attention_heads");
  out_.set_u32(a + "embedding_length", static_cast<uint32_t>(hidden));
  out_.set_u32(a + "feed_forward_length",
               static_cast<uint32_t>(config_int(config, "intermediate_size")));
  out_.set_u32(a + "attention.head_count", static_cast<uint32_t>(heads));
  out_.set_u32(a + "attention.head_count_kv",
               static_cast<uint32_t>(config.contains("num_key_value_heads")
                                         ? config_int(config, "num_key_value_heads")
                                         : heads));
  if (config.contains("rope_theta"))
    out_.set_f32(a + "rope.freq_base", config["rope_theta"].get<float>());
  out_.set_f32(a + "attention.layer_norm_rms_epsilon", config.value("rms_norm_eps", 1e-6f));
  const bool has_head_dim = config.contains("head_dim") && config["head_dim"].is_number_integer();
  if (has_head_dim) {
    out_.set_u32(a + "attention.key_length", config["head_dim"].get<uint32_t>());
    out_.set_u32(a + "attention.value_length", config["head_dim"].get<uint32_t>());
  }
  if (family_of_gguf(arch_, false)->rope_dimension_count) {
    out_.set_u32(a + "vocab_size", static_cast<uint32_t>(config_int(config, "vocab_size")));
    out_.set_u32(
        a + "rope.dimension_count",
        static_cast<uint32_t>(has_head_dim ? config["head_dim"].get<int64_t>() : hidden / heads));
  }
  if (routes_experts(config)) write_expert_keys(config, arch_, out_);
  write_tokenizer_keys(tokenizer_source_file, out_);
}

void GgufModelWriter::add(const std::string& hf_name, const at::Tensor& t,
                          const std::function<void(const std::string&)>& warn) {
  // A tied head is the embedding: llama.cpp reads token_embd for it.
  if (hf_name == "lm_head.weight" && config_.value("tie_word_embeddings", false)) return;
  // A routed expert waits for the others of its layer and projection.
  std::optional<std::pair<std::string, at::Tensor>> stacked;
  if (routes_experts(config_) && experts_.add(hf_name, t, &stacked)) {
    if (stacked) add_matrix(stacked->first, stacked->second, hf_name, warn);
    return;
  }
  const std::optional<std::string> name = gguf_tensor_name(hf_name);
  if (!name) throw GgufError("the model's tensor " + hf_name + " has no GGUF name tightfit knows");
  at::Tensor w = t.detach().to(at::kFloat);
  if (const int64_t n = permuted_heads(arch_, config_, *name)) w = permute_rows(w, n, hf_name);
  // Qwen2-MoE's shared-expert gate, [1, hidden] in transformers, is a
  // vector in llama.cpp ({n_embd}).
  if (name->ends_with(".ffn_gate_inp_shexp.weight")) w = w.reshape({-1});
  add_matrix(*name, w, hf_name, warn);
}

void GgufModelWriter::add_matrix(const std::string& name, const at::Tensor& w,
                                 const std::string& hf_name,
                                 const std::function<void(const std::string&)>& warn) {
  // Norms, biases and the routers stay F32, as convert_hf_to_gguf keeps them.
  const bool keep_f32 = w.dim() <= 1 || name.ends_with("_norm.weight") ||
                        name.find(".ffn_gate_inp") != std::string::npos;
  const TensorType* type = keep_f32 ? tensor_type(0) : &type_;
  if (type->block > 1 && w.size(-1) % type->block != 0) {
    if (warn)
      warn(hf_name + ": rows of " + std::to_string(w.size(-1)) + " do not fill " + type->name +
           " blocks of " + std::to_string(type->block) + "; written as F16");
    type = tensor_type(1);
  }
  add_encoded(out_, name, w, *type);
}

void GgufModelWriter::finish() {
  experts_.check_complete();
  out_.finish();
}

void write_lora_adapter(const std::string& peft_dir, const nlohmann::json& config,
                        const std::string& path, const TensorType& type,
                        const std::string& model_name) {
  const std::string arch = gguf_architecture(config);
  const fs::path dir(peft_dir);
  const nlohmann::json lora =
      read_json_file((dir / "adapter_config.json").string(), size_t{16} << 20);
  auto refuse = [&](const std::string& why) {
    throw GgufError((dir / "adapter_config.json").string() + ": " + why);
  };
  if (lora.value("peft_type", "") != "LORA") refuse("peft_type is not LORA");
  if (lora.value("use_dora", false)) refuse("DoRA adapters have no llama.cpp form");
  for (const char* pattern : {"rank_pattern", "alpha_pattern"})
    if (lora.contains(pattern) && lora[pattern].is_object() && !lora[pattern].empty())
      refuse(std::string(pattern) +
             " gives some weights their own rank or alpha; a llama.cpp "
             "adapter has one alpha");
  if (!lora.contains("r") || !lora["r"].is_number() || !lora.contains("lora_alpha") ||
      !lora["lora_alpha"].is_number())
    refuse("r and lora_alpha are required numbers");
  const double r = lora["r"].get<double>();
  double alpha = lora["lora_alpha"].get<double>();
  // llama.cpp scales by alpha / r; rsLoRA by alpha / sqrt(r).
  if (lora.value("use_rslora", false)) alpha *= std::sqrt(r);

  GgufWriter out(path);
  add_general(out, arch, "adapter", model_name, type);
  out.set_string("adapter.type", "lora");
  out.set_f32("adapter.lora.alpha", static_cast<float>(alpha));

  const SafetensorsReader weights((dir / "adapter_model.safetensors").string());
  static const std::regex lora_name(R"((?:base_model\.model\.)?(.+)\.lora_([AB])\.weight)");
  std::map<std::string, std::pair<std::string, std::string>> pairs;  // base -> (A, B) keys
  for (const std::string& key : weights.names()) {
    std::smatch m;
    if (!std::regex_match(key, m, lora_name))
      throw GgufError(weights.path() + ": tensor " + key +
                      " is not a LoRA A or B matrix (a llama.cpp adapter holds only those)");
    auto& pair = pairs[m[1].str() + ".weight"];
    (m[2] == "A" ? pair.first : pair.second) = key;
  }
  if (pairs.empty()) throw GgufError(weights.path() + ": no LoRA tensors");
  size_t in_f16 = 0;
  for (const auto& [base, keys] : pairs) {
    if (keys.first.empty() || keys.second.empty())
      throw GgufError(weights.path() + ": " + base + " has only one of lora_A and lora_B");
    const std::optional<std::string> name = gguf_tensor_name(base);
    if (!name)
      throw GgufError(weights.path() + ": the adapted weight " + base +
                      " has no GGUF name tightfit knows");
    at::Tensor a = weights.read(keys.first).to(at::kFloat);
    at::Tensor b = weights.read(keys.second).to(at::kFloat);
    if (a.dim() != 2 || b.dim() != 2 || a.size(0) != b.size(1))
      throw GgufError(weights.path() + ": " + base + "'s lora_A " + json_excerpt(a.sizes().vec()) +
                      " and lora_B " + json_excerpt(b.sizes().vec()) + " do not multiply");
    // B's rows are the weight's output rows: permuted as the weight is.
    if (const int64_t n = permuted_heads(arch, config, *name)) b = permute_rows(b, n, base);
    for (auto& [suffix, t] : {std::pair{".lora_a", a}, std::pair{".lora_b", b}}) {
      const TensorType* tt = &type;
      if (tt->block > 1 && t.size(-1) % tt->block != 0) {
        // As convert_lora_to_gguf: F16 where rows do not fill the blocks (B's r columns).
        ++in_f16;
        tt = tensor_type(1);
      }
      add_encoded(out, *name + suffix, t, *tt);
    }
  }
  if (in_f16 > 0)
    log_message(TF_LOG_WARN,
                std::to_string(in_f16) + " adapter matrices have rows that do not fill " +
                    type.name + " blocks of " + std::to_string(type.block) +
                    " (lora_b's rows are r = " + std::to_string(static_cast<int64_t>(r)) +
                    " long): written as F16, as convert_lora_to_gguf writes them");
  out.finish();
}

}  // namespace tightfit::gguf
