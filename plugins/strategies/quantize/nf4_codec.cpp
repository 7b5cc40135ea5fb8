#include "nf4_codec.hpp"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace nf4 {
namespace {

const at::Tensor& levels_tensor() {
  static const at::Tensor levels = at::tensor(std::vector<float>(kLevels.begin(), kLevels.end()));
  return levels;
}

// The midpoints between neighbouring levels, in fp32 as the tensor path
// computes them.
constexpr std::array<float, 15> kMidpoints = [] {
  std::array<float, 15> mid{};
  for (size_t k = 0; k < mid.size(); ++k) mid[k] = (kLevels[k + 1] + kLevels[k]) / 2.0f;
  return mid;
}();

// The largest |x| of a block, NaN when one is NaN. The NaN is tracked apart
// so that the maximum is a plain one; fp32 blocks take it sixteen at a time.
template <typename T>
float block_absmax(const T* x, int64_t len) {
  float a = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < len; ++i) {
    const float ax = std::fabs(static_cast<float>(x[i]));
    nan |= ax != ax;
    a = ax > a ? ax : a;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : a;
}

// A value's code: the midpoints m with !(m >= v), as bucketize's lower bound
// counts them (ties go to the lower level, NaN codes 15).
inline uint8_t code_of(float v) {
  uint8_t c = 0;
  for (float m : kMidpoints) c += !(m >= v);
  return c;
}

// The codes of one fp32 block: one IEEE division and fifteen comparisons a
// value, exact in any vector width, so sixteen values go at once in GCC's
// generic vectors and each CPU runs them in its widest registers (a 7B
// model's 6.5 billion values took 40 s of its set-up one value at a time on
// two cores). A comparison is -1 where true: the code is 15 plus the sum of
// (m >= v) over the midpoints. bf16 values round the quotient to bf16 first,
// one at a time.
using F32x16 = float __attribute__((vector_size(64)));
using I32x16 = int32_t __attribute__((vector_size(64)));
using U8x16 = uint8_t __attribute__((vector_size(16)));

__attribute__((target_clones("avx512f", "avx2", "default"))) void block_codes_f32(const float* x,
                                                                                  int64_t len,
                                                                                  float a,
                                                                                  uint8_t* codes) {
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    F32x16 v;
    std::memcpy(&v, x + i, sizeof v);
    v = v / a;
    I32x16 c = I32x16{} + 15;
#pragma GCC unroll 15
    for (float m : kMidpoints) c += m >= v;
    const U8x16 bytes = __builtin_convertvector(c, U8x16);
    std::memcpy(codes + i, &bytes, sizeof bytes);
  }
  for (; i < len; ++i) codes[i] = code_of(x[i] / a);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) float block_absmax_f32(const float* x,
                                                                                    int64_t len) {
  F32x16 a{};
  I32x16 nan{};
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    F32x16 v;
    std::memcpy(&v, x + i, sizeof v);
    I32x16 bits;
    std::memcpy(&bits, &v, sizeof bits);
    bits &= 0x7fffffff;  // |v|
    std::memcpy(&v, &bits, sizeof v);
    nan |= v != v;
    a = v > a ? v : a;
  }
  float m = block_absmax(x + i, len - i);
  bool any_nan = m != m;
  for (int k = 0; k < 16; ++k) {
    any_nan |= nan[k] != 0;
    m = a[k] > m ? a[k] : m;
  }
  return any_nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

// The absmax and codes of a block of T: fp32 blocks in the vector clones.
template <typename T>
float absmax_of(const T* x, int64_t len) {
  if constexpr (std::is_same_v<T, float>)
    return block_absmax_f32(x, len);
  else
    return block_absmax(x, len);
}

template <typename T>
void block_codes(const T* x, int64_t len, float a, uint8_t* codes) {
  if constexpr (std::is_same_v<T, float>) {
    block_codes_f32(x, len, a, codes);
  } else {
    for (int64_t i = 0; i < len; ++i)
      codes[i] = code_of(static_cast<float>(static_cast<T>(static_cast<float>(x[i]) / a)));
  }
}

