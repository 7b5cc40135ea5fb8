// GGUF files read as ggml's own Python package (gguf 0.19) writes and reads
// them: every metadata value type, tensor infos in GGUF's dimension order,
// and each tensor type tightfit decodes equal, value for value, to
// gguf.quants.dequantize (tests/peers/gguf_files.py). Then hostile files:
// each defect refused by name before anything is allocated for it.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bpe_tokenizer.hpp"
#include "chat_template.hpp"
#include "gguf_file.hpp"
#include "gguf_folder.hpp"
#include "gguf_model.hpp"
#include "gguf_recipe.hpp"
#include "safetensors.hpp"
#include "session.hpp"
#include "test_support.hpp"
#include "tokenizer_config.hpp"

using namespace tightfit;
using namespace tightfit::gguf;

namespace {

class GgufPeer : public ::testing::Test {
 protected:
  static test::TempDir* dir_;
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                            "/tests/peers/gguf_files.py " + dir_->str() + " > " + dir_->str() +
                            "/peer.log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "the Python peer failed (see " << dir_->str()
                                           << "/peer.log); scripts/setup installs gguf";
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string path(const std::string& name) { return dir_->str() + "/" + name; }
};
test::TempDir* GgufPeer::dir_ = nullptr;

}  // namespace

TEST_F(GgufPeer, MetadataOfEveryTypeReadsAsGgufReadsIt) {
  const GgufReader r(path("types.gguf"));
  std::ifstream in(path("metadata.json"));
  const nlohmann::json want = nlohmann::json::parse(in);
  EXPECT_EQ(r.version(), 3u);
  EXPECT_EQ(r.alignment(), 32u);
  EXPECT_EQ(r.data_offset(), want["__data_offset__"].get<uint64_t>());
  EXPECT_EQ(r.get("general.architecture").as_string("a"), "llama");
  for (const std::string key :
       {"test.u8", "test.i8", "test.u16", "test.i16", "test.u32", "test.i32", "test.i64"})
    EXPECT_EQ(r.get(key).as_int(key), want[key].get<int64_t>()) << key;
  EXPECT_EQ(r.get("test.u64").type, ValueType::UINT64);
  EXPECT_EQ(r.get("test.u64").u, want["test.u64"].get<uint64_t>());
  EXPECT_THROW(r.get("test.u64").as_int("test.u64"), GgufError);  // past int64: said, not wrapped
  EXPECT_EQ(r.get("test.f32").type, ValueType::FLOAT32);
  EXPECT_EQ(r.get("test.f32").f, want["test.f32"].get<double>());
  EXPECT_EQ(r.get("test.f64").f, 0.1);
  EXPECT_TRUE(r.get("test.bool").as_bool("test.bool"));
  EXPECT_EQ(r.get("test.string").as_string("s"), want["test.string"].get<std::string>());
  std::vector<std::string> strings;
  for (const Value& v : r.get("test.strings").as_array("a")) strings.push_back(v.as_string("s"));
  EXPECT_EQ(strings, want["test.strings"].get<std::vector<std::string>>());
  const auto& ints = r.get("test.ints").as_array("a");
  ASSERT_EQ(ints.size(), 3u);
  EXPECT_EQ(ints[1].as_int("i"), -2);
  EXPECT_EQ(r.get("test.floats").as_array("a")[1].as_number("f"), -1.25);
  // Arrays of arrays keep their nesting (gguf's reader flattens them).
  const auto& nested = r.get("test.nested").as_array("a");
  ASSERT_EQ(nested.size(), 2u);
  EXPECT_EQ(nested[0].as_array("n").size(), 2u);
  EXPECT_EQ(nested[1].as_array("n")[0].as_int("n"), 3);
  EXPECT_THROW(r.get("test.nope"), GgufError);
  EXPECT_THROW(r.get("test.string").as_int("test.string"), GgufError);
}

TEST_F(GgufPeer, EveryTensorTypeDecodesAsGgmlDequantizes) {
  const GgufReader r(path("types.gguf"));
  std::ifstream in(path("metadata.json"));
  const nlohmann::json want = nlohmann::json::parse(in)["__tensors__"];
  const SafetensorsFile expected = read_safetensors(path("expected.safetensors"));
  ASSERT_EQ(r.tensors().size(), want.size());
  for (const TensorInfo& t : r.tensors()) {
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.type->name, want[t.name]["type"].get<std::string>());
    EXPECT_EQ(t.dims, want[t.name]["shape"].get<std::vector<int64_t>>());  // ne0 first
    const at::Tensor got = r.read_float(t);
    const at::Tensor& ref = expected.tensors.at(t.name);
    ASSERT_EQ(got.sizes(), ref.sizes());  // PyTorch's order: [rows, columns]
    EXPECT_TRUE(at::equal(got, ref)) << "max diff " << (got - ref).abs().max().item<double>();
  }
}

