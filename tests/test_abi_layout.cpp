// The current plugin_api.h held to the frozen ABI 1.0 layout, at compile
// time: every field a 1.0 plugin or host knows sits where 1.0 put it (the
// offsets below were taken from tests/abi/v1.0/tightfit/plugin_api.h on
// x86-64 Linux; later versions only append fields or take reserved slots).
// A change that moves a field fails the build of this test. The enums stay
// 32 bits wide (each has a *_MAX_ENUM of 0x7FFFFFFF).
#include <gtest/gtest.h>

#include <cstddef>

#include "plugin_hooks.hpp"
#include "tightfit/plugin_api.h"

#define TF_FROZEN(type, field, offset)             \
  static_assert(offsetof(type, field) == (offset), \
                #type "." #field " moved from its ABI 1.0 offset")

TF_FROZEN(tf_config_key, struct_size, 0);
TF_FROZEN(tf_config_key, name, 8);
TF_FROZEN(tf_config_key, type, 16);
TF_FROZEN(tf_config_key, default_value, 24);
TF_FROZEN(tf_config_key, doc, 32);
TF_FROZEN(tf_config_key, min_value, 40);
TF_FROZEN(tf_config_key, max_value, 48);
TF_FROZEN(tf_config_key, choices, 56);
TF_FROZEN(tf_param_spec, struct_size, 0);
TF_FROZEN(tf_param_spec, name, 8);
TF_FROZEN(tf_param_spec, ndim, 16);
TF_FROZEN(tf_param_spec, shape, 24);
TF_FROZEN(tf_param_spec, dtype, 32);
TF_FROZEN(tf_param_spec, stage, 36);
TF_FROZEN(tf_param_spec, init, 40);
TF_FROZEN(tf_param_spec, init_std, 48);
TF_FROZEN(tf_param_spec, flags, 56);
TF_FROZEN(tf_param_spec, tied_to, 64);
TF_FROZEN(tf_stage_spec, struct_size, 0);
TF_FROZEN(tf_stage_spec, name, 8);
TF_FROZEN(tf_stage_spec, kind, 16);
TF_FROZEN(tf_stage_spec, activation_bytes_per_token, 24);
TF_FROZEN(tf_stage_spec, flops_per_token, 32);
TF_FROZEN(tf_stage_spec, frozen_activation_bytes_per_token, 40);
TF_FROZEN(tf_stage_spec, output_bytes_per_token, 48);
TF_FROZEN(tf_stage_spec, projection_softcap, 96);
// 1.26: the decode cache per row.
TF_FROZEN(tf_stage_spec, decode_cache_bytes_per_token, 104);
TF_FROZEN(tf_stage_spec, decode_state_bytes, 112);
TF_FROZEN(tf_stage_spec, tiled_flops_per_token, 120);
TF_FROZEN(tf_stage_call, struct_size, 0);
TF_FROZEN(tf_stage_call, stage, 4);
TF_FROZEN(tf_stage_call, training, 8);
TF_FROZEN(tf_stage_call, recompute, 12);
TF_FROZEN(tf_stage_call, step, 16);
TF_FROZEN(tf_run_info, struct_size, 0);
TF_FROZEN(tf_run_info, device, 8);
TF_FROZEN(tf_run_info, rank, 16);
TF_FROZEN(tf_run_info, world_size, 20);
TF_FROZEN(tf_run_info, local_rank, 24);
TF_FROZEN(tf_run_info, vocab_size, 32);
TF_FROZEN(tf_run_info, seq_len, 40);
TF_FROZEN(tf_run_info, batch_size, 48);
TF_FROZEN(tf_run_info, total_steps, 56);
TF_FROZEN(tf_run_info, seed, 64);
TF_FROZEN(tf_run_info, run_dir, 72);
TF_FROZEN(tf_run_info, dry_run, 80);
TF_FROZEN(tf_run_info, model_source, 88);
TF_FROZEN(tf_run_info, mlp_tile_tokens, 96);  // 1.29
TF_FROZEN(tf_param_plan, struct_size, 0);
TF_FROZEN(tf_param_plan, bytes, 8);
TF_FROZEN(tf_param_plan, format, 16);
TF_FROZEN(tf_param_plan, tier, 20);
TF_FROZEN(tf_param_info, struct_size, 0);
TF_FROZEN(tf_param_info, name, 8);
TF_FROZEN(tf_param_info, ndim, 16);
TF_FROZEN(tf_param_info, shape, 24);
TF_FROZEN(tf_param_info, dtype, 88);
TF_FROZEN(tf_param_info, stage, 92);
TF_FROZEN(tf_param_info, flags, 96);
TF_FROZEN(tf_param_info, trainable, 100);
TF_FROZEN(tf_param_info, format, 104);
TF_FROZEN(tf_param_info, residency, 108);
TF_FROZEN(tf_param_info, numel, 112);
TF_FROZEN(tf_param_info, stored_bytes, 120);
TF_FROZEN(tf_stage_info, struct_size, 0);
TF_FROZEN(tf_stage_info, name, 8);
TF_FROZEN(tf_stage_info, kind, 16);
TF_FROZEN(tf_stage_info, recompute, 20);
TF_FROZEN(tf_stage_info, skip, 24);
TF_FROZEN(tf_stage_info, trainable, 28);
TF_FROZEN(tf_stage_info, device, 32);
TF_FROZEN(tf_stage_info, activation_bytes_per_token, 40);
TF_FROZEN(tf_stage_info, flops_per_token, 48);
TF_FROZEN(tf_stage_info, n_params, 56);
TF_FROZEN(tf_memory_stats, struct_size, 0);
TF_FROZEN(tf_memory_stats, current, 8);
TF_FROZEN(tf_memory_stats, peak, 72);
TF_FROZEN(tf_memory_stats, total_current, 136);
TF_FROZEN(tf_memory_stats, total_peak, 144);
TF_FROZEN(tf_memory_stats, budget, 152);
TF_FROZEN(tf_batch, struct_size, 0);
TF_FROZEN(tf_batch, tokens, 8);
TF_FROZEN(tf_batch, targets, 16);
TF_FROZEN(tf_batch, n_tokens, 24);
// Its tail as the minors added it (1.3, 1.7).
TF_FROZEN(tf_batch, positions, 32);
TF_FROZEN(tf_batch, n_targets, 40);
TF_FROZEN(tf_batch, pairs, 48);
TF_FROZEN(tf_pass_result, struct_size, 0);
TF_FROZEN(tf_pass_result, loss, 8);
TF_FROZEN(tf_pass_result, n_tokens, 16);
TF_FROZEN(tf_pass_result, finite, 24);
TF_FROZEN(tf_step_result, struct_size, 0);
TF_FROZEN(tf_step_result, loss, 8);
TF_FROZEN(tf_step_result, n_tokens, 16);
TF_FROZEN(tf_step_result, backward_passes, 24);
TF_FROZEN(tf_step_result, forward_passes, 28);
TF_FROZEN(tf_step_result, lr, 32);
TF_FROZEN(tf_step_result, phase, 40);
TF_FROZEN(tf_optimizer_info, struct_size, 0);
TF_FROZEN(tf_optimizer_info, name, 8);
TF_FROZEN(tf_optimizer_info, lr, 16);
TF_FROZEN(tf_optimizer_info, momentum, 56);
TF_FROZEN(tf_optimizer_info, step, 64);
TF_FROZEN(tf_optimizer_info, n_state, 72);
TF_FROZEN(tf_stage_event, struct_size, 0);
TF_FROZEN(tf_stage_event, stage, 4);
TF_FROZEN(tf_stage_event, phase, 8);
TF_FROZEN(tf_stage_event, begin, 12);
TF_FROZEN(tf_stage_event, step, 16);
TF_FROZEN(tf_model_summary, struct_size, 0);
TF_FROZEN(tf_model_summary, n_params, 8);
TF_FROZEN(tf_model_summary, n_trainable, 16);
TF_FROZEN(tf_model_summary, param_bytes, 24);
TF_FROZEN(tf_model_summary, n_stages, 32);
TF_FROZEN(tf_model_summary, batch_size, 40);
TF_FROZEN(tf_model_summary, seq_len, 48);
TF_FROZEN(tf_model_summary, activation_bytes, 56);
TF_FROZEN(tf_model_summary, logits_tokens, 64);
// 1.26: the decode cache, the vocabulary, the longest prompt.
TF_FROZEN(tf_model_summary, decode_cache_bytes_per_token, 72);
TF_FROZEN(tf_model_summary, decode_state_bytes, 80);
TF_FROZEN(tf_model_summary, vocab_size, 88);
TF_FROZEN(tf_model_summary, prompt_tokens, 96);
TF_FROZEN(tf_memory_estimate, struct_size, 0);
TF_FROZEN(tf_memory_estimate, delta_bytes, 8);
TF_FROZEN(tf_memory_estimate, time_factor, 264);
TF_FROZEN(tf_memory_estimate, grads_in_forward, 272);
// Its tail, field by field as the minors added them (1.1, 1.4, 1.5, 1.6).
TF_FROZEN(tf_memory_estimate, update_bytes, 280);
TF_FROZEN(tf_memory_estimate, recompute_inputs_tier, 288);
TF_FROZEN(tf_memory_estimate, time_from_plan, 292);
TF_FROZEN(tf_memory_estimate, forward_bytes, 296);
TF_FROZEN(tf_memory_estimate, block_bytes, 304);
TF_FROZEN(tf_memory_estimate, autocast_compute, 312);
TF_FROZEN(tf_memory_estimate, prefetch_stages, 316);
TF_FROZEN(tf_memory_estimate, micro_batches, 320);
TF_FROZEN(tf_memory_estimate, rank_exchange, 324);
// 1.26: the training pass's and the generation's shape.
TF_FROZEN(tf_memory_estimate, pass_rows, 328);
TF_FROZEN(tf_memory_estimate, pass_seq_len, 336);
TF_FROZEN(tf_memory_estimate, generate_rows, 344);
TF_FROZEN(tf_memory_estimate, generate_new_tokens, 352);
TF_FROZEN(tf_memory_estimate, generate_prompts, 360);  // 1.27
TF_FROZEN(tf_host_api, struct_size, 0);
TF_FROZEN(tf_host_api, abi_version, 4);
TF_FROZEN(tf_host_api, libtorch_version, 8);
TF_FROZEN(tf_host_api, set_error, 16);
TF_FROZEN(tf_host_api, last_error, 24);
TF_FROZEN(tf_host_api, log, 32);
TF_FROZEN(tf_host_api, config_get_bool, 40);
TF_FROZEN(tf_host_api, config_get_int, 48);
TF_FROZEN(tf_host_api, config_get_double, 56);
TF_FROZEN(tf_host_api, config_get_string, 64);
TF_FROZEN(tf_host_api, config_get_list_string, 72);
TF_FROZEN(tf_host_api, config_get_list_int, 80);
TF_FROZEN(tf_host_api, config_has, 88);
TF_FROZEN(tf_host_api, run_info, 96);
TF_FROZEN(tf_host_api, tensor_release, 104);
TF_FROZEN(tf_host_api, declare_param, 112);
TF_FROZEN(tf_host_api, declare_stage, 120);
TF_FROZEN(tf_host_api, weight, 128);
TF_FROZEN(tf_host_api, linear, 136);
TF_FROZEN(tf_host_api, param_count, 144);
TF_FROZEN(tf_host_api, param_name, 152);
TF_FROZEN(tf_host_api, param_info, 160);
TF_FROZEN(tf_host_api, param_storage, 168);
TF_FROZEN(tf_host_api, param_set_storage, 176);
TF_FROZEN(tf_host_api, param_set_trainable, 184);
TF_FROZEN(tf_host_api, param_grad, 192);
TF_FROZEN(tf_host_api, param_add_, 200);
TF_FROZEN(tf_host_api, stage_count, 208);
TF_FROZEN(tf_host_api, stage_info, 216);
TF_FROZEN(tf_host_api, stage_set_recompute, 224);
TF_FROZEN(tf_host_api, stage_set_device, 232);
TF_FROZEN(tf_host_api, stage_set_skip, 240);
TF_FROZEN(tf_host_api, stage_set_trainable, 248);
TF_FROZEN(tf_host_api, memory_stats, 256);
TF_FROZEN(tf_host_api, memory_push_category, 264);
TF_FROZEN(tf_host_api, memory_pop_category, 272);
TF_FROZEN(tf_host_api, next_batch, 280);
TF_FROZEN(tf_host_api, batch_release, 288);
TF_FROZEN(tf_host_api, forward, 296);
TF_FROZEN(tf_host_api, forward_backward, 304);
TF_FROZEN(tf_host_api, zero_grad, 312);
TF_FROZEN(tf_host_api, optimizer_step, 320);
TF_FROZEN(tf_host_api, set_lr, 328);
TF_FROZEN(tf_host_api, base_lr, 336);
TF_FROZEN(tf_host_api, snapshot_take, 344);
TF_FROZEN(tf_host_api, snapshot_restore, 352);
TF_FROZEN(tf_host_api, snapshot_drop, 360);
TF_FROZEN(tf_host_api, perturb_params, 368);
TF_FROZEN(tf_host_api, log_metric, 376);
TF_FROZEN(tf_host_api, state_put_tensor, 384);
TF_FROZEN(tf_host_api, state_get_tensor, 392);
TF_FROZEN(tf_host_api, state_put_double, 400);
TF_FROZEN(tf_host_api, state_get_double, 408);
TF_FROZEN(tf_host_api, optimizer_apply, 416);
TF_FROZEN(tf_host_api, optimizer_info, 424);
TF_FROZEN(tf_host_api, set_micro_batch, 432);
TF_FROZEN(tf_host_api, micro_batch, 440);
TF_FROZEN(tf_host_api, tensors_save, 448);
TF_FROZEN(tf_host_api, tensors_load, 456);
TF_FROZEN(tf_host_api, optimizer_update, 464);
TF_FROZEN(tf_host_api, dist_all_reduce, 472);
TF_FROZEN(tf_host_api, dist_reduce_scatter, 480);
TF_FROZEN(tf_host_api, dist_all_gather, 488);
TF_FROZEN(tf_host_api, dist_broadcast, 496);
TF_FROZEN(tf_host_api, dist_barrier, 504);
TF_FROZEN(tf_host_api, plan_param_get, 512);
TF_FROZEN(tf_host_api, plan_param_set, 520);
TF_FROZEN(tf_host_api, param_source_blocks, 528);
TF_FROZEN(tf_host_api, blocks_decode, 536);
TF_FROZEN(tf_host_api, sequence_logps, 544);
TF_FROZEN(tf_host_api, adapters_set_enabled, 552);
TF_FROZEN(tf_host_api, token_logps, 560);
TF_FROZEN(tf_host_api, preference_rows, 568);
TF_FROZEN(tf_host_api, add_loss_term, 576);
TF_FROZEN(tf_host_api, expect_weights, 584);
TF_FROZEN(tf_host_api, take_loss_terms, 592);
TF_FROZEN(tf_host_api, declare_param_copies, 600);
TF_FROZEN(tf_host_api, use_param_copies, 608);
TF_FROZEN(tf_host_api, take_mean_logits, 616);
TF_FROZEN(tf_host_api, run_pass, 624);
TF_FROZEN(tf_host_api, read_later, 632);
TF_FROZEN(tf_host_api, progress, 640);
TF_FROZEN(tf_host_api, declare_kept_param_copies, 648);
TF_FROZEN(tf_host_api, generate, 656);  // 1.25
TF_FROZEN(tf_host_api, score_rewards, 664);
TF_FROZEN(tf_host_api, score_texts, 672);        // 1.28, the last reserved slot
TF_FROZEN(tf_host_api, tiled_over_tokens, 680);  // 1.29, appended
static_assert(sizeof(tf_host_api) == 688, "tf_host_api grows only by appending services");
TF_FROZEN(tf_model_vtable, struct_size, 0);
TF_FROZEN(tf_model_vtable, create, 8);
TF_FROZEN(tf_model_vtable, destroy, 16);
TF_FROZEN(tf_model_vtable, stage_forward, 24);
TF_FROZEN(tf_model_vtable, hf_config_json, 32);
TF_FROZEN(tf_model_vtable, decode, 40);
TF_FROZEN(tf_model_vtable, release_cache, 48);
TF_FROZEN(tf_model_vtable, decode_rows, 72);  // 1.27, the first reserved slot of 1.3
TF_FROZEN(tf_strategy_vtable, struct_size, 0);
TF_FROZEN(tf_strategy_vtable, create, 8);
TF_FROZEN(tf_strategy_vtable, destroy, 16);
TF_FROZEN(tf_strategy_vtable, configure, 24);
TF_FROZEN(tf_strategy_vtable, params_ready, 32);
TF_FROZEN(tf_strategy_vtable, step_begin, 40);
TF_FROZEN(tf_strategy_vtable, step_end, 48);
TF_FROZEN(tf_strategy_vtable, stage_event, 56);
TF_FROZEN(tf_strategy_vtable, fetch_weight, 64);
TF_FROZEN(tf_strategy_vtable, release_weight, 72);
TF_FROZEN(tf_strategy_vtable, linear_extend, 80);
TF_FROZEN(tf_strategy_vtable, grad_ready, 88);
TF_FROZEN(tf_strategy_vtable, optimizer_step_param, 96);
TF_FROZEN(tf_strategy_vtable, estimate_memory, 104);
TF_FROZEN(tf_strategy_vtable, save_state, 112);
TF_FROZEN(tf_strategy_vtable, load_state, 120);
TF_FROZEN(tf_strategy_vtable, export_weight, 128);
TF_FROZEN(tf_strategy_vtable, export_adapter, 136);
TF_FROZEN(tf_strategy_vtable, loss_scale, 144);
TF_FROZEN(tf_strategy_vtable, loss_scale_update, 152);
TF_FROZEN(tf_strategy_vtable, stage_params_ready, 160);
TF_FROZEN(tf_strategy_vtable, pack_activation, 168);
TF_FROZEN(tf_strategy_vtable, unpack_activation, 176);
TF_FROZEN(tf_strategy_vtable, grad_norm_sq, 184);
TF_FROZEN(tf_strategy_vtable, apply_held_grads, 192);
TF_FROZEN(tf_strategy_vtable, drop_held_grads, 200);
TF_FROZEN(tf_strategy_vtable, set_adapters_enabled, 208);
TF_FROZEN(tf_strategy_vtable, want_weight, 216);
TF_FROZEN(tf_schedule_vtable, struct_size, 0);
TF_FROZEN(tf_schedule_vtable, create, 8);
TF_FROZEN(tf_schedule_vtable, destroy, 16);
TF_FROZEN(tf_schedule_vtable, run_step, 24);
TF_FROZEN(tf_schedule_vtable, estimate_memory, 32);
TF_FROZEN(tf_schedule_vtable, save_state, 40);
TF_FROZEN(tf_schedule_vtable, load_state, 48);
TF_FROZEN(tf_schedule_vtable, eval_batch, 56);
TF_FROZEN(tf_schedule_vtable, preference_tokenization, 64);
TF_FROZEN(tf_schedule_vtable, features, 72);  // 1.25
TF_FROZEN(tf_batch, prompts, 88);
TF_FROZEN(tf_reward_vtable, score, 24);
TF_FROZEN(tf_reward_batch, prompts, 24);
TF_FROZEN(tf_generate_request, n_stop_ids, 72);
TF_FROZEN(tf_generate_request, repetition_penalty, 80);  // 1.26
TF_FROZEN(tf_generate_request, min_p, 88);               // 1.26
TF_FROZEN(tf_generate_request, n_prompts, 96);           // 1.27
TF_FROZEN(tf_generate_request, prompt_lengths, 104);     // 1.27
TF_FROZEN(tf_generate_request, prompt_seeds, 112);       // 1.27
TF_FROZEN(tf_score_texts_request, texts, 24);            // 1.28
TF_FROZEN(tf_score_texts_request, batch_rows, 40);
TF_FROZEN(tf_score_texts_result, positions, 32);
TF_FROZEN(tf_plugin_descriptor, struct_size, 0);
TF_FROZEN(tf_plugin_descriptor, abi_version, 4);
TF_FROZEN(tf_plugin_descriptor, kind, 8);
TF_FROZEN(tf_plugin_descriptor, name, 16);
TF_FROZEN(tf_plugin_descriptor, version, 24);
TF_FROZEN(tf_plugin_descriptor, description, 32);
TF_FROZEN(tf_plugin_descriptor, libtorch_version, 40);
TF_FROZEN(tf_plugin_descriptor, flags, 48);
TF_FROZEN(tf_plugin_descriptor, config_keys, 56);
TF_FROZEN(tf_plugin_descriptor, n_config_keys, 64);
TF_FROZEN(tf_plugin_descriptor, vtable, 72);
TF_FROZEN(tf_host_offer, struct_size, 0);
TF_FROZEN(tf_host_offer, abi_version, 4);
TF_FROZEN(tf_host_offer, libtorch_version, 8);

static_assert(sizeof(tf_status) == 4 && sizeof(tf_plugin_kind) == 4 && sizeof(tf_dtype) == 4 &&
              sizeof(tf_mem_category) == 4 && sizeof(tf_residency) == 4 &&
              sizeof(tf_param_format) == 4 && sizeof(tf_value_type) == 4 &&
              sizeof(tf_stage_kind) == 4 && sizeof(tf_init_kind) == 4 &&
              sizeof(tf_reduce_op) == 4 && sizeof(tf_pass_phase) == 4 && sizeof(tf_log_level) == 4);

// The kernel's hook lists (kernel/plugins/plugin_hooks.hpp), which name hooks for
// `plugins check` and for the calls, hold every slot of each vtable in the
// header's order: each listed hook directly after the one before it, the
// first after destroy, the last before the vtable's next field.
#define TF_STRATEGY_OFFSET(name) offsetof(tf_strategy_vtable, name),
#define TF_MODEL_OFFSET(name) offsetof(tf_model_vtable, name),
#define TF_SCHEDULE_OFFSET(name) offsetof(tf_schedule_vtable, name),
template <size_t N>
constexpr bool one_slot_after_another(const size_t (&offsets)[N], size_t first, size_t next) {
  if (offsets[0] != first || offsets[N - 1] + sizeof(void*) != next) return false;
  for (size_t i = 1; i < N; ++i)
    if (offsets[i] != offsets[i - 1] + sizeof(void*)) return false;
  return true;
}
constexpr size_t kStrategyHooks[] = {TF_STRATEGY_HOOKS(TF_STRATEGY_OFFSET)};
constexpr size_t kModelHooks[] = {TF_MODEL_HOOKS(TF_MODEL_OFFSET)};
constexpr size_t kScheduleHooks[] = {TF_SCHEDULE_HOOKS(TF_SCHEDULE_OFFSET)};
constexpr size_t kModelLaterHooks[] = {TF_MODEL_LATER_HOOKS(TF_MODEL_OFFSET)};
static_assert(one_slot_after_another(kStrategyHooks,
                                     offsetof(tf_strategy_vtable, destroy) + sizeof(void*),
                                     offsetof(tf_strategy_vtable, reserved)),
              "TF_STRATEGY_HOOKS must list every hook of tf_strategy_vtable, in order");
static_assert(one_slot_after_another(kModelHooks,
                                     offsetof(tf_model_vtable, destroy) + sizeof(void*),
                                     offsetof(tf_model_vtable, hf_model_types)),
              "TF_MODEL_HOOKS must list every hook of tf_model_vtable, in order");
static_assert(one_slot_after_another(kModelLaterHooks,
                                     offsetof(tf_model_vtable, features) + sizeof(void*),
                                     offsetof(tf_model_vtable, reserved)),
              "TF_MODEL_LATER_HOOKS must list the hooks after tf_model_vtable's data fields");
static_assert(one_slot_after_another(kScheduleHooks,
                                     offsetof(tf_schedule_vtable, destroy) + sizeof(void*),
                                     offsetof(tf_schedule_vtable, preference_tokenization)),
              "TF_SCHEDULE_HOOKS must list every hook of tf_schedule_vtable, in order");

// And the check itself refuses a list with a slot left out.
TEST(AbiLayout, TheHookListCheckRefusesAGap) {
  constexpr size_t gap[] = {24, 32, 48};
  static_assert(!one_slot_after_another(gap, 24, 56));
  constexpr size_t whole[] = {24, 32, 40, 48};
  static_assert(one_slot_after_another(whole, 24, 56));
  EXPECT_EQ(sizeof(kStrategyHooks) / sizeof(size_t), 26u);  // expect_weight (1.17) the 26th
}

// The static_asserts above are the test; this one only makes the binary
// report that they held, and checks the one runtime fact they cannot: a
// plugin built against 1.0 reports a struct_size the host accepts.
TEST(AbiLayout, CurrentHeaderKeepsTheFrozenOneZeroLayout) {
  EXPECT_GE(sizeof(tf_strategy_vtable), offsetof(tf_strategy_vtable, reserved));
  EXPECT_EQ(TF_ABI_VERSION_MAJOR, 1);
}
