// A SentencePiece BPE model as the tokenizer.json transformers' LlamaConverter
// makes of it: every piece with its score, the merges generated from the
// pieces (generate_merges), byte fallback, control pieces as special added
// tokens and user-defined ones as plain added tokens, and the legacy
// (Prepend + Replace normalizer) or Metaspace pre-tokenizer. Shared by a
// folder's tokenizer.model and a GGUF file's "llama" tokenizer, which holds
// the same pieces, scores and types.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "sentencepiece_model.hpp"

namespace tightfit {

// `source` names the model in messages. `legacy`: LlamaTokenizer's legacy
// (space handling by the normalizer); `add_prefix_space`: a "▁" before the
// text. No post-processor: the caller adds BOS/EOS as its class does.
// Throws std::invalid_argument for a model that is not BPE or has a piece
// too long to convert (conversion costs a piece's length squared).
nlohmann::json sentencepiece_bpe_tokenizer(const SentencePieceModel& m, const std::string& source,
                                           bool legacy, bool add_prefix_space);

}  // namespace tightfit
