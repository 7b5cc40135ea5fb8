// run_pass (ABI 1.20): a pass is a value. One tf_pass says what the pass
// computes, with which weights and whether it back-propagates; nothing of it
// lasts past the call; and a loss pass may leave its loss on the device to
// be read with the update's gradient norm, one read a step.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "host_reads.hpp"
#include "tensor_handle.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

// A tiny GPT-2 with LoRA on its attention, its adapters moved off zero so
// that turning them off changes the model, and one batch of its data.
class RunPassTest : public ::testing::Test {
 protected:
  void SetUp() override {
    s_ = test::make_session(
        test::tiny_recipe(test::write_corpus(dir_), dir_.str() + "/out", "",
                          "[[strategy]]\nplugin = \"lora\"\ntargets = [\"c_attn\"]\n"));
    api_ = s_->host_api();
    ctx_ = s_->plugins().schedule.ctx.get();
    ASSERT_EQ(api_->perturb_params(ctx_, 7, 0.05), TF_OK);
    batch_.struct_size = sizeof batch_;
    ASSERT_EQ(api_->next_batch(ctx_, &batch_), TF_OK);
  }
  void TearDown() override { api_->batch_release(ctx_, &batch_); }

  tf_pass pass(tf_pass_compute what) const {
    tf_pass p{};
    p.struct_size = sizeof p;
    p.compute = what;
    p.batch = &batch_;
    return p;
  }
  static tf_pass_result result() {
    tf_pass_result r{};
    r.struct_size = sizeof r;
    return r;
  }
  // Each trainable parameter's gradient, copied, then cleared.
  std::map<std::string, at::Tensor> take_grads() {
    std::map<std::string, at::Tensor> grads;
    for (Param* p : s_->store().trainable())
      if (p->value.grad().defined()) grads[p->name] = p->value.grad().clone();
    s_->update().zero_grad();
    return grads;
  }
  // Takes a new tensor handle out of a result.
  static at::Tensor take(tf_tensor& h) {
    at::Tensor t = handle_tensor(h);
    release_handle(h);
    h = nullptr;
    return t;
  }

  test::TempDir dir_;
  std::unique_ptr<Session> s_;
  const tf_host_api* api_ = nullptr;
  tf_host_context* ctx_ = nullptr;
  tf_batch batch_{};
};

TEST_F(RunPassTest, ALossPassIsForwardBackwardBitForBit) {
  tf_pass_result old = result();
  ASSERT_EQ(api_->forward_backward(ctx_, &batch_, 0.5, &old), TF_OK);
  const auto expected = take_grads();
  ASSERT_FALSE(expected.empty());
  tf_pass p = pass(TF_PASS_LOSS);
  p.backward = 1;
  p.loss_scale = 0.5;
  tf_pass_result r = result();
  ASSERT_EQ(api_->run_pass(ctx_, &p, &r), TF_OK) << api_->last_error(ctx_);
  EXPECT_EQ(r.loss, old.loss);
  EXPECT_EQ(r.n_tokens, old.n_tokens);
  EXPECT_EQ(r.finite, 1);
  EXPECT_EQ(r.read_pending, 0);
  const auto grads = take_grads();
  ASSERT_EQ(grads.size(), expected.size());
  for (const auto& [name, g] : expected) EXPECT_TRUE(at::equal(grads.at(name), g)) << name;
  // Without backward: the same loss, no gradient.
  p.backward = 0;
  tf_pass_result f = result();
  ASSERT_EQ(api_->run_pass(ctx_, &p, &f), TF_OK);
  EXPECT_EQ(f.loss, old.loss);
  EXPECT_TRUE(take_grads().empty());
}

