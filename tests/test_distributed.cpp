// Multi-process runs: 2 ranks on Gloo (this machine's CPU) through the real
// launchers (`tightfit run --nproc 2`, torchrun), checked against a single
// process on the same global batch; ZeRO's memory, resume on another number
// of ranks, and what happens when a rank dies or hangs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "safetensors.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// A tiny GPT-2 run; `batch` rows per rank, `strategy` appended.
std::string recipe(const TempDir& dir, const std::string& corpus, const std::string& name,
                   int64_t batch, const std::string& strategy, const std::string& optimizer,
                   int64_t steps = 4, double timeout = 60) {
  std::ostringstream os;
  os << "[run]\nname = \"" << name << "\"\nseed = 7\nsteps = " << steps << "\nout_dir = \""
     << (dir.path() / "runs").string()
     << "\"\nsample_tokens = 0\neval_batches = 1\nlog_every = 1000\nthreads = 1\n"
     << "dist_timeout = " << timeout << "\n\n"
     << "[model]\nplugin = \"gpt2\"\npreset = \"custom\"\nn_layer = 4\nn_embd = 32\nn_head = 2\n"
     << "n_positions = 64\n\n"
     << "[data]\ncorpus = \"" << corpus
     << "\"\ntokenizer = \"byte\"\nseq_len = 32\nbatch_size = " << batch << "\n\n"
     << "[optimizer]\n"
     << optimizer << "\n\n"
     << "[schedule]\nplugin = \"standard\"\nwarmup_steps = 2\n\n"
     << "[save]\nfinal = true\nhf = true\n\n"
     << strategy;
  return test::write_file(dir, name + ".toml", os.str());
}

const char* kSgd = "name = \"sgd\"\nlr = 0.1\nmomentum = 0.9";
const char* kAdamW = "name = \"adamw\"\nlr = 1e-3";
// Without clipping ZeRO's updates are bitwise those of data parallel (with it,
// the norm is summed in another order: equal to ~1e-7).
const char* kAdamWNoClip = "name = \"adamw\"\nlr = 1e-3\ngrad_clip = 0";

std::string shard(const std::string& mode) {
  return "[[strategy]]\nplugin = \"shard\"\n" + mode + "\n";
}

// The trained model, whole (the Hugging Face folder the run exports at its
// end: ZeRO-3 checkpoints hold parameters in parts).
fs::path trained(const TempDir& dir, const std::string& name) {
  return dir.path() / "runs" / name / "hf";
}

fs::path final_checkpoint(const TempDir& dir, const std::string& name, int64_t step = 4) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return dir.path() / "runs" / name / "checkpoints" / buf;
}

// The largest per-tensor relative difference ||a - b|| / ||b|| of two models.
double max_relative_difference(const fs::path& a, const fs::path& b) {
  const auto ma = read_safetensors((a / "model.safetensors").string());
  const auto mb = read_safetensors((b / "model.safetensors").string());
  double worst = 0;
  for (const auto& [k, t] : mb.tensors) {
    const at::Tensor& u = ma.tensors.at(k);
    worst = std::max(worst, (u - t).norm().item<double>() / (t.norm().item<double>() + 1e-12));
  }
  return worst;
}

