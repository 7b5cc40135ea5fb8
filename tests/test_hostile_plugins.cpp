// Plugins that break the ABI's rules: each gets a clear refusal or error
// naming the plugin (and the hook), never a crash of the host.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "plugin_loader.hpp"
#include "session.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

const std::string kHostile = std::string(TIGHTFIT_FIXTURE_DIR) + "/hostile";

std::string recipe(const test::TempDir& dir, const std::string& plugin, const std::string& mode) {
  std::string r =
      test::tiny_recipe(test::write_corpus(dir), dir.str(), "",
                        "[[strategy]]\nplugin = \"" + plugin + "\"\nmode = \"" + mode + "\"\n");
  r.replace(r.find("[run]\n"), 6, "[run]\nplugin_paths = [\"" + kHostile + "/" + plugin + "\"]\n");
  return r;
}

// The error building or training a session from `text`, "" when it ran.
std::string train_error(const std::string& text) {
  try {
    test::make_session(text)->train();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A vtable shorter than the host's (an older header): the host copies it into
// a zeroed struct of its own size, so the hooks past the plugin's size read as
// absent, whatever the bytes after the plugin's struct hold (here: hooks that
// abort the process if called).
TEST(HostilePlugins, HooksPastAShortVtableAreNeverCalled) {
  const LoadedPlugin p =
      load_plugin_file(kHostile + "/short_vtable_strategy/short_vtable_strategy.so", "file");
  EXPECT_EQ(p.plugin_vtable_size, offsetof(tf_strategy_vtable, fetch_weight));
  ASSERT_NE(p.strategy(), nullptr);
  EXPECT_EQ(p.strategy()->struct_size, sizeof(tf_strategy_vtable));
  EXPECT_NE(p.strategy()->step_begin, nullptr);
  EXPECT_EQ(p.strategy()->fetch_weight, nullptr);
  EXPECT_EQ(p.strategy()->grad_ready, nullptr);
  test::TempDir dir;
  EXPECT_EQ(train_error(recipe(dir, "short_vtable_strategy", "none")), "");
}

TEST(HostilePlugins, AnEntryThatThrowsIsRefusedNamingTheFile) {
  const std::string path = kHostile + "/throwing_entry_strategy/throwing_entry_strategy.so";
  try {
    load_plugin_file(path, "file");
    FAIL() << "loaded";
  } catch (const PluginLoadError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("threw an exception (hostile entry)"), std::string::npos)
        << e.what();
  }
}

// A hook that throws, one that returns a status no header defines, one that
// says TF_OK but hands back no tensor: each stops the run with an error
// naming the plugin and the hook.
TEST(HostilePlugins, ThrowsUnknownStatusesAndMissingTensorsAreErrorsNamingThePlugin) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"throw", "threw an exception in step_begin (hostile step_begin)"},
      {"unknown_status", "failed in step_begin: status 42"},
      {"no_tensor", "returned TF_OK from fetch_weight but no tensor"},
  };
  for (const auto& [mode, expected] : cases) {
    test::TempDir dir;
    const std::string err = train_error(recipe(dir, "hostile_strategy", mode));
    EXPECT_NE(err.find("\"hostile_strategy\""), std::string::npos) << mode << ": " << err;
    EXPECT_NE(err.find(expected), std::string::npos) << mode << ": " << err;
  }
  test::TempDir dir;
  EXPECT_EQ(train_error(recipe(dir, "hostile_strategy", "none")), "");
}

