// Instruction and chat rows to token ids and a loss mask, against TRL's
// SFTTrainer (completion-only loss); malformed rows named by file:line and
// field; examples into padded batches; a chat fine-tune end to end.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bpe_tokenizer.hpp"
#include "chat_data.hpp"
#include "cross_entropy.hpp"
#include "data_setup.hpp"
#include "example_batcher.hpp"
#include "safetensors.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

using ojson = nlohmann::ordered_json;

class ChatData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                            "/tests/peers/trl_parity.py " + dir_->str() + " > " + dir_->str() +
                            "/peer.log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "the TRL peer failed; scripts/setup installs trl";
  }
  static void TearDownTestSuite() { delete dir_; }
  static test::TempDir* dir_;
};
test::TempDir* ChatData::dir_ = nullptr;

TEST_F(ChatData, MasksEqualTrlCompletionOnlyLoss) {
  auto tok = BpeTokenizer::load(dir_->str());
  const TokenizerConfig config = TokenizerConfig::load(dir_->str());
  EXPECT_EQ(config.eos_token, "</s>");  // written as {"content": "</s>", ...}
  EXPECT_FALSE(config.chat_template.empty());
  const ChatFormatter formatter(*tok, config, TrainOn::kCompletion);
  const std::vector<Example> got = load_examples(dir_->str() + "/rows.jsonl", formatter);
  std::ifstream in(dir_->str() + "/expected.json");
  const ojson expected = ojson::parse(in);
  ASSERT_EQ(got.size(), expected.size());
  int equal = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const auto ids = expected[i]["input_ids"].get<std::vector<int64_t>>();
    std::vector<uint8_t> mask;
    for (const auto& v : expected[i]["completion_mask"]) mask.push_back(v.get<uint8_t>());
    EXPECT_EQ(got[i].ids, ids) << "row " << i;
    EXPECT_EQ(got[i].trained, mask) << "row " << i;
    equal += got[i].ids == ids && got[i].trained == mask;
  }
  RecordProperty("rows_equal_to_trl", equal);
  std::cout << "TRL completion masks: " << equal << " of " << got.size() << " rows equal\n";
  // train_on = "all": the same ids, every token trained.
  const ChatFormatter all(*tok, config, TrainOn::kAll);
  const std::vector<Example> every = load_examples(dir_->str() + "/rows.jsonl", all);
  for (size_t i = 0; i < every.size(); ++i) {
    EXPECT_EQ(every[i].ids, got[i].ids);
    EXPECT_EQ(std::count(every[i].trained.begin(), every[i].trained.end(), 1),
              static_cast<long>(every[i].ids.size()));
  }
}

// A LlamaTokenizerFast with add_bos_token = false: no BOS on any row, as
// TRL's tokens; rows whose prompt tokens are not a prefix of the row's (a
// word split between prompt and completion) are masked as TRL masks them
// and counted in the data summary.
TEST_F(ChatData, AddBosTokenFalseAndSplitWordsCountAsTrl) {
  const std::string folder = dir_->str() + "/nobos";
  auto tok = BpeTokenizer::load(folder);
  const ChatFormatter formatter(*tok, TokenizerConfig::load(folder), TrainOn::kCompletion);
  const std::vector<Example> got = load_examples(folder + "/rows.jsonl", formatter);
  std::ifstream in(folder + "/expected.json");
  const ojson expected = ojson::parse(in);
  ASSERT_EQ(got.size(), expected.size());
  int64_t trained = 0, trl_trained = 0, not_prefix = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].ids, expected[i]["input_ids"].get<std::vector<int64_t>>()) << "row " << i;
    std::vector<uint8_t> mask;
    for (const auto& v : expected[i]["completion_mask"]) mask.push_back(v.get<uint8_t>());
    EXPECT_EQ(got[i].trained, mask) << "row " << i;
    trained += std::count(got[i].trained.begin(), got[i].trained.end(), 1);
    trl_trained += std::count(mask.begin(), mask.end(), 1);
    not_prefix += got[i].prompt_not_prefix;
  }
  EXPECT_EQ(trained, trl_trained);
  EXPECT_EQ(not_prefix, 2);  // "The weat|her", "It stre|amed"; "The memory bud|get" splits cleanly
  DataRequest r;
  r.corpus = folder + "/rows.jsonl";
  r.tokenizer = folder;
  r.seq_len = 64;
  r.batch_size = 2;
  r.val_fraction = 0;
  const DataSetup d = setup_data(r);
  EXPECT_NE(d.description.find("2 rows whose tokenized prompt is not a prefix"), std::string::npos)
      << d.description;
}

