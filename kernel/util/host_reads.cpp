#include "host_reads.hpp"

#include <atomic>
#include <stdexcept>
#include <string>

namespace tightfit {
namespace {
std::atomic<int64_t> reads{0};
}  // namespace

at::Tensor read_to_host(const at::Tensor& t) {
  reads.fetch_add(1, std::memory_order_relaxed);
  // One copy; a non-blocking copy to pageable memory still waits on a GPU.
  return t.detach().to(at::kCPU).contiguous();
}

std::vector<double> read_values(const at::Tensor& t) {
  reads.fetch_add(1, std::memory_order_relaxed);
  // (detach and the copy only where they change something: each op is a
  // launch on a GPU.)
  const at::Tensor plain = t.requires_grad() ? t.detach() : t;
  const at::Tensor host = plain.to(at::kCPU, at::kDouble).contiguous();
  const double* p = host.data_ptr<double>();
  return std::vector<double>(p, p + host.numel());
}

double read_value(const at::Tensor& t) {
  if (t.numel() != 1)
    throw std::invalid_argument("read_value: a tensor of " + std::to_string(t.numel()) +
                                " values, not one");
  return read_values(t)[0];
}

int64_t host_reads() {
  return reads.load(std::memory_order_relaxed);
}

int64_t count_not_equal(const at::Tensor& values, int64_t ignored) {
  if (!values.device().is_cpu()) return static_cast<int64_t>(read_value(values.ne(ignored).sum()));
  const at::Tensor v = values.to(at::kLong).contiguous();
  const int64_t* p = v.data_ptr<int64_t>();
  int64_t n = 0;
  for (int64_t i = 0, end = v.numel(); i < end; ++i) n += p[i] != ignored ? 1 : 0;
  return n;
}

}  // namespace tightfit
