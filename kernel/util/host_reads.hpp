// Reads of device values by the host. On a GPU each read waits until the
// device has run everything queued before it, so the training path reads
// only through these functions, and a step reads at most a few times
// (tests/test_step_reads.cpp bounds the count for every stack). They never
// go through Tensor::item() (LibTorch's _local_scalar_dense): the test
// counts item() calls apart, so a read that bypasses these shows up there.
// A tensor already on the host is read the same way and counted the same:
// on the CPU the run's device is the host, and the count is what a GPU run
// would wait for.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace tightfit {

// Every value of `t` (any shape, any real dtype, bool as 0/1) as doubles, in
// one read.
std::vector<double> read_values(const at::Tensor& t);
// The one value of a one-element tensor.
double read_value(const at::Tensor& t);
// A host copy of `t` (contiguous), in one read.
at::Tensor read_to_host(const at::Tensor& t);

// Reads made so far in this process (all threads).
int64_t host_reads();

// How many of `values` (integers) are not `ignored`: counted on the host
// without a read when they are there (a batch's targets before they go to
// the device), else with one read.
int64_t count_not_equal(const at::Tensor& values, int64_t ignored);

}  // namespace tightfit
