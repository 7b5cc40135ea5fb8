// A reward model opened from a Hugging Face folder (score_texts, ABI 1.28):
// a session of its own beside the run (SessionOptions::guest), scoring texts
// as transformers' *ForSequenceClassification and TRL's GRPOTrainer do.
#pragma once

#include <memory>
#include <string>

#include "plugin_loader.hpp"
#include "text_scorer.hpp"

namespace tightfit {

// The classifier in `folder` on `device`, its weights read unless
// `dry_run` (then it is composed only, and score() is refused). Throws
// RecipeError naming the folder when it is not a sequence classifier the
// registry's model plugins read.
std::shared_ptr<TextScorer> open_folder_scorer(const std::string& folder,
                                               const PluginRegistry& registry,
                                               const std::string& device, bool dry_run);

}  // namespace tightfit
