// Multi-process runs on torch.distributed's c10d: a TCPStore rendezvous at
// MASTER_ADDR:MASTER_PORT and a Gloo (CPU) or NCCL (CUDA) process group. The
// kernel owns the group and lends its collectives to plugins (shard) through
// host services; no transport of our own.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

namespace tightfit {

// The launch environment torchrun and Slurm (via srun + a wrapper) set.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Under torchrun the agent hosts the store (TORCHELASTIC_USE_AGENT_STORE)
  // and lives across restarts: each attempt (TORCHELASTIC_RESTART_COUNT)
  // rendezvous under its own prefix, as torch.distributed does.
  bool agent_store = false;
  int attempt = 0;
};

// Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (SLURM_PROCID
// and SLURM_NTASKS stand in for RANK and WORLD_SIZE). nullopt when the run is a
// single process. Throws std::invalid_argument naming the bad variable.
std::optional<DistEnv> dist_env_from_environment();

// A collective failed: a peer died, hung past the timeout or disagreed.
struct DistributedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ReduceOp { Sum, Avg, Max, Min };

class ProcessGroup {
 public:
  // Joins the group (rank 0 hosts the store); waits at most `timeout` for
  // every rank to arrive, and each collective at most `timeout` afterwards.
  ProcessGroup(const DistEnv& env, const at::Device& device, std::chrono::milliseconds timeout);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  const char* backend() const;

  // In place, on every rank.
  void all_reduce(at::Tensor& t, ReduceOp op);
  // `in` holds world_size equal contiguous parts; rank r receives the
  // reduction of part r into `out` (numel = in.numel() / world_size).
  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op);
  // `out` (numel = world_size * in.numel()) receives every rank's `in`, in rank order.
  void all_gather(at::Tensor& out, const at::Tensor& in);
  void broadcast(at::Tensor& t, int root);
  void barrier();

 private:
  struct Impl;
  DistEnv env_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Impl> impl_;
  template <typename F>
  void run(const char* what, F&& f);
};

}  // namespace tightfit
