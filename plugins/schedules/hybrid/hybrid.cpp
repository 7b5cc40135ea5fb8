// The hybrid schedule (the field notes' HybridTrainer): steps whose weight
// update a learned dynamics model can predict skip their backward pass.
//
//   warmup   full steps (forward, backward, update) while early training settles
//   full     full steps that also fit the dynamics model (dynamics_model.hpp)
//   predict  one forward pass (the loss, for the guard) and the predicted
//            update; no backward, no gradients, no optimizer step
//   correct  a full step every `correction_interval` predicted steps (and at
//            the end of a run): the real gradient at the extrapolated weights
//            corrects them, and its update measures the prediction's error
//
// A predict run starts after `full_steps` full steps once the model's
// confidence is at least `confidence`; it lasts at most `max_predict_steps`
// predicted steps and ends early when a correction finds the confidence
// below the threshold. The kernel snapshots the weights at the start of a
// run and after each correction (the last good weights). The divergence
// guard: a loss that is not finite or above divergence_factor x the recent
// full steps' mean restores that snapshot, returns to full steps and makes
// the model earn its confidence again. A predicted step's loss above the
// full steps' trend (3 residual spreads) brings the next correction forward.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "dynamics_model.hpp"
#include "loss_watch.hpp"
#include "tightfit/lr_schedule.hpp"