TEST_F(ChatData, MalformedRowsNameFileLineAndField) {
  auto tok = BpeTokenizer::load(dir_->str());
  const ChatFormatter formatter(*tok, TokenizerConfig::load(dir_->str()), TrainOn::kCompletion);
  const std::pair<const char*, const char*> cases[] = {
      {R"({"messages": "hi"})", "\"messages\" must be a non-empty list"},
      {R"({"messages": [{"content": "x"}]})", "\"messages\"[0].role must be a string"},
      {R"({"messages": [{"role": "user", "content": 3}]})", "\"messages\"[0].content must be"},
      {R"({"messages": [{"role": "user", "content": "only a question"}]})", "no assistant message"},
      {R"({"prompt": "p"})", "needs \"completion\" too"},
      {R"({"prompt": 1, "completion": "c"})", "\"prompt\" must be a string"},
      {R"({"instruction": "i"})", "\"output\" must be a string"},
      {R"({"nothing": 1})", "a row needs \"messages\""},
      {R"({"messages": [)", "not valid JSON"},
      {R"([1, 2])", "a row must be a JSON object"},
  };
  test::TempDir d;
  for (const auto& [row, message] : cases) {
    const std::string file =
        test::write_file(d, "data.jsonl", std::string("{\"text\": \"fine\"}\n\n") + row + "\n");
    try {
      load_examples(file, formatter);
      ADD_FAILURE() << "accepted: " << row;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(file + ":3"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  // A conversation without a chat template to render it.
  const ChatFormatter bare(*tok, TokenizerConfig{}, TrainOn::kCompletion);
  const std::string file =
      test::write_file(d, "chat.jsonl", R"({"messages": [{"role": "user", "content": "x"}]})");
  EXPECT_THROW(load_examples(file, bare), std::invalid_argument);
  // Not a regular file: refused, not read (a FIFO would block).
  const std::string fifo = d.str() + "/fifo.jsonl";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    load_examples(fifo, formatter);
    ADD_FAILURE() << "read a FIFO";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
}

// A tokenizer that runs out of memory on any text: the failure names the
// file, the line and the stage, not the corpus as a whole.
class ExhaustedTokenizer final : public Tokenizer {
 public:
  int64_t vocab_size() const override { return 256; }
  std::vector<int64_t> encode(const std::string&) const override { throw std::bad_alloc(); }
  std::vector<int64_t> encode_with_offsets(const std::string&,
                                           std::vector<std::pair<size_t, size_t>>&) const override {
    throw std::bad_alloc();
  }
  std::string decode(const std::vector<int64_t>&) const override { return {}; }
};

TEST(ChatDataMemory, AFailureNamesTheFileLineAndStage) {
  const ExhaustedTokenizer tok;
  TokenizerConfig config;
  config.chat_template =
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}";
  config.source = "chat.jinja";
  const ChatFormatter formatter(tok, config, TrainOn::kCompletion);
  test::TempDir d;
  const std::pair<const char*, const char*> rows[] = {
      {R"({"text": "plain"})", "tokenizing the row's text (5 bytes)"},
      {R"({"prompt": "p", "completion": "c"})", "tokenizing the row's text (1 bytes)"},
      {R"({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]})",
       "tokenizing the row's text (19 bytes)"},
  };
  for (const auto& [row, stage] : rows) {
    const std::string file = test::write_file(d, "rows.jsonl", std::string("\n") + row + "\n");
    try {
      load_examples(file, formatter);
      ADD_FAILURE() << "no failure for " << row;
    } catch (const DataOutOfMemory& e) {
      EXPECT_NE(std::string(e.what()).find(file + ":2: " + stage), std::string::npos) << e.what();
    }
  }
}

// Rows are one example each, padded; the prompt and the padding are never
// targets; long examples are cut and counted; the split is by whole examples.
TEST(ExampleBatcher, PadsMasksTruncatesAndSplits) {
  std::vector<Example> ex;
  for (int i = 0; i < 20; ++i) {
    Example e;
    const int n = 3 + i;  // 3 .. 22 tokens: the longer ones are cut at seq_len + 1 = 11
    for (int t = 0; t < n; ++t) e.ids.push_back(100 * i + t);
    e.trained.assign(static_cast<size_t>(n), 0);
    for (int t = n / 2; t < n; ++t) e.trained[static_cast<size_t>(t)] = 1;
    ex.push_back(e);
  }
  Example prompt_only;  // no answer within seq_len: left out (as is example 19, answer at 11..21)
  prompt_only.ids.assign(30, 7);
  prompt_only.trained.assign(30, 0);
  prompt_only.trained[25] = 1;
  ex.push_back(prompt_only);
  ExampleBatcher b(ex, /*seq_len=*/10, /*batch_size=*/4, /*seed=*/5, /*val_fraction=*/0.25,
                   /*pad_id=*/-7);
  EXPECT_EQ(b.counts().examples, 21);
  EXPECT_EQ(b.counts().without_answer, 2);
  EXPECT_EQ(b.counts().truncated, 12);  // lengths 12 .. 22, and the prompt-only one
  EXPECT_EQ(b.counts().validation, 4);  // a quarter of the 19 kept
  EXPECT_EQ(b.counts().train, 15);
  for (int step = 0; step < 6; ++step) {
    const auto batch = b.next();
    ASSERT_EQ(batch.tokens.sizes(), at::IntArrayRef({4, 10}));
    for (int64_t r = 0; r < 4; ++r) {
      const int64_t example = batch.tokens[r][0].item<int64_t>() / 100;
      const int64_t n = std::min<int64_t>(3 + example, 11);
      for (int64_t t = 0; t < 10; ++t) {
        const int64_t tok = batch.tokens[r][t].item<int64_t>(),
                      tgt = batch.targets[r][t].item<int64_t>();
        if (t >= n - 1) {  // padding: never a target
          EXPECT_EQ(tok, -7);
          EXPECT_EQ(tgt, kIgnoreIndex);
        } else {
          EXPECT_EQ(tok, 100 * example + t);
          const bool trained = t + 1 >= (3 + example) / 2;
          EXPECT_EQ(tgt, trained ? 100 * example + t + 1 : kIgnoreIndex) << example << " " << t;
        }
      }
    }
  }
  // Deterministic in (seed, position): the same batches again.
  ExampleBatcher again(ex, 10, 4, 5, 0.25, -7);
  again.set_position(3);
  b.set_position(3);
  EXPECT_TRUE(at::equal(again.next().tokens, b.next().tokens));
  EXPECT_TRUE(at::equal(again.validation(1).targets, b.validation(1).targets));
}

// A Qwen2-shaped model fine-tuned on chat rows through the folder's chat
// template: the loss is on the answers, falls, and the summary says what the
// examples became.
TEST_F(ChatData, ChatFineTuneTrainsOnAnswers) {
  test::TempDir d;
  std::string rows;
  for (int i = 0; i < 40; ++i)
    rows += R"({"messages": [{"role": "user", "content": "What is )" + std::to_string(i) +
            R"( plus one?"}, {"role": "assistant", "content": "It is )" + std::to_string(i + 1) +
            R"(."}]})" + "\n";
  const std::string data = test::write_file(d, "chat.jsonl", rows);
  const std::string recipe =
      "[run]\nname = \"chat\"\nseed = 3\nsteps = 30\nout_dir = \"" + d.str() +
      "\"\nsample_tokens = 0\neval_batches = 2\nlog_every = 1000\n\n"
      "[model]\nplugin = \"llama\"\npreset = \"custom\"\nn_layer = 2\nn_embd = 32\nn_head = 4\n"
      "n_kv_head = 2\nintermediate_size = 64\nmax_positions = 128\n\n"
      "[data]\ncorpus = \"" +
      data + "\"\ntokenizer = \"" + dir_->str() +
      "/tokenizer.json\"\nseq_len = 48\nbatch_size = 8\nval_fraction = 0.1\n\n"
      "[optimizer]\nlr = 3e-3\n\n[schedule]\nplugin = \"standard\"\nwarmup_steps = 2\n";
  auto s = test::make_session(recipe);
  const auto batch = s->data().batcher().next();
  const int64_t trained = batch.targets.ne(kIgnoreIndex).sum().item<int64_t>();
  EXPECT_GT(trained, 0);
  EXPECT_LT(trained, batch.targets.numel() / 2);  // prompts, template and padding are not
  s->data().batcher().set_position(0);
  const TrainSummary sum = s->train();
  EXPECT_NE(sum.data.find("40 examples: 36 train, 4 validation"), std::string::npos) << sum.data;
  ASSERT_GE(sum.losses.size(), 30u);
  EXPECT_LT(sum.losses.back(), sum.losses.front() * 0.7) << "the answers are learnable";
  EXPECT_TRUE(std::isfinite(sum.val_loss));
}

