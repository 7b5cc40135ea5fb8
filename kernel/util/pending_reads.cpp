#include "pending_reads.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "host_reads.hpp"

namespace tightfit {

void PendingReads::add(const at::Tensor& value, Fill fill, bool outlives) {
  if (value.numel() != 1)
    throw std::invalid_argument("a pending read holds one value, not " +
                                std::to_string(value.numel()));
  if (!open_) {
    const std::vector<double> now = read_with({value});
    fill(now[0]);
    return;
  }
  pending_.push_back({value, std::move(fill), outlives});
}

size_t PendingReads::close() {
  open_ = false;
  std::vector<Pending> kept;
  size_t forgotten = 0;
  for (Pending& p : pending_) {
    if (p.outlives)
      kept.push_back(std::move(p));
    else
      ++forgotten;
  }
  pending_ = std::move(kept);
  read_with();
  return forgotten;
}

std::vector<double> PendingReads::read_with(const std::vector<at::Tensor>& now) {
  std::vector<at::Tensor> values;
  values.reserve(now.size() + pending_.size());
  for (const at::Tensor& t : now) {
    if (t.numel() != 1)
      throw std::invalid_argument("read_with: a tensor of " + std::to_string(t.numel()) +
                                  " values, not one");
    values.push_back(t);
  }
  for (const Pending& p : pending_) values.push_back(p.value);
  if (values.empty()) return {};
  // One device and dtype for the stack (stages may sit on several); fp64
  // keeps every value as it was (a loss in fp32, a norm in fp64). Each op
  // here is a launch on a GPU: only the conversions that change something.
  const at::Device where = values.front().device();
  for (at::Tensor& v : values) {
    if (v.requires_grad()) v = v.detach();
    if (v.dim() != 0) v = v.reshape({});
    if (v.device() != where || v.scalar_type() != at::kDouble) v = v.to(where, at::kDouble);
  }
  const std::vector<double> read =
      read_values(values.size() == 1 ? values.front() : at::stack(values));
  std::vector<Pending> pending = std::exchange(pending_, {});
  for (size_t i = 0; i < pending.size(); ++i) pending[i].fill(read[now.size() + i]);
  return {read.begin(), read.begin() + static_cast<std::ptrdiff_t>(now.size())};
}

}  // namespace tightfit
