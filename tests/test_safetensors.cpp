// safetensors: round trip, and malformed files refused before allocation.
#include <gtest/gtest.h>

#include <fstream>

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
