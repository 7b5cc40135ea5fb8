#include "data_setup.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "chat_data.hpp"
#include "checked_size.hpp"
#include "example_batcher.hpp"
#include "file_util.hpp"
#include "gguf_folder.hpp"
#include "gguf_model.hpp"
#include "json_input.hpp"
#include "kto_data.hpp"
#include "memory_accounting.hpp"
#include "prompt_data.hpp"
#include "tokenizer_choice.hpp"
#include "tokenizer_folder.hpp"

namespace tightfit {
namespace fs = std::filesystem;

namespace {

fs::path resolve(const std::string& spec, const std::string& base_dir) {
  fs::path p = spec;
  if (p.is_relative() && !base_dir.empty() && !fs::exists(p)) p = fs::path(base_dir) / p;
  return p;
}

// The first .jsonl file of `p` (itself, or the first in a folder, sorted).
fs::path first_jsonl(const fs::path& p) {
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) return p.extension() == ".jsonl" ? p : fs::path();
  if (!fs::is_directory(p, ec)) return {};
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(p, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec) && it->path().extension() == ".jsonl") files.push_back(it->path());
  if (files.empty()) return {};
  return *std::min_element(files.begin(), files.end());
}

// The budget counts the data: what reading it would hold (`bytes`, at
// least) is refused before it is read when it is already over the budget.
void check_corpus_fits(const DataRequest& r, int64_t bytes, const std::string& what) {
  if (r.memory_budget <= 0 || !r.budget_counts_host || bytes <= r.memory_budget) return;
  throw OutOfBudgetError("the corpus alone needs at least " + format_bytes(bytes) + " (" + what +
                         ") and run.memory_budget is " + format_bytes(r.memory_budget) +
                         ": the budget counts the data as well as the model; raise it or use a "
                         "smaller corpus");
}

// Reading and tokenizing may ask for more than the machine has even without
// a budget: that is the out-of-memory exit naming the file and the stage
// (`stage`, or the file:line and stage a DataOutOfMemory names), not a bare
// std::bad_alloc.
template <class F>
auto preparing_data(const DataRequest& r, const std::string& stage, F&& step) {
  auto out_of_memory = [&](const std::string& what) {
    return OutOfBudgetError("this machine ran out of memory " + what + " (corpus \"" + r.corpus +
                            "\", " + format_bytes(corpus_bytes_on_disk(r.corpus, r.base_dir)) +
                            " on disk): tightfit holds the tokenized corpus in memory; use a "
                            "smaller corpus, or split it and train on the parts in turn");
  };
  try {
    return step();
  } catch (const DataOutOfMemory& e) {
    throw out_of_memory(std::string("at ") + e.what());
  } catch (const std::bad_alloc&) {
    throw out_of_memory(stage);
  }
}

DataSetup stream(const DataRequest& r, DataSetup d) {
  if (r.packing)
    throw std::invalid_argument(
        "packing = true packs instruction and chat rows, and corpus \"" + r.corpus +
        "\" is text, which is always one token stream cut into rows: drop packing");
  check_corpus_fits(r, corpus_bytes_on_disk(r.corpus, r.base_dir), "its text, read whole");
  const std::string text = preparing_data(r, "reading the corpus's text",
                                          [&] { return load_corpus_text(r.corpus, r.base_dir); });
  // The byte tokenizer makes one int64 id per byte.
  if (d.tokenizer_spec == "byte")
    check_corpus_fits(r, checked_product({static_cast<int64_t>(text.size()), 8}, "the corpus"),
                      std::to_string(text.size()) + " tokens as int64");
  // A tokenizer.json reads text, as Hugging Face's does (it is given a
  // decoded str): bytes that are not UTF-8 would be split in ways no peer
  // reproduces. The byte tokenizer reads any bytes.
  if (d.tokenizer_spec != "byte")
    if (const size_t bad = first_invalid_utf8(text); bad != std::string::npos) {
      const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<long>(bad), '\n');
      throw std::runtime_error("corpus \"" + r.corpus + "\" is not valid UTF-8 (byte " +
                               std::to_string(bad) + " of its text, line " + std::to_string(line) +
                               "), and tokenizer " + d.tokenizer_spec +
                               " reads text: convert it (iconv -f latin1 -t utf-8) or use "
                               "tokenizer = \"byte\"");
    }
  std::vector<int64_t> ids = preparing_data(
      r,
      "tokenizing the corpus's " + std::to_string(text.size()) + " bytes with " + d.tokenizer_spec,
      [&] { return d.tokenizer->encode(text); });
  CategoryScope scope(TF_MEM_OTHER);
  at::Tensor tokens;
  try {
    tokens = at::tensor(ids, at::kLong);
  } catch (const c10::OutOfMemoryError&) {
    // The budget counts the data too, and this is its first byte.
    throw OutOfBudgetError(
        "the corpus alone needs " + format_bytes(static_cast<int64_t>(ids.size()) * 8) + " (" +
        std::to_string(ids.size()) + " tokens as int64) and run.memory_budget is " +
        format_bytes(r.memory_budget) +
        ": the budget counts the data as well as the model; raise it or use a "
        "smaller corpus");
  }
  d.unigram_entropy = unigram_entropy(tokens, d.tokenizer->vocab_size());
  // Ranks sample the global batch and each keeps its own rows (next_batch).
  d.batcher = std::make_unique<TokenBatcher>(tokens, r.seq_len, r.batch_size * r.world_size, r.seed,
                                             r.val_fraction);
  return d;
}

