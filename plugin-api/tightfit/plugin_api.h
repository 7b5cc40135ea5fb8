/*
 * tightfit plugin ABI, version 1.26 (1.0 plus the fields marked "Added in 1.1"
 * through "Added in 1.26"). What each version added, and what ABI 2.0 would
 * drop or reshape: plugin-api/README.md, "Versions".
 *
 * This header is the whole contract between the tightfit host (the kernel) and
 * a plugin shared library. It is plain C: no C++ type and no exception ever
 * crosses it. It grows the way SQLite's extension routine table and Vulkan's
 * versioned structs grow:
 *
 *  - Every struct that crosses the boundary starts with `struct_size` (the
 *    sizeof the struct as the *writer* compiled it) and, for the top-level
 *    tables, `abi_version`. A reader checks `struct_size` before it reads a
 *    field, and treats a field that lies past `struct_size` as absent (zero,
 *    NULL). Fields are only ever appended; reserved slots are left zero.
 *  - Major version changes break; minor versions only append. The host loads a
 *    plugin when plugin.major == host.major and plugin.minor <= host.minor.
 *  - A function returns a tf_status. On failure the plugin reports the reason
 *    through the host's `set_error` callback before returning; the host reports
 *    the reason of its own failures through `last_error`.
 *
 * Tensors cross as handles of LibTorch's own stable C interface
 * (AtenTensorHandle, from torch/csrc/inductor/aoti_torch/c/shim.h). Ownership is
 * stated per function:
 *  - "borrowed": valid for the duration of the call; do not release it.
 *  - "new": the receiver owns it and must release it exactly once, with the
 *    host's `tensor_release` (or aoti_torch_delete_tensor_object; same thing).
 * Host and plugins share one LibTorch in one process, so autograd flows through
 * plugin code: a tensor a plugin computes from handles the host gave it carries
 * its autograd history back to the host.
 *
 * Threading: unless a function says otherwise the host calls a plugin from one
 * thread at a time, and a plugin calls host services only from inside a call
 * the host made to it. Threads a plugin started may call only
 * `tensor_release`, `log` and `memory_push_category`/`memory_pop_category`;
 * any other service called from them returns TF_ERR_UNSUPPORTED.
 *
 * Lifetime: the host never unloads a plugin library, so deleters, autograd
 * nodes and tensors a plugin created stay valid for the life of the process.
 */
#ifndef TIGHTFIT_PLUGIN_API_H
#define TIGHTFIT_PLUGIN_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------- */
/* Versions                                                                   */
/* ------------------------------------------------------------------------- */

#define TF_ABI_VERSION_MAJOR 1
#define TF_ABI_VERSION_MINOR 30
/* A version is packed as (major << 16) | minor. */
#define TF_MAKE_VERSION(major, minor) ((((uint32_t)(major)) << 16) | ((uint32_t)(minor)))
#define TF_VERSION_MAJOR(v) ((uint32_t)(v) >> 16)
#define TF_VERSION_MINOR(v) ((uint32_t)(v)&0xffffu)
#define TF_ABI_VERSION TF_MAKE_VERSION(TF_ABI_VERSION_MAJOR, TF_ABI_VERSION_MINOR)

/* Whether a size-prefixed table `ptr` (of struct type `type`) is long enough
 * to hold `member` and sets it: members added in later minor versions must be
 * checked this way before use, e.g. TF_HAS(api, tf_host_api, micro_batch). */
#define TF_HAS(ptr, type, member) \
  ((ptr)->struct_size >= offsetof(type, member) + sizeof((ptr)->member) && (ptr)->member != NULL)

/* The one symbol every plugin library exports (see tf_plugin_entry_fn). */
#define TF_PLUGIN_ENTRY_SYMBOL "tightfit_plugin_entry"

/* Symbol visibility for the entry function. */
#if defined(_WIN32)
#define TF_PLUGIN_EXPORT __declspec(dllexport)
#else
#define TF_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------- */
/* Basic types                                                                */
/* ------------------------------------------------------------------------- */

/* LibTorch's stable-ABI tensor handle; identical to the declaration in
 * torch/csrc/inductor/aoti_torch/c/macros.h, repeated so this header needs no
 * LibTorch include path. */
struct AtenTensorOpaque;
typedef struct AtenTensorOpaque* AtenTensorHandle;
typedef AtenTensorHandle tf_tensor;

/* Opaque host context. The host gives each plugin instance its own context;
 * pass it back on every service call. */
typedef struct tf_host_context tf_host_context;

typedef enum tf_status {
  TF_OK = 0,
  /* A hook declines: "not mine, let the next strategy or the kernel do it". */
  TF_NOT_HANDLED = 1,
  TF_ERROR = -1,                /* generic failure; message via set_error */
  TF_ERR_INVALID_ARGUMENT = -2, /* bad argument or configuration value */
  TF_ERR_NOT_FOUND = -3,        /* no such key, parameter, stage */
  TF_ERR_OUT_OF_MEMORY = -4,    /* device or memory_budget exhausted */
  TF_ERR_UNSUPPORTED = -5,      /* valid request this plugin/host cannot serve */
  TF_ERR_ABI = -6,              /* version or struct-size mismatch */
  TF_ERR_NON_FINITE = -7, /* NaN/Inf in a loss or gradient */
  TF_STATUS_MAX_ENUM = 0x7FFFFFFF /* holds the enum at 32 bits; never a value */
} tf_status;

typedef enum tf_plugin_kind {
  TF_PLUGIN_MODEL = 1,
  TF_PLUGIN_STRATEGY = 2,
  TF_PLUGIN_SCHEDULE = 3,
  TF_PLUGIN_REWARD = 4, /* added in 1.25: scores completions (tf_reward_vtable) */
  TF_PLUGIN_KIND_MAX_ENUM = 0x7FFFFFFF /* holds the enum at 32 bits; never a value */
} tf_plugin_kind;

typedef enum tf_log_level {
  TF_LOG_DEBUG = 0,
  TF_LOG_INFO = 1,
  TF_LOG_WARN = 2,
  TF_LOG_ERROR = 3,
  TF_LOG_LEVEL_MAX_ENUM = 0x7FFFFFFF /* holds the enum at 32 bits; never a value */
} tf_log_level;

/* Element types, numbered as LibTorch's c10::ScalarType for the ones it has. */
typedef enum tf_dtype {
  TF_DTYPE_U8 = 0,
  TF_DTYPE_I8 = 1,
  TF_DTYPE_I32 = 3,
  TF_DTYPE_I64 = 4,
  TF_DTYPE_F16 = 5,
  TF_DTYPE_F32 = 6,
  TF_DTYPE_BF16 = 15,
  TF_DTYPE_MAX_ENUM = 0x7FFFFFFF /* holds the enum at 32 bits; never a value */
} tf_dtype;

/* Memory categories: every byte the kernel counts belongs to one. */
typedef enum tf_mem_category {
  TF_MEM_WEIGHTS = 0,       /* parameters (any format) */
  TF_MEM_GRADS = 1,         /* parameter gradients */
  TF_MEM_OPTIMIZER = 2,     /* optimizer state */
  TF_MEM_ACTIVATIONS = 3,   /* tensors saved or produced in forward/recompute */
  TF_MEM_ADAPTERS = 4,      /* adapter parameters (LoRA) and their state */
  TF_MEM_TRANSIENT = 5,     /* workspace: backward temporaries, dequantized copies */
  TF_MEM_OTHER = 6,         /* data batches, anything unattributed */
  TF_MEM_CATEGORY_COUNT = 8, /* array size; slot 7 is reserved */
  TF_MEM_CATEGORY_MAX_ENUM = 0x7FFFFFFF /* holds the enum at 32 bits; never a value */
} tf_mem_category;

/* Where bytes live. */
typedef enum tf_residency {
  TF_TIER_DEVICE = 0, /* the compute device (the run's `device`) */
  TF_TIER_HOST = 1,   /* host RAM (pinned on CUDA) */
  TF_TIER_DISK = 2,   /* files under the run folder, memory-mapped */
  /* Split across ranks, each holding a part (ZeRO-3); the strategy that
   * split it gathers it for its stage's events and checkpoints the parts
   * (the kernel saves a placeholder). Added in 1.0's reserved slot. */
  TF_TIER_SHARDED = 3,
  TF_TIER_COUNT = 4, /* array size */
  TF_RESIDENCY_MAX_ENUM = 0x7FFFFFFF /* holds the enum at 32 bits; never a value */
} tf_residency;

/* How a parameter is stored. The dense formats are what `weight` returns;
 * the compact ones are turned dense by the strategy that set them (fetch_weight). */
typedef enum tf_param_format {
  TF_FORMAT_DENSE = 0,   /* in the parameter's dtype */
  TF_FORMAT_INT8 = 1,    /* per-channel absmax int8 */
  TF_FORMAT_NF4 = 2,     /* block-wise NormalFloat4 with double-quantized scales */
  TF_FORMAT_GGML = 3,    /* a GGUF file's own blocks (one of ggml's types). Added in 1.9 */
  TF_FORMAT_CUSTOM = 100, /* owned by a strategy plugin; opaque to the kernel */
  TF_PARAM_FORMAT_MAX_ENUM = 0x7FFFFFFF /* holds the enum at 32 bits; never a value */
} tf_param_format;

/* ------------------------------------------------------------------------- */
/* Recipe keys a plugin declares                                              */
/* ------------------------------------------------------------------------- */

typedef enum tf_value_type {
  TF_VALUE_BOOL = 1,
  TF_VALUE_INT = 2,
  TF_VALUE_FLOAT = 3, /* accepts integers too */
  TF_VALUE_STRING = 4,
  TF_VALUE_STRING_LIST = 5,
  TF_VALUE_INT_LIST = 6,
  TF_VALUE_SIZE = 7, /* a byte size: integer or string such as "8GiB", "512MB" */
  /* Added in 1.2: a file or folder, as a string; the host hands a relative
   * path back found beside the recipe when it is not found from the working
   * directory (as [model] weights). */
  TF_VALUE_PATH = 8,
  TF_VALUE_TYPE_MAX_ENUM = 0x7FFFFFFF /* holds the enum at 32 bits; never a value */
} tf_value_type;

/* What `tightfit fit` may search (added in 1.23). fit plans stacks of the
 * installed plugins under a memory budget; a plugin that declares a
 * tf_plugin_search is one it may add to a recipe or leave out, and a key with
 * a tf_key_search is one whose values it tries. Strings are the host's to
 * read while the library is loaded; labels may hold "{}", the value as the
 * recipe writes it without quotes ("checkpoint {}" -> "checkpoint 2"). */

/* One value fit tries for a key. */
typedef struct tf_search_value {
  uint32_t struct_size;
  const char* value;         /* TOML literal, as default_value: "2", "\"nf4\"", "true" */
  const char* label;         /* how fit names it in a stack ("nf4 base"); NULL: "key = value" */
  const char* approximation; /* what it changes in the maths ("nf4 weights"); NULL: exact */
  double quality_penalty;    /* how far that is from the plain maths, for --objective quality:
                                0 exact; nf4 weights 1, bf16 weights 1, 8-bit state 0.3 */
  uint32_t flags;            /* TF_SEARCH_VALUE_* */
  const char* claims;        /* a resource it takes over ("optimizer state"); NULL: none.
                                Two settings claiming the same one are never stacked */
  const char* needs;         /* a plugin that must be in the stack for it to do anything
                                ("checkpoint"); NULL: none */
} tf_search_value;

/* Does nothing by itself: a stack in which fit adds the plugin with every
 * searched key at an OFF value is the stack without it, and is skipped. */
#define TF_SEARCH_VALUE_OFF 0x1u
/* Tried only when the recipe's device is CUDA (a host tier on a CPU run is
 * the same memory). */
#define TF_SEARCH_VALUE_CUDA_ONLY 0x2u
/* Not always a saving: it may take more memory than the key's values before
 * it, or than the plugin left out (bf16 compute casts the weights), so a
 * stack with it that does not fit rules out nothing that has another value. */
#define TF_SEARCH_VALUE_MAY_COST 0x4u

