"""Reference for the parity tests: a Hugging Face transformers model on random
weights. Writes OUT/model.safetensors + OUT/config.json (the weights under
Hugging Face names, as save_pretrained writes them) and OUT/reference.safetensors
(tokens, targets, logits, loss, and every parameter's gradient).
With "packed", each row holds several examples: the tokens' position_ids
restart at each (transformers then keeps attention inside an example, as
TRL's padding-free packing relies on) and are written as "positions".
With "aux" (the mixtures of experts), the config sets output_router_logits: the
loss adds router_aux_loss_coef times the routers' load-balancing loss, over a
batch whose second row ends in padding (attention_mask 0 there, written as
"attention_mask"; "aux_loss" is the term before the coefficient).

usage: hf_parity.py FAMILY OUT_DIR [packed|aux]
FAMILY: gpt2 | gpt2_inner | llama | llama3 | llama_bias | mistral | qwen2 | qwen2_window | qwen3 | gemma | gemma2
        | gemma3_text | phi3 | phi3_short | mixtral | qwen2_moe | qwen3_moe | olmoe | rwkv
"""
import pathlib
import sys

import torch
from safetensors.torch import save_file
import transformers

VOCAB = 256


def build(family: str) -> torch.nn.Module:
    if family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      activation_function="gelu_new", layer_norm_epsilon=1e-5)
        return transformers.GPT2LMHeadModel(cfg)
    if family == "llama":
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
                                       tie_word_embeddings=False, attention_bias=False)
        return transformers.LlamaForCausalLM(cfg)
    if family == "llama3":  # Llama 3 rotary scaling and a tied head
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                                       max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-5,
                                       tie_word_embeddings=True, attention_bias=False,
                                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 64})
        return transformers.LlamaForCausalLM(cfg)
    if family == "gpt2_inner":  # a wider MLP, exact gelu, another epsilon
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                      n_inner=72, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      activation_function="gelu", layer_norm_epsilon=1e-6)
        return transformers.GPT2LMHeadModel(cfg)
    if family == "llama_bias":  # head_dim != hidden/heads, every bias, YaRN rotary, gelu
        cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       head_dim=12, max_position_embeddings=256, rope_theta=500.0,
                                       rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=True,
                                       mlp_bias=True, hidden_act="gelu_pytorch_tanh",
                                       rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 64})
        return transformers.LlamaForCausalLM(cfg)
    if family == "mistral":  # a window of 5 over 16 tokens, dynamic NTK within the context
        cfg = transformers.MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5,
                                         head_dim=8, sliding_window=5, tie_word_embeddings=False,
                                         rope_scaling={"rope_type": "dynamic", "factor": 2.0})
        return transformers.MistralForCausalLM(cfg)
    if family == "qwen2":  # q/k/v biases, untied head, linear rotary scaling
        cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-6,
                                       tie_word_embeddings=False,
                                       rope_scaling={"rope_type": "linear", "factor": 2.0})
        return transformers.Qwen2ForCausalLM(cfg)
    if family == "qwen2_window":  # the second layer windowed (max_window_layers = 1)
        cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                                       max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                       use_sliding_window=True, sliding_window=6, max_window_layers=1)
        return transformers.Qwen2ForCausalLM(cfg)
    if family == "qwen3":  # per-head q/k RMSNorm, head_dim 16 with hidden 32 and 4 heads, tied
        cfg = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       head_dim=16, max_position_embeddings=64, rope_theta=1000000.0,
                                       rms_norm_eps=1e-6, tie_word_embeddings=True)
        return transformers.Qwen3ForCausalLM(cfg)
    if family == "gemma":  # sqrt(hidden)-scaled embeddings, (1 + w) norms, GeGLU, head_dim 16, tied
        cfg = transformers.GemmaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                                       head_dim=16, max_position_embeddings=64, rope_theta=10000.0,
                                       rms_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh",
                                       tie_word_embeddings=True)
        return transformers.GemmaForCausalLM(cfg)
    if family == "gemma2":  # gemma, plus: capped scores and logits (caps small enough to bend
        # these random weights' values), query_pre_attn_scalar 24 != head_dim 16, sandwich norms,
        # layer 0 sliding over 5 keys and layer 1 full
        cfg = transformers.Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        head_dim=16, max_position_embeddings=64, rope_theta=10000.0,
                                        rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                                        query_pre_attn_scalar=24, sliding_window=5,
                                        attn_logit_softcapping=0.02, final_logit_softcapping=0.2,
                                        tie_word_embeddings=True)
        return transformers.Gemma2ForCausalLM(cfg)
    if family == "gemma3_text":  # gemma2's norms and scalar, plus per-head (1 + w) q/k norms; layer 0
        # slides over 5 keys rotating by rope_local_base_freq 50, layer 1 is full (pattern 2) rotating
        # by rope_theta 1000 with linear scaling; logits capped, scores not (Gemma 3 never caps them)
        cfg = transformers.Gemma3TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=16, max_position_embeddings=64, rope_theta=1000.0,
                                            rope_local_base_freq=50.0,
                                            rope_scaling={"rope_type": "linear", "factor": 2.0},
                                            rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                                            query_pre_attn_scalar=24, sliding_window=5, sliding_window_pattern=2,
                                            final_logit_softcapping=0.2, tie_word_embeddings=True)
        return transformers.Gemma3ForCausalLM(cfg)
    if family in ("phi3", "phi3_short"):  # fused qkv_proj and gate_up_proj, half of each head rotated,
        # LongRoPE (16 tokens past the original 8 positions: the long factors, attention factor sqrt(2);
        # phi3_short: within the original 32, the short factors), every layer sliding over 5 keys
        original = 8 if family == "phi3" else 32
        cfg = transformers.Phi3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, original_max_position_embeddings=original,
                                      rope_theta=10000.0, rms_norm_eps=1e-5, partial_rotary_factor=0.5,
                                      rope_scaling={"type": "longrope", "short_factor": [1.0, 1.5],
                                                    "long_factor": [2.0, 5.0]},
                                      sliding_window=5, pad_token_id=0, tie_word_embeddings=False)
        return transformers.Phi3ForCausalLM(cfg)
    # Mixtures of 4 experts, 2 per token: every expert serves some of the 32 tokens.
    if family == "mixtral":  # w1/w2/w3 experts, top 2 renormalized, every layer sliding over 5 keys
        cfg = transformers.MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64, rms_norm_eps=1e-5, sliding_window=5,
                                         num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)
        return transformers.MixtralForCausalLM(cfg)
    if family == "qwen2_moe":  # q/k/v biases, top 2 not renormalized, a sigmoid-gated shared expert;
        # layer 1 is a dense MLP (mlp_only_layers)
        cfg = transformers.Qwen2MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=64, rms_norm_eps=1e-6, num_experts=4,
                                          num_experts_per_tok=2, moe_intermediate_size=24,
                                          shared_expert_intermediate_size=40, norm_topk_prob=False,
                                          mlp_only_layers=[1], tie_word_embeddings=False)
        return transformers.Qwen2MoeForCausalLM(cfg)
    if family == "qwen3_moe":  # per-head q/k norms, head_dim 16, top 2 renormalized; experts every
        # second layer (decoder_sparse_step 2: layer 0 dense, layer 1 experts)
        cfg = transformers.Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6,
                                          num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                          norm_topk_prob=True, decoder_sparse_step=2, tie_word_embeddings=False)
        return transformers.Qwen3MoeForCausalLM(cfg)
    if family == "olmoe":  # q/k norms over all heads, q/k/v clamped to 1.0, top 2 not renormalized
        cfg = transformers.OlmoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=24,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                       max_position_embeddings=64, rms_norm_eps=1e-5, clip_qkv=1.0,
                                       num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)
        return transformers.OlmoeForCausalLM(cfg)
    if family == "rwkv":
        cfg = transformers.RwkvConfig(vocab_size=VOCAB, context_length=64, hidden_size=32, num_hidden_layers=2,
                                      attention_hidden_size=32, intermediate_size=128, layer_norm_epsilon=1e-5,
                                      rescale_every=0, tie_word_embeddings=False)
        return transformers.RwkvForCausalLM(cfg)
    raise SystemExit(f"unknown family {family}")


