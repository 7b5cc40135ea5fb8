#include "machine_rates.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "cuda_memory.hpp"
#include "file_util.hpp"

namespace tightfit {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Waits for the device to finish (a CPU op is done when it returns).
void sync(const at::Tensor& t) {
  if (t.is_cuda()) (void)t.sum().item<double>();
}

// Runs `body` until `min_seconds` have passed (at least `min_reps` times)
// after one warm-up call; returns seconds per call. (The fastest of several
// short windows was tried: it ranks the same and predicts steps 25% too
// fast, since real steps do not run in the machine's best moments.)
template <class F>
double time_per_call(F&& body, double min_seconds, int min_reps) {
  body();
  int reps = 0;
  const auto t0 = Clock::now();
  while (reps < min_reps || seconds_since(t0) < min_seconds) {
    body();
    ++reps;
  }
  return seconds_since(t0) / reps;
}

int64_t mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// Reads `path` to the end in 4 MiB pieces; bytes per second.
double read_rate(const std::string& path, int64_t bytes, bool cold) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot read the scratch file " + path);
  // Cold: ask the kernel to drop the file's cached pages first (what a tier
  // larger than the page cache sees).
  if (cold) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  std::vector<char> buf(4 << 20);
  const auto t0 = Clock::now();
  int64_t total = 0;
  for (ssize_t got; (got = ::read(fd, buf.data(), buf.size())) > 0;) total += got;
  const double s = seconds_since(t0);
  ::close(fd);
  return total == bytes && s > 0 ? static_cast<double>(bytes) / s : 0;
}

}  // namespace

int64_t available_ram() {
  return mem_available();
}

double MachineRates::matmul_flops(int64_t rows, bool bf16) const {
  const auto& m = bf16 ? bf16_flops : fp32_flops;
  if (m.empty()) return 0;
  auto best = m.begin();
  for (auto it = m.begin(); it != m.end(); ++it)
    if (std::abs(std::log(static_cast<double>(it->first) / static_cast<double>(rows))) <
        std::abs(std::log(static_cast<double>(best->first) / static_cast<double>(rows))))
      best = it;
  return best->second;
}

MatmulRates measure_matmul_rates(const at::Device& device, const std::vector<int64_t>& rows,
                                 int64_t k, int64_t n) {
  MatmulRates r;
  const auto opts = at::TensorOptions().device(device);
  // Matmuls as a linear does them: [rows, k] x [k, n]. Capped shapes keep
  // the measurement short; the rate has levelled off well before the caps.
  k = std::clamp<int64_t>(k, 64, 2048);
  n = std::clamp<int64_t>(n, 64, 4096);
  for (int64_t m : rows) {
    const int64_t mm = std::clamp<int64_t>(m, 1, 2048);
    for (bool bf16 : {false, true}) {
      const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
      const at::Tensor a = at::randn({mm, k}, opts.dtype(dtype));
      const at::Tensor b = at::randn({k, n}, opts.dtype(dtype));
      at::Tensor c;
      const double s = time_per_call(
          [&] {
            c = at::matmul(a, b);
            sync(c);
          },
          0.15, 2);
      (bf16 ? r.bf16_flops : r.fp32_flops)[m] = 2.0 * static_cast<double>(mm * k * n) / s;
    }
  }
  return r;
}