/* How fit searches one key. */
typedef struct tf_key_search {
  uint32_t struct_size;
  uint32_t flags; /* TF_SEARCH_KEY_* */
  /* From the least to the most memory-saving; stride: each one's struct_size. */
  const tf_search_value* values;
  uint32_t n_values;
  /* Another key of the plugin: this one is searched only while that one is
   * at a value that is not OFF (offload's prefetch with its params tier); with
   * TF_SEARCH_KEY_FOLLOWS, the key this one keeps its default ratio to. */
  const char* with;
} tf_key_search;

/* The recipe's value is the user's choice of what to train (LoRA's rank, the
 * format of a quantized base): a recipe with the plugin keeps it, and fit
 * searches it only with `--change <plugin>`. */
#define TF_SEARCH_KEY_RECIPES_CHOICE 0x1u
/* `--lora-ranks` gives this key's values (an adapter's rank). */
#define TF_SEARCH_KEY_RANK 0x2u
/* A value n splits [data] batch_size into n micro-batches: tried when n
 * divides it, and fit writes batch_size / n (the same effective batch). */
#define TF_SEARCH_KEY_SPLITS_BATCH 0x4u
/* Not searched: unless the recipe sets it, fit writes the key's default times
 * the ratio of the `with` key's value to that key's default (LoRA's alpha
 * follows its rank, so alpha / rank stays). */
#define TF_SEARCH_KEY_FOLLOWS 0x8u

/* How fit treats the plugin as a whole. */
typedef struct tf_plugin_search {
  uint32_t struct_size;
  uint32_t flags;            /* TF_SEARCH_PLUGIN_* */
  const char* label;         /* how fit names it in a stack when no value's label does */
  const char* approximation; /* what adding it changes in the maths; NULL: exact */
  double quality_penalty;    /* as tf_search_value's, for adding it */
  const char* claims;        /* as tf_search_value's */
  /* A schedule: the schedule it may replace in a recipe ("standard"), taking
   * that schedule's keys; fit searches it only in recipes with that one. */
  const char* stands_in_for;
  /* Where fit writes it among the strategies of a stack, lower first (their
   * hooks run in recipe order): what trains 0, weight formats 10, optimizer
   * state 20, precision 30, recomputation 40, tiers 50, the update 60, ranks
   * 70. Equal ones are written by name. */
  int32_t stack_order;
} tf_plugin_search;

/* Trains adapters instead of the weights (LoRA): fit adds it only to a
 * recipe that has it, when the user gives --lora-ranks, or when no stack that
 * trains all weights fits; it is never taken out of a recipe that has it. */
#define TF_SEARCH_PLUGIN_TRAINS_ADAPTERS 0x1u
/* Works on frozen weights only (quantize): tried only in stacks that train
 * adapters. */
#define TF_SEARCH_PLUGIN_FROZEN_WEIGHTS 0x2u
/* Searched only with ranks (world size > 1), and then always in: its OFF
 * values are what ranks run without a memory strategy (shard's data
 * parallel). */
#define TF_SEARCH_PLUGIN_RANKS 0x4u

/* One key of the plugin's recipe table. The kernel validates the recipe
 * against these before the plugin sees it: unknown key, wrong type, missing
 * required key and out-of-range value are errors at file:line:column.
 * The host walks the plugin's array with each element's `struct_size` as stride. */
typedef struct tf_config_key {
  uint32_t struct_size;
  const char* name; /* key in the plugin's table */
  tf_value_type type;
  const char* default_value; /* TOML literal ("2", "\"cosine\"", "true"); NULL = required */
  const char* doc;           /* one line for `tightfit plugins info` */
  double min_value;          /* numeric range, inclusive; ignored when min > max */
  double max_value;
  const char* choices; /* for strings: allowed values separated by '|', or NULL */
  /* Added in 1.23: how `tightfit fit` searches the key; NULL: it does not
   * (the recipe's value or the default stays). */
  const tf_key_search* search;
} tf_config_key;

/* ------------------------------------------------------------------------- */
/* Model declarations                                                         */
/* ------------------------------------------------------------------------- */

typedef enum tf_stage_kind {
  TF_STAGE_EMBED = 1, /* tokens (int64 [B,T]) -> hidden */
  TF_STAGE_BLOCK = 2, /* hidden -> hidden; residual, so it may be skipped */
  TF_STAGE_HEAD = 3, /* hidden -> logits [B,T,vocab] */
  TF_STAGE_KIND_MAX_ENUM = 0x7FFFFFFF /* holds the enum at 32 bits; never a value */
} tf_stage_kind;

typedef enum tf_init_kind {
  TF_INIT_NORMAL = 1, /* N(0, init_std^2) */
  TF_INIT_ZEROS = 2,
  TF_INIT_ONES = 3,
  TF_INIT_UNIFORM = 4, /* U(-init_std, init_std) */
  TF_INIT_CONSTANT = 5, /* every element = init_std */
  TF_INIT_KIND_MAX_ENUM = 0x7FFFFFFF /* holds the enum at 32 bits; never a value */
} tf_init_kind;

/* Parameter flags. */
#define TF_PARAM_NO_WEIGHT_DECAY 0x1u /* exclude from AdamW decay (norms, biases) */
#define TF_PARAM_FROZEN 0x2u          /* not trainable */
/* The Hugging Face checkpoint stores this 2-D weight transposed ([in, out], as
 * GPT-2's Conv1D does); tightfit keeps [out, in] and transposes on import/export. */
#define TF_PARAM_HF_TRANSPOSED 0x4u
#define TF_PARAM_ADAPTER 0x8u /* an adapter added by a strategy (counted as ADAPTERS) */
/* Added in 1.15: one expert's weight in a mixture of experts. A batch uses
 * only the experts its tokens are routed to, so a strategy that keeps
 * weights in another tier may leave this one there until it is fetched
 * (want_weight) instead of bringing it in with its stage. */
#define TF_PARAM_EXPERT 0x10u
/* Added in 1.19: a frozen copy of another parameter (declare_param_copies),
 * read only by the passes that read copies (use_param_copies: a reference
 * model's). A strategy that keeps weights in another tier may leave it there
 * until it is fetched (want_weight), as an expert, instead of bringing it in
 * with its stage for every pass. */
#define TF_PARAM_COPY 0x20u

/* A parameter the model (or an adapter strategy) declares. The kernel's
 * parameter store owns it; model code asks the store for it by name. */
typedef struct tf_param_spec {
  uint32_t struct_size;
  const char* name; /* Hugging Face state-dict name, e.g. "transformer.h.0.attn.c_attn.weight" */
  int32_t ndim;
  const int64_t* shape; /* ndim entries; tightfit layout ([out, in] for linear weights) */
  tf_dtype dtype;       /* storage dtype before any strategy changes it */
  int32_t stage;        /* index of the stage that uses it; -1 = several (e.g. tied embeddings) */
  tf_init_kind init;
  double init_std;
  uint32_t flags;      /* TF_PARAM_* */
  const char* tied_to; /* NULL, or the name of a parameter this one shares storage with */
  /* Added in 1.17: the share of a pass's tokens expected to use it, in
   * [0, 1]: a routed expert's top_k / n_experts (each token is routed to
   * top_k of n_experts); 0 = every token (not routed, or unknown). `plan`
   * counts what a strategy keeps per token for that share of the batch and,
   * for a TF_PARAM_EXPERT weight left in another tier, how often a pass
   * reads it. */
  double routed_share;
} tf_param_spec;

/* A stage the model declares, in execution order. */
typedef struct tf_stage_spec {
  uint32_t struct_size;
  const char* name; /* "embed", "block.3", "head" */
  tf_stage_kind kind;
  /* Bytes of activations autograd keeps for this stage per token in training
   * (the model's own formula, for `plan`); 0 = unknown. */
  int64_t activation_bytes_per_token;
  /* Forward FLOPs per token (for cost models); 0 = unknown. */
  int64_t flops_per_token;
  /* Added in 1.0's tail (0 = unknown; plan then assumes the values above):
   * the bytes per token the stage keeps when none of its own weights needs a
   * gradient (frozen, or only LoRA adapters train: a linear with a frozen
   * weight keeps no input for the weight's gradient), and the bytes per token
   * of its output (what a recomputed next stage keeps as its input). */
  int64_t frozen_activation_bytes_per_token;
  int64_t output_bytes_per_token;
  /* Added in 1.1 (0 = unknown: plan assumes the gradients of the
   * output and of the input): the bytes per token of gradients alive at once
   * at the peak of the stage's backward, less the kept activations backward
   * has already let go by then — with the stage's own weights trained, and
   * frozen (a frozen linear frees no saved input as its backward runs). */
  int64_t backward_bytes_per_token;
  int64_t frozen_backward_bytes_per_token;
  /* Added in 1.5, for a TF_STAGE_HEAD stage (NULL and 0 elsewhere): the
   * stage's output is exactly host->linear(hidden, projection_weight,
   * projection_bias) of a hidden state it computes, with nothing after it.
   * The host may then call the stage with tf_stage_call.hidden_only = 1 and
   * run the projection together with the loss itself, a chunk of tokens at a
   * time, so the whole [tokens x vocabulary] logits never exist ([run]
   * fused_loss). projection_bytes_per_token: the part of the activation
   * bytes above (trained and frozen alike) that the logits account for,
   * which the host then does not keep. The names are copied. */
  const char* projection_weight;
  const char* projection_bias; /* NULL: no bias */
  int64_t projection_bytes_per_token;
  /* Added in 1.14, with projection_weight: the head's output is
   * c * tanh(linear(hidden, projection_weight, projection_bias) / c) with
   * c = projection_softcap (Gemma 2's final_logit_softcapping), which the
   * host's fused loss then applies to each chunk, and its derivative in
   * backward; 0 = no cap. A finite value >= 0. */
  double projection_softcap;
  /* Added in 1.26, for `plan` (0 = none, or unknown): what the model's
   * decode cache (tf_model_vtable.decode) keeps for this stage, per row: bytes
   * per token it has seen (an attention block's keys and values), and bytes
   * however many it has seen (a recurrent block's state). */
  int64_t decode_cache_bytes_per_token;
  int64_t decode_state_bytes;
  /* Added in 1.30, for cost models (0 = none, or unknown): the part of
   * flops_per_token the stage computes through host->tiled_over_tokens (its
   * feed-forward, TF_MODEL_FEATURE_TILED_MLP). Under [run] mlp_tile_tokens a
   * training pass wider than the tile computes it once more in backward.
   * At most flops_per_token. */
  int64_t tiled_flops_per_token;
} tf_stage_spec;

/* What a stage forward call is asked to do. */
typedef struct tf_stage_call {
  uint32_t struct_size;
  int32_t stage;     /* index into the declared stages */
  int32_t training;  /* 1: training (dropout on); 0: evaluation / generation */
  int32_t recompute; /* 1: this is a recompute in backward (results must match forward) */
  int64_t step;      /* current optimizer step */
  /* Added in 1.3 (read it when struct_size covers it): the position of each
   * token, int64 [B, T] on the stage's device, borrowed; NULL = 0..T-1 in
   * every row. Set when rows are packed with several examples: a position
   * that is not the one before plus 1 starts a new example, and attention
   * must not cross from one example to another (as transformers reads
   * position_ids). Only models that declare TF_MODEL_FEATURE_POSITIONS get
   * it; the same tensor comes with every stage of a pass, recompute included. */
  tf_tensor positions;
  /* Added in 1.5: 1 asks a head that declared projection_weight for its
   * hidden state, the projection's input, instead of its logits (read it
   * when struct_size covers it; absent = 0). Comes only in training and
   * evaluation passes whose loss the host computes; recompute repeats it. */
  int32_t hidden_only;
  /* Added in 1.16: the pass's tf_batch.attention_mask (int64 [B, T] on the
   * stage's device, borrowed; NULL: every token is an example's), with
   * every stage of the pass, recompute included. A model whose loss term
   * averages over tokens (a mixture of experts' load-balancing loss) counts
   * only the tokens marked 1, as transformers does with attention_mask. */
  tf_tensor attention_mask;
} tf_stage_call;

/* ------------------------------------------------------------------------- */
/* Information the host gives                                                 */
/* ------------------------------------------------------------------------- */

