// Causal self-attention in tiles of queries and keys, forward and backward,
// whose memory is linear in the sequence for every variant the families
// use: grouped key/value heads, sliding windows, Gemma 2's soft-capped
// scores, packed rows (each example attends within itself) and learned
// sinks (gpt-oss: a logit per head in every query's softmax that carries no
// value). LibTorch's
// own kernels are linear only for the plain causal case; a window, a packed
// row or a cap otherwise takes a [T, T] mask or [T, T] scores per head.
//
// FlashAttention's algorithm (Dao 2022; FlashAttention-2's backward): for
// each tile of queries, the scores against one tile of keys at a time with
// a running maximum and sum (the online softmax), so that no more than a
// tile x tile block of scores exists; forward keeps q, k, v, the output and
// each query's log-sum-exp (4 bytes a query a head), and backward computes
// each block's scores again from them. The block's scores and softmax are
// fp32 whatever the inputs' dtype (as LibTorch's fused kernels accumulate).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "tightfit/packed_rows.hpp"

namespace tf_sdk {

// Queries, and keys, a block by default: 512 x 512 fp32 scores a head (1
// MiB), large enough for the products to run at speed.
inline constexpr int64_t kTiledAttentionTile = 512;

// Which variant of causal self-attention, and the tile.
struct TiledAttention {
  double scale = 1.0;    // the scores are scale * q . k
  double softcap = 0;    // > 0: scores = softcap * tanh(scores / softcap) (Gemma 2)
  int64_t window = 0;    // > 0: a query sees its `window` latest keys, itself included
  at::Tensor positions;  // int64 [B, T] of a packed row (an example restarts them); or none
  int64_t tile = kTiledAttentionTile;  // queries, and keys, a block
  // [H]: each head's sink logit, a column every query's softmax takes a
  // share of and that adds nothing to the output (its gradient flows to
  // it); or none.
  at::Tensor sinks;
};

// A sequence this long or longer takes the tiled path where a model would
// otherwise hand LibTorch a mask or spell out capped scores (Llama::attend):
// from here a [T, T] mask and its scores cost more than the tiles' loops.
inline constexpr int64_t kTiledAttentionFrom = 2048;

namespace detail {

struct AttentionTiles {
  int64_t T = 0, tile = 0;
  std::vector<int64_t> first_key;  // a query tile's first visible key
  at::Tensor example;              // int64 [B, T] example ids, or undefined
  int64_t window = 0;
  int64_t count() const { return (T + tile - 1) / tile; }
  int64_t begin(int64_t i) const { return i * tile; }
  int64_t end(int64_t i) const { return std::min(T, (i + 1) * tile); }
  // The keys queries [t0, t1) may see, bool broadcasting to [B, KVH, G, tq,
  // tk]; undefined when they see every key in [s0, s1).
  at::Tensor mask(int64_t t0, int64_t t1, int64_t s0, int64_t s1, const at::Device& dev) const {
    const bool causal_all = s1 - 1 <= t0;
    const bool window_all = window <= 0 || (t1 - 1) - s0 < window;
    if (causal_all && window_all && !example.defined()) return {};
    at::Tensor allowed = causal_mask(t1 - t0, s1 - s0, t0 - s0, window, dev);  // [tq, tk]
    if (example.defined()) {
      const at::Tensor same = example.slice(1, t0, t1).unsqueeze(2).eq(
          example.slice(1, s0, s1).unsqueeze(1));  // [B, tq, tk]
      return same.logical_and(allowed).unsqueeze(1).unsqueeze(1);
    }
    return allowed;
  }
};

// The positions a custom function was handed (an empty tensor for none:
// every tensor it takes must exist), as TiledAttention holds them.
inline at::Tensor positions_or_none(const at::Tensor& positions) {
  return positions.numel() > 0 ? positions : at::Tensor();
}

inline AttentionTiles attention_tiles(int64_t T, const TiledAttention& a) {
  AttentionTiles t;
  t.T = T;
  t.tile = std::max<int64_t>(1, a.tile);
  t.window = a.window;
  if (a.positions.defined()) t.example = packed_example_ids(a.positions);
  const int64_t n = t.count();
  t.first_key.assign(static_cast<size_t>(n), 0);
  at::Tensor example_first;  // [n]: the first token of tile i's first query's example, in any row
  if (t.example.defined()) {
    const at::Tensor starts = at::arange(0, T, t.tile, t.example.options());
    const at::Tensor ids = t.example.contiguous();
    example_first = at::searchsorted(ids, ids.index_select(1, starts).contiguous())
                        .amin(0)
                        .to(at::kCPU, at::kLong)
                        .contiguous();
  }
  const int64_t* example_start =
      example_first.defined() ? example_first.data_ptr<int64_t>() : nullptr;
  for (int64_t i = 0; i < n; ++i) {
    int64_t first = t.window > 0 ? std::max<int64_t>(0, t.begin(i) - t.window + 1) : 0;
    if (example_start) first = std::max(first, example_start[i]);
    t.first_key[static_cast<size_t>(i)] = first;
  }
  return t;
}

// q [B, KVH, G, tq, D] and k [B, KVH, 1, tk, D], fp32: the capped, masked
// scores, and tanh of the raw ones when capped (the cap's slope).
inline at::Tensor block_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask,
                               const TiledAttention& a, at::Tensor* capped_tanh) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)).mul_(a.scale);
  if (a.softcap > 0) {
    at::Tensor th = s.div_(a.softcap).tanh_();
    if (capped_tanh) *capped_tanh = th;
    s = th * a.softcap;
  }
  if (mask.defined()) s.masked_fill_(mask.logical_not(), -std::numeric_limits<float>::infinity());
  return s;
}