// The walkthrough of docs/fine-tune.md on a small folder: a sharded Qwen2
// save_pretrained wrote, with its tokenizer files and chat template, and chat
// rows; `tightfit plan` and `tightfit run` (save.hf) from the command line;
// transformers loads the result, its tokenizer and template, and computes
// tightfit's logits.
TEST(FineTuneWalkthrough, HfFolderInChatRowsOutFolderTransformersLoads) {
  test::TempDir d;
  const std::string py =
      test::peer_python() + " " + TIGHTFIT_SOURCE_DIR + "/tests/peers/make_hf_folder.py ";
  ASSERT_EQ(std::system((py + "make " + d.str() + "/model " + d.str() + "/chat.jsonl").c_str()), 0);
  const std::string recipe = test::write_file(
      d, "chat.toml",
      "[run]\nname = \"qwen2-chat\"\nseed = 1\nsteps = 40\nsample_tokens = 0\nout_dir = \"" +
          d.str() +
          "/runs\"\n[model]\nplugin = \"llama\"\nconfig = \"model\"\nweights = \"model\"\n"
          "[data]\ncorpus = \"chat.jsonl\"\nseq_len = 64\nbatch_size = 8\nval_fraction = 0.1\n"
          "[optimizer]\nlr = 3e-3\n[save]\nevery = 0\nhf = true\n");
  std::string out;
  ASSERT_EQ(test::run_tightfit("plan " + recipe, &out), 0) << out;
  EXPECT_NE(out.find("device peak"), std::string::npos) << out;
  ASSERT_EQ(test::run_tightfit("run " + recipe, &out), 0) << out;
  EXPECT_NE(out.find("48 examples: 44 train, 4 validation"), std::string::npos) << out;
  const std::string hf = d.str() + "/runs/qwen2-chat/hf";
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json",
                        "tokenizer_config.json", "chat_template.jinja", "generation_config.json"})
    EXPECT_TRUE(std::filesystem::exists(hf + "/" + f)) << f;
  auto s = test::make_session("[run]\nname = \"reload\"\nsample_tokens = 0\nout_dir = \"" +
                              d.str() + "/reload\"\n[model]\nplugin = \"llama\"\nconfig = \"" + hf +
                              "\"\nweights = \"" + hf + "\"\n[data]\ncorpus = \"" + d.str() +
                              "/chat.jsonl\"\ntokenizer = \"" + hf + "\"\nseq_len = 64\n");
  const at::Tensor tokens = at::randint(0, 256, {2, 20}, at::kLong);  // within any vocabulary here
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    logits = s->executor().forward_logits(tokens, false);
  }
  write_safetensors(hf + "/expected.safetensors", {{"tokens", tokens}, {"logits", logits}});
  EXPECT_EQ(std::system((py + "check " + hf).c_str()), 0);
}

}  // namespace
}  // namespace tightfit