typedef struct tf_run_info {
  uint32_t struct_size;
  const char* device; /* "cpu", "cuda:0" */
  int32_t rank;       /* torch.distributed rank, 0 when single process */
  int32_t world_size;
  int32_t local_rank;
  int64_t vocab_size; /* the tokenizer's vocabulary */
  int64_t seq_len;
  int64_t batch_size; /* rows a batch holds (2 per preference pair) */
  int64_t total_steps;
  uint64_t seed;
  const char* run_dir; /* folder for this run's metrics, checkpoints, disk tier */
  /* Added in 1.0's tail (read it when struct_size covers it): 1 when the run
   * is only planned (`plan`, `fit`, `run --dry-run`): nothing is allocated
   * and `device` may not exist on this machine (a GPU recipe planned on a
   * laptop), so create/configure must not touch it. */
  int32_t dry_run;
  /* Added in 1.8 (read it when struct_size covers it): the Hugging Face
   * model folder the weights come from ([model] weights, absolute; the
   * folder of a weights file), "" when the model starts from the recipe's
   * init. A PEFT adapter names it as base_model_name_or_path. */
  const char* model_source;
  /* Added in 1.29 (read it when struct_size covers it): [run]
   * mlp_tile_tokens, > 0 only for a model that declares
   * TF_MODEL_FEATURE_TILED_MLP: tiled_over_tokens computes its feed-forward
   * that many tokens at a time in training, and the model declares its
   * stages' activation bytes for that tile (its intermediate one tile wide,
   * not the whole batch's). 0: the whole batch at once. */
  int64_t mlp_tile_tokens;
} tf_run_info;

/* A matrix as its weights file stores it, in one of ggml's block types
 * (param_source_blocks). Added in 1.9. */
typedef struct tf_source_blocks {
  uint32_t struct_size;
  char type[16];     /* ggml's type name: "Q4_1", "Q8_0", "Q4_K", "F16", ... */
  int64_t rows;      /* the parameter's [rows, cols] */
  int64_t cols;
  int64_t row_bytes; /* one row's blocks (a block never spans two rows) */
  tf_tensor bytes;   /* new: uint8 [rows, row_bytes] on CPU; NULL unless asked for */
} tf_source_blocks;

/* A parameter as `plan` expects it to be stored (plan_param_get/set). */
typedef struct tf_param_plan {
  uint32_t struct_size;
  int64_t bytes; /* stored bytes in its planned format */
  tf_param_format format;
  tf_residency tier;
} tf_param_plan;

typedef struct tf_param_info {
  uint32_t struct_size;
  const char* name;
  int32_t ndim;
  int64_t shape[8];
  tf_dtype dtype;
  int32_t stage;
  uint32_t flags;
  int32_t trainable;
  tf_param_format format;
  tf_residency residency;
  int64_t numel;
  int64_t stored_bytes; /* bytes in its current format */
  /* Added in 1.17: tf_param_spec.routed_share as declared (an adapter
   * strategy declares its adapters of a routed weight with the same share). */
  double routed_share;
} tf_param_info;

typedef struct tf_stage_info {
  uint32_t struct_size;
  const char* name;
  tf_stage_kind kind;
  int32_t recompute; /* activation checkpointing on */
  int32_t skip;      /* block skipped (identity) */
  int32_t trainable; /* gradients wanted for its parameters */
  const char* device;
  int64_t activation_bytes_per_token;
  int64_t flops_per_token;
  int32_t n_params;
} tf_stage_info;

typedef struct tf_memory_stats {
  uint32_t struct_size;
  int64_t current[TF_MEM_CATEGORY_COUNT];
  int64_t peak[TF_MEM_CATEGORY_COUNT];
  int64_t total_current;
  int64_t total_peak;
  int64_t budget; /* 0 = none */
} tf_memory_stats;

/* A training batch. Both handles are new: release with batch_release. */
typedef struct tf_batch {
  uint32_t struct_size;
  tf_tensor tokens;  /* int64 [B, T] */
  tf_tensor targets; /* int64 [B, T] */
  int64_t n_tokens;
  /* Added in 1.3: int64 [B, T] positions when rows are packed (see
   * tf_stage_call.positions), else NULL; new like the others. A schedule hands
   * the batch on unchanged; the host refuses to give a packed batch to a
   * caller whose tf_batch is too short to carry them. */
  tf_tensor positions;
  /* Added in 1.7 (written when the caller's struct_size covers it): the
   * targets that count in the loss, those not ignore_index (-100: prompts,
   * padding, boundaries of packed examples); 0 when none do. A pass's loss
   * is the mean over these, so a schedule that accumulates weighs each
   * micro-batch by its share of the step's. */
  int64_t n_targets;
  /* Added in 1.10: preference pairs ([data] chosen/rejected rows). When
   * non-zero, rows [0, pairs) are the chosen answers and rows [pairs,
   * 2 pairs) the rejected ones to the same prompts, in the same order, with
   * targets on the answers only. forward and forward_backward refuse such a
   * batch (their mean loss would train on the rejected answers too); a
   * preference schedule scores it with sequence_logps. The host refuses to
   * give pairs to a caller whose tf_batch is too short to carry this. */
  int64_t pairs;
  /* Added in 1.13: unpaired preference rows (KTO: [data] rows with
   * "prompt", "completion" and a bool "label", or pairs unpaired as TRL's
   * KTOTrainer unpairs them), given only to a schedule whose
   * preference_tokenization is "kto". When set (int64 [pairs], new like the
   * others), rows [0, pairs) are completions, desirable[r] 1 where row r's
   * is desirable and 0 where not, and rows [pairs, 2 pairs) are the KL
   * rows: row r's prompt with the completion of the row before it in its
   * chunk of batch_size rows (TRL's KL dataset), their answers targeted.
   * NULL for pairs. */
  tf_tensor desirable;
  /* Added in 1.13: for preference batches, int64 [pairs] (new like the
   * others): each pair's (or unpaired row's) index among the run's
   * preference rows — the training rows 0..n-1 as they are stored, then the
   * held-out ones — so that a schedule can keep values per row (TRL's
   * precompute_ref_log_probs); NULL otherwise. */
  tf_tensor row_ids;
  /* Added in 1.16: int64 [B, T] (new like the others), 1 where the token is
   * an example's and 0 where it only pads its row (transformers'
   * attention_mask); NULL when no token pads. Padding comes only after a
   * row's examples, so no example's token attends to it; a model reads the
   * mask where a term counts tokens (tf_stage_call.attention_mask). A
   * schedule hands it on with the batch; the host reads it when the
   * caller's struct_size covers it. */
  tf_tensor attention_mask;
  /* Added in 1.21: for preference batches, int64 [B] (new like the others),
   * 1 where the row's first token is its answer's: no prompt token precedes
   * it (truncation_mode = "keep_end" cut the prompt away, or the prompt is
   * empty), 0 where a prompt token comes first; NULL for other batches.
   * Nothing scores a row's first token, so the targets cannot say it; TRL's
   * DPOTrainer counts one more position in such a row (its rolled loss
   * mask wraps the first token's flag onto the batch's last column), which
   * a schedule matching it reads here. The host writes it when the
   * caller's struct_size covers it. */
  tf_tensor answer_first;
  /* Added in 1.25: non-zero in a batch of prompts, given only to a schedule
   * with TF_SCHEDULE_FEATURE_PROMPTS ([data] rows with a "prompt" and no
   * answer: online RL completes them itself). Its `prompts` rows each hold
   * one prompt's ids as TRL's GRPOTrainer tokenizes it (the chat template
   * with the generation prompt for messages, no special tokens added; cut
   * to [data] max_prompt_length), padded after (attention_mask 0); every
   * target is ignore_index; row_ids says each row's index among the run's
   * prompt rows, as score_rewards reads it. Loss passes refuse it. */
  int64_t prompts;
} tf_batch;

/* Result of one forward (and backward) the host ran for a schedule. */
typedef struct tf_pass_result {
  uint32_t struct_size;
  double loss; /* mean cross-entropy of the batch */
  int64_t n_tokens;
  int32_t finite; /* 0 when loss or a gradient is NaN/Inf */
  /* Added in 1.20, written by run_pass (the older services write them 0 and
   * NULL). A log-probs pass: `logps`, fp32 on the CPU, [B]
   * (TF_PASS_SEQUENCE_LOGPS) or [B, T] (TF_PASS_TOKEN_LOGPS, 0 where the
   * target is ignore_index), and for a sequence pass `counts`, int64 [B],
   * the targets each row scored; `mean_logits` (fp32 [B, T] on the CPU) when
   * the pass asked for it. Each new, or NULL when not computed. */
  tf_tensor logps;
  tf_tensor counts;
  tf_tensor mean_logits;
  /* The sum of the model's own loss terms, when the pass took them. */
  double loss_terms;
  /* 1 while a deferred read (tf_pass.defer_read) has not written `loss`
   * and `finite` yet; the host sets it to 0 when it writes them. */
  int32_t read_pending;
  /* Added in 1.25: fp32 [B, T] on the CPU (new), each position's entropy
   * when the pass asked for them (tf_pass.entropies), 0 where the target is
   * ignore_index; NULL otherwise. */
  tf_tensor entropies;
} tf_pass_result;

/* What a pass computes (tf_pass.compute, ABI 1.20). */
typedef enum tf_pass_compute {
  /* The batch's mean cross-entropy (with the model's own loss terms), as
   * forward and forward_backward compute it. */
  TF_PASS_LOSS = 0,
  /* Each row's summed target log-probability, as sequence_logps. */
  TF_PASS_SEQUENCE_LOGPS = 1,
  /* Each target's log-probability, as token_logps. */
  TF_PASS_TOKEN_LOGPS = 2,
  TF_PASS_COMPUTE_MAX_ENUM = 0x7FFFFFFF
} tf_pass_compute;

/* One pass of the model as a value (added in 1.20, for run_pass): the rows,
 * what to compute, with which weights, and whether to back-propagate. It
 * holds for this pass only: nothing is armed for a later one, and the
 * adapters and weights' copies that the modal services (adapters_set_enabled,
 * use_param_copies) set are as they were when run_pass returns. A new
 * option is a field appended here; a host reads no field past struct_size
 * (zero: the default). */
typedef struct tf_pass {
  uint32_t struct_size;
  tf_pass_compute compute;
  const tf_batch* batch; /* borrowed; its struct_size is read as forward's */
  /* A log-probs pass: int64 [B, T] targets (borrowed) scored in place of the
   * batch's, each ignore_index or a token of the vocabulary (ORPO's NLL
   * scores the prompt too); NULL: the batch's. A loss pass: must be NULL. */
  tf_tensor targets;
  int32_t backward; /* 1: back-propagate into the parameters' gradients */
  /* TF_PASS_LOSS with backward: the loss's factor, as forward_backward's
   * loss_scale (1/micro_batches for accumulation); 0 reads as 1. */
  double loss_scale;
  /* Log-probs with backward: fp32 (borrowed), [B] for a sequence pass and
   * [B, T] for a token pass; the backward is that of sum grad_weights *
   * logps. Required with backward, refused without. */
  tf_tensor grad_weights;
  /* 1: the strategies' adapters (LoRA) off for this pass: the base model,
   * as PEFT's disable_adapter() (a reference model without a copy). */
  int32_t adapters_off;
  /* Non-empty: every weight the pass reads is its copy under this prefix
   * where declare_param_copies declared one (use_param_copies' meaning);
   * NULL or "": the parameters. */
  const char* param_copies;
  /* A log-probs pass: 1 takes the model's own loss terms (take_loss_terms'
   * meaning: their sum in result.loss_terms, back-propagated times
   * loss_terms_grad_weight with backward); 0 refuses them as such passes do. */
  int32_t take_loss_terms;
  double loss_terms_grad_weight;
  /* A log-probs pass: 1 also measures each position's logits averaged over
   * the vocabulary (result.mean_logits), as take_mean_logits. */
  int32_t mean_logits;
  /* TF_PASS_LOSS: 1 leaves the loss on the device and reads it with the
   * host's next read, optimizer_step's (which reads the gradients' norm
   * anyway), so that a step waits for the device once. run_pass then
   * returns with result.read_pending 1 and keeps the result pointer: the
   * caller's tf_pass_result must stay valid until that read writes `loss`
   * and `finite` and sets read_pending to 0. Only inside run_step: a
   * result still pending when run_step returns is never written, and the
   * step fails naming the schedule. Outside run_step (create, eval_batch)
   * the loss is read before run_pass returns. */
  int32_t defer_read;
  /* Added in 1.25. A log-probs pass: the logits are divided by this before
   * the log-softmax (TRL's GRPOTrainer scores at its sampling temperature);
   * 0 reads as 1. It must be finite and positive. */
  double temperature;
  /* Added in 1.25. A log-probs pass: 1 also measures the entropy of each
   * position's distribution (after `temperature`) in result.entropies,
   * computed a chunk at a time as the log-probs are (TRL's entropy). */
  int32_t entropies;
} tf_pass;

