// Attention of a chunk's queries over a KV cache on a CPU, one (row, KV head) at a time.
//
// For a row b and KV head h, the G = Hq / Hkv query heads that share it (grouped-query attention, as
// scaled_dot_product_attention's enable_gqa: query head j reads KV head j / G) and the chunk's T positions give
// N = G T queries. Each key is read once for all N (pass 1: the scores q . k / sqrt(D) where the mask lets the query
// see the key), each query's scores become its softmax (pass 2), and each value is read once for all N (pass 3).
// torch's CPU flash attention runs a small matrix product per (row, query head) instead, which a decode step's one
// query turns into a matrix-vector product whose fixed cost dominates at these sizes.
//
// Every query is computed alone, with the same operations in the same order whatever the chunk's length, the
// batch or the threads: the scores' dot products by D-wide vectors summed in one fixed order, the softmax's sum
// lane by lane over key positions (padded with zeros to whole vectors), the values accumulated in key order: a row's
// numbers do not depend on the batch, the group or the scoring path. The engine calls it for every chunk over
// its cache (attention_kernel.py). A query the mask hides every key from gets zeros.
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "parallel.h"
#include "simd.h"

namespace {

struct Operands {
  const float *q, *k, *v;   // q (B, Hq, T, D) contiguous; k, v (B, Hkv, S, D), each key a contiguous row
  const bool* mask;         // (B, 1 or Hq, T, S), True = attend
  float* out;               // (B, Hq, T, D) contiguous
  int64_t hq, hkv, t, s, d;
  int64_t kb, kh, ks, vb, vh, vs;  // k and v strides: row, head, position
  int64_t mb, mh, mt, ms;          // mask strides (0 where the mask broadcasts)
  float scale;
};

constexpr float kHidden = -std::numeric_limits<float>::infinity();

// A score q . k sums its products in one order whatever the path: where the head dim is whole vectors, lane l of a
// vector sums the products of dims l, l + kVec, ... in turn, and vsum adds the lanes; elsewhere one running sum.
inline float dot(const float* q, const float* k, int64_t d) {
#ifdef BEBOP_VEC
  if (d % kVec == 0) {
    vec acc = vzero();
    for (int64_t j = 0; j < d; j += kVec) acc = vfma(vload(q + j), vload(k + j), acc);
    return vsum(acc);
  }
#endif
  float acc = 0.f;
  for (int64_t j = 0; j < d; ++j) acc = std::fma(q[j], k[j], acc);
  return acc;
}

#ifdef BEBOP_VEC
// dot for kVec keys at once, from kt (d x width: key s in column s): one running sum per (lane of dims, key), then the
// lanes added as vsum adds them (halves, then quarters, ...), so each key's score is bit for bit dot's.
inline vec dots(const float* q, const float* kt, int64_t d, int64_t width) {
  vec a[kVec];
  for (int64_t l = 0; l < kVec; ++l) a[l] = vzero();
  for (int64_t j = 0; j < d; j += kVec)
#pragma GCC unroll 16
    for (int64_t l = 0; l < kVec; ++l) a[l] = vfma(vset(q[j + l]), vload(kt + (j + l) * width), a[l]);
  for (int64_t w = kVec / 2; w >= 1; w /= 2)
    for (int64_t l = 0; l < w; ++l) a[l] = vadd(a[l], a[l + w]);
  return a[0];
}
#endif

// A query's scores (padded to `width` with kHidden) -> its softmax's numerators in place; returns their sum (0 when
// every key is hidden).
inline float soften(float* row, int64_t width) {
  float top = kHidden;
#ifdef BEBOP_VEC
  if (width % kVec == 0) {  // a max is the same in any order
    vec m = vset(kHidden);
    for (int64_t s = 0; s < width; s += kVec) m = vmax(vload(row + s), m);
    top = vtop(m);
  } else
#endif
    for (int64_t s = 0; s < width; ++s) top = std::max(top, row[s]);
  if (top == kHidden) {  // no key seen: no weights
    for (int64_t s = 0; s < width; ++s) row[s] = 0.f;
    return 0.f;
  }
#ifdef BEBOP_VEC
  if (width % kVec == 0) {
    const vec topv = vset(top);
    vec sum = vzero();
    for (int64_t s = 0; s < width; s += kVec) {
      const vec p = vexp(vsub(vload(row + s), topv));  // exp(-inf) = 0: a hidden key weighs nothing
      vstore(row + s, p);
      sum = vadd(sum, p);
    }
    return vsum(sum);
  }
#endif
  float sum = 0.f;
  for (int64_t s = 0; s < width; ++s) {
    row[s] = std::exp(row[s] - top);
    sum += row[s];
  }
  return sum;
}

// out (d) = scale * sum over keys of p[s] v[s]: even and odd keys summed apart, each in key order (keys of weight 0
// skipped), then added. With a compile-time width of whole vectors, up to 48 (AVX2) or 96 (AVX-512) values, the
// sums stay in registers; wider heads sum a vector of values at a time over every key.
template <int64_t DT>
inline void weigh(const float* p, const float* v, int64_t vs, int64_t keys, int64_t d, float scale, float* out) {
#ifdef BEBOP_VEC
  if constexpr (DT > 0 && DT % kVec == 0 && DT / kVec <= 6) {
    constexpr int64_t n = DT / kVec;
    vec even[n], odd[n];
    for (int64_t u = 0; u < n; ++u) even[u] = odd[u] = vzero();
    for (int64_t s = 0; s < keys; s += 2) {
      if (p[s] != 0.f) {
        const vec pv = vset(p[s]);
#pragma GCC unroll 8
        for (int64_t u = 0; u < n; ++u) even[u] = vfma(pv, vload(v + s * vs + u * kVec), even[u]);
      }
      if (s + 1 < keys && p[s + 1] != 0.f) {
        const vec pv = vset(p[s + 1]);
#pragma GCC unroll 8
        for (int64_t u = 0; u < n; ++u) odd[u] = vfma(pv, vload(v + (s + 1) * vs + u * kVec), odd[u]);
      }
    }
    const vec sv = vset(scale);
    for (int64_t u = 0; u < n; ++u) vstore(out + u * kVec, vmul(vadd(even[u], odd[u]), sv));
    return;
  }
  if (d % kVec == 0) {  // out holds the sums: even keys' first, then odd keys' are added in
    for (int64_t j = 0; j < d; ++j) out[j] = 0.f;
    for (int parity = 0; parity < 2; ++parity) {
      for (int64_t j = 0; j < d; j += kVec) {
        vec acc = vzero();
        for (int64_t s = parity; s < keys; s += 2)
          if (p[s] != 0.f) acc = vfma(vset(p[s]), vload(v + s * vs + j), acc);
        vstore(out + j, parity == 0 ? acc : vmul(vadd(vload(out + j), acc), vset(scale)));
      }
    }
    return;
  }
#endif
  for (int64_t j = 0; j < d; ++j) {
    float sums[2] = {0.f, 0.f};
    for (int64_t s = 0; s < keys; ++s)
      if (p[s] != 0.f) sums[s % 2] = std::fma(p[s], v[s * vs + j], sums[s % 2]);
    out[j] = (sums[0] + sums[1]) * scale;
  }
}

// Row b, KV head h: each of its N queries over every key (the keys and values, a few tens of KB at decoding sizes,
// stay in cache from one query to the next). With several queries the keys are first transposed into kt (D x width)
// and scored a vector of keys at a time; with one or two (a decode step) key by key: the same sums either way.
// Scratch: kt, scores (width). DT > 0: the head dim at compile time.
template <int64_t DT>
void attend(const Operands& o, int64_t b, int64_t h, int64_t width, float* kt, float* scores) {
  const int64_t g = o.hq / o.hkv, d = DT > 0 ? DT : o.d;
  const float *kb = o.k + b * o.kb + h * o.kh, *vb = o.v + b * o.vb + h * o.vh;
  bool by_vectors = false;
#ifdef BEBOP_VEC
  by_vectors = g * o.t > 2 && d % kVec == 0;
  if (by_vectors)
    for (int64_t j = 0; j < d; ++j) {
      float* row = kt + j * width;
      for (int64_t s = 0; s < o.s; ++s) row[s] = kb[s * o.ks + j];
      for (int64_t s = o.s; s < width; ++s) row[s] = 0.f;
    }
#endif
  for (int64_t j = 0; j < g; ++j) {  // query head h g + j of the group
    for (int64_t t = 0; t < o.t; ++t) {
      const int64_t at = ((b * o.hq + h * g + j) * o.t + t) * d;  // the query's offset in q and out
      const float* q = o.q + at;
      const bool* seen = o.mask + b * o.mb + (h * g + j) * o.mh + t * o.mt;
#ifdef BEBOP_VEC
      if (by_vectors) {
        const vec sv = vset(o.scale);
        int64_t s = 0;  // the keys' scores, a vector of keys at a time, hidden ones -inf
        for (; o.ms == 1 && s + kVec <= o.s; s += kVec)
          vstore(scores + s, vhide(vmul(dots(q, kt + s, d, width), sv), seen + s, kHidden));
        for (; s < width; s += kVec) {
          vstore(scores + s, vmul(dots(q, kt + s, d, width), sv));
          for (int64_t l = s; l < s + kVec; ++l)
            if (l >= o.s || !seen[l * o.ms]) scores[l] = kHidden;
        }
      }
#endif
      if (!by_vectors) {
        for (int64_t s = 0; s < o.s; ++s) scores[s] = seen[s * o.ms] ? dot(q, kb + s * o.ks, d) * o.scale : kHidden;
        for (int64_t s = o.s; s < width; ++s) scores[s] = kHidden;
      }
      const float sum = soften(scores, width);
      weigh<DT>(scores, vb, o.vs, o.s, d, sum > 0.f ? 1.f / sum : 0.f, o.out + at);
    }
  }
}

void cached_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                      double scale, const at::Tensor& out) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && mask.dim() == 4, "cached_attention: 4-d operands");
  const int64_t b = q.size(0), hq = q.size(1), t = q.size(2), d = q.size(3), hkv = k.size(1), s = k.size(2);
  for (const at::Tensor* x : {&q, &k, &v, &out})
    TORCH_CHECK(x->device().is_cpu() && x->scalar_type() == at::kFloat, "cached_attention: float32 CPU tensors");
  TORCH_CHECK(q.is_contiguous() && out.is_contiguous() && out.sizes() == q.sizes(), "cached_attention: q, out");
  TORCH_CHECK(k.sizes() == at::IntArrayRef({b, hkv, s, d}) && v.sizes() == k.sizes() && k.stride(3) == 1 &&
                  v.stride(3) == 1, "cached_attention: k, v (B, Hkv, S, D), each key contiguous");
  TORCH_CHECK(hkv > 0 && hq % hkv == 0, "cached_attention: query heads a multiple of the KV heads");
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.device().is_cpu() && mask.size(0) == b &&
                  (mask.size(1) == 1 || mask.size(1) == hq) && mask.size(2) == t && mask.size(3) == s,
              "cached_attention: a bool mask (B, 1 or Hq, T, S)");
  auto stride = [&](int64_t dim) { return mask.size(dim) == 1 ? int64_t(0) : mask.stride(dim); };
  const Operands o{q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), mask.data_ptr<bool>(),
                   out.data_ptr<float>(), hq, hkv, t, s, d, k.stride(0), k.stride(1), k.stride(2), v.stride(0),
                   v.stride(1), v.stride(2), stride(0), stride(1), stride(2), stride(3), float(scale)};
#ifdef BEBOP_VEC
  const int64_t width = (s + kVec - 1) / kVec * kVec;  // whole vectors: the softmax's sum in one lane order
#else
  const int64_t width = s;
#endif
  parallel_blocks(b * hkv, grain_for(2 * (hq / hkv) * t * s * d), [&](int64_t begin, int64_t end) {
    std::vector<float> scores(width), kt(d * width);
    for (int64_t w = begin; w < end; ++w) {
      switch (d) {
        case 64: attend<64>(o, w / hkv, w % hkv, width, kt.data(), scores.data()); break;
        case 128: attend<128>(o, w / hkv, w % hkv, width, kt.data(), scores.data()); break;
        case 32: attend<32>(o, w / hkv, w % hkv, width, kt.data(), scores.data()); break;
        default: attend<0>(o, w / hkv, w % hkv, width, kt.data(), scores.data());
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bebop_native, m) {
  m.def("cached_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(bebop_native, CPU, m) { m.impl("cached_attention", &cached_attention); }