// The preference keys as the rows will be cut, checked before a row is read
// (a dry run and `plan` refuse them too): max_length 0 is seq_len + 1.
PreferenceOptions preference_options(const DataRequest& r) {
  PreferenceOptions preference = r.preference;
  if (preference.max_length == 0) preference.max_length = r.seq_len + 1;
  if (preference.max_length > r.seq_len + 1)
    throw std::invalid_argument(
        "max_length = " + std::to_string(preference.max_length) +
        " tokens of prompt + completion do not fit a row of seq_len = " +
        std::to_string(r.seq_len) + " (inputs) + 1 (the last target): set seq_len = " +
        std::to_string(preference.max_length - 1) + ", or leave max_length out (seq_len + 1)");
  const char* trainers =
      preference.unpaired ? "TRL's KTOTrainer does" : "TRL's CPOTrainer and ORPOTrainer do";
  const bool joint = preference.joint || preference.unpaired;
  if (joint &&
      (preference.max_prompt_length <= 0 || preference.max_prompt_length >= preference.max_length))
    throw std::invalid_argument(
        "max_prompt_length = " + std::to_string(preference.max_prompt_length) +
        " is not below max_length = " + std::to_string(preference.max_length) +
        (r.preference.max_length == 0 ? " (seq_len + 1)" : "") +
        ": this schedule tokenizes its rows as " + trainers +
        ", which cut a long row's prompt to max_prompt_length and its answers to max_length - "
        "max_prompt_length (TRL fails on this too); set [data] max_prompt_length below it, e.g. " +
        std::to_string(std::max<int64_t>(1, preference.max_length / 2)));
  if (joint && preference.max_completion_length > 0)
    throw std::invalid_argument(
        "max_completion_length = " + std::to_string(preference.max_completion_length) +
        ": this schedule tokenizes its rows as " + trainers +
        ", which cut completions by max_length and max_prompt_length "
        "only: leave max_completion_length out");
  if (r.train_on != "completion")
    throw std::invalid_argument("train_on = \"" + r.train_on +
                                "\", and preference pairs score their completions only: leave "
                                "train_on out");
  return preference;
}