TEST_F(RunPassTest, ADeferredLossIsWrittenByTheUpdatesOneRead) {
  tf_pass_result plain = result();
  ASSERT_EQ(api_->forward(ctx_, &batch_, &plain), TF_OK);
  tf_pass p = pass(TF_PASS_LOSS);
  p.backward = 1;
  p.defer_read = 1;
  // Inside a step (the trainer opens the window around run_step).
  s_->executor().pending_reads().open();
  tf_pass_result r = result();
  const int64_t before = host_reads();
  ASSERT_EQ(api_->run_pass(ctx_, &p, &r), TF_OK) << api_->last_error(ctx_);
  EXPECT_EQ(host_reads(), before) << "the pass read its loss";
  EXPECT_EQ(r.read_pending, 1);
  EXPECT_EQ(r.loss, 0.0);
  ASSERT_EQ(api_->optimizer_step(ctx_), TF_OK);
  EXPECT_EQ(host_reads(), before + 1) << "the update and the loss in one read";
  EXPECT_EQ(r.read_pending, 0);
  EXPECT_EQ(r.loss, plain.loss);
  EXPECT_EQ(r.finite, 1);
  EXPECT_EQ(s_->executor().pending_reads().close(), 0u);
  // A pass left unread when the window closes is never written.
  s_->executor().pending_reads().open();
  tf_pass_result left = result();
  ASSERT_EQ(api_->run_pass(ctx_, &p, &left), TF_OK);
  EXPECT_EQ(s_->executor().pending_reads().close(), 1u);
  EXPECT_EQ(left.read_pending, 1);
  s_->update().zero_grad();
  // Outside a step the loss is read before run_pass returns.
  tf_pass_result now = result();
  ASSERT_EQ(api_->run_pass(ctx_, &p, &now), TF_OK);
  EXPECT_EQ(now.read_pending, 0);
  EXPECT_TRUE(std::isfinite(now.loss));
  EXPECT_GT(now.loss, 0);
}

TEST_F(RunPassTest, APluginsValueReadLaterComesWithTheUpdatesRead) {
  const at::Tensor value = at::full({}, 2.5, at::kFloat);
  // Outside a step: at once.
  double now = 0;
  ASSERT_EQ(api_->read_later(ctx_, borrow_handle(value), &now), TF_OK);
  EXPECT_EQ(now, 2.5);
  // Inside: with the update's read, beside a deferred loss.
  tf_pass p = pass(TF_PASS_LOSS);
  p.backward = 1;
  p.defer_read = 1;
  s_->executor().pending_reads().open();
  tf_pass_result r = result();
  ASSERT_EQ(api_->run_pass(ctx_, &p, &r), TF_OK);
  double later = 0;
  const int64_t before = host_reads();
  ASSERT_EQ(api_->read_later(ctx_, borrow_handle(value * 2), &later), TF_OK);
  EXPECT_EQ(later, 0.0);
  ASSERT_EQ(api_->optimizer_step(ctx_), TF_OK);
  EXPECT_EQ(host_reads(), before + 1);
  EXPECT_EQ(later, 5.0);
  EXPECT_EQ(r.read_pending, 0);
  // A value still unread when the step ends is read then (its slot is the
  // plugin's, not a call's).
  double at_close = 0;
  ASSERT_EQ(api_->read_later(ctx_, borrow_handle(value * 3), &at_close), TF_OK);
  EXPECT_EQ(s_->executor().pending_reads().close(), 0u);
  EXPECT_EQ(at_close, 7.5);
  // Not one number: refused.
  const at::Tensor two = at::ones({2});
  EXPECT_EQ(api_->read_later(ctx_, borrow_handle(two), &now), TF_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api_->read_later(ctx_, borrow_handle(value), nullptr), TF_ERR_INVALID_ARGUMENT);
}

TEST_F(RunPassTest, AdaptersOffAndMeanLogitsHoldForThePassAlone) {
  // The modal calls: adapters off, the next logps call measures mean logits.
  int32_t holders = 0;
  ASSERT_EQ(api_->adapters_set_enabled(ctx_, 0, &holders), TF_OK);
  ASSERT_EQ(holders, 1);
  tf_tensor means_h = nullptr, logps_h = nullptr, counts_h = nullptr;
  ASSERT_EQ(api_->take_mean_logits(ctx_, &means_h), TF_OK);
  ASSERT_EQ(api_->sequence_logps(ctx_, &batch_, nullptr, &logps_h, &counts_h), TF_OK);
  ASSERT_EQ(api_->adapters_set_enabled(ctx_, 1, nullptr), TF_OK);
  const at::Tensor base_logps = take(logps_h), base_counts = take(counts_h),
                   base_means = take(means_h);
  tf_tensor on_h = nullptr;
  ASSERT_EQ(api_->sequence_logps(ctx_, &batch_, nullptr, &on_h, nullptr), TF_OK);
  const at::Tensor on_logps = take(on_h);
  ASSERT_FALSE(at::equal(on_logps, base_logps)) << "the adapters change nothing";

  // The same as one value.
  tf_pass p = pass(TF_PASS_SEQUENCE_LOGPS);
  p.adapters_off = 1;
  p.mean_logits = 1;
  tf_pass_result r = result();
  ASSERT_EQ(api_->run_pass(ctx_, &p, &r), TF_OK) << api_->last_error(ctx_);
  ASSERT_NE(r.logps, nullptr);
  ASSERT_NE(r.counts, nullptr);
  ASSERT_NE(r.mean_logits, nullptr);
  EXPECT_TRUE(at::equal(take(r.logps), base_logps));
  EXPECT_TRUE(at::equal(take(r.counts), base_counts));
  EXPECT_TRUE(at::equal(take(r.mean_logits), base_means));
  EXPECT_EQ(r.finite, 1);
  // Nothing of it lasts: the adapters are on, and no mean logits are armed.
  tf_tensor after_h = nullptr;
  ASSERT_EQ(api_->sequence_logps(ctx_, &batch_, nullptr, &after_h, nullptr), TF_OK);
  EXPECT_TRUE(at::equal(take(after_h), on_logps));
  EXPECT_TRUE(s_->executor().adapters_enabled());

  // With the modal state off, a pass that asks nothing has them on, and the
  // state is off again after it.
  ASSERT_EQ(api_->adapters_set_enabled(ctx_, 0, nullptr), TF_OK);
  tf_pass on = pass(TF_PASS_SEQUENCE_LOGPS);
  tf_pass_result r_on = result();
  ASSERT_EQ(api_->run_pass(ctx_, &on, &r_on), TF_OK);
  EXPECT_TRUE(at::equal(take(r_on.logps), on_logps));
  take(r_on.counts);
  EXPECT_FALSE(s_->executor().adapters_enabled());
  ASSERT_EQ(api_->adapters_set_enabled(ctx_, 1, nullptr), TF_OK);
}

