// The Gated DeltaNet recurrent rule on a CPU, one (row, head) state tile at a time.
//
// Per position t of a chunk, with e = exp(g_t) and S the state before t (Dk x Dv, float32):
//   pass 1 (reads S):        ks = S^T k_t,  qs = S^T q_t
//                            delta = beta_t (v_t - e ks),  o_t = e qs + (q_t . k_t) delta
//   pass 2 (S from cache):   S_t = e S + k_t delta^T, written to states[t]
// which is bebop.model.gated_deltanet.recurrent_rule's math (the pure-torch reference this is tested
// against). The torch form reads a tile three times and writes it twice (the read, the decay, the rank-one
// update), each pass streaming the whole batch's states through memory; here a tile is read from memory once
// and written once, the second pass finding it in cache. The chunk's last states are written with streaming
// stores (no read of the destination before its write), and the next tile is prefetched during the second
// pass. Each position is computed by the same code whatever the chunk's length, the batch or the threads (one
// thread owns a tile), so a decode step and a verify round alike.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kMaxDv = 1024;  // the runtime-width kernel's scratch (the Python side checks Dv against it)

struct Chunk {
  const float *q, *k, *v, *g, *beta, *state;  // (B,H,T,Dk) x2, (B,H,T,Dv), (B,H,T) x2, (B,H,Dk,Dv)
  float *states, *out;                         // (T,B,H,Dk,Dv), (B,H,T,Dv)
  int64_t rows, t, dk, dv;                     // rows = B*H tiles
};

// dst = e * row + ki * delta over dv floats; streamed (bypassing the cache) when asked and aligned.
inline void update_row(float* dst, const float* row, const float* delta, float e, float ki, int64_t dv, bool stream) {
#if defined(__AVX512F__)
  if (stream) {
    const __m512 ev = _mm512_set1_ps(e), kv = _mm512_set1_ps(ki);
    for (int64_t j = 0; j < dv; j += 16)
      _mm512_stream_ps(dst + j, _mm512_fmadd_ps(ev, _mm512_loadu_ps(row + j), _mm512_mul_ps(kv, _mm512_loadu_ps(delta + j))));
    return;
  }
#elif defined(__AVX__)
  if (stream) {
    const __m256 ev = _mm256_set1_ps(e), kv = _mm256_set1_ps(ki);
    for (int64_t j = 0; j < dv; j += 8)
      _mm256_stream_ps(dst + j, _mm256_add_ps(_mm256_mul_ps(ev, _mm256_loadu_ps(row + j)), _mm256_mul_ps(kv, _mm256_loadu_ps(delta + j))));
    return;
  }
#endif
  for (int64_t j = 0; j < dv; ++j) dst[j] = e * row[j] + ki * delta[j];
}

constexpr int64_t kStreamWidth =
#if defined(__AVX512F__)
    16;
#elif defined(__AVX__)
    8;
#else
    0;
#endif

