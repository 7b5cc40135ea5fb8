// The parameter store's initial values: a parameter not kept as CPU fp32 is
// drawn a chunk at a time, with the numbers of the whole fp32 draw and
// without a whole fp32 copy beside it.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>

#include "memory_accounting.hpp"
#include "param_store.hpp"

using namespace tightfit;

namespace {

Param param(int64_t numel, at::ScalarType dtype, tf_init_kind init) {
  Param p;
  p.name = "w";
  p.shape = {numel};
  p.dtype = dtype;
  p.init = init;
  p.init_std = init == TF_INIT_CONSTANT ? 0.3 : 0.02;
  return p;
}

// The reference: the whole parameter drawn in fp32, then converted.
at::Tensor whole_draw(Param p, at::Generator& gen) {
  const at::ScalarType dtype = p.dtype;
  p.dtype = at::kFloat;
  return initial_values(p, at::Device(at::kCPU), gen).to(dtype);
}

}  // namespace

TEST(ParamStore, ChunkedInitialValuesAreTheWholeDrawBitForBit) {
  // Sizes around the 16-value blocks of LibTorch's normal_ and the 32-value
  // chunks: a tail shorter than 16 must ride with the chunk before it.
  for (const int64_t n : {1, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 100, 1003}) {
    for (const tf_init_kind init :
         {TF_INIT_NORMAL, TF_INIT_UNIFORM, TF_INIT_CONSTANT, TF_INIT_ONES}) {
      for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
        SCOPED_TRACE("numel " + std::to_string(n) + " init " + std::to_string(init) + " " +
                     c10::toString(dtype));
        const Param p = param(n, dtype, init);
        auto gen_chunked = at::make_generator<at::CPUGeneratorImpl>(1234);
        auto gen_whole = at::make_generator<at::CPUGeneratorImpl>(1234);
        const at::Tensor chunked = initial_values(p, at::Device(at::kCPU), gen_chunked, 32);
        const at::Tensor whole = whole_draw(p, gen_whole);
        ASSERT_EQ(chunked.scalar_type(), dtype);
        ASSERT_EQ(chunked.sizes(), whole.sizes());
        EXPECT_TRUE(at::equal(chunked, whole));
        // Both generators moved on alike: the next parameter gets the same numbers.
        const Param next = param(40, at::kFloat, TF_INIT_NORMAL);
        EXPECT_TRUE(at::equal(initial_values(next, at::Device(at::kCPU), gen_chunked),
                              initial_values(next, at::Device(at::kCPU), gen_whole)));
      }
    }
  }
}

TEST(ParamStore, AnAbsentParameterTakesItsDrawFromTheGenerator) {
  // A skipped stage's parameter is drawn and dropped, so the ones after it
  // get the numbers they would have had.
  for (const tf_init_kind init : {TF_INIT_NORMAL, TF_INIT_UNIFORM, TF_INIT_ZEROS}) {
    const Param absent = param(1003, at::kBFloat16, init);
    auto gen_dropped = at::make_generator<at::CPUGeneratorImpl>(7);
    auto gen_kept = at::make_generator<at::CPUGeneratorImpl>(7);
    EXPECT_FALSE(initial_values(absent, std::nullopt, gen_dropped, 32).defined());
    whole_draw(absent, gen_kept);
    const Param next = param(100, at::kFloat, TF_INIT_NORMAL);
    EXPECT_TRUE(at::equal(initial_values(next, at::Device(at::kCPU), gen_dropped),
                          initial_values(next, at::Device(at::kCPU), gen_kept)))
        << "init kind " << init;
  }
}

