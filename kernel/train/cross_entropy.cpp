#include "cross_entropy.hpp"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <string>

#include "host_reads.hpp"

namespace tightfit {

int64_t cross_entropy_block_rows(int64_t vocab) {
  return std::max<int64_t>(1, (int64_t{8} << 20) / (4 * std::max<int64_t>(vocab, 1)));
}

namespace {

// Whether the logits' storage may be overwritten in backward: only when the
// op that made them keeps its inputs, not its output, for its own backward
// (a matmul, a copy), seen through views. Anything else (a tanh soft-cap
// saves its result) gets a separate gradient tensor.
bool may_overwrite(const at::Tensor& logits) {
  const auto* node = logits.grad_fn().get();
  while (node != nullptr) {
    const std::string name = node->name();
    if (name == "torch::autograd::CopySlices") return false;
    if (name.find("View") != std::string::npos || name.find("Reshape") != std::string::npos ||
        name.find("Transpose") != std::string::npos) {
      node = node->next_edges().empty() ? nullptr : node->next_edges()[0].function.get();
      continue;
    }
    return name == "MmBackward0" || name == "AddmmBackward0" || name == "BmmBackward0" ||
           name == "MatmulBackward0" || name == "LinearBackward0" || name == "ToCopyBackward0" ||
           name == "CloneBackward0";
  }
  return false;  // a leaf (or no grad): the caller's tensor
}

// log sum_j exp(logits[i, j]) per row, a block of rows at a time.
at::Tensor row_logsumexp(const at::Tensor& logits) {
  const int64_t n = logits.size(0), rows = cross_entropy_block_rows(logits.size(1));
  at::Tensor lse = at::empty({n}, logits.options());
  for (int64_t i = 0; i < n; i += rows) {
    const int64_t m = std::min(rows, n - i);
    lse.narrow(0, i, m).copy_(at::logsumexp(logits.narrow(0, i, m), {1}));
  }
  return lse;
}

at::Tensor mean_loss(const at::Tensor& lse, const at::Tensor& logits, const at::Tensor& targets,
                     const at::Tensor& counted) {
  if (!counted.defined()) return (lse - logits.gather(1, targets.unsqueeze(1)).squeeze(1)).mean();
  // Ignored rows gather a valid index (0) and count nothing.
  const at::Tensor safe = targets.clamp_min(0);
  const at::Tensor per_row = (lse - logits.gather(1, safe.unsqueeze(1)).squeeze(1)) * counted;
  return per_row.sum() / counted.sum().clamp_min(1);
}

// The rows whose target counts, as a 0/1 tensor of the logits' dtype, or an
// undefined tensor when every row counts (the plain mean, bit for bit).
// `counted`: how many do, when the caller knows; -1 reads whether any is
// ignored.
at::Tensor counted_rows(const at::Tensor& logits, const at::Tensor& targets, int64_t counted) {
  if (counted == targets.numel()) return {};
  const at::Tensor ignored = targets.eq(kIgnoreIndex);
  if (counted < 0 && read_value(ignored.any()) == 0) return {};
  return ignored.logical_not().to(logits.scalar_type());
}

// The mean's divisor: the counted rows (at least 1), or all of them.
double mean_divisor(const at::Tensor& counted_mask, int64_t counted, int64_t n) {
  if (!counted_mask.defined()) return static_cast<double>(n);
  if (counted >= 0) return std::max(1.0, static_cast<double>(counted));
  return std::max(1.0, read_value(counted_mask.sum()));
}

struct CrossEntropyMean : public torch::autograd::Function<CrossEntropyMean> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, int64_t n_counted) {
    const at::Tensor lse = row_logsumexp(logits);
    const at::Tensor counted = counted_rows(logits, targets, n_counted);
    ctx->save_for_backward({logits, targets, lse, counted});
    ctx->saved_data["in_place"] = may_overwrite(logits);
    ctx->saved_data["n_counted"] = n_counted;
    return mean_loss(lse, logits, targets, counted);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    const at::Tensor& targets = saved[1];
    const at::Tensor& lse = saved[2];
    const at::Tensor& counted = saved[3];
    at::Tensor g = ctx->saved_data["in_place"].toBool() ? logits : at::empty_like(logits);
    const int64_t n = logits.size(0), rows = cross_entropy_block_rows(logits.size(1));
    // d mean / d logits = (softmax - onehot) / N, times the incoming gradient;
    // with ignored rows, N counts the others and ignored rows get zero.
    const double count = mean_divisor(counted, ctx->saved_data["n_counted"].toInt(), n);
    const at::Tensor scale = grads[0].to(logits.scalar_type()) / count;
    for (int64_t i = 0; i < n; i += rows) {
      const int64_t m = std::min(rows, n - i);
      at::Tensor block = g.narrow(0, i, m);
      at::sub_out(block, logits.narrow(0, i, m), lse.narrow(0, i, m).unsqueeze(1));
      block.exp_().mul_(scale);
      if (counted.defined()) block.mul_(counted.narrow(0, i, m).unsqueeze(1));
    }
    if (!counted.defined()) {
      g.scatter_add_(1, targets.unsqueeze(1), (-scale).expand({n, 1}).contiguous());
    } else {
      g.scatter_add_(1, targets.clamp_min(0).unsqueeze(1),
                     (-scale * counted).unsqueeze(1).contiguous());
    }
    return {g, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor cross_entropy_each(const at::Tensor& logits, const at::Tensor& targets,
                              const at::Tensor& grad, double grad_scale,
                              const at::Tensor& weights) {
  const at::Tensor lse = row_logsumexp(logits);
  const at::Tensor counted = targets.ne(kIgnoreIndex).to(logits.scalar_type());
  const at::Tensor safe = targets.clamp_min(0).unsqueeze(1);
  // Read before `grad` (which may be the logits) is written.
  const at::Tensor each = (lse - logits.gather(1, safe).squeeze(1)) * counted;
  if (!grad.defined()) return each;
  const at::Tensor factor = weights.defined()
                                ? counted * weights.to(counted.scalar_type()) * grad_scale
                                : counted * grad_scale;
  const int64_t n = logits.size(0), rows = cross_entropy_block_rows(logits.size(1));
  for (int64_t i = 0; i < n; i += rows) {
    const int64_t m = std::min(rows, n - i);
    at::Tensor block = grad.narrow(0, i, m);
    at::sub_out(block, logits.narrow(0, i, m), lse.narrow(0, i, m).unsqueeze(1));
    block.exp_().mul_(factor.narrow(0, i, m).unsqueeze(1));
  }
  grad.scatter_add_(1, safe, (-factor).unsqueeze(1));
  return each;
}

at::Tensor cross_entropy_rows(const at::Tensor& logits, const at::Tensor& targets,
                              const at::Tensor& grad, double grad_scale) {
  return cross_entropy_each(logits, targets, grad, grad_scale, at::Tensor()).sum();
}

at::Tensor cross_entropy_mean(const at::Tensor& logits, const at::Tensor& targets,
                              int64_t counted) {
  // No backward: the same value, with no state kept.
  if (!logits.requires_grad() || !at::GradMode::is_enabled())
    return mean_loss(row_logsumexp(logits), logits, targets,
                     counted_rows(logits, targets, counted));
  return CrossEntropyMean::apply(logits, targets, counted);
}

}  // namespace tightfit