namespace {

using tf_hybrid::DynamicsModel;
using tf_hybrid::GroupState;
using tf_hybrid::LossWatch;

struct Settings {
  double confidence = 0.60;
  int64_t max_predict_steps = 50;
  int64_t correction_interval = 15;
  int64_t warmup_full_steps = 100;
  int64_t full_steps = 20;
  double divergence_factor = 1.5;
  int64_t inject_divergence_at = 0;
};

// The field notes' two configurations (confidence, horizon, correction interval).
struct Preset {
  const char* name;
  double confidence;
  int64_t max_predict_steps;
  int64_t correction_interval;
};
constexpr Preset kPresets[] = {{"conservative", 0.60, 50, 15}, {"aggressive", 0.55, 75, 10}};

struct Hybrid {
  tf_sdk::Host host;
  tf_sdk::LrSchedule lr;
  Settings cfg;
  DynamicsModel model;
  LossWatch losses;
  int64_t skipped = 0;  // non-finite gradients (step_or_skip)
  // The phase machine.
  int64_t full_left = 0;  // full steps owed before the next predict run
  bool predicting = false;
  int64_t run_predicted = 0;  // predicted steps in this run
  int64_t since_correct = 0;  // predicted steps since the run began or was corrected
  int32_t snapshot = -1;      // the last good weights while predicting
  bool injected = false;
  // What it reports.
  int64_t steps = 0, predicted = 0, divergences = 0, early_corrections = 0;
};

Settings read_settings(const tf_sdk::Host& host) {
  Settings c;
  const std::string preset = host.get_string("preset");
  for (const Preset& p : kPresets)
    if (preset == p.name) {
      c.confidence = p.confidence;
      c.max_predict_steps = p.max_predict_steps;
      c.correction_interval = p.correction_interval;
    }
  // Keys the recipe sets override the preset.
  if (host.has("confidence")) c.confidence = host.get_double("confidence");
  if (host.has("max_predict_steps")) c.max_predict_steps = host.get_int("max_predict_steps");
  if (host.has("correction_interval")) c.correction_interval = host.get_int("correction_interval");
  c.warmup_full_steps = host.get_int("warmup_full_steps");
  c.full_steps = host.get_int("full_steps");
  c.divergence_factor = host.get_double("divergence_factor");
  c.inject_divergence_at = host.get_int("inject_divergence_at");
  return c;
}

tf_status create(const tf_host_api* api, tf_host_context* ctx, void** out) {
  return tf_sdk::guard(api, ctx, [&] {
    tf_sdk::Host host(api, ctx);
    auto s = std::make_unique<Hybrid>(
        Hybrid{host, tf_sdk::LrSchedule::read(host), read_settings(host),
               DynamicsModel(host.get_double("history_decay"), host.get_double("fit_decay")),
               LossWatch(static_cast<size_t>(host.get_int("loss_window")))});
    *out = s.release();
    return TF_OK;
  });
}

// The trainable, dense parameters this step, with their stored tensors.
struct Trainable {
  std::string name;
  at::Tensor weights;
};
std::vector<Trainable> trainable(const tf_sdk::Host& host) {
  std::vector<Trainable> out;
  for (const std::string& name : host.param_names()) {
    const tf_param_info info = host.param_info(name);
    if (!info.trainable || info.format != TF_FORMAT_DENSE) continue;
    at::Tensor w = host.param_storage(name);
    if (w.numel() != info.numel)
      throw std::invalid_argument(
          "hybrid: parameter \"" + name +
          "\" is stored in part on this rank (ZeRO stage 3); the hybrid schedule predicts whole "
          "tensors: use shard stage 1 or 2 with it");
    out.push_back({name, std::move(w)});
  }
  return out;
}

void log_metric(Hybrid& s, const char* key, double v) {
  s.host.log_metric(key, v);
}

void end_run(Hybrid& s) {
  if (s.snapshot >= 0) s.host.drop_snapshot(s.snapshot);
  s.snapshot = -1;
  s.predicting = false;
  s.full_left = s.cfg.full_steps;
}

void take_snapshot(Hybrid& s) {
  if (s.snapshot >= 0) s.host.drop_snapshot(s.snapshot);
  s.snapshot = s.host.take_snapshot(/*with_optimizer=*/false);
}

// The guard fired: back to the last good weights and to full steps.
void roll_back(Hybrid& s, int64_t step, double loss) {
  if (s.snapshot >= 0) s.host.restore_snapshot(s.snapshot);
  ++s.divergences;
  s.host.log(TF_LOG_WARN, "step " + std::to_string(step + 1) + ": loss " + std::to_string(loss) +
                              " against a recent mean of " + std::to_string(s.losses.mean()) +
                              "; rolled back to the last good weights and back to full steps (" +
                              std::to_string(s.divergences) + " divergences so far)");
  end_run(s);
  s.model.distrust();
}

// A full step; `measure` feeds its update to the dynamics model. `guard`
// (a correction) rolls back instead of updating when the loss diverged.
tf_pass_result full_step(Hybrid& s, int64_t step, double lr, bool measure, bool guard,
                         bool* diverged) {
  // Measured from the weights before the forward pass: a strategy may update
  // them during backward (fused_update).
  std::vector<Trainable> params;
  std::vector<GroupState*> groups;
  if (measure) {
    params = trainable(s.host);
    at::NoGradGuard no_grad;
    tf_sdk::MemoryCategory history(s.host, TF_MEM_OPTIMIZER);  // the model's, like optimizer state
    for (const auto& p : params) {
      GroupState& g = s.model.group(p.name, p.weights);
      DynamicsModel::begin_measure(g, p.weights);
      groups.push_back(&g);
    }
  }
  s.host.zero_grad();
  const tf_pass_result pass = tf_sdk::Batch(s.host).forward_backward(1.0);
  if (guard && s.losses.diverged(pass.loss, s.cfg.divergence_factor)) {
    s.host.zero_grad();
    roll_back(s, step, pass.loss);
    *diverged = true;
    return pass;
  }
  const int64_t skipped_before = s.skipped;
  tf_sdk::step_or_skip(s.host, step, s.skipped);
  if (measure && s.skipped == skipped_before && lr > 0) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> stats;
    for (size_t i = 0; i < params.size(); ++i)
      stats.push_back(s.model.end_measure(*groups[i], params[i].weights, lr));
    if (!stats.empty()) {
      const tf_hybrid::Observation o = s.model.observe(groups, at::stack(stats));
      if (o.measured) log_metric(s, "prediction_error", o.relative_error);
    }
  }
  if (!guard) s.losses.add(step, pass.loss);  // the yardstick: full steps' losses only
  return pass;
}

