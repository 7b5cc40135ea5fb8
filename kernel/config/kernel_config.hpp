// The kernel's own recipe tables read once into structs (as torchtitan's
// JobConfig): [run], [data], [optimizer] and [save]. The code reads fields,
// never a key by its string. Each table's fields are one list below, in the
// order of its keys in kernel_keys.cpp (types, defaults, ranges and docs
// live there); KernelConfig.FieldsAreTheKeys checks that the two lists are
// the same names in the same order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "recipe.hpp"

// X(type, field, getter): the field and the ConfigTable getter that reads it.
#define TF_RUN_CONFIG(X)                                     \
  X(std::string, name, get_string)                           \
  X(int64_t, seed, get_int)                                  \
  X(int64_t, steps, get_int)                                 \
  X(std::string, device, get_string)                         \
  X(int64_t, memory_budget, get_size)                        \
  X(std::string, memory_budget_scope, get_string)            \
  X(int64_t, cpu_block_cache, get_size)                      \
  X(bool, fused_loss, get_bool)                              \
  X(int64_t, loss_chunk_tokens, get_int)                     \
  X(int64_t, mlp_tile_tokens, get_int)                       \
  X(std::string, out_dir, get_string)                        \
  X(int64_t, log_every, get_int)                             \
  X(int64_t, threads, get_int)                               \
  X(bool, adapt_threads, get_bool)                           \
  X(int64_t, sample_tokens, get_int)                         \
  X(std::string, sample_prompt, get_string)                  \
  X(int64_t, sample_top_k, get_int)                          \
  X(std::string, answer_prompts, get_string)                 \
  X(int64_t, answer_tokens, get_int)                         \
  X(int64_t, eval_batches, get_int)                          \
  X(int64_t, eval_interval, get_int)                         \
  X(double, dist_timeout, get_double)                        \
  X(bool, deterministic, get_bool)                           \
  X(std::vector<std::string>, plugin_paths, get_string_list) \
  X(std::string, on_non_finite, get_string)                  \
  X(std::vector<int64_t>, debug_nan_at_steps, get_int_list)  \
  X(bool, profile_ops, get_bool)

#define TF_DATA_CONFIG(X)                    \
  X(std::string, corpus, get_string)         \
  X(std::string, tokenizer, get_string)      \
  X(int64_t, seq_len, get_int)               \
  X(int64_t, batch_size, get_int)            \
  X(double, val_fraction, get_double)        \
  X(std::string, train_on, get_string)       \
  X(bool, packing, get_bool)                 \
  X(std::string, chat_template, get_string)  \
  X(int64_t, max_prompt_length, get_int)     \
  X(int64_t, max_completion_length, get_int) \
  X(int64_t, max_length, get_int)            \
  X(std::string, truncation_mode, get_string)

#define TF_OPTIMIZER_CONFIG(X)        \
  X(std::string, name, get_string)    \
  X(double, lr, get_double)           \
  X(double, weight_decay, get_double) \
  X(double, beta1, get_double)        \
  X(double, beta2, get_double)        \
  X(double, eps, get_double)          \
  X(double, momentum, get_double)     \
  X(double, grad_clip, get_double)    \
  X(bool, fused, get_bool)

#define TF_SAVE_CONFIG(X)         \
  X(int64_t, every, get_int)      \
  X(int64_t, keep_last, get_int)  \
  X(bool, final, get_bool)        \
  X(std::string, dir, get_string) \
  X(bool, hf, get_bool)           \
  X(bool, adapter, get_bool)

namespace tightfit {

#define TF_CONFIG_FIELD(type, field, getter) type field{};
struct RunConfig {
  TF_RUN_CONFIG(TF_CONFIG_FIELD)
};
struct DataConfig {
  TF_DATA_CONFIG(TF_CONFIG_FIELD)
};
struct OptimizerConfig {
  TF_OPTIMIZER_CONFIG(TF_CONFIG_FIELD)
};
struct SaveConfig {
  TF_SAVE_CONFIG(TF_CONFIG_FIELD)
};
#undef TF_CONFIG_FIELD

struct KernelConfig {
  RunConfig run;
  DataConfig data;
  OptimizerConfig optimizer;
  SaveConfig save;
};

// Each table read from its validated ConfigTable (defaults filled in).
RunConfig read_run_config(const ConfigTable& t);
DataConfig read_data_config(const ConfigTable& t);
OptimizerConfig read_optimizer_config(const ConfigTable& t);
SaveConfig read_save_config(const ConfigTable& t);

// The field names of each struct, in order (for the check against the keys).
const std::vector<std::string>& run_config_fields();
const std::vector<std::string>& data_config_fields();
const std::vector<std::string>& optimizer_config_fields();
const std::vector<std::string>& save_config_fields();

}  // namespace tightfit
