#include "example_batcher.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

#include "ignore_index.hpp"
#include "memory_accounting.hpp"

namespace tightfit {
// std::mt19937_64 and a Fisher-Yates shuffle written out: std::shuffle's
// draws are the library's choice.
std::vector<size_t> seeded_permutation(size_t n, uint64_t seed) {
  std::vector<size_t> p(n);
  std::iota(p.begin(), p.end(), size_t{0});
  std::mt19937_64 rng(seed);
  for (size_t i = n; i > 1; --i) std::swap(p[i - 1], p[rng() % i]);
  return p;
}

namespace {

// Tokens an example fills in a row: all its ids but the last, which is only a target.
int64_t row_length(const Example& e) {
  return static_cast<int64_t>(e.ids.size()) - 1;
}

}  // namespace

std::vector<bool> ExampleBatcher::held_out(size_t units, double val_fraction, uint64_t seed) {
  std::vector<bool> held(units, false);
  if (units == 0) return held;
  const std::vector<size_t> order = seeded_permutation(units, seed ^ 0xA5A5A5A5ull);
  size_t n_val = static_cast<size_t>(static_cast<double>(units) * val_fraction);
  if (n_val >= units) n_val = units - 1;
  for (size_t k = 0; k < n_val; ++k) held[order[k]] = true;
  return held;
}

std::vector<std::vector<Example>> ExampleBatcher::take_units(std::vector<Example>& examples,
                                                             bool keep_unanswered) {
  if (examples.size() % static_cast<size_t>(group_) != 0)
    throw std::logic_error("ExampleBatcher: preference pairs come as an even number of examples");
  counts_.examples += static_cast<int64_t>(examples.size()) / group_;
  std::vector<std::vector<Example>> kept;
  for (size_t u = 0; u < examples.size(); u += static_cast<size_t>(group_)) {
    bool answered = true;
    for (int64_t k = 0; k < group_; ++k) {
      Example& e = examples[u + static_cast<size_t>(k)];
      if (static_cast<int64_t>(e.ids.size()) > seq_len_ + 1) {
        e.ids.resize(static_cast<size_t>(seq_len_ + 1));
        e.trained.resize(static_cast<size_t>(seq_len_ + 1));
        ++counts_.truncated;
      }
      // Position 0 is never a target: a row trains on trained[1..].
      answered =
          answered && e.ids.size() >= 2 &&
          std::any_of(e.trained.begin() + 1, e.trained.end(), [](uint8_t t) { return t != 0; });
    }
    // A pair is kept as TRL keeps it: a side without a completion token
    // has log-probability 0.
    if (!answered) ++counts_.without_answer;
    if (!answered && !keep_unanswered) continue;
    std::vector<Example> unit;
    for (int64_t k = 0; k < group_; ++k)
      unit.push_back(std::move(examples[u + static_cast<size_t>(k)]));
    kept.push_back(std::move(unit));
  }
  return kept;
}

ExampleBatcher::ExampleBatcher(std::vector<Example> examples, int64_t seq_len, int64_t batch_size,
                               uint64_t seed, double val_fraction, int64_t pad_id, bool packing,
                               bool pairs)
    : seq_len_(seq_len),
      batch_size_(batch_size),
      pad_id_(pad_id),
      group_(pairs ? 2 : 1),
      packing_(packing),
      seed_(seed) {
  if (pairs && packing)
    throw std::invalid_argument(
        "packing = true packs examples, and preference pairs are two sequences each: drop packing");
  // Whole units (an example, or a pair) are kept, held out and shuffled.
  std::vector<std::vector<Example>> kept = take_units(examples, pairs);
  if (kept.empty())
    throw std::runtime_error(
        "none of the " + std::to_string(counts_.examples) +
        " examples has a token to train on within seq_len = " + std::to_string(seq_len) +
        " (prompts longer than seq_len?): raise [data] seq_len");
  const std::vector<size_t> order = seeded_permutation(kept.size(), seed ^ 0xA5A5A5A5ull);
  const std::vector<bool> held = held_out(kept.size(), val_fraction, seed);
  for (size_t k = 0; k < order.size(); ++k)
    for (Example& e : kept[order[k]]) (held[order[k]] ? val_ : train_).push_back(std::move(e));
  finish();
}

ExampleBatcher::ExampleBatcher(Splits splits, int64_t seq_len, int64_t batch_size, int64_t pad_id,
                               bool fill_last)
    : seq_len_(seq_len),
      batch_size_(batch_size),
      pad_id_(pad_id),
      group_(2),
      packing_(false),
      seed_(0),
      sequential_(true),
      fill_last_(fill_last) {
  for (auto [split, into] : {std::pair{&splits.train, &train_}, {&splits.validation, &val_}})
    for (std::vector<Example>& unit : take_units(*split, /*keep_unanswered=*/true))
      for (Example& e : unit) into->push_back(std::move(e));
  if (train_.empty()) throw std::runtime_error("no rows to train on: the corpus has none");
  finish();
}

void ExampleBatcher::finish() {
  counts_.train = static_cast<int64_t>(train_.size()) / group_;
  counts_.validation = static_cast<int64_t>(val_.size()) / group_;
  int64_t filled = 0;
  for (const Example& e : train_) {
    counts_.trained_tokens += std::count(e.trained.begin() + 1, e.trained.end(), uint8_t{1});
    filled += row_length(e);
  }
  train_rows_ = make_rows(train_);
  val_rows_ = make_rows(val_);
  counts_.rows = static_cast<int64_t>(train_rows_.size());
  counts_.row_fill = static_cast<double>(filled) / static_cast<double>(counts_.rows * seq_len_);
}

std::vector<ExampleBatcher::Row> ExampleBatcher::make_rows(
    const std::vector<Example>& split) const {
  std::vector<Row> rows;
  if (!packing_) {
    for (const Example& e : split) rows.push_back({&e});
    return rows;
  }
  // Best fit decreasing: longest first, each into the row it leaves least
  // room in (a new row when none has room). Ties keep the split's order.
  std::vector<size_t> by_length(split.size());
  std::iota(by_length.begin(), by_length.end(), size_t{0});
  std::stable_sort(by_length.begin(), by_length.end(),
                   [&](size_t a, size_t b) { return row_length(split[a]) > row_length(split[b]); });
  std::multimap<int64_t, size_t> room;  // free tokens -> row
  for (size_t i : by_length) {
    const int64_t n = row_length(split[i]);
    auto fit = room.lower_bound(n);
    size_t row = rows.size();
    int64_t left = seq_len_;
    if (fit != room.end()) {
      row = fit->second;
      left = fit->first;
      room.erase(fit);
    } else {
      rows.emplace_back();
    }
    rows[row].push_back(&split[i]);
    if (left - n > 0) room.emplace(left - n, row);
  }
  return rows;
}

ExampleBatcher::Batch ExampleBatcher::batch_of(const std::vector<const Row*>& rows) const {
  CategoryScope scope(TF_MEM_OTHER);
  const int64_t B = static_cast<int64_t>(rows.size()), T = seq_len_;
  at::Tensor tokens = at::full({B, T}, pad_id_, at::kLong);
  at::Tensor targets = at::full({B, T}, kIgnoreIndex, at::kLong);
  // Positions only for packed rows; one example a row keeps the default 0..T-1.
  at::Tensor positions = packing_ ? at::empty({B, T}, at::kLong) : at::Tensor();
  auto* tok = tokens.data_ptr<int64_t>();
  auto* tgt = targets.data_ptr<int64_t>();
  int64_t* pos = packing_ ? positions.data_ptr<int64_t>() : nullptr;
  at::Tensor mask = at::ones({B, T}, at::kLong);
  int64_t* in_example = mask.data_ptr<int64_t>();
  bool padded = false;
  for (int64_t b = 0; b < B; ++b) {
    int64_t used = 0;  // tokens of row b filled so far
    for (const Example* e : *rows[static_cast<size_t>(b)]) {
      const int64_t n = std::min(row_length(*e), T - used);
      int64_t* row_tok = tok + b * T + used;
      int64_t* row_tgt = tgt + b * T + used;
      for (int64_t t = 0; t < n; ++t) {
        const auto i = static_cast<size_t>(t);
        row_tok[t] = e->ids[i];
        if (pos) pos[b * T + used + t] = t;
        if (e->trained[i + 1]) row_tgt[t] = e->ids[i + 1];
      }
      used += n;
    }
    // Padding counts from 0 as an example of its own: nothing attends to it.
    if (pos)
      for (int64_t t = used; t < T; ++t) pos[b * T + t] = t - used;
    for (int64_t t = used; t < T; ++t) in_example[b * T + t] = 0;
    padded = padded || used < T;
  }
  Batch out{tokens, targets, positions, 0};
  if (padded) out.attention_mask = mask;
  return out;
}

// The rows of `units` (each group_ rows long in `rows`): with pairs, every
// unit's first row (chosen) and then every unit's second (rejected), as
// TRL's concatenated_inputs stacks them.
ExampleBatcher::Batch ExampleBatcher::units_batch(const std::vector<Row>& rows,
                                                  const std::vector<size_t>& units,
                                                  int64_t id_offset) const {
  std::vector<const Row*> picked;
  for (int64_t k = 0; k < group_; ++k)
    for (const size_t u : units)
      picked.push_back(&rows[u * static_cast<size_t>(group_) + static_cast<size_t>(k)]);
  Batch b = batch_of(picked);
  if (group_ != 2) return b;
  b.pairs = static_cast<int64_t>(units.size());
  b.answer_first = at::zeros({static_cast<int64_t>(picked.size())}, at::kLong);
  for (size_t r = 0; r < picked.size(); ++r) {
    const Example* first = picked[r]->front();
    b.answer_first[static_cast<int64_t>(r)] = !first->trained.empty() && first->trained[0] ? 1 : 0;
  }
  b.row_ids = at::empty({b.pairs}, at::kLong);
  for (size_t i = 0; i < units.size(); ++i)
    b.row_ids[static_cast<int64_t>(i)] = id_offset + static_cast<int64_t>(units[i]);
  // Unpaired rows (KTO) carry their completions' labels.
  if (rows[units.front() * 2].front()->desirable >= 0) {
    b.desirable = at::empty({b.pairs}, at::kLong);
    for (size_t i = 0; i < units.size(); ++i)
      b.desirable[static_cast<int64_t>(i)] = rows[units[i] * 2].front()->desirable;
  }
  // Pairs are padded to the batch's longest row, as TRL's collator pads
  // them, not to seq_len: the padding would be computed for nothing.
  int64_t longest = 1;
  for (const Row* row : picked)
    for (const Example* e : *row) longest = std::max(longest, std::min(row_length(*e), seq_len_));
  if (longest < seq_len_) {
    b.tokens = b.tokens.narrow(1, 0, longest).contiguous();
    b.targets = b.targets.narrow(1, 0, longest).contiguous();
    if (b.attention_mask.defined())
      b.attention_mask = b.attention_mask.narrow(1, 0, longest).contiguous();
  }
  return b;
}

ExampleBatcher::Batch ExampleBatcher::next() {
  const size_t n = train_rows_.size() / static_cast<size_t>(group_);
  std::vector<size_t> picked;
  if (sequential_) {
    // The rows in their order, epoch after epoch; the epoch's last batch is
    // shorter, or completed with the first rows (fill_last).
    const auto size = static_cast<size_t>(batch_size_);
    const size_t per_epoch = (n + size - 1) / size;
    const size_t first = static_cast<size_t>(position_) % per_epoch * size;
    for (size_t k = first; k < first + size && (k < n || fill_last_); ++k) picked.push_back(k % n);
    ++position_;
    return units_batch(train_rows_, picked, 0);
  }
  for (int64_t k = 0; k < batch_size_; ++k) {
    const uint64_t g = static_cast<uint64_t>(position_) * static_cast<uint64_t>(batch_size_) +
                       static_cast<uint64_t>(k);
    const int64_t epoch = static_cast<int64_t>(g / n);
    if (epoch != order_epoch_) {  // each epoch its own order, from (seed, epoch) alone
      order_ = seeded_permutation(n, seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
      order_epoch_ = epoch;
    }
    picked.push_back(order_[g % n]);
  }
  ++position_;
  return units_batch(train_rows_, picked, 0);
}

ExampleBatcher::Batch ExampleBatcher::validation(int64_t i) const {
  const bool held_out = !val_rows_.empty();
  const std::vector<Row>& split = held_out ? val_rows_ : train_rows_;
  const size_t n = split.size() / static_cast<size_t>(group_);
  std::vector<size_t> picked;
  for (int64_t k = 0; k < batch_size_; ++k)
    picked.push_back(static_cast<size_t>(i * batch_size_ + k) % n);
  return units_batch(split, picked, held_out ? counts_.train : 0);
}

ExampleBatcher::Batch ExampleBatcher::preference_rows(int64_t first, int64_t count) const {
  if (group_ != 2) return Batcher::preference_rows(first, count);
  if (first < 0 || count <= 0)
    throw std::invalid_argument("preference_rows: first must be 0 or more and count positive");
  const bool held_out = first >= counts_.train;
  const std::vector<Row>& split = held_out ? val_rows_ : train_rows_;
  const int64_t begin = held_out ? first - counts_.train : first;
  const int64_t end = std::min(begin + count, static_cast<int64_t>(split.size()) / 2);
  std::vector<size_t> picked;
  for (int64_t k = begin; k < end; ++k) picked.push_back(static_cast<size_t>(k));
  if (picked.empty()) return {};  // past the last row: pairs 0
  return units_batch(split, picked, held_out ? counts_.train : 0);
}

at::Tensor ExampleBatcher::train_ids() const {
  std::vector<int64_t> all;
  for (const Example& e : train_) all.insert(all.end(), e.ids.begin(), e.ids.end());
  return at::tensor(all, at::kLong);
}

}  // namespace tightfit
