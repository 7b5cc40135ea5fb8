// Resume: an interrupted run continued from its checkpoint reproduces the
// uninterrupted run's losses exactly; damaged checkpoints are never taken.
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "checkpoint_manifest.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {
namespace fs = std::filesystem;

class ResumeTest : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  // The [schedule] table's body; the standard one unless a test sets it.
  std::string schedule;
  std::string recipe(const std::string& out, const std::string& strategy = "") const {
    std::string r =
        test::tiny_recipe(corpus, out, "dropout = 0.1\n", strategy + "\n[save]\nkeep_last = 3\n");
    r.replace(r.find("steps = 4"), 9, "steps = 20");
    if (!schedule.empty()) {
      const std::string standard = "plugin = \"standard\"\nwarmup_steps = 2\n";
      r.replace(r.find(standard), standard.size(), schedule);
    }
    return r;
  }
  TrainSummary train(const std::string& out, bool resume, int64_t stop_after,
                     const std::string& strategy = "") {
    SessionOptions o;
    o.resume = resume;
    o.stop_after_steps = stop_after;
    return test::make_session(recipe(out, strategy), o)->train();
  }
};

TEST_F(ResumeTest, InterruptedRunResumesWithIdenticalLosses) {
  const TrainSummary full = train(dir.str() + "/a", false, -1);
  ASSERT_EQ(full.losses.size(), 20u);

  const TrainSummary first = train(dir.str() + "/b", false, 10);
  ASSERT_EQ(first.losses.size(), 10u);
  const TrainSummary second = train(dir.str() + "/b", true, -1);
  ASSERT_EQ(second.first_step, 10);
  ASSERT_EQ(second.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(first.losses[i], full.losses[i]) << "step " << i;
    EXPECT_EQ(second.losses[i], full.losses[10 + i]) << "step " << 10 + i;
  }
}

TEST_F(ResumeTest, ResumeIsExactWithCheckpointingStrategyToo) {
  const std::string ck = "[[strategy]]\nplugin = \"checkpoint\"\n";
  const TrainSummary full = train(dir.str() + "/a", false, -1, ck);
  train(dir.str() + "/b", false, 7, ck);
  const TrainSummary second = train(dir.str() + "/b", true, -1, ck);
  ASSERT_EQ(second.losses.size(), 13u);
  for (size_t i = 0; i < 13; ++i)
    EXPECT_EQ(second.losses[i], full.losses[7 + i]) << "step " << 7 + i;
}

// Gradient accumulation: each saved step is a whole update over its micro
// batches, and the resumed run reads the next micro batches, not the first.
TEST_F(ResumeTest, ResumeIsExactWithTheAccumulateSchedule) {
  schedule = "plugin = \"accumulate\"\nmicro_batches = 3\nwarmup_steps = 2\n";
  const TrainSummary full = train(dir.str() + "/a", false, -1);
  train(dir.str() + "/b", false, 7);
  const TrainSummary second = train(dir.str() + "/b", true, -1);
  ASSERT_EQ(second.first_step, 7);
  ASSERT_EQ(second.losses.size(), 13u);
  for (size_t i = 0; i < 13; ++i)
    EXPECT_EQ(second.losses[i], full.losses[7 + i]) << "step " << 7 + i;
}

// Every memory strategy, alone and in the stacks people use: stopped after 7
// steps and resumed, the losses are the uninterrupted run's, bit for bit.
struct StackCase {
  const char* name;
  const char* strategies;
};
class ResumeEveryStack : public ResumeTest, public ::testing::WithParamInterface<StackCase> {};

TEST_P(ResumeEveryStack, RepeatsTheUninterruptedLosses) {
  const std::string st = GetParam().strategies;
  const TrainSummary full = train(dir.str() + "/a", false, -1, st);
  train(dir.str() + "/b", false, 7, st);
  const TrainSummary second = train(dir.str() + "/b", true, -1, st);
  ASSERT_EQ(second.losses.size(), 13u);
  for (size_t i = 0; i < 13; ++i)
    EXPECT_EQ(second.losses[i], full.losses[7 + i]) << GetParam().name << " step " << 7 + i;
}

