// Host services: errors, logging, the plugin's recipe table and run facts.
// Each catches every exception (serve) so none crosses the ABI.
#include "host_api_services.hpp"

namespace tightfit::host_services {

// These three return nothing, so a failure inside them (no memory for the
// message, a log sink that throws) is swallowed rather than thrown into C.
void h_set_error(tf_host_context* ctx, const char* message) {
  if (ctx == nullptr || !on_a_host_thread(ctx)) return;
  try {
    ctx->plugin_error = message ? message : "(no message)";
  } catch (...) {
    ctx->plugin_error.clear();
  }
}
// Valid until this context's next service call (the header says so).
const char* h_last_error(tf_host_context* ctx) {
  if (ctx == nullptr || !on_a_host_thread(ctx)) return "";
  return ctx->last_error.c_str();
}
// Safe from a plugin's own threads too.
void h_log(tf_host_context* ctx, tf_log_level level, const char* message) {
  if (ctx == nullptr || ctx->kernel == nullptr) return;
  try {
    ctx->kernel->log(level, "[" + ctx->plugin_name + "] " + (message ? message : ""));
  } catch (...) {  // nowhere to report a failing log
  }
}

tf_status h_config_get_bool(tf_host_context* ctx, const char* key, int32_t* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = ctx->config.get_bool(key) ? 1 : 0;
  });
}
tf_status h_config_get_int(tf_host_context* ctx, const char* key, int64_t* out) {
  return serve(ctx, [&] {
    require(out, "out");
    for (const auto& k : ctx->config.keys())
      if (k.name == key && k.type == TF_VALUE_SIZE) {
        *out = ctx->config.get_size(key);
        return;
      }
    *out = ctx->config.get_int(key);
  });
}
tf_status h_config_get_double(tf_host_context* ctx, const char* key, double* out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = ctx->config.get_double(key);
  });
}

tf_status h_config_get_string(tf_host_context* ctx, const char* key, const char** out) {
  return serve(ctx, [&] {
    require(out, "out");
    *out = intern(ctx->config.get_string(key));
  });
}
tf_status h_config_get_list_string(tf_host_context* ctx, const char* key, int32_t index,
                                   const char** out) {
  return serve(ctx, [&] {
    require(out, "out");
    const auto list = ctx->config.get_string_list(key);
    if (index < 0 || static_cast<size_t>(index) >= list.size())
      throw std::out_of_range(std::string("index past the end of ") + key);
    *out = intern(list[static_cast<size_t>(index)]);
  });
}
tf_status h_config_get_list_int(tf_host_context* ctx, const char* key, int32_t index,
                                int64_t* out) {
  return serve(ctx, [&] {
    require(out, "out");
    const auto list = ctx->config.get_int_list(key);
    if (index < 0 || static_cast<size_t>(index) >= list.size())
      throw std::out_of_range(std::string("index past the end of ") + key);
    *out = list[static_cast<size_t>(index)];
  });
}
int32_t h_config_has(tf_host_context* ctx, const char* key) {
  return ctx && key && ctx->config.has(key) ? 1 : 0;
}

tf_status h_run_info(tf_host_context* ctx, tf_run_info* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_run_info");
    write_struct(out, ctx->kernel->env->run_info);
  });
}

// A plugin's own long phase, drawn by the host's progress sink (a terminal
// only); without one a call is a comparison.
tf_status h_progress(tf_host_context* ctx, const char* phase, int64_t done, int64_t total,
                     const char* unit) {
  return serve(ctx, [&] {
    if (phase == nullptr) {
      ctx->end_progress();
      return;
    }
    if (total < 0 || done < 0)
      throw std::invalid_argument("progress: done and total count up from 0 (got " +
                                  std::to_string(done) + " of " + std::to_string(total) + ")");
    if (!has_progress_sink()) return;
    if (!ctx->progress || ctx->progress_phase != phase) {
      ctx->end_progress();
      ctx->progress_phase = phase;
      ctx->progress_unit = unit ? unit : "";
      ctx->progress = std::make_unique<Progress>("[" + ctx->plugin_name + "] " + phase, total,
                                                 ctx->progress_unit.c_str());
    }
    ctx->progress->set(done);
    if (total > 0 && done >= total) ctx->end_progress();
  });
}

}  // namespace tightfit::host_services
