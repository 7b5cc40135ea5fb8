// The stage executor: runs the model as the sequence of stages it declared,
// raises the strategies' hook events around each stage in forward, backward
// and recompute, hands finished gradients to grad_ready, and serves weights
// (fetch_weight, linear) from whichever tier a strategy keeps them in.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "param_store.hpp"
#include "pass_request.hpp"
#include "pass_scope.hpp"
#include "plugin_set.hpp"
#include "run_environment.hpp"

namespace tightfit {

struct StageState {
  std::string name;
  tf_stage_kind kind = TF_STAGE_BLOCK;
  bool recompute = false;
  bool skip = false;
  bool trainable = true;
  std::string device;
  int64_t activation_bytes_per_token = 0;
  int64_t flops_per_token = 0;
  int64_t frozen_activation_bytes_per_token = 0;  // 0 = unknown
  int64_t output_bytes_per_token = 0;             // 0 = unknown
  int64_t backward_bytes_per_token = 0;           // 0 = unknown
  int64_t frozen_backward_bytes_per_token = 0;    // 0 = unknown
  int64_t decode_cache_bytes_per_token = 0;       // per row, in decode (ABI 1.26)
  int64_t decode_state_bytes = 0;                 // per row, in decode (ABI 1.26)
  int64_t tiled_flops_per_token = 0;  // of flops_per_token, through tiled_over_tokens (ABI 1.30)
  // A head's projection (tf_stage_spec.projection_weight, ABI 1.5): empty
  // when the head does not declare one and its logits come whole.
  std::string projection_weight;
  std::string projection_bias;
  int64_t projection_bytes_per_token = 0;  // of the activation bytes: the logits
  double projection_softcap = 0;           // logits c tanh(z / c) (ABI 1.14); 0: none
};

struct PassResult {
  double loss = 0;
  int64_t n_tokens = 0;
  bool finite = true;
};

// A token logps pass's scoring (Executor::token_logps): the logits divided
// by a temperature first, and each position's entropy measured.
struct TokenScoring {
  double temperature = 1.0;
  bool entropies = false;
};

// A model's function of each token alone (tiled_over_tokens, ABI 1.29).
struct TokenwiseFn {
  tf_tokenwise_fn fn = nullptr;
  void* user = nullptr;
  int64_t tag = 0;
};

class Executor {
 public:
  // `step` is the trainer's counter (0-based), read for each call's tf_stage_call.
  Executor(PluginSet& plugins, ParamStore& store, const RunEnvironment& env, const int64_t& step)
      : plugins_(plugins), store_(store), env_(env), step_(step) {}
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The model's stages, in order, as it declared them and strategies marked them.
  std::vector<StageState>& stages() { return stages_; }
  const std::vector<StageState>& stages() const { return stages_; }
  // Once parameters exist: the tensor that gives checkpointed stages a backward.
  void prepare_recompute() {
    recompute_anchor_ =
        at::empty({0}, at::TensorOptions().device(env_.device)).requires_grad_(true);
  }
  // Testing aid ([run] debug_nan_at_steps): a NaN loss at each listed step, once.
  void inject_nan_at(const std::vector<int64_t>& steps) {
    nan_steps_pending_.insert(steps.begin(), steps.end());
  }

  // [run] fused_loss and loss_chunk_tokens: whether a head that declares its
  // projection computes it with the loss a chunk of tokens at a time.
  void set_fused_loss(bool on, int64_t chunk_tokens) {
    fused_loss_ = on;
    loss_chunk_tokens_ = chunk_tokens;
  }
  // [run] mlp_tile_tokens: tiled_over_tokens runs a model's per-token
  // function this many tokens at a time (0: all at once).
  void set_mlp_tile_tokens(int64_t tokens) { mlp_tile_tokens_ = tokens; }
  // fn(x), tiled over x's tokens in training (tiled_tokens.cpp).
  at::Tensor tiled_over_tokens(const at::Tensor& x, const TokenwiseFn& fn);
  // While `reused` is set (a tiled call's loop over its tiles): a frozen
  // weight stored compact or in another tier is fetched once (per autocast
  // state) and handed out again, not dequantized or read for every tile.
  void reuse_fetched_weights(std::map<std::string, at::Tensor>* reused) {
    reused_weights_ = reused;
  }
  // One call of the model's fn through the door into plugins, in `scope`
  // when given (a tile run again in backward), else in the running pass.
  at::Tensor call_tokenwise(const TokenwiseFn& fn, const at::Tensor& x, PassScope* scope = nullptr);
  // The stage whose projection the loss computes (-1: the logits come whole).
  int32_t fusable_head() const;
  // The strategies' adapters are on (the default) or off (a reference pass).
  void set_adapters_enabled(bool on) { adapters_enabled_ = on; }
  bool adapters_enabled() const { return adapters_enabled_; }
  // Turns the strategies' adapters on or off (their set_adapters_enabled)
  // and the passes' view of them with it; how many strategies hold some (0:
  // none does, and nothing changed).
  int32_t switch_adapters(bool on);

