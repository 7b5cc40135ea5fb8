// The recipes the planner's tests measure (tests/test_plan.cpp,
// tests/test_planned_peak.cpp): small models of the three families, one
// recipe shape, and the plan of a recipe composed as a dry run.
#pragma once

#include <string>

#include "memory_plan.hpp"
#include "test_support.hpp"

namespace tightfit::test {

inline const char* kGpt2 =
    "plugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 4\nn_embd = 256\nn_head = 4\n"
    "n_positions = 128\n";
inline const char* kLlama =
    "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 4\nn_embd = 256\nn_head = 4\n"
    "n_kv_head = 2\nintermediate_size = 688\nmax_positions = 128\n";
// The model's own weights in bf16, as QLoRA recipes keep them: it declares
// 16-bit activations, which autocast must not shrink again.
inline const char* kLlamaBf16 =
    "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 4\nn_embd = 256\nn_head = 4\n"
    "n_kv_head = 2\nintermediate_size = 688\nmax_positions = 128\ndtype = \"bf16\"\n";
inline const char* kRwkv = "plugin = \"rwkv\"\npreset = \"custom\"\nn_layer = 4\nn_embd = 192\n";
// A vocabulary far larger than the byte tokenizer's, tied: the head's
// logits and their gradients dominate.
inline const char* kLlamaBigVocab =
    "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 256\nn_head = 4\n"
    "n_kv_head = 2\nintermediate_size = 688\nmax_positions = 128\nvocab_size = 32000\n"
    "tie_embeddings = true\n";

// A 3-step recipe of `model` on the built-in corpus, 8 x 128 byte tokens a
// step; `device` (when not empty) becomes [run] device.
inline std::string recipe(const std::string& out, const std::string& model,
                          const std::string& schedule, const std::string& strategies,
                          const std::string& device = "") {
  return "[run]\n" + (device.empty() ? std::string() : "device = \"" + device + "\"\n") +
         "name = \"p\"\nseed = 1\nsteps = 3\nlog_every = 1000\nsample_tokens = 0\n"
         "eval_batches = 1\nout_dir = \"" +
         out + "\"\n[model]\n" + model +
         "[data]\ncorpus = \"builtin:fortunes\"\ntokenizer = \"byte\"\nseq_len = 128\n"
         "batch_size = 8\n[optimizer]\nname = \"adamw\"\nlr = 1e-3\n[schedule]\n" +
         (schedule.empty() ? "plugin = \"standard\"\nwarmup_steps = 1\n" : schedule) + strategies;
}

inline MemoryPlan plan_of(const std::string& text) {
  SessionOptions dry;
  dry.dry_run = true;
  auto s = test::make_session(text, dry);
  return plan_memory(s->parts());
}

inline double relative(int64_t predicted, int64_t measured) {
  return static_cast<double>(predicted - measured) / static_cast<double>(measured);
}

}  // namespace tightfit::test
