// The host reads a device value as seldom as it can: on a GPU each read
// waits until everything queued has run, so a step that reads a gradient
// norm per parameter (as the optimizer did: one read per parameter, every
// step) leaves the device idle while the host catches up. For every stack
// of the plan-accuracy set (bench/plan_accuracy.py), a step's reads are
// counted on the CPU, where the same code runs: the kernel's own reads
// (host_reads.hpp) and every Tensor::item() anywhere (plugins included,
// seen as aten::_local_scalar_dense through LibTorch's RecordFunction
// callbacks). The bound is one read per optimizer step: the gradients'
// norm, which is also the step's finite flag, with the losses of the step's
// passes (deferred to it: tf_pass.defer_read), however many micro-batches.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "host_reads.hpp"
#include "op_counter.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

const char* kGpt2 =
    "plugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 2\n"
    "n_positions = 64";
const char* kLlama =
    "plugin = \"llama\"\npreset = \"custom\"\nn_layer = 3\nn_embd = 64\nn_head = 4\n"
    "n_kv_head = 2\nintermediate_size = 128\nmax_positions = 64";
const char* kRwkv = "plugin = \"rwkv\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 64";

std::string strategy(const std::string& name, const std::string& keys = "") {
  return "[[strategy]]\nplugin = \"" + name + "\"\n" + keys + (keys.empty() ? "" : "\n");
}

struct Stack {
  const char* name;
  const char* model;
  std::string strategies;
  std::string schedule = "plugin = \"standard\"\nwarmup_steps = 1";
};

std::vector<Stack> stacks() {
  const std::string lora_gpt2 = strategy("lora", "targets = [\"c_attn\"]");
  const std::string lora_rwkv = strategy("lora", "targets = [\"key\", \"value\", \"receptance\"]");
  return {
      {"gpt2", kGpt2, ""},
      {"llama", kLlama, ""},
      {"rwkv", kRwkv, ""},
      {"gpt2 checkpoint", kGpt2, strategy("checkpoint")},
      {"llama checkpoint", kLlama, strategy("checkpoint")},
      {"rwkv checkpoint", kRwkv, strategy("checkpoint")},
      {"gpt2 lora", kGpt2, lora_gpt2},
      {"rwkv lora checkpoint", kRwkv, lora_rwkv + strategy("checkpoint")},
      {"llama lora autocast", kLlama, strategy("lora") + strategy("precision")},
      {"llama qlora", kLlama, strategy("quantize") + strategy("lora")},
      {"llama qlora checkpoint", kLlama,
       strategy("quantize") + strategy("lora") + strategy("checkpoint")},
      {"llama lora ckpt act@disk", kLlama,
       strategy("lora") + strategy("checkpoint") +
           strategy("offload", "params = \"none\"\nactivations = \"disk\"")},
      {"llama lora offload disk", kLlama,
       strategy("lora") + strategy("offload", "params = \"disk\"\nprefetch = 2")},
      {"llama qlora offload disk", kLlama,
       strategy("quantize") + strategy("lora") + strategy("offload", "params = \"disk\"")},
      {"llama qlora bf16", kLlama,
       strategy("quantize") + strategy("lora") + strategy("precision", "mode = \"bf16\"")},
      {"gpt2 offload optimizer", kGpt2,
       strategy("offload", "params = \"none\"\noptimizer = \"host\"")},
      {"gpt2 fused_update", kGpt2, strategy("fused_update")},
      {"gpt2 autocast", kGpt2, strategy("precision")},
      {"gpt2 bf16", kGpt2, strategy("precision", "mode = \"bf16\"")},
      {"gpt2 fp16 loss scaling", kGpt2, strategy("precision", "dtype = \"fp16\"")},
      {"gpt2 adamw8", kGpt2, strategy("adamw8")},
      {"llama sparse skip", kLlama, strategy("sparse", "first = 1\nlast = 1\nmiddle = \"skip\"")},
      {"llama lisa", kLlama, strategy("sparse", "first = 1\nlast = 1\nmiddle = \"lisa\"\nk = 1")},
      {"gpt2 accumulate", kGpt2, "",
       "plugin = \"accumulate\"\nmicro_batches = 2\nwarmup_steps = 1"},
  };
}

