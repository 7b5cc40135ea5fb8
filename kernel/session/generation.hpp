// Text generation from a session's model: greedy, temperature, top-k and
// nucleus sampling, with the model's incremental decode when it has one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sampling_options.hpp"

namespace tightfit {

class Session;

// What is wrong with generation's sampling values (named as the command
// line's options, without "--"), or nullptr.
const char* sampling_problem(const SamplingOptions& o);

// Samples o.n_tokens after the prompt: greedy when top_k == 1 or temperature
// == 0, else temperature, top-k, nucleus (top_p < 1) and min-p sampling,
// after the repetition penalty (transformers' order: the penalty, then the
// temperature, top-k, top-p and min-p). Uses the
// model's incremental decode when it has one and use_cache, else recomputes
// the whole context for every new token (either way the model refuses a
// context past its positions). Throws std::invalid_argument for bad sampling
// values and a prompt of no tokens.
std::string generate_text(Session& s, const std::string& prompt, const SamplingOptions& o);

}  // namespace tightfit