TEST_F(GgufPeer, VersionTwoAndAWiderAlignmentRead) {
  const SafetensorsFile expected = read_safetensors(path("expected.safetensors"));
  for (const std::string name : {"v2.gguf", "aligned.gguf"}) {
    const GgufReader r(path(name));
    EXPECT_EQ(r.version(), name == "v2.gguf" ? 2u : 3u);
    EXPECT_EQ(r.alignment(), name == "aligned.gguf" ? 64u : 32u);
    EXPECT_EQ(r.data_offset() % r.alignment(), 0u);
    const TensorInfo* t = r.find_tensor("t.q4_k");
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(at::equal(r.read_float(*t), expected.tensors.at("t.q4_k"))) << name;
  }
}

// ---- hostile files ------------------------------------------------------

namespace {

// A GGUF file byte by byte.
struct Bytes {
  std::string b;
  template <typename T>
  Bytes& put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b += s;
    return *this;
  }
  Bytes& header(uint64_t tensors, uint64_t keys, uint32_t version = 3) {
    b += "GGUF";
    return put<uint32_t>(version).put<uint64_t>(tensors).put<uint64_t>(keys);
  }
  // A tensor info: name, dims (ne0 first), type, offset.
  Bytes& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) put<uint64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  Bytes& pad_to(size_t alignment) {
    b.resize((b.size() + alignment - 1) / alignment * alignment, '\0');
    return *this;
  }
};

std::string refusal(const test::TempDir& dir, const std::string& bytes, const Limits& limits = {}) {
  const std::string p = test::write_file(dir, "hostile.gguf", bytes);
  try {
    GgufReader r(p, limits);
    for (const TensorInfo& t : r.tensors()) r.read_float(t);
  } catch (const GgufError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(p + ": ", 0), 0u) << "names the file: " << what;
    return what;
  }
  return "(read without an error)";
}

}  // namespace

