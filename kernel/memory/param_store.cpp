#include "param_store.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <stdexcept>

#include "checked_size.hpp"
#include "initial_draws.hpp"
#include "memory_accounting.hpp"

namespace tightfit {

int64_t Param::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

at::ScalarType to_scalar_type(tf_dtype d) {
  switch (d) {
    case TF_DTYPE_U8:
      return at::kByte;
    case TF_DTYPE_I8:
      return at::kChar;
    case TF_DTYPE_I32:
      return at::kInt;
    case TF_DTYPE_I64:
      return at::kLong;
    case TF_DTYPE_F16:
      return at::kHalf;
    case TF_DTYPE_F32:
      return at::kFloat;
    case TF_DTYPE_BF16:
      return at::kBFloat16;
    case TF_DTYPE_MAX_ENUM:
      break;
  }
  throw std::invalid_argument("unknown tf_dtype " + std::to_string(static_cast<int>(d)));
}

tf_dtype to_tf_dtype(at::ScalarType t) {
  switch (t) {
    case at::kByte:
      return TF_DTYPE_U8;
    case at::kChar:
      return TF_DTYPE_I8;
    case at::kInt:
      return TF_DTYPE_I32;
    case at::kLong:
      return TF_DTYPE_I64;
    case at::kHalf:
      return TF_DTYPE_F16;
    case at::kFloat:
      return TF_DTYPE_F32;
    case at::kBFloat16:
      return TF_DTYPE_BF16;
    default:
      throw std::invalid_argument(std::string("no tf_dtype for ") + c10::toString(t));
  }
}

namespace {
// The most weights a store holds, adapters and copies included: 2^19, ten
// times DeepSeek-V3's with adapters on every expert.
constexpr size_t kMaxParams = size_t{1} << 19;
}  // namespace

void ParamStore::declare(const tf_param_spec& spec) {
  if (materialized_)
    throw std::logic_error("parameters can no longer be declared: already materialized");
  if (spec.name == nullptr || *spec.name == 0)
    throw std::invalid_argument("parameter without a name");
  const std::string name = spec.name;
  // Declared counts bound the work: a config.json's layers times experts
  // (100,000 experts) would otherwise declare millions of entries, and plan
  // or create run out of memory before saying anything.
  if (params_.size() >= kMaxParams)
    throw std::invalid_argument(
        "the model declares more than " + std::to_string(kMaxParams) + " weights (the next is \"" +
        name + "\"): real models declare thousands (DeepSeek-V3, 61 layers of 256 experts, about " +
        "47,000); the config's counts of layers and experts are absurd for any model");
  if (index_.count(name)) throw std::invalid_argument("parameter \"" + name + "\" declared twice");
  if (kept_ > 0)
    throw std::logic_error("parameter \"" + name + "\" declared after the kernel's copies");
  if (spec.ndim < 0 || spec.ndim > 8 || (spec.ndim > 0 && spec.shape == nullptr))
    throw std::invalid_argument("parameter \"" + name + "\": ndim must be 0..8 with a shape");
  Param p;
  p.name = name;
  for (int i = 0; i < spec.ndim; ++i) {
    if (spec.shape[i] <= 0)
      throw std::invalid_argument("parameter \"" + name + "\" has a dimension <= 0");
    p.shape.push_back(spec.shape[i]);
  }
  p.dtype = to_scalar_type(spec.dtype);
  // Its bytes, and all parameters' together, stay far inside int64 (a
  // config.json of absurd sizes is refused here, not wrapped into a small model).
  int64_t numel = 1;
  for (const int64_t d : p.shape) numel = checked_product({numel, d}, "parameter " + name);
  checked_product({numel, 8}, "parameter " + name);
  total_elements_ = checked_product({total_elements_ + numel, 8}, "the parameters together") / 8;
  p.stage = spec.stage;
  p.init = spec.init;
  p.init_std = spec.init_std;
  p.flags = spec.flags;
  // !(x >= 0) also catches NaN.
  if (!(spec.routed_share >= 0) || spec.routed_share > 1)
    throw std::invalid_argument("parameter \"" + name +
                                "\" declares a routed_share outside [0, 1] (0: every token)");
  p.routed_share = spec.routed_share;
  p.trainable = !(spec.flags & TF_PARAM_FROZEN);
  index_[name] = params_.size();
  params_.push_back(std::move(p));
}

void ParamStore::adopt(Param p) {
  if (index_.count(p.name))
    throw std::invalid_argument("parameter \"" + p.name + "\" adopted twice");
  index_[p.name] = params_.size();
  params_.push_back(std::move(p));
  materialized_ = true;
}

int32_t ParamStore::declare_copies(const std::string& prefix, std::optional<tf_residency> kept_in) {
  if (kept_in && *kept_in != TF_TIER_DEVICE && *kept_in != TF_TIER_HOST)
    throw std::invalid_argument(
        "declare_kept_param_copies: the tier must be TF_TIER_DEVICE or TF_TIER_HOST");
  if (kept_ > 0)
    throw std::invalid_argument("declare_param_copies: copies are declared once a run");
  if (materialized_)
    throw std::logic_error("parameters can no longer be declared: already materialized");
  if (prefix.empty()) throw std::invalid_argument("declare_param_copies: an empty prefix");
  for (const Param& p : params_)
    if (p.name.rfind(prefix, 0) == 0)
      throw std::invalid_argument("declare_param_copies: the prefix \"" + prefix +
                                  "\" begins the name of parameter \"" + p.name +
                                  "\" already (copies declared twice?)");
  std::vector<Param> copies;
  for (const Param& p : params_) {
    if (!p.trainable || (p.flags & TF_PARAM_ADAPTER)) continue;
    Param c = p;
    c.name = prefix + p.name;
    c.copy_of = p.name;
    c.flags |= TF_PARAM_COPY | TF_PARAM_FROZEN;
    c.trainable = false;
    if (kept_in) {
      c.kept_by_host = true;
      c.residency = *kept_in;
    }
    copies.push_back(std::move(c));
  }
  if (params_.size() + copies.size() > kMaxParams)
    throw std::invalid_argument("declare_param_copies: " + std::to_string(copies.size()) +
                                " copies beside " + std::to_string(params_.size()) +
                                " weights pass the " + std::to_string(kMaxParams) +
                                " a model may declare");
  total_elements_ = 0;  // the bound covers the copies too
  for (const std::vector<Param>* list : {&params_, &copies})
    for (const Param& p : *list)
      total_elements_ =
          checked_product({total_elements_ + p.numel(), 8}, "the parameters together") / 8;
  for (Param& c : copies) {
    index_[c.name] = params_.size();
    params_.push_back(std::move(c));
  }
  if (kept_in) kept_ = copies.size();
  return static_cast<int32_t>(copies.size());
}

bool ParamStore::has_copies(const std::string& prefix) const {
  return !prefix.empty() && std::any_of(params_.begin(), params_.end(), [&](const Param& p) {
    return !p.copy_of.empty() && p.name.rfind(prefix, 0) == 0;
  });
}

namespace {

// Fills `t` with a constant init kind's value.
void fill_constant(at::Tensor& t, const Param& p) {
  switch (p.init) {
    case TF_INIT_ZEROS:
      t.zero_();
      break;
    case TF_INIT_ONES:
      t.fill_(1.0);
      break;
    case TF_INIT_CONSTANT:
      t.fill_(p.init_std);
      break;
    default:
      throw std::invalid_argument("parameter \"" + p.name + "\" has an unknown init kind");
  }
}

bool draws_from_stream(tf_init_kind k) {
  return k == TF_INIT_NORMAL || k == TF_INIT_UNIFORM;
}

}  // namespace

at::Tensor initial_values(const Param& p, const at::Device& device, uint64_t seed) {
  at::Tensor out = at::empty(p.shape, at::TensorOptions().dtype(p.dtype).device(device));
  if (!draws_from_stream(p.init)) {
    fill_constant(out, p);
    return out;
  }
  const int64_t n = p.numel(), n_chunks = (n + kInitChunkValues - 1) / kInitChunkValues;
  const uint64_t key = init_stream_key(seed, p.source_name());
  const auto spread = static_cast<float>(p.init_std);
  at::Tensor flat = out.view({-1});
  const bool in_place = device.is_cpu() && p.dtype == at::kFloat;
  auto draw_chunks = [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t begin = c * kInitChunkValues, m = std::min(kInitChunkValues, n - begin);
      at::Tensor chunk = in_place ? flat.narrow(0, begin, m)
                                  : at::empty({m}, at::TensorOptions().dtype(at::kFloat));
      if (p.init == TF_INIT_NORMAL)
        draw_normal(key, begin, m, spread, chunk.data_ptr<float>());
      else
        draw_uniform(key, begin, m, -spread, spread, chunk.data_ptr<float>());
      if (!in_place) flat.narrow(0, begin, m).copy_(chunk);
    }
  };
  // On the CPU the chunks go to the threads; a device's copies go in order.
  if (device.is_cpu())
    at::parallel_for(0, n_chunks, 1, draw_chunks);
  else
    draw_chunks(0, n_chunks);
  return out;
}

