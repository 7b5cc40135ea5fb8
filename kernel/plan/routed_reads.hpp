// What a training pass reads of the weights that come in only when a batch
// routes to them: a mixture of experts' frozen expert weights
// (TF_PARAM_EXPERT) planned in the host or disk tier, which a strategy
// brings in one by one as the model fetches them (ABI 1.15's want_weight,
// as offload does), not with their stage, so no prefetch hides the reads.
//
// A weight whose routed share is s (ABI 1.17: top_k / n_experts) is used by
// a pass of T tokens with probability 1 - (1 - s)^T when the router chooses
// each token's experts evenly and independently of the other tokens: the
// estimate. Text routes less evenly than that (a repeated token goes where
// it went before, so fewer experts are used), and a router trained to
// balance its load over a small batch can use more, up to min(1, T s) of
// them: the bound. A weight declared without a share counts as always used.
// Each use the plan's timeline has reads it: the forward, a recompute, and
// the backward (the input's gradient needs the frozen weight again).
#pragma once

#include <cstdint>
#include <vector>

#include "stage_flow.hpp"

namespace tightfit {

struct KernelParts;
struct Param;

// Whether `p`, kept in the host or disk tier, is read when a batch routes
// to it rather than with its stage: a frozen expert weight.
bool read_when_routed(const Param& p);

struct RoutedReads {
  int64_t weights = 0;            // routed weights kept in the host or disk tier
  int64_t bytes = 0;              // their bytes
  double used_per_pass = 0;       // expected weights a pass uses (even, independent routing)
  double most_used_per_pass = 0;  // the most a pass can use (T s each, at most all)
  double reads_per_pass = 0;      // expected reads a pass makes (each use reads)
  double bytes_per_pass = 0;      // their bytes
  // Per declared stage: the expected bytes one use of the stage reads, by tier.
  std::vector<double> stage_host_bytes, stage_disk_bytes;
  bool any() const { return weights > 0; }
};

// The probability that a pass of `tokens` tokens routes any to a weight
// whose share is `share` (0: always used), each token's choice even and
// independent of the others'.
double routed_use_probability(double share, double tokens);

// From the kernel's planned parameter table (plan_memory fills it) and the
// plan's stage flows.
RoutedReads plan_routed_reads(const KernelParts& kernel, const std::vector<StageFlow>& stages);

}  // namespace tightfit