// A routed share (ABI 1.17) is a share of the tokens: kept as declared in
// [0, 1] (0 from a plugin whose spec ends before the field), refused outside
// it naming the parameter, NaN included.
TEST(ParamStore, ARoutedShareOutsideZeroToOneIsRefusedByName) {
  const int64_t shape[] = {4, 4};
  tf_param_spec spec{};
  spec.struct_size = sizeof spec;
  spec.ndim = 2;
  spec.shape = shape;
  spec.dtype = TF_DTYPE_F32;
  spec.stage = 0;
  spec.flags = TF_PARAM_EXPERT;
  ParamStore store;
  spec.name = "experts.0.w1.weight";
  spec.routed_share = 0.25;
  store.declare(spec);
  EXPECT_EQ(store.get("experts.0.w1.weight").routed_share, 0.25);
  for (const double bad : {-0.5, 1.5, std::nan("")}) {
    spec.name = "experts.1.w1.weight";
    spec.routed_share = bad;
    try {
      store.declare(spec);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("\"experts.1.w1.weight\" declares a routed_share "
                                           "outside [0, 1]"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(ParamStore, ABf16ParameterIsNeverWholeInFp32) {
  // 4M values: 8 MiB in bf16; drawn whole in fp32 first, the set-up would
  // hold 16 MiB more (the 2 GB a 514M-value tied embedding held).
  constexpr int64_t n = int64_t{4} << 20;
  const int64_t shape[] = {n / 1024, 1024};
  tf_param_spec spec{};
  spec.struct_size = sizeof spec;
  spec.name = "embed.weight";
  spec.ndim = 2;
  spec.shape = shape;
  spec.dtype = TF_DTYPE_BF16;
  spec.stage = 0;
  spec.init = TF_INIT_NORMAL;
  spec.init_std = 0.02;
  ParamStore store;
  store.declare(spec);
  auto& acct = MemoryAccounting::instance();
  acct.reset_peaks();
  const int64_t before = acct.snapshot().total_current;
  store.materialize(1, [](const Param&) { return std::optional<at::Device>(at::kCPU); });
  const int64_t grown = acct.snapshot().total_peak - before;
  const int64_t bf16_bytes = n * 2;
  EXPECT_GE(grown, bf16_bytes);
  // The parameter and one 4 MiB fp32 chunk at most, not its 16 MiB fp32 copy.
  static_assert(kInitChunkValues * 4 <= (int64_t{4} << 20));
  EXPECT_LE(grown, bf16_bytes + (int64_t{5} << 20));
  const Param& p = store.get("embed.weight");
  EXPECT_EQ(p.value.scalar_type(), at::kBFloat16);
  // The numbers: the whole fp32 draw from the same seed, converted.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  EXPECT_TRUE(at::equal(p.value.detach(), whole_draw(p, gen)));
}

// ABI 1.19's copies (a reference model's weights): one of each trainable
// parameter but the adapters, frozen and flagged, holding the same initial
// values; the others draw the numbers they would have without them, and
// a prefix a name starts with already is refused.
TEST(ParamStore, CopiesRepeatTheirParametersDrawAndTakeNothingFromTheOthers) {
  auto declare = [](ParamStore& store, const char* name, uint32_t flags, tf_dtype dtype) {
    const int64_t shape[] = {37, 5};
    tf_param_spec spec{};
    spec.struct_size = sizeof spec;
    spec.name = name;
    spec.ndim = 2;
    spec.shape = shape;
    spec.dtype = dtype;
    spec.stage = 0;
    spec.init = TF_INIT_NORMAL;
    spec.init_std = 0.02;
    spec.flags = flags;
    store.declare(spec);
  };
  auto make = [&](ParamStore& store) {
    declare(store, "a", 0, TF_DTYPE_F32);
    declare(store, "frozen", TF_PARAM_FROZEN, TF_DTYPE_F32);
    declare(store, "b", 0, TF_DTYPE_BF16);
    declare(store, "lora_A", TF_PARAM_ADAPTER, TF_DTYPE_F32);
  };
  ParamStore plain, with_copies;
  make(plain);
  make(with_copies);
  EXPECT_EQ(with_copies.declare_copies("reference."), 2);
  EXPECT_TRUE(with_copies.has_copies("reference."));
  EXPECT_FALSE(with_copies.has_copies("other."));
  EXPECT_EQ(with_copies.find("reference.frozen"), nullptr);
  EXPECT_EQ(with_copies.find("reference.lora_A"), nullptr);
  for (const char* bad : {"", "reference.", "a"}) {
    try {
      with_copies.declare_copies(bad);
      ADD_FAILURE() << "prefix \"" << bad << "\" was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("declare_param_copies"), std::string::npos);
    }
  }
  const auto on_cpu = [](const Param&) { return std::optional<at::Device>(at::kCPU); };
  plain.materialize(5, on_cpu);
  with_copies.materialize(5, on_cpu);
  for (const char* name : {"a", "frozen", "b", "lora_A"})
    EXPECT_TRUE(at::equal(plain.get(name).value, with_copies.get(name).value)) << name;
  for (const char* name : {"a", "b"}) {
    const Param& copy = with_copies.get(std::string("reference.") + name);
    EXPECT_EQ(copy.copy_of, name);
    EXPECT_EQ(copy.source_name(), name);
    EXPECT_FALSE(copy.trainable);
    EXPECT_FALSE(copy.value.requires_grad());
    EXPECT_EQ(copy.flags & (TF_PARAM_COPY | TF_PARAM_FROZEN), TF_PARAM_COPY | TF_PARAM_FROZEN);
    EXPECT_EQ(copy.value.scalar_type(), plain.get(name).value.scalar_type());
    EXPECT_TRUE(at::equal(copy.value, plain.get(name).value)) << name;
    EXPECT_FALSE(copy.value.is_same(with_copies.get(name).value));
  }
}
