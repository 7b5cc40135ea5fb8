// Where and how a run runs: the kernel's own recipe tables, the training
// device, the ranks and their process group, the run folder, and what
// plugins learn of all this (tf_run_info). Set up once while a session is
// built (session_build.cpp); read-only after that.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "distributed.hpp"
#include "memory_accounting.hpp"
#include "recipe.hpp"
#include "run_folder_lock.hpp"
#include "tightfit/plugin_api.h"

namespace tightfit {

struct RunEnvironment {
  // [run], [data], [optimizer] and [save], validated against kernel_keys.
  ConfigTable run_cfg, data_cfg, opt_cfg, save_cfg;
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

  bool is_rank0() const { return run_info.rank == 0; }
  // [run] memory_budget_scope = "process": the budget bounds the process's RSS.
  bool process_budget_scope() const {
    return run_cfg.get_string("memory_budget_scope") == "process";
  }
  // [save].dir, or the run folder's checkpoints/.
  std::string checkpoint_dir() const;
  // Counted CPU bytes by category, plus the CUDA allocator's totals on a CUDA run.
  MemorySnapshot memory_snapshot() const;
};

}  // namespace tightfit