// Sinks [H] as fp32 [1, KVH, G, 1, 1] beside the grouped queries; or none.
inline at::Tensor head_sinks(const at::Tensor& sinks, int64_t KVH, int64_t G) {
  if (sinks.numel() == 0) return {};
  return sinks.to(at::kFloat).view({1, KVH, G, 1, 1});
}

struct TiledAttentionFunction : public torch::autograd::Function<TiledAttentionFunction> {
  // q [B, H, T, D], k, v [B, KVH, T, D] -> [B, H, T, D]
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, double scale, double softcap,
                            int64_t window, const at::Tensor& positions, int64_t tile,
                            const at::Tensor& sinks) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const TiledAttention a{scale, softcap, window, positions_or_none(positions), tile};
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), KVH = k.size(1);
    const int64_t G = H / KVH;
    const AttentionTiles tiles = attention_tiles(T, a);
    const at::Tensor qg = q.reshape({B, KVH, G, T, D});
    at::Tensor out = at::empty({B, KVH, G, T, D}, q.options());
    at::Tensor lse = at::empty({B, KVH, G, T}, q.options().dtype(at::kFloat));
    const at::Tensor sink = head_sinks(sinks, KVH, G);
    for (int64_t i = 0; i < tiles.count(); ++i) {
      const int64_t t0 = tiles.begin(i), t1 = tiles.end(i);
      const at::Tensor qt = qg.slice(3, t0, t1).to(at::kFloat);
      // The sink is the first column each query has seen: its running
      // maximum starts there, with a sum of exp(0) = 1 and nothing added.
      at::Tensor m = sink.defined()
                         ? sink.expand({B, KVH, G, t1 - t0, 1}).clone()
                         : at::full({B, KVH, G, t1 - t0, 1},
                                    -std::numeric_limits<float>::infinity(), qt.options());
      at::Tensor l = sink.defined() ? at::ones_like(m) : at::zeros_like(m);
      at::Tensor acc = at::zeros_like(qt);
      for (int64_t s0 = tiles.first_key[static_cast<size_t>(i)]; s0 < t1; s0 += tiles.tile) {
        const int64_t s1 = std::min(t1, s0 + tiles.tile);
        const at::Tensor kt = k.slice(2, s0, s1).unsqueeze(2).to(at::kFloat);
        const at::Tensor vt = v.slice(2, s0, s1).unsqueeze(2).to(at::kFloat);
        at::Tensor s = block_scores(qt, kt, tiles.mask(t0, t1, s0, s1, q.device()), a, nullptr);
        const at::Tensor m_new = at::maximum(m, s.amax(-1, true));
        // A row that has seen no key yet (all masked so far) keeps max -inf
        // and shifts by 0: its p and its correction are exp(-inf) = 0.
        const at::Tensor shift = m_new.nan_to_num(0.0, 0.0, 0.0);
        const at::Tensor p = s.sub_(shift).exp_();  // over the scores: one block at a time
        const at::Tensor keep = (m - shift).exp_();
        l = l * keep + p.sum(-1, true);
        acc = acc * keep + at::matmul(p, vt);
        m = m_new;
      }
      out.slice(3, t0, t1).copy_(acc / l);
      lse.slice(3, t0, t1).copy_((m + l.log()).squeeze(-1));
    }
    out = out.view({B, H, T, D});
    ctx->save_for_backward({q, k, v, out, lse, positions, sinks});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["window"] = window;
    ctx->saved_data["tile"] = tile;
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3];
    const at::Tensor &lse = saved[4], &positions = saved[5], &sinks = saved[6];
    const TiledAttention a{ctx->saved_data["scale"].toDouble(),
                           ctx->saved_data["softcap"].toDouble(), ctx->saved_data["window"].toInt(),
                           positions_or_none(positions), ctx->saved_data["tile"].toInt()};
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), KVH = k.size(1);
    const int64_t G = H / KVH;
    const AttentionTiles tiles = attention_tiles(T, a);
    const at::Tensor qg = q.reshape({B, KVH, G, T, D});
    const at::Tensor og = out.reshape({B, KVH, G, T, D});
    const at::Tensor dog = grads[0].reshape({B, KVH, G, T, D});
    at::Tensor dq = at::empty({B, KVH, G, T, D}, q.options());
    at::Tensor dk = at::zeros({B, KVH, T, D}, k.options().dtype(at::kFloat));
    at::Tensor dv = at::zeros({B, KVH, T, D}, v.options().dtype(at::kFloat));
    const at::Tensor sink = head_sinks(sinks, KVH, G);
    at::Tensor dsink = sink.defined() ? at::zeros_like(sink) : at::Tensor();
    for (int64_t i = 0; i < tiles.count(); ++i) {
      const int64_t t0 = tiles.begin(i), t1 = tiles.end(i);
      const at::Tensor qt = qg.slice(3, t0, t1).to(at::kFloat);
      const at::Tensor dot = dog.slice(3, t0, t1).to(at::kFloat);
      const at::Tensor lt = lse.slice(3, t0, t1).unsqueeze(-1);
      // D_i = rowsum(dO * O): the softmax's backward term of each query.
      const at::Tensor di = (dot * og.slice(3, t0, t1).to(at::kFloat)).sum(-1, true);
      // The sink's share p = exp(sink - lse) carries no value: its score's
      // gradient is p (0 - D_i), summed over the queries.
      if (sink.defined()) dsink.sub_(((sink - lt).exp() * di).sum(at::IntArrayRef{0, 3}, true));
      at::Tensor dqt = at::zeros_like(qt);
      for (int64_t s0 = tiles.first_key[static_cast<size_t>(i)]; s0 < t1; s0 += tiles.tile) {
        const int64_t s1 = std::min(t1, s0 + tiles.tile);
        const at::Tensor kt = k.slice(2, s0, s1).unsqueeze(2).to(at::kFloat);
        const at::Tensor vt = v.slice(2, s0, s1).unsqueeze(2).to(at::kFloat);
        // In place where it can: the scores, their tanh when capped and the
        // gradient are the blocks alive at once.
        at::Tensor th;
        at::Tensor s = block_scores(qt, kt, tiles.mask(t0, t1, s0, s1, q.device()), a, &th);
        const at::Tensor p = s.sub_(lt).exp_();  // masked: exp(-inf) = 0
        dv.slice(2, s0, s1).add_(at::matmul(p.transpose(-2, -1), dot).sum(2));
        at::Tensor ds = at::matmul(dot, vt.transpose(-2, -1)).sub_(di).mul_(p);
        if (a.softcap > 0) ds.mul_(th.mul_(th).neg_().add_(1));  // d(c tanh(x / c)) = 1 - tanh^2
        ds.mul_(a.scale);
        dqt.add_(at::matmul(ds, kt));
        dk.slice(2, s0, s1).add_(at::matmul(ds.transpose(-2, -1), qt).sum(2));
      }
      dq.slice(3, t0, t1).copy_(dqt);
    }
    return {dq.view({B, H, T, D}),
            dk.to(k.scalar_type()),
            dv.to(v.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            sink.defined() ? dsink.view(sinks.sizes()).to(sinks.scalar_type()) : at::Tensor()};
  }
};

}  // namespace detail