/* Added in 1.25: what generate samples. A prompt's `n` completions are
 * sampled together (one batched decode of n rows of the same prompt), each
 * token from the model's logits divided by `temperature`, cut to the `top_k`
 * likeliest and then to the smallest set whose probability reaches `top_p`
 * (transformers' TemperatureLogitsWarper, TopKLogitsWarper and
 * TopPLogitsWarper, in that order), with the policy's weights as they are
 * (the strategies' adapters on). */
typedef struct tf_generate_request {
  uint32_t struct_size;
  tf_tensor prompt;       /* int64 [P] (borrowed): the prompt's ids, P >= 1 */
  int32_t n;              /* completions to sample, >= 1 */
  int64_t max_new_tokens; /* each completion's most tokens, >= 1 */
  double temperature;     /* > 0; 0 = greedy (every row the same) */
  double top_p;           /* (0, 1]; 1 = off */
  int64_t top_k;          /* 0 = off */
  uint64_t seed;          /* the sampler's generator is seeded with it */
  /* A completion ends with the first of these it samples (kept as its last
   * token, as transformers' generate keeps the EOS); NULL and 0: the
   * tokenizer's EOS (TRL's generation_config.eos_token_id). */
  const int64_t* stop_ids;
  int32_t n_stop_ids;
  /* Added in 1.26, transformers' processors in generate's order: the
   * repetition penalty on every id of the row so far, prompt included (> 0;
   * 1 and 0 = off), before the temperature, top-k and top-p; then min-p, a
   * token kept when its probability is at least min_p times the likeliest's
   * ([0, 1]; 0 = off). */
  double repetition_penalty;
  double min_p;
  /* Added in 1.27: several prompts sampled together, `n` completions of
   * each, every row of every prompt in one batched decode (the shorter
   * prompts left-padded, where the model has decode_rows; else, prompts of
   * different lengths one after another). 0: one prompt, `prompt`. Else
   * `prompt` holds the prompts' ids one after another (int64 [sum of
   * lengths]), `prompt_lengths` (int64 [n_prompts], borrowed, each >= 1) says
   * where each ends, and prompt b's rows are drawn from a generator seeded
   * with prompt_seeds[b] (n_prompts seeds; NULL: seed + b), so a prompt's
   * completions do not depend on which others it is sampled beside. The
   * result's rows: prompt 0's n, then prompt 1's, ... */
  int32_t n_prompts;
  tf_tensor prompt_lengths;
  const uint64_t* prompt_seeds;
} tf_generate_request;

typedef struct tf_generate_result {
  uint32_t struct_size;
  /* int64 [n, C] (new), C the longest completion: each completion's ids,
   * its stop id included, then `pad` to C. */
  tf_tensor completions;
  tf_tensor lengths; /* int64 [n] (new): each completion's ids */
  int64_t pad;       /* the id after each completion's end in `completions` */
  /* The tokenizer's EOS and pad ids (-1 where it names none): a completion
   * that ends in neither was cut at max_new_tokens (TRL's is_truncated). */
  int64_t eos;
  int64_t pad_token;
} tf_generate_result;

/* Added in 1.25: completions score_rewards hands the recipe's rewards. Row i
 * completes the prompt row row_ids[i] of the batch of prompts it came from. */
typedef struct tf_reward_request {
  uint32_t struct_size;
  tf_tensor row_ids;     /* int64 [n] (borrowed): tf_batch.row_ids of its prompt */
  tf_tensor completions; /* int64 [n, C] (borrowed), as generate writes them */
  tf_tensor lengths;     /* int64 [n] (borrowed) */
} tf_reward_request;

typedef struct tf_reward_scores {
  uint32_t struct_size;
  int32_t count; /* R: the recipe's rewards ([[reward]] tables), in order */
  /* fp64 [n, R] (new): reward r's score of completion i, NaN where it gave
   * none for the row (TRL's None); the host has refused every other
   * non-finite value. */
  tf_tensor scores;
  tf_tensor weights; /* fp64 [R] (new): each reward's weight (TRL's reward_weights) */
  /* [R]: each reward's name for metrics (TRL's reward function names),
   * valid for the life of the run. */
  const char* const* names;
} tf_reward_scores;

/* Added in 1.28: texts a sequence classifier (a reward model) scores, as
 * transformers' *ForSequenceClassification and TRL's GRPOTrainer score them:
 * each text's tokens with no special tokens added, and the logit of `label`
 * at its last token that is not the tokenizer's padding token (its EOS when
 * it names none). */
typedef struct tf_score_texts_request {
  uint32_t struct_size;
  /* A Hugging Face model folder: config.json of a *ForSequenceClassification
   * architecture, its weights and its tokenizer. The host opens it once for
   * the run (composed only, nothing read, when the run is only planned). */
  const char* model;
  int64_t n; /* 0: open the model and say what it holds, scoring nothing */
  /* [n] UTF-8. With `messages` 0 each is a text, tokenized as it is; with 1
   * each is a JSON array of chat messages the model's chat template renders
   * first, with no generation prompt (TRL's apply_chat_template). */
  const char* const* texts;
  int32_t messages;
  int32_t label;      /* the label whose logit each score is (TRL: 0) */
  int64_t batch_rows; /* rows in one forward pass; 0: all n together */
} tf_score_texts_request;

typedef struct tf_score_texts_result {
  uint32_t struct_size;
  double* scores;       /* [n], the caller's: each text's logit of `label` */
  int64_t weight_bytes; /* the model's weights as held, on the run's device */
  int64_t num_labels;   /* the classifier's labels (config.json's id2label) */
  int64_t positions;    /* the most tokens a text may have; 0: no limit */
} tf_score_texts_result;

/* What a schedule reports for one step. */
typedef struct tf_step_result {
  uint32_t struct_size;
  double loss;
  int64_t n_tokens;
  int32_t backward_passes; /* 0 for a predicted / zeroth-order step */
  int32_t forward_passes;
  double lr;
  const char* phase; /* static string, e.g. "full", "predict"; NULL = "full" */
} tf_step_result;

/* The run's optimizer. */
typedef struct tf_optimizer_info {
  uint32_t struct_size;
  const char* name; /* "adamw", "sgd" */
  double lr;        /* current learning rate */
  double beta1, beta2, eps, weight_decay, momentum;
  int64_t step; /* 1-based count of the update being applied */
  /* Added in 1.0's tail: state tensors per parameter that optimizer_update
   * takes (AdamW 2: exp_avg, exp_avg_sq; SGD with momentum 1; plain SGD 0). */
  int32_t n_state;
} tf_optimizer_info;

/* Reductions of the cross-rank collectives (added in 1.0's tail). */
typedef enum tf_reduce_op {
  TF_REDUCE_SUM = 1,
  TF_REDUCE_AVG = 2,
  TF_REDUCE_MAX = 3,
  TF_REDUCE_MIN = 4,
  TF_REDUCE_OP_MAX_ENUM = 0x7FFFFFFF /* holds the enum at 32 bits; never a value */
} tf_reduce_op;

/* Hook event around a stage. */
typedef enum tf_pass_phase {
  TF_PHASE_FORWARD = 1,
  TF_PHASE_BACKWARD = 2,
  TF_PHASE_RECOMPUTE = 3, /* forward re-run inside backward for checkpointing */
  /* A weight of this stage is needed outside a pass (export, decoding) while
   * a strategy keeps it in another tier: bring it in at begin, drop at end. */
  TF_PHASE_ACCESS = 4,
  TF_PASS_PHASE_MAX_ENUM = 0x7FFFFFFF /* holds the enum at 32 bits; never a value */
} tf_pass_phase;

typedef struct tf_stage_event {
  uint32_t struct_size;
  int32_t stage;
  tf_pass_phase phase;
  int32_t begin; /* 1 = about to run, 0 = finished */
  int64_t step;
} tf_stage_event;

/* A model summary for memory estimates. */
typedef struct tf_model_summary {
  uint32_t struct_size;
  int64_t n_params;
  int64_t n_trainable;
  int64_t param_bytes;
  int32_t n_stages;
  int64_t batch_size;
  int64_t seq_len;
  int64_t activation_bytes; /* sum over stages of activation_bytes_per_token * B * T */
  /* Added in 1.5: when the host fuses the head's projection with the loss,
   * the tokens of one chunk, whose logits exist at once (a transient of
   * forward, not kept to backward; activation_bytes leaves the logits out);
   * 0 when the logits come whole, batch_size * seq_len at once. */
  int64_t logits_tokens;
  /* Added in 1.26: the stages' decode cache per row (tf_stage_spec's, summed
   * over the stages that run), the head's output rows (the model's
   * vocabulary), and for a schedule that samples completions of prompts
   * (TF_SCHEDULE_FEATURE_PROMPTS) the longest prompt of the data, in tokens
   * as the model reads it (0 otherwise). */
  int64_t decode_cache_bytes_per_token;
  int64_t decode_state_bytes;
  int64_t vocab_size;
  int64_t prompt_tokens;
} tf_model_summary;

/* A strategy's or schedule's effect on memory: signed byte deltas per
 * (tier, category) against the kernel's baseline, plus a step-time factor.
 * The baseline already follows every declaration made by the end of
 * configure: parameters' dtypes and trainability, adapters, skipped, frozen
 * and recomputed stages (with the model's declared activation bytes). A
 * strategy estimates what those do not show: formats it will convert
 * weights to, tiers, dtypes it changes later, gradients it frees early,
 * partitioning, its own buffers. */
