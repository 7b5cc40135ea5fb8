// Careless and hostile input (issue 21): numbers that are not numbers, sizes
// past int64, devices tightfit does not train on and sampling edge values
// are refused by name with exit 2 — never a LibTorch exception, never a
// silently switched-off budget; JSON nested hundreds of thousands deep and
// FIFOs where files belong are refused naming the file — never a stack
// overflow, never a hang.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <thread>

#include "bpe_tokenizer.hpp"
#include "chat_data.hpp"
#include "checkpoint_manifest.hpp"
#include "data.hpp"
#include "input_files.hpp"
#include "memory_accounting.hpp"
#include "memory_plan.hpp"
#include "metrics.hpp"
#include "recipe.hpp"
#include "safetensors.hpp"
#include "test_support.hpp"
#include "tightfit/hf_config.hpp"

namespace tightfit {
namespace {

using test::recipe_error;

class HostileNumbers : public ::testing::Test {
 protected:
  test::TempDir dir;
  std::string corpus = test::write_corpus(dir);
  // The tiny recipe with `key = value` added to [table] (first line of it).
  std::string with(const std::string& table, const std::string& line) const {
    std::string text = test::tiny_recipe(corpus, dir.str());
    const auto at = text.find("[" + table + "]\n");
    EXPECT_NE(at, std::string::npos) << table;
    // A key the recipe sets already is replaced (TOML allows no second).
    const std::string key = line.substr(0, line.find(' '));
    if (const auto old = text.find("\n" + key + " = ", at); old != std::string::npos)
      text.erase(old + 1, text.find('\n', old + 1) - old);
    text.insert(at + table.size() + 3, line + "\n");
    return text;
  }
};

// TOML spells NaN and infinity; every float key refuses them with the place,
// those with a range and those without.
TEST_F(HostileNumbers, NanAndInfinityAreRefusedWithFileLineColumn) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"optimizer", "lr = nan"},         {"optimizer", "lr = +inf"},
      {"optimizer", "grad_clip = -inf"}, {"optimizer", "weight_decay = nan"},
      {"data", "val_fraction = nan"},    {"model", "dropout = nan"},
      {"run", "dist_timeout = inf"}};
  for (const auto& [table, line] : cases) {
    const std::string msg = recipe_error(with(table, line));
    const std::string key = line.substr(0, line.find(' '));
    EXPECT_TRUE(
        std::regex_search(msg, std::regex("^my\\.toml:\\d+:\\d+: \\[" + table + "\\].*\\." + key +
                                          " = [-+]?(nan|inf) is not a finite number")))
        << line << ": " << msg;
  }
}

