// A reward model opened from a Hugging Face folder (score_texts, ABI 1.28):
// a session of its own beside the run (SessionOptions::guest), scoring texts
// as transformers' *ForSequenceClassification and TRL's GRPOTrainer do.
#include <ATen/ATen.h>

#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "chat_data.hpp"
#include "chat_template.hpp"
#include "json_input.hpp"
#include "model_folder_recipe.hpp"
#include "recipe_error.hpp"
#include "session.hpp"
#include "tokenizer_config.hpp"

namespace tightfit {
namespace fs = std::filesystem;
namespace {

// What config.json says of the classifier: its labels (id2label's, else
// num_labels, else 2: transformers' PretrainedConfig) and its positions.
struct ClassifierConfig {
  int64_t num_labels = 2;
  int64_t positions = 0;
};

ClassifierConfig read_classifier_config(const fs::path& folder) {
  const std::string file = (folder / "config.json").string();
  nlohmann::json cfg;
  try {
    cfg = read_json_file(file, size_t{16} << 20);
  } catch (const std::invalid_argument& e) {
    throw RecipeError(std::string(e.what()) + ": a reward model is a Hugging Face folder");
  }
  bool classifies = false;
  std::string named;
  if (cfg.is_object() && cfg.contains("architectures") && cfg["architectures"].is_array())
    for (const auto& a : cfg["architectures"])
      if (a.is_string()) {
        named += (named.empty() ? "" : ", ") + a.get<std::string>();
        classifies = classifies || a.get<std::string>().ends_with("ForSequenceClassification");
      }
  if (!classifies)
    throw RecipeError(file + ": architectures is [" + named +
                      "], not a *ForSequenceClassification model: a reward model scores "
                      "texts with a classification head (score.weight); give such a folder");
  ClassifierConfig c;
  if (cfg.contains("id2label") && cfg["id2label"].is_object() && !cfg["id2label"].empty())
    c.num_labels = static_cast<int64_t>(cfg["id2label"].size());
  else if (cfg.contains("num_labels") && cfg["num_labels"].is_number_integer())
    c.num_labels = cfg["num_labels"].get<int64_t>();
  for (const char* key : {"max_position_embeddings", "n_positions"})
    if (cfg.contains(key) && cfg[key].is_number_integer() && cfg[key].get<int64_t>() > 0) {
      c.positions = cfg[key].get<int64_t>();
      break;
    }
  return c;
}

class FolderScorer final : public TextScorer {
 public:
  FolderScorer(const fs::path& folder, const PluginRegistry& registry, const std::string& device,
               bool dry_run)
      : folder_(folder.string()), config_(read_classifier_config(folder)), dry_run_(dry_run) {
    SessionOptions o;
    o.guest = true;
    o.skip_data = true;
    o.dry_run = dry_run;
    session_ = std::make_unique<Session>(
        recipe_for_model_folder(folder, fs::absolute(folder).string(), device), registry, o);
    check_head();
    for (const Param& p : session_->store().all())
      if (!p.absent) weight_bytes_ += p.numel() * static_cast<int64_t>(at::elementSize(p.dtype));
    if (dry_run) return;
    const Tokenizer& tok = session_->data().tokenizer();
    tokens_ = TokenizerConfig::load(folder_);
    // TRL pads with the tokenizer's pad token, its EOS when it has none, and
    // sets the model's pad_token_id to it: the score is read at the last
    // token that is not it.
    const std::string& pad = tokens_.pad_token.empty() ? tokens_.eos_token : tokens_.pad_token;
    pad_id_ = pad.empty() ? -1 : tok.token_id(pad);
    if (pad_id_ < 0)
      throw RecipeError(folder_ +
                        ": the tokenizer names no pad or EOS token (tokenizer_config.json), so "
                        "the token a score is read at is unknown (TRL pads with one): add "
                        "\"pad_token\" to tokenizer_config.json");
  }

  std::vector<double> score(const std::vector<std::string>& texts, bool messages, int64_t label,
                            int64_t batch_rows) override {
    if (dry_run_)
      throw std::logic_error("score_texts: " + folder_ + " was only composed (a planned run)");
    at::NoGradGuard no_grad;
    std::vector<std::vector<int64_t>> ids;
    ids.reserve(texts.size());
    for (size_t i = 0; i < texts.size(); ++i) ids.push_back(tokenize(texts[i], messages, i));
    const int64_t n = static_cast<int64_t>(ids.size());
    const int64_t step = batch_rows > 0 ? batch_rows : std::max<int64_t>(n, 1);
    std::vector<double> out;
    out.reserve(ids.size());
    for (int64_t from = 0; from < n; from += step) {
      const int64_t rows = std::min(step, n - from);
      size_t width = 1;
      for (int64_t r = 0; r < rows; ++r) width = std::max(width, ids[from + r].size());
      // Right-padded as TRL's tokenizer call pads; causal attention keeps the
      // pads out of every real token's logits.
      at::Tensor batch = at::full({rows, static_cast<int64_t>(width)}, pad_id_, at::kLong);
      std::vector<int64_t> last(static_cast<size_t>(rows), 0);
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<int64_t>& row = ids[from + r];
        if (!row.empty())
          batch[r]
              .narrow(0, 0, static_cast<int64_t>(row.size()))
              .copy_(at::tensor(at::ArrayRef<int64_t>(row), at::kLong));
        // transformers' pooling: the rightmost token that is not the pad
        // token (0 when every token is one).
        for (size_t t = row.size(); t-- > 0;)
          if (row[t] != pad_id_) {
            last[static_cast<size_t>(r)] = static_cast<int64_t>(t);
            break;
          }
      }
      const at::Device device = session_->env().device;
      const at::Tensor logits =
          session_->executor().forward_logits(batch.to(device), /*training=*/false);
      // Each row's pooled token's logit of `label`, brought over alone.
      const at::Tensor pooled =
          logits.select(2, label)
              .gather(1, at::tensor(at::ArrayRef<int64_t>(last), at::kLong).to(device).unsqueeze(1))
              .to(at::kCPU, at::kDouble);
      const auto value = pooled.accessor<double, 2>();
      for (int64_t r = 0; r < rows; ++r) out.push_back(value[r][0]);
    }
    return out;
  }