// KTO's rows: read in their order, held out, each split's KL rows made
// within its chunks of batch_size rows, batched in that order.
DataSetup unpaired_examples(const DataRequest& r, DataSetup d, const ChatFormatter& formatter,
                            const PreferenceOptions& preference, int64_t pad) {
  const KtoFormatter kto(formatter, preference);
  const std::vector<KtoRow> rows = preparing_data(
      r, "reading the rows", [&] { return load_kto_rows(r.corpus, kto, r.base_dir); });
  if (rows.empty()) throw std::invalid_argument("corpus \"" + r.corpus + "\" holds no rows");
  const std::vector<bool> held = ExampleBatcher::held_out(rows.size(), r.val_fraction, r.seed);
  std::vector<const KtoRow*> train, validation;
  int64_t desirable = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    (held[i] ? validation : train).push_back(&rows[i]);
    desirable += rows[i].completion.desirable;
  }
  auto batcher = preparing_data(r, "batching the rows", [&] {
    ExampleBatcher::Splits splits{kto_units(train, r.batch_size, kto),
                                  kto_units(validation, r.batch_size, kto)};
    return std::make_unique<ExampleBatcher>(std::move(splits), r.seq_len,
                                            r.batch_size * r.world_size, pad, r.world_size > 1);
  });
  const ExampleBatcher::Counts& c = batcher->counts();
  d.unigram_entropy = unigram_entropy(batcher->train_ids(), d.tokenizer->vocab_size());
  d.description =
      std::to_string(c.examples) + " unpaired preference rows (" + std::to_string(desirable) +
      " desirable, " + std::to_string(static_cast<int64_t>(rows.size()) - desirable) +
      " undesirable): " + std::to_string(c.train) + " train, " + std::to_string(c.validation) +
      " validation, in their order, each with a KL row (its prompt, the completion "
      "before it in its chunk of batch_size = " +
      std::to_string(r.batch_size) + "); " + std::to_string(c.without_answer) +
      " keep no completion token within max_length = " + std::to_string(preference.max_length) +
      "; " + std::to_string(c.trained_tokens) + " tokens scored";
  // Rows go in their order: pairs unpaired put every chosen answer first.
  const auto global = static_cast<size_t>(r.batch_size * r.world_size);
  size_t batches = 0, one_label = 0;
  for (size_t b = 0; b < train.size(); b += global, ++batches) {
    const size_t end = std::min(train.size(), b + global);
    one_label += std::all_of(train.begin() + static_cast<long>(b),
                             train.begin() + static_cast<long>(end), [&](const KtoRow* row) {
                               return row->completion.desirable == train[b]->completion.desirable;
                             });
  }
  if (one_label > 0)
    d.description += "; " + std::to_string(one_label) + " of the " + std::to_string(batches) +
                     " batches an epoch hold completions of one label only (rows are trained in "
                     "their order, as TRL's KTOTrainer takes them: interleave the labels in the "
                     "file for batches of both)";
  d.batcher = std::move(batcher);
  return d;
}

// Prompt rows for a schedule that completes them (prompt_data.hpp).
DataSetup prompt_examples(const DataRequest& r, DataSetup d, const ChatFormatter& formatter,
                          const TokenizerConfig& config, int64_t pad) {
  const int64_t cap = r.preference.max_prompt_length;
  std::vector<PromptRow> rows = preparing_data(r, "reading the prompts", [&] {
    return load_prompt_rows(r.corpus, formatter, cap, config.truncate_left, r.base_dir);
  });
  for (const PromptRow& p : rows)
    d.longest_prompt = std::max<int64_t>(d.longest_prompt, static_cast<int64_t>(p.ids.size()));
  if (!r.read_data) return d;  // planning: the length is all it needs
  const auto cut =
      std::count_if(rows.begin(), rows.end(), [](const PromptRow& p) { return p.truncated; });
  auto id_of = [&](const std::string& token) {
    return token.empty() ? int64_t{-1} : d.tokenizer->token_id(token);
  };
  auto batcher = std::make_unique<PromptBatcher>(std::move(rows), r.batch_size * r.world_size,
                                                 r.seed, r.val_fraction, pad,
                                                 id_of(config.eos_token), id_of(config.pad_token));
  d.description = std::to_string(batcher->train_rows() + batcher->validation_rows()) +
                  " prompts: " + std::to_string(batcher->train_rows()) + " train, " +
                  std::to_string(batcher->validation_rows()) + " validation; the longest " +
                  std::to_string(batcher->longest()) + " tokens; " + std::to_string(cut) +
                  " cut to max_prompt_length = " + std::to_string(cap) + " (keeping the " +
                  (config.truncate_left ? "last" : "first") +
                  " tokens, as the tokenizer's truncation_side says)";
  d.batcher = std::move(batcher);
  return d;
}

