// Host services: memory, batches, passes, the optimizer, snapshots, state I/O, tensor files.
// Each catches every exception (serve) so none crosses the ABI.
#include <nlohmann/json.hpp>

#include "cross_entropy.hpp"
#include "host_api_services.hpp"
#include "host_reads.hpp"
#include "json_input.hpp"
#include "safetensors.hpp"

namespace tightfit::host_services {

tf_status h_memory_stats(tf_host_context* ctx, tf_memory_stats* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_memory_stats");
    const MemorySnapshot s = MemoryAccounting::instance().snapshot();
    tf_memory_stats m{};
    for (int i = 0; i < TF_MEM_CATEGORY_COUNT; ++i) {
      m.current[i] = s.current[i];
      m.peak[i] = s.peak[i];
    }
    m.total_current = s.total_current;
    m.total_peak = s.total_peak;
    m.budget = s.budget;
    write_struct(out, m);
  });
}
// The category stack is per thread, so these two serve a plugin's own
// threads too; they touch nothing of ctx there.
tf_status h_memory_push_category(tf_host_context* ctx, tf_mem_category c) {
  if (ctx == nullptr || c < 0 || c >= TF_MEM_CATEGORY_COUNT) return TF_ERR_INVALID_ARGUMENT;
  try {
    push_category(c);
    return TF_OK;
  } catch (...) {
    return TF_ERROR;
  }
}
tf_status h_memory_pop_category(tf_host_context* ctx) {
  if (ctx == nullptr) return TF_ERR_INVALID_ARGUMENT;
  return pop_category() ? TF_OK : TF_ERR_UNSUPPORTED;  // a pop without a push
}

static bool covers_positions(const tf_batch* b) {
  return b->struct_size >= offsetof(tf_batch, positions) + sizeof(b->positions);
}
static bool covers_pairs(const tf_batch* b) {
  return b->struct_size >= offsetof(tf_batch, pairs) + sizeof(b->pairs);
}
static bool covers_desirable(const tf_batch* b) {
  return b->struct_size >= offsetof(tf_batch, desirable) + sizeof(b->desirable);
}
static bool covers_row_ids(const tf_batch* b) {
  return b->struct_size >= offsetof(tf_batch, row_ids) + sizeof(b->row_ids);
}
bool covers_attention_mask(const tf_batch* b) {
  return b->struct_size >= offsetof(tf_batch, attention_mask) + sizeof(b->attention_mask);
}
static bool covers_answer_first(const tf_batch* b) {
  return b->struct_size >= offsetof(tf_batch, answer_first) + sizeof(b->answer_first);
}
static bool covers_prompts(const tf_batch* b) {
  return b->struct_size >= offsetof(tf_batch, prompts) + sizeof(b->prompts);
}

// A batch handed to a plugin, refused to a caller whose tf_batch cannot
// carry what it holds.
static void write_batch(tf_batch* out, Batcher::Batch b) {
  // Packed rows without their positions would attend across examples.
  if (b.positions.defined() && !covers_positions(out))
    throw std::invalid_argument(
        "the rows are packed ([data] packing = true) and this caller's tf_batch (ABI before "
        "1.3) cannot carry their positions: rebuild the schedule plugin against this "
        "tightfit's plugin_api.h, or set packing = false");
  // Pairs handed on as plain rows would train on the rejected answers.
  if (b.pairs > 0 && !covers_pairs(out))
    throw std::invalid_argument(
        "the data holds preference pairs (chosen/rejected rows) and this caller's tf_batch "
        "(ABI before 1.10) cannot say so: use a preference schedule ([trainer] schedule = "
        "\"dpo\"), or rebuild this one against this tightfit's plugin_api.h");
  // Unpaired rows read as pairs would score KL rows as rejected answers.
  if (b.desirable.defined() && !covers_desirable(out))
    throw std::invalid_argument(
        "the data holds unpaired preference rows (KTO's) and this caller's tf_batch (ABI "
        "before 1.13) cannot carry their labels: use schedule kto, or rebuild this one "
        "against this tightfit's plugin_api.h");
  // Prompts read as examples would be trained as text with no target.
  if (b.prompts > 0 && !covers_prompts(out))
    throw std::invalid_argument(
        "the data holds prompts alone (online RL's) and this caller's tf_batch (ABI before "
        "1.25) cannot say so: use schedule grpo, or rebuild this one against this tightfit's "
        "plugin_api.h");
  tf_batch batch{};
  batch.pairs = b.pairs;
  batch.prompts = b.prompts;
  if (b.tokens.defined()) {
    batch.n_tokens = b.tokens.numel();
    batch.n_targets = count_not_equal(b.targets, kIgnoreIndex);  // on the host: no read
    batch.tokens = give_handle(std::move(b.tokens));
    batch.targets = give_handle(std::move(b.targets));
  }
  if (b.positions.defined()) batch.positions = give_handle(std::move(b.positions));
  if (b.desirable.defined()) batch.desirable = give_handle(std::move(b.desirable));
  // Row ids are an addition a caller too old for them simply does not see.
  if (b.row_ids.defined() && covers_row_ids(out)) batch.row_ids = give_handle(std::move(b.row_ids));
  // A caller too old for the mask hands batches back without it: its
  // passes refuse a model's loss term that would count the padding
  // (run_batch).
  if (b.attention_mask.defined() && covers_attention_mask(out))
    batch.attention_mask = give_handle(std::move(b.attention_mask));
  if (b.answer_first.defined() && covers_answer_first(out))
    batch.answer_first = give_handle(std::move(b.answer_first));
  write_struct(out, batch);
}

