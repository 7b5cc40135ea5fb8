// What this machine does per second, measured here and now, for the step-time
// cost model (`tightfit fit`): matmul throughput at the shapes a model's
// linears have, memory bandwidth, the host link, the disk tier (warm in the
// page cache and cold), and the dequantization of 4-bit weights.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <map>
#include <string>

namespace tightfit {

struct MachineRates {
  std::string device;  // "cpu", "cuda:0"
  int threads = 1;
  // Matmul FLOP/s by rows (tokens in a micro-batch), for fp32 and bf16.
  std::map<int64_t, double> fp32_flops, bf16_flops;
  double memory_bytes_per_s = 0;  // a large copy on the device (read + write counted)
  // Elementwise work of a training step per byte of activations autograd
  // keeps (norm, activation function, softmax: forward and backward), fp32
  // and bf16.
  double activation_fp32_bytes_per_s = 0, activation_bf16_bytes_per_s = 0;
  double host_link_bytes_per_s = 0;  // device <-> host; on a CPU run, the copy rate
  // The disk tier is memory-mapped: warm, it reads (and is written) at page-
  // cache speed; cold, at the disk's. Bytes/s.
  double disk_read_warm = 0, disk_read_cold = 0, disk_write = 0;
  double dequant_values_per_s = 0;  // 4-bit table lookup and block scale, values out
  int64_t ram_available = 0;        // MemAvailable: what the page cache can hold

  // The matmul rate at `rows` (the nearest measured row count) for fp32 or bf16.
  double matmul_flops(int64_t rows, bool bf16) const;
};

// Matmul FLOP/s of [rows, k] x [k, n] on `device` for each row count, fp32
// and bf16 (k and n capped so one measurement takes well under a second):
// which precision is fast here, as a cuBLAS workspace probe is measured.
struct MatmulRates {
  std::map<int64_t, double> fp32_flops, bf16_flops;
};
MatmulRates measure_matmul_rates(const at::Device& device, const std::vector<int64_t>& rows,
                                 int64_t k, int64_t n);

// Measures the rates on `device` with matmuls of rows x k x n for each row
// count in `rows` (k and n capped so one measurement takes well under a
// second), using `scratch_dir` for the disk measurements (a file is written
// and removed). Throws std::runtime_error when the scratch folder is unusable.
MachineRates measure_machine_rates(const at::Device& device, const std::vector<int64_t>& rows,
                                   int64_t k, int64_t n, const std::string& scratch_dir);

// MemAvailable now (bytes): what the page cache could hold.
int64_t available_ram();

}  // namespace tightfit