// `preference`: the checked preference options (preference_options) for pairs.
DataSetup examples(const DataRequest& r, DataSetup d, const PreferenceOptions& preference) {
  // The tokenizer's folder holds its tokenizer_config.json (special tokens, chat template).
  TokenizerConfig config;
  if (d.tokenizer_spec != "byte")
    config = TokenizerConfig::load(fs::path(d.tokenizer_spec).parent_path().string());
  if (!r.chat_template.empty()) {
    const fs::path t = resolve(r.chat_template, r.base_dir);
    config.chat_template = read_regular_file(t.string(), size_t{64} << 20);
    config.source = t.string();
  }
  const ChatFormatter formatter(*d.tokenizer, config,
                                r.train_on == "all" ? TrainOn::kAll : TrainOn::kCompletion);
  check_corpus_fits(r, corpus_bytes_on_disk(r.corpus, r.base_dir), "its rows, read whole");
  int64_t pad = d.tokenizer->token_id(config.pad_token);
  if (pad < 0) pad = d.tokenizer->token_id(config.eos_token);
  if (pad < 0) pad = 0;  // padding is never a target, and causal attention never looks ahead to it
  if (d.unpaired) return unpaired_examples(r, std::move(d), formatter, preference, pad);
  if (d.prompts) return prompt_examples(r, std::move(d), formatter, config, pad);
  const bool pairs = d.pairs;
  const PreferenceFormatter preferences(formatter, preference);
  std::vector<Example> rows = preparing_data(r, "reading the rows", [&] {
    return pairs ? load_preference_examples(r.corpus, preferences, r.base_dir)
                 : load_examples(r.corpus, formatter, r.base_dir);
  });
  const auto not_prefix =
      std::count_if(rows.begin(), rows.end(), [](const Example& e) { return e.prompt_not_prefix; });
  auto batcher = preparing_data(r, "batching the rows", [&] {
    return std::make_unique<ExampleBatcher>(std::move(rows), r.seq_len, r.batch_size * r.world_size,
                                            r.seed, r.val_fraction, pad, r.packing, pairs);
  });
  const ExampleBatcher::Counts& c = batcher->counts();
  d.unigram_entropy = unigram_entropy(batcher->train_ids(), d.tokenizer->vocab_size());
  if (pairs)
    d.description = std::to_string(c.examples) + " preference pairs: " + std::to_string(c.train) +
                    " train, " + std::to_string(c.validation) + " validation; " +
                    std::to_string(c.without_answer) +
                    " with a side that keeps no completion token within max_length = " +
                    std::to_string(preference.max_length) +
                    " (its log-probability is 0, as in "
                    "TRL); " +
                    std::to_string(c.trained_tokens) + " completion tokens scored";
  else
    d.description = std::to_string(c.examples) + " examples: " + std::to_string(c.train) +
                    " train, " + std::to_string(c.validation) + " validation; " +
                    std::to_string(c.truncated) + " cut to seq_len " + std::to_string(r.seq_len) +
                    ", " + std::to_string(c.without_answer) +
                    " left out (no answer token within it); " + std::to_string(c.trained_tokens) +
                    " tokens trained on (train_on = " + r.train_on + ")";
  if (not_prefix > 0)
    d.description += "; " + std::to_string(not_prefix) +
                     " rows whose tokenized prompt is not a prefix of their tokenized prompt + "
                     "completion (tokens merge across the boundary), masked as TRL masks them: "
                     "the first len(prompt) tokens";
  if (r.packing) {
    char fill[16];
    std::snprintf(fill, sizeof fill, "%.1f%%", 100 * c.row_fill);
    d.description += "; packed " + std::to_string(c.train) + " into " + std::to_string(c.rows) +
                     " rows of " + std::to_string(r.seq_len) + " tokens, " + fill + " filled";
  }
  d.batcher = std::move(batcher);
  return d;
}

}  // namespace

