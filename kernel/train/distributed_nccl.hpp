// The NCCL backend lives in its own translation unit: it needs CUDA and
// NCCL headers (the torch wheel's own NCCL) that the Gloo side does not.
#pragma once

#include <chrono>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace tightfit {

// A ProcessGroupNCCL for CUDA runs; throws when this build has no NCCL.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int world_size,
                                                    std::chrono::milliseconds timeout);

}  // namespace tightfit
