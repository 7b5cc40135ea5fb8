#include "distributed.hpp"

#include <cstdlib>
#include <limits>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "distributed_nccl.hpp"

namespace tightfit {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, const std::string& value, int lo, int hi) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || v < lo || v > hi)
    throw std::invalid_argument("environment variable " + std::string(name) + "=\"" + value +
                                "\" must be an integer in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "]");
  return static_cast<int>(v);
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::Min:
      return c10d::ReduceOp::MIN;
    default:  // Avg is a sum divided afterwards: Gloo has no AVG
      return c10d::ReduceOp::SUM;
  }
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

}  // namespace

std::optional<DistEnv> dist_env_from_environment() {
  auto world = env("WORLD_SIZE");
  auto rank = env("RANK");
  const bool slurm = !world && env("SLURM_NTASKS") && env("SLURM_PROCID");
  if (slurm) {
    world = env("SLURM_NTASKS");
    rank = env("SLURM_PROCID");
  }
  if (!world) return std::nullopt;
  DistEnv e;
  const char* world_name = slurm ? "SLURM_NTASKS" : "WORLD_SIZE";
  const char* rank_name = slurm ? "SLURM_PROCID" : "RANK";
  e.world_size = env_int(world_name, *world, 1, 1 << 20);
  if (e.world_size == 1) return std::nullopt;
  if (!rank)
    throw std::invalid_argument(std::string(world_name) + " is " + *world + " but " + rank_name +
                                " is not set; launch with torchrun --no-python or tightfit run "
                                "--nproc N, which set both");
  e.rank = env_int(rank_name, *rank, 0, e.world_size - 1);
  if (auto lr = env(slurm ? "SLURM_LOCALID" : "LOCAL_RANK"))
    e.local_rank = env_int(slurm ? "SLURM_LOCALID" : "LOCAL_RANK", *lr, 0, e.world_size - 1);
  else
    e.local_rank = e.rank;
  if (auto a = env("MASTER_ADDR")) e.master_addr = *a;
  if (auto p = env("MASTER_PORT")) e.master_port = env_int("MASTER_PORT", *p, 1, 65535);
  if (auto a = env("TORCHELASTIC_USE_AGENT_STORE")) e.agent_store = *a == "True" || *a == "1";
  if (auto c = env("TORCHELASTIC_RESTART_COUNT"))
    e.attempt = env_int("TORCHELASTIC_RESTART_COUNT", *c, 0, 1 << 30);
  return e;
}

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  const char* name = "gloo";
};

ProcessGroup::ProcessGroup(const DistEnv& env, const at::Device& device,
                           std::chrono::milliseconds timeout)
    : env_(env), timeout_(timeout), impl_(std::make_unique<Impl>()) {
  const std::string where = "rank " + std::to_string(env.rank) + " of " +
                            std::to_string(env.world_size) + " (" + env.master_addr + ":" +
                            std::to_string(env.master_port) + ")";
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(env.master_port);
    so.isServer = env.rank == 0 && !env.agent_store;
    so.numWorkers = static_cast<size_t>(env.world_size);
    so.waitWorkers = true;
    so.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    // A fresh prefix per attempt: keys a failed attempt left (its ranks'
    // addresses) must not be read by the next.
    impl_->store = c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + std::to_string(env.attempt) + "/tightfit", tcp);
    if (device.is_cuda()) {
      impl_->backend = make_nccl_backend(impl_->store, env.rank, env.world_size, timeout);
      impl_->name = "nccl";
    } else {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      else if (is_loopback(env.master_addr))
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      else
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      impl_->backend =
          c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, env.rank, env.world_size, opts);
    }
  } catch (const std::exception& e) {
    throw DistributedError(where + ": cannot join the process group within " +
                           std::to_string(timeout.count() / 1000) + " s: " + e.what() +
                           " (are all ranks started, and MASTER_ADDR/MASTER_PORT the same "
                           "and reachable for all?)");
  }
}

ProcessGroup::~ProcessGroup() = default;

const char* ProcessGroup::backend() const {
  return impl_->name;
}

template <typename F>
void ProcessGroup::run(const char* what, F&& f) {
  try {
    c10::intrusive_ptr<c10d::Work> work = f();
    work->wait(timeout_);
  } catch (const std::exception& e) {
    throw DistributedError("rank " + std::to_string(env_.rank) + " of " +
                           std::to_string(env_.world_size) + ": " + what + " failed: " + e.what() +
                           " — another rank stopped, or did not arrive within " +
                           std::to_string(timeout_.count() / 1000) +
                           " s ([run].dist_timeout); that rank's own output says why");
  }
}

void ProcessGroup::all_reduce(at::Tensor& t, ReduceOp op) {
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = timeout_;
  run("all_reduce", [&] { return impl_->backend->allreduce(ts, o); });
  if (op == ReduceOp::Avg) t.div_(env_.world_size);
}

void ProcessGroup::reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op) {
  if (in.numel() != out.numel() * env_.world_size || !in.is_contiguous() || !out.is_contiguous())
    throw std::invalid_argument("reduce_scatter: in must be contiguous with world_size x " +
                                std::to_string(out.numel()) + " elements, out contiguous");
  at::Tensor src = in;
  c10d::ReduceScatterOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = timeout_;
  run("reduce_scatter", [&] { return impl_->backend->_reduce_scatter_base(out, src, o); });
  if (op == ReduceOp::Avg) out.div_(env_.world_size);
}

void ProcessGroup::all_gather(at::Tensor& out, const at::Tensor& in) {
  if (out.numel() != in.numel() * env_.world_size || !in.is_contiguous() || !out.is_contiguous())
    throw std::invalid_argument("all_gather: out must be contiguous with world_size x " +
                                std::to_string(in.numel()) + " elements, in contiguous");
  at::Tensor src = in;
  c10d::AllgatherOptions o;
  o.timeout = timeout_;
  run("all_gather", [&] { return impl_->backend->_allgather_base(out, src, o); });
}

void ProcessGroup::broadcast(at::Tensor& t, int root) {
  std::vector<at::Tensor> ts{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = timeout_;
  run("broadcast", [&] { return impl_->backend->broadcast(ts, o); });
}

void ProcessGroup::barrier() {
  c10d::BarrierOptions o;
  o.timeout = timeout_;
  run("barrier", [&] { return impl_->backend->barrier(o); });
}

}  // namespace tightfit