#define TF_STRATEGY(name) "[[strategy]]\nplugin = \"" name "\"\n"
INSTANTIATE_TEST_SUITE_P(
    Stacks, ResumeEveryStack,
    ::testing::Values(
        StackCase{"lora", TF_STRATEGY("lora")},
        StackCase{"qlora", TF_STRATEGY("lora") TF_STRATEGY("quantize")},
        StackCase{"adam8", TF_STRATEGY("quantize") "weights = false\noptimizer_state = \"int8\"\n"},
        StackCase{"adamw8", TF_STRATEGY("adamw8")}, StackCase{"autocast", TF_STRATEGY("precision")},
        StackCase{"bf16", TF_STRATEGY("precision") "mode = \"bf16\"\n"},
        StackCase{"fused_update", TF_STRATEGY("fused_update")},
        StackCase{"lisa", TF_STRATEGY("sparse") "first = 0\nlast = 1\nmiddle = \"lisa\"\nk = 1\n"},
        StackCase{"offload_optimizer",
                  TF_STRATEGY("offload") "params = \"none\"\noptimizer = \"disk\"\n"},
        StackCase{"lora_weights_on_disk",
                  TF_STRATEGY("lora") TF_STRATEGY("offload") "params = \"disk\"\nprefetch = 1\n"},
        StackCase{"checkpoint_inputs_on_disk",
                  TF_STRATEGY("checkpoint") TF_STRATEGY("offload") "params = \"none\"\n"
                                                                   "activations = \"disk\"\n"},
        StackCase{"qlora_bf16_checkpoint",
                  TF_STRATEGY("lora") TF_STRATEGY("quantize")
                      TF_STRATEGY("precision") "mode = \"bf16\"\n" TF_STRATEGY("checkpoint")}),
    [](const auto& info) { return std::string(info.param.name); });
#undef TF_STRATEGY

TEST_F(ResumeTest, FreshRunDoesNotOverwriteSavedCheckpoints) {
  const TrainSummary a = train(dir.str() + "/c", false, 5);
  const TrainSummary b = train(dir.str() + "/c", false, 5);
  EXPECT_NE(a.run_dir, b.run_dir);
  EXPECT_TRUE(fs::exists(fs::path(a.checkpoint_dir) / "step-00000005" / "model.safetensors"));
}

TEST_F(ResumeTest, DamagedLatestCheckpointFallsBackToThePreviousOne) {
  std::string r = recipe(dir.str() + "/d");
  r += "every = 4\n";  // appended to [save]
  SessionOptions o;
  o.stop_after_steps = 10;
  auto s1 = test::make_session(r, o);
  const TrainSummary first = s1->train();
  const fs::path cps = first.checkpoint_dir;
  ASSERT_TRUE(fs::exists(cps / "step-00000008"));
  ASSERT_TRUE(fs::exists(cps / "step-00000010"));
  // Truncate the newest model file: a crash mid-copy, or disk damage.
  ASSERT_EQ(::truncate((cps / "step-00000010" / "model.safetensors").c_str(), 100), 0);
  o.resume = true;
  o.stop_after_steps = 0;
  auto s2 = test::make_session(r, o);
  EXPECT_EQ(s2->step(), 8);
  // The damaged files are left for the user to inspect.
  EXPECT_TRUE(fs::exists(cps / "step-00000010" / "model.safetensors"));
}

