#include "adamw8_state.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <utility>

namespace adamw8 {
namespace {

// Codes of x in blocks: signed in [-127, 127] or unsigned in [0, 255].
std::pair<at::Tensor, at::Tensor> encode_blocks(const at::Tensor& x, int64_t block,
                                                bool is_signed) {
  const int64_t n = x.numel(), pad = (block - n % block) % block;
  at::Tensor blocks = at::constant_pad_nd(x.flatten(), {0, pad}).view({-1, block});
  at::Tensor absmax = blocks.abs().amax(1).clamp_min(1e-30);
  const double levels = is_signed ? 127.0 : 255.0;
  at::Tensor codes = (blocks / absmax.unsqueeze(1) * levels).round();
  codes = is_signed ? codes.clamp(-127, 127).to(at::kChar) : codes.clamp(0, 255).to(at::kByte);
  return {codes.flatten(), absmax};
}
at::Tensor decode_blocks(const at::Tensor& codes, const at::Tensor& absmax, int64_t block,
                         bool is_signed, const at::IntArrayRef shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  const double levels = is_signed ? 127.0 : 255.0;
  at::Tensor x = codes.to(at::kFloat).view({-1, block}) * (absmax.unsqueeze(1) / levels);
  return x.flatten().slice(0, 0, n).view(shape);
}

}  // namespace

tf_status State::step(const tf_sdk::Host& host, const char* name, const at::Tensor& param,
                      const at::Tensor& grad, double lr) {
  const tf_optimizer_info o = host.optimizer_info();
  if (std::string(o.name) != "adamw")  // never a silent fallback to the kernel's optimizer
    throw std::invalid_argument(std::string("8-bit AdamW state, but the run's optimizer is ") +
                                o.name +
                                ": set [optimizer] name = \"adamw\", or drop the 8-bit state");
  const tf_param_info info = host.param_info(name);
  at::NoGradGuard no_grad;
  // Working fp32 copies are transient; only the int8 codes are state.
  const tf_sdk::MemoryCategory transient(host, TF_MEM_TRANSIENT);
  if (!param.is_contiguous())
    throw std::invalid_argument("8-bit AdamW needs contiguous parameters");
  const at::Tensor flat_param = param.detach().view(-1);
  const at::Tensor flat_grad = grad.reshape(-1);
  const int64_t n = flat_param.numel(), block = block_, n_blocks = (n + block - 1) / block;
  ParamState& st = params_[name];
  if (st.m_codes.defined() && st.m_codes.device() != param.device()) {  // read from a checkpoint
    const tf_sdk::MemoryCategory as_optimizer(host, TF_MEM_OPTIMIZER);
    for (at::Tensor* t : {&st.m_codes, &st.m_absmax, &st.r_codes, &st.r_absmax})
      *t = t->to(param.device());
  }
  if (!st.m_codes.defined()) {  // zero codes and scales decode to zero moments
    const tf_sdk::MemoryCategory as_optimizer(host, TF_MEM_OPTIMIZER);
    // On the parameter's device, where the update runs.
    const at::TensorOptions on = flat_param.options();
    st.m_codes = at::zeros({n_blocks * block}, on.dtype(at::kChar));
    st.r_codes = at::zeros({n_blocks * block}, on.dtype(at::kByte));
    st.m_absmax = at::zeros({n_blocks}, on.dtype(at::kFloat));
    st.r_absmax = at::zeros({n_blocks}, on.dtype(at::kFloat));
  }
  const bool decay =
      !(info.flags & TF_PARAM_NO_WEIGHT_DECAY) && info.ndim >= 2 && o.weight_decay > 0;
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(o.step));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(o.step));
  // A chunk of blocks at a time: the fp32 working copies (parameter,
  // gradient, both moments) stay a few MiB even for a 262M-value embedding,
  // and each block is decoded, updated and encoded exactly as a whole-tensor
  // update would.
  constexpr int64_t kChunkBlocks = 4096;
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kChunkBlocks) {
    const int64_t nb = std::min(kChunkBlocks, n_blocks - b0);
    const int64_t begin = b0 * block, end = std::min(n, (b0 + nb) * block), len = end - begin;
    at::Tensor p = flat_param.slice(0, begin, end).to(at::kFloat);
    const at::Tensor g = flat_grad.slice(0, begin, end).to(at::kFloat);
    const at::Tensor m_codes = st.m_codes.slice(0, begin, begin + nb * block);
    const at::Tensor r_codes = st.r_codes.slice(0, begin, begin + nb * block);
    const at::Tensor m_absmax = st.m_absmax.slice(0, b0, b0 + nb),
                     r_absmax = st.r_absmax.slice(0, b0, b0 + nb);
    at::Tensor m = decode_blocks(m_codes, m_absmax, block, true, {len});
    at::Tensor v = decode_blocks(r_codes, r_absmax, block, false, {len}).square();
    if (decay) p.mul_(1.0 - lr * o.weight_decay);
    m.mul_(o.beta1).add_(g, 1.0 - o.beta1);
    v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
    p.addcdiv_(m, (v / bc2).sqrt_().add_(o.eps), -lr / bc1);
    flat_param.slice(0, begin, end).copy_(p);
    auto [mc, ma] = encode_blocks(m, block, true);
    auto [rc, ra] = encode_blocks(v.sqrt(), block, false);
    m_codes.copy_(mc), m_absmax.copy_(ma), r_codes.copy_(rc), r_absmax.copy_(ra);
  }
  return TF_OK;
}

void State::save(const tf_sdk::Host& host) const {
  for (const auto& [name, a] : params_)
    for (auto [key, t] : {std::pair{".m_codes", &a.m_codes},
                          {".m_absmax", &a.m_absmax},
                          {".r_codes", &a.r_codes},
                          {".r_absmax", &a.r_absmax}})
      host.save_tensor("adam8." + name + key, *t);
}

void State::load(const tf_sdk::Host& host) {
  params_.clear();
  for (const std::string& name : host.param_names()) {
    // A parameter without 8-bit state had no update before the checkpoint.
    const std::optional<at::Tensor> m_codes = host.find_saved_tensor("adam8." + name + ".m_codes");
    if (!m_codes) continue;
    ParamState& a = params_[name];
    a.m_codes = *m_codes;
    for (auto [key, t] : {std::pair{".m_absmax", &a.m_absmax},
                          {".r_codes", &a.r_codes},
                          {".r_absmax", &a.r_absmax}})
      *t = host.saved_tensor("adam8." + name + key);
    // The codes must tile the parameter in this run's blocks.
    const int64_t n = host.param_info(name).numel, n_blocks = (n + block_ - 1) / block_;
    if (a.m_codes.numel() != n_blocks * block_ || a.r_codes.numel() != n_blocks * block_ ||
        a.m_absmax.numel() != n_blocks || a.r_absmax.numel() != n_blocks)
      throw std::invalid_argument("8-bit AdamW: the checkpoint's state of " + name +
                                  " is in blocks of another size (state_block_size changed?); "
                                  "resume with the block size it was saved with");
  }
}

}  // namespace adamw8