// A budget that cannot be a number of bytes is an error, never "no budget".
TEST_F(HostileNumbers, ByteSizesPastInt64OrNotNumbersAreRefused) {
  for (const std::string& v :
       {std::string("-1"), std::string("\"-5GiB\""), std::string("\"nanGiB\""),
        std::string("\"infGiB\""), std::string("\"1e30GiB\""),
        std::string("\"9223372036854775808\""), std::string("\"10000000TB\"")}) {
    const std::string msg = recipe_error(with("run", "memory_budget = " + v));
    EXPECT_TRUE(std::regex_search(msg, std::regex("^my\\.toml:\\d+:\\d+: .*memory_budget")))
        << v << ": " << msg;
  }
  EXPECT_THROW(parse_byte_size("nan"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("-inf"), std::invalid_argument);
  EXPECT_THROW(parse_byte_size("8192PB"), std::invalid_argument);
  EXPECT_EQ(parse_byte_size("8000000TB"), 8'000'000'000'000'000'000);  // still fits int64
  // The command line's budgets go through the same parser.
  std::string out;
  const std::string recipe = test::write_file(dir, "r.toml", test::tiny_recipe(corpus, dir.str()));
  for (const char* b : {"nan", "-1GiB", "1e300", "inf"}) {
    EXPECT_EQ(test::run_tightfit(std::string("plan ") + recipe + " --budget " + b, &out), 2)
        << b << ": " << out;
    EXPECT_NE(out.find("byte size"), std::string::npos) << out;
  }
}

TEST_F(HostileNumbers, DevicesTightfitDoesNotTrainOnAreRefused) {
  for (const char* d : {"meta", "mps", "cpu:3", "cuda:-1", "xla", "cpu:0:1", "cuda:99999999999"}) {
    const std::string msg = recipe_error(with("run", std::string("device = \"") + d + "\""));
    EXPECT_NE(msg.find("[run].device"), std::string::npos) << d << ": " << msg;
    EXPECT_NE(msg.find("use cpu, cuda or cuda:N"), std::string::npos) << d << ": " << msg;
  }
  EXPECT_NO_THROW(test::make_session(with("run", "device = \"cpu:0\"")));
}

// Sampling values at and past their edges: greedy where that is what they
// mean, else exit 2 naming the option — never a LibTorch error.
TEST_F(HostileNumbers, SamplingEdgeValues) {
  const std::string recipe = test::write_file(dir, "r.toml", test::tiny_recipe(corpus, dir.str()));
  std::string out;
  for (const char* bad :
       {"--top-p nan", "--top-p -0.1", "--top-p 1.5", "--temperature -1", "--temperature nan",
        "--temperature inf", "--top-k -5", "-n -1", "--min-p -0.5", "--min-p 2", "--min-p nan",
        "--repetition-penalty 0", "--repetition-penalty -1", "--repetition-penalty inf"}) {
    EXPECT_EQ(test::run_tightfit("generate " + recipe + " -p Hi " + bad, &out), 2)
        << bad << ": " << out;
    EXPECT_NE(out.find("tightfit generate: --"), std::string::npos) << bad << ": " << out;
  }
  // top-p 0 keeps the likeliest token: greedy, as transformers keeps one.
  auto s = test::make_session(test::tiny_recipe(corpus, dir.str()));
  const std::string greedy = s->generate("The ", 24, 1, 0.0, 7);
  EXPECT_EQ(s->generate("The ", 24, 40, 0.8, 7, /*top_p=*/0.0), greedy);
  EXPECT_EQ(s->generate("The ", 24, 0, 1.0, 9, /*top_p=*/0.0), greedy);
  EXPECT_THROW(s->generate("The ", 4, 40, std::nan(""), 7), std::invalid_argument);
  // min-p 1 keeps only the likeliest token (and any tied with it): greedy.
  SamplingOptions o;
  o.n_tokens = 24;
  o.top_k = 0;
  o.seed = 11;
  o.min_p = 1.0;
  EXPECT_EQ(s->generate("The ", o), greedy);
  o.min_p = std::nan("");
  EXPECT_THROW(s->generate("The ", o), std::invalid_argument);
}

// JSON nested 300,000 levels deep: a recursive copy, dump or destruction
// of it overflows the stack; every reader refuses it at 64 levels (8 for a
// safetensors header) and names the file.
std::string deep(size_t n) {
  return std::string(n, '[') + std::string(n, ']');
}
constexpr size_t kDeep = 300'000;

template <class Error>
void expect_refused(const std::function<void()>& read, const std::string& file,
                    const std::string& what = "nested deeper") {
  try {
    read();
    ADD_FAILURE() << file << " was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(DeepJson, EveryReaderRefusesItNamingTheFile) {
  test::TempDir d;
  const std::string tok = test::write_file(
      d, "tokenizer.json",
      R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "x": )" + deep(kDeep) + "}");
  expect_refused<std::invalid_argument>([&] { BpeTokenizer::load(tok); }, tok);

  std::filesystem::create_directories(d.str() + "/model");
  const std::string cfg = test::write_file(d, "model/config.json",
                                           R"({"model_type": "llama", "x": )" + deep(kDeep) + "}");
  expect_refused<std::invalid_argument>([&] { tf_sdk::read_hf_config(d.str() + "/model"); }, cfg,
                                        "nests deeper");
  const std::string adapter = test::write_file(d, "model/adapter_config.json", deep(kDeep));
  expect_refused<std::invalid_argument>(
      [&] { tf_sdk::read_hf_json(adapter, 1 << 24, "PEFT adapter config"); }, adapter,
      "nests deeper");
  const std::string tcfg = test::write_file(d, "model/tokenizer_config.json",
                                            R"({"chat_template": )" + deep(kDeep) + "}");
  expect_refused<std::invalid_argument>([&] { TokenizerConfig::load(d.str() + "/model"); }, tcfg);

  expect_refused<std::runtime_error>(
      [&] { parse_checkpoint_manifest(deep(kDeep), "manifest.json"); }, "manifest.json", "damaged");
  expect_refused<std::runtime_error>([&] { parse_trainer_record(deep(kDeep), "trainer.json"); },
                                     "trainer.json");
  // Found by fuzz_checkpoint: a number past double's range is a JSON error too.
  expect_refused<std::runtime_error>(
      [&] { parse_trainer_record(R"({"format": 1, "step": 1e400})", "trainer.json"); },
      "trainer.json", "not valid JSON");

  // A safetensors header: 8-byte length, then the JSON.
  const std::string header = R"({"t": )" + deep(kDeep) + "}";
  std::string st(8, '\0');
  for (int i = 0; i < 8; ++i)
    st[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  const std::string weights = test::write_file(d, "model.safetensors", st + header);
  expect_refused<SafetensorsError>([&] { read_safetensors(weights); }, weights);

  const std::string rows = test::write_file(d, "rows.jsonl",
                                            R"({"text": "ok"})"
                                            "\n" +
                                                deep(kDeep) + "\n");
  expect_refused<std::runtime_error>([&] { load_corpus_text(rows); }, rows + ":2");
  const std::string chat =
      test::write_file(d, "chat.jsonl", R"({"prompt": "a", "completion": )" + deep(kDeep) + "}\n");
  const ByteTokenizer bytes;
  const ChatFormatter formatter(bytes, TokenizerConfig{}, TrainOn::kCompletion);
  expect_refused<std::invalid_argument>([&] { load_examples(chat, formatter); }, chat + ":1");

  // From the command line: a model folder's config.json, exit 2.
  std::string out;
  EXPECT_EQ(test::run_tightfit("generate " + d.str() + "/model -p hi -n 1", &out), 2) << out;
  EXPECT_NE(out.find(cfg), std::string::npos) << out;
}

// TOML nested by dotted keys: TOML++ bounds arrays and inline tables, not
// tables made by "[a.a.a...]" or "a.a.a... = 1", whose destruction recursed
// past the stack (a segfault at 100,000 keys). Refused before parsing, naming
// the place; strings holding dots and brackets are not nesting.
TEST(DeepToml, DottedKeysHeadersAndInlineTablesAreRefusedNamingThePlace) {
  auto dotted = [](size_t n) {
    std::string s = "a";
    for (size_t i = 1; i < n; ++i) s += ".a";
    return s;
  };
  auto repeat = [](const std::string& unit, size_t n) {
    std::string s;
    for (size_t i = 0; i < n; ++i) s += unit;
    return s;
  };
  const std::vector<std::pair<std::string, std::string>> hostile = {
      {"header", "[" + dotted(300'000) + "]\n"},
      {"array-of-tables header", "x = 1\n\n[[" + dotted(300'000) + "]]\n"},
      {"dotted key", "[run]\n" + dotted(300'000) + " = 1\n"},
      {"inline table", "[run]\nx = {" + dotted(300'000) + " = 1}\n"},
      {"inline tables",
       "[run]\nx = " + repeat("{a = ", 150) + dotted(100) + " = 1" + std::string(150, '}') + "\n"},
  };
  for (const auto& [what, text] : hostile) {
    try {
      (void)Recipe::parse(text, "deep.toml");
      ADD_FAILURE() << what << " parsed";
    } catch (const RecipeError& e) {
      EXPECT_NE(std::string(e.what()).find("deep.toml:"), std::string::npos) << what << e.what();
      EXPECT_NE(std::string(e.what()).find("nest deeper than"), std::string::npos) << e.what();
    }
  }
  // Dots and brackets inside strings and comments, and a real recipe, are fine.
  const std::string quoted = "[run]\nname = \"" + dotted(10'000) + "[[{{\"\nnote = '''\n" +
                             dotted(10'000) + "\n'''\n# " + dotted(10'000) + "\n[\"" +
                             dotted(10'000) + "\".b]\nc = [[1.5, 2.5], {d.e = 1}]\n";
  EXPECT_NO_THROW((void)Recipe::parse(quoted, "ok.toml"));
  std::ifstream in(std::string(TIGHTFIT_SOURCE_DIR) + "/configs/default.toml");
  const std::string recipe((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NO_THROW((void)Recipe::parse(recipe, "default.toml"));
  // From the command line: --set with a dotted key or an inline table.
  Recipe r = Recipe::parse("[run]\nsteps = 1\n", "r.toml");
  EXPECT_THROW(r.apply_override(dotted(100'000) + "=1"), RecipeError);
  EXPECT_THROW(r.apply_override("run.x={" + dotted(100'000) + "=1}"), RecipeError);
  test::TempDir d;
  const std::string path = test::write_file(d, "deep.toml", "[" + dotted(300'000) + "]\n");
  std::string out;
  EXPECT_EQ(test::run_tightfit("plan " + path, &out), 2) << out;
  EXPECT_NE(out.find(path + ":1:"), std::string::npos) << out.substr(0, 400);
}

// Opens every FIFO under `dir` for writing after `after`, so that a reader
// stuck on one gets end-of-file; says whether it had to.
class FifoWatchdog {
 public:
  FifoWatchdog(std::vector<std::string> fifos, std::chrono::seconds after)
      : thread_([this, fifos, after] {
          const auto until = std::chrono::steady_clock::now() + after;
          while (!done_ && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          while (!done_) {
            for (const auto& f : fifos) {
              const int fd = ::open(f.c_str(), O_WRONLY | O_NONBLOCK);
              if (fd >= 0) {
                unblocked_ = true;
                ::close(fd);
              }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        }) {}
  ~FifoWatchdog() {
    done_ = true;
    thread_.join();
  }
  bool unblocked() const { return unblocked_; }

 private:
  std::atomic<bool> done_{false}, unblocked_{false};
  std::thread thread_;
};

// A FIFO (or a folder) where a file belongs is refused at once, naming it.
TEST(NotARegularFile, FifosAndFoldersAreRefusedWithoutWaiting) {
  test::TempDir d;
  std::filesystem::create_directories(d.str() + "/model");
  std::vector<std::string> fifos;
  auto fifo = [&](const std::string& name) {
    const std::string p = d.str() + "/" + name;
    EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0) << p;
    fifos.push_back(p);
    return p;
  };
  const std::string tok = fifo("tokenizer.json"), weights = fifo("model.safetensors"),
                    corpus = fifo("fifo-corpus.txt"), rows = fifo("rows.jsonl"),
                    cfg = fifo("model/config.json"), tcfg = fifo("model/tokenizer_config.json"),
                    adapter = fifo("model/adapter_config.json"), prompts = fifo("prompts.txt");
  FifoWatchdog watchdog(fifos, std::chrono::seconds(20));
  expect_refused<std::invalid_argument>([&] { BpeTokenizer::load(tok); }, tok, "regular file");
  expect_refused<SafetensorsError>([&] { read_safetensors(weights); }, weights, "regular file");
  expect_refused<std::runtime_error>([&] { load_corpus_text(corpus); }, corpus, "regular file");
  expect_refused<std::runtime_error>([&] { load_corpus_text(rows); }, rows, "regular file");
  expect_refused<std::invalid_argument>([&] { tf_sdk::read_hf_config(d.str() + "/model"); }, cfg,
                                        "regular file");
  expect_refused<std::invalid_argument>([&] { TokenizerConfig::load(d.str() + "/model"); }, tcfg,
                                        "regular file");
  expect_refused<std::invalid_argument>(
      [&] { tf_sdk::read_hf_json(adapter, 1 << 24, "PEFT adapter config"); }, adapter,
      "regular file");
  expect_refused<SafetensorsError>([&] { read_safetensors(d.str() + "/model"); },
                                   d.str() + "/model", "regular file");
  std::string out;
  const std::string recipe =
      test::write_file(d, "r.toml", test::tiny_recipe(test::write_corpus(d), d.str()));
  ASSERT_EQ(test::run_tightfit("run " + recipe + " -q", &out), 0) << out;  // a checkpoint to load
  EXPECT_NE(test::run_tightfit("generate " + recipe + " --prompts " + prompts, &out), 0);
  EXPECT_NE(out.find("regular file"), std::string::npos) << out;
  EXPECT_FALSE(watchdog.unblocked()) << "a reader waited on a FIFO";
}

// A recipe that saves at its last step (4) into `save_dir` ("" = the run folder's).
std::string saving_recipe(const test::TempDir& d, const std::string& name,
                          const std::string& save_dir = "") {
  std::string r = test::tiny_recipe(test::write_corpus(d), d.str(), "",
                                    "[save]\nevery = 4\nkeep_last = 1\n" +
                                        (save_dir.empty() ? "" : "dir = \"" + save_dir + "\"\n"));
  r.replace(r.find("name = \"t\""), 10, "name = \"" + name + "\"");
  return r;
}

TEST(UsersFiles, RunNamesAndSaveFoldersStayInsideTheirBase) {
  test::TempDir d;
  for (const char* name : {"../escape", "/tmp/abs", "a/../../b", ""}) {
    try {
      test::make_session(saving_recipe(d, name));
      ADD_FAILURE() << "run name \"" << name << "\" was accepted";
    } catch (const RecipeError& e) {
      EXPECT_NE(std::string(e.what()).find("[run].name"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(test::make_session(saving_recipe(d, "ok", "../up")), RecipeError);
  EXPECT_NO_THROW(test::make_session(saving_recipe(d, "nested/ok", d.str() + "/abs-ckpt")));
}

// The sweep after a crash takes only what tightfit made; a symlink planted
// where tightfit writes is replaced, never written through; a step count of
// nine digits still saves and resumes.
TEST(UsersFiles, SavesTouchNothingOfTheUsers) {
  test::TempDir d;
  const std::string ckpt = d.str() + "/ckpt";
  std::filesystem::create_directories(ckpt + "/step-00000001.old");  // the user's, by its name
  test::write_file(d, "ckpt/step-00000001.old/notes.txt", "mine");
  std::filesystem::create_directories(ckpt + "/step-00000002.tmp-77");
  test::write_file(d, "ckpt/step-00000002.tmp-77/data.bin", "mine as well");
  test::write_file(d, "ckpt/notes.tmp-1", "mine too");
  // A crash's leftover, made by tightfit: it has the marker.
  std::filesystem::create_directories(ckpt + "/step-00000003.tmp-99");
  test::write_file(d, std::string("ckpt/step-00000003.tmp-99/") + kCheckpointMarker, "");
  // Symlinks where the manifest and its temporary file went, to a file of the user's.
  const std::string precious = test::write_file(d, "precious.txt", "do not touch");
  std::filesystem::create_symlink(precious, ckpt + "/manifest.json");
  std::filesystem::create_symlink(precious, ckpt + "/manifest.json.tmp");
  // The manifest is read through the link and refused as not tightfit's: nothing written.
  EXPECT_THROW(test::make_session(saving_recipe(d, "a", ckpt))->train(), std::runtime_error);
  std::filesystem::remove(ckpt + "/manifest.json");

  test::make_session(saving_recipe(d, "a", ckpt))->train();
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step-00000001.old/notes.txt"));
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step-00000002.tmp-77"));
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/notes.tmp-1"));
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/step-00000003.tmp-99"));
  std::ifstream in(precious);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "do not touch");
  EXPECT_FALSE(std::filesystem::is_symlink(ckpt + "/manifest.json"));
  EXPECT_EQ(read_checkpoint_manifest(ckpt + "/manifest.json"),
            std::vector<std::string>{"step-00000004"});

  // Another run given the same [save] dir: refused before it replaces or
  // rotates away the first run's checkpoint.
  try {
    test::make_session(saving_recipe(d, "b", ckpt))->train();
    ADD_FAILURE() << "a second run saved into the first run's folder";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("a [save] dir of its own"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step-00000004/model.safetensors"));

  EXPECT_EQ(checkpoint_step_name(123'456'789), "step-123456789");
  EXPECT_EQ(parse_checkpoint_manifest(R"({"checkpoints": ["step-99999999", "step-123456789"]})",
                                      "m.json"),
            (std::vector<std::string>{"step-99999999", "step-123456789"}));
  EXPECT_THROW(parse_checkpoint_manifest(R"({"checkpoints": ["step-1"]})", "m.json"),
               std::runtime_error);
}

// metrics.jsonl: a fresh run starts it (an earlier run's rows do not stay
// above its own), and a symlink planted there is refused, never written
// through.
TEST(UsersFiles, MetricsStartFreshAndNeverFollowALink) {
  test::TempDir d;
  const std::string corpus = test::write_corpus(d);
  std::filesystem::create_directories(d.str() + "/t");
  test::write_file(d, "t/metrics.jsonl", "{\"step\": 1, \"loss\": 9.9}\n");
  test::make_session(test::tiny_recipe(corpus, d.str()))->train();
  std::ifstream in(d.str() + "/t/metrics.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_NE(rows.front()["loss"].get<double>(), 9.9);

  const std::string precious = test::write_file(d, "precious.txt", "do not touch");
  test::TempDir e;
  std::filesystem::create_directories(e.str() + "/t");
  std::filesystem::create_symlink(precious, e.str() + "/t/metrics.jsonl");
  try {
    test::make_session(test::tiny_recipe(corpus, e.str()))->train();
    ADD_FAILURE() << "metrics were written through a symlink";
  } catch (const InputError& err) {  // exit 2 at the command line
    EXPECT_NE(std::string(err.what()).find("symbolic link"), std::string::npos) << err.what();
  }
  std::ifstream p(precious);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(p), {}), "do not touch");
}

// A run resumed from the checkpoint of step 3 keeps the rows of steps 1..3
// and drops what the crashed run wrote past it (the steps it runs again,
// a line cut short), so no step has two rows; a FIFO planted as the file is
// refused at once, never waited on.
TEST(UsersFiles, AResumedRunsMetricsContinueAfterItsCheckpointsStep) {
  test::TempDir d;
  std::string rows;
  for (int step = 1; step <= 5; ++step)
    rows += "{\"step\": " + std::to_string(step) + ", \"loss\": 9.0}\n";
  const std::string path = test::write_file(d, "metrics.jsonl", rows + "{\"step\": 6, \"lo");
  {
    MetricsWriter w(path, /*resumed_at_step=*/3);
    EXPECT_TRUE(w.write({{"step", 4}, {"loss", 1.0}}));
  }
  std::ifstream in(path);
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);)
    steps.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));

  const std::string fifo = d.str() + "/fifo.jsonl";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const int64_t at : {0, 3}) {
    try {
      MetricsWriter w(fifo, at);
      ADD_FAILURE() << "opened a FIFO as metrics.jsonl";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// A config.json with absurd or meaningless numbers is refused naming the
// key — sizes are bounded as recipe keys are, a zero rope factor, theta or
// norm epsilon never trains NaN, a float is never cast into an integer —
// and sizes that pass one by one but not together (tokens x vocabulary)
// are refused by the planner, never wrapped past int64 into a plan that "fits".
TEST(HostileConfig, AbsurdNumbersAreRefusedNamingTheKey) {
  test::TempDir d;
  const std::string corpus = test::write_corpus(d);
  auto error_for = [&](const std::string& plugin, const std::string& config_json) -> std::string {
    static int n = 0;
    const std::string folder = d.str() + "/m" + std::to_string(++n);
    std::filesystem::create_directories(folder);
    std::ofstream(folder + "/config.json") << config_json;
    std::string text = test::tiny_recipe(corpus, d.str());
    const auto model = text.find("[model]\n");
    const auto end = text.find("\n[", model + 1);
    text.replace(model, end - model,
                 "[model]\nplugin = \"" + plugin + "\"\nconfig = \"" + folder + "\"");
    SessionOptions dry;
    dry.dry_run = true;
    try {
      test::make_session(text, dry);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "(built)";
  };
  const std::string rwkv =
      R"({"model_type": "rwkv", "num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 256)";
  struct Case {
    std::string plugin, config, expect;
  };
  const std::vector<Case> cases = {
      {"rwkv", rwkv + R"(, "hidden_size": 1000000000000})", "\"hidden_size\""},
      {"rwkv", R"({"num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 1e30})",
       "\"vocab_size\" must be an integer"},
      {"rwkv", rwkv + R"(, "layer_norm_epsilon": 0})", "\"layer_norm_epsilon\""},
      {"rwkv", rwkv + R"(, "tie_word_embeddings": "yes"})", "\"tie_word_embeddings\""},
      {"rwkv", rwkv + R"(, "num_hidden_layers": 100000000})", "\"num_hidden_layers\""},
  };
  for (const Case& c : cases) {
    const std::string msg = error_for(c.plugin, c.config);
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.config << "\n" << msg;
    EXPECT_NE(msg.find("config.json"), std::string::npos) << c.config << "\n" << msg;
  }
}

// Declared counts bound the work: a mixture of experts with 100,000 experts
// in each of 32 layers (every count within its key's bound) is refused
// where the weights are declared, naming the count, before plan or create
// holds millions of entries; one layer of them (300,000 weights) is planned.
TEST(HostileConfig, ExpertsByTheHundredThousandAreBoundedWork) {
  test::TempDir d;
  const std::string corpus = test::write_corpus(d);
  auto recipe_for = [&](int layers) {
    const std::string folder = d.str() + "/moe" + std::to_string(layers);
    std::filesystem::create_directories(folder);
    std::ofstream(folder + "/config.json") << nlohmann::json({{"model_type", "mixtral"},
                                                              {"num_hidden_layers", layers},
                                                              {"hidden_size", 8},
                                                              {"intermediate_size", 8},
                                                              {"num_attention_heads", 2},
                                                              {"num_key_value_heads", 1},
                                                              {"num_local_experts", 100000},
                                                              {"num_experts_per_tok", 2},
                                                              {"vocab_size", 256},
                                                              {"max_position_embeddings", 64}})
                                                  .dump();
    std::string text = test::tiny_recipe(corpus, d.str());
    const auto model = text.find("[model]\n");
    const auto end = text.find("\n[", model + 1);
    text.replace(model, end - model, "[model]\nplugin = \"llama\"\nconfig = \"" + folder + "\"");
    return text;
  };
  SessionOptions dry;
  dry.dry_run = true;
  try {
    test::make_session(recipe_for(32), dry);
    ADD_FAILURE() << "3.2 million experts' weights were declared";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("the model declares more than 524288 weights"),
              std::string::npos)
        << e.what();
  }
  auto s = test::make_session(recipe_for(1), dry);
  EXPECT_GT(s->store().all().size(), 300000u);
  const MemoryPlan plan = plan_memory(s->parts());
  EXPECT_GT(plan.tracked_peak, int64_t{100000} * 3 * 8 * 8 * 4);  // the experts' fp32 weights
}

// An allocation that fails while the model is built names the parameter,
// its size and where its values come from, and is the out-of-memory exit
// (OutOfBudgetError: exit 3), not LibTorch's allocator text alone. The
// failure is made real with an address-space limit 4 GiB above what the
// process maps (so it fails whatever the machine's overcommit policy).
TEST(HostileConfig, AnAllocationThatFailsNamesTheParameterAndItsSize) {
  test::TempDir d;
  const std::string corpus = test::write_corpus(d);
  std::string text = test::tiny_recipe(corpus, d.str());
  text.replace(text.find("n_embd = 32"), 11, "n_embd = 4096\nvocab_size = 1000000");
  text.replace(text.find("n_head = 2"), 10, "n_head = 32");
  size_t mapped_kib = 0;
  {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("VmSize:", 0) == 0) mapped_kib = std::stoull(line.substr(7));
  }
  ASSERT_GT(mapped_kib, 0u);
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &before), 0);
  rlimit limited = before;
  limited.rlim_cur = (mapped_kib << 10) + (rlim_t{4} << 30);
  if (before.rlim_max != RLIM_INFINITY && limited.rlim_cur > before.rlim_max)
    GTEST_SKIP() << "the address-space limit is already below what the test needs";
  std::string message;
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &limited), 0);
  try {
    test::make_session(text);
    message = "(built)";
  } catch (const OutOfBudgetError& e) {
    message = e.what();
  } catch (const std::exception& e) {
    message = std::string("not the out-of-memory exit: ") + e.what();
  }
  ::setrlimit(RLIMIT_AS, &before);
  EXPECT_NE(message.find("while allocating parameter transformer.wte.weight (Float [1000000, "
                         "4096], 15.3GiB, initial values)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("`tightfit plan` shows where its memory goes"), std::string::npos)
      << message;
}

// Each size within its bound, the product not: batch_size x seq_len x
// vocabulary x 4 bytes passes int64. The plan refuses it by name.
TEST(HostileConfig, ProductsPastInt64AreRefusedNotWrapped) {
  test::TempDir d;
  const std::string corpus = test::write_corpus(d);
  std::string text = test::tiny_recipe(corpus, d.str());
  for (const auto& [key, value] : {std::pair{"seq_len", "10000000"}, {"batch_size", "1000000"}}) {
    const auto at = text.find(std::string("\n") + key + " = ");
    ASSERT_NE(at, std::string::npos) << key;
    text.replace(at + 1, text.find('\n', at + 1) - at - 1, std::string(key) + " = " + value);
  }
  text.replace(text.find("n_positions = 64"), 16, "n_positions = 10000000\nvocab_size = 10000000");
  SessionOptions dry;
  dry.dry_run = true;
  try {
    auto s = test::make_session(text, dry);
    const MemoryPlan plan = plan_memory(s->parts());
    FAIL() << "planned a peak of " << plan.tracked_peak << " bytes";
  } catch (const RecipeError& e) {
    EXPECT_NE(std::string(e.what()).find("passes 64 PiB"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

// A corpus far larger than the budget (a 64 GiB sparse file: no disk used)
// is refused before it is read — the budget's exit, naming the corpus and
// the budget — and never read whole into memory to find out.
TEST(HugeCorpus, OverTheBudgetIsRefusedBeforeItIsRead) {
  test::TempDir d;
  for (const std::string name : {"huge.txt", "huge.jsonl"}) {
    const std::string corpus = d.str() + "/" + name;
    {
      const int fd = ::open(corpus.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::ftruncate(fd, int64_t{64} << 30), 0);
      ::close(fd);
    }
    const std::string text =
        test::tiny_recipe(corpus, d.str()).replace(0, 6, "[run]\nmemory_budget = \"64MiB\"\n");
    const auto start = std::chrono::steady_clock::now();
    try {
      test::make_session(text);
      FAIL() << name << ": a 64 GiB corpus was taken under a 64 MiB budget";
    } catch (const OutOfBudgetError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("the corpus alone needs at least 64.0GiB"), std::string::npos) << msg;
      EXPECT_NE(msg.find("run.memory_budget is 64.0MiB"), std::string::npos) << msg;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20)) << name;
  }
}

}  // namespace
}  // namespace tightfit

namespace tightfit {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The plugins' own files obey the same rule as the kernel's: offload's disk
// tier lives in a private folder it makes inside the user's `dir` and
// removes after (a user's 0.bin there, or a symlink planted as one, is
// never written), and LoRA's adapter_config.json replaces a planted symlink
// instead of writing through it.
TEST(UsersFiles, PluginsWriteOnlyTheirOwnFiles) {
  test::TempDir d;
  const std::string corpus = test::write_corpus(d);
  const std::string od = d.str() + "/offload-here";
  std::filesystem::create_directories(od);
  std::ofstream(od + "/0.bin") << "mine";
  std::ofstream(d.str() + "/target.txt") << "keep";
  std::filesystem::create_symlink(d.str() + "/target.txt", od + "/1.bin");
  {
    auto s = test::make_session(test::tiny_recipe(
        corpus, d.str(), "",
        "[[strategy]]\nplugin = \"offload\"\nparams = \"disk\"\ntrainable = true\n"
        "optimizer = \"disk\"\ndir = \"" +
            od + "\"\n"));
    s->train();
    int scratch = 0;
    for (const auto& e : std::filesystem::directory_iterator(od))
      scratch += e.path().filename().string().rfind("tightfit-offload-", 0) == 0;
    EXPECT_EQ(scratch, 1) << "the disk tier's files are in a folder of their own";
  }
  EXPECT_EQ(read_text(od + "/0.bin"), "mine");
  EXPECT_EQ(read_text(d.str() + "/target.txt"), "keep");
  for (const auto& e : std::filesystem::directory_iterator(od))
    EXPECT_NE(e.path().filename().string().rfind("tightfit-offload-", 0), 0u)
        << e.path() << " was left behind";

  auto s = test::make_session(
      test::tiny_recipe(corpus, d.str(), "", "[[strategy]]\nplugin = \"lora\"\nrank = 2\n"));
  s->train();
  const std::string adapter = d.str() + "/adapter";
  std::filesystem::create_directories(adapter);
  std::filesystem::create_symlink(d.str() + "/target.txt", adapter + "/adapter_config.json");
  std::filesystem::create_symlink(d.str() + "/target.txt", adapter + "/adapter_config.json.tmp");
  s->export_adapter(adapter);
  EXPECT_EQ(read_text(d.str() + "/target.txt"), "keep");
  EXPECT_FALSE(std::filesystem::is_symlink(adapter + "/adapter_config.json"));
  EXPECT_NE(read_text(adapter + "/adapter_config.json").find("\"r\": 2"), std::string::npos);
}

// A model folder whose name holds quotes, '#' and spaces exports and
// generates like any other; its path is never pasted into TOML text, where
// it would end the string early and name another folder.
TEST(UsersFiles, FolderNamesWithQuotesAndHashWork) {
  test::TempDir d;
  const std::string recipe =
      test::write_file(d, "r.toml", test::tiny_recipe(test::write_corpus(d), d.str()));
  std::string out;
  ASSERT_EQ(test::run_tightfit("run " + recipe + " -q", &out), 0) << out;
  const std::string hf = d.str() + "/my \"hf\" #1";
  ASSERT_EQ(test::run_tightfit("export " + recipe + " --out '" + hf + "'", &out), 0) << out;
  ASSERT_TRUE(std::filesystem::exists(hf + "/config.json"));
  std::string from_folder, from_recipe;
  ASSERT_EQ(test::run_tightfit("generate '" + hf + "' -p Hello -n 8 --greedy", &from_folder), 0)
      << from_folder;
  ASSERT_EQ(test::run_tightfit("generate " + recipe + " -p Hello -n 8 --greedy", &from_recipe), 0)
      << from_recipe;
  EXPECT_EQ(from_folder, from_recipe);
}

}  // namespace
}  // namespace tightfit