// A predicted step: the loss at the current weights (forward only), then the
// model's next update; `diverged` when the guard fired.
tf_pass_result predict_step(Hybrid& s, int64_t step, double lr, bool* diverged) {
  const tf_pass_result pass = tf_sdk::Batch(s.host).forward();
  if (s.losses.diverged(pass.loss, s.cfg.divergence_factor)) {
    roll_back(s, step, pass.loss);
    *diverged = true;
    return pass;
  }
  if (s.losses.above_trend(step, pass.loss, 3.0)) {
    s.since_correct = s.cfg.correction_interval;  // correct at the next step
    ++s.early_corrections;
  }
  double scale = lr;
  if (s.cfg.inject_divergence_at > 0 && !s.injected && step + 1 >= s.cfg.inject_divergence_at) {
    // A test's deliberate blow-up, for the guard to catch next step: far
    // along the learned direction can even help early on, so go against it.
    scale *= -1e4;
    s.injected = true;
  }
  at::NoGradGuard no_grad;
  for (const auto& p : trainable(s.host)) {
    GroupState* g = s.model.find(p.name);
    if (!g || g->observed < 2) continue;  // no history yet: no prediction
    s.host.add_to_param(p.name, s.model.predict_next(*g), scale);
  }
  ++s.run_predicted;
  ++s.since_correct;
  ++s.predicted;
  return pass;
}

tf_status run_step(void* state, tf_host_context* ctx, int64_t step, int64_t total,
                   tf_step_result* out) {
  auto* s = static_cast<Hybrid*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    const double lr = s->lr.apply(s->host, step, total);
    const Settings& c = s->cfg;
    // Resumed inside a predict run: the checkpoint's weights are the last good ones.
    if (s->predicting && s->snapshot < 0) take_snapshot(*s);
    bool diverged = false;
    const char* phase = "full";
    tf_pass_result pass{};
    int32_t backward = 1;
    if (step < c.warmup_full_steps) {
      phase = "warmup";
      pass = full_step(*s, step, lr, /*measure=*/false, /*guard=*/false, &diverged);
      if (step + 1 == c.warmup_full_steps) s->full_left = c.full_steps;
    } else if (!s->predicting) {
      if (s->full_left > 0 || !s->model.ready() || s->model.confidence() < c.confidence) {
        pass = full_step(*s, step, lr, true, false, &diverged);
        if (s->full_left > 0) --s->full_left;
      } else {
        s->predicting = true;
        s->run_predicted = 0;
        s->since_correct = 0;
        take_snapshot(*s);
        phase = "predict";
        backward = 0;
        pass = predict_step(*s, step, lr, &diverged);
      }
    } else if (s->run_predicted >= c.max_predict_steps ||
               s->since_correct >= c.correction_interval) {
      phase = "correct";
      const bool last = s->run_predicted >= c.max_predict_steps;
      pass = full_step(*s, step, lr, true, /*guard=*/true, &diverged);
      if (!diverged) {
        if (last || s->model.confidence() < c.confidence) {
          end_run(*s);
        } else {
          s->since_correct = 0;
          take_snapshot(*s);
        }
      }
    } else {
      phase = "predict";
      backward = 0;
      pass = predict_step(*s, step, lr, &diverged);
    }
    ++s->steps;
    log_metric(*s, "confidence", s->model.confidence());
    log_metric(*s, "divergences", static_cast<double>(s->divergences));
    log_metric(*s, "backward_skipped",
               static_cast<double>(s->predicted) / static_cast<double>(s->steps));
    out->loss = pass.loss;
    out->n_tokens = pass.n_tokens;
    out->backward_passes = backward;
    out->forward_passes = 1;
    out->lr = lr;
    out->phase = phase;
    return TF_OK;
  });
}