typedef struct tf_memory_estimate {
  uint32_t struct_size;
  int64_t delta_bytes[TF_TIER_COUNT][TF_MEM_CATEGORY_COUNT];
  double time_factor; /* predicted step time relative to plain; 1.0 = same, 0 = unknown */
  /* Added in 1.0's tail: 1 when gradients of earlier passes are alive during
   * a forward pass (gradient accumulation), so the planner counts them then. */
  int32_t grads_in_forward;
  /* Added in 1.1: device bytes alive only while the optimizer update
   * runs (a copy of the weights from before it), not in forward or backward;
   * kept out of delta_bytes. */
  int64_t update_bytes;
  /* Added in 1.1: the tier (TF_TIER_HOST or TF_TIER_DISK) this strategy keeps
   * the inputs of recomputed stages in between forward and their recompute
   * (pack_activation); TF_TIER_DEVICE (0) = it does not. The plan then counts
   * them there, and on the device only the one being recomputed and the one
   * read ahead. */
  int32_t recompute_inputs_tier;
  /* Added in 1.4: 1 when everything this plugin does to step time shows in
   * the plan — recomputed stages, weight formats and tiers, dtypes and
   * autocast, adapters, optimizer state tiers, micro-batches — which the step
   * cost model (`tightfit fit`) prices from the machine's measured rates;
   * time_factor is then left out of it. 0 (older plugins, and the default):
   * time_factor multiplies the modeled step time, as for any effect the
   * model cannot see. */
  int32_t time_from_plan;
  /* Added in 1.5: device bytes alive only at the end of a forward pass, not
   * in backward or the update (autocast's 16-bit copy of the head's matrix
   * while a fused head computes its chunks); kept out of delta_bytes. */
  int64_t forward_bytes;
  /* Added in 1.6: device bytes alive only while a decoder block
   * (TF_STAGE_BLOCK) computes — in its forward, its recompute or its
   * backward — and not while the head computes or the update runs (a frozen
   * weight dequantized for one projection); kept out of delta_bytes. Since
   * 1.29 it may be negative: a strategy that makes another's workspace
   * smaller (autocast serving an NF4 weight's fetch in 16 bits) takes the
   * difference back; the host adds up every strategy's and counts at least
   * none (an older host counts a negative one as none). */
  int64_t block_bytes;
  /* Added in 1.24: what the step cost model (`tightfit fit`) needs to know
   * of this plugin that the plan does not show; 0 where it does nothing of
   * the kind. */
  int32_t autocast_compute; /* 1: matmuls run in 16 bits from weights kept in 32 */
  int32_t prefetch_stages;  /* how many stages ahead it reads the tiers it keeps */
  int32_t micro_batches;    /* a schedule's passes of data.batch_size per update */
  /* What the ranks exchange each step (with world_size > 1): 1 gradients,
   * all-reduced (data parallel); 2, 3, 4: ZeRO stage 1, 2, 3 (the optimizer
   * state, then the gradients, then the weights partitioned). */
  int32_t rank_exchange;
  /* Added in 1.26, for a schedule whose training passes are not the batch's
   * shape (grpo: each prompt's completions are rows of prompt + completion
   * tokens): the rows and the tokens per row of its largest pass; 0 = the
   * batch's. The plan then counts activations, logits and backward at that
   * shape, and asks every plugin again with it in tf_model_summary. */
  int64_t pass_rows;
  int64_t pass_seq_len;
  /* Added in 1.26, for a schedule that samples with the host's generate:
   * the rows it decodes together and the most tokens each samples (after a
   * prompt of tf_model_summary.prompt_tokens). The plan counts the
   * generation as its own moment, outside the training pass: the decode
   * cache of those rows, a chunk of the prompt's logits and the sampling
   * workspace, beside the weights and optimizer state. */
  int64_t generate_rows;
  int64_t generate_new_tokens;
  /* Added in 1.27: how many prompts those rows complete (each prompt's
   * rows one after another); a model that fans a cache out
   * (TF_MODEL_FEATURE_DECODE_FANOUT) prefills each prompt once. 0: each
   * row its own prompt. */
  int64_t generate_prompts;
} tf_memory_estimate;

/* ------------------------------------------------------------------------- */
/* Host services                                                              */
/* ------------------------------------------------------------------------- */

/* The table of services the host gives every plugin. A service used outside
 * the calls it is meant for returns TF_ERR_UNSUPPORTED, and so does one
 * called from a thread the plugin started (except tensor_release, log and
 * memory_push/pop_category). String results are owned by the host and valid
 * for the life of the process unless stated otherwise (a parameter's or
 * stage's name survives later declarations). Output structs are written no
 * further than the caller's struct_size, which is set to min(caller's,
 * host's); input structs are read no further than theirs (later fields read
 * as 0). */

/* A function of each token alone that the host may run in tiles
 * (tiled_over_tokens, 1.29): out = f(x), *out new; a status other than TF_OK
 * fails the pass (set_error says why). */
typedef tf_status (*tf_tokenwise_fn)(void* user, tf_host_context* ctx, int64_t tag, tf_tensor x,
                                     tf_tensor* out);