// An edited or damaged trainer.json (wrong types, values out of range) is
// refused before any state changes, naming the file and the field, and the
// checkpoint before it is used.
TEST(TrainerRecord, RefusesWrongTypesAndRanges) {
  const std::string good =
      R"({"format": 1, "step": 4, "optimizer_steps": 4, "lr": 0.001, "data_position": 4, )"
      R"("world_size": 2, "optimizer_steps_sat_out": {"experts.3.w1": 2}})";
  const TrainerRecord r = parse_trainer_record(good, "t.json");
  EXPECT_EQ(r.step, 4);
  EXPECT_EQ(r.steps_sat_out, (std::map<std::string, int64_t>{{"experts.3.w1", 2}}));
  EXPECT_EQ(r.world_size, 2);
  EXPECT_DOUBLE_EQ(r.lr, 0.001);
  const std::pair<std::string, std::string> bad[] = {
      {R"("step": 4,)", R"("step": -4,)"},
      {R"("step": 4,)", R"("step": "4",)"},
      {R"("world_size": 2)", R"("world_size": 1000000000)"},
      {R"("world_size": 2)", R"("world_size": 0)"},
      {R"("data_position": 4,)", R"("data_position": 18446744073709551615,)"},
      {R"("lr": 0.001,)", R"("lr": null,)"},
      {R"("format": 1,)", R"("format": 2,)"},
      {R"("experts.3.w1": 2)", R"("experts.3.w1": 5)"},  // more than the steps taken
      {R"("experts.3.w1": 2)", R"("experts.3.w1": 0)"},
      {R"({"experts.3.w1": 2})", R"([2])"},
  };
  for (const auto& [from, to] : bad) {
    std::string text = good;
    text.replace(text.find(from), from.size(), to);
    try {
      parse_trainer_record(text, "t.json");
      ADD_FAILURE() << "accepted " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("t.json", 0), 0u) << e.what();
    }
  }
  EXPECT_THROW(parse_trainer_record("{\"format\": 1", "t.json"), std::runtime_error);
}

TEST_F(ResumeTest, EditedTrainerRecordFallsBackToThePreviousCheckpoint) {
  const std::string r = recipe(dir.str() + "/w") + "every = 2\n";  // appended to [save]
  SessionOptions o;
  o.stop_after_steps = 4;
  const fs::path cps = test::make_session(r, o)->train().checkpoint_dir;
  ASSERT_TRUE(fs::exists(cps / "step-00000002"));
  std::ifstream in(cps / "step-00000004" / "trainer.json");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  const std::string ws = "\"world_size\": 1";
  ASSERT_NE(text.find(ws), std::string::npos);
  text.replace(text.find(ws), ws.size(), "\"world_size\": 99999999");
  std::ofstream(cps / "step-00000004" / "trainer.json") << text;
  o.resume = true;
  o.stop_after_steps = 0;
  EXPECT_EQ(test::make_session(r, o)->step(), 2);
}

TEST_F(ResumeTest, LeftoverTemporaryFolderIsNeverTakenForACheckpoint) {
  const TrainSummary first = train(dir.str() + "/e", false, 4);
  const fs::path cps = first.checkpoint_dir;
  // A save killed before its rename leaves a .tmp folder and no manifest entry.
  fs::create_directories(cps / "step-00000009.tmp-123");
  std::ofstream(cps / "step-00000009.tmp-123" / "trainer.json") << "{\"step\": 9}";
  SessionOptions o;
  o.resume = true;
  o.stop_after_steps = 0;
  EXPECT_EQ(test::make_session(recipe(dir.str() + "/e"), o)->step(), 4);
}

// A manifest entry that is not a checkpoint name (a path out of the folder)
// is refused: --resume never loads, and rotation never deletes, elsewhere.
TEST_F(ResumeTest, ManifestEntryOutsideTheFolderIsRefused) {
  const TrainSummary first = train(dir.str() + "/m", false, 2);
  const fs::path cps = first.checkpoint_dir;
  fs::create_directories(dir.path() / "precious");
  std::ofstream(cps / "manifest.json")
      << R"({"format": 1, "checkpoints": ["../../../precious", "step-00000002"]})";
  SessionOptions o;
  o.resume = true;
  o.stop_after_steps = 0;
  try {
    test::make_session(recipe(dir.str() + "/m"), o);
    FAIL() << "a manifest naming a folder outside the checkpoints was used";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("not a checkpoint name"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(dir.path() / "precious"));
}

TEST_F(ResumeTest, CheckpointFromAnotherShapeIsRefusedClearly) {
  train(dir.str() + "/f", false, 3);
  std::string other = recipe(dir.str() + "/f");
  other.replace(other.find("n_embd = 32"), 11, "n_embd = 48");
  SessionOptions o;
  o.resume = true;
  try {
    test::make_session(other, o);
    FAIL() << "a checkpoint of another shape was loaded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape"), std::string::npos) << e.what();
  }
}