// Every call into a plugin goes through one guard (plugin_call): create,
// save_state, load_state and a schedule's run_step that throw are errors
// naming the plugin and the call, as hooks' are; a destroy that throws (it
// runs while the session is torn down) is a warning, and the run's result
// stands.
TEST(HostilePlugins, EveryCallIntoAPluginGoesThroughTheGuard) {
  for (const std::string call : {"create", "save_state"}) {
    test::TempDir dir;
    const std::string err = train_error(recipe(dir, "hostile_strategy", "throw_" + call));
    EXPECT_NE(err.find("strategy #1 plugin \"hostile_strategy\" threw an exception in " + call +
                       " (hostile " + call + ")"),
              std::string::npos)
        << call << ": " << err;
  }
  {  // load_state: a checkpoint saved by a plugin that behaved, resumed by one that throws
    test::TempDir dir;
    ASSERT_EQ(train_error(recipe(dir, "hostile_strategy", "none")), "");
    std::string text = recipe(dir, "hostile_strategy", "throw_load_state");
    text.replace(text.find("steps = 4"), 9, "steps = 6");
    SessionOptions resume;
    resume.resume = true;
    std::string err;
    try {
      test::make_session(text, resume)->train();
    } catch (const std::exception& e) {
      err = e.what();
    }
    EXPECT_NE(err.find("threw an exception in load_state (hostile load_state)"), std::string::npos)
        << err;
  }
  {  // a schedule's run_step
    test::TempDir dir;
    std::string text = test::tiny_recipe(test::write_corpus(dir), dir.str());
    text.replace(text.find("[run]\n"), 6,
                 "[run]\nplugin_paths = [\"" + kHostile + "/hostile_schedule\"]\n");
    const std::string standard = "plugin = \"standard\"\nwarmup_steps = 2\n";
    text.replace(text.find(standard), standard.size(),
                 "plugin = \"hostile_schedule\"\nmode = \"throw_run_step\"\n");
    const std::string err = train_error(text);
    EXPECT_NE(err.find("schedule plugin \"hostile_schedule\" threw an exception in run_step "
                       "(hostile run_step)"),
              std::string::npos)
        << err;
    text.replace(text.find("throw_run_step"), 14, "none");
    EXPECT_EQ(train_error(text), "");  // the same schedule that behaves trains
  }
  {  // destroy
    test::TempDir dir;
    const std::string path =
        test::write_file(dir, "r.toml", recipe(dir, "hostile_strategy", "throw_destroy"));
    std::string out;
    EXPECT_EQ(test::run_tightfit("run " + path + " -q", &out), 0) << out;
    EXPECT_NE(out.find("[warning] strategy #1 plugin \"hostile_strategy\" threw an exception in "
                       "destroy (hostile destroy)"),
              std::string::npos)
        << out;
  }
}

