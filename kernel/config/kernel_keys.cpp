// The kernel's own recipe tables: [run], [data], [optimizer] and [save],
// with their types, defaults, ranges and one line of documentation each
// (validation and `tightfit plugins info` read the same list).
#include "kernel_keys.hpp"

#include <optional>
#include <utility>

namespace tightfit {

namespace {

KeySpec key(std::string name, tf_value_type type, std::optional<std::string> def, std::string doc,
            double lo = 1, double hi = 0, std::string choices = {}) {
  return KeySpec{std::move(name), type, std::move(def), std::move(doc), lo, hi, std::move(choices)};
}

}  // namespace

const std::vector<KeySpec>& run_keys() {
  static const std::vector<KeySpec> keys = {
      key("name", TF_VALUE_STRING, "\"run\"", "run name; its folder is out_dir/name"),
      key("seed", TF_VALUE_INT, "1234", "seed for initialization, data order and sampling", 0,
          9.2e18),
      key("steps", TF_VALUE_INT, "200", "optimizer steps to train", 0, 1e12),
      key("device", TF_VALUE_STRING, "\"cpu\"", "compute device: cpu, cuda, cuda:N"),
      key("memory_budget", TF_VALUE_SIZE, "0",
          "refuse allocations past this many bytes (\"8GiB\"); 0 = no budget"),
      key("memory_budget_scope", TF_VALUE_STRING, "\"tracked\"",
          "what memory_budget bounds: the tensor bytes tightfit tracks (on a GPU, the "
          "device's), or the whole process's resident memory (RSS: libraries, allocator and "
          "mapped files too; CPU runs)",
          1, 0, "tracked|process"),
      key("cpu_block_cache", TF_VALUE_SIZE, "\"512MiB\"",
          "freed CPU blocks of 1 MiB and more kept for the next allocation of their size "
          "(weights dequantized, cast or read from a disk tier once per pass), so the kernel "
          "does not fault in and zero fresh pages each time; resident, not tracked, never "
          "beyond the most the live blocks needed; 0 = off"),
      key("fused_loss", TF_VALUE_BOOL, "true",
          "compute the head's projection together with the loss a chunk of tokens at a time, "
          "so the [tokens x vocabulary] logits and their gradient never exist whole (models "
          "whose head declares its projection); false = the logits whole, as before"),
      key("loss_chunk_tokens", TF_VALUE_INT, "0",
          "tokens per chunk of the fused loss; 0 = as many as keep a chunk's fp32 logits near "
          "64 MiB",
          0, 1e9),
      key("mlp_tile_tokens", TF_VALUE_INT, "0",
          "compute the feed-forward of each block over this many tokens at a time in training, "
          "each tile run again in backward rather than kept, so its [tokens x intermediate] "
          "activations are one tile wide (long context; models that declare it); 0 = "
          "all tokens at once",
          0, 1e9),
      key("out_dir", TF_VALUE_STRING, "\"runs\"", "folder that holds run folders"),
      key("log_every", TF_VALUE_INT, "10", "steps between progress lines", 1, 1e9),
      key("threads", TF_VALUE_INT, "0",
          "intra-op CPU threads; 0 = one per CPU this process may use (its affinity, capped by "
          "its cgroup's CPU quota)",
          0, 4096),
      key("adapt_threads", TF_VALUE_BOOL, "false",
          "with threads = 0: between steps, a thread fewer for each of those CPUs other "
          "processes keep busy, back when they are free (faster on a busy machine; the last "
          "bits of a run then follow the load)"),
      key("sample_tokens", TF_VALUE_INT, "200", "tokens to sample from the trained model; 0 = none",
          0, 1e6),
      key("sample_prompt", TF_VALUE_STRING, "\"\\n\"", "prompt for the sample"),
      key("sample_top_k", TF_VALUE_INT, "40", "top-k for the sample; 1 = greedy", 1, 1e9),
      key("answer_prompts", TF_VALUE_PATH, "\"\"",
          "prompts (one a line, or JSONL rows with \"prompt\" or \"messages\", in the model's "
          "chat template) answered greedily before training and after, side by side in the "
          "summary and in the run's answers.jsonl; \"\" = none"),
      key("answer_tokens", TF_VALUE_INT, "48", "most tokens of each answer_prompts answer", 1, 1e5),
      key("eval_batches", TF_VALUE_INT, "8", "validation batches for each eval loss", 0, 1e6),
      key("eval_interval", TF_VALUE_INT, "0",
          "steps between eval losses on the held-out split (metrics' eval_loss); 0 = at the end "
          "only",
          0, 1e12),
      key("dist_timeout", TF_VALUE_FLOAT, "300",
          "seconds a rank waits for the others (joining, and in each collective) before the "
          "run stops with an error naming it",
          1, 1e6),
      key("deterministic", TF_VALUE_BOOL, "true",
          "on a CUDA device, LibTorch's deterministic algorithms (strict: an operator without "
          "one stops the run, named) and no cuBLAS workspace, so a rerun, a resume and an exact "
          "strategy give the same bits (as on a CPU), at a cost in speed (GPT-2 124M: 1.6x the "
          "step time on an H100); false = the faster kernels, whose sums vary in the last bits"),
      key("plugin_paths", TF_VALUE_STRING_LIST, "[]",
          "extra plugin files or folders (relative to the recipe)"),
      key("on_non_finite", TF_VALUE_STRING, "\"skip\"",
          "a non-finite loss or gradient: skip the update, roll back to the last checkpoint "
          "(and go on past the batches since), or stop",
          1, 0, "skip|rollback|stop"),
      key("debug_nan_at_steps", TF_VALUE_INT_LIST, "[]",
          "testing aid: make the loss NaN once at these steps (0-based)"),
      key("profile_ops", TF_VALUE_BOOL, "false",
          "record each step's time inside LibTorch operators (op_s), its wall time "
          "(step_s), the operators it dispatched (ops; ops_all with those they ran inside) "
          "and its reads of device values (host_reads) in metrics.jsonl; the rest of the "
          "time is outside LibTorch (about 1 us per op extra while on)"),
  };
  return keys;
}

const std::vector<KeySpec>& data_keys() {
  static const std::vector<KeySpec> keys = {
      key("corpus", TF_VALUE_STRING, "\"builtin:fortunes\"",
          "builtin:fortunes, a text file, a folder of text files, a .jsonl with \"text\", or "
          "JSONL instruction/chat rows (messages, prompt/completion, instruction/output), "
          "preference rows (chosen/rejected, for a preference schedule such as dpo), or prompt "
          "rows (a \"prompt\" alone, for a schedule that samples its completions: grpo)"),
      key("tokenizer", TF_VALUE_STRING, "\"auto\"",
          "byte (256 ids), or a model folder or tokenizer.json; auto = the [model].weights "
          "folder's tokenizer (tokenizer.json, vocab.json + merges.txt or tokenizer.model), "
          "refused when it has none"),
      key("seq_len", TF_VALUE_INT, "128", "tokens per sequence", 1, 1e7),
      key("batch_size", TF_VALUE_INT, "16",
          "sequences per batch (pairs of preference rows; prompts, each sampled num_generations "
          "times, for grpo)",
          1, 1e6),
      key("val_fraction", TF_VALUE_FLOAT, "0.05",
          "held out for eval: the corpus's tail, or that share of the examples", 0, 0.5),
      key("train_on", TF_VALUE_STRING, "\"completion\"",
          "instruction and chat rows: the loss on the answers only (completion) or on every "
          "token (all)",
          1, 0, "completion|all"),
      key("packing", TF_VALUE_BOOL, "false",
          "instruction and chat rows: several examples to a row, each attending only to "
          "itself (false: one example per row, padded)"),
      key("chat_template", TF_VALUE_STRING, "\"\"",
          "a .jinja chat template to use instead of the tokenizer_config.json's"),
      key("max_prompt_length", TF_VALUE_INT, "512",
          "preference rows: the prompt's last tokens kept (TRL's max_prompt_length); prompt rows "
          "(grpo): cut on the tokenizer's truncation_side, as TRL's GRPOTrainer; 0 = all",
          0, 1e7),
      key("max_completion_length", TF_VALUE_INT, "0",
          "preference rows: each completion's first tokens kept (TRL's max_completion_length); "
          "0 = all",
          0, 1e7),
      key("max_length", TF_VALUE_INT, "0",
          "preference rows: prompt + completion tokens kept (TRL's max_length); 0 = seq_len + 1, "
          "a row's inputs and its last target",
          0, 1e7),
      key("truncation_mode", TF_VALUE_STRING, "\"keep_end\"",
          "preference rows longer than max_length: keep their end (keep_end, TRL's default) or "
          "their start (keep_start)",
          1, 0, "keep_end|keep_start"),
  };
  return keys;
}

const std::vector<KeySpec>& optimizer_keys() {
  static const std::vector<KeySpec> keys = {
      key("name", TF_VALUE_STRING, "\"adamw\"", "optimizer", 1, 0, "adamw|sgd"),
      key("lr", TF_VALUE_FLOAT, "3e-4", "peak learning rate", 0, 1e3),
      key("weight_decay", TF_VALUE_FLOAT, "0.1", "decoupled weight decay on >=2-D weights", 0, 10),
      key("beta1", TF_VALUE_FLOAT, "0.9", "AdamW beta1", 0, 1),
      key("beta2", TF_VALUE_FLOAT, "0.95", "AdamW beta2", 0, 1),
      key("eps", TF_VALUE_FLOAT, "1e-8", "AdamW epsilon", 0, 1),
      key("momentum", TF_VALUE_FLOAT, "0.0", "SGD momentum", 0, 1),
      key("grad_clip", TF_VALUE_FLOAT, "1.0", "clip the global gradient norm; 0 = off", 0, 1e9),
      key("fused", TF_VALUE_BOOL, "false",
          "AdamW in LibTorch's fused kernel (torch.optim.AdamW(fused=True): one pass over a "
          "parameter, its gradient and moments); rounds a few last bits otherwise than the "
          "default multi-tensor update"),
  };
  return keys;
}

const std::vector<KeySpec>& save_keys() {
  static const std::vector<KeySpec> keys = {
      key("every", TF_VALUE_INT, "0", "save a checkpoint every N steps; 0 = only at the end", 0,
          1e12),
      key("keep_last", TF_VALUE_INT, "2", "checkpoints kept (older ones are rotated out)", 1, 1e6),
      key("final", TF_VALUE_BOOL, "true", "save when the run ends"),
      key("dir", TF_VALUE_STRING, "\"\"", "checkpoint folder; empty = <run folder>/checkpoints"),
      key("hf", TF_VALUE_BOOL, "false",
          "also write <run folder>/hf, a Hugging Face model folder, at the end"),
      key("adapter", TF_VALUE_BOOL, "false",
          "also write <run folder>/adapter, the adapters on their own (PEFT format), at the end"),
  };
  return keys;
}

const std::vector<std::string>& kernel_top_level_tables() {
  static const std::vector<std::string> tables = {"run",      "model",    "data", "optimizer",
                                                  "strategy", "schedule", "save", "reward"};
  return tables;
}

}  // namespace tightfit
