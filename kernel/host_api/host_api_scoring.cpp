// score_texts (ABI 1.28): texts scored by a sequence classifier the run
// opens beside its model (a reward model). The session layer opens it
// (KernelParts::open_scorer); this service checks the request and hands the
// texts over.
#include <algorithm>
#include <string>
#include <vector>

#include "host_api_services.hpp"
#include "text_scorer.hpp"

namespace tightfit::host_services {

tf_status h_score_texts(tf_host_context* ctx, const tf_score_texts_request* in,
                        tf_score_texts_result* out) {
  return serve(ctx, [&] {
    const tf_score_texts_request r = read_struct(in);
    check_size(out, "tf_score_texts_result");
    require(r.model, "tf_score_texts_request.model");
    if (r.n < 0 || r.batch_rows < 0 || r.label < 0)
      throw std::invalid_argument(
          "tf_score_texts_request: n, batch_rows and label must be >= 0 (0 rows: only open "
          "the model)");
    if (r.n > 0) {
      require(r.texts, "tf_score_texts_request.texts");
      require(out->scores, "tf_score_texts_result.scores");
    }
    if (!ctx->kernel->open_scorer)
      throw std::invalid_argument("score_texts: this host opens no scoring models");
    // Held for the call: an abandoned reward call keeps the model it scores with.
    const std::shared_ptr<TextScorer> scorer = ctx->kernel->open_scorer(r.model);
    if (r.label >= scorer->num_labels())
      throw std::invalid_argument("score_texts: label " + std::to_string(r.label) + " of " +
                                  r.model + ", which has " + std::to_string(scorer->num_labels()) +
                                  " labels (config.json's id2label)");
    std::vector<std::string> texts;
    texts.reserve(static_cast<size_t>(r.n));
    for (int64_t i = 0; i < r.n; ++i) {
      if (r.texts[i] == nullptr)
        throw std::invalid_argument("tf_score_texts_request.texts[" + std::to_string(i) +
                                    "] is NULL");
      texts.emplace_back(r.texts[i]);
    }
    const std::vector<double> scores =
        r.n > 0 ? scorer->score(texts, r.messages != 0, r.label, r.batch_rows)
                : std::vector<double>{};
    tf_score_texts_result o{};
    o.scores = out->scores;
    o.weight_bytes = scorer->weight_bytes();
    o.num_labels = scorer->num_labels();
    o.positions = scorer->positions();
    std::copy(scores.begin(), scores.end(), out->scores);
    write_struct(out, o);
  });
}

}  // namespace tightfit::host_services
