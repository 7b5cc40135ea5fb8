// tf_tensor handles on the kernel's side of the ABI: an opaque pointer to an
// at::Tensor. Borrowed handles point at a tensor the caller keeps (valid for
// the call only); a new handle owns a heap at::Tensor that whoever receives
// it adopts (or releases with tensor_release).
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "tightfit/plugin_api.h"

namespace tightfit {

// A handle to `t` for the length of one call.
inline tf_tensor borrow_handle(const at::Tensor& t) {
  return reinterpret_cast<tf_tensor>(const_cast<at::Tensor*>(&t));
}
// The tensor behind a handle (borrowed or new), in place.
inline at::Tensor& handle_tensor(tf_tensor h) {
  return *reinterpret_cast<at::Tensor*>(h);
}
// A new handle the receiver owns.
inline tf_tensor give_handle(at::Tensor t) {
  return reinterpret_cast<tf_tensor>(new at::Tensor(std::move(t)));
}
// Frees a new handle (and its reference to the tensor); NULL is a no-op.
inline void release_handle(tf_tensor h) {
  delete reinterpret_cast<at::Tensor*>(h);
}
// Takes ownership of a new handle: the tensor, the handle freed.
inline at::Tensor adopt_handle(tf_tensor h) {
  at::Tensor* p = reinterpret_cast<at::Tensor*>(h);
  at::Tensor t = std::move(*p);
  delete p;
  return t;
}

}  // namespace tightfit