tf_status h_next_batch(tf_host_context* ctx, tf_batch* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_batch");
    write_batch(out, ctx->kernel->data->next_batch());
  });
}

tf_status h_preference_rows(tf_host_context* ctx, int64_t first, int64_t count, tf_batch* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_batch");
    write_batch(out, ctx->kernel->data->batcher().preference_rows(first, count));
  });
}

void h_batch_release(tf_host_context*, tf_batch* batch) {
  if (!batch) return;
  release_handle(batch->tokens);
  release_handle(batch->targets);
  batch->tokens = batch->targets = nullptr;
  if (covers_positions(batch)) {
    release_handle(batch->positions);
    batch->positions = nullptr;
  }
  if (covers_desirable(batch)) {
    release_handle(batch->desirable);
    batch->desirable = nullptr;
  }
  if (covers_row_ids(batch)) {
    release_handle(batch->row_ids);
    batch->row_ids = nullptr;
  }
  if (covers_attention_mask(batch)) {
    release_handle(batch->attention_mask);
    batch->attention_mask = nullptr;
  }
  if (covers_answer_first(batch)) {
    release_handle(batch->answer_first);
    batch->answer_first = nullptr;
  }
}

void refuse_pairs_in_a_loss_pass(const tf_batch& b) {
  if (b.prompts > 0)
    throw std::invalid_argument(
        "this batch holds prompts alone, with no answer to train on: a schedule that samples "
        "its own completions (grpo) scores prompt + completion rows it builds, with log-probs "
        "passes");
  if (b.pairs > 0)
    throw std::invalid_argument(
        "this batch holds preference pairs (chosen and rejected answers), and the mean "
        "cross-entropy of a loss pass (forward, forward_backward, run_pass's TF_PASS_LOSS) "
        "would train on the rejected answers too: train preference rows with a preference "
        "schedule ([trainer] schedule = \"dpo\"), which scores them with log-probs passes");
}

// One pass over a batch the caller hands in, read through its struct_size
// (positions past an older caller's struct: not packed).
static PassResult run_batch(tf_host_context* ctx, const tf_batch* in, bool backward,
                            double loss_scale) {
  const tf_batch b = read_struct(in);
  require(b.tokens, "tf_batch.tokens");
  require(b.targets, "tf_batch.targets");
  refuse_pairs_in_a_loss_pass(b);
  PassRows rows{b.positions ? handle_tensor(b.positions) : at::Tensor(),
                b.attention_mask ? handle_tensor(b.attention_mask) : at::Tensor()};
  // An older caller's tf_batch cannot say which tokens pad (ABI 1.16).
  rows.padding_known = covers_attention_mask(in);
  return ctx->kernel->executor->run_pass(handle_tensor(b.tokens), handle_tensor(b.targets),
                                         backward, loss_scale, rows);
}

tf_status h_add_loss_term(tf_host_context* ctx, tf_tensor term) {
  return serve(ctx, [&] {
    require(term, "term");
    if (!ctx->kernel->executor)
      throw std::invalid_argument("add_loss_term: no pass is running (a plan runs none)");
    ctx->kernel->executor->add_loss_term(handle_tensor(term));
  });
}

static void write_pass(tf_pass_result* out, const PassResult& r) {
  tf_pass_result p{};
  p.loss = r.loss;
  p.n_tokens = r.n_tokens;
  p.finite = r.finite ? 1 : 0;
  write_struct(out, p);
}