// The log lines of training `text` and the error it stopped with ("" = none).
std::pair<std::vector<std::string>, std::string> train_logged(const std::string& text) {
  auto lines = std::make_shared<std::vector<std::string>>();
  auto m = std::make_shared<std::mutex>();
  SessionOptions o;
  o.on_log = [lines, m](const std::string& line) {
    std::lock_guard<std::mutex> lock(*m);
    lines->push_back(line);
  };
  std::string error;
  try {
    test::make_session(text, o)->train();
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::lock_guard<std::mutex> lock(*m);
  return {*lines, error};
}

bool has_line(const std::vector<std::string>& lines, const std::string& part) {
  for (const auto& l : lines)
    if (l.find(part) != std::string::npos) return true;
  return false;
}

// fetch_weight handing back the handle the host lent it: adopting that would
// free a tensor the host owns; it is the plugin's error.
TEST(HostilePlugins, HandingBackALentTensorIsAnErrorNamingThePlugin) {
  test::TempDir dir;
  const std::string err = train_error(recipe(dir, "hostile_strategy", "return_borrowed"));
  EXPECT_NE(err.find("\"hostile_strategy\" returned from fetch_weight the tensor handle the host "
                     "lent it"),
            std::string::npos)
      << err;
}

// Services called from a thread the plugin started are refused with
// TF_ERR_UNSUPPORTED (and a warning naming the plugin); the three the header
// allows there still work.
TEST(HostilePlugins, ServicesFromAPluginsOwnThreadAreRefused) {
  test::TempDir dir;
  const auto [lines, err] = train_logged(recipe(dir, "hostile_strategy", "other_thread"));
  EXPECT_EQ(err, "");
  EXPECT_TRUE(has_line(lines, "own thread: param_count " + std::to_string(TF_ERR_UNSUPPORTED) +
                                  ", memory_push_category 0, memory_pop_category 0"));
  EXPECT_TRUE(has_line(lines,
                       "[hostile_strategy] called a host service from a thread the host "
                       "did not call it on"));
  EXPECT_TRUE(has_line(lines, "[hostile_strategy] logged from the plugin's own thread"));
}

// Services meant for other calls return the documented TF_ERR_UNSUPPORTED.
TEST(HostilePlugins, ServicesInTheWrongPhaseAreUnsupported) {
  test::TempDir dir;
  const auto [lines, err] = train_logged(recipe(dir, "hostile_strategy", "wrong_phase"));
  EXPECT_EQ(err, "");
  const std::string u = std::to_string(TF_ERR_UNSUPPORTED);
  EXPECT_TRUE(has_line(lines, "wrong phase: declare_param " + u + ", state_put_double " + u +
                                  ", plan_param_get " + u));
}

// A parameter's name handed to a plugin survives declarations that move the
// host's table; release_weight, withdrawn, is never called (the fixture's
// aborts) and the host says so.
TEST(HostilePlugins, NamesOutliveLaterDeclarationsAndReleaseWeightIsNeverCalled) {
  test::TempDir dir;
  const auto [lines, err] = train_logged(recipe(dir, "hostile_strategy", "names_survive"));
  EXPECT_EQ(err, "");
  EXPECT_TRUE(has_line(lines,
                       "[hostile_strategy] sets release_weight, which no tightfit 1.x "
                       "host calls"));
}

// Output structs: written no further than the caller's struct_size, which
// then says min(caller's, host's). Input structs: a size too small to hold
// the fields is refused before any is read.
TEST(HostilePlugins, StructsAreReadAndWrittenWithinTheCallersSize) {
  test::TempDir dir;
  auto s = test::make_session(recipe(dir, "hostile_strategy", "none"));
  const tf_host_api* api = s->host_api();
  tf_host_context* ctx = s->plugins().model.ctx.get();
  const char* name = nullptr;
  ASSERT_EQ(api->param_name(ctx, 0, &name), TF_OK);

  // A newer caller's larger struct: the host's size comes back, the rest untouched.
  std::vector<unsigned char> big(sizeof(tf_param_info) + 64, 0xAB);
  auto* info = reinterpret_cast<tf_param_info*>(big.data());
  info->struct_size = static_cast<uint32_t>(big.size());
  ASSERT_EQ(api->param_info(ctx, name, info), TF_OK);
  EXPECT_EQ(info->struct_size, sizeof(tf_param_info));
  EXPECT_GT(info->ndim, 0);
  for (size_t i = sizeof(tf_param_info); i < big.size(); ++i) ASSERT_EQ(big[i], 0xAB) << i;

  // An older caller's smaller struct: nothing past its size is written.
  std::vector<unsigned char> small(sizeof(tf_param_info), 0xCD);
  info = reinterpret_cast<tf_param_info*>(small.data());
  const uint32_t older = offsetof(tf_param_info, ndim) + sizeof(int32_t);
  info->struct_size = older;
  ASSERT_EQ(api->param_info(ctx, name, info), TF_OK);
  EXPECT_EQ(info->struct_size, older);
  EXPECT_GT(info->ndim, 0);
  for (size_t i = older; i < small.size(); ++i) ASSERT_EQ(small[i], 0xCD) << i;

  // A batch whose struct_size cannot hold its own header is refused.
  tf_batch batch{};
  batch.struct_size = 4;
  tf_pass_result result{};
  result.struct_size = sizeof result;
  EXPECT_EQ(api->forward(ctx, &batch, &result), TF_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(api->last_error(ctx)).find("struct_size is too small"), std::string::npos)
      << api->last_error(ctx);
}

}  // namespace
}  // namespace tightfit