TEST(GgufHostile, EachDefectIsRefusedByName) {
  test::TempDir dir;
  auto has = [](const std::string& what, const std::string& part) {
    return what.find(part) != std::string::npos;
  };
  // A good file: one F32 tensor of 8 values.
  Bytes good;
  good.header(1, 1).str("general.architecture").put<uint32_t>(8).str("llama");
  good.tensor("w", {8}, 0, 0).pad_to(32);
  good.b.append(32, '\0');
  EXPECT_EQ(refusal(dir, good.b), "(read without an error)");

  EXPECT_PRED2(has, refusal(dir, "GGML" + good.b.substr(4)), "not a GGUF file");
  EXPECT_PRED2(has, refusal(dir, "GGUF"), "too short");
  Bytes v1;
  v1.header(0, 0, 1).pad_to(32);
  EXPECT_PRED2(has, refusal(dir, v1.b), "GGUF version 1");
  // Counts: past the limits, and past what the file could hold.
  Bytes many_keys;
  many_keys.header(0, uint64_t{1} << 40);
  many_keys.b.append(64, '\0');
  EXPECT_PRED2(has, refusal(dir, many_keys.b), "metadata entries, past the limit");
  Bytes many_tensors;
  many_tensors.header(100000, 0);
  many_tensors.b.append(64, '\0');
  EXPECT_PRED2(has, refusal(dir, many_tensors.b), "cannot fit in the file");
  // A string announcing more bytes than the file or the limit.
  Bytes long_string;
  long_string.header(0, 1).put<uint64_t>(uint64_t{1} << 62);
  long_string.b.append(64, '\0');
  EXPECT_PRED2(has, refusal(dir, long_string.b), "past the 65536-byte limit");
  Bytes long_value;
  long_value.header(0, 1).str("k").put<uint32_t>(8).put<uint64_t>(1000);
  long_value.b.append(64, '\0');
  EXPECT_PRED2(has, refusal(dir, long_value.b), "the file ends inside a string");
  // An array of 2^40 items, and arrays nested past the limit.
  Bytes huge_array;
  huge_array.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(0).put<uint64_t>(uint64_t{1}
                                                                                   << 40);
  huge_array.b.append(64, '\0');
  EXPECT_PRED2(has, refusal(dir, huge_array.b), "past the limit");
  Bytes deep;
  deep.header(0, 1).str("k").put<uint32_t>(9);  // an array of arrays of arrays ...
  for (int i = 0; i < 100; ++i) deep.put<uint32_t>(9).put<uint64_t>(1);
  deep.b.append(64, '\0');
  EXPECT_PRED2(has, refusal(dir, deep.b), "arrays nest deeper than 4");
  // Memory the values would take, all told (a small limit stands in for 1 GiB).
  Bytes big;
  big.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(0).put<uint64_t>(4096);
  big.b.append(4096 + 64, '\0');
  Limits small;
  small.max_metadata_bytes = 64 * 1024;
  EXPECT_PRED2(has, refusal(dir, big.b, small), "takes more than 65536 bytes in memory");
  // Unknown value types, a bool that is not 0 or 1, a key twice.
  Bytes bad_type;
  bad_type.header(0, 1).str("k").put<uint32_t>(13).put<uint64_t>(0);
  bad_type.b.append(32, '\0');
  EXPECT_PRED2(has, refusal(dir, bad_type.b), "unknown value type 13");
  Bytes bad_bool;
  bad_bool.header(0, 1).str("k").put<uint32_t>(7).put<uint8_t>(2);
  bad_bool.b.append(32, '\0');
  EXPECT_PRED2(has, refusal(dir, bad_bool.b), "not 0 or 1");
  Bytes twice;
  twice.header(0, 2)
      .str("k")
      .put<uint32_t>(4)
      .put<uint32_t>(1)
      .str("k")
      .put<uint32_t>(4)
      .put<uint32_t>(2);
  twice.b.append(32, '\0');
  EXPECT_PRED2(has, refusal(dir, twice.b), "appears twice");
  // Alignment that is not a power of two.
  Bytes align;
  align.header(0, 1).str("general.alignment").put<uint32_t>(4).put<uint32_t>(48);
  align.b.append(32, '\0');
  EXPECT_PRED2(has, refusal(dir, align.b), "not a power of two");
  // Tensor infos: dimensions, shapes whose size passes int64, unknown and
  // undecoded types, rows not a whole number of blocks, offsets.
  auto one_tensor = [&](std::vector<uint64_t> dims, uint32_t type, uint64_t offset,
                        size_t data = 64) {
    Bytes t;
    t.header(1, 0).tensor("w", std::move(dims), type, offset).pad_to(32);
    t.b.append(data, '\0');
    return refusal(dir, t.b);
  };
  EXPECT_PRED2(has, one_tensor({1, 1, 1, 1, 1}, 0, 0), "has 5 dimensions");
  EXPECT_PRED2(has, one_tensor({uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0), "absurd shape");
  // 2^62 F32 elements: the count fits int64 but its 2^64 bytes wrapped to 0
  // and passed the bounds check (found by fuzz_gguf); refused, not allocated.
  EXPECT_PRED2(has, one_tensor({uint64_t{1} << 31, uint64_t{1} << 31}, 0, 0), "absurd shape");
  EXPECT_PRED2(has, one_tensor({uint64_t{1} << 61, 2}, 1, 0), "absurd shape");
  EXPECT_PRED2(has, one_tensor({8}, 99, 0), "type 99, which tightfit does not know");
  EXPECT_PRED2(has, one_tensor({33}, 2, 0), "not a multiple of Q4_0's block of 32");
  EXPECT_PRED2(has, one_tensor({8}, 0, 4), "is not aligned to 32");
  EXPECT_PRED2(has, one_tensor({64}, 0, 0), "runs past the end of the file");
  EXPECT_PRED2(has, one_tensor({8}, 0, uint64_t{1} << 62), "runs past the end of the file");
  EXPECT_PRED2(has, one_tensor({256}, 16, 0, 128), "IQ2_XXS, which tightfit does not decode");
  Bytes overlap;
  overlap.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).pad_to(32);
  overlap.b.append(128, '\0');
  EXPECT_PRED2(has, refusal(dir, overlap.b), "tensors a and b overlap");
  // A cut file: the data section shorter than its tensors.
  EXPECT_PRED2(has, refusal(dir, good.b.substr(0, good.b.size() - 8)), "runs past the end");
}