tf_status h_forward(tf_host_context* ctx, const tf_batch* batch, tf_pass_result* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_pass_result");
    write_pass(out, run_batch(ctx, batch, false, 1.0));
  });
}
tf_status h_forward_backward(tf_host_context* ctx, const tf_batch* batch, double loss_scale,
                             tf_pass_result* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_pass_result");
    write_pass(out, run_batch(ctx, batch, true, loss_scale));
  });
}
tf_status h_zero_grad(tf_host_context* ctx) {
  return serve(ctx, [&] { ctx->kernel->update->zero_grad(); });
}
tf_status h_optimizer_step(tf_host_context* ctx) {
  tf_status inner = TF_OK;
  const tf_status st = serve(ctx, [&] { inner = ctx->kernel->update->optimizer_step(); });
  if (st != TF_OK) return st;
  if (inner == TF_ERR_NON_FINITE)
    ctx->last_error = "a gradient is not finite; the update was skipped";
  return inner;
}
tf_status h_set_lr(tf_host_context* ctx, double lr) {
  return serve(ctx, [&] {
    if (!(lr >= 0)) throw std::invalid_argument("learning rate must be >= 0");
    ctx->kernel->update->optimizer().set_lr(lr);
  });
}
tf_status h_base_lr(tf_host_context* ctx, double* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = ctx->kernel->update->optimizer().config().lr;
  });
}
tf_status h_snapshot_take(tf_host_context* ctx, int32_t with_optimizer, int32_t* out_id) {
  return serve(ctx, [&] {
    require(out_id, "out_id");
    *out_id = ctx->kernel->snapshots->take(with_optimizer != 0);
  });
}
tf_status h_snapshot_restore(tf_host_context* ctx, int32_t id) {
  return serve(ctx, [&] { ctx->kernel->snapshots->restore(id); });
}
tf_status h_snapshot_drop(tf_host_context* ctx, int32_t id) {
  return serve(ctx, [&] { ctx->kernel->snapshots->drop(id); });
}
tf_status h_perturb_params(tf_host_context* ctx, uint64_t seed, double scale) {
  return serve(ctx, [&] { ctx->kernel->snapshots->perturb_params(seed, scale); });
}
tf_status h_log_metric(tf_host_context* ctx, const char* key, double value) {
  return serve(ctx, [&] {
    require(key, "key");
    (*ctx->kernel->step_metrics)[ctx->plugin_name + "." + key] = value;
  });
}

static std::string state_key(tf_host_context* ctx, const char* key) {
  require(key, "key");
  return ctx->state_prefix + key;
}
// A plugin's state in the checkpoint being loaded.
// Read from its file now: a tensor of its own, nothing kept.
static at::Tensor saved_state(tf_host_context* ctx, const char* key, const char* service) {
  if (!ctx->state_in) throw WrongPhase(std::string(service) + " is only allowed inside load_state");
  const std::string full = state_key(ctx, key);
  if (!ctx->state_in->contains(full))
    throw std::out_of_range(std::string("checkpoint has no state \"") + key + "\"");
  return ctx->state_in->read(full);
}
// Written to the checkpoint's file now, so state larger than memory (an
// optimizer's disk tier) streams through.
static void put_state(tf_host_context* ctx, const char* key, const at::Tensor& t,
                      const char* service) {
  if (!ctx->state_out)
    throw WrongPhase(std::string(service) + " is only allowed inside save_state");
  const std::string full = state_key(ctx, key);
  if (ctx->state_out->contains(full))
    throw std::invalid_argument(std::string("state \"") + key + "\" was already saved");
  ctx->state_out->put(full, t);
}
tf_status h_state_put_tensor(tf_host_context* ctx, const char* key, tf_tensor value) {
  return serve(ctx, [&] {
    require(value, "value");
    put_state(ctx, key, handle_tensor(value), "state_put_tensor");
  });
}
tf_status h_state_get_tensor(tf_host_context* ctx, const char* key, tf_tensor* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = give_handle(saved_state(ctx, key, "state_get_tensor"));
  });
}
tf_status h_state_put_double(tf_host_context* ctx, const char* key, double value) {
  return serve(ctx,
               [&] { put_state(ctx, key, at::full({1}, value, at::kDouble), "state_put_double"); });
}
tf_status h_state_get_double(tf_host_context* ctx, const char* key, double* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = saved_state(ctx, key, "state_get_double").item<double>();
  });
}

