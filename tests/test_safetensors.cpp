// safetensors: round trip, and malformed files refused before allocation.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "safetensors.hpp"
#include "test_support.hpp"

namespace tightfit {
namespace {

void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\0');
}

std::string refusal(const std::string& path) {
  try {
    read_safetensors(path);
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted " << path;
  return {};
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  test::TempDir dir;
  const std::string path = dir.str() + "/a.safetensors";
  std::map<std::string, at::Tensor> in = {{"w", at::randn({3, 4})},
                                          {"b", at::arange(5, at::kLong)},
                                          {"h", at::randn({2}).to(at::kBFloat16)}};
  write_safetensors(path, in, {{"k", "v"}});
  const SafetensorsFile f = read_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 3u);
  for (const auto& [k, t] : in) EXPECT_TRUE(at::equal(f.tensors.at(k), t)) << k;
  EXPECT_EQ(f.metadata.at("k"), "v");
}

TEST(Safetensors, EmptyTensorsBesideOthersAreNotOverlaps) {
  test::TempDir dir;
  const std::string path = dir.str() + "/e.safetensors";
  // Empty ranges start where a neighbour's bytes start or end.
  write_safetensors(path, {{"a", at::empty({0})},
                           {"b", at::randn({4})},
                           {"c", at::empty({0, 3})},
                           {"d", at::randn({2})},
                           {"e", at::empty({0})}});
  const SafetensorsReader r(path);
  EXPECT_EQ(r.read("a").numel(), 0);
  EXPECT_EQ(r.read("b").numel(), 4);
  EXPECT_EQ(r.read("c").sizes(), at::IntArrayRef({0, 3}));
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// What Python's safetensors checks before it reads a tensor: the data
// offsets, sorted, tile the data section from 0 to the file's end.
void expect_contiguous_data(const std::string& path) {
  const std::string bytes = file_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  ASSERT_EQ(n % 8, 0u) << "data not 8-byte aligned";
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [k, v] : header.items())
    if (k != "__metadata__") ranges.emplace_back(v["data_offsets"][0], v["data_offsets"][1]);
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, at) << path;
    at = e;
  }
  EXPECT_EQ(8 + n + at, bytes.size()) << path;
}

