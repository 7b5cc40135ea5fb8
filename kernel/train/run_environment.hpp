// Where and how a run runs: the kernel's own recipe tables, the training
// device, the ranks and their process group, the run folder, and what
// plugins learn of all this (tf_run_info). Set up once while a session is
// built (session_build.cpp); read-only after that.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "distributed.hpp"
#include "kernel_config.hpp"
#include "memory_accounting.hpp"
#include "memory_budget.hpp"
#include "recipe.hpp"
#include "run_folder_lock.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {

struct RunEnvironment {
  // [run], [data], [optimizer] and [save], validated and read once.
  KernelConfig config;
  at::Device device{at::kCPU};
  std::string device_str;    // what run_info.device points to
  std::string run_dir;       // out_dir/name (numbered when that name holds another run)
  std::string run_dir_abs;   // what run_info.run_dir points to
  std::string model_source;  // what run_info.model_source points to
  tf_run_info run_info{};
  // The process group of a multi-process run; nullptr in a single process.
  std::unique_ptr<ProcessGroup> pg;
  // Rank 0's hold on the run folder (one run per folder), while the session lives.
  std::shared_ptr<RunFolderLock> folder_lock;

  // The run's memory budget, decided once from [run] and the device.
  MemoryBudget budget;

  bool is_rank0() const { return run_info.rank == 0; }
  // [save].dir, or the run folder's checkpoints/.
  std::string checkpoint_dir() const;
  // Counted CPU bytes by category, plus the CUDA allocator's totals on a CUDA run.
  MemorySnapshot memory_snapshot() const;
};

}  // namespace tightfit
