// The bytes of a tensor's storage freed or allocated again while the tensor
// itself — shape, autograd identity, version — stays as it is, as FSDP does
// with sharded parameters between uses. Strategies that keep a trained
// weight elsewhere (offload's tiers, ZeRO-3's peers) give the leaf its bytes
// only while its stage runs.
#pragma once

#include <ATen/ATen.h>

namespace tf_sdk {

inline void free_bytes(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

inline bool has_bytes(const at::Tensor& t) {
  return t.storage().nbytes() > 0;
}

inline void allocate_bytes(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(n));
  s->set_nbytes(n);
}

}  // namespace tf_sdk