  // `rows`: packed rows' positions and the padding, handed to every stage
  // of the pass.
  at::Tensor forward_logits(const at::Tensor& tokens, bool training, const PassRows& rows = {});
  // The mean loss of a pass against `targets` [B, T] (kIgnoreIndex counts
  // nothing): the head's projection fused with the loss where it can be
  // (fusable_head), else the whole logits' cross-entropy. `grad_scale`: the
  // factor the loss is multiplied by before backward.
  at::Tensor forward_loss(const at::Tensor& tokens, const at::Tensor& targets, bool training,
                          const PassRows& rows = {}, double grad_scale = 1.0);
  // One pass as its request says (pass_request.hpp): the weights it names
  // for it alone, then run_pass, sequence_logps or token_logps.
  PassOutcome run(const PassRequest& request);
  // Forward, loss and (when `backward`) backward with the loss scaled by
  // `loss_scale` times the strategies' fp16 factor; grad_ready is dispatched
  // as each stage's gradients finish. With `deferred`, the loss stays on
  // the device until the next read (pending_reads), which hands it over.
  PassResult run_pass(const at::Tensor& tokens, const at::Tensor& targets, bool backward,
                      double loss_scale, const PassRows& rows = {},
                      const PendingReads::Fill& deferred = {});
  // Device values waiting for the host's next read (a deferred pass's loss).
  PendingReads& pending_reads() { return pending_reads_; }
  // A logps pass that takes the model's own loss terms (ABI 1.18's
  // take_loss_terms), which those passes refuse otherwise: their sum lands
  // in *sum, and a backward also back-propagates grad_weight times it.
  struct LossTermsTaken {
    double grad_weight = 0;
    double* sum = nullptr;
  };
  // Each row's summed log-probability of its targets and how many it has
  // (fp32 and int64 [B], on the CPU), from the head's projection a chunk at
  // a time; with `grad_weights` ([B]) also the backward of
  // sum_b grad_weights[b] * logps[b], as run_pass's backward (strategies'
  // loss scale, grad_ready). A preference schedule's pass (executor_logps.cpp).
  // With `mean_logits`, also each position's logits averaged over the
  // vocabulary (fp32 [B, T] on the CPU: every position's, padding too; 0 in
  // a row without a target, which the pass leaves out).
  struct SequenceLogps {
    at::Tensor logps, counts;
    bool finite = true;
    at::Tensor mean_logits;
  };
  SequenceLogps sequence_logps(const at::Tensor& tokens, const at::Tensor& targets,
                               const at::Tensor& positions, const at::Tensor& grad_weights,
                               const at::Tensor& attention_mask = {},
                               const LossTermsTaken* terms = nullptr, bool padding_known = true,
                               bool mean_logits = false);
  // take_loss_terms: the next logps call of the host API takes the terms
  // (disarm_loss_terms hands that call the request, once).
  void arm_loss_terms(const LossTermsTaken& t) { armed_terms_ = t; }
  std::optional<LossTermsTaken> disarm_loss_terms() { return std::exchange(armed_terms_, {}); }
  // take_mean_logits (ABI 1.19): the next logps call of the host API also
  // measures each position's logits averaged over the vocabulary (its
  // TokenLogps::mean_logits), once.
  void arm_mean_logits(tf_tensor* out) { armed_mean_logits_ = out; }
  tf_tensor* disarm_mean_logits() { return std::exchange(armed_mean_logits_, nullptr); }
  // Each target's log-probability (fp32 [B, T] on the CPU, 0 where ignored),
  // and with `grad_weights` ([B, T]) the backward of their weighted sum: the
  // per-token form of sequence_logps (ORPO's NLL over every token).
  // `scoring`: the logits divided by a temperature first (online RL scores
  // at its sampling temperature), and each position's entropy measured
  // (fp32 [B, T] on the CPU, 0 where the target is ignored).
  struct TokenLogps {
    at::Tensor logps;
    bool finite = true;
    at::Tensor mean_logits;
    at::Tensor entropies;
  };
  TokenLogps token_logps(const at::Tensor& tokens, const at::Tensor& targets,
                         const at::Tensor& positions, const at::Tensor& grad_weights,
                         const at::Tensor& attention_mask = {},
                         const LossTermsTaken* terms = nullptr, bool padding_known = true,
                         bool mean_logits = false, const TokenScoring& scoring = {});
  at::Tensor run_stage(int32_t stage, const at::Tensor& input, bool training, bool recompute);
  // A checkpointed stage's recompute in backward; the loss terms it adds
  // land in `terms`, for its backward with the factor loss_term_seed().
  at::Tensor recompute_stage(int32_t stage, const at::Tensor& input,
                             std::vector<at::Tensor>* terms);
  // A model's own term of the pass's loss (tf_host_api.add_loss_term).
  void add_loss_term(const at::Tensor& term);
  // The factor the pass's loss was back-propagated with (loss scaling, a
  // micro-batch's weight): d (what backward differentiates) / d loss.
  double loss_term_seed() const { return term_seed_; }
  void raise_stage_event(int32_t stage, tf_pass_phase phase, bool begin);
  // Activation offload of a recomputed stage's input: the index of the
  // strategy that packed it (-1: none, keep it) and its key; and the way back.
  int32_t pack_activation(int32_t stage, const at::Tensor& x, uint64_t* key);
  at::Tensor unpack_activation(int32_t strategy, int32_t stage, uint64_t key);
  // Hands the finished gradients of `stage` (-1: all the rest) to strategies'
  // grad_ready hooks during backward.
  void dispatch_grads(int32_t stage);

