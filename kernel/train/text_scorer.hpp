// A sequence classifier the run holds beside its model (a reward model,
// tf_host_api.score_texts): opened from a Hugging Face folder by the session
// layer, which hands the host services a way to open one
// (KernelParts::open_scorer) without their depending on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tightfit {

class TextScorer {
 public:
  virtual ~TextScorer() = default;
  // Each text's logit of `label` at its last token that is not the padding
  // token, texts taken `batch_rows` at a time (0: all). With `messages`, each
  // text is a JSON array of chat messages the model's chat template renders
  // first. Throws std::invalid_argument naming the row for a text the model
  // cannot read (too long, not messages, a template failure).
  virtual std::vector<double> score(const std::vector<std::string>& texts, bool messages,
                                    int64_t label, int64_t batch_rows) = 0;
  virtual int64_t weight_bytes() const = 0;
  virtual int64_t num_labels() const = 0;
  virtual int64_t positions() const = 0;  // 0: no limit
};

}  // namespace tightfit