namespace {

// The first row of the first .jsonl file of `spec`, when it is a JSON object.
std::optional<nlohmann::json> first_row(const std::string& spec, const std::string& base_dir) {
  const fs::path file = first_jsonl(resolve(spec, base_dir));
  if (file.empty()) return std::nullopt;
  // The first non-blank line decides, read at most 16 MiB in: a file of one
  // endless line (or of blank lines) is not read whole to find out.
  constexpr size_t kMaxProbe = size_t{16} << 20;
  std::ifstream in(file);
  std::string line;
  size_t probed = 0, line_number = 1;
  for (char c; probed < kMaxProbe && in.get(c); ++probed) {
    if (c != '\n') {
      line += c;
      continue;
    }
    if (line.find_first_not_of(" \t\r") != std::string::npos) break;
    line.clear();
    ++line_number;
  }
  if (line.find_first_not_of(" \t\r") == std::string::npos || probed >= kMaxProbe)
    return std::nullopt;
  // A .jsonl file's rows are JSON: the first one decides what the data is,
  // and one that does not parse is reported as that row (its file and
  // line), never taken for text and then blamed on a key the recipe sets.
  nlohmann::json row = parse_json(line, file.string() + ":" + std::to_string(line_number));
  if (!row.is_object()) return std::nullopt;
  return row;
}

}  // namespace

CorpusKind corpus_kind(const std::string& spec, const std::string& base_dir) {
  const std::optional<nlohmann::json> row = first_row(spec, base_dir);
  if (!row) return CorpusKind::kText;
  if (row->contains("chosen") && row->contains("rejected")) return CorpusKind::kPairs;
  if (row->contains("completion") && row->contains("label")) return CorpusKind::kUnpaired;
  if (is_prompt_only_row(*row)) return CorpusKind::kPrompts;
  for (const char* key :
       {"messages", "prompt", "completion", "instruction", "output", "chosen", "rejected"})
    if (row->contains(key)) return CorpusKind::kExamples;
  return CorpusKind::kText;
}

