#include "fused_head_loss.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "cross_entropy.hpp"
#include "host_reads.hpp"
#include "memory_accounting.hpp"

namespace tightfit {

int64_t fused_loss_chunk_rows(int64_t vocab, int64_t requested) {
  if (requested > 0) return requested;
  const int64_t rows = (int64_t{64} << 20) / (4 * std::max<int64_t>(vocab, 1));
  return std::max<int64_t>(16, rows / 16 * 16);
}

namespace {

// The dtype linear computes in: autocast's where it is on for the weight's
// device, else the weight's own (the executor casts the input to it).
at::ScalarType compute_dtype(const at::Tensor& weight) {
  const at::DeviceType device = weight.device().type();
  if (at::autocast::is_autocast_enabled(device) && weight.scalar_type() == at::kFloat)
    return at::autocast::get_autocast_dtype(device);
  return weight.scalar_type();
}

// Whether a 16-bit matmul on this CPU allocates a scratch of its whole
// output beside it: oneDNN on a CPU without native bf16 (no AVX-512 BF16 or
// AMX) computes into fp32 and rounds, so a chunk's logits had 4 more bytes
// each than planned (the 32k-word autocast plan 25% under there, exact on a
// CPU with AMX). Measured once per dtype on a small product.
bool low_precision_mm_has_output_scratch(at::ScalarType dtype) {
  static std::mutex m;
  static std::map<at::ScalarType, bool> measured;
  std::lock_guard<std::mutex> lock(m);
  if (const auto it = measured.find(dtype); it != measured.end()) return it->second;
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor a = at::zeros({64, 256}, at::TensorOptions().dtype(dtype));
  const at::Tensor b = at::zeros({1024, 256}, at::TensorOptions().dtype(dtype));
  at::Tensor out = at::empty({64, 1024}, at::TensorOptions().dtype(dtype));
  const int64_t before = thread_allocated_cpu_bytes();
  at::mm_out(out, a, b.t());
  return measured[dtype] = thread_allocated_cpu_bytes() - before >= out.numel() * 2;
}

// The rows a 16-bit chunk's projection computes at once: all of them, or
// where a 16-bit CPU matmul keeps a scratch of its output, blocks whose fp32
// scratch is a cross-entropy block's (8 MiB), not the chunk's.
int64_t projection_rows(const at::Tensor& w, at::ScalarType dtype, int64_t chunk_rows) {
  if (w.device().is_cpu() && dtype != at::kFloat && low_precision_mm_has_output_scratch(dtype))
    return std::min(chunk_rows, std::max<int64_t>(16, cross_entropy_block_rows(w.size(0))));
  return chunk_rows;
}

// low = x w^T (+ bias), `rows` rows at a time.
void project_chunk(at::Tensor& low, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                   int64_t rows) {
  for (int64_t r = 0; r < x.size(0); r += rows) {
    const int64_t m = std::min(rows, x.size(0) - r);
    at::Tensor out = low.narrow(0, r, m);
    const at::Tensor xr = x.narrow(0, r, m);
    if (b.defined())
      at::addmm_out(out, b, xr, w.t());
    else
      at::mm_out(out, xr, w.t());
  }
}

// What forward computes for backward: the gradients of the loss times
// grad_scale, for the inputs that require one.
struct HeadGrads {
  bool want_hidden = false, want_weight = false, want_bias = false;
  at::Tensor hidden, weight, bias;
  bool any() const { return want_hidden || want_weight || want_bias; }
};

// acc (+)= a b, where acc may be of another dtype than a and b (an fp32
// gradient of a weight that computes in bf16): a fresh product, added. A
// transient until the kernel hands it to grad_ready, as the gradient autograd
// would have made in backward.
void accumulate_product(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b,
                        at::ScalarType acc_dtype) {
  if (!acc.defined()) {
    acc = at::mm(a, b).to(acc_dtype);
  } else if (acc.scalar_type() == a.scalar_type()) {
    acc.addmm_(a, b);
  } else {
    acc.add_(at::mm(a, b));
  }
}

// The fp32 logits of a chunk's rows whose entropies are computed at once
// (a few temporaries of this size live beside the chunk).
constexpr int64_t kEntropyBlockBytes = int64_t{1} << 20;

// The sum of the counted rows' losses over every chunk (each weighted by
// `weights` [N] when defined); fills `g` with the gradients of (that sum x
// row_scale) as it goes, and `each` ([N] fp32, when defined) with every
// row's own loss. hidden [N, C], targets [N].
at::Tensor chunked_loss(const at::Tensor& hidden, const at::Tensor& targets,
                        const HeadProjection& p, at::ScalarType dtype, int64_t chunk_rows,
                        double row_scale, HeadGrads& g, const at::Tensor& weights = {},
                        const at::Tensor& each = {}, const at::Tensor& mean_logits = {},
                        double logits_scale = 1.0, const at::Tensor& entropies = {}) {
  // Everything below is in explicit dtypes, as linear under autocast would be.
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  at::Tensor w, b;
  {
    CategoryScope scope(TF_MEM_TRANSIENT);
    w = p.weight.detach().to(dtype);
    b = p.bias.defined() ? p.bias.detach().to(dtype) : p.bias;
  }
  const at::Tensor h = hidden.detach();
  const int64_t n = h.size(0), vocab = w.size(0);
  at::Tensor total = at::zeros({}, h.options().dtype(at::kFloat));
  // In the compute dtype, as linear's backward makes it (autocast then
  // casts it to the hidden state's dtype): half the bytes under bf16.
  if (g.want_hidden) g.hidden = at::empty(h.sizes(), h.options().dtype(dtype));
  // One chunk's logits (fp32) and, computing in 16 bits, its product and
  // gradient in that dtype: allocated once and reused, so the pages of a
  // chunk-sized buffer are faulted in once, not for every chunk.
  // A capped head keeps, beside them, d cap(z) / dz = 1 - tanh²(z / c) of
  // the chunk while its cross-entropy writes the gradient over the logits.
  const double cap = p.softcap;
  at::Tensor logits_buffer, low_buffer, slope_buffer;
  {
    CategoryScope scope(TF_MEM_TRANSIENT);
    const int64_t rows = std::min(chunk_rows, n);
    logits_buffer = at::empty({rows, vocab}, h.options().dtype(at::kFloat));
    if (dtype != at::kFloat) low_buffer = at::empty({rows, vocab}, h.options().dtype(dtype));
    if (cap > 0 && g.any()) slope_buffer = at::empty({rows, vocab}, h.options().dtype(at::kFloat));
  }
  const int64_t rows_at_once = projection_rows(w, dtype, chunk_rows);
  for (int64_t i = 0; i < n; i += chunk_rows) {
    const int64_t m = std::min(chunk_rows, n - i);
    CategoryScope scope(TF_MEM_TRANSIENT);
    const at::Tensor x = h.narrow(0, i, m).to(dtype);
    at::Tensor logits = logits_buffer.narrow(0, 0, m);
    at::Tensor low = dtype == at::kFloat ? logits : low_buffer.narrow(0, 0, m);
    project_chunk(low, x, w, b, rows_at_once);
    if (!low.is_same(logits)) logits.copy_(low);
    at::Tensor slope;
    if (cap > 0) {  // logits = c tanh(z / c), in fp32
      logits.div_(cap).tanh_();
      if (slope_buffer.defined()) {
        slope = slope_buffer.narrow(0, 0, m);
        at::mul_out(slope, logits, logits).neg_().add_(1.0);
      }
      logits.mul_(cap);
    }
    if (mean_logits.defined()) mean_logits.narrow(0, i, m).copy_(logits.mean(1));
    if (logits_scale != 1.0) logits.mul_(logits_scale);
    if (entropies.defined()) {  // H = lse - sum_v p_v z_v, before the gradient overwrites z
      // A few rows at a time: p_v z_v of the whole chunk would be two more
      // chunk-sized tensors beside the logits.
      const at::Tensor counted = targets.narrow(0, i, m).ne(kIgnoreIndex).to(at::kFloat);
      const int64_t block = std::max<int64_t>(1, kEntropyBlockBytes / (4 * vocab));
      for (int64_t r = 0; r < m; r += block) {
        const int64_t k = std::min(block, m - r);
        const at::Tensor z = logits.narrow(0, r, k);
        const at::Tensor lse = at::logsumexp(z, 1);
        entropies.narrow(0, i + r, k)
            .copy_((lse - (at::exp(z - lse.unsqueeze(1)) * z).sum(1)) * counted.narrow(0, r, k));
      }
    }
    // The chunk's gradient is written over its fp32 logits.
    const at::Tensor row_weights = weights.defined() ? weights.narrow(0, i, m) : at::Tensor();
    const at::Tensor losses = cross_entropy_each(
        logits, targets.narrow(0, i, m), g.any() ? logits : at::Tensor(), row_scale, row_weights);
    if (each.defined()) each.narrow(0, i, m).copy_(losses);
    total.add_(row_weights.defined() ? (losses * row_weights).sum() : losses.sum());
    if (!g.any()) continue;
    if (logits_scale != 1.0) logits.mul_(logits_scale);  // d / dz of the scaled logits
    if (slope.defined()) logits.mul_(slope);  // d loss / dz = d loss / d cap(z) * cap'(z)
    const at::Tensor d = low.is_same(logits) ? logits : low.copy_(logits);
    if (g.want_hidden) {
      at::Tensor rows = g.hidden.narrow(0, i, m);
      at::mm_out(rows, d, w);
    }
    if (g.want_weight) accumulate_product(g.weight, d.t(), x, p.weight.scalar_type());
    if (g.want_bias) {
      const at::Tensor db = d.sum(0, false, at::kFloat);
      if (!g.bias.defined()) {
        g.bias = db.to(p.bias.scalar_type());
      } else {
        g.bias.add_(db);
      }
    }
  }
  return total;
}

// The rows whose target counts (at least 1, as the unfused mean).
// (A read; a pass counts its batch's targets on the host before they go to
// the device, and hands the count in.)
double counted_rows(const at::Tensor& targets) {
  return std::max(1.0, read_value(targets.ne(kIgnoreIndex).sum()));
}

// The mean loss (no `weights`), or the weighted sum of the rows' losses;
// `each` (when defined) receives every row's loss.
struct FusedHeadLossFunction : public torch::autograd::Function<FusedHeadLossFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            const at::Tensor& targets, int64_t chunk_rows, double grad_scale,
                            int64_t dtype, const std::optional<at::Tensor>& weights,
                            const std::optional<at::Tensor>& each, double softcap,
                            const std::optional<at::Tensor>& mean_logits, double count,
                            double logits_scale, const std::optional<at::Tensor>& entropies) {
    const HeadProjection p{weight, bias.value_or(at::Tensor()), softcap};
    HeadGrads g;
    g.want_hidden = hidden.requires_grad();
    g.want_weight = weight.requires_grad();
    g.want_bias = p.bias.defined() && p.bias.requires_grad();
    const at::Tensor sum = chunked_loss(
        hidden, targets, p, static_cast<at::ScalarType>(dtype), chunk_rows, grad_scale / count, g,
        weights.value_or(at::Tensor()), each.value_or(at::Tensor()),
        mean_logits.value_or(at::Tensor()), logits_scale, entropies.value_or(at::Tensor()));
    ctx->saved_data["grad_scale"] = grad_scale;
    ctx->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden.scalar_type());
    if (g.hidden.defined()) ctx->saved_data["hidden"] = g.hidden;
    if (g.weight.defined()) ctx->saved_data["weight"] = g.weight;
    if (g.bias.defined()) ctx->saved_data["bias"] = g.bias;
    return sum / count;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // Forward's gradients are for the loss times grad_scale; backward brings
    // the factor it is really multiplied by (the same, unless a caller
    // scaled it otherwise). Taken out of the node so that autograd can make
    // the buffer the parameter's .grad without a copy.
    const at::Tensor factor = grads[0] / ctx->saved_data["grad_scale"].toDouble();
    auto take = [&](const char* key) -> at::Tensor {
      auto it = ctx->saved_data.find(key);
      if (it == ctx->saved_data.end()) return {};
      at::Tensor t = it->second.toTensor();
      ctx->saved_data.erase(it);
      t.mul_(factor);
      return t;
    };
    at::Tensor dh = take("hidden"), dw = take("weight"), db = take("bias");
    const auto hidden_dtype = static_cast<at::ScalarType>(ctx->saved_data["hidden_dtype"].toInt());
    if (dh.defined() && dh.scalar_type() != hidden_dtype) dh = dh.to(hidden_dtype);
    return {dh,           dw,           db,           at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

namespace {

// The rows whose target counts, when some do not and the targets are on the
// host (a batch's, before they went to the device: no read of the device),
// as an index on `device`; undefined when every row counts, none does, or
// the targets are on a device. Read from the host's memory directly, so a
// batch whose targets all count dispatches no operator here.
at::Tensor counted_row_index(const at::Tensor& targets, at::Device device) {
  if (!targets.device().is_cpu() || targets.scalar_type() != at::kLong) return {};
  const at::Tensor t = targets.is_contiguous() ? targets : targets.contiguous();
  const int64_t* ids = t.const_data_ptr<int64_t>();
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (ids[i] != kIgnoreIndex) rows.push_back(i);
  if (rows.empty() || static_cast<int64_t>(rows.size()) == t.numel()) return {};
  return at::tensor(rows, at::kLong).to(device);
}

// Every row of hidden projected: hidden flattened, targets checked, the
// gradient-free path taken where nothing needs a gradient.
at::Tensor fused_head_all_rows(const at::Tensor& hidden, const at::Tensor& targets,
                               const HeadProjection& projection, int64_t chunk_rows,
                               double grad_scale, const at::Tensor& weights, const at::Tensor& each,
                               const at::Tensor& mean_logits, int64_t counted, double logits_scale,
                               const at::Tensor& entropies);

// The loss of the rows whose target counts alone, when some do not: a
// prompt's positions (a schedule's completions, an SFT batch's masked
// prompts) cost no projection over the vocabulary, as TRL's logits_to_keep.
// Their loss, entropy and gradient are 0 either way; `mean_logits` wants
// every row's, so it takes the whole rows. Undefined when not taken.
at::Tensor fused_head_of_counted_rows(const at::Tensor& hidden, const at::Tensor& targets,
                                      const HeadProjection& projection, int64_t chunk_rows,
                                      double grad_scale, const at::Tensor& weights,
                                      const at::Tensor& each, const at::Tensor& mean_logits,
                                      int64_t counted, double logits_scale,
                                      const at::Tensor& entropies) {
  if (mean_logits.defined() || counted == targets.numel() || hidden.dim() == 0 ||
      targets.numel() * hidden.size(-1) != hidden.numel())  // fused_head refuses it
    return {};
  const at::Tensor rows = counted_row_index(targets, hidden.device());
  if (!rows.defined()) return {};
  const at::Tensor h = hidden.reshape({-1, hidden.size(-1)});
  auto pick = [&](const at::Tensor& t) {
    return t.defined() ? t.reshape({-1}).to(h.device()).index_select(0, rows) : t;
  };
  const at::Tensor part_each = each.defined() ? at::zeros({rows.size(0)}, each.options()) : each;
  const at::Tensor part_entropies =
      entropies.defined() ? at::zeros({rows.size(0)}, entropies.options()) : entropies;
  at::Tensor loss = fused_head_all_rows(
      h.index_select(0, rows), pick(targets), projection, chunk_rows, grad_scale, pick(weights),
      part_each, at::Tensor(), counted >= 0 ? counted : rows.size(0), logits_scale, part_entropies);
  if (each.defined()) each.zero_().index_copy_(0, rows, part_each);
  if (entropies.defined()) entropies.zero_().index_copy_(0, rows, part_entropies);
  return loss;
}

// fused_head_loss and fused_head_weighted_loss: the counted rows alone
// where that is known on the host, else every row.
at::Tensor fused_head(const at::Tensor& hidden, const at::Tensor& targets,
                      const HeadProjection& projection, int64_t chunk_rows, double grad_scale,
                      const at::Tensor& weights, const at::Tensor& each,
                      const at::Tensor& mean_logits, int64_t counted, double logits_scale = 1.0,
                      const at::Tensor& entropies = {}) {
  if (chunk_rows <= 0) throw std::invalid_argument("fused loss: chunk_rows must be positive");
  if (at::Tensor loss =
          fused_head_of_counted_rows(hidden, targets, projection, chunk_rows, grad_scale, weights,
                                     each, mean_logits, counted, logits_scale, entropies);
      loss.defined())
    return loss;
  return fused_head_all_rows(hidden, targets, projection, chunk_rows, grad_scale, weights, each,
                             mean_logits, counted, logits_scale, entropies);
}

at::Tensor fused_head_all_rows(const at::Tensor& hidden, const at::Tensor& targets,
                               const HeadProjection& projection, int64_t chunk_rows,
                               double grad_scale, const at::Tensor& weights, const at::Tensor& each,
                               const at::Tensor& mean_logits, int64_t counted, double logits_scale,
                               const at::Tensor& entropies) {
  const at::Tensor h = hidden.reshape({-1, hidden.size(-1)});
  const at::Tensor t = targets.reshape({-1}).to(h.device(), at::kLong);
  if (t.size(0) != h.size(0))
    throw std::invalid_argument("fused loss: " + std::to_string(t.size(0)) + " targets for " +
                                std::to_string(h.size(0)) + " tokens");
  const at::Tensor w =
      weights.defined() ? weights.reshape({-1}).to(h.device(), at::kFloat) : weights;
  const at::ScalarType dtype = compute_dtype(projection.weight);
  // The mean's divisor: the counted targets, at least 1 (a weighted loss is a sum).
  const double count = w.defined()    ? 1.0
                       : counted >= 0 ? std::max(1.0, static_cast<double>(counted))
                                      : counted_rows(t);
  const bool grad = at::GradMode::is_enabled() &&
                    (h.requires_grad() || projection.weight.requires_grad() ||
                     (projection.bias.defined() && projection.bias.requires_grad()));
  if (!grad) {
    at::NoGradGuard no_grad;
    HeadGrads none;
    const at::Tensor sum = chunked_loss(h, t, projection, dtype, chunk_rows, 0.0, none, w, each,
                                        mean_logits, logits_scale, entropies);
    return w.defined() ? sum : sum / count;
  }
  std::optional<at::Tensor> bias, weights_opt, each_opt, means_opt, entropies_opt;
  if (projection.bias.defined()) bias = projection.bias;
  if (w.defined()) weights_opt = w;
  if (each.defined()) each_opt = each;
  if (mean_logits.defined()) means_opt = mean_logits;
  if (entropies.defined()) entropies_opt = entropies;
  return FusedHeadLossFunction::apply(
      h, projection.weight, bias, t, chunk_rows, grad_scale, static_cast<int64_t>(dtype),
      weights_opt, each_opt, projection.softcap, means_opt, count, logits_scale, entropies_opt);
}

}  // namespace

at::Tensor fused_head_loss(const at::Tensor& hidden, const at::Tensor& targets,
                           const HeadProjection& projection, int64_t chunk_rows, double grad_scale,
                           int64_t counted) {
  return fused_head(hidden, targets, projection, chunk_rows, grad_scale, at::Tensor(), at::Tensor(),
                    at::Tensor(), counted);
}

at::Tensor fused_head_weighted_loss(const at::Tensor& hidden, const at::Tensor& targets,
                                    const HeadProjection& projection, int64_t chunk_rows,
                                    double grad_scale, const at::Tensor& weights,
                                    const at::Tensor& each, const at::Tensor& mean_logits,
                                    double logits_scale, const at::Tensor& entropies) {
  if (!each.defined() || each.numel() != targets.numel())
    throw std::invalid_argument("fused weighted loss: one loss slot per target");
  if (mean_logits.defined() && mean_logits.numel() != targets.numel())
    throw std::invalid_argument("fused weighted loss: one mean-logit slot per target");
  if (entropies.defined() && entropies.numel() != targets.numel())
    throw std::invalid_argument("fused weighted loss: one entropy slot per target");
  return fused_head(hidden, targets, projection, chunk_rows, grad_scale, weights, each, mean_logits,
                    /*counted=*/-1, logits_scale, entropies);
}

}  // namespace tightfit