std::vector<nlohmann::json> metrics(const TempDir& dir, const std::string& name) {
  std::ifstream in(dir.path() / "runs" / name / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

void run_ok(const std::string& args) {
  std::string out;
  const int rc = test::run_tightfit(args, &out);
  ASSERT_EQ(rc, 0) << out;
}

class Distributed : public ::testing::Test {
 protected:
  TempDir dir;
  std::string corpus = test::write_corpus(dir);
};

// Data parallel and ZeRO 1/2 with 2 ranks of 2 rows = one process with 4 rows.
TEST_F(Distributed, TwoRanksEqualOneProcessOnTheGlobalBatch) {
  run_ok("run -q " + recipe(dir, corpus, "single", 4, "", kSgd));
  for (const auto& [name, mode] : std::vector<std::pair<std::string, std::string>>{
           {"data", "mode = \"data\""},
           {"zero1", "mode = \"zero\"\nstage = 1"},
           {"zero2", "mode = \"zero\"\nstage = 2"},
           {"zero3", "mode = \"zero\"\nstage = 3"},
           {"zero3-checkpoint",
            "mode = \"zero\"\nstage = 3\n[[strategy]]\nplugin = \"checkpoint\""}}) {
    SCOPED_TRACE(name);
    run_ok("run -q --nproc 2 " + recipe(dir, corpus, name, 2, shard(mode), kSgd));
    EXPECT_LE(max_relative_difference(trained(dir, name), trained(dir, "single")), 1e-5);
    // Rank 0 reports the global batch's loss.
    const auto a = metrics(dir, name), b = metrics(dir, "single");
    ASSERT_EQ(a.size(), 4u);
    ASSERT_EQ(b.size(), 4u);
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_NEAR(a[i]["loss"].get<double>(), b[i]["loss"].get<double>(), 1e-5);
  }
}

// Preference pairs on 2 ranks of 2 pairs = one process with 4: each rank
// scores its own pairs, the gradients are averaged, and the loss, TRL's
// metrics and the held-out loss are the ranks' means (as TRL gathers them).
TEST_F(Distributed, PreferencePairsOnTwoRanksEqualOneProcess) {
  const fs::path peer = dir.path() / "peer";
  fs::create_directories(peer);
  const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                          "/tests/peers/dpo_data.py " + peer.string() + " > " + peer.string() +
                          "/peer.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the TRL data peer failed";
  auto pairs_recipe = [&](const std::string& name, int64_t pairs, const std::string& extra) {
    std::ostringstream os;
    os << "[run]\nname = \"" << name << "\"\nseed = 7\nsteps = 4\nout_dir = \""
       << (dir.path() / "runs").string()
       << "\"\nsample_tokens = 0\neval_batches = 1\nlog_every = 1000\nthreads = 1\n\n"
       << "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\n"
       << "n_head = 4\nn_kv_head = 2\nintermediate_size = 64\nmax_positions = 128\n\n"
       << "[data]\ncorpus = \"" << (peer / "rows.jsonl").string() << "\"\ntokenizer = \""
       << (peer / "tokenizer.json").string()
       << "\"\nseq_len = 96\nval_fraction = 0.25\nbatch_size = " << pairs << "\n\n"
       << "[optimizer]\nname = \"adamw\"\nlr = 1e-2\ngrad_clip = 0\n\n"
       << "[schedule]\nplugin = \"dpo\"\nwarmup_steps = 0\n\n[save]\nfinal = true\nhf = true\n\n"
       << "[[strategy]]\nplugin = \"lora\"\ntargets = [\"q\", \"v\"]\n"
       << extra;
    return test::write_file(dir, name + ".toml", os.str());
  };
  run_ok("run -q " + pairs_recipe("pairs-single", 4, ""));
  run_ok("run -q --nproc 2 " +
         pairs_recipe("pairs-data", 2, "[[strategy]]\nplugin = \"shard\"\nmode = \"data\"\n"));
  EXPECT_LE(max_relative_difference(trained(dir, "pairs-data"), trained(dir, "pairs-single")),
            1e-4);
  const auto a = metrics(dir, "pairs-data"), b = metrics(dir, "pairs-single");
  ASSERT_EQ(a.size(), b.size());
  size_t compared = 0;
  // logits/chosen and /rejected are each rank's mean over its own tokens,
  // averaged over the ranks as TRL gathers them: not the one process's mean
  // over every token, so they are only checked to be there.
  for (size_t i = 0; i < a.size(); ++i)
    for (const auto& [key, value] : b[i].items())
      if (key.rfind("dpo.logits/", 0) == 0) {
        EXPECT_TRUE(a[i].contains(key)) << key;
      } else if (key == "loss" || key == "val_loss" || key.rfind("dpo.", 0) == 0) {
        ASSERT_TRUE(a[i].contains(key)) << key;
        EXPECT_NEAR(a[i][key].get<double>(), value.get<double>(),
                    1e-4 * std::max(1.0, std::abs(value.get<double>())))
            << key << " at record " << i;
        ++compared;
      }
  EXPECT_GE(compared, 4u * 7);  // the loss and six metrics of each step
}

// KTO's unpaired rows on two ranks, each with its own batch_size rows and
// their KL rows (as TRL's per-device chunks): with APO-zero's loss (no KL
// term) two ranks of 2 equal one process of 4; with KTO's, the KL estimate
// is the ranks' mean, the same on both, and the run trains.
TEST_F(Distributed, UnpairedRowsOnTwoRanks) {
  const fs::path peer = dir.path() / "peer";
  fs::create_directories(peer);
  const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                          "/tests/peers/dpo_data.py " + peer.string() + " > " + peer.string() +
                          "/peer.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the TRL data peer failed";
  auto kto_recipe = [&](const std::string& name, int64_t rows, const std::string& loss,
                        const std::string& extra) {
    std::ostringstream os;
    os << "[run]\nname = \"" << name << "\"\nseed = 7\nsteps = 3\nout_dir = \""
       << (dir.path() / "runs").string()
       << "\"\nsample_tokens = 0\neval_batches = 0\nlog_every = 1000\nthreads = 1\n\n"
       << "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\n"
       << "n_head = 4\nn_kv_head = 2\nintermediate_size = 64\nmax_positions = 128\n\n"
       << "[data]\ncorpus = \"" << (peer / "rows.jsonl").string() << "\"\ntokenizer = \""
       << (peer / "tokenizer.json").string()
       << "\"\nseq_len = 96\nval_fraction = 0.25\nmax_prompt_length = 32\nbatch_size = " << rows
       << "\n\n[optimizer]\nname = \"adamw\"\nlr = 1e-2\ngrad_clip = 0\n\n"
       << "[schedule]\nplugin = \"kto\"\nwarmup_steps = 0\nloss_type = \"" << loss
       << "\"\n\n[save]\nfinal = true\nhf = true\n\n"
       << "[[strategy]]\nplugin = \"lora\"\ntargets = [\"q\", \"v\"]\n"
       << extra;
    return test::write_file(dir, name + ".toml", os.str());
  };
  const std::string data = "[[strategy]]\nplugin = \"shard\"\nmode = \"data\"\n";
  // 3 steps of 4 rows stay within the 14 training rows' first epoch.
  run_ok("run -q " + kto_recipe("apo-single", 4, "apo_zero_unpaired", ""));
  run_ok("run -q --nproc 2 " + kto_recipe("apo-data", 2, "apo_zero_unpaired", data));
  EXPECT_LE(max_relative_difference(trained(dir, "apo-data"), trained(dir, "apo-single")), 1e-4);
  const auto a = metrics(dir, "apo-data"), b = metrics(dir, "apo-single");
  ASSERT_EQ(a.size(), b.size());
  size_t compared = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (const auto& [key, value] : b[i].items())
      if (key == "loss" || key.rfind("kto.", 0) == 0) {
        ASSERT_TRUE(a[i].contains(key)) << key;
        EXPECT_NEAR(a[i][key].get<double>(), value.get<double>(),
                    1e-4 * std::max(1.0, std::abs(value.get<double>())))
            << key << " at record " << i;
        ++compared;
      }
  EXPECT_GE(compared, 3u * 2);
  run_ok("run -q --nproc 2 " + kto_recipe("kto-data", 2, "kto", data));
  const auto k = metrics(dir, "kto-data");
  ASSERT_EQ(k.size(), 3u);
  for (const auto& record : k) {
    EXPECT_TRUE(std::isfinite(record["loss"].get<double>()));
    EXPECT_GE(record["kto.kl"].get<double>(), 0.0);
  }
}

// ZeRO's AdamW on parts = AdamW on whole tensors (both on the all-reduced
// gradients), with half the optimizer state (and, stage 2, fewer gradients)
// per rank; the gradient norm covers the parts ranks hold.
TEST_F(Distributed, ZeroPartitionsOptimizerStateAndGradients) {
  run_ok("run -q --nproc 2 " +
         recipe(dir, corpus, "data", 2, shard("mode = \"data\""), kAdamWNoClip));
  const auto base = metrics(dir, "data");
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(stage);
    const std::string name = "zero" + std::to_string(stage);
    run_ok("run -q --nproc 2 " + recipe(dir, corpus, name, 2,
                                        shard("mode = \"zero\"\nstage = " + std::to_string(stage)),
                                        kAdamWNoClip));
    EXPECT_EQ(max_relative_difference(trained(dir, name), trained(dir, "data")), 0.0);
    const auto m = metrics(dir, name);
    ASSERT_EQ(m.size(), base.size());
    for (size_t i = 0; i < m.size(); ++i)
      EXPECT_NEAR(m[i]["grad_norm"].get<double>() / base[i]["grad_norm"].get<double>(), 1.0, 1e-6);
    const double ratio =
        m.back()["peak_optimizer"].get<double>() / base.back()["peak_optimizer"].get<double>();
    EXPECT_GT(ratio, 0.45);
    EXPECT_LT(ratio, 0.56);
    if (stage >= 2) {
      EXPECT_LT(m.back()["peak_grads"].get<double>(), base.back()["peak_grads"].get<double>());
    }
    // Stage 3: half the weights of each block per rank, plus the stage in use
    // and the (whole) tied embedding.
    const double weights =
        m.back()["peak_weights"].get<double>() / base.back()["peak_weights"].get<double>();
    if (stage == 3)
      EXPECT_LT(weights, 0.85);
    else
      EXPECT_EQ(weights, 1.0);
  }
}

// A run saved by 2 ranks (ZeRO-2: optimizer state in two files; ZeRO-3:
// parameters too) continues on 1 rank with the same global batch as if
// uninterrupted, and one saved by 1 process continues on 2 ranks.
TEST_F(Distributed, SavedByTwoRanksResumesOnOne) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE(stage);
    const std::string zero = shard("mode = \"zero\"\nstage = " + std::to_string(stage));
    const std::string whole = "whole" + std::to_string(stage),
                      split = "split" + std::to_string(stage);
    run_ok("run -q --nproc 2 " + recipe(dir, corpus, whole, 2, zero, kAdamW));
    run_ok("run -q --nproc 2 --stop-after 2 " + recipe(dir, corpus, split, 2, zero, kAdamW));
    ASSERT_TRUE(fs::exists(final_checkpoint(dir, split, 2) / "state.rank-1.safetensors"));
    // The same run folder, one process with both ranks' rows.
    run_ok("run -q --resume " + recipe(dir, corpus, split, 4, zero, kAdamW));
    // (AdamW normalizes each element by its own gradient history, so the
    // ~1e-7 differences between a 4-row mean and the mean of two 2-row means
    // grow to ~1e-5 in the weights whose gradients are near zero.)
    EXPECT_LE(max_relative_difference(trained(dir, split), trained(dir, whole)), 1e-4);
    const auto a = metrics(dir, split), b = metrics(dir, whole);
    ASSERT_EQ(a.size(), 4u);
    for (size_t i = 2; i < 4; ++i)
      EXPECT_NEAR(a[i]["loss"].get<double>(), b[i]["loss"].get<double>(), 1e-5);
    // And the other way: saved by 1 process, resumed by 2 ranks.
    const std::string grown = "grown" + std::to_string(stage);
    run_ok("run -q --stop-after 2 " + recipe(dir, corpus, grown, 4, zero, kAdamW));
    run_ok("run -q --nproc 2 --resume " + recipe(dir, corpus, grown, 2, zero, kAdamW));
    EXPECT_LE(max_relative_difference(trained(dir, grown), trained(dir, whole)), 1e-4);
    const auto g = metrics(dir, grown);
    ASSERT_EQ(g.size(), 4u);
    for (size_t i = 2; i < 4; ++i)
      EXPECT_NEAR(g[i]["loss"].get<double>(), b[i]["loss"].get<double>(), 1e-5);
  }
}