  // ABI 1.19 use_param_copies: the passes read `prefix` + name wherever
  // such a copy was declared ("": the parameters themselves).
  void use_param_copies(const std::string& prefix);
  const std::string& param_copies() const { return copies_prefix_; }
  // The parameter a pass reads for `name`: its copy while copies are used.
  std::string read_name(const std::string& name) const;

  at::Tensor fetch_weight(const std::string& name);
  at::Tensor fetch_weight_once(Param& p);  // fetch_weight without reuse
  at::Tensor fetch_resident(Param& p);
  // The model will fetch these next in its running stage (ABI 1.17): each
  // one left in another tier goes to the strategies' expect_weight, so the
  // one keeping it may start reading it. Outside its stage's event: ignored.
  void expect_weights(const std::vector<std::string>& names);
  void expect_stage_copies(int32_t stage);
  // Runs fn with p in the device tier: a parameter a strategy keeps in
  // another tier is brought in around fn (TF_PHASE_ACCESS) unless its stage
  // is in use already.
  void with_resident(Param& p, const std::function<void()>& fn);
  bool stage_in_use(int32_t stage) const;  // fetch_weight once the weight is in the device tier
  at::Tensor linear(const at::Tensor& x, const std::string& weight, const std::string& bias);

  // fp16 loss scaling: the strategies' factor the last backward passes were
  // scaled by (1: none). The update step divides it out and resets it.
  double applied_loss_scale() const { return applied_loss_scale_; }
  void clear_applied_loss_scale() { applied_loss_scale_ = 1.0; }