MachineRates measure_machine_rates(const at::Device& device, const std::vector<int64_t>& rows,
                                   int64_t k, int64_t n, const std::string& scratch_dir) {
  // The rates are those of the device the recipe names; a GPU recipe's
  // cannot be measured on a machine without that GPU.
  if (device.is_cuda() && !cuda_device_usable(device.has_index() ? device.index() : 0))
    throw std::runtime_error("the rates of " + device.str() +
                             " are measured on it, and no such CUDA device is available here: "
                             "run fit on the machine with the GPU, or check that a stack fits "
                             "with `tightfit plan RECIPE --budget SIZE` (no rates needed)");
  MachineRates r;
  r.device = device.str();
  r.threads = at::get_num_threads();
  r.ram_available = mem_available();
  MatmulRates matmuls = measure_matmul_rates(device, rows, k, n);
  r.fp32_flops = std::move(matmuls.fp32_flops);
  r.bf16_flops = std::move(matmuls.bf16_flops);
  const auto opts = at::TensorOptions().device(device);
  // A smaller micro-batch is never more efficient: what looks so is timing
  // noise (on a busy machine), which would otherwise rank stacks.
  for (auto* m : {&r.fp32_flops, &r.bf16_flops}) {
    double larger = 0;
    for (auto it = m->rbegin(); it != m->rend(); ++it) {
      if (larger > 0) it->second = std::min(it->second, larger);
      larger = it->second;
    }
  }
  // Bandwidth: a 64 MiB copy reads and writes every byte.
  {
    const int64_t values = 16 << 20;
    const at::Tensor src = at::rand({values}, opts);
    at::Tensor dst = at::empty_like(src);
    const double s = time_per_call(
        [&] {
          dst.copy_(src);
          sync(dst);
        },
        0.1, 3);
    r.memory_bytes_per_s = 2.0 * 4 * static_cast<double>(values) / s;
    if (device.is_cuda()) {
      const at::Tensor host = at::empty({values}, at::TensorOptions().pinned_memory(true));
      const double h = time_per_call(
          [&] {
            dst.copy_(host, /*non_blocking=*/false);
            sync(dst);
          },
          0.1, 3);
      r.host_link_bytes_per_s = 4 * static_cast<double>(values) / h;
    } else {
      r.host_link_bytes_per_s = r.memory_bytes_per_s / 2;  // one way: a plain copy in RAM
    }
  }
  // Elementwise: layer norm, tanh-GELU and softmax over [rows, n], forward
  // and backward; autograd keeps about three tensors of that size.
  for (bool bf16 : {false, true}) {
    const int64_t mm = std::clamp<int64_t>(rows.empty() ? 1024 : rows.front(), 64, 2048);
    const at::Tensor x =
        at::randn({mm, n}, opts.dtype(bf16 ? at::kBFloat16 : at::kFloat)).requires_grad_(true);
    const double s = time_per_call(
        [&] {
          at::Tensor y = at::layer_norm(x, {n});
          y = at::softmax(at::gelu(y, "tanh"), -1);
          y.backward(at::ones_like(y));
          sync(x.grad());
        },
        0.15, 2);
    (bf16 ? r.activation_bf16_bytes_per_s : r.activation_fp32_bytes_per_s) =
        3.0 * static_cast<double>(x.numel() * x.element_size()) / s;
  }
  // 4-bit dequantization as the quantize plugin does it: unpack two codes a
  // byte, look them up in the 16 levels, scale each block of 64.
  {
    const int64_t values = 4 << 20;
    const at::Tensor packed = at::randint(0, 256, {values / 2}, opts.dtype(at::kByte));
    const at::Tensor levels = at::randn({16}, opts);
    const at::Tensor absmax = at::rand({values / 64}, opts);
    at::Tensor out;
    const double s = time_per_call(
        [&] {
          const at::Tensor codes =
              at::stack({packed.div(16, "floor"), packed.remainder(16)}, 1).flatten().to(at::kInt);
          out = levels.index_select(0, codes).view({-1, 64}) * absmax.unsqueeze(1);
          sync(out);
        },
        0.1, 3);
    r.dequant_values_per_s = static_cast<double>(values) / s;
  }
  // The disk tier: write 64 MiB, fsync, read it back warm and cold.
  {
    // A new file of this process's own: a name planted there (a link to a
    // user's file) is refused, never written through or truncated.
    const std::string path = scratch_dir + "/.tightfit-rates-scratch-" + std::to_string(::getpid());
    const int64_t bytes = 64 << 20;
    std::vector<char> buf(4 << 20, 'x');
    {
      const int fd =
          ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0)
        throw std::runtime_error("cannot create the scratch file " + path +
                                 " to measure the disk (" + std::strerror(errno) +
                                 "; use a writable folder)");
      const auto t0 = Clock::now();
      bool ok = true;
      for (int64_t done = 0; done < bytes && ok; done += static_cast<int64_t>(buf.size()))
        ok = ::write(fd, buf.data(), buf.size()) == static_cast<ssize_t>(buf.size());
      ok = ok && ::fsync(fd) == 0;
      const double s = seconds_since(t0);
      ::close(fd);
      if (!ok) {
        remove_tree(path);
        throw std::runtime_error("writing a scratch file in " + scratch_dir + " failed");
      }
      r.disk_write = static_cast<double>(bytes) / s;
    }
    r.disk_read_warm = read_rate(path, bytes, false);
    r.disk_read_cold = read_rate(path, bytes, true);
    remove_tree(path);
  }
  return r;
}

}  // namespace tightfit