  int64_t weight_bytes() const override { return weight_bytes_; }
  int64_t num_labels() const override { return config_.num_labels; }
  int64_t positions() const override { return config_.positions; }

 private:
  // The model plugin read the folder as a classifier: its head is
  // score.weight with a row per label (a plugin that reads only causal LMs
  // would score with its vocabulary's logits).
  void check_head() const {
    for (const Param& p : session_->store().all())
      if (p.name == "score.weight") {
        if (p.shape.empty() || p.shape[0] != config_.num_labels)
          throw RecipeError(folder_ + ": score.weight has " +
                            std::to_string(p.shape.empty() ? 0 : p.shape[0]) +
                            " rows and config.json " + std::to_string(config_.num_labels) +
                            " labels (id2label, num_labels); they must agree");
        return;
      }
    throw RecipeError(folder_ + ": model plugin \"" + session_->plugins().model.plugin->name +
                      "\" does not read *ForSequenceClassification models (it declares no "
                      "score.weight head); `tightfit plugins` lists the models, and the llama "
                      "plugin reads LLaMA, Qwen2/3, Mistral and Gemma classifiers");
  }

  std::vector<int64_t> tokenize(const std::string& text, bool messages, size_t row) {
    const std::string where = "score_texts row " + std::to_string(row);
    std::string rendered = text;
    if (messages) {
      const nlohmann::ordered_json m = parse_ordered_json(text, where);
      check_chat_messages(m, where, "messages");
      if (!template_) {
        if (tokens_.chat_template.empty())
          throw std::invalid_argument(
              where + ": " + folder_ +
              " has no chat template, so conversational rows cannot be scored (TRL applies "
              "the reward model's template): add one to its tokenizer_config.json");
        template_ = std::make_unique<ChatTemplate>(tokens_.chat_template, tokens_.source);
      }
      rendered = template_->render(m, false, tokens_.template_variables()).text;
    }
    std::vector<int64_t> ids = session_->data().tokenizer().encode(rendered);
    if (ids.empty())
      throw std::invalid_argument(where +
                                  ": no tokens to score (transformers would read the score "
                                  "from padding its attention mask hides): give a text");
    if (config_.positions > 0 && static_cast<int64_t>(ids.size()) > config_.positions)
      throw std::invalid_argument(where + ": " + std::to_string(ids.size()) + " tokens, and " +
                                  folder_ + " reads at most " + std::to_string(config_.positions) +
                                  " (max_position_embeddings): lower max_completion_length or "
                                  "use a reward model with more positions");
    return ids;
  }

  std::string folder_;
  ClassifierConfig config_;
  bool dry_run_;
  std::unique_ptr<Session> session_;
  TokenizerConfig tokens_;
  std::unique_ptr<ChatTemplate> template_;
  int64_t pad_id_ = -1;
  int64_t weight_bytes_ = 0;
};

// The classifier in `folder` on `device`, its weights read unless `dry_run`
// (then composed only, and score() refused).
std::shared_ptr<TextScorer> open_folder_scorer(const std::string& folder,
                                               const PluginRegistry& registry,
                                               const std::string& device, bool dry_run) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec))
    throw RecipeError(folder +
                      ": not a folder; a reward model is a Hugging Face model folder "
                      "(config.json, weights, tokenizer)");
  return std::make_shared<FolderScorer>(fs::path(folder), registry, device, dry_run);
}

}  // namespace

// One model a folder for the run, opened when a plugin first asks: a
// reward's create (so a folder it cannot read stops the run at set-up), its
// estimate, and each score call (from the reward's own call thread).
std::shared_ptr<TextScorer> Session::open_scorer(const std::string& model) {
  std::error_code ec;
  const fs::path canonical = fs::weakly_canonical(fs::absolute(model), ec);
  const std::string key = ec ? model : canonical.string();
  std::lock_guard<std::mutex> lock(scorers_mutex_);
  std::shared_ptr<TextScorer>& open = scorers_[key];
  if (!open) {
    if (!options_.dry_run) log(TF_LOG_INFO, "opening the scoring model " + key);
    open = open_folder_scorer(key, plugins_.registry, env_.device_str, options_.dry_run);
  }
  return open;
}

}  // namespace tightfit
