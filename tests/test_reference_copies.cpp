// reference_tier = "weights" (ABI 1.19's declare_param_copies): a full
// fine-tune's reference model as frozen copies of the trainable weights,
// which the strategies place like any frozen weight. Left alone they give
// the schedule's device copy's run bit for bit; offloaded to disk with the
// trained weights the same run; quantized, the reference is the quantized
// model (QLoRA's base, with its adapters off).
#include "preference_test_support.hpp"

namespace tightfit {
namespace {

using namespace preference_test;

class ReferenceCopies : public PreferenceRecipes {
 protected:
  static constexpr const char* kWeights = "reference_tier = \"weights\"\n";

  static std::string text(const std::string& out, const std::string& schedule,
                          const std::string& extra, const std::string& strategies = "",
                          int64_t steps = 6) {
    const std::string data = schedule == "kto" ? "max_prompt_length = 32\n" : "";
    return recipe(out, rows(), data, "plugin = \"" + schedule + "\"\n" + extra, strategies, steps);
  }
  static TrainSummary run(const std::string& recipe_text, bool resume = false,
                          int64_t stop_after = -1) {
    SessionOptions o;
    o.resume = resume;
    o.stop_after_steps = stop_after;
    return test::make_session(recipe_text, o)->train();
  }
  // The first line of a run's metrics.jsonl (its first step).
  static nlohmann::json first_metrics(const TrainSummary& sum) {
    std::ifstream in(sum.metrics_path);
    std::string line;
    std::getline(in, line);
    return nlohmann::json::parse(line);
  }
};

// Left where they are made (no strategy), the copies are the device copy:
// the same losses and held-out loss, bit for bit, for dpo and kto, resumed
// too (a checkpoint carries them as frozen weights); the plan counts them
// as the weights the device copy adds; exports leave them out.
TEST_F(ReferenceCopies, AsFrozenWeightsTheyGiveTheDeviceCopysRun) {
  for (const std::string schedule : {"dpo", "kto"}) {
    SCOPED_TRACE(schedule);
    test::TempDir d;
    const TrainSummary device = run(text(d.str() + "/device", schedule, ""));
    const TrainSummary copies = run(text(d.str() + "/copies", schedule, kWeights));
    ASSERT_EQ(device.losses.size(), 6u);
    ASSERT_EQ(copies.losses.size(), 6u);
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(copies.losses[i], device.losses[i]) << "step " << i;
    EXPECT_EQ(copies.val_loss, device.val_loss);
    run(text(d.str() + "/b", schedule, kWeights), false, 3);
    const TrainSummary second = run(text(d.str() + "/b", schedule, kWeights), true);
    ASSERT_EQ(second.losses.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_EQ(second.losses[i], device.losses[3 + i]) << "step " << 3 + i;

    const MemoryPlan device_plan = test::plan_of(text(d.str(), schedule, ""));
    const MemoryPlan copies_plan = test::plan_of(text(d.str(), schedule, kWeights));
    EXPECT_EQ(copies_plan.n_params, device_plan.n_params);  // a copy is not more of the model
    EXPECT_EQ(copies_plan.at_peak[TF_TIER_DEVICE][TF_MEM_WEIGHTS],
              device_plan.at_peak[TF_TIER_DEVICE][TF_MEM_WEIGHTS]);

    auto s = test::make_session(text(d.str() + "/export", schedule, kWeights, "", 1));
    s->train();
    const std::string hf = d.str() + "/hf";
    s->export_hf(hf, true, int64_t{1} << 40);
    const SafetensorsFile exported = read_safetensors(hf + "/model.safetensors");
    EXPECT_FALSE(exported.tensors.empty());
    for (const auto& [name, t] : exported.tensors)
      EXPECT_EQ(name.rfind("reference.", 0), std::string::npos) << name;
    EXPECT_NE(s->store().find("reference.model.embed_tokens.weight"), nullptr);
  }
}

// Offloaded to disk along with the trained block weights (offload's
// trainable = true, which the device copy refuses): the same losses as the
// device copy's run, each copy read only by the reference pass; the plan
// moves the copies' block bytes off the device.
TEST_F(ReferenceCopies, OnDiskWithTheTrainedWeightsTheRunIsTheDeviceCopys) {
  const std::string offload =
      "[[strategy]]\nplugin = \"offload\"\nparams = \"disk\"\ntrainable = true\n"
      "optimizer = \"disk\"\n";
  test::TempDir d;
  const TrainSummary device = run(text(d.str() + "/device", "dpo", ""));
  auto s = test::make_session(text(d.str() + "/disk", "dpo", kWeights, offload));
  const Param& copy = s->store().get("reference.model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(copy.residency, TF_TIER_DISK);
  EXPECT_EQ(copy.value.numel(), 0);  // not brought in with its stage
  const TrainSummary disk = s->train();
  ASSERT_EQ(disk.losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(disk.losses[i], device.losses[i]) << "step " << i;
  EXPECT_EQ(disk.val_loss, device.val_loss);
  const nlohmann::json m = first_metrics(disk);
  ASSERT_TRUE(m.contains("offload.copy_mib")) << m.dump();
  EXPECT_GT(m["offload.copy_mib"].get<double>(), 0);
  EXPECT_FALSE(m.contains("offload.expert_loads")) << m.dump();

  const MemoryPlan device_plan = test::plan_of(text(d.str(), "dpo", ""));
  const MemoryPlan disk_plan = test::plan_of(text(d.str(), "dpo", kWeights, offload));
  EXPECT_LT(disk_plan.at_peak[TF_TIER_DEVICE][TF_MEM_WEIGHTS],
            device_plan.at_peak[TF_TIER_DEVICE][TF_MEM_WEIGHTS]);
  EXPECT_GT(disk_plan.disk_bytes, 0);
}

// Quantized (nf4): the reference is the model with its block matrices
// quantized, which is QLoRA's base: at the first step (adapters at B = 0)
// the reference's log-probabilities a full fine-tune with quantized copies
// scores against equal the QLoRA run's policy's. The plan keeps the copies'
// block matrices compact.
TEST_F(ReferenceCopies, QuantizedTheReferenceIsTheQuantizedModel) {
  const std::string quantize = "[[strategy]]\nplugin = \"quantize\"\nformat = \"nf4\"\n";
  test::TempDir d;
  const TrainSummary copies = run(text(d.str() + "/copies", "dpo", kWeights, quantize, 1));
  const TrainSummary qlora = run(text(d.str() + "/qlora", "dpo", "", kLora + quantize, 1));
  const nlohmann::json c = first_metrics(copies), q = first_metrics(qlora);
  for (const char* side : {"chosen", "rejected"}) {
    const std::string logps = std::string("dpo.logps/") + side;
    const std::string rewards = std::string("dpo.rewards/") + side;
    ASSERT_TRUE(c.contains(logps) && c.contains(rewards)) << c.dump();
    ASSERT_TRUE(q.contains(logps)) << q.dump();
    // rewards = beta (policy - reference), beta 0.1.
    const double reference = c[logps].get<double>() - c[rewards].get<double>() / 0.1;
    EXPECT_NEAR(reference, q[logps].get<double>(), 1e-4 * std::abs(q[logps].get<double>())) << side;
    EXPECT_NE(c[rewards].get<double>(), 0.0) << side;  // not the policy's own weights
  }
  const MemoryPlan device_plan = test::plan_of(text(d.str(), "dpo", ""));
  const MemoryPlan quantized_plan = test::plan_of(text(d.str(), "dpo", kWeights, quantize));
  EXPECT_LT(quantized_plan.at_peak[TF_TIER_DEVICE][TF_MEM_WEIGHTS],
            device_plan.at_peak[TF_TIER_DEVICE][TF_MEM_WEIGHTS]);
}

// Refused by name where there is no copy to place, and outside the one
// call where copies can be declared.
TEST_F(ReferenceCopies, RecipesWithoutACopyToPlaceAreRefusedByName) {
  test::TempDir d;
  const std::string with_adapters =
      error_of([&] { test::make_session(text(d.str() + "/lora", "dpo", kWeights, kLora)); });
  EXPECT_NE(with_adapters.find("with adapters the reference is the base with them off"),
            std::string::npos)
      << with_adapters;
  const std::string precomputed = error_of([&] {
    test::make_session(
        text(d.str(), "kto", std::string(kWeights) + "precompute_ref_log_probs = true\n"));
  });
  EXPECT_NE(precomputed.find("precompute_ref_log_probs = true keeps none"), std::string::npos)
      << precomputed;
  // The device copy still refuses a strategy that moves trained weights,
  // and says where the copy can go instead.
  const std::string moved = error_of([&] {
    test::make_session(text(d.str() + "/moved", "dpo", "",
                            "[[strategy]]\nplugin = \"offload\"\nparams = \"host\"\n"
                            "optimizer = \"host\"\ntrainable = true\n"))
        ->train();
  });
  EXPECT_NE(moved.find("reference_tier = \"weights\""), std::string::npos) << moved;
  // After the schedule's create, copies can no longer be declared.
  auto s = test::make_session(text(d.str() + "/late", "dpo", kWeights, "", 1));
  tf_host_context* ctx = s->plugins().schedule.ctx.get();
  int32_t n = -1;
  EXPECT_EQ(s->host_api()->declare_param_copies(ctx, "late.", &n), TF_ERR_UNSUPPORTED);
  EXPECT_EQ(n, -1);
  EXPECT_EQ(s->host_api()->use_param_copies(ctx, "nothing."), TF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s->host_api()->use_param_copies(ctx, "reference."), TF_OK);
  EXPECT_EQ(s->host_api()->use_param_copies(ctx, nullptr), TF_OK);
}

}  // namespace
}  // namespace tightfit
