#include "generation_plan.hpp"

#include <algorithm>

#include "checked_size.hpp"
#include "completion_sampler.hpp"
#include "executor.hpp"
#include "kernel_parts.hpp"
#include "plugin_set.hpp"
#include "run_environment.hpp"
#include "stage_flow.hpp"

namespace tightfit {

GenerationPlan plan_generation(const KernelParts& s, int64_t rows, int64_t prompts,
                               int64_t prompt_tokens, int64_t new_tokens) {
  GenerationPlan g;
  g.rows = std::max<int64_t>(rows, 0);
  g.prefill_rows = g.rows;
  g.prompt_tokens = std::max<int64_t>(prompt_tokens, 1);
  g.new_tokens = std::max<int64_t>(new_tokens, 0);
  if (g.rows == 0 || g.new_tokens == 0) return g;
  const tf_model_vtable* vt = s.plugins->model.plugin->model();
  g.incremental = vt->decode != nullptr && vt->release_cache != nullptr;
  const LoadedPlugin& model = *s.plugins->model.plugin;
  if (g.incremental && prompts > 0 && prompts < g.rows && g.rows % prompts == 0 &&
      TF_VERSION_MINOR(model.abi_version) >= 27 &&
      (model.model_features & TF_MODEL_FEATURE_DECODE_FANOUT) != 0)
    g.prefill_rows = prompts;  // each prompt prefilled once (completion_sampler)
  const int64_t context = g.prompt_tokens + g.new_tokens;
  int64_t per_token = 0, state = 0, largest_block = 0, vocab = s.env->run_info.vocab_size;
  // A stage's work without autograd (stage_flow.hpp); the head's logits
  // are counted apart.
  int64_t computing = 0;
  for (const StageState& st : s.executor->stages()) {
    if (st.skip) continue;
    per_token += st.decode_cache_bytes_per_token;
    state += st.decode_state_bytes;
    largest_block = std::max(largest_block, st.decode_cache_bytes_per_token);
    const int64_t logits = st.kind == TF_STAGE_HEAD ? st.projection_bytes_per_token : 0;
    computing = std::max(computing, live_without_autograd(st.activation_bytes_per_token - logits));
    if (st.kind == TF_STAGE_HEAD && !st.projection_weight.empty()) {
      const Param& w = s.store->get(st.projection_weight);
      if (!w.shape.empty()) vocab = std::max(vocab, w.shape[0]);
    }
  }
  // A sampling step: fp32 logits, their softmax, and a sort's values and
  // int64 indices (top-k, top-p) of every row.
  const int64_t step = checked_product({g.rows, vocab, 4 + 4 + 4 + 8}, "the sampling step");
  if (!g.incremental) {
    // Each token: the whole context's forward and every position's logits.
    const int64_t tokens = checked_product({g.rows, context}, "the generated rows' tokens");
    g.workspace = std::max(
        step, checked_product({tokens, computing + 4 * vocab}, "a generation step's forward"));
    return g;
  }
  g.cache = checked_product({g.rows, context, per_token + largest_block}, "the decode cache") +
            checked_product({g.rows, state}, "the decode state");
  const int64_t piece = std::min(g.prompt_tokens, prefill_chunk_tokens(g.prefill_rows, vocab));
  const int64_t prefill =
      checked_product({g.prefill_rows, piece, computing + 4 * vocab}, "a prefill piece");
  g.workspace = std::max(prefill, step);
  return g;
}

}  // namespace tightfit
