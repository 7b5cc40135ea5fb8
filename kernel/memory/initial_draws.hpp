// The random initial values of parameters: N(0, std) and U(low, high) from a
// counter-based stream, so a value is a function of the stream's key and its
// position alone, and the same on every CPU and any number of threads.
//
// Why not LibTorch's generator: its mt19937 is a sequential state machine
// (one 624-word state per stream, about 3.3 ns a value on a thread), and
// drawing a 7B model's 6.7 billion values took 15 s of its 36 s set-up on two
// cores. Here a value's 32 random bits are SplitMix64's finalizer of the key
// and its position (Steele, Lea and Flood 2014; the generator Java's
// SplittableRandom uses, which passes BigCrush), so any range is drawn
// without drawing what comes before it, sixteen at a time in the CPU's widest
// registers. Normal values are Box-Muller pairs, with the logarithm, sine and
// cosine computed by fixed polynomials (Cephes' single-precision ones, within
// a few units in the last place) in IEEE single precision without fused
// multiply-adds, so the bits do not depend on the CPU's vector width.
//
// The stream's layout: values come in blocks of 32 from 16 hashes (of the
// counters 16b+1 .. 16b+16 for block b). Normal: value k < 16 of a block is
// r cos(2 pi u2) of pair k and value 16 + k is r sin(2 pi u2), where
// r = sqrt(-2 ln u1), u1 = (hi24 + 1) / 2^24 and u2 = lo24 / 2^24 are the
// top 24 bits of hash k's high and low words. Uniform: value k is the high
// word's u, value 16 + k the low word's, both hi24 / 2^24 in [0, 1).
#pragma once

#include <cstdint>
#include <string>

namespace tightfit {

// The key of a parameter's stream: the run's seed and the parameter's name
// (that of the parameter a copy copies), mixed so that similar names and
// neighbouring seeds get unrelated streams.
uint64_t init_stream_key(uint64_t seed, const std::string& name);

// Writes values [first, first + n) of stream `key` to out[0, n).
void draw_normal(uint64_t key, int64_t first, int64_t n, float std, float* out);
void draw_uniform(uint64_t key, int64_t first, int64_t n, float low, float high, float* out);

}  // namespace tightfit