DataSetup setup_data(const DataRequest& r) {
  DataSetup d;
  d.tokenizer_spec = r.tokenizer;
  const std::string weights = r.weights.empty() ? "" : resolve(r.weights, r.base_dir).string();
  if (!weights.empty() && gguf::looks_like_gguf(weights)) {
    // A GGUF model's tokenizer is in its metadata (gguf_tokenizer).
    if (d.tokenizer_spec == "byte")
      throw std::invalid_argument(
          "tokenizer = \"byte\", and [model] weights " + weights +
          " is a GGUF model, which reads the ids of its own tokenizer, not bytes; set tokenizer "
          "= \"auto\" to use the tokenizer in its metadata");
    if (d.tokenizer_spec == "auto") {
      const gguf::ModelFolder folder = gguf::model_folder(weights);
      if (!folder.tokenizer_error.empty()) throw std::invalid_argument(folder.tokenizer_error);
      d.tokenizer_spec = folder.path;
    }
  }
  if (d.tokenizer_spec == "auto") {
    // The model's own tokenizer, never a stand-in: the byte tokenizer only
    // when the recipe names it.
    if (r.weights.empty())
      throw std::invalid_argument(
          "tokenizer = \"auto\" is the tokenizer of [model] weights, and this recipe loads no "
          "weights: set tokenizer = \"byte\" for the 256-id byte tokenizer, or tokenizer = "
          "\"PATH\" for a model folder or tokenizer.json");
    fs::path w = resolve(r.weights, r.base_dir);
    std::error_code ec;
    if (!fs::exists(w, ec))
      throw std::invalid_argument("[model] weights \"" + r.weights +
                                  "\" is not a file or folder (nor is it under " + r.base_dir +
                                  "): give the model folder, whose tokenizer tokenizer = "
                                  "\"auto\" reads");
    if (!fs::is_directory(w)) w = w.parent_path();
    if (w.empty()) w = ".";
    if (!has_tokenizer_files(w.string()))
      throw std::invalid_argument(
          "tokenizer = \"auto\" is the tokenizer of [model] weights, and " + w.string() +
          " has none (tokenizer.json, vocab.json + merges.txt, or tokenizer.model): copy the "
          "model's tokenizer files into it, set tokenizer = \"PATH\" to a folder that has them, "
          "or tokenizer = \"byte\" for the 256-id byte tokenizer");
    d.tokenizer_spec = w.string();
  }
  if (d.tokenizer_spec == "byte" && !r.weights.empty()) {
    // Pretrained weights read token ids of their own tokenizer; bytes are
    // not those ids.
    fs::path w = resolve(r.weights, r.base_dir);
    if (!fs::is_directory(w)) w = w.parent_path();
    // (A folder tightfit exported from a byte-tokenizer run holds the byte
    // tokenizer written as a tokenizer.json: that one is bytes.)
    std::error_code ec;
    const bool byte_export =
        fs::is_regular_file(w / "tokenizer.json", ec) &&
        fs::file_size(w / "tokenizer.json", ec) == byte_tokenizer_json().size() &&
        read_regular_file((w / "tokenizer.json").string(), size_t{1} << 20) ==
            byte_tokenizer_json();
    if (!w.empty() && has_tokenizer_files(w.string()) && !byte_export)
      throw std::invalid_argument(
          "tokenizer = \"byte\", and [model] weights come from " + w.string() +
          ", which has its own tokenizer: the model's ids are that tokenizer's, not bytes; set "
          "tokenizer = \"auto\" to use it");
  }
  d.tokenizer = make_tokenizer(d.tokenizer_spec, r.base_dir);
  if (d.tokenizer->source_file().size()) d.tokenizer_spec = d.tokenizer->source_file();
  // Known without reading the rows: a plan counts a pair's two rows.
  const CorpusKind kind = corpus_kind(r.corpus, r.base_dir);
  if (kind == CorpusKind::kUnpaired && !r.preference.unpaired)
    throw std::invalid_argument(
        "corpus \"" + r.corpus +
        "\" holds unpaired preference rows (\"completion\" with a \"label\": KTO's), which "
        "only schedule kto trains on (the others would train on the undesirable completions "
        "too): set [schedule] plugin = \"kto\", or drop \"label\" for supervised rows");
  if (r.preference.unpaired && kind != CorpusKind::kPairs && kind != CorpusKind::kUnpaired)
    throw std::invalid_argument(
        "the schedule trains on preference rows as TRL's KTOTrainer (prompt, completion and "
        "label; or chosen and rejected, unpaired), and corpus \"" +
        r.corpus + "\" holds " + (kind == CorpusKind::kText ? "text" : "supervised examples") +
        ": give it rows of either kind");
  if (r.prompts != (kind == CorpusKind::kPrompts))
    throw std::invalid_argument(
        r.prompts ? "the schedule samples its own completions of prompts (online RL), and "
                    "corpus \"" +
                        r.corpus + "\" holds " +
                        (kind == CorpusKind::kText ? std::string("text")
                                                   : std::string("rows with answers")) +
                        ": give rows with a \"prompt\" (text or messages) and no answer"
                  : "corpus \"" + r.corpus +
                        "\" holds prompts without answers, which only a schedule that "
                        "samples its own completions trains on: set [schedule] plugin = "
                        "\"grpo\" (with [[reward]] tables), or give each row a "
                        "\"completion\"");
  d.prompts = r.prompts;
  d.pairs = kind == CorpusKind::kPairs || kind == CorpusKind::kUnpaired;
  d.unpaired = r.preference.unpaired;
  // Prompts are cut by max_prompt_length alone.
  for (const std::string& key : r.preference_keys_set)
    if (d.prompts && key != "max_prompt_length")
      throw std::invalid_argument(key +
                                  " shapes preference rows, and a schedule that samples its own "
                                  "completions reads only max_prompt_length from [data] (the "
                                  "completions' length is its max_completion_length): leave it "
                                  "out");
  // The preference keys shape preference rows only: set for other data,
  // they would change nothing.
  if (!d.pairs && !d.prompts && !r.preference_keys_set.empty())
    throw std::invalid_argument(r.preference_keys_set.front() +
                                " shapes preference rows (chosen/rejected), and corpus \"" +
                                r.corpus + "\" holds none: leave it out");
  const PreferenceOptions preference = d.pairs ? preference_options(r) : r.preference;
  // A plan reads the prompts too: the longest sizes a generation.
  if (!r.read_data && !d.prompts) return d;
  return kind == CorpusKind::kText ? stream(r, std::move(d))
                                   : examples(r, std::move(d), preference);
}

}  // namespace tightfit
