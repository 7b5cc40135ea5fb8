#include "example_batcher.hpp"

#include <algorithm>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

#include "cross_entropy.hpp"
#include "memory_accounting.hpp"

namespace tightfit {
namespace {

// A permutation of [0, n) from `seed` (std::mt19937_64 and a Fisher-Yates
// shuffle written out: std::shuffle's draws are the library's choice).
std::vector<size_t> permutation(size_t n, uint64_t seed) {
  std::vector<size_t> p(n);
  std::iota(p.begin(), p.end(), size_t{0});
  std::mt19937_64 rng(seed);
  for (size_t i = n; i > 1; --i) std::swap(p[i - 1], p[rng() % i]);
  return p;
}

}  // namespace

ExampleBatcher::ExampleBatcher(std::vector<Example> examples, int64_t seq_len, int64_t batch_size,
                               uint64_t seed, double val_fraction, int64_t pad_id)
    : seq_len_(seq_len), batch_size_(batch_size), pad_id_(pad_id), seed_(seed) {
  counts_.examples = static_cast<int64_t>(examples.size());
  std::vector<Example> kept;
  for (Example& e : examples) {
    if (static_cast<int64_t>(e.ids.size()) > seq_len + 1) {
      e.ids.resize(static_cast<size_t>(seq_len + 1));
      e.trained.resize(static_cast<size_t>(seq_len + 1));
      ++counts_.truncated;
    }
    // Position 0 is never a target: a row trains on trained[1..].
    if (e.ids.size() < 2 ||
        std::none_of(e.trained.begin() + 1, e.trained.end(), [](uint8_t t) { return t != 0; })) {
      ++counts_.without_answer;
      continue;
    }
    kept.push_back(std::move(e));
  }
  if (kept.empty())
    throw std::runtime_error(
        "none of the " + std::to_string(counts_.examples) +
        " examples has a token to train on within seq_len = " + std::to_string(seq_len) +
        " (prompts longer than seq_len?): raise [data] seq_len");
  const std::vector<size_t> order = permutation(kept.size(), seed ^ 0xA5A5A5A5ull);
  size_t n_val = static_cast<size_t>(static_cast<double>(kept.size()) * val_fraction);
  if (n_val >= kept.size()) n_val = kept.size() - 1;
  for (size_t k = 0; k < order.size(); ++k)
    (k < n_val ? val_ : train_).push_back(std::move(kept[order[k]]));
  counts_.train = static_cast<int64_t>(train_.size());
  counts_.validation = static_cast<int64_t>(val_.size());
  for (const Example& e : train_)
    counts_.trained_tokens += std::count(e.trained.begin() + 1, e.trained.end(), uint8_t{1});
}

ExampleBatcher::Batch ExampleBatcher::rows(const std::vector<const Example*>& examples) const {
  CategoryScope scope(TF_MEM_OTHER);
  const int64_t B = static_cast<int64_t>(examples.size()), T = seq_len_;
  at::Tensor tokens = at::full({B, T}, pad_id_, at::kLong);
  at::Tensor targets = at::full({B, T}, kIgnoreIndex, at::kLong);
  auto* tok = tokens.data_ptr<int64_t>();
  auto* tgt = targets.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const Example& e = *examples[static_cast<size_t>(b)];
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(e.ids.size()) - 1, T);
    for (int64_t t = 0; t < n; ++t) {
      tok[b * T + t] = e.ids[static_cast<size_t>(t)];
      if (e.trained[static_cast<size_t>(t + 1)]) tgt[b * T + t] = e.ids[static_cast<size_t>(t + 1)];
    }
  }
  return {tokens, targets};
}

ExampleBatcher::Batch ExampleBatcher::next() {
  const size_t n = train_.size();
  std::vector<const Example*> picked;
  for (int64_t k = 0; k < batch_size_; ++k) {
    const uint64_t g = static_cast<uint64_t>(position_) * static_cast<uint64_t>(batch_size_) +
                       static_cast<uint64_t>(k);
    const int64_t epoch = static_cast<int64_t>(g / n);
    if (epoch != order_epoch_) {  // each epoch its own order, from (seed, epoch) alone
      order_ = permutation(n, seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
      order_epoch_ = epoch;
    }
    picked.push_back(&train_[order_[g % n]]);
  }
  ++position_;
  return rows(picked);
}

ExampleBatcher::Batch ExampleBatcher::validation(int64_t i) const {
  const std::vector<Example>& split = val_.empty() ? train_ : val_;
  std::vector<const Example*> picked;
  for (int64_t k = 0; k < batch_size_; ++k)
    picked.push_back(&split[static_cast<size_t>(i * batch_size_ + k) % split.size()]);
  return rows(picked);
}

at::Tensor ExampleBatcher::train_ids() const {
  std::vector<int64_t> all;
  for (const Example& e : train_) all.insert(all.end(), e.ids.begin(), e.ids.end());
  return at::tensor(all, at::kLong);
}

}  // namespace tightfit