// On the CPU a weight takes one pass per block and the tensor path's
// arithmetic in its dtype T (fp32 or bf16): the absmax (NaN kept, at least
// 1e-12, rounded to T), the quotient (in fp32, rounded to T) and its code;
// padding codes as 0 / absmax and a last odd half byte as 0. Blocks go to
// the threads in even-length runs, so every run starts on a whole byte.
template <typename T>
void encode_cpu(const T* x, int64_t n, int64_t block, float* absmax, uint8_t* packed) {
  const int64_t n_blocks = (n + block - 1) / block, padded = n_blocks * block;
  const int64_t run = 2 * std::max<int64_t>(1, 16384 / block);  // blocks, an even count
  const int64_t n_runs = (n_blocks + run - 1) / run;
  at::parallel_for(0, n_runs, 1, [&](int64_t r0, int64_t r1) {
    std::vector<uint8_t> codes(static_cast<size_t>(run * block));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b_begin = r * run, b_end = std::min(n_blocks, b_begin + run);
      for (int64_t b = b_begin; b < b_end; ++b) {
        const int64_t begin = b * block, len = std::min(n, begin + block) - begin;
        const float a = absmax_of(x + begin, len);
        absmax[b] = std::isnan(a) ? a : static_cast<float>(static_cast<T>(std::max(a, 1e-12f)));
        uint8_t* c = codes.data() + (b - b_begin) * block;
        block_codes(x + begin, len, absmax[b], c);
        if (len < block)  // the padding of the last block
          std::fill(c + len, c + block,
                    code_of(static_cast<float>(static_cast<T>(0.0f / absmax[b]))));
      }
      const int64_t e_begin = b_begin * block, e_end = b_end * block;  // e_begin is even
      for (int64_t e = e_begin; e < e_end; e += 2) {
        const uint8_t high = codes[e - e_begin];
        const uint8_t low = e + 1 < padded ? codes[e + 1 - e_begin] : 0;
        packed[e / 2] = static_cast<uint8_t>(high * 16 + low);
      }
    }
  });
}

// Elsewhere: bucketize against the midpoints, a chunk of blocks at a time, so
// the temporaries stay small next to a 7B model's largest weights.
at::Tensor encode_tensors(const at::Tensor& flat, int64_t block, at::Tensor& absmax) {
  const int64_t n = flat.numel(), n_blocks = absmax.numel();
  const at::Tensor& levels = levels_tensor();
  const at::Tensor midpoints =
      ((levels.slice(0, 1) + levels.slice(0, 0, -1)) / 2).to(flat.device());
  at::Tensor codes =
      at::zeros({n_blocks * block + (n_blocks * block) % 2}, flat.options().dtype(at::kByte));
  constexpr int64_t kChunkBlocks = 1 << 14;
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kChunkBlocks) {
    const int64_t nb = std::min(kChunkBlocks, n_blocks - b0);
    const int64_t begin = b0 * block, end = std::min(n, (b0 + nb) * block);
    at::Tensor blocks =
        at::constant_pad_nd(flat.slice(0, begin, end), {0, nb * block - (end - begin)})
            .view({nb, block});
    at::Tensor amax = blocks.abs().amax(1).clamp_min(1e-12);
    absmax.slice(0, b0, b0 + nb).copy_(amax);
    codes.slice(0, begin, begin + nb * block)
        .copy_(at::bucketize(blocks / amax.unsqueeze(1), midpoints, /*out_int32=*/true).flatten());
  }
  codes = codes.view({-1, 2});
  return (codes.select(1, 0) * 16 + codes.select(1, 1)).to(at::kByte);
}

// With AVX-512 (x86-64-v4), whole blocks of a multiple of 32 values: a
// block's 16 values made at once (the same fp32 products, rounded to T as
// c10 rounds: bf16 to nearest even with NaN as 0x7FC0, fp16 by c10::Half),
// then every 16 bytes of codes become 32 values by one permute of them
// (vpermw; for fp32, two vpermd). No arithmetic on the values, so the same
// bits as the loop below; on a 7B QLoRA step the loop's lookups were a tenth
// of the CPU time.
using U8x8 = uint8_t __attribute__((vector_size(8)));
using U16x16 = uint16_t __attribute__((vector_size(32)));
using U16x32 = uint16_t __attribute__((vector_size(64)));
using U32x16 = uint32_t __attribute__((vector_size(64)));
using I32x8 = int32_t __attribute__((vector_size(32)));