// A recipe of `stack` that logs (and so reports progress) every step and
// evaluates nothing between steps.
std::string recipe_of(const Stack& stack, const test::TempDir& dir) {
  std::string text =
      test::tiny_recipe(test::write_corpus(dir), dir.str() + "/out", "", stack.strategies);
  const auto model = text.find("[model]"), data = text.find("[data]");
  text.replace(model, data - model, "[model]\n" + std::string(stack.model) + "\n\n");
  const auto schedule = text.find("[schedule]");
  const auto end = text.find("\n\n", schedule);
  text.replace(schedule, end - schedule, "[schedule]\n" + stack.schedule);
  text.replace(text.find("log_every = 1000"), 16, "log_every = 1");
  text.replace(text.find("eval_batches = 1"), 16, "eval_batches = 0");
  text.replace(text.find("steps = 4"), 9, "steps = 5");
  return text;
}

struct StepReads {
  int64_t kernel = 0;  // through host_reads.hpp
  int64_t item = 0;    // Tensor::item() anywhere
  int64_t ops = 0;     // aten ops dispatched (outermost)
};

// Each step's reads, the first (which makes the optimizer's state) left out.
std::vector<StepReads> reads_per_step(const Stack& stack) {
  test::TempDir dir;
  OpCounter ops;
  std::vector<StepReads> at_progress;
  SessionOptions options;
  options.on_progress = [&](const ProgressInfo&) {
    const OpCounter::Counts now = ops.counts();
    at_progress.push_back({host_reads(), now.of("aten::_local_scalar_dense"), now.outermost});
  };
  test::make_session(recipe_of(stack, dir), options)->train();
  std::vector<StepReads> steps;
  for (size_t i = 1; i < at_progress.size(); ++i)
    steps.push_back({at_progress[i].kernel - at_progress[i - 1].kernel,
                     at_progress[i].item - at_progress[i - 1].item,
                     at_progress[i].ops - at_progress[i - 1].ops});
  return steps;
}

TEST(StepReads, EveryStackReadsOnceAStep) {
  for (const Stack& stack : stacks()) {
    SCOPED_TRACE(stack.name);
    const std::vector<StepReads> steps = reads_per_step(stack);
    ASSERT_EQ(steps.size(), 4u);
    const int64_t bound = 1;  // the update's norm, the passes' losses with it
    std::cout << "  " << stack.name << ": reads per step (kernel + item)";
    for (const StepReads& r : steps) std::cout << " " << r.kernel << "+" << r.item;
    std::cout << "\n";
    for (size_t i = 0; i < steps.size(); ++i) {
      const int64_t total = steps[i].kernel + steps[i].item;
      EXPECT_LE(total, bound) << "step " << i + 2 << ": " << steps[i].kernel << " kernel reads and "
                              << steps[i].item << " item() calls";
      EXPECT_GE(steps[i].kernel, 1) << "step " << i + 2 << ": the loss goes unread?";
    }
  }
}

// The ops a step dispatches, pinned for the tiny GPT-2 of the suite (2
// blocks, AdamW, clipping): on a GPU each is a launch at least, so a change
// that adds some is seen here, and one that saves some lowers the pin.
// bench/run dispatch compares the count with PyTorch eager's and
// transformers + PEFT's at real sizes.
TEST(StepOps, ATinyGpt2StepDispatchesNoMoreOpsThanPinned) {
  constexpr int64_t kPinned = 338;  // measured 2026-12-04
  const std::vector<StepReads> steps = reads_per_step(stacks().front());
  ASSERT_EQ(steps.size(), 4u);
  for (size_t i = 0; i < steps.size(); ++i)
    EXPECT_LE(steps[i].ops, kPinned) << "step " << i + 2 << " dispatched " << steps[i].ops
                                     << " ops; if that is on purpose, pin the new count";
}

// The kernel's reads never go through item(): a stray item() in a step is
// seen apart, and the two counts add up to the reads a GPU waits for.
TEST(StepReads, KernelReadsAreCountedAndNotItemCalls) {
  OpCounter ops;
  const int64_t before = host_reads();
  const at::Tensor t = at::arange(6, at::kFloat).reshape({2, 3});
  const std::vector<double> values = read_values(t);
  EXPECT_EQ(values, (std::vector<double>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(read_value(t.sum()), 15.0);
  EXPECT_EQ(read_to_host(t).sizes(), t.sizes());
  EXPECT_EQ(host_reads() - before, 3);
  EXPECT_EQ(ops.counts().of("aten::_local_scalar_dense"), 0);
  (void)t.sum().item<double>();
  EXPECT_EQ(ops.counts().of("aten::_local_scalar_dense"), 1);
  EXPECT_THROW(read_value(t), std::invalid_argument);
  // Host values are counted without a read.
  const int64_t reads = host_reads();
  EXPECT_EQ(count_not_equal(at::tensor({1, -100, 3, -100}, at::kLong), -100), 2);
  EXPECT_EQ(host_reads(), reads);
}

}  // namespace
}  // namespace tightfit
