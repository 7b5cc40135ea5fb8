// The llama plugin's stages and parameters under Hugging Face names, with
// the activation bytes and multiply-adds `plan` counts for each block.
#include <cmath>
#include <string>
#include <vector>

#include "llama_model.hpp"
#include "tightfit/activation_bytes.hpp"
#include "tightfit/tiled_attention.hpp"

namespace llama {
namespace {

void declare(const Llama& m, const std::string& name, std::vector<int64_t> shape, int32_t stage,
             tf_init_kind init, double std, uint32_t flags, double routed_share = 0) {
  m.host.declare_param(name, std::move(shape), tf_sdk::parse_dtype(m.host.get_string("dtype")),
                       stage, init, std, flags, routed_share);
}

// Layer l's router, experts (and Qwen2-MoE's shared expert and its gate),
// under the family's names; each expert's weights are parameters of their
// own, flagged TF_PARAM_EXPERT (ABI 1.15) for the strategies that move them,
// with the share of the tokens routed to each (top_k of n_experts, ABI
// 1.17) for the plan.
void declare_experts(const Llama& m, int64_t l, int32_t st, double std, double proj_std) {
  const Shape& s = m.s;
  const ExpertNames n = s.expert_names();
  const std::string block = m.layer(l, n.block) + std::string(".");
  const int64_t C = s.n_embd;
  auto declare_mlp = [&](const std::string& prefix, const ExpertNames& names, int64_t I,
                         uint32_t flags, double share) {
    declare(m, prefix + names.gate + ".weight", {I, C}, st, TF_INIT_NORMAL, std, flags, share);
    declare(m, prefix + names.up + ".weight", {I, C}, st, TF_INIT_NORMAL, std, flags, share);
    declare(m, prefix + names.down + ".weight", {C, I}, st, TF_INIT_NORMAL, proj_std, flags, share);
  };
  const double routed_share = static_cast<double>(s.top_k) / static_cast<double>(s.n_experts);
  declare(m, block + "gate.weight", {s.n_experts, C}, st, TF_INIT_NORMAL, std, 0);
  for (int64_t e = 0; e < s.n_experts; ++e)
    declare_mlp(block + "experts." + std::to_string(e) + ".", n, s.expert_intermediate,
                TF_PARAM_EXPERT, routed_share);  // routed: a batch may leave it unused
  if (s.shared_intermediate > 0) {
    declare_mlp(block + "shared_expert.", {"", "gate_proj", "up_proj", "down_proj"},
                s.shared_intermediate, 0, 0);
    declare(m, block + "shared_expert_gate.weight", {1, C}, st, TF_INIT_NORMAL, std, 0);
  }
}

}  // namespace

void declare_parameters(Llama& m_ref, const tf_run_info& info) {
  Llama* m = &m_ref;
  const Shape& s = m->s;
  const int64_t L = s.n_layer, C = s.n_embd, V = s.vocab, D = m->head_dim(), I = s.intermediate;
  const int64_t KV = s.n_kv_head * D, Q = s.n_head * D, T = info.seq_len;
  const int64_t elt = m->dtype == at::kFloat ? 4 : 2;
  const uint32_t no_decay = TF_PARAM_NO_WEIGHT_DECAY;
  // A norm's identity: w = 1, or Gemma's w = 0 (it scales by 1 + w).
  const tf_init_kind norm_init = s.unit_offset_norm ? TF_INIT_ZEROS : TF_INIT_ONES;
  const double std = 0.02, proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L));

  // Activation bytes per token autograd keeps (for `plan`). RMSNorm keeps
  // its fp32 input, the normalized value and the scaled output (the
  // projections' input); attention keeps
  // rotated q, k and v as attention sees them (H D, KVH D, KVH D where the
  // kernel serves grouped heads itself; repeated elsewhere, H D each:
  // Llama::attend) and its output (H D), Qwen3's per-head norms their
  // fp32 inputs; the MLP its input's gate, up, silu(gate)
  // and their product (4 I). Small fp32 statistics round it off.
  // Frozen, a norm keeps only its fp32 input and the MLP gate's input, silu
  // of it and up (3 I): the linears' inputs and the norms' outputs go.
  // Frozen, its input: fp32 activations are their own fp32 copy, and a
  // 16-bit input is kept as it is (tf_sdk::rms_norm).
  const int64_t rms_norm_bytes = 4 * C + 2 * elt * C, frozen_norm_bytes = elt * C;
  // Gemma 2's capped attention keeps its [T, T] scores per head: their tanh
  // and the probabilities (fp32; measured), and two norms more.
  // A long pass attends in tiles where it needs a mask or a cap
  // (Llama::attend): nothing [T, T] is kept, and q, k, v as given.
  const int64_t n_norms = s.sandwich_norms ? 4 : 2;
  auto tiled_attention = [&](int64_t l) {
    return T >= tf_sdk::kTiledAttentionFrom && s.masked_or_capped(l, T);
  };
  auto extra = [&](int64_t l) {
    return 72 + tf_sdk::attention_lse_bytes(s.n_head) +
           (s.qk_norm ? 4 * (Q + KV) + 2 * elt * (Q + KV) : 0) +
           (s.attn_softcap > 0 && !tiled_attention(l) ? 2 * 4 * s.n_head * T : 0);
  };
  // A mixture of experts runs top_k expert MLPs per token (and Qwen2-MoE's
  // shared one): their activations count as one MLP of that total width;
  // each routed copy keeps its gathered input and weighted output (2 C),
  // the router its logits and fp32 probabilities (E (elt + 4)).
  const int64_t E = s.n_experts, Ie = s.expert_intermediate, Is = s.shared_intermediate;
  const int64_t moe_I = s.top_k * Ie + Is;
  const int64_t moe_extra = E * (elt + 4) + s.top_k * 2 * C * elt + (Is > 0 ? 2 * C * elt : 0);
  auto mlp_width = [&](int64_t l) { return s.has_experts(l) ? moe_I : I; };
  // Grouped heads unrepeated where the kernel serves them
  // (Llama::kernel_serves_grouped_heads): the CPU's, CUDA's in 16 bits.
  const std::string device = info.device != nullptr ? info.device : "";
  const bool grouped = KV < Q && s.attn_softcap <= 0 &&
                       (device.rfind("cpu", 0) == 0 || (device.rfind("cuda", 0) == 0 && elt == 2));
  auto attention = [&](int64_t l) {
    return grouped || tiled_attention(l) ? 2 * elt * (Q + KV) : 4 * elt * Q;
  };
  // [run] mlp_tile_tokens (Llama::feed_forward): a dense feed-forward
  // sublayer, its norms with it, keeps only the residual stream it starts
  // from, and computes one tile's norms and intermediates at a time, in
  // forward and again in backward: there, with their gradients, a workspace
  // of the tile's share of the batch's tokens.
  const int64_t tile = mlp_tile_tokens(info), tokens = std::max<int64_t>(1, info.batch_size * T);
  const bool tiled = tile > 0 && tile < tokens;
  auto tiles = [&](int64_t l) { return tiled && !s.has_experts(l); };
  auto tile_share = [&](int64_t bytes) {
    return (bytes * tile + tokens - 1) / tokens;  // per token of the batch, rounded up
  };
  // The norms outside the tiles: the attention's (and Gemma 2's after it).
  const int64_t norms_in_tiles = s.sandwich_norms ? 2 : 1;
  auto norms_kept = [&](int64_t l) { return tiles(l) ? n_norms - norms_in_tiles : n_norms; };
  auto block_bytes = [&](int64_t l) {
    return norms_kept(l) * rms_norm_bytes + attention(l) +
           (tiles(l) ? elt * C : 4 * elt * mlp_width(l)) + extra(l) +
           (s.has_experts(l) ? moe_extra : 0);
  };
  // Frozen, an untiled feed-forward keeps its gate's input, silu of it and
  // up (the norm's output, which frozen projections do not keep, goes).
  auto frozen_block_bytes = [&](int64_t l) {
    return norms_kept(l) * frozen_norm_bytes + attention(l) +
           (tiles(l) ? elt * C : 3 * elt * mlp_width(l)) + extra(l) +
           (s.has_experts(l) ? moe_extra : 0);
  };
  // Gradients alive at once at the peak of a block's backward, measured:
  // in the MLP, those of h, silu(gate) and up with the residual's; trained,
  // the saved inputs the weight gradients used are gone by then. Tiled, a
  // tile's intermediates run again with them.
  // Tiled attention's backward (when its moment is the larger): the
  // gradients of q (in its dtype), k and v (fp32) and the residual's, with
  // the blocks of one tile.
  auto attention_backward = [&](int64_t l) {
    if (!tiled_attention(l)) return int64_t{0};
    return elt * Q + 8 * KV + 2 * C * elt +
           (tf_sdk::tiled_attention_workspace_bytes(
                info.batch_size, s.n_head, D, tf_sdk::kTiledAttentionTile, s.attn_softcap > 0) +
            tokens - 1) /
               tokens;
  };
  // Tiled, the block's own gradients are the larger part: the residual's
  // and the tile's, its norm's in fp32 (4 C, whatever the activations'
  // dtype) among them.
  auto backward_bytes = [&](int64_t l) {
    if (tiles(l))
      return std::max(attention_backward(l),
                      2 * C * elt + tile_share(4 * C + (4 + 3) * mlp_width(l) * elt));
    return std::max(attention_backward(l), (mlp_width(l) + 2 * C) * elt);
  };
  // Frozen, a 16-bit norm computes its fp32 ops again in backward, a few
  // thousand rows at a time (tf_sdk::rms_norm). The block's first norm's is
  // its backward's last moment: that workspace with the residual's gradient
  // and the norm's, the rest of what the block kept gone by then (the plan
  // adds this workspace to all of it: counted net of it).
  auto norm_backward = [&](int64_t l) {
    if (elt != 2) return int64_t{0};
    const int64_t workspace =
        (tf_sdk::rms_norm_backward_workspace_bytes(tokens, C) + tokens - 1) / tokens;
    return std::max<int64_t>(0,
                             2 * C * elt + workspace - (frozen_block_bytes(l) - frozen_norm_bytes));
  };
  auto frozen_backward_bytes = [&](int64_t l) {
    if (tiles(l))
      return std::max({attention_backward(l), norm_backward(l),
                       C * elt + tile_share(4 * C + (3 + 3) * mlp_width(l) * elt)});
    return std::max({attention_backward(l), norm_backward(l), (3 * mlp_width(l) + C) * elt});
  };
  // Multiply-adds per token: the router and the experts each token runs.
  auto mlp_flops = [&](int64_t l) {
    return s.has_experts(l) ? 3 * C * moe_I + C * E + (Is > 0 ? C : 0) : 3 * C * I;
  };
  m->host.declare_stage("embed", TF_STAGE_EMBED, 0, 0, 0, C * elt);
  declare(*m, "model.embed_tokens.weight", {V, C}, s.tie_embeddings ? -1 : 0, TF_INIT_NORMAL, std,
          0);
  for (int64_t l = 0; l < L; ++l) {
    const int32_t st = m->host.declare_stage(
        "block." + std::to_string(l), TF_STAGE_BLOCK,
        {block_bytes(l), frozen_block_bytes(l), C * elt, backward_bytes(l),
         frozen_backward_bytes(l), /*decode_cache: keys, values=*/2 * KV * elt},
        {2 * (2 * C * Q + 2 * C * KV + mlp_flops(l)) + 2 * T * Q,
         /*tiled: the dense feed-forward (Llama::feed_forward_sublayer)=*/s.has_experts(l)
             ? 0
             : 2 * mlp_flops(l)});
    declare(*m, m->layer(l, "input_layernorm.weight"), {C}, st, norm_init, 0, no_decay);
    if (s.fused_projections) {
      declare(*m, m->layer(l, "self_attn.qkv_proj.weight"), {Q + 2 * KV, C}, st, TF_INIT_NORMAL,
              std, 0);
    } else {
      declare(*m, m->layer(l, "self_attn.q_proj.weight"), {Q, C}, st, TF_INIT_NORMAL, std, 0);
      declare(*m, m->layer(l, "self_attn.k_proj.weight"), {KV, C}, st, TF_INIT_NORMAL, std, 0);
      declare(*m, m->layer(l, "self_attn.v_proj.weight"), {KV, C}, st, TF_INIT_NORMAL, std, 0);
    }
    if (s.qkv_bias) {
      declare(*m, m->layer(l, "self_attn.q_proj.bias"), {Q}, st, TF_INIT_ZEROS, 0, no_decay);
      declare(*m, m->layer(l, "self_attn.k_proj.bias"), {KV}, st, TF_INIT_ZEROS, 0, no_decay);
      declare(*m, m->layer(l, "self_attn.v_proj.bias"), {KV}, st, TF_INIT_ZEROS, 0, no_decay);
    }
    if (s.qk_norm || s.qk_norm_full) {  // per head, or OLMoE's over all heads
      declare(*m, m->layer(l, "self_attn.q_norm.weight"), {s.qk_norm ? D : Q}, st, norm_init, 0,
              no_decay);
      declare(*m, m->layer(l, "self_attn.k_norm.weight"), {s.qk_norm ? D : KV}, st, norm_init, 0,
              no_decay);
    }
    declare(*m, m->layer(l, "self_attn.o_proj.weight"), {C, Q}, st, TF_INIT_NORMAL, proj_std, 0);
    if (s.o_bias)
      declare(*m, m->layer(l, "self_attn.o_proj.bias"), {C}, st, TF_INIT_ZEROS, 0, no_decay);
    declare(*m, m->layer(l, "post_attention_layernorm.weight"), {C}, st, norm_init, 0, no_decay);
    if (s.sandwich_norms)
      for (const char* norm :
           {"pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"})
        declare(*m, m->layer(l, norm), {C}, st, norm_init, 0, no_decay);
    if (s.has_experts(l)) {
      declare_experts(*m, l, st, std, proj_std);
      continue;
    }
    if (s.fused_projections) {
      declare(*m, m->layer(l, "mlp.gate_up_proj.weight"), {2 * I, C}, st, TF_INIT_NORMAL, std, 0);
    } else {
      declare(*m, m->layer(l, "mlp.gate_proj.weight"), {I, C}, st, TF_INIT_NORMAL, std, 0);
      declare(*m, m->layer(l, "mlp.up_proj.weight"), {I, C}, st, TF_INIT_NORMAL, std, 0);
    }
    declare(*m, m->layer(l, "mlp.down_proj.weight"), {C, I}, st, TF_INIT_NORMAL, proj_std, 0);
    if (s.mlp_bias) {
      declare(*m, m->layer(l, "mlp.gate_proj.bias"), {I}, st, TF_INIT_ZEROS, 0, no_decay);
      declare(*m, m->layer(l, "mlp.up_proj.bias"), {I}, st, TF_INIT_ZEROS, 0, no_decay);
      declare(*m, m->layer(l, "mlp.down_proj.bias"), {C}, st, TF_INIT_ZEROS, 0, no_decay);
    }
  }
  // The head's rows: the vocabulary's, or a sequence classifier's labels.
  const int64_t rows = s.num_labels > 0 ? s.num_labels : V;
  const int64_t loss = tf_sdk::loss_activation_bytes(rows, elt);
  const int32_t head = m->host.declare_stage(
      "head", TF_STAGE_HEAD, {rms_norm_bytes + loss, frozen_norm_bytes + loss, rows * elt},
      2 * C * rows, {m->head_weight(), "", loss, s.final_softcap});
  declare(*m, "model.norm.weight", {C}, head, norm_init, 0, no_decay);
  if (!s.tie_embeddings) declare(*m, m->head_weight(), {rows, C}, head, TF_INIT_NORMAL, std, 0);
}

}  // namespace llama