// The phase machine, the counters, the recent losses and the dynamics
// model's history, so a resumed run predicts what the uninterrupted one would.
tf_status save_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Hybrid*>(state);
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    auto put = [&](const std::string& key, double v) { s->host.save_double(key, v); };
    auto put_tensor = [&](const std::string& key, const at::Tensor& t) {
      s->host.save_tensor(key, t);
    };
    put("skipped", static_cast<double>(s->skipped));
    put("full_left", static_cast<double>(s->full_left));
    put("predicting", s->predicting ? 1 : 0);
    put("run_predicted", static_cast<double>(s->run_predicted));
    put("since_correct", static_cast<double>(s->since_correct));
    put("injected", s->injected ? 1 : 0);
    put("steps", static_cast<double>(s->steps));
    put("predicted", static_cast<double>(s->predicted));
    put("divergences", static_cast<double>(s->divergences));
    put("early_corrections", static_cast<double>(s->early_corrections));
    at::Tensor losses = at::zeros({static_cast<int64_t>(s->losses.size()), 2}, at::kDouble);
    int64_t i = 0;
    for (const auto& [at_step, loss] : s->losses.recent()) {
      losses[i][0] = static_cast<double>(at_step);
      losses[i++][1] = loss;
    }
    put_tensor("losses", losses);
    for (const GroupState& g : s->model.groups()) {
      put_tensor("group." + g.name + ".last", g.last);
      put_tensor("group." + g.name + ".memory", g.memory);
      put_tensor("group." + g.name + ".fit",
                 at::tensor({g.a, g.b, g.confidence, g.energy, static_cast<double>(g.observed),
                             g.s_ll, g.s_lm, g.s_mm, g.s_ul, g.s_um},
                            at::kDouble));
    }
    return TF_OK;
  });
}

tf_status load_state(void* state, tf_host_context* ctx) {
  auto* s = static_cast<Hybrid*>(state);
  const tf_host_api* api = s->host.api();
  return tf_sdk::guard(api, ctx, [&] {
    auto get = [&](const char* key) { return static_cast<int64_t>(s->host.saved_double(key)); };
    auto get_tensor = [&](const std::string& key) { return s->host.saved_tensor(key); };
    s->skipped = get("skipped");
    s->full_left = get("full_left");
    s->predicting = get("predicting") != 0;
    s->run_predicted = get("run_predicted");
    s->since_correct = get("since_correct");
    s->injected = get("injected") != 0;
    s->steps = get("steps");
    s->predicted = get("predicted");
    s->divergences = get("divergences");
    s->early_corrections = get("early_corrections");
    s->snapshot = -1;  // taken again at the next step
    s->losses.clear();
    const at::Tensor losses = get_tensor("losses").to(at::kDouble).contiguous();
    for (int64_t i = 0; i < losses.size(0); ++i)
      s->losses.add(static_cast<int64_t>(losses[i][0].item<double>()), losses[i][1].item<double>());
    for (const Trainable& p : trainable(s->host)) {
      const std::optional<at::Tensor> saved_fit =
          s->host.find_saved_tensor("group." + p.name + ".fit");
      if (!saved_fit) continue;  // not seen yet
      const at::Tensor fit = saved_fit->to(at::kDouble).contiguous();
      const double* f = fit.data_ptr<double>();
      tf_sdk::MemoryCategory history(s->host, TF_MEM_OPTIMIZER);
      GroupState& g = s->model.group(p.name, p.weights);
      g.a = f[0];
      g.b = f[1];
      g.confidence = f[2];
      g.energy = f[3];
      g.observed = static_cast<int64_t>(f[4]);
      g.s_ll = f[5];
      g.s_lm = f[6];
      g.s_mm = f[7];
      g.s_ul = f[8];
      g.s_um = f[9];
      g.last.copy_(get_tensor("group." + p.name + ".last"));
      g.memory.copy_(get_tensor("group." + p.name + ".memory"));
    }
    return TF_OK;
  });
}

