// The parameter store's initial values: a function of the seed, the name and
// the position alone, drawn a chunk at a time on any number of threads, a
// parameter not kept as CPU fp32 without a whole fp32 copy beside it.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>

#include "initial_draws.hpp"
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

// The reference: the whole stream in one call, in fp32 on one thread, then
// converted.
at::Tensor reference_draw(const Param& p, uint64_t seed) {
  const int64_t n = p.numel();
  at::Tensor flat = at::empty({n}, at::kFloat);
  const uint64_t key = init_stream_key(seed, p.name);
  const auto spread = static_cast<float>(p.init_std);
  if (p.init == TF_INIT_NORMAL) draw_normal(key, 0, n, spread, flat.data_ptr<float>());
  if (p.init == TF_INIT_UNIFORM) draw_uniform(key, 0, n, -spread, spread, flat.data_ptr<float>());
  if (p.init == TF_INIT_CONSTANT) flat.fill_(p.init_std);
  if (p.init == TF_INIT_ONES) flat.fill_(1.0);
  if (p.init == TF_INIT_ZEROS) flat.zero_();
  return flat.view(p.shape).to(p.dtype);
}

// Restores LibTorch's thread count when a test changes it.
struct Threads {
  int saved = at::get_num_threads();
  ~Threads() { at::set_num_threads(saved); }
};

}  // namespace

// The numbers are the parameter's stream whatever the chunks, the same drawn
// on one thread as on two, in fp32 or converted into place: sizes around
// the stream's 32-value blocks and the chunk size, every init kind.
TEST(ParamStore, InitialValuesAreTheSameOnAnyNumberOfThreads) {
  Threads restore;
  const int64_t K = kInitChunkValues;
  for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, int64_t{1003}, K - 1, K, K + 7,
                          2 * K + 16, 3 * K + 1}) {
    for (const tf_init_kind init :
         {TF_INIT_NORMAL, TF_INIT_UNIFORM, TF_INIT_CONSTANT, TF_INIT_ONES}) {
      for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
        SCOPED_TRACE("numel " + std::to_string(n) + " init " + std::to_string(init) + " " +
                     c10::toString(dtype));
        const Param p = param(n, dtype, init);
        const at::Tensor ref = reference_draw(p, 1234);
        for (const int threads : {1, 2, 3}) {
          at::set_num_threads(threads);
          const at::Tensor got = initial_values(p, at::Device(at::kCPU), 1234);
          ASSERT_EQ(got.scalar_type(), dtype);
          ASSERT_TRUE(at::equal(got, ref)) << threads << " threads";
        }
      }
    }
  }
}

// Every chunk, name and seed has its own stream: no two chunks of a
// parameter, two parameters or two seeds repeat each other, and the values
// are N(0, std) (a wrong or shared seed shows here).
TEST(ParamStore, ChunksNamesAndSeedsDrawTheirOwnNumbers) {
  const int64_t K = kInitChunkValues;
  Param p = param(4 * K, at::kFloat, TF_INIT_NORMAL);
  const at::Tensor a = initial_values(p, at::Device(at::kCPU), 7);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = i + 1; j < 4; ++j)
      EXPECT_FALSE(at::equal(a.narrow(0, i * K, 64), a.narrow(0, j * K, 64))) << i << " " << j;
  EXPECT_NEAR(a.mean().item<double>(), 0.0, 1e-4);
  EXPECT_NEAR(a.std().item<double>(), 0.02, 1e-4);
  EXPECT_FALSE(at::equal(a, initial_values(p, at::Device(at::kCPU), 8)));
  Param q = p;
  q.name = "w2";
  EXPECT_FALSE(at::equal(a, initial_values(q, at::Device(at::kCPU), 7)));
}

// A parameter's numbers do not depend on the others: absent, read from a
// file (not drawn) or declared in another order, the rest are the same.
TEST(ParamStore, AParametersNumbersDependOnNoOtherParameter) {
  auto make = [](ParamStore& store, const std::vector<std::string>& names) {
    for (const std::string& name : names) {
      const int64_t shape[] = {33, 7};
      tf_param_spec spec{};
      spec.struct_size = sizeof spec;
      spec.name = name.c_str();
      spec.ndim = 2;
      spec.shape = shape;
      spec.dtype = TF_DTYPE_F32;
      spec.stage = name == "b" ? 1 : 0;
      spec.init = TF_INIT_NORMAL;
      spec.init_std = 0.02;
      store.declare(spec);
    }
  };
  ParamStore all, reordered, without_b, b_from_a_file;
  make(all, {"a", "b", "c"});
  make(reordered, {"c", "a", "b"});
  make(without_b, {"a", "b", "c"});
  make(b_from_a_file, {"a", "b", "c"});
  const auto on_cpu = [](const Param&) { return std::optional<at::Device>(at::kCPU); };
  all.materialize(3, on_cpu);
  reordered.materialize(3, on_cpu);
  without_b.materialize(3, [](const Param& p) {
    return p.name == "b" ? std::nullopt : std::optional<at::Device>(at::kCPU);
  });
  b_from_a_file.materialize(3, on_cpu, {}, [](const Param& p) { return p.name != "b"; });
  EXPECT_TRUE(without_b.get("b").absent);
  EXPECT_EQ(b_from_a_file.get("b").value.sizes(), all.get("b").value.sizes());
  for (const char* name : {"a", "c"}) {
    EXPECT_TRUE(at::equal(all.get(name).value, reordered.get(name).value)) << name;
    EXPECT_TRUE(at::equal(all.get(name).value, without_b.get(name).value)) << name;
    EXPECT_TRUE(at::equal(all.get(name).value, b_from_a_file.get(name).value)) << name;
  }
  EXPECT_TRUE(at::equal(all.get("b").value, reordered.get("b").value));
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
  Threads restore;
  at::set_num_threads(2);
  auto& acct = MemoryAccounting::instance();
  acct.reset_peaks();
  const int64_t before = acct.snapshot().total_current;
  store.materialize(1, [](const Param&) { return std::optional<at::Device>(at::kCPU); });
  const int64_t grown = acct.snapshot().total_peak - before;
  const int64_t bf16_bytes = n * 2;
  EXPECT_GE(grown, bf16_bytes);
  // The parameter and one 4 MiB fp32 chunk a thread at most, not its 16 MiB
  // fp32 copy (two threads: 8 MiB).
  static_assert(kInitChunkValues * 4 <= (int64_t{4} << 20));
  EXPECT_LE(grown, bf16_bytes + (int64_t{9} << 20));
  const Param& p = store.get("embed.weight");
  EXPECT_EQ(p.value.scalar_type(), at::kBFloat16);
  // The numbers: the fp32 draw of the same seed, converted.
  EXPECT_TRUE(at::equal(p.value.detach(), reference_draw(p, 1)));
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