// Streamed a tensor at a time, the file is the one written at once, whatever
// space was kept for the header: kept too little (the data moves up, in
// several pieces), or far too much for a small file (it moves down); a large
// file keeps its padding. Python's safetensors reads each (the peer).
TEST(SafetensorsWriter, StreamsTheSameFileWhateverSpaceItKept) {
  test::TempDir dir;
  std::map<std::string, at::Tensor> many;
  for (int i = 0; i < 300; ++i)
    many["layer." + std::to_string(i) + ".weight"] = at::randn({i % 7, 3});
  many["big"] = at::randn({5 << 20});  // 20 MiB: moved in 3 pieces
  many["bf"] = at::randn({9}).to(at::kBFloat16);
  many["ids"] = at::arange(11, at::kLong);
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  const std::string whole = dir.str() + "/whole.safetensors";
  write_safetensors(whole, many, meta);

  struct Case {
    std::string name;
    uint64_t space;
    std::map<std::string, at::Tensor> tensors;
  };
  std::map<std::string, at::Tensor> small = many;
  small.erase("big");
  const std::map<std::string, at::Tensor> large = {{"a", at::randn({17 << 20})},
                                                   {"b", at::randn({3})}};
  for (const Case& c : {Case{"outgrown", 16, many}, Case{"roomy_small", 1 << 20, small},
                        Case{"roomy_large", 1 << 20, large}}) {
    const std::string path = dir.str() + "/" + c.name + ".safetensors";
    // Reversed order: the data section follows arrival, not the names' order.
    SafetensorsWriter w(path, meta, c.space);
    for (auto it = c.tensors.rbegin(); it != c.tensors.rend(); ++it) w.put(it->first, it->second);
    EXPECT_FALSE(std::filesystem::exists(path)) << "nothing at the path before finish";
    w.finish();
    expect_contiguous_data(path);
    const SafetensorsFile f = read_safetensors(path);
    ASSERT_EQ(f.tensors.size(), c.tensors.size()) << c.name;
    for (const auto& [k, t] : c.tensors)
      EXPECT_TRUE(at::equal(f.tensors.at(k), t)) << c.name << " " << k;
    EXPECT_EQ(f.metadata, meta);
  }
  // A small file keeps no more than 4 KiB of padding; a large one its space.
  const auto size = [&](const std::string& n) {
    return std::filesystem::file_size(dir.str() + "/" + n + ".safetensors");
  };
  const uint64_t small_data = [&] {
    uint64_t b = 0;
    for (const auto& [k, t] : small) b += t.numel() * t.element_size();
    return b;
  }();
  EXPECT_LE(size("roomy_small"), small_data + 8 + 4096 + 300 * 100);
  EXPECT_EQ(size("roomy_large"), (1u << 20) + (17u << 20) * 4 + 12);
  // (its offsets differ from the whole file's in digits, not in padding)
  EXPECT_LT(size("outgrown"), std::filesystem::file_size(whole) + 4096);

  const std::string cmd =
      test::peer_python() + " -c \"" +
      "import sys; from safetensors.torch import load_file; from safetensors import safe_open\n" +
      "for p in sys.argv[1:]:\n" + "    t = load_file(p); m = safe_open(p, 'pt').metadata()\n" +
      "    assert m == {'format': 'pt'}, m\n" +
      "    print(p, len(t), sum(float(v.double().sum()) for v in t.values()))\n\" " + dir.str() +
      "/outgrown.safetensors " + dir.str() + "/roomy_small.safetensors " + dir.str() +
      "/roomy_large.safetensors";
  std::string out;
  ASSERT_EQ(test::run_command(cmd, &out), 0) << out;
  EXPECT_NE(out.find("outgrown.safetensors " + std::to_string(many.size())), std::string::npos)
      << out;
}

// A name given twice is refused; a writer never finished leaves nothing
// behind, neither the file nor its temporary, and an existing file at the
// path stays as it was.
TEST(SafetensorsWriter, RefusesADuplicateAndLeavesNothingUnfinished) {
  test::TempDir dir;
  const std::string path = dir.str() + "/s.safetensors";
  write_safetensors(path, {{"kept", at::ones({2})}});
  const std::string before = file_bytes(path);
  {
    SafetensorsWriter w(path);
    w.put("a", at::ones({4}));
    try {
      w.put("a", at::zeros({4}));
      ADD_FAILURE() << "a duplicate name was accepted";
    } catch (const SafetensorsError& e) {
      EXPECT_NE(std::string(e.what()).find("\"a\" given twice"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(file_bytes(path), before);
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    files += e.is_regular_file();
  EXPECT_EQ(files, 1u) << "the unfinished temporary was left behind";
}

TEST(Safetensors, RefusesMalformedFiles) {
  test::TempDir dir;
  const std::string p = dir.str() + "/bad.safetensors";
  write_raw(p, R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  EXPECT_NE(refusal(p).find("lie outside"), std::string::npos);
  write_raw(
      p,
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12);
  EXPECT_NE(refusal(p).find("overlap"), std::string::npos);
  write_raw(p, R"({"a":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(refusal(p).find("overflows"), std::string::npos);
  write_raw(p, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(refusal(p).find("need 12"), std::string::npos);
  write_raw(p, R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1);
  EXPECT_NE(refusal(p).find("unsupported dtype"), std::string::npos);
  write_raw(p, "not json", 0);
  EXPECT_NE(refusal(p).find("not a JSON object"), std::string::npos);
  {
    std::ofstream out(p, std::ios::binary);
    out << "\xff\xff\xff\xff\xff\xff\xff\x7f";
  }
  EXPECT_NE(refusal(p).find("header length"), std::string::npos);
}

}  // namespace
}  // namespace tightfit