// llama.cpp writes Mixtral as architecture llama with llama.expert_count and
// stacked experts: read as model_type mixtral (not as a dense llama that
// stops at its first missing MLP tensor), and refused naming the key when
// its expert_used_count is missing; an expert_count of 0 is a dense model.
// An expert_count on an architecture tightfit reads as dense (qwen2) is
// refused as a mixture of experts by name.
TEST(GgufHostile, AMixtralFileReadsAsMixtralAndOtherExpertCountsAreRefused) {
  test::TempDir dir;
  auto file = [&](const std::string& arch, uint32_t experts, bool used) {
    Bytes f;
    f.header(0, used ? 6 : 5).str("general.architecture").put<uint32_t>(8).str(arch);
    f.str(arch + ".expert_count").put<uint32_t>(4).put<uint32_t>(experts);
    if (used) f.str(arch + ".expert_used_count").put<uint32_t>(4).put<uint32_t>(2);
    f.str(arch + ".block_count").put<uint32_t>(4).put<uint32_t>(2);
    f.str(arch + ".embedding_length").put<uint32_t>(4).put<uint32_t>(32);
    f.str(arch + ".attention.head_count").put<uint32_t>(4).put<uint32_t>(4);
    f.pad_to(32);
    return test::write_file(dir, arch + std::to_string(experts) + (used ? "u" : "") + ".gguf", f.b);
  };
  auto refusal = [](const std::string& p) {
    GgufReader r(p);
    try {
      hf_config(r);
    } catch (const GgufError& e) {
      return std::string(e.what());
    }
    return std::string("(read)");
  };
  {
    GgufReader dense(file("llama", 0, false));
    EXPECT_EQ(hf_config(dense)["model_type"], "llama");
  }
  {
    GgufReader mixtral(file("llama", 8, true));
    const nlohmann::json c = hf_config(mixtral);
    EXPECT_EQ(c["model_type"], "mixtral");
    EXPECT_EQ(c["num_local_experts"], 8);
    EXPECT_EQ(c["num_experts_per_tok"], 2);
  }
  const std::string no_used = file("llama", 8, false);
  EXPECT_NE(refusal(no_used).find(no_used + ": the metadata gives no llama.expert_used_count"),
            std::string::npos)
      << refusal(no_used);
  const std::string qwen2 = file("qwen2", 4, true);
  const std::string what = refusal(qwen2);
  EXPECT_NE(what.find(qwen2 + ": qwen2.expert_count is 4: a mixture of experts"), std::string::npos)
      << what;
  EXPECT_NE(what.find("Hugging Face folder"), std::string::npos) << what;
}