TEST_F(RunPassTest, ATokenPassWithBackwardIsTokenLogpsBitForBit) {
  const at::Tensor targets = handle_tensor(batch_.targets);
  const at::Tensor weights = at::rand(targets.sizes(), at::kFloat);
  tf_tensor old_h = nullptr;
  ASSERT_EQ(api_->token_logps(ctx_, &batch_, borrow_handle(weights), &old_h), TF_OK);
  const at::Tensor old_logps = take(old_h);
  const auto expected = take_grads();
  ASSERT_FALSE(expected.empty());
  tf_pass p = pass(TF_PASS_TOKEN_LOGPS);
  p.backward = 1;
  p.grad_weights = borrow_handle(weights);
  tf_pass_result r = result();
  ASSERT_EQ(api_->run_pass(ctx_, &p, &r), TF_OK) << api_->last_error(ctx_);
  EXPECT_TRUE(at::equal(take(r.logps), old_logps));
  EXPECT_EQ(r.counts, nullptr);
  const auto grads = take_grads();
  for (const auto& [name, g] : expected) EXPECT_TRUE(at::equal(grads.at(name), g)) << name;
}

TEST_F(RunPassTest, WhatAPassCannotBeIsRefusedByName) {
  auto refused = [&](tf_pass p, const std::string& says) {
    tf_pass_result r = result();
    EXPECT_EQ(api_->run_pass(ctx_, &p, &r), TF_ERR_INVALID_ARGUMENT) << says;
    const std::string error = api_->last_error(ctx_);
    EXPECT_NE(error.find(says), std::string::npos) << error;
    EXPECT_EQ(r.logps, nullptr);
  };
  tf_pass unknown = pass(TF_PASS_LOSS);
  unknown.compute = static_cast<tf_pass_compute>(7);
  refused(unknown, "tf_pass.compute 7");
  tf_pass deferred_logps = pass(TF_PASS_SEQUENCE_LOGPS);
  deferred_logps.defer_read = 1;
  refused(deferred_logps, "defer_read");
  tf_pass loss_targets = pass(TF_PASS_LOSS);
  loss_targets.targets = batch_.targets;
  refused(loss_targets, "tf_pass.targets");
  tf_pass copies = pass(TF_PASS_LOSS);
  copies.param_copies = "reference.";
  refused(copies, "no copies were declared under \"reference.\"");
  tf_pass no_weights = pass(TF_PASS_SEQUENCE_LOGPS);
  no_weights.backward = 1;
  refused(no_weights, "needs its grad_weights");
  tf_pass loss_means = pass(TF_PASS_LOSS);
  loss_means.mean_logits = 1;
  refused(loss_means, "a loss pass takes no");
  // A result too short to say when a deferred loss is written.
  tf_pass d = pass(TF_PASS_LOSS);
  d.defer_read = 1;
  tf_pass_result short_result = result();
  short_result.struct_size = offsetof(tf_pass_result, logps);
  EXPECT_EQ(api_->run_pass(ctx_, &d, &short_result), TF_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(s_->executor().adapters_enabled());
}

}  // namespace
}  // namespace tightfit
