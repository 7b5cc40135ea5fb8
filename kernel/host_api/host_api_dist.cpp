// Host services: collectives and the planned parameter table.
// Each catches every exception (serve) so none crosses the ABI.
#include "host_api_services.hpp"

namespace tightfit::host_services {

static ReduceOp to_reduce_op(tf_reduce_op op) {
  switch (op) {
    case TF_REDUCE_SUM:
      return ReduceOp::Sum;
    case TF_REDUCE_AVG:
      return ReduceOp::Avg;
    case TF_REDUCE_MAX:
      return ReduceOp::Max;
    case TF_REDUCE_MIN:
      return ReduceOp::Min;
    case TF_REDUCE_OP_MAX_ENUM:
      break;
  }
  throw std::invalid_argument("unknown reduce op " + std::to_string(static_cast<int>(op)));
}

tf_status h_dist_all_reduce(tf_host_context* ctx, tf_tensor t, tf_reduce_op op) {
  return serve(ctx, [&] {
    require(t, "t");
    const ReduceOp r = to_reduce_op(op);
    if (ProcessGroup* pg = ctx->kernel->env->pg.get()) pg->all_reduce(handle_tensor(t), r);
  });
}
// A group of one: reduce_scatter and all_gather are copies of the same size.
static void copy_as_one_rank(at::Tensor& out, const at::Tensor& in, const char* what) {
  if (out.numel() != in.numel())
    throw std::invalid_argument(std::string(what) + ": in and out differ in size (one rank)");
  out.copy_(in.view_as(out));
}
tf_status h_dist_reduce_scatter(tf_host_context* ctx, tf_tensor out, tf_tensor in,
                                tf_reduce_op op) {
  return serve(ctx, [&] {
    require(out, "out");
    require(in, "in");
    const ReduceOp r = to_reduce_op(op);
    if (ProcessGroup* pg = ctx->kernel->env->pg.get())
      pg->reduce_scatter(handle_tensor(out), handle_tensor(in), r);
    else
      copy_as_one_rank(handle_tensor(out), handle_tensor(in), "reduce_scatter");
  });
}
tf_status h_dist_all_gather(tf_host_context* ctx, tf_tensor out, tf_tensor in) {
  return serve(ctx, [&] {
    require(out, "out");
    require(in, "in");
    if (ProcessGroup* pg = ctx->kernel->env->pg.get())
      pg->all_gather(handle_tensor(out), handle_tensor(in));
    else
      copy_as_one_rank(handle_tensor(out), handle_tensor(in), "all_gather");
  });
}
tf_status h_dist_broadcast(tf_host_context* ctx, tf_tensor t, int32_t root) {
  return serve(ctx, [&] {
    require(t, "t");
    if (root < 0 || root >= ctx->kernel->env->run_info.world_size)
      throw std::invalid_argument("broadcast root " + std::to_string(root) + " is not a rank");
    if (ProcessGroup* pg = ctx->kernel->env->pg.get()) pg->broadcast(handle_tensor(t), root);
  });
}
tf_status h_dist_barrier(tf_host_context* ctx) {
  return serve(ctx, [&] {
    if (ProcessGroup* pg = ctx->kernel->env->pg.get()) pg->barrier();
  });
}

static std::map<std::string, tf_param_plan>::iterator planned(tf_host_context* ctx,
                                                              const char* name) {
  require(name, "name");
  if (!ctx->kernel->plan->planning)
    throw WrongPhase("the planned parameter table is only open inside estimate_memory");
  auto& table = ctx->kernel->plan->params;
  auto it = table.find(name);
  if (it == table.end())
    throw std::out_of_range(std::string("no planned parameter \"") + name +
                            "\" (absent, in a skipped stage, or not declared)");
  return it;
}
tf_status h_plan_param_get(tf_host_context* ctx, const char* name, tf_param_plan* out) {
  return serve(ctx, [&] {
    check_size(out, "tf_param_plan");
    write_struct(out, planned(ctx, name)->second);
  });
}
tf_status h_plan_param_set(tf_host_context* ctx, const char* name, const tf_param_plan* in) {
  return serve(ctx, [&] {
    require(in, "in");
    tf_param_plan p = read_struct(in);
    if (p.bytes < 0) throw std::invalid_argument("planned bytes must not be negative");
    if (p.tier < 0 || p.tier >= TF_TIER_COUNT) throw std::invalid_argument("no such tier");
    p.struct_size = sizeof p;
    planned(ctx, name)->second = p;
  });
}

}  // namespace tightfit::host_services