typedef struct tf_host_api {
  uint32_t struct_size;
  uint32_t abi_version;         /* the host's TF_ABI_VERSION */
  const char* libtorch_version; /* the host's LibTorch, e.g. "2.11.0" */

  /* --- errors and logging --- */
  /* Records why the plugin's current call fails; the host shows it with the
   * plugin's name. Call before returning an error status. */
  void (*set_error)(tf_host_context* ctx, const char* message);
  /* The message of the host's last failed service call in this context;
   * valid until this context's next service call. */
  const char* (*last_error)(tf_host_context* ctx);
  void (*log)(tf_host_context* ctx, tf_log_level level, const char* message);

  /* --- the plugin's own recipe table (validated against its tf_config_key) --- */
  tf_status (*config_get_bool)(tf_host_context* ctx, const char* key, int32_t* out);
  tf_status (*config_get_int)(tf_host_context* ctx, const char* key, int64_t* out);
  tf_status (*config_get_double)(tf_host_context* ctx, const char* key, double* out);
  /* *out is host-owned, valid until the run ends. */
  tf_status (*config_get_string)(tf_host_context* ctx, const char* key, const char** out);
  /* Element `index` of a list key; TF_ERR_NOT_FOUND past the end. Integers and
   * sizes of INT_LIST/SIZE keys are read with config_get_list_int. */
  tf_status (*config_get_list_string)(tf_host_context* ctx, const char* key, int32_t index,
                                      const char** out);
  tf_status (*config_get_list_int)(tf_host_context* ctx, const char* key, int32_t index,
                                   int64_t* out);
  /* 1 when the recipe sets the key explicitly (not from its default). */
  int32_t (*config_has)(tf_host_context* ctx, const char* key);

  tf_status (*run_info)(tf_host_context* ctx, tf_run_info* out);

  /* --- tensors --- */
  /* Releases a new handle. Safe from any thread. */
  void (*tensor_release)(tf_tensor t);

  /* --- declarations (model create; strategies' configure for adapters) --- */
  tf_status (*declare_param)(tf_host_context* ctx, const tf_param_spec* spec);
  tf_status (*declare_stage)(tf_host_context* ctx, const tf_stage_spec* spec, int32_t* out_index);

  /* --- parameter store: compute access (model stage forwards) --- */
  /* The dense weight to compute with, differentiable back to the parameter.
   * Strategies may produce it (dequantize, fetch from host/disk). Out: new. */
  tf_status (*weight)(tf_host_context* ctx, const char* name, tf_tensor* out);
  /* y = x W^T + b through the store: the kernel's linear, extended by
   * strategies (LoRA adds its low-rank term; quantize dequantizes just in time
   * and keeps only the compact form for backward). `bias` may be NULL.
   * x: borrowed. Out: new. */
  tf_status (*linear)(tf_host_context* ctx, tf_tensor x, const char* weight, const char* bias,
                      tf_tensor* out);

  /* --- parameter store: inspection and control (strategies, schedules) --- */
  tf_status (*param_count)(tf_host_context* ctx, int32_t* out);
  tf_status (*param_name)(tf_host_context* ctx, int32_t index, const char** out);
  tf_status (*param_info)(tf_host_context* ctx, const char* name, tf_param_info* out);
  /* The stored tensor itself (in its current format and residency). Out: new. */
  tf_status (*param_storage)(tf_host_context* ctx, const char* name, tf_tensor* out);
  /* Replaces the stored tensor and records its format and residency. The
   * strategy that sets a non-dense format must serve fetch_weight for it.
   * value: borrowed (the store keeps its own reference). */
  tf_status (*param_set_storage)(tf_host_context* ctx, const char* name, tf_tensor value,
                                 tf_param_format format, tf_residency residency);
  tf_status (*param_set_trainable)(tf_host_context* ctx, const char* name, int32_t trainable);
  /* The parameter's gradient, or an undefined-handle error when it has none. Out: new. */
  tf_status (*param_grad)(tf_host_context* ctx, const char* name, tf_tensor* out);
  /* param += alpha * delta, outside autograd (predicted updates, perturbations).
   * delta: borrowed. */
  tf_status (*param_add_)(tf_host_context* ctx, const char* name, tf_tensor delta, double alpha);

  /* --- stages --- */
  tf_status (*stage_count)(tf_host_context* ctx, int32_t* out);
  tf_status (*stage_info)(tf_host_context* ctx, int32_t stage, tf_stage_info* out);
  /* Activation checkpointing: run the stage without keeping its activations
   * and recompute it in backward (the kernel's generic stage Function). */
  tf_status (*stage_set_recompute)(tf_host_context* ctx, int32_t stage, int32_t on);
  /* Place a stage on a device; the executor moves activations at boundaries. */
  tf_status (*stage_set_device)(tf_host_context* ctx, int32_t stage, const char* device);
  /* Skip a block stage (identity) — sparse layers. */
  tf_status (*stage_set_skip)(tf_host_context* ctx, int32_t stage, int32_t skip);
  /* Freeze or unfreeze all parameters of a stage. */
  tf_status (*stage_set_trainable)(tf_host_context* ctx, int32_t stage, int32_t trainable);

  /* --- memory accounting --- */
  tf_status (*memory_stats)(tf_host_context* ctx, tf_memory_stats* out);
  /* Attribute allocations made by this thread to `category` until the matching
   * pop (strategies' own buffers: offload staging, optimizer state). The
   * category stack is per thread, so these two may also be called from
   * threads the plugin started (a prefetch thread). */
  tf_status (*memory_push_category)(tf_host_context* ctx, tf_mem_category category);
  tf_status (*memory_pop_category)(tf_host_context* ctx);

  /* --- training services (schedules) --- */
  /* The next training batch from the recipe's data, deterministic by seed
   * and position. */
  tf_status (*next_batch)(tf_host_context* ctx, tf_batch* out);
  void (*batch_release)(tf_host_context* ctx, tf_batch* batch);
  /* Forward without gradients (predicted steps, MeZO, evaluation). */
  tf_status (*forward)(tf_host_context* ctx, const tf_batch* batch, tf_pass_result* out);
  /* Forward and backward; gradients accumulate into the parameters'
   * gradients scaled by loss_scale (1/micro_batches for accumulation). */
  tf_status (*forward_backward)(tf_host_context* ctx, const tf_batch* batch, double loss_scale,
                                tf_pass_result* out);
  tf_status (*zero_grad)(tf_host_context* ctx);
  /* Gradient clipping (recipe's optimizer.grad_clip) then the optimizer update
   * (strategies' optimizer_step hooks first). Returns TF_ERR_NON_FINITE, and
   * changes nothing, when a gradient is not finite. */
  tf_status (*optimizer_step)(tf_host_context* ctx);
  tf_status (*set_lr)(tf_host_context* ctx, double lr);
  /* The recipe's optimizer.lr. */
  tf_status (*base_lr)(tf_host_context* ctx, double* out);
  /* Copies all trainable parameters (and optimizer state when with_optimizer)
   * to a snapshot; restore copies them back. */
  tf_status (*snapshot_take)(tf_host_context* ctx, int32_t with_optimizer, int32_t* out_id);
  tf_status (*snapshot_restore)(tf_host_context* ctx, int32_t id);
  tf_status (*snapshot_drop)(tf_host_context* ctx, int32_t id);
  /* Adds scale * z to every trainable parameter, z ~ N(0,1) drawn from a
   * generator seeded with `seed` (the same seed gives the same z: MeZO). */
  tf_status (*perturb_params)(tf_host_context* ctx, uint64_t seed, double scale);
  /* Appends a key to this step's metrics line. */
  tf_status (*log_metric)(tf_host_context* ctx, const char* key, double value);

  /* --- plugin state in checkpoints (inside save_state / load_state only) --- */
  /* value: borrowed; written to the checkpoint's file before the call returns
     (the host keeps no copy, so state larger than memory streams through). A
     key put twice in one save: TF_ERR_INVALID_ARGUMENT. */
  tf_status (*state_put_tensor)(tf_host_context* ctx, const char* key, tf_tensor value);
  /* Out: new. TF_ERR_NOT_FOUND when the checkpoint has no such key. */
  tf_status (*state_get_tensor)(tf_host_context* ctx, const char* key, tf_tensor* out);
  tf_status (*state_put_double)(tf_host_context* ctx, const char* key, double value);
  tf_status (*state_get_double)(tf_host_context* ctx, const char* key, double* out);

  /* --- optimizer-in-backward (strategies' grad_ready) --- */
  /* Applies the run's optimizer (its lr, betas, weight decay and the step now
   * being taken) to one parameter with grad_scale * grad, at once. grad:
   * borrowed. The strategy then returns TF_OK from grad_ready so the kernel
   * frees the gradient. */
  tf_status (*optimizer_apply)(tf_host_context* ctx, const char* name, tf_tensor grad,
                               double grad_scale);
  /* The run's optimizer settings and the step being taken (for strategies
   * that keep optimizer state themselves, e.g. 8-bit AdamW). */
  tf_status (*optimizer_info)(tf_host_context* ctx, tf_optimizer_info* out);

  /* --- gradient accumulation (added in 1.0's reserved space) --- */
  /* A schedule that accumulates declares that the forward_backward calls that
   * follow are micro-batch `index` (0-based) of `count` in this optimizer step.
   * optimizer_step resets it to 0 of 1. */
  tf_status (*set_micro_batch)(tf_host_context* ctx, int32_t index, int32_t count);
  /* Where the current backward is in its step, for strategies whose
   * grad_ready must wait for the last micro-batch (fused update). */
  tf_status (*micro_batch)(tf_host_context* ctx, int32_t* index, int32_t* count);

  /* --- tensor files: plugins' own artifacts, such as adapters --- */
  /* Writes `n` tensors (borrowed, any device) under `names` to a safetensors
   * file at `path`: a temporary name, fsync, then rename, so a reader never
   * sees half a file. `metadata_json` (a JSON object of strings) may be NULL. */
  tf_status (*tensors_save)(tf_host_context* ctx, const char* path, int32_t n,
                            const char* const* names, const tf_tensor* tensors,
                            const char* metadata_json);
  /* Reads tensor `name` from the safetensors file at `path` (validated as the
   * kernel's own checkpoints are). Out: new, on CPU. TF_ERR_NOT_FOUND when the
   * file has no such tensor. The host keeps the last file read for this
   * plugin instance until another path is read; path NULL releases it. */
  tf_status (*tensors_load)(tf_host_context* ctx, const char* path, const char* name,
                            tf_tensor* out);

  /* --- optimizer state kept by a strategy (offload: update where it lives) --- */
  /* Applies the run's optimizer (lr, betas, weight decay of parameter `name`,
   * the step being taken) to `param` (borrowed, updated in place; it may be a
   * host copy of the parameter) from `grad` (borrowed, same device as param),
   * with state the caller keeps: `state` holds optimizer_info.n_state fp32
   * tensors shaped like the parameter, all zero before the first update, and
   * updated in place. Called from optimizer_step_param. */
  tf_status (*optimizer_update)(tf_host_context* ctx, const char* name, tf_tensor param,
                                tf_tensor grad, int32_t n_state, const tf_tensor* state);

  /* --- collectives across ranks (torch.distributed c10d: Gloo on CPU, NCCL on
   * CUDA; the kernel owns the process group). Every rank must make the same
   * calls in the same order, with tensors of the same shape and dtype, on the
   * run's device, contiguous. In a single-process run they are identities
   * (reduce_scatter and all_gather copy). A peer that dies or stays away past
   * [run].dist_timeout fails the call with a message naming this rank. --- */
  /* In place. */
  tf_status (*dist_all_reduce)(tf_host_context* ctx, tf_tensor t, tf_reduce_op op);
  /* `in` holds world_size equal parts; this rank's reduced part goes to `out`. */
  tf_status (*dist_reduce_scatter)(tf_host_context* ctx, tf_tensor out, tf_tensor in,
                                   tf_reduce_op op);
  /* `out` (world_size x in's elements) receives every rank's `in`, in rank order. */
  tf_status (*dist_all_gather)(tf_host_context* ctx, tf_tensor out, tf_tensor in);
  tf_status (*dist_broadcast)(tf_host_context* ctx, tf_tensor t, int32_t root);
  tf_status (*dist_barrier)(tf_host_context* ctx);

  /* --- the planned parameter table (inside estimate_memory only) ---
   * While `plan` asks for estimates it keeps, per parameter, the bytes, format
   * and tier the recipe's strategies will give it, starting from the
   * declaration (dense, declared dtype, device). A strategy that converts or
   * moves parameters reads what earlier strategies planned and records its
   * own change here, instead of a weights delta, so that conversions stack
   * (4-bit weights then offloaded: the 4-bit bytes move). The plan's weights
   * and adapters per tier are summed from this table. */
  tf_status (*plan_param_get)(tf_host_context* ctx, const char* name, tf_param_plan* out);
  tf_status (*plan_param_set)(tf_host_context* ctx, const char* name, const tf_param_plan* in);

  /* --- a weights file's own blocks (added in 1.9, in the reserved slots) ---
   * When [model] weights is a GGUF file: how it stores parameter `name` (a
   * matrix): its ggml type, sizes and, when with_bytes, the bytes, rows in
   * the parameter's order (LLaMA's q/k permutation undone). Any time after
   * create (a plan asks without bytes). TF_ERR_NOT_FOUND, with last_error
   * saying why, when the weights are not a GGUF file or hold no matrix of
   * the parameter's shape under its name. */
  tf_status (*param_source_blocks)(tf_host_context* ctx, const char* name, int32_t with_bytes,
                                   tf_source_blocks* out);
  /* Decodes rows of ggml blocks of type `type` (`bytes`: borrowed, uint8
   * [rows, row_bytes], any device) to float32 [rows, cols] (new, on bytes'
   * device), value for value as ggml's reference dequantizers do. */
  tf_status (*blocks_decode)(tf_host_context* ctx, const char* type, tf_tensor bytes, int64_t cols,
                             tf_tensor* out);

  /* --- preference training (added in 1.10, in the reserved slots) ---
   * Each row's summed log-probability of its targets (those not
   * ignore_index) under the model as it is now, from the head's projection
   * and the log-softmax a chunk of tokens at a time (the logits are never
   * whole): *out_logps fp32 [rows] and *out_counts int64 [rows] (the targets
   * scored), both new, on the CPU; either pointer may be NULL.
   * `grad_weights` NULL: a forward without gradients (a reference model's
   * pass). Otherwise fp32 [rows] (borrowed): also the backward of
   * sum_r grad_weights[r] * logps[r], the gradients accumulated into the
   * parameters' as forward_backward's are (grad_ready, loss scaling,
   * checkpointed stages). A schedule passes d loss / d logps[r] of its loss
   * at the logps of a gradient-free pass over the same batch, which is
   * exactly its loss's gradient. */
  tf_status (*sequence_logps)(tf_host_context* ctx, const tf_batch* batch, tf_tensor grad_weights,
                              tf_tensor* out_logps, tf_tensor* out_counts);
  /* Turns the strategies' adapters (LoRA) off (enabled 0) or back on for the
   * passes that follow: off, the model is the base model alone, as PEFT's
   * disable_adapter() makes it (a reference model without a second copy).
   * *out_count (may be NULL): how many strategies hold adapters; 0 when none
   * does, and then nothing changed. */
  tf_status (*adapters_set_enabled)(tf_host_context* ctx, int32_t enabled, int32_t* out_count);
  /* Added in 1.12 (a reserved slot): each target's log-probability, as
   * sequence_logps scores them but not summed: *out_logps fp32 [B, T] (new,
   * on the CPU), 0 where the target is ignore_index. `grad_weights` NULL: no
   * gradients; else fp32 [B, T] (borrowed): also the backward of
   * sum_{b,t} grad_weights[b,t] * logps[b,t], as sequence_logps's. Here and
   * in sequence_logps the batch's targets may be the schedule's own: a copy
   * of the tf_batch whose `targets` is another int64 [B, T] (ignore_index or
   * a token id of the model's vocabulary; the host refuses any other), e.g.
   * ORPO's NLL, which scores the prompt's tokens too. */
  tf_status (*token_logps)(tf_host_context* ctx, const tf_batch* batch, tf_tensor grad_weights,
                           tf_tensor* out_logps);
  /* Added in 1.13 (a reserved slot): the run's preference rows with
   * row_ids [first, first + count) as one batch (at most count: it stops
   * where the training rows end and the held-out ones begin), laid out as
   * next_batch lays them out (release with batch_release); out->pairs is 0
   * past the last row. For a pass over every row before training (a
   * reference model's log-probabilities, computed once); the training
   * position does not move, and every rank gets the same rows. */
  tf_status (*preference_rows)(tf_host_context* ctx, int64_t first, int64_t count, tf_batch* out);
  /* Added in 1.16 (a reserved slot): adds `term`, a float scalar (borrowed),
   * to the loss of the pass whose stage_forward is calling: a model's own
   * term, such as a mixture of experts' load-balancing loss (transformers'
   * router_aux_loss_coef * aux_loss). The host adds its value to the loss it
   * reports and back-propagates it as the loss, with the same scale (loss
   * scaling, a micro-batch's weight); evaluation passes report it too. Only
   * from stage_forward, and refused in the passes of sequence_logps and
   * token_logps unless the schedule lets them take it (take_loss_terms,
   * 1.18). In a recompute (tf_stage_call.recompute = 1) the value is
   * not added again: the host back-propagates the recomputed term with the
   * stage's output, so that a term a checkpointed stage computes gets its
   * gradient. A term that needs the whole pass (every layer's routing) is
   * added by the last stage, from values its blocks kept; a checkpointed
   * block then adds, in its recompute, the part of that term its own
   * activations make. Outside a pass whose loss the host computes
   * (generation, logits) the term is dropped. */
  tf_status (*add_loss_term)(tf_host_context* ctx, tf_tensor term);
  /* Added in 1.17 (a reserved slot): the model is about to fetch these
   * `count` parameters of its running stage, in this order (a mixture of
   * experts once its router has chosen: the chosen experts' weights). The
   * host passes each one kept in another tier and not resident to the
   * strategies' expect_weight, so that the one keeping it may start reading
   * it; the fetch itself is unchanged (want_weight, fetch_weight). Only
   * inside a stage's event; a hint, never required: a host without the slot
   * reads each weight when it is fetched. */
  tf_status (*expect_weights)(tf_host_context* ctx, const char* const* names, int32_t count);
  /* Added in 1.18 (a reserved slot): lets the next sequence_logps or
   * token_logps call take the model's own loss terms (add_loss_term: a
   * mixture of experts' load-balancing loss), which those passes refuse
   * otherwise; it runs nothing itself. That call's pass adds up the terms
   * its model adds (over the tokens the batch's attention_mask keeps) and,
   * with grad_weights, also back-propagates `grad_weight` times their sum
   * along with the weighted log-probabilities (a checkpointed stage's
   * recomputed part too). When the call returns, *out_sum (borrowed until
   * then; fp64) holds the sum: 0 if the model added none. A schedule adds
   * it to the loss it reports, as TRL's trainers add aux_loss_coef *
   * aux_loss of the policy's concatenated pass; a reference model's pass
   * takes its terms with grad_weight 0 and drops them (TRL adds the
   * policy's only). It holds for one call; a call it did not reach (an
   * error before the pass) leaves *out_sum unwritten. */
  tf_status (*take_loss_terms)(tf_host_context* ctx, double grad_weight, double* out_sum);

  /* Added in 1.19 (the last reserved slot): declares, for every trainable
   * parameter that is not an adapter, a frozen copy named `prefix` + its
   * name: the same shape, dtype, stage, init and flags, with TF_PARAM_COPY
   * and TF_PARAM_FROZEN, holding the values the parameter starts with (read
   * from the recipe's weights by the parameter's own name, or the same
   * initial draw). A copy is a frozen parameter like any other: the
   * strategies convert and place it (quantize stores it compact, offload
   * keeps a block's in host memory or on disk), the plan counts it,
   * checkpoints carry it as they carry frozen weights, and exports leave it
   * out. Only in a schedule's create (the strategies are configured, the
   * parameters not yet made); `prefix` is non-empty and no declared name
   * starts with it. *out_count (may be NULL): how many were declared. */
  tf_status (*declare_param_copies)(tf_host_context* ctx, const char* prefix, int32_t* out_count);
  /* Added in 1.19: until called again, every weight a pass reads (weight,
   * linear, a head's projection) is its copy `prefix` + name where one was
   * declared, and the parameter itself where none was (the frozen ones);
   * NULL or "" reads the parameters themselves again. Copies are frozen:
   * such a pass back-propagates into no parameter it read as a copy. The
   * prefix must be one declare_param_copies declared. */
  tf_status (*use_param_copies)(tf_host_context* ctx, const char* prefix);
  /* Added in 1.19: the next sequence_logps or token_logps call also
   * measures each position's logits averaged over the vocabulary (capped as
   * the head caps them): *out receives a new fp32 [B, T] tensor on the CPU
   * with every position's, the padding's too (0 in a row without a target,
   * which the pass leaves out), from the same chunks as the log-probs (the
   * logits are never whole). TRL's DPOTrainer logs their mean over each
   * side's completion tokens as logits/chosen and logits/rejected. It holds
   * for one call and runs nothing itself; a call it did not reach (an error
   * before the pass) leaves *out unwritten. */
  tf_status (*take_mean_logits)(tf_host_context* ctx, tf_tensor* out);

  /* Added in 1.20 (a reserved slot): runs one pass as `pass` says (tf_pass:
   * the loss or log-probs, backward or not, adapters off or the weights'
   * copies for this pass alone, the model's terms and mean logits taken)
   * and writes what it computed to *out (tf_pass_result). It does what
   * forward, forward_backward, sequence_logps and token_logps do with
   * take_loss_terms, take_mean_logits, adapters_set_enabled and
   * use_param_copies around them, which ABI 2.0 drops for it. */
  tf_status (*run_pass)(tf_host_context* ctx, const tf_pass* pass, tf_pass_result* out);
  /* Added in 1.20 (a reserved slot): `value`, a tensor of one real value
   * (borrowed; the host keeps its own reference), is read with the host's
   * next read of the device, optimizer_step's gradient norm, and written to
   * *out as a double: a strategy's own figure (a norm it keeps for the next
   * step) without a read of its own, so that a step waits for the device
   * once. *out must stay valid until it is written: the plugin's state, not
   * its stack. Inside run_step it is written by the step's update, or when
   * run_step returns at the latest; outside a step, before read_later
   * returns. */
  tf_status (*read_later)(tf_host_context* ctx, tf_tensor value, double* out);

  /* Added in 1.22 (the last reserved slot): how far a phase of the plugin's
   * own that can take more than a few seconds has come (a schedule scoring
   * every preference row with the reference before training, a reward model
   * read at create): `done` of `total` `unit`s ("rows"; total 0 when not
   * known). A call with another `phase` than the running one starts it (and
   * ends the one before); done >= total > 0, or a NULL `phase`, ends it, as
   * does the plugin call it was made in returning. The host draws it on a
   * terminal, at most ten times a second, and nothing in a pipe or with -q:
   * a call costs a comparison when no one watches. */
  tf_status (*progress)(tf_host_context* ctx, const char* phase, int64_t done, int64_t total,
                        const char* unit);

  /* Added in 1.24 (a reserved slot): declares the copies declare_param_copies
   * declares (the same names, rules and phase), kept by the host rather than
   * placed by the strategies: dense, in `tier` — TF_TIER_DEVICE, beside the
   * weights, or TF_TIER_HOST, host memory (pinned on a GPU run) that a pass
   * reads each copy from as it needs it — in the dtype their parameter has
   * once the strategies have placed it. They hold the parameters' values as
   * training finds them (TRL's create_reference_model: a copy of the model
   * when the trainer starts), taken when training starts or a pass first
   * reads one; checkpoints carry them, the plan counts them in `tier`, and no
   * strategy sees them (param_count and param_name leave them out; no hook
   * is called for them). Set-up refuses, by name, a parameter they copy that
   * a strategy keeps compact or in another tier. tf_pass.param_copies reads
   * them. */
  tf_status (*declare_kept_param_copies)(tf_host_context* ctx, const char* prefix,
                                         tf_residency tier, int32_t* out_count);

  /* Added in 1.25 (a reserved slot): samples request->n completions of one
   * prompt (1.27: of each of several) with the model as it is
   * (tf_generate_request), no gradients; the
   * key/value cache is transient memory. Only from run_step and
   * eval_batch. */
  tf_status (*generate)(tf_host_context* ctx, const tf_generate_request* request,
                        tf_generate_result* out);
  /* Added in 1.25 (a reserved slot): the recipe's reward plugins' scores of
   * completions (tf_reward_request, tf_reward_scores): the host decodes each
   * completion (special tokens skipped, as TRL's batch_decode), hands every
   * reward the texts, ids and data rows, and checks what it returns. A
   * reward that fails, or returns an infinity or a NaN it did not mean
   * (anything but a finite number or NaN for "no score"), fails the call
   * naming the reward and the row; so does a completion no reward scored. */
  tf_status (*score_rewards)(tf_host_context* ctx, const tf_reward_request* request,
                             tf_reward_scores* out);

  /* Added in 1.28 (the last reserved slot): scores texts with a sequence
   * classifier the run opens beside its model (tf_score_texts_request), no
   * gradients, on the run's device; out->scores receives request->n values.
   * Only from a plugin call (a reward's create, score or estimate_memory).
   * Services added in later 1.x versions are appended after it (the struct
   * is size-prefixed). */
  tf_status (*score_texts)(tf_host_context* ctx, const tf_score_texts_request* request,
                           tf_score_texts_result* out);

  /* Added in 1.29 (appended; a host older than 1.29 lacks it: TF_HAS):
   * out = fn(x), where fn computes each token alone (a feed-forward; no
   * dropout, no state): x is [..., C] and fn's output keeps its leading
   * dimensions. In a training pass under [run] mlp_tile_tokens = N > 0 the
   * host runs fn over at most N tokens at a time and keeps only x for
   * backward, where it runs each tile again with autograd and backpropagates
   * that tile's share of the gradient, so fn's intermediates are never more
   * than N tokens wide (a tiled MLP); the parameters fn reads (through
   * weight/linear) get the sum of the tiles' gradients. Otherwise it calls fn
   * once on x. The host calls fn, on any thread, as it calls a plugin's hooks
   * (its services served there), with `user` and `tag` as given, during this
   * call and in backward: `user` must live as long as the model does. *out is
   * new. */
  tf_status (*tiled_over_tokens)(tf_host_context* ctx, tf_tensor x, tf_tokenwise_fn fn, void* user,
                                 int64_t tag, tf_tensor* out);
} tf_host_api;