# Two rows of 16 tokens: examples of 7, 6 and 3 tokens, and of 10 and 6.
PACKED_LENGTHS = [[7, 6, 3], [10, 6]]


# The load-balancing loss's batch ("aux"): row 1 ends with 3 tokens of padding.
AUX_COEF = 0.05
AUX_PADDING = 3


def main(family: str, out: pathlib.Path, mode: str) -> None:
    packed, aux = mode == "packed", mode == "aux"
    torch.manual_seed(0)
    model = build(family)
    if aux:  # the routers' load-balancing loss joins the loss
        model.config.output_router_logits = True
        model.config.router_aux_loss_coef = AUX_COEF
        model.router_aux_loss_coef = AUX_COEF
    model.config._attn_implementation = "eager"
    model.train()
    with torch.no_grad():  # make norms and biases non-trivial
        for name, p in model.named_parameters():
            if "ln" in name or "norm" in name or name.endswith("bias") or "time_" in name:
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight"):
                p.normal_(0.0, 1.0)  # routers far from uniform: no near-ties in the top k
    params = dict(model.named_parameters())  # a tied lm_head.weight is listed once
    save_file({k: v.detach().contiguous() for k, v in params.items()}, str(out / "model.safetensors"))
    model.config.to_json_file(str(out / "config.json"))

    tokens = torch.randint(0, VOCAB, (2, 16))
    targets = torch.randint(0, VOCAB, (2, 16))
    if packed:
        positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in PACKED_LENGTHS])
        logits = model(tokens, position_ids=positions, use_cache=False).logits
    elif aux:
        # transformers leaves padding out of the load-balancing loss through
        # attention_mask; its targets are ignored.
        mask = torch.ones_like(tokens)
        mask[1, -AUX_PADDING:] = 0
        targets[1, -AUX_PADDING:] = -100
        result = model(tokens, attention_mask=mask)
        logits = result.logits
    else:
        logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    if aux:
        loss = loss + AUX_COEF * result.aux_loss
    loss.backward()
    ref = {"tokens": tokens, "targets": targets, "logits": logits.detach().contiguous(),
           "loss": loss.detach().reshape(1)}
    if packed:
        ref["positions"] = positions
    if aux:
        ref["attention_mask"] = mask
        ref["aux_loss"] = result.aux_loss.detach().reshape(1)
    for k, p in params.items():
        ref["grad." + k] = p.grad.contiguous()
    save_file(ref, str(out / "reference.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