// Stopped and resumed on the same 2 ranks, sharded state (ZeRO-3: each rank
// saved its own part of the parameters and optimizer state) gives the
// uninterrupted run's losses and weights bit for bit.
TEST_F(Distributed, ShardedStateResumesExactlyOnTheSameRanks) {
  const std::string zero = shard("mode = \"zero\"\nstage = 3");
  run_ok("run -q --nproc 2 " + recipe(dir, corpus, "whole", 2, zero, kAdamW));
  run_ok("run -q --nproc 2 --stop-after 2 " + recipe(dir, corpus, "split", 2, zero, kAdamW));
  ASSERT_TRUE(fs::exists(final_checkpoint(dir, "split", 2) / "state.rank-1.safetensors"));
  run_ok("run -q --nproc 2 --resume " + recipe(dir, corpus, "split", 2, zero, kAdamW));
  EXPECT_EQ(max_relative_difference(trained(dir, "split"), trained(dir, "whole")), 0.0);
  const auto a = metrics(dir, "split"), b = metrics(dir, "whole");
  ASSERT_EQ(a.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i;
}

// The torchrun launch: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from it.
TEST_F(Distributed, RunsUnderTorchrun) {
  const fs::path torchrun = fs::path(TIGHTFIT_SOURCE_DIR) / ".venv/bin/torchrun";
  if (!fs::exists(torchrun)) GTEST_SKIP() << "no torchrun in .venv (run scripts/setup)";
  run_ok("run -q --nproc 2 " + recipe(dir, corpus, "launcher", 2, shard("mode = \"data\""), kSgd));
  const std::string r = recipe(dir, corpus, "torchrun", 2, shard("mode = \"data\""), kSgd);
  const std::string cmd = torchrun.string() +
                          " --no-python --standalone --nproc-per-node 2 " TIGHTFIT_BINARY
                          " run -q " +
                          r + " > " + (dir.path() / "torchrun.log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_EQ(
      max_relative_difference(final_checkpoint(dir, "torchrun"), final_checkpoint(dir, "launcher")),
      0.0);
}

// The rank of a run started by --nproc whose environment says RANK=`rank`.
pid_t find_rank(const std::string& recipe_path, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream cmd(e.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (cmdline.find(recipe_path) == std::string::npos) continue;
    std::ifstream env(e.path() / "environ");
    std::string environ((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    if (environ.find(std::string("RANK=") + std::to_string(rank) + '\0') == 0 ||
        environ.find(std::string("\0RANK=", 6) + std::to_string(rank) + '\0') != std::string::npos)
      return static_cast<pid_t>(std::stol(pid));
  }
  return -1;
}

struct Launched {
  pid_t pid;
  std::string log;
};

// Starts `argv` with its output in dir/`log_name`.
Launched start(const TempDir& dir, const std::string& log_name, std::vector<std::string> argv) {
  const std::string log = (dir.path() / log_name).string();
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return {pid, log};
}

Launched launch(const TempDir& dir, const std::string& recipe_path) {
  return start(dir, "launch.log", {TIGHTFIT_BINARY, "run", "-q", "--nproc", "2", recipe_path});
}

// Waits for the launcher; returns its exit status and the seconds it took.
std::pair<int, double> wait_for(pid_t pid, double limit_s) {
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > limit_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return {-1, s};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

pid_t wait_for_rank(const std::string& recipe_path, int rank) {
  for (int i = 0; i < 600; ++i) {
    if (pid_t p = find_rank(recipe_path, rank); p > 0) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A rank killed mid-run: the launcher names it and the other stops at once.
TEST_F(Distributed, KilledRankStopsTheOthers) {
  const std::string r =
      recipe(dir, corpus, "killed", 2, shard("mode = \"data\""), kSgd, 100000, 30);
  const Launched l = launch(dir, r);
  const pid_t victim = wait_for_rank(r, 1);
  ASSERT_GT(victim, 0);
  std::this_thread::sleep_for(std::chrono::seconds(3));  // training
  ::kill(victim, SIGKILL);
  const auto [rc, seconds] = wait_for(l.pid, 60);
  const std::string log = read_text(l.log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(rc, -1) << "the launcher did not stop: " << log;
  EXPECT_LT(seconds, 30) << log;  // well inside dist_timeout: a dead peer is noticed at once
  EXPECT_NE(log.find("rank 1 of 2 was killed by signal 9"), std::string::npos) << log;
  EXPECT_EQ(find_rank(r, 0), -1) << "rank 0 still running";
}

// Ctrl-C reaching one rank only (a signal sent to its process): every rank
// stops at the same step boundary, they save one checkpoint together, and
// the launcher ends with 130 once all have, killing none.
TEST_F(Distributed, CtrlCOnOneRankStopsEveryRankAtTheSameStepAndSaves) {
  const std::string r = recipe(dir, corpus, "ctrlc", 2, shard("mode = \"data\""), kSgd, 100000);
  const Launched l = launch(dir, r);
  const pid_t rank1 = wait_for_rank(r, 1);
  ASSERT_GT(rank1, 0);
  std::this_thread::sleep_for(std::chrono::seconds(3));  // training
  ASSERT_EQ(::kill(rank1, SIGINT), 0);
  const auto [rc, seconds] = wait_for(l.pid, 120);
  const std::string log = read_text(l.log);
  EXPECT_EQ(rc, 130) << log;
  EXPECT_EQ(log.find("did not stop"), std::string::npos) << log;
  EXPECT_EQ(log.find("the other ranks stop too"), std::string::npos) << log;
  const auto at = log.find("stopped by Ctrl-C after step ");
  ASSERT_NE(at, std::string::npos) << log;
  const int64_t step = std::stoll(log.substr(at + 29));
  EXPECT_TRUE(fs::exists(final_checkpoint(dir, "ctrlc", step))) << log;
  EXPECT_FALSE(fs::exists(final_checkpoint(dir, "ctrlc", step + 1))) << log;
}

// A rank that hangs (stopped): the others give up after dist_timeout with a
// message naming themselves and the timeout; the launcher ends the hung one.
TEST_F(Distributed, HungRankTimesOut) {
  const std::string r = recipe(dir, corpus, "hung", 2, shard("mode = \"data\""), kSgd, 100000, 4);
  const Launched l = launch(dir, r);
  const pid_t victim = wait_for_rank(r, 1);
  ASSERT_GT(victim, 0);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ::kill(victim, SIGSTOP);
  const auto [rc, seconds] = wait_for(l.pid, 60);
  const std::string log = read_text(l.log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(rc, -1) << "the launcher did not stop: " << log;
  EXPECT_LT(seconds, 4 + 9 + 15) << log;  // timeout, the launcher's grace, slack for a loaded CI
  EXPECT_NE(log.find("rank 0 of 2: "), std::string::npos) << log;
  EXPECT_NE(log.find("dist_timeout"), std::string::npos) << log;
  EXPECT_EQ(find_rank(r, 1), -1) << "the hung rank was left behind";
}

std::map<std::string, at::Tensor> train_in_process(const std::string& text, int steps) {
  auto s = test::make_session(text);
  for (int i = 0; i < steps; ++i) {
    s->update().zero_grad();
    auto b = s->data().next_batch();
    s->executor().run_pass(b.tokens, b.targets, true, 1.0);
    EXPECT_EQ(s->update().optimizer_step(), TF_OK);
  }
  std::map<std::string, at::Tensor> out;
  for (Param& p : s->store().all())  // (ZeRO-3's parameters are whole only when brought in)
    s->executor().with_resident(p, [&] { out[p.name] = p.value.detach().cpu().clone(); });
  return out;
}

// Pipeline placement on ["cpu", "cpu"] computes exactly what the unsplit
// model does; a single process with ZeRO (collectives are identities; stage
// 3 still frees and gathers each stage's weights, around recompute too) the
// same up to the clipping norm, whose held parts ZeRO sums over its flat
// shards: a few float ulps in the clip factor, which Adam turns into up to
// 1.4e-5 of a bias after 3 steps (an AMX machine, 2026-11-25; ZeRO without
// clipping is checked bit for bit in ZeroComposesWithPrecisionAndOffload).
constexpr double kClipNormOrder = 1e-4;
TEST_F(Distributed, LayersOnTwoDevicesAndOneRankZeroEqualThePlainRun) {
  const std::string out = (dir.path() / "runs").string();
  const auto plain = train_in_process(test::tiny_recipe(corpus, out), 3);
  const std::vector<std::pair<std::string, double>> stacks = {
      {"[[strategy]]\nplugin = \"shard\"\nmode = \"layers\"\ndevices = [\"cpu\", \"cpu\"]\n"
       "split = [1, 1]\n",
       0.0},
      {"[[strategy]]\nplugin = \"shard\"\nmode = \"layers\"\nsplit = [1, 1]\n"
       "[[strategy]]\nplugin = \"checkpoint\"\n",
       0.0},
      {"[[strategy]]\nplugin = \"shard\"\nmode = \"zero\"\nstage = 2\n", kClipNormOrder},
      {"[[strategy]]\nplugin = \"shard\"\nmode = \"zero\"\nstage = 3\n", kClipNormOrder},
      {"[[strategy]]\nplugin = \"shard\"\nmode = \"zero\"\nstage = 3\n"
       "[[strategy]]\nplugin = \"checkpoint\"\n",
       kClipNormOrder}};
  for (const auto& [stack, tolerance] : stacks) {
    SCOPED_TRACE(stack);
    const auto got = train_in_process(test::tiny_recipe(corpus, out, "", stack), 3);
    for (const auto& [name, w] : plain)
      EXPECT_LE((got.at(name) - w).norm().item<double>() / (w.norm().item<double>() + 1e-12),
                tolerance)
          << name;
  }
}

// ZeRO composes with precision (autocast) and with activation offload,
// exactly: without clipping, every weight after 3 steps is bit-identical to
// the run without ZeRO, on any CPU. With clipping the one difference is the
// order the clip norm is summed in (ZeRO's held parts are summed apart and
// added), a few ulps in the clip factor. In fp32 that stays under 1e-4; under
// bf16 autocast it can flip the bf16 rounding of a weight, and Adam turns a
// near-zero gradient's change into a full step: 1.1% on a bias after 3 steps
// on an AMD EPYC without AVX-512 (ATEN_CPU_CAPABILITY=avx2 reproduces it) —
// rounding amplified, not a different computation, so the exact check is
// the one without clipping.
TEST_F(Distributed, ZeroComposesWithPrecisionAndOffload) {
  const std::string out = (dir.path() / "runs").string();
  const std::string zero3 = "[[strategy]]\nplugin = \"shard\"\nmode = \"zero\"\nstage = 3\n";
  const std::string autocast = "[[strategy]]\nplugin = \"precision\"\n";
  const std::string offload =
      "[[strategy]]\nplugin = \"checkpoint\"\n[[strategy]]\nplugin = \"offload\"\nparams = "
      "\"none\"\nactivations = \"disk\"\n";
  auto without_clipping = [](std::string text) {
    return text.replace(text.find("[optimizer]\n"), 12, "[optimizer]\ngrad_clip = 0.0\n");
  };
  for (const auto& [reference, stack] : std::vector<std::pair<std::string, std::string>>{
           {autocast, zero3 + autocast}, {"", zero3 + offload}}) {
    SCOPED_TRACE(stack);
    const auto want =
        train_in_process(without_clipping(test::tiny_recipe(corpus, out, "", reference)), 3);
    const auto got =
        train_in_process(without_clipping(test::tiny_recipe(corpus, out, "", stack)), 3);
    for (const auto& [name, w] : want)
      EXPECT_TRUE(at::equal(got.at(name), w))
          << name << ": max difference " << (got.at(name) - w).abs().max().item<double>();
  }
  // fp32 with clipping: the norm's order only.
  const auto want = train_in_process(test::tiny_recipe(corpus, out), 3);
  const auto got = train_in_process(test::tiny_recipe(corpus, out, "", zero3 + offload), 3);
  for (const auto& [name, w] : want)
    EXPECT_LE((got.at(name) - w).norm().item<double>() / (w.norm().item<double>() + 1e-12),
              kClipNormOrder)
        << name;
}

TEST_F(Distributed, LayersSplitMustCoverTheBlocks) {
  const std::string out = (dir.path() / "runs").string();
  for (const char* bad : {"mode = \"layers\"\nsplit = [1, 3]\n", "mode = \"layers\"\n",
                          "mode = \"layers\"\ndevices = [\"cpu\"]\nsplit = [1, 1]\n",
                          "mode = \"layers\"\ndevices = [\"cuda:7\", \"cpu\"]\n",
                          "mode = \"data\"\nsplit = [1, 1]\n", "mode = \"data\"\nstage = 2\n"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(test::make_session(test::tiny_recipe(
                     corpus, out, "", std::string("[[strategy]]\nplugin = \"shard\"\n") + bad)),
                 RecipeError);
  }
}

// Killed mid-run under torchrun --max-restarts: the restarted group resumes
// from the last complete checkpoint and finishes the run.
TEST_F(Distributed, TorchrunRestartResumesFromTheLastCheckpoint) {
  const fs::path torchrun = fs::path(TIGHTFIT_SOURCE_DIR) / ".venv/bin/torchrun";
  if (!fs::exists(torchrun)) GTEST_SKIP() << "no torchrun in .venv (run scripts/setup)";
  std::string r = recipe(dir, corpus, "restart", 4, shard("mode = \"data\""), kSgd, 150, 30);
  {  // slower steps (a wider model), a checkpoint every 5
    std::string text = read_text(r);
    text.replace(text.find("n_embd = 32"), 11, "n_embd = 256");
    text.replace(text.find("[save]\n"), 7, "[save]\nevery = 5\n");
    std::ofstream(r) << text;
  }
  const auto [pid, log] =
      start(dir, "restart.log",
            {torchrun.string(), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
             "--no-python", TIGHTFIT_BINARY, "run", "-q", "--resume", r});
  const fs::path metrics_file = dir.path() / "runs" / "restart" / "metrics.jsonl";
  auto lines = [&] {
    std::ifstream in(metrics_file);
    return std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n');
  };
  pid_t victim = -1;
  for (int i = 0; i < 1200 && victim < 0; ++i) {
    if (lines() >= 20) victim = find_rank(r, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(victim, 0) << read_text(log);
  ::kill(victim, SIGKILL);
  const auto [rc, seconds] = wait_for(pid, 240);
  const std::string out = read_text(log);
  ASSERT_EQ(rc, 0) << out;
  const auto m = metrics(dir, "restart");
  ASSERT_FALSE(m.empty());
  EXPECT_EQ(m.back()["step"].get<int64_t>(), 150) << out;
  // The restart picked up a checkpoint (not step 0): no step is missing.
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  std::set<int64_t> steps;
  for (const auto& rec : m) steps.insert(rec["step"].get<int64_t>());
  EXPECT_EQ(steps.size(), 150u);
}

// Bad launch environments are named.
TEST_F(Distributed, BadEnvironmentIsAClearError) {
  std::string out;
  const std::string r = recipe(dir, corpus, "env", 2, "", kSgd);
  const int rc = std::system(("WORLD_SIZE=2 RANK=5 " TIGHTFIT_BINARY " run -q " + r + " > " +
                              (dir.path() / "env.log").string() + " 2>&1")
                                 .c_str());
  EXPECT_NE(rc, 0);
  EXPECT_NE(read_text((dir.path() / "env.log").string()).find("RANK=\"5\""), std::string::npos);
  EXPECT_EQ(test::run_tightfit("run -q --nproc 0 " + r, &out), 2) << out;
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// A mixture of experts on two ranks: experts frozen (LoRA on q and v) trains;
// trained experts, whose gradients exist only where tokens were routed, are
// refused by name before any collective could be left unmatched.
TEST(DistributedExperts, FrozenExpertsTrainAndTrainedOnesAreRefusedByName) {
  TempDir dir;
  const std::string corpus = test::write_corpus(dir);
  auto moe_recipe = [&](const std::string& name, const std::string& targets) {
    const std::string path = recipe(dir, corpus, name, 2, shard("mode = \"data\""), kAdamW, 2);
    std::string text = read_text(path);
    const auto begin = text.find("[model]"), end = text.find("[data]");
    text.replace(begin, end - begin, "[model]\n" + test::fixture_model("mixtral-tiny") + "\n");
    text += "[[strategy]]\nplugin = \"lora\"\ntargets = " + targets + "\n";
    std::ofstream(path) << text;
    return path;
  };
  run_ok("run -q --nproc 2 " + moe_recipe("frozen", "[\"q\", \"v\"]"));
  std::string out;
  EXPECT_NE(
      test::run_tightfit("run -q --nproc 2 " + moe_recipe("trained", "[\"q\", \"gate\"]"), &out),
      0);
  EXPECT_NE(out.find("belongs to a routed expert"), std::string::npos) << out;
  EXPECT_NE(out.find("block_sparse_moe.experts."), std::string::npos) << out;
  EXPECT_NE(out.find("train on one process"), std::string::npos) << out;
}

}  // namespace
}  // namespace tightfit