bool cpu_has_v4() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd");
  return has;
}

template <typename T>
__attribute__((target("arch=x86-64-v4"))) void decode_blocks_v4(const uint8_t* packed,
                                                                const float* absmax, int64_t b0,
                                                                int64_t b1, int64_t block, T* out) {
  F32x16 levels;
  std::memcpy(&levels, kLevels.data(), sizeof levels);
  for (int64_t b = b0; b < b1; ++b) {
    const F32x16 product = levels * absmax[b];
    const uint8_t* p = packed + b * block / 2;
    T* o = out + b * block;
    if constexpr (sizeof(T) == 2) {
      U16x32 table{};
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        U32x16 u;
        std::memcpy(&u, &product, sizeof u);
        U32x16 rounded = (u + ((u >> 16) & 1) + 0x7fff) >> 16;
        const I32x16 nan = product != product;
        rounded = nan ? U32x16{} + 0x7fc0 : rounded;
        const U16x16 t = __builtin_convertvector(rounded, U16x16);
        table = __builtin_shufflevector(t, t, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
                                        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      } else {
        for (int k = 0; k < 16; ++k) table[k] = static_cast<T>(product[k]).x;
      }
      for (int64_t i = 0; i < block / 2; i += 16) {
        U8x16 bytes;
        std::memcpy(&bytes, p + i, sizeof bytes);
        const U16x16 w = __builtin_convertvector(bytes, U16x16);
        U16x32 codes =
            __builtin_shufflevector(w, w, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9,
                                    9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
        codes = (codes >> U16x32{4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0,
                                 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0}) &
                15;
        const U16x32 values = __builtin_shuffle(table, codes);
        std::memcpy(o + 2 * i, &values, sizeof values);
      }
    } else {
      I32x16 table;
      std::memcpy(&table, &product, sizeof table);
      for (int64_t i = 0; i < block / 2; i += 8) {
        U8x8 bytes;
        std::memcpy(&bytes, p + i, sizeof bytes);
        const I32x8 w = __builtin_convertvector(bytes, I32x8);
        I32x16 codes =
            __builtin_shufflevector(w, w, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        codes = (codes >> I32x16{4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0}) & 15;
        const I32x16 values = __builtin_shuffle(table, codes);
        std::memcpy(o + 2 * i, &values, sizeof values);
      }
    }
  }
}

// On the CPU, one pass over the codes with no temporaries: element i of a
// block is kLevels[code] * absmax, rounded once to T — the same fp32 product
// and the same rounding as the tensor path, so the same bits. Each block's
// 16 values are made first, so an element is one lookup. (The tensor path
// makes six passes and four chunk-sized temporaries per weight use: it was a
// third of a 7B QLoRA step on two cores.)
template <typename T>
void decode_cpu(const uint8_t* packed, const float* absmax, int64_t n, int64_t block, T* out) {
  const int64_t n_blocks = (n + block - 1) / block;
  // Whole blocks of a multiple of 32 values go to the AVX-512 permutes.
  constexpr bool kPermutable =
      std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>;
  const int64_t vector_blocks = kPermutable && block % 32 == 0 && cpu_has_v4() ? n / block : 0;
  at::parallel_for(0, n_blocks, std::max<int64_t>(1, 65536 / block), [&](int64_t b0, int64_t b1) {
    const int64_t v1 = std::min(b1, vector_blocks);
    if constexpr (kPermutable)
      if (b0 < v1) decode_blocks_v4(packed, absmax, b0, v1, block, out);
    std::array<T, 16> value;
    for (int64_t b = std::max(b0, v1); b < b1; ++b) {
      for (size_t k = 0; k < value.size(); ++k) value[k] = static_cast<T>(kLevels[k] * absmax[b]);
      int64_t i = b * block;
      const int64_t end = std::min(n, (b + 1) * block);
      if (i % 2 == 1) {  // an odd block size: this block starts on a byte's low code
        out[i] = value[packed[i / 2] & 15];
        ++i;
      }
      for (; i + 1 < end; i += 2) {
        const uint8_t byte = packed[i / 2];
        out[i] = value[byte >> 4];
        out[i + 1] = value[byte & 15];
      }
      if (i < end) out[i] = value[packed[i / 2] >> 4];
    }
  });
}

// Elsewhere, a chunk of blocks at a time: the whole matrix's int32 codes and
// fp32 products (three times its fp32 bytes, at a 7B model's MLP 0.5 GB)
// never exist together, only the result and one chunk's temporaries — what
// `plan` counts for a dequantized weight.
void decode_tensors(const at::Tensor& packed, const at::Tensor& absmax, int64_t n, int64_t block,
                    at::Tensor& out) {
  const at::Tensor levels = levels_tensor().to(packed.device());
  // An even number of blocks per chunk starts every chunk on a whole byte.
  const int64_t chunk_blocks = std::max<int64_t>(2, ((int64_t{1} << 20) / block) & ~int64_t{1});
  for (int64_t b0 = 0; b0 * block < n; b0 += chunk_blocks) {
    const int64_t nb = std::min(chunk_blocks, absmax.numel() - b0);
    const int64_t begin = b0 * block, end = std::min(n, (b0 + nb) * block);
    const at::Tensor bytes = packed.slice(0, begin / 2, (begin + nb * block + 1) / 2);
    const at::Tensor codes =
        at::stack({bytes.div(16, "floor"), bytes.remainder(16)}, 1).flatten().to(at::kInt);
    const at::Tensor values =
        levels.index_select(0, codes.slice(0, 0, nb * block)).view({nb, block}) *
        absmax.slice(0, b0, b0 + nb).unsqueeze(1);
    out.slice(0, begin, end).copy_(values.flatten().slice(0, 0, end - begin));
  }
}

}  // namespace

std::pair<at::Tensor, at::Tensor> encode(const at::Tensor& w, int64_t block) {
  const int64_t n = w.numel(), n_blocks = (n + block - 1) / block;
  if (!w.is_cpu() || (w.scalar_type() != at::kFloat && w.scalar_type() != at::kBFloat16))
    return encode_with_tensor_ops(w, block);
  const at::Tensor x = w.flatten().contiguous();
  at::Tensor absmax = at::empty({n_blocks}, at::kFloat);
  at::Tensor packed = at::empty({(n_blocks * block + 1) / 2}, at::kByte);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, w.scalar_type(), "nf4::encode", [&] {
    encode_cpu(x.data_ptr<scalar_t>(), n, block, absmax.data_ptr<float>(),
               packed.data_ptr<uint8_t>());
  });
  return {packed, absmax};
}