// A float in the metadata that is NaN, infinite, zero or negative (the rope
// base, the norm's epsilon) is refused naming the key where it enters: a NaN
// once went into config.json as null and the plugin trained with its default.
TEST(GgufHostile, ANonFiniteOrNonPositiveRopeBaseOrEpsilonIsRefusedByName) {
  test::TempDir dir;
  auto file = [&](const std::string& key, float value) {
    Bytes f;
    f.header(0, 5).str("general.architecture").put<uint32_t>(8).str("llama");
    f.str("llama.block_count").put<uint32_t>(4).put<uint32_t>(2);
    f.str("llama.embedding_length").put<uint32_t>(4).put<uint32_t>(32);
    f.str("llama.attention.head_count").put<uint32_t>(4).put<uint32_t>(4);
    f.str(key).put<uint32_t>(6).put<float>(value);  // FLOAT32
    f.pad_to(32);
    static int n = 0;
    return test::write_file(dir, "f" + std::to_string(n++) + ".gguf", f.b);
  };
  {
    GgufReader ok(file("llama.rope.freq_base", 10000.0f));
    EXPECT_EQ(hf_config(ok)["rope_theta"].get<double>(), 10000.0);
  }
  for (const std::string key : {"llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon"})
    for (const float bad : {std::nanf(""), INFINITY, -INFINITY, 0.0f, -1.0f}) {
      const std::string p = file(key, bad);
      GgufReader r(p);
      try {
        const nlohmann::json c = hf_config(r);
        ADD_FAILURE() << key << " = " << bad << " was read: " << c.dump();
      } catch (const GgufError& e) {
        const std::string what = e.what();
        EXPECT_EQ(what.rfind(p + ": " + key + " is ", 0), 0u) << what;
        EXPECT_NE(what.find("positive finite number"), std::string::npos) << what;
      }
    }
}

TEST(GgufHostile, AFifoOrAFolderIsRefusedNotWaitedOn) {
  test::TempDir dir;
  const std::string fifo = dir.str() + "/model.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    GgufReader r(fifo);
    FAIL() << "a FIFO was read";
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(GgufReader r(dir.str()), GgufError);
  EXPECT_THROW(GgufReader r(dir.str() + "/missing.gguf"), GgufError);
}