/* ------------------------------------------------------------------------- */
/* Plugin vtables                                                             */
/* ------------------------------------------------------------------------- */

/* Every vtable begins with these. `create` reads the plugin's recipe table
 * through the host and returns the instance state; `destroy` frees it. */

/* A model: declares its parameters and stages, and computes each stage. */
typedef struct tf_model_vtable {
  uint32_t struct_size;
  /* Reads the model table, declares every parameter (declare_param) and
   * stage (declare_stage, in execution order). */
  tf_status (*create)(const tf_host_api* host, tf_host_context* ctx, void** out_state);
  void (*destroy)(void* state);
  /* Computes one stage. `input` is borrowed: int64 tokens [B,T] for the
   * embed stage, else the previous stage's output. *out is new. The forward
   * must obtain weights only through host->weight / host->linear. */
  tf_status (*stage_forward)(void* state, tf_host_context* ctx, const tf_stage_call* call,
                             tf_tensor input, tf_tensor* out);
  /* Optional: the model's Hugging Face config.json (a JSON object, with
   * "model_type" and "architectures"), so exported weights load in
   * transformers. *out_json is owned by the plugin, valid until the next call. */
  tf_status (*hf_config_json)(void* state, tf_host_context* ctx, const char** out_json);
  /* Optional: incremental decoding for generation. *cache is the model's own
   * state between calls: NULL on the first call (the model creates it), then
   * handed back unchanged; the host frees it with release_cache. Runs the
   * model on the next tokens (int64 [B, T_new], borrowed) after everything the
   * cache has seen and returns their logits [B, T_new, vocab] (new). Recurrent
   * models (RWKV) carry their state here; attention models may keep keys and
   * values. Weights still come through host->weight / host->linear. */
  tf_status (*decode)(void* state, tf_host_context* ctx, void** cache, tf_tensor tokens,
                      tf_tensor* out_logits);
  void (*release_cache)(void* state, void* cache);
  /* Added in 1.2 (in the first reserved slot, so 1.0 and 1.1 layouts hold):
   * the Hugging Face "model_type" values this model computes from a
   * config.json, comma-separated ("llama,mistral,qwen2,qwen3"), or NULL. The
   * host picks the plugin for a model folder by it. Static storage. */
  const char* hf_model_types;
  /* Added in 1.3 (the next reserved slot): TF_MODEL_FEATURE_* bits. */
  uintptr_t features;
  /* Added in 1.27 (the next reserved slot), optional: decode as `decode`
   * does, of rows that begin at different columns, so that prompts of
   * different lengths are decoded together, each left-padded to the
   * longest. `starts` (int64 [B], borrowed: a row for each of `tokens`'
   * rows, the same rows' starts on every call of a cache) is each row's
   * first real column of everything the cache has seen and `tokens` add:
   * no position attends to a column before its row's start (a padding
   * column attends to itself only, so its values stay finite), and a row's
   * positions count from its start (the column at `starts[b]` is position
   * 0). Read by a host only from a plugin built against 1.27 or later. */
  tf_status (*decode_rows)(void* state, tf_host_context* ctx, void** cache, tf_tensor tokens,
                           tf_tensor starts, tf_tensor* out_logits);
  void* reserved[2];
} tf_model_vtable;

/* The model reads tf_stage_call.positions: packed rows (several examples to
 * a row, [data] packing = true) are computed as if each example had its row. */
#define TF_MODEL_FEATURE_POSITIONS ((uintptr_t)1)
/* Added in 1.27: decode (and decode_rows) fan a cache out. When a call's
 * tokens have k > 1 times the rows the cache holds, each cached row is
 * repeated k times first (row i becomes rows i*k .. i*k+k-1, its starts
 * too), so that one prompt's prefill serves its k completions. */
#define TF_MODEL_FEATURE_DECODE_FANOUT ((uintptr_t)2)
/* Added in 1.29: the model computes its feed-forward through
 * host->tiled_over_tokens and declares its activation bytes for
 * tf_run_info.mlp_tile_tokens ([run] mlp_tile_tokens is refused for a model
 * without it). */
#define TF_MODEL_FEATURE_TILED_MLP ((uintptr_t)4)

/* A memory strategy: any subset of hooks; NULL means "no effect". Strategies
 * run in recipe order; a hook returning TF_NOT_HANDLED passes to the next. */