void ParamStore::materialize(uint64_t seed,
                             const std::function<std::optional<at::Device>(const Param&)>& place,
                             const std::function<void(size_t, size_t)>& after_group,
                             const std::function<bool(const Param&)>& drawn) {
  size_t group_start = 0;
  // The copies the kernel keeps are filled when training starts.
  const size_t made = plugins_see();
  for (size_t i = 0; i < made; ++i) {
    Param& p = params_[i];
    {
      const tf_mem_category cat = (p.flags & TF_PARAM_ADAPTER) ? TF_MEM_ADAPTERS : TF_MEM_WEIGHTS;
      CategoryScope scope(cat);
      const std::optional<at::Device> device = place(p);
      if (!device) {
        p.absent = true;
        p.trainable = false;
        p.value = at::empty({0}, at::TensorOptions().dtype(p.dtype));
      } else {
        at::Tensor t = !drawn || drawn(p)
                           ? initial_values(p, *device, seed)
                           : at::empty(p.shape, at::TensorOptions().dtype(p.dtype).device(*device));
        p.value = t.set_requires_grad(p.trainable && at::isFloatingType(p.dtype));
      }
    }
    const bool group_ends = i + 1 == made || params_[i + 1].stage != p.stage;
    if (group_ends && after_group) after_group(group_start, i + 1);
    if (group_ends) group_start = i + 1;
  }
  materialized_ = true;
}