// The real model scripts/setup fetches: SmolLM2-135M-Instruct, Q4_1 with a
// Q8_0 embedding (as llama.cpp's converter wrote it), read as gguf reads it.
TEST(GgufSmolLM2, TheRealFileReadsAsGgufReadsIt) {
  const std::string file =
      std::string(TIGHTFIT_SOURCE_DIR) + "/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  ASSERT_TRUE(std::filesystem::is_regular_file(file)) << file << ": run scripts/setup";
  test::TempDir dir;
  const std::string cmd = test::peer_python() + " " + TIGHTFIT_SOURCE_DIR +
                          "/tests/peers/gguf_smollm2.py " + file + " " + dir.str() + " > " +
                          dir.str() + "/peer.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the Python peer failed (see its log)";
  std::ifstream in(dir.str() + "/smollm2.json");
  const nlohmann::json want = nlohmann::json::parse(in);

  const GgufReader r(file);
  EXPECT_EQ(r.data_offset(), want["data_offset"].get<uint64_t>());
  ASSERT_EQ(r.tensors().size(), want["tensor_count"].get<size_t>());
  for (const TensorInfo& t : r.tensors())
    EXPECT_EQ(t.type->name, want["types"][t.name].get<std::string>()) << t.name;
  const auto& tokens = r.get("tokenizer.ggml.tokens").as_array("tokens");
  EXPECT_EQ(tokens.size(), want["tokens"].get<size_t>());
  EXPECT_EQ(tokens[1000].as_string("t"), want["token_1000"].get<std::string>());
  const auto& merges = r.get("tokenizer.ggml.merges").as_array("merges");
  EXPECT_EQ(merges.size(), want["merges"].get<size_t>());
  EXPECT_EQ(merges[0].as_string("m"), want["merge_0"].get<std::string>());
  EXPECT_EQ(r.get("tokenizer.chat_template").as_string("t"),
            want["chat_template"].get<std::string>());
  EXPECT_EQ(r.get("llama.block_count").as_int("n"), want["block_count"].get<int64_t>());
  EXPECT_EQ(r.get("llama.rope.freq_base").as_number("f"), want["rope_freq_base"].get<double>());

  const SafetensorsFile expected = read_safetensors(dir.str() + "/smollm2_expected.safetensors");
  for (const auto& [name, ref] : expected.tensors) {
    const TensorInfo* t = r.find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    const at::Tensor got = r.read_float(*t);
    ASSERT_EQ(got.sizes(), ref.sizes()) << name;
    EXPECT_TRUE(at::equal(got, ref))
        << name << ": max diff " << (got - ref).abs().max().item<double>();
  }

  // As transformers' GGUF loader: the config, and the tensors under Hugging
  // Face names with llama's q/k permutation undone.
  std::ifstream config_in(dir.str() + "/smollm2_config.json");
  const nlohmann::json hf = nlohmann::json::parse(config_in);
  const nlohmann::json config = hf_config(r);
  for (const auto& [key, value] : config.items()) {
    ASSERT_TRUE(hf.contains(key)) << key;
    if (value.is_number_float())
      EXPECT_EQ(value.get<double>(), hf[key].get<double>()) << key;
    else
      EXPECT_EQ(value, hf[key]) << key;
  }
  for (const char* key :
       {"num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
        "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps", "max_position_embeddings",
        "vocab_size", "tie_word_embeddings"})
    EXPECT_TRUE(config.contains(key)) << key;
  const SafetensorsFile hf_tensors = read_safetensors(dir.str() + "/smollm2_hf.safetensors");
  for (const auto& [name, ref] : hf_tensors.tensors) {
    const at::Tensor got = read_hf_tensor(r, config, name);
    ASSERT_EQ(got.sizes(), ref.sizes()) << name;
    EXPECT_TRUE(at::equal(got, ref))
        << name << ": max diff " << (got - ref).abs().max().item<double>();
  }
  EXPECT_EQ(gguf_tensor_name("model.layers.12.mlp.gate_proj.weight"), "blk.12.ffn_gate.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.0.self_attn.q_proj.bias"), "blk.0.attn_q.bias");
  EXPECT_EQ(gguf_tensor_name("model.layers.x.mlp.gate_proj.weight"), std::nullopt);
  EXPECT_THROW(read_hf_tensor(r, config, "lm_head.weight"), GgufError);  // tied: no output.weight

  // As a model folder (gguf_folder): the tokenizer is the original SmolLM2
  // one, digits split one by one as its "smollm" pre-tokenizer says (where
  // no number is in the text, also transformers' GGUF tokenizer); its chat
  // template renders as transformers' apply_chat_template; the model's
  // logits are within 1e-4 (of their scale) of the float64 answer, and
  // its greedy answer is transformers'.
  setenv("TIGHTFIT_CACHE", (dir.str() + "/cache").c_str(), 1);
  std::ifstream tok_in(dir.str() + "/smollm2_tokenizer.json");
  const nlohmann::json tw = nlohmann::json::parse(tok_in);
  const ModelFolder folder = model_folder(file);
  ASSERT_EQ(folder.tokenizer_error, "");
  const auto tok = BpeTokenizer::load(folder.path);
  size_t vs_original = 0, vs_transformers = 0, compared = 0;
  for (size_t i = 0; i < tw["lines"].size(); ++i) {
    const std::vector<int64_t> got =
        tok->encode_with_special_tokens(tw["lines"][i].get<std::string>());
    if (got != tw["original"][i].get<std::vector<int64_t>>() && ++vs_original <= 3)
      ADD_FAILURE() << "line " << i << ": " << tw["lines"][i];
    if (!tw["has_number"][i].get<bool>()) {
      ++compared;
      if (got != tw["transformers"][i].get<std::vector<int64_t>>()) ++vs_transformers;
    }
  }
  EXPECT_EQ(vs_original, 0u);
  EXPECT_EQ(vs_transformers, 0u) << "of " << compared;
  EXPECT_GT(compared, 100u);
  const TokenizerConfig tc = TokenizerConfig::load(folder.path);
  const ChatTemplate chat(tc.chat_template, tc.source);
  EXPECT_EQ(chat.render(tw["messages"], true, tc.template_variables()).text,
            tw["chat"].get<std::string>());

  const std::string recipe = test::gguf_recipe("builtin:fortunes", dir.str(), file);
  SessionOptions so;
  so.skip_data = true;
  auto s = test::make_session(recipe, so);
  const auto prompt_ids = tw["prompt_ids"].get<std::vector<int64_t>>();
  {
    at::NoGradGuard no_grad;
    const at::Tensor logits = s->executor().forward_logits(
        at::tensor(prompt_ids, at::kLong).unsqueeze(0), /*training=*/false, at::Tensor());
    // Measured against the float64 answer, not transformers' float32 one:
    // two float32 runs of 30 layers differ by summation order on some CPUs
    // (2e-4 apart on one CI machine, bit-equal on another), so "within 1e-4"
    // is taken relative to the logits' scale (max |logit| is about 25); a
    // wrong rope or norm moves them by 1e-2 and more.
    const auto ref = read_safetensors(dir.str() + "/smollm2_logits.safetensors").tensors;
    const at::Tensor got = logits[0][-1].to(at::kDouble), exact = ref.at("exact");
    const auto max_err = [&](const at::Tensor& t) {
      return (t.to(at::kDouble) - exact).abs().max().item<double>();
    };
    EXPECT_LE(max_err(got), 1e-4 * exact.abs().max().item<double>())
        << "transformers' float32 logits are " << max_err(ref.at("logits"))
        << " from the float64 answer, tightfit's differ from them by "
        << (got - ref.at("logits").to(at::kDouble)).abs().max().item<double>();
  }
  SamplingOptions o;
  o.n_tokens = 10;
  o.top_k = 1;
  o.temperature = 0;
  o.add_special_tokens = false;  // the rendered chat holds its own
  EXPECT_EQ(s->generate(tw["chat"].get<std::string>(), o),
            tok->decode(tw["new_ids"].get<std::vector<int64_t>>()));
}

// A GGUF file that is not a model (no shape in its metadata) as a run's
// weights: refused (exit 2) naming what is missing; and bytes in place of a
// GGUF model's own tokenizer are refused too (test_gguf_tokenizer runs real
// ones).
TEST_F(GgufPeer, AFileThatIsNotAModelIsRefusedAsARunsWeights) {
  test::TempDir dir;
  const std::string corpus = test::write_corpus(dir);
  const std::pair<std::string, std::string> cases[] = {
      {"auto", "types.gguf: the metadata gives no num_hidden_layers"},
      {"byte", "is a GGUF model, which reads the ids of its own tokenizer, not bytes"}};
  for (const auto& [tokenizer, why] : cases) {
    std::string r =
        test::tiny_recipe(corpus, dir.str(), "weights = \"" + path("types.gguf") + "\"\n");
    r.replace(r.find("tokenizer = \"byte\""), 18, "tokenizer = \"" + tokenizer + "\"");
    const std::string recipe = test::write_file(dir, "r.toml", r);
    std::string out;
    EXPECT_EQ(test::run_tightfit("run " + recipe + " --quiet", &out), 2) << out;
    EXPECT_NE(out.find(why), std::string::npos) << out;
  }
}