// The tiles [begin, end) over every position of the chunk. DV > 0: the width at compile time (the
// accumulators stay in registers); DV == 0: c.dv at run time.
template <int64_t DV>
void run_tiles(const Chunk& c, int64_t begin, int64_t end, bool stream) {
  const int64_t dv = DV > 0 ? DV : c.dv, dk = c.dk, tile = dk * dv;
  alignas(64) float ks[DV > 0 ? DV : kMaxDv], qs[DV > 0 ? DV : kMaxDv], delta[DV > 0 ? DV : kMaxDv];
  for (int64_t r = begin; r < end; ++r) {
    const float* prev = c.state + r * tile;
    const float* next_tile = r + 1 < end ? c.state + (r + 1) * tile : nullptr;
    for (int64_t t = 0; t < c.t; ++t) {
      const int64_t at = r * c.t + t;  // (row, head, position)
      const float *qt = c.q + at * dk, *kt = c.k + at * dk, *vt = c.v + at * dv;
      const float e = std::exp(c.g[at]), b = c.beta[at];
      float* nxt = c.states + (t * c.rows + r) * tile;
      for (int64_t j = 0; j < dv; ++j) ks[j] = qs[j] = 0.f;
      float qk = 0.f;
      for (int64_t i = 0; i < dk; ++i) {
        const float ki = kt[i], qi = qt[i];
        const float* row = prev + i * dv;
        qk += qi * ki;
#pragma GCC unroll 16
        for (int64_t j = 0; j < dv; ++j) {
          ks[j] += ki * row[j];
          qs[j] += qi * row[j];
        }
      }
      float* o = c.out + at * dv;
      for (int64_t j = 0; j < dv; ++j) {
        delta[j] = (vt[j] - e * ks[j]) * b;
        o[j] = e * qs[j] + qk * delta[j];
      }
      const bool last = t == c.t - 1;  // earlier positions' states are read again at once: keep them cached
      for (int64_t i = 0; i < dk; ++i) {
        if (last && next_tile != nullptr)
          for (int64_t j = 0; j < dv; j += 16) __builtin_prefetch(next_tile + i * dv + j, 0, 2);
        update_row(nxt + i * dv, prev + i * dv, delta, e, kt[i], dv, stream && last);
      }
      prev = nxt;
    }
  }
#if defined(__AVX512F__) || defined(__AVX__)
  if (stream) _mm_sfence();
#endif
}

void gdn_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                   const at::Tensor& beta, const at::Tensor& state, const at::Tensor& states, const at::Tensor& out) {
  const int64_t b = k.size(0), h = k.size(1), t = k.size(2), dk = k.size(3), dv = v.size(3);
  for (const at::Tensor* x : {&q, &k, &v, &g, &beta, &state, &states, &out}) {
    TORCH_CHECK(x->scalar_type() == at::kFloat, "gdn_recurrent: float32 tensors expected");
    TORCH_CHECK(x->is_contiguous() && x->device().is_cpu(), "gdn_recurrent: contiguous CPU tensors expected");
  }
  TORCH_CHECK(q.sizes() == k.sizes() && v.sizes() == at::IntArrayRef({b, h, t, dv}), "gdn_recurrent: q, k, v shapes");
  TORCH_CHECK(g.sizes() == at::IntArrayRef({b, h, t}) && beta.sizes() == g.sizes(), "gdn_recurrent: g, beta shapes");
  TORCH_CHECK(state.sizes() == at::IntArrayRef({b, h, dk, dv}), "gdn_recurrent: state shape");
  TORCH_CHECK(states.sizes() == at::IntArrayRef({t, b, h, dk, dv}) && out.sizes() == v.sizes(), "gdn_recurrent: outputs");
  TORCH_CHECK(dv <= kMaxDv, "gdn_recurrent: value head dim above ", kMaxDv);
  const Chunk c{q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), g.data_ptr<float>(),
                beta.data_ptr<float>(), state.data_ptr<float>(), states.data_ptr<float>(), out.data_ptr<float>(),
                b * h, t, dk, dv};
  const bool stream = kStreamWidth > 0 && dv % kStreamWidth == 0 &&
                      reinterpret_cast<std::uintptr_t>(c.states) % (kStreamWidth * sizeof(float)) == 0;
  at::parallel_for(0, c.rows, 1, [&](int64_t begin, int64_t end) {
    switch (dv) {
      case 64: run_tiles<64>(c, begin, end, stream); break;
      case 128: run_tiles<128>(c, begin, end, stream); break;
      case 256: run_tiles<256>(c, begin, end, stream); break;
      default: run_tiles<0>(c, begin, end, stream);
    }
  });
}

}  // namespace

TORCH_LIBRARY(bebop_native, m) {
  m.def("gdn_recurrent(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor state, Tensor(a!) states, "
        "Tensor(b!) out) -> ()");
}

TORCH_LIBRARY_IMPL(bebop_native, CPU, m) { m.impl("gdn_recurrent", &gdn_recurrent); }
