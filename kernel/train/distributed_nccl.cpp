#include "distributed_nccl.hpp"

#include <stdexcept>

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace tightfit {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int world_size,
                                                    std::chrono::milliseconds timeout) {
#ifdef USE_C10D_NCCL
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, opts);
#else
  (void)store;
  (void)rank;
  (void)world_size;
  (void)timeout;
  throw std::runtime_error(
      "this tightfit was built without NCCL (no nccl.h found at configure time); CUDA runs with "
      "more than one rank need it: install the torch wheel's nvidia-nccl package and rebuild");
#endif
}

}  // namespace tightfit