std::pair<at::Tensor, at::Tensor> encode_with_tensor_ops(const at::Tensor& w, int64_t block) {
  const int64_t n_blocks = (w.numel() + block - 1) / block;
  at::Tensor absmax = at::empty({n_blocks}, w.options().dtype(at::kFloat));
  at::Tensor packed = encode_tensors(w.flatten(), block, absmax);
  return {packed, absmax};
}

at::Tensor decode(const at::Tensor& packed, const at::Tensor& absmax, int64_t n, int64_t block,
                  at::ScalarType dtype) {
  at::Tensor out = at::empty({n}, packed.options().dtype(dtype));
  if (packed.is_cpu() && packed.is_contiguous() && absmax.is_contiguous() &&
      absmax.scalar_type() == at::kFloat &&
      (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf)) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "nf4::decode", [&] {
      decode_cpu(packed.data_ptr<uint8_t>(), absmax.data_ptr<float>(), n, block,
                 out.data_ptr<scalar_t>());
    });
    return out;
  }
  decode_tensors(packed, absmax, n, block, out);
  return out;
}

at::Tensor decode_with_tensor_ops(const at::Tensor& packed, const at::Tensor& absmax, int64_t n,
                                  int64_t block, at::ScalarType dtype) {
  at::Tensor out = at::empty({n}, packed.options().dtype(dtype));
  decode_tensors(packed, absmax, n, block, out);
  return out;
}

}  // namespace nf4