tf_status h_optimizer_apply(tf_host_context* ctx, const char* name, tf_tensor grad,
                            double grad_scale) {
  return serve(ctx, [&] {
    require(name, "name");
    require(grad, "grad");
    at::NoGradGuard no_grad;
    ctx->kernel->update->optimizer_apply(name, handle_tensor(grad), grad_scale);
  });
}

tf_status h_optimizer_info(tf_host_context* ctx, tf_optimizer_info* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_optimizer_info");
    const Optimizer& o = ctx->kernel->update->optimizer();
    const OptimizerConfig& c = o.config();
    tf_optimizer_info info{};
    info.name = c.name == "sgd" ? "sgd" : "adamw";
    info.lr = o.lr();
    info.beta1 = c.beta1;
    info.beta2 = c.beta2;
    info.eps = c.eps;
    info.weight_decay = c.weight_decay;
    info.momentum = c.momentum;
    info.step = ctx->kernel->update->update_step();
    info.n_state = static_cast<int32_t>(o.slot_names().size());
    write_struct(out, info);
  });
}

tf_status h_set_micro_batch(tf_host_context* ctx, int32_t index, int32_t count) {
  return serve(ctx, [&] { ctx->kernel->update->set_micro_batch(index, count); });
}

tf_status h_micro_batch(tf_host_context* ctx, int32_t* index, int32_t* count) {
  return serve(ctx, [&] {
    require(index, "index");
    require(count, "count");
    *index = ctx->kernel->update->micro_batch_index();
    *count = ctx->kernel->update->micro_batch_count();
  });
}

tf_status h_tensors_save(tf_host_context* ctx, const char* path, int32_t n,
                         const char* const* names, const tf_tensor* tensors,
                         const char* metadata_json) {
  return serve(ctx, [&] {
    require(path, "path");
    if (n < 0) throw std::invalid_argument("n must be >= 0");
    if (n > 0) {
      require(names, "names");
      require(tensors, "tensors");
    }
    std::map<std::string, at::Tensor> out;
    for (int32_t i = 0; i < n; ++i) {
      require(names[i], "names[i]");
      require(tensors[i], "tensors[i]");
      if (!out.emplace(names[i], handle_tensor(tensors[i]).detach().to(at::kCPU)).second)
        throw std::invalid_argument(std::string("tensor name \"") + names[i] + "\" given twice");
    }
    std::map<std::string, std::string> metadata;
    if (metadata_json) {
      const auto j = parse_json(metadata_json, "metadata_json");
      if (!j.is_object()) throw std::invalid_argument("metadata_json is not a JSON object");
      for (const auto& [k, v] : j.items())
        metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
    }
    const std::string tmp = std::string(path) + ".tmp";
    write_safetensors(tmp, out, metadata);
    if (std::rename(tmp.c_str(), path) != 0)
      throw std::runtime_error(std::string("cannot rename ") + tmp + " to " + path + ": " +
                               std::strerror(errno));
  });
}

tf_status h_tensors_load(tf_host_context* ctx, const char* path, const char* name, tf_tensor* out) {
  return serve(ctx, [&] {
    if (path == nullptr) {
      ctx->loaded_path.clear();
      ctx->loaded_tensors.clear();
      return;
    }
    require(name, "name");
    require(out, "out");
    if (ctx->loaded_path != path) {
      ctx->loaded_tensors.clear();
      ctx->loaded_path.clear();
      ctx->loaded_tensors = read_safetensors(path).tensors;
      ctx->loaded_path = path;
    }
    auto it = ctx->loaded_tensors.find(name);
    if (it == ctx->loaded_tensors.end())
      throw std::out_of_range(std::string(path) + " has no tensor \"" + name + "\"");
    *out = give_handle(it->second);
  });
}

tf_status h_optimizer_update(tf_host_context* ctx, const char* name, tf_tensor param,
                             tf_tensor grad, int32_t n_state, const tf_tensor* state) {
  return serve(ctx, [&] {
    require(name, "name");
    require(param, "param");
    require(grad, "grad");
    if (n_state > 0) require(state, "state");
    const Param& p = ctx->kernel->store->get(name);
    std::vector<at::Tensor*> slots;
    for (int32_t i = 0; i < n_state; ++i) {
      require(state[i], "state[i]");
      slots.push_back(&handle_tensor(state[i]));
    }
    UpdateStep& update = *ctx->kernel->update;
    update.optimizer().update_with_state(handle_tensor(param), p.decays(), handle_tensor(grad),
                                         slots, update.take_param_step(p.name));
  });
}

}  // namespace tightfit::host_services