// Causal self-attention of q [B, H, T, D] over k, v [B, KVH, T, D] (H a
// multiple of KVH: each key/value head serves H / KVH query heads, in
// order), in tiles: -> [B, H, T, D] in q's dtype.
inline at::Tensor tiled_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const TiledAttention& a) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(1) > 0 &&
                  q.size(1) % k.size(1) == 0 && k.sizes() == v.sizes() && q.size(2) == k.size(2),
              "tiled_attention: q [B, H, T, D] and k, v [B, KVH, T, D], H a multiple of KVH");
  TORCH_CHECK(!a.sinks.defined() || (a.sinks.dim() == 1 && a.sinks.size(0) == q.size(1)),
              "tiled_attention: sinks hold one logit per query head [H]");
  // (Every tensor a custom function takes must exist: none goes as an empty one.)
  const at::Tensor positions =
      a.positions.defined() ? a.positions : at::empty({0}, q.options().dtype(at::kLong));
  const at::Tensor sinks = a.sinks.defined() ? a.sinks : at::empty({0}, q.options());
  return detail::TiledAttentionFunction::apply(q, k, v, a.scale, a.softcap, a.window, positions,
                                               a.tile, sinks);
}

// The workspace tiled_attention's backward holds at once beyond the
// gradients of q, k and v (fp32: a block's probabilities, their gradient
// and a capped block's tanh, tile x tile a head; a tile's q, dq, dO and O;
// a key tile's k and v); forward holds less. Per query token it keeps its
// log-sum-exp (tf_sdk::attention_lse_bytes).
inline int64_t tiled_attention_workspace_bytes(int64_t batch, int64_t n_head, int64_t head_dim,
                                               int64_t tile, bool capped) {
  return batch * 4 * ((capped ? 3 : 2) * n_head * tile * tile + 6 * n_head * tile * head_dim);
}

}  // namespace tf_sdk