// torch's AdamW keeps a step count per parameter, which its bias corrections
// use, and leaves a parameter without a gradient alone (its count too): an
// expert that no token chose in a step is updated later as if that step had
// not been. A Mixtral of 16 experts, one per token, trained as a whole
// model four steps, each run as its own resumed session so that each step's
// gradients can be read (and the checkpoints carry the counts): the weights
// after the fourth step equal LibTorch's torch::optim::AdamW (the same
// algorithm as torch.optim.AdamW) fed the same gradients, step by step.
TEST(AdamwSteps, AnExpertThatSatOutAStepIsUpdatedAsTorchsAdamW) {
  test::TempDir dir;
  std::string text =
      test::tiny_recipe(test::write_corpus(dir), dir.str() + "/out", "", "[save]\nevery = 1\n");
  const auto begin = text.find("[model]"), end = text.find("[data]");
  text.replace(begin, end - begin, "[model]\n" + test::many_experts_model(dir) + "\n");
  text.replace(text.find("seq_len = 32"), 12, "seq_len = 8");
  text.replace(text.find("batch_size = 4"), 14, "batch_size = 2");
  text.replace(text.find("eval_batches = 1"), 16, "eval_batches = 0");
  text.replace(text.find("lr = 1e-3"), 9,
               "lr = 1e-2\nbeta1 = 0.9\nbeta2 = 0.999\neps = 1e-8\nweight_decay = 0.0\n"
               "grad_clip = 0.0");
  text.replace(text.find("warmup_steps = 2"), 16, "warmup_steps = 0\ndecay = \"constant\"");
  constexpr int kSteps = 4;

  std::map<std::string, at::Tensor> start, last;
  std::vector<std::map<std::string, at::Tensor>> grads;  // per step; absent: none
  for (int k = 1; k <= kSteps; ++k) {
    SessionOptions o;
    o.resume = k > 1;
    o.stop_after_steps = 1;  // one step a session
    auto s = test::make_session(text, o);
    if (k == 1)
      for (Param* p : s->store().trainable()) start[p->name] = p->value.detach().clone();
    ASSERT_EQ(s->train().losses.size(), 1u);
    std::map<std::string, at::Tensor> step;
    for (Param* p : s->store().trainable()) {
      if (p->value.grad().defined()) step[p->name] = p->value.grad().detach().clone();
      last[p->name] = p->value.detach().clone();
    }
    grads.push_back(std::move(step));
  }
  // Some expert sat out a step and was updated in a later one: there the
  // run's count and the expert's own differ.
  int late = 0;
  for (const auto& [name, w] : start) {
    bool missed = false;
    for (const auto& step : grads) {
      if (!step.count(name))
        missed = true;
      else if (missed) {
        ++late;
        break;
      }
    }
  }
  EXPECT_GT(late, 0) << "no parameter sat out a step and came back: the test shows nothing";

  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  for (const auto& [name, w] : start) {
    names.push_back(name);
    params.push_back(w.clone().requires_grad_(true));
  }
  torch::optim::AdamW torch_adamw(
      params, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.0));
  for (const auto& step : grads) {
    for (size_t i = 0; i < names.size(); ++i) {
      const auto g = step.find(names[i]);
      params[i].mutable_grad() = g == step.end() ? at::Tensor() : g->second;
    }
    torch_adamw.step();
  }
  for (size_t i = 0; i < names.size(); ++i)
    EXPECT_TRUE(at::allclose(last.at(names[i]), params[i].detach(), 1e-5, 1e-7))
        << names[i] << ": largest difference "
        << (last.at(names[i]) - params[i].detach()).abs().max().item<double>();
}

}  // namespace
}  // namespace tightfit