 private:
  // What a pass asks of its head: the loss against these targets.
  struct LossRequest {
    at::Tensor targets;
    double grad_scale = 1.0;
    bool computed = false;  // the head stage computed the loss (fused)
    // Targets that count (not kIgnoreIndex), counted on the host when they
    // came from there; -1: unknown (the loss counts them, with a read).
    int64_t counted = -1;
    // Set for a weighted loss (sequence_logps): every target's cross-entropy
    // lands in `each` and the loss is sum_t weights[t] * CE_t.
    at::Tensor weights, each;
    // Set when asked (take_mean_logits): each position's logits averaged
    // over the vocabulary.
    at::Tensor mean_logits;
    // A weighted loss's logits are multiplied by this first (1 / temperature).
    double logits_scale = 1.0;
    // Set when asked: each position's entropy (after logits_scale), 0 where ignored.
    at::Tensor entropies;
  };
  // Backward of `loss` times loss_scale and the strategies' factor, then
  // the stages' last events and grad_ready for what is left.
  void backward_pass(const at::Tensor& loss, double loss_scale, double strategies_scale);
  // The stages in order; with `loss`, the fused head's stage returns the loss.
  at::Tensor forward_stages(const at::Tensor& tokens, bool training, const PassRows& rows,
                            LossRequest* loss);
  // The fused head's loss from its hidden state, inside its forward event.
  at::Tensor head_loss(int32_t stage, const at::Tensor& hidden, LossRequest& loss);
  // The weighted loss (LossRequest::each) from whole logits.
  at::Tensor weighted_logits_loss(const at::Tensor& logits, const at::Tensor& targets,
                                  LossRequest& loss);
  // Whether a strategy's linear_extend changes the head's projection (LoRA
  // on the head): then the logits come whole. Asked once.
  bool head_is_extended(const StageState& head, const at::Tensor& hidden, const at::Tensor& w);

  // The product of the strategies' loss_scale factors.
  double strategies_loss_scale();
  // A schedule's own targets (token_logps) reach the head's gather: each
  // must be ignore_index or a row of the head's projection, refused by name
  // before the pass (an index past it reads out of bounds; on CUDA it ends
  // the context).
  void check_target_ids(const at::Tensor& targets) const;

  PluginSet& plugins_;
  ParamStore& store_;
  const RunEnvironment& env_;
  const int64_t& step_;

  std::vector<StageState> stages_;
  std::set<int64_t> nan_steps_pending_;
  PendingReads pending_reads_;
  double applied_loss_scale_ = 1.0;     // the loss scale of this step's backward passes
  std::vector<int> active_events_;      // per stage: stage events begun and not yet ended
  std::vector<bool> grads_dispatched_;  // per backward: grad_ready already called
  // The pass running (pass_scope.hpp): a pass entry's local, or idle_pass_
  // outside any pass.
  PassScope idle_pass_;
  PassScope* pass_ = &idle_pass_;
  // Makes `scope` the running pass until the enclosing block ends.
  class EnteredPass {
   public:
    EnteredPass(Executor& executor, PassScope& scope)
        : executor_(executor), outer_(executor.pass_) {
      executor.pass_ = &scope;
    }
    ~EnteredPass() { executor_.pass_ = outer_; }
    EnteredPass(const EnteredPass&) = delete;
    EnteredPass& operator=(const EnteredPass&) = delete;

   private:
    Executor& executor_;
    PassScope* outer_;
  };
  double term_seed_ = 1.0;
  std::optional<LossTermsTaken> armed_terms_;
  tf_tensor* armed_mean_logits_ = nullptr;
  at::Tensor recompute_anchor_;  // requires grad so checkpointed stages always get a backward
  bool fused_loss_ = true;
  int64_t loss_chunk_tokens_ = 0;  // 0: fused_loss_chunk_rows decides
  int64_t mlp_tile_tokens_ = 0;    // 0: a per-token function runs on all tokens at once
  std::map<std::string, at::Tensor>* reused_weights_ = nullptr;  // reuse_fetched_weights
  std::optional<bool> head_extended_;  // head_is_extended, once asked (with adapters on)
  bool adapters_enabled_ = true;
  std::string copies_prefix_;  // use_param_copies
  // Per stage, the parameters whose copies under copies_prefix_ the stage
  // reads (their own names), found once when the prefix is set.
  std::map<int32_t, std::vector<std::string>> copied_by_stage_;
  std::string copied_by_stage_prefix_;
};

// Turns the strategies' adapters on or off (their set_adapters_enabled
// hooks); how many hold some.
int32_t switch_strategy_adapters(PluginSet& plugins, bool on);

// Sets a slot for a scope and puts its value back after (a session's
// window in which a schedule may declare parameter copies).
template <class T>
class ScopedAssign {
 public:
  ScopedAssign(T& slot, T value) : slot_(slot), saved_(std::move(slot)) {
    slot_ = std::move(value);
  }
  ~ScopedAssign() { slot_ = std::move(saved_); }
  ScopedAssign(const ScopedAssign&) = delete;
  ScopedAssign& operator=(const ScopedAssign&) = delete;

 private:
  T& slot_;
  T saved_;
};

}  // namespace tightfit