// The model's history: three fp32 copies of the trainable weights (last
// update, long memory, a scratch copy); the snapshot of the last good
// weights while predicting. Peak activations and gradients are the full
// steps', unchanged; the time factor assumes the predictor keeps its
// confidence (a full cycle of full_steps, then max_predict_steps predicted
// steps with their corrections, a predicted step costing one forward of a
// full step's three).
tf_status estimate_memory(void* state, tf_host_context* ctx, const tf_model_summary* model,
                          tf_memory_estimate* out) {
  auto* s = static_cast<Hybrid*>(state);
  return tf_sdk::guard(s->host.api(), ctx, [&] {
    out->delta_bytes[TF_TIER_DEVICE][TF_MEM_OPTIMIZER] = 12 * model->n_trainable;
    // The weights before the step, to measure its update: only while it runs.
    if (TF_SDK_REACHES(out, tf_memory_estimate, update_bytes))
      out->update_bytes = 4 * model->n_trainable;
    else
      out->delta_bytes[TF_TIER_DEVICE][TF_MEM_TRANSIENT] = 4 * model->n_trainable;
    const Settings& c = s->cfg;
    const double predicted = static_cast<double>(c.max_predict_steps);
    const double full =
        static_cast<double>(c.full_steps) +
        std::ceil(predicted / static_cast<double>(std::max<int64_t>(1, c.correction_interval)));
    out->time_factor = (full + predicted / 3.0) / (full + predicted);
    return TF_OK;
  });
}

const std::vector<tf_config_key> kKeys = tf_sdk::with_lr_schedule_keys({
    tf_sdk::key("preset", TF_VALUE_STRING, "\"conservative\"",
                "the field notes' settings for confidence, max_predict_steps and "
                "correction_interval: conservative (0.60, 50, 15) or aggressive (0.55, 75, 10); "
                "keys set in the recipe override it",
                1, 0, "conservative|aggressive"),
    tf_sdk::key("confidence", TF_VALUE_FLOAT, "0.60",
                "predict only while the model's confidence (its out-of-sample cosine with the "
                "real updates) is at least this (preset's when not set)",
                -1, 1),
    tf_sdk::key("max_predict_steps", TF_VALUE_INT, "50",
                "predicted steps in one run at most (preset's when not set)", 1, 1e9),
    tf_sdk::key("correction_interval", TF_VALUE_INT, "15",
                "a correcting full step after this many predicted ones (preset's when not set)", 1,
                1e9),
    tf_sdk::key("warmup_full_steps", TF_VALUE_INT, "100",
                "full steps before the dynamics model starts learning", 0, 1e12),
    tf_sdk::key("full_steps", TF_VALUE_INT, "20",
                "full steps that train the model before each predict run", 0, 1e9),
    tf_sdk::key("divergence_factor", TF_VALUE_FLOAT, "1.5",
                "roll back when a loss exceeds this times the recent full steps' mean", 1, 1e6),
    tf_sdk::key("loss_window", TF_VALUE_INT, "20",
                "full steps whose losses make the guard's mean and trend", 2, 1e6),
    tf_sdk::key("history_decay", TF_VALUE_FLOAT, "0.9",
                "beta of the model's long memory of updates (m = beta m + (1 - beta) u)", 0,
                0.9999),
    tf_sdk::key("fit_decay", TF_VALUE_FLOAT, "0.9",
                "forgetting of the least-squares fit and the confidence per measured step", 0,
                0.9999),
    tf_sdk::key("inject_divergence_at", TF_VALUE_INT, "0",
                "testing: the first predicted step at or after this step (1-based) applies -10000x "
                "its update, for the guard to catch; 0 = never",
                0, 1e12),
});

const tf_schedule_vtable kVtable = {.struct_size = sizeof(tf_schedule_vtable),
                                    .create = create,
                                    .destroy = tf_sdk::destroy_state<Hybrid>,
                                    .run_step = run_step,
                                    .estimate_memory = estimate_memory,
                                    .save_state = save_state,
                                    .load_state = load_state};

const tf_plugin_descriptor kDescriptor = tf_sdk::describe(
    TF_PLUGIN_SCHEDULE, "hybrid", "1.0.0",
    "predict/correct: a learned dynamics model predicts weight updates so some steps skip "
    "backward; a divergence guard rolls back",
    kKeys, &kVtable);

}  // namespace

TF_DEFINE_PLUGIN_ENTRY(kDescriptor)