at::Tensor ParamStore::kept_copy_of(const Param& copy, const at::Tensor& values,
                                    const at::Tensor& beside) {
  at::TensorOptions where = beside.options().requires_grad(false);
  if (copy.residency == TF_TIER_HOST)
    where = where.device(at::kCPU).pinned_memory(beside.is_cuda());
  at::Tensor kept = at::empty(beside.sizes(), where);
  kept.copy_(values.detach());
  return kept;
}

void ParamStore::check_kept_copies() const {
  for (size_t i = plugins_see(); i < params_.size(); ++i) {
    const Param& live = get(params_[i].copy_of);
    if (live.format != TF_FORMAT_DENSE || live.residency != TF_TIER_DEVICE)
      throw std::invalid_argument(
          "the kernel keeps " + params_[i].name + ", a copy of " + live.name + ", and " +
          live.name +
          " is not a dense weight in the device tier (a strategy moves or converts it): the "
          "kernel copies only dense weights on the device; leave that strategy out, or let the "
          "strategies place the copies (declare_param_copies)");
  }
}

void ParamStore::take_kept_copies() {
  check_kept_copies();
  at::NoGradGuard no_grad;
  const CategoryScope scope(TF_MEM_WEIGHTS);
  for (size_t i = plugins_see(); i < params_.size(); ++i) {
    Param& copy = params_[i];
    if (copy.value.defined()) continue;
    const Param& live = get(copy.copy_of);
    if (!live.value.defined() || live.format != TF_FORMAT_DENSE)
      throw std::logic_error("the copy " + copy.name + " has no dense weight to copy");
    copy.value = kept_copy_of(copy, live.value, live.value);
    copy.dtype = copy.value.scalar_type();
  }
}

Param* ParamStore::find(const std::string& name) {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &params_[it->second];
}

const Param* ParamStore::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &params_[it->second];
}

Param& ParamStore::get(const std::string& name) {
  if (Param* p = find(name)) return *p;
  throw std::out_of_range("no parameter named \"" + name + "\"");
}

const Param& ParamStore::get(const std::string& name) const {
  return const_cast<ParamStore*>(this)->get(name);
}

std::vector<Param*> ParamStore::trainable() {
  std::vector<Param*> out;
  for (auto& p : params_)
    if (p.trainable) out.push_back(&p);
  return out;
}

void ParamStore::set_trainable(Param& p, bool on) {
  if (on && p.absent)
    throw std::invalid_argument("parameter \"" + p.name +
                                "\" belongs to a skipped stage and was never materialized; it "
                                "cannot be trained");
  p.trainable = on;
  if (p.value.defined() && at::isFloatingType(p.value.scalar_type()) && p.value.is_leaf())
    p.value.requires_grad_(on);
}

int64_t ParamStore::count_params(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& p : params_)
    if (!trainable_only || p.trainable) n += p.numel();
  return n;
}

int64_t ParamStore::stored_bytes() const {
  int64_t n = 0;
  for (const auto& p : params_)
    if (p.value.defined()) n += p.value.numel() * p.value.element_size();
  return n;
}

}  // namespace tightfit
