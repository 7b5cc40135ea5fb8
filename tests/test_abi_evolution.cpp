// ABI evolution: a plugin built against the frozen 1.0 header
// (tests/abi/v1.0) keeps loading into and working in this newer host, and a
// plugin that needs a newer minor than the host has is refused.
#include <gtest/gtest.h>

#include "memory_plan.hpp"
#include "plugin_loader.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

const std::string kV10Dir = std::string(TIGHTFIT_FIXTURE_DIR) + "/abi_v1_0";

std::string recipe(const std::string& out, const std::string& schedule) {
  return "[run]\nname = \"abi\"\nseed = 3\nsteps = 4\nlog_every = 1000\nsample_tokens = 0\n"
         "eval_batches = 1\nout_dir = \"" +
         out + "\"\nplugin_paths = [\"" + kV10Dir +
         "\"]\n[model]\nplugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 64\n"
         "n_head = 2\nn_positions = 64\n[data]\ncorpus = \"builtin:fortunes\"\n"
         "tokenizer = \"byte\"\nseq_len = 32\nbatch_size = 4\n[optimizer]\nname = \"adamw\"\n"
         "lr = 3e-3\n[schedule]\n" +
         schedule;
}

TEST(AbiEvolution, HostIsNewerThanTheFrozenHeader) {
  // The point of the fixture: it predates this host's ABI.
  EXPECT_GT(TF_ABI_VERSION_MINOR, 0);
  const LoadedPlugin p = load_plugin_file(kV10Dir + "/abi_v1_0_schedule.so", "file");
  EXPECT_EQ(p.descriptor.abi_version, TF_MAKE_VERSION(1, 0));
  EXPECT_EQ(p.descriptor.kind, TF_PLUGIN_SCHEDULE);
  ASSERT_EQ(p.keys.size(), 1u);
  EXPECT_EQ(p.keys[0].name, "note");
}

// Trained through the 1.0 host table, the losses are the built-in standard
// schedule's at the same constant learning rate, bit for bit.
TEST(AbiEvolution, V10ScheduleTrainsExactlyLikeTheBuiltInOne) {
  test::TempDir a, b;
  const TrainSummary old_abi =
      test::make_session(recipe(a.str(), "plugin = \"abi_v1_0_schedule\"\n"))->train();
  const TrainSummary current =
      test::make_session(
          recipe(b.str(), "plugin = \"standard\"\nwarmup_steps = 0\ndecay = \"constant\"\n"))
          ->train();
  ASSERT_EQ(old_abi.losses.size(), 4u);
  ASSERT_EQ(current.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(old_abi.losses[i], current.losses[i]) << "step " << i;
  EXPECT_LT(old_abi.losses.back(), old_abi.losses.front());
}

// The 1.0 plugin answers `plan` through a tf_memory_estimate smaller than
// the host's; the fields it does not know stay zero.
TEST(AbiEvolution, V10ScheduleIsPlanned) {
  test::TempDir dir;
  SessionOptions dry;
  dry.dry_run = true;
  auto s = test::make_session(recipe(dir.str(), "plugin = \"abi_v1_0_schedule\"\n"), dry);
  const MemoryPlan plan = plan_memory(s->parts());
  EXPECT_TRUE(plan.unestimated.empty());
  ASSERT_FALSE(plan.contributions.empty());
  const PlanContribution& c = plan.contributions.back();
  EXPECT_EQ(c.plugin, "schedule abi_v1_0_schedule");
  EXPECT_EQ(c.time_factor, 1.0);
  EXPECT_EQ(c.update_bytes, 0);
  EXPECT_GT(plan.device_peak, 0);
}

// Packed rows need tf_batch.positions (1.3): a schedule whose tf_batch
// predates them is refused at its first batch with the fix, rather than
// training examples that attend to one another.
TEST(AbiEvolution, V10ScheduleIsRefusedPackedRows) {
  test::TempDir dir;
  std::string rows;
  for (int i = 0; i < 20; ++i)
    rows += R"({"prompt": "n )" + std::to_string(i) + R"(", "completion": " )" +
            std::to_string(i + 1) + "\"}\n";
  const std::string data = test::write_file(dir, "rows.jsonl", rows);
  std::string r = recipe(dir.str(), "plugin = \"abi_v1_0_schedule\"\n");
  r.replace(r.find("builtin:fortunes"), 16, data);
  r.replace(r.find("batch_size = 4\n"), 15, "batch_size = 4\npacking = true\n");
  auto s = test::make_session(r);
  try {
    s->train();
    ADD_FAILURE() << "a 1.0 schedule trained packed rows";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("ABI before 1.3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("packing = false"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tightfit