typedef struct tf_strategy_vtable {
  uint32_t struct_size;
  tf_status (*create)(const tf_host_api* host, tf_host_context* ctx, void** out_state);
  void (*destroy)(void* state);

  /* After the model declared itself and before parameters are materialized:
   * choose recompute, devices, skipped stages, trainable sets; declare adapter
   * parameters (LoRA). */
  tf_status (*configure)(void* state, tf_host_context* ctx);
  /* After parameters exist (initialized or loaded): convert formats
   * (quantize), move storage to host or disk tiers (offload). */
  tf_status (*params_ready)(void* state, tf_host_context* ctx);

  /* Start and end of each optimizer step (sparse: re-pick trainable stages). */
  tf_status (*step_begin)(void* state, tf_host_context* ctx, int64_t step);
  tf_status (*step_end)(void* state, tf_host_context* ctx, int64_t step, double loss);

  /* Around each stage in forward, backward and recompute (fetch, prefetch,
   * evict; all-gather and free for ZeRO-3). */
  tf_status (*stage_event)(void* state, tf_host_context* ctx, const tf_stage_event* event);

  /* Produce the dense compute weight for a parameter in a format this
   * strategy owns, or fetched from its tier. stored: borrowed; *out new.
   * While autocast is on for the stored tensor's device, an fp32 parameter
   * may be served in the autocast dtype (what linear computes in there).
   * TF_NOT_HANDLED = not this strategy's parameter. */
  tf_status (*fetch_weight)(void* state, tf_host_context* ctx, const char* name, tf_tensor stored,
                            tf_tensor* out);
  /* Withdrawn in ABI 1.4: no 1.x host calls it (a host logs a warning when
   * a plugin sets it), and ABI 2.0 removes it. The field stays so the layout
   * stays as frozen in 1.0. Evict when the stage that used the weight is
   * done: stage_event with begin = 0. */
  tf_status (*release_weight)(void* state, tf_host_context* ctx, const char* name);

  /* Extend y = linear(x, weight) (LoRA adds its term). x and y borrowed; on
   * TF_OK *out is the new result (new); TF_NOT_HANDLED leaves y. */
  tf_status (*linear_extend)(void* state, tf_host_context* ctx, const char* weight, tf_tensor x,
                             tf_tensor y, tf_tensor* out);

  /* A parameter's gradient is complete for this backward (fused update,
   * reduce-scatter, offload of gradients). grad: borrowed. TF_OK = consumed
   * (the kernel drops the gradient), TF_NOT_HANDLED = keep it. */
  tf_status (*grad_ready)(void* state, tf_host_context* ctx, const char* name, tf_tensor grad);

  /* The optimizer update of one parameter where its state lives. param and
   * grad borrowed. TF_OK = updated here, TF_NOT_HANDLED = kernel updates it. */
  tf_status (*optimizer_step_param)(void* state, tf_host_context* ctx, const char* name,
                                    tf_tensor param, tf_tensor grad, double lr);

  /* Memory this strategy adds or removes against the plain recipe (plan). */
  tf_status (*estimate_memory)(void* state, tf_host_context* ctx, const tf_model_summary* model,
                               tf_memory_estimate* out);

  /* Checkpoint the strategy's own state (state_put_* / state_get_*). */
  tf_status (*save_state)(void* state, tf_host_context* ctx);
  tf_status (*load_state)(void* state, tf_host_context* ctx);

  /* Export: the value a parameter should have in a standalone model (LoRA
   * merges W + scale B A). dense: borrowed, the parameter's dense value;
   * *out new. TF_NOT_HANDLED = export as is. Adapter parameters
   * (TF_PARAM_ADAPTER) are left out of exports that merge. */
  tf_status (*export_weight)(void* state, tf_host_context* ctx, const char* name, tf_tensor dense,
                             tf_tensor* out);

  /* Export: write this strategy's trained adapters on their own into the
   * existing folder `dir` (LoRA: PEFT's adapter_model.safetensors and
   * adapter_config.json). TF_NOT_HANDLED = nothing to write. */
  tf_status (*export_adapter)(void* state, tf_host_context* ctx, const char* dir);

  /* fp16 loss scaling (precision). loss_scale: multiply *scale (1 before
   * the first strategy) by the factor the loss should be scaled by before the
   * coming backward; it must not change within an optimizer step. The kernel
   * divides the gradients by the product of all factors before clipping and
   * the update, and stops the run if a strategy consumes a still-scaled
   * gradient in grad_ready. loss_scale_update: after each optimizer step,
   * whether the unscaled gradients were finite (when not, the update was
   * skipped) — where a dynamic scaler backs off or grows. */
  tf_status (*loss_scale)(void* state, tf_host_context* ctx, double* scale);
  tf_status (*loss_scale_update)(void* state, tf_host_context* ctx, int32_t finite);

  /* Streaming setup: the kernel materializes parameters one stage at a time
   * (a run of consecutive parameters of one stage, initialized or loaded)
   * and calls this after each run, before the next is allocated, so a
   * strategy that converts or moves weights (quantize, offload) can do so
   * while the model is never whole in memory. May come more than once for a
   * stage (adapters are declared after the model); convert what is not yet
   * converted. params_ready still follows once for everything. */
  tf_status (*stage_params_ready)(void* state, tf_host_context* ctx, int32_t stage);

  /* Activation offload: the input a checkpointed (recomputed) stage keeps
   * from forward to its recompute in backward. pack_activation takes `x`
   * (borrowed) in forward and returns a key (any value) under which the
   * strategy keeps it — TF_NOT_HANDLED leaves it in memory; the first
   * strategy that packs owns it. unpack_activation gives it back in backward
   * (*out new, on the device it came from) and forgets it. */
  tf_status (*pack_activation)(void* state, tf_host_context* ctx, int32_t stage, tf_tensor x,
                               uint64_t* out_key);
  tf_status (*unpack_activation)(void* state, tf_host_context* ctx, int32_t stage, uint64_t key,
                                 tf_tensor* out);

  /* Gradients a strategy holds itself after consuming them in grad_ready
   * (ZeRO-2/3 keep only this rank's reduce-scattered part). In optimizer_step,
   * before clipping: grad_norm_sq adds the squared L2 norm of everything it
   * holds, over all ranks, to *sum_sq (clipping and the finiteness check
   * cover held gradients too). Then, when the step goes ahead,
   * apply_held_grads updates the parameters from them multiplied by
   * grad_scale (the clipping factor) and drops them; when the step is skipped
   * (non-finite) and on zero_grad, drop_held_grads drops them. */
  tf_status (*grad_norm_sq)(void* state, tf_host_context* ctx, double* sum_sq);
  tf_status (*apply_held_grads)(void* state, tf_host_context* ctx, double grad_scale);
  tf_status (*drop_held_grads)(void* state, tf_host_context* ctx);

  /* Added in 1.10 (a reserved slot): the strategy's adapters off (enabled
   * 0: its linear_extend adds nothing) or on, for the passes that follow
   * (host adapters_set_enabled). TF_NOT_HANDLED when it holds none. */
  tf_status (*set_adapters_enabled)(void* state, tf_host_context* ctx, int32_t enabled);

  /* Added in 1.15 (a reserved slot): the parameter `name`, kept in another
   * tier (residency not device) and not resident now, is about to be
   * fetched inside its stage's event. The strategy that left it there at
   * the event's start (offload's TF_PARAM_EXPERT weights, brought in only
   * for the experts a batch is routed to) makes it resident now
   * (param_set_storage), until the stage's event ends. TF_NOT_HANDLED = not
   * this strategy's. Called before fetch_weight, so a compact format is
   * still turned dense by the strategy that owns it. */
  tf_status (*want_weight)(void* state, tf_host_context* ctx, const char* name);

  /* Added in 1.17 (a reserved slot): the parameter `name`, kept in another
   * tier and not resident, will be fetched inside the running stage's event
   * after those announced before it (host expect_weights). The strategy that
   * keeps it may start reading it now, so that its want_weight finds it
   * read; the parameter itself is not changed until want_weight.
   * TF_NOT_HANDLED = not this strategy's. */
  tf_status (*expect_weight)(void* state, tf_host_context* ctx, const char* name);

  void* reserved[3];
} tf_strategy_vtable;

/* A trainer schedule: decides what each step does using training services. */
typedef struct tf_schedule_vtable {
  uint32_t struct_size;
  tf_status (*create)(const tf_host_api* host, tf_host_context* ctx, void** out_state);
  void (*destroy)(void* state);
  /* Runs optimizer step `step` (0-based) of `total`. */
  tf_status (*run_step)(void* state, tf_host_context* ctx, int64_t step, int64_t total,
                        tf_step_result* out);
  tf_status (*estimate_memory)(void* state, tf_host_context* ctx, const tf_model_summary* model,
                               tf_memory_estimate* out);
  tf_status (*save_state)(void* state, tf_host_context* ctx);
  tf_status (*load_state)(void* state, tf_host_context* ctx);
  /* Added in 1.10 (a reserved slot): the held-out loss of one validation
   * batch as this schedule defines its loss, in *out (loss, n_tokens,
   * finite); no gradients. NULL: the kernel's mean cross-entropy, which is
   * not reported for preference pairs (a schedule that takes them sets it). */
  tf_status (*eval_batch)(void* state, tf_host_context* ctx, const tf_batch* batch,
                          tf_pass_result* out);
  /* Added in 1.11 (a reserved slot): how preference rows become tokens for
   * this schedule. NULL or "dpo": as TRL's DPOTrainer (prompt and each
   * completion tokenized apart, EOS after each completion); "joint": as TRL's
   * CPOTrainer and ORPOTrainer (prompt + completion tokenized together, the
   * tokenizer's BOS before the prompt, EOS after the completion, their
   * truncation). Added in 1.13: "kto": as TRL's KTOTrainer (pairs
   * unpaired, prompt + completion tokenized together, BOS and EOS, its
   * truncation, the KL rows; tf_batch.desirable). The host refuses any
   * other value by name. */
  const char* preference_tokenization;
  /* Added in 1.25 (a reserved slot): TF_SCHEDULE_FEATURE_* bits. */
  uintptr_t features;
  void* reserved[5];
} tf_schedule_vtable;

/* The schedule trains on prompts it completes itself (online RL: GRPO):
 * [data] rows with a "prompt" and no answer come as batches of prompts
 * (tf_batch.prompts), and the recipe's [[reward]] tables are its rewards. */
#define TF_SCHEDULE_FEATURE_PROMPTS ((uintptr_t)1)

/* Added in 1.25: what a reward plugin scores, borrowed for the call. Rows
 * [g * group_size, (g + 1) * group_size) complete the same prompt. */
typedef struct tf_reward_batch {
  uint32_t struct_size;
  int64_t n;
  int32_t group_size;
  /* [n] UTF-8: each row's prompt as the model read it (the chat template
   * applied), its completion decoded with special tokens skipped (TRL's
   * completions text), and its data row, the JSONL object as written (a
   * reward reads its own fields from it: "answer"). */
  const char* const* prompts;
  const char* const* completions;
  const char* const* rows;
  tf_tensor completion_ids; /* int64 [n, C]: ids, then -1 past each one's end */
  tf_tensor lengths;        /* int64 [n] */
} tf_reward_batch;

/* Added in 1.25: a reward ([[reward]] plugin = "NAME", weight = w, and its
 * own keys), as TRL's reward functions. */
typedef struct tf_reward_vtable {
  uint32_t struct_size;
  tf_status (*create)(const tf_host_api* host, tf_host_context* ctx, void** out_state);
  void (*destroy)(void* state);
  /* out_scores[i] (n, written by the plugin): completion i's score, or NaN
   * where the reward does not apply to the row (TRL's None). Any other
   * non-finite value, or an error, stops the run naming the reward. */
  tf_status (*score)(void* state, tf_host_context* ctx, const tf_reward_batch* batch,
                     double* out_scores);
  /* Optional: memory the reward holds (a scorer model), as a strategy's. */
  tf_status (*estimate_memory)(void* state, tf_host_context* ctx, const tf_model_summary* model,
                               tf_memory_estimate* out);
  void* reserved[4];
} tf_reward_vtable;

/* ------------------------------------------------------------------------- */
/* Descriptor and entry point                                                 */
/* ------------------------------------------------------------------------- */

/* The plugin uses only LibTorch's stable C interface (the aoti shim) and so
 * loads into a host built against another LibTorch version. */
#define TF_PLUGIN_FLAG_STABLE_ABI_ONLY 0x1u

typedef struct tf_plugin_descriptor {
  uint32_t struct_size;
  uint32_t abi_version; /* TF_ABI_VERSION the plugin was compiled against */
  tf_plugin_kind kind;
  const char* name;                 /* recipe name: [model] plugin = "gpt2" */
  const char* version;              /* the plugin's own version */
  const char* description;          /* one line */
  const char* libtorch_version;     /* TORCH_VERSION at build, e.g. "2.11.0" */
  uint32_t flags;                   /* TF_PLUGIN_FLAG_* */
  const tf_config_key* config_keys; /* array of n_config_keys, stride = element struct_size */
  uint32_t n_config_keys;
  /* tf_model_vtable*, tf_strategy_vtable*, tf_schedule_vtable* or (1.25)
   * tf_reward_vtable* as `kind` says. */
  const void* vtable;
  /* Added in 1.23 (the first reserved slot): `tightfit fit` may add this
   * plugin to a recipe or leave it out, as declared; NULL: it keeps the
   * recipe's table as it is. Read only from a plugin of ABI 1.23 or later. */
  const tf_plugin_search* search;
  void* reserved[7];
} tf_plugin_descriptor;

/* What the host offers when it opens a library. */
typedef struct tf_host_offer {
  uint32_t struct_size;
  uint32_t abi_version;         /* host TF_ABI_VERSION */
  const char* libtorch_version; /* host LibTorch */
} tf_host_offer;

/* The entry point, exported as TF_PLUGIN_ENTRY_SYMBOL. The first call the host
 * makes: the plugin may refuse a host it cannot work with (return TF_ERR_ABI);
 * otherwise it sets *out to its static descriptor. The host then checks the
 * descriptor's struct_size before reading it, the ABI versions both ways and
 * the LibTorch version, and copies it into a zeroed struct of its own. */
typedef tf_status (*tf_plugin_entry_fn)(const tf_host_offer* host,
                                        const tf_plugin_descriptor** out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TIGHTFIT_PLUGIN_API_H */
