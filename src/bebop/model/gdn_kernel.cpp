// The Gated DeltaNet recurrent rule on a CPU, one (row, head) state tile at a time.
//
// Per position t of a chunk, with e = exp(g_t) and S the state before t (Dk x Dv):
//   pass 1 (reads S):        ks = S^T k_t,  qs = S^T q_t
//                            delta = beta_t (v_t - e ks),  o_t = e qs + (q_t . k_t) delta
//   pass 2 (S from cache):   S_t = e S + k_t delta^T, written to states[t]
// which is bebop.model.gated_deltanet.recurrent_rule's math (the pure-torch reference this is tested
// against). The torch form reads a tile three times and writes it twice (the read, the decay, the rank-one
// update), each pass streaming the whole batch's states through memory; here a tile is read from memory once
// and written once, the second pass finding it in cache. The chunk's last states are written with streaming
// stores (no read of the destination before its write), and the next tile is prefetched during the second
// pass. That per-position path serves a decode step (one position). A chunk of several (a verify, or a prefill
// given states of one position, which keeps only its end) runs with AVX-512 or AVX2 a block of a tile's columns at a
// time over every position, the block in L1 (block_tile); elsewhere the per-position path, a prefill's positions before
// the last written to a per-thread tile of scratch. Both paths compute each position with the same operations in
// the same order (fused multiply-adds written out, the library built with -ffp-contract=off), whatever the chunk's
// length, the batch or the threads (one thread owns a tile): a decode step and a verify round alike, and a
// prefill's end is bit for bit that of keeping every position.
//
// The states are float32 or bfloat16 (a cache that keeps them in the model's dtype, as vLLM does by default:
// half the bytes). The arithmetic is float32 either way; a bfloat16 state is rounded to nearest even as torch
// rounds (.to(torch.bfloat16)) each time it is written, and the next position reads the rounded one, as the
// next decode step would.
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "parallel.h"
#include "simd.h"

namespace {

constexpr int64_t kMaxDv = 1024;  // the runtime-width kernel's scratch (the Python side checks Dv against it)

template <typename S>
struct Chunk {
  const float *q, *k, *v, *g, *beta;  // (B,H,T,Dk) x2, (B,H,T,Dv), (B,H,T) x2
  const S* state;                     // (B,H,Dk,Dv)
  S* states;                          // (T,B,H,Dk,Dv), or (1,B,H,Dk,Dv): the chunk's end only
  float* out;                         // (B,H,T,Dv)
  int64_t rows, t, dk, dv;            // rows = B*H tiles
  bool end_only;                      // states holds the last position only
};

inline float widen(float x) { return x; }
inline float widen(uint16_t x) {  // bfloat16 bits -> float32
  const uint32_t u = uint32_t(x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t to_bf16(float f) {  // round to nearest even, NaN kept a quiet NaN: c10::BFloat16's rounding
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if (std::isnan(f)) return 0x7FC0;
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

constexpr int64_t kStreamBytes =
#if defined(__AVX512F__)
    64;
#elif defined(__AVX__)
    32;
#else
    0;
#endif

// Copies `bytes` (a multiple of kStreamBytes) from cache-resident `src` to `dst` with streaming stores.
inline void stream_copy(void* dst, const void* src, int64_t bytes) {
#if defined(__AVX512F__)
  for (int64_t j = 0; j < bytes; j += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(static_cast<char*>(dst) + j),
                        _mm512_load_si512(static_cast<const char*>(src) + j));
#elif defined(__AVX__)
  for (int64_t j = 0; j < bytes; j += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(static_cast<char*>(dst) + j),
                        _mm256_load_si256(reinterpret_cast<const __m256i*>(static_cast<const char*>(src) + j)));
#else
  std::memcpy(dst, src, bytes);
#endif
}


// dst = e * row + ki * delta over dv values; streamed (bypassing the cache) when asked (the caller checked the
// alignment). `line` is scratch of dv values in cache, aligned to 64 bytes. Every position of every chunk takes
// the same path for a given dv, so a decode step and a verify round alike.
template <typename S>
inline void update_row(S* dst, const S* row, const float* delta, float e, float ki, int64_t dv, bool stream, S* line) {
  S* to = stream ? line : dst;
#ifdef BEBOP_VEC
  if (dv % kVec == 0 && (kVec == 16 || std::is_same_v<S, float>)) {  // AVX2 rounds bfloat16 faster as scalar code
    const vec ev = vset(e), kv = vset(ki);
    for (int64_t j = 0; j < dv; j += kVec) vput(to + j, vfma(ev, vload(row + j), vmul(kv, vload(delta + j))), false);
    if (stream) stream_copy(dst, line, dv * int64_t(sizeof(S)));
    return;
  }
#endif
  for (int64_t j = 0; j < dv; ++j) {
    const float x = std::fma(e, widen(row[j]), ki * delta[j]);
    if constexpr (std::is_same_v<S, float>) to[j] = x; else to[j] = to_bf16(x);
  }
  if (stream) stream_copy(dst, line, dv * int64_t(sizeof(S)));
}

// Pass 1: ks = S^T k, qs = S^T q over a (dk, dv) tile. With AVX-512 and a compile-time width of up to 256, the
// accumulators stay in registers (2 x DV / 16 of them) and a bfloat16 row is widened as it is loaded.
template <int64_t DV, typename S>
inline void read_tile(const S* tile, const float* kt, const float* qt, int64_t dk, int64_t dv, float* ks, float* qs) {
#if defined(__AVX512F__)
  if constexpr (DV > 0 && DV % 16 == 0 && DV <= 256) {
    constexpr int64_t n = DV / 16;
    __m512 ka[n], qa[n];
    for (int64_t u = 0; u < n; ++u) ka[u] = qa[u] = _mm512_setzero_ps();
    for (int64_t i = 0; i < dk; ++i) {
      const __m512 kv = _mm512_set1_ps(kt[i]), qv = _mm512_set1_ps(qt[i]);
      const S* row = tile + i * DV;
#pragma GCC unroll 16
      for (int64_t u = 0; u < n; ++u) {
        const __m512 x = vload(row + 16 * u);
        ka[u] = _mm512_fmadd_ps(kv, x, ka[u]);
        qa[u] = _mm512_fmadd_ps(qv, x, qa[u]);
      }
    }
    for (int64_t u = 0; u < n; ++u) {
      _mm512_storeu_ps(ks + 16 * u, ka[u]);
      _mm512_storeu_ps(qs + 16 * u, qa[u]);
    }
    return;
  }
#endif
  for (int64_t j = 0; j < dv; ++j) ks[j] = qs[j] = 0.f;
  for (int64_t i = 0; i < dk; ++i) {
    const float ki = kt[i], qi = qt[i];
    const S* row = tile + i * dv;
#pragma GCC unroll 16
    for (int64_t j = 0; j < dv; ++j) {
      const float x = widen(row[j]);
      ks[j] = std::fma(ki, x, ks[j]);
      qs[j] = std::fma(qi, x, qs[j]);
    }
  }
}

#ifdef BEBOP_VEC
// x as the next position reads it (a bfloat16 state rounded as vput rounds it), written to p unless p is null
inline vec vkeep(float* p, vec x, bool stream) {
  if (p != nullptr) vput(p, x, stream);
  return x;
}
inline vec vkeep(uint16_t* p, vec x, bool stream) {
  const vbits bits = bf16_bits(x);
  if (p != nullptr) put_bits(p, bits, stream);
  return widen_bits(bits);
}

// A chunk's tile r (a chunk of several positions), NB vectors of value columns at a time: a (Dk, NB x kVec)
// block of the state stays in L1 over every position, and a position's update and the next position's read are one
// pass over it (the NB column groups' sums are independent chains, which hides the FMA latency). Each position's
// states are written as they are computed (streamed where `stream`: nothing reads them back here), or the last
// only (end_only). Per position and column it is the arithmetic of read_tile, the delta and update_row (same
// operations, same order), so the states are bit for bit those of the per-position path, which a decode step takes.
template <int NB, typename S>
void block_tile(const Chunk<S>& c, int64_t r, vec* block, float* qk, bool stream) {
  const int64_t dk = c.dk, dv = c.dv, t_len = c.t, tile = dk * dv;
  const S* init = c.state + r * tile;
  auto states_at = [&](int64_t t) { return c.states + ((c.end_only ? 0 : t) * c.rows + r) * tile; };
  for (int64_t t = 0; t < t_len; ++t) {
    const float *qt = c.q + (r * t_len + t) * dk, *kt = c.k + (r * t_len + t) * dk;
    float sum = 0.f;
    for (int64_t i = 0; i < dk; ++i) sum = std::fma(qt[i], kt[i], sum);
    qk[t] = sum;
  }
  for (int64_t j0 = 0; j0 < dv; j0 += kVec * NB) {
    vec ks[NB], qs[NB], delta[NB];
    for (int u = 0; u < NB; ++u) ks[u] = qs[u] = vzero();
    const float *k0 = c.k + r * t_len * dk, *q0 = c.q + r * t_len * dk;
    for (int64_t i = 0; i < dk; ++i) {
      const vec kv = vset(k0[i]), qv = vset(q0[i]);
#pragma GCC unroll 8
      for (int u = 0; u < NB; ++u) {
        const vec x = vload(init + i * dv + j0 + kVec * u);
        block[i * NB + u] = x;
        ks[u] = vfma(kv, x, ks[u]);
        qs[u] = vfma(qv, x, qs[u]);
      }
    }
    for (int64_t t = 0; t < t_len; ++t) {
      const int64_t at = r * t_len + t;
      const vec ev = vset(std::exp(c.g[at])), bv = vset(c.beta[at]), qkv = vset(qk[t]);
      for (int u = 0; u < NB; ++u) {
        const int64_t j = j0 + kVec * u;
        delta[u] = vmul(vfnma(ev, ks[u], vload(c.v + at * dv + j)), bv);
        vstore(c.out + at * dv + j, vfma(ev, qs[u], vmul(qkv, delta[u])));
      }
      const float* kt = c.k + at * dk;
      if (t + 1 == t_len) {
        S* dst = states_at(t) + j0;
        for (int64_t i = 0; i < dk; ++i) {
          const vec kv = vset(kt[i]);
#pragma GCC unroll 8
          for (int u = 0; u < NB; ++u)
            vput(dst + i * dv + kVec * u, vfma(ev, block[i * NB + u], vmul(kv, delta[u])), stream);
        }
        break;
      }
      S* dst = c.end_only ? nullptr : states_at(t) + j0;
      const float *kn = kt + dk, *qn = c.q + (at + 1) * dk;
      for (int u = 0; u < NB; ++u) ks[u] = qs[u] = vzero();
      for (int64_t i = 0; i < dk; ++i) {
        const vec kv = vset(kt[i]), knv = vset(kn[i]), qnv = vset(qn[i]);
#pragma GCC unroll 8
        for (int u = 0; u < NB; ++u) {
          const vec x = vkeep(dst == nullptr ? nullptr : dst + i * dv + kVec * u,
                                  vfma(ev, block[i * NB + u], vmul(kv, delta[u])), stream);
          block[i * NB + u] = x;
          ks[u] = vfma(knv, x, ks[u]);
          qs[u] = vfma(qnv, x, qs[u]);
        }
      }
    }
  }
}
#endif

// The tiles [begin, end) over every position of the chunk. DV > 0: the width at compile time (the
// accumulators stay in registers); DV == 0: c.dv at run time.
template <int64_t DV, typename S>
void run_tiles(const Chunk<S>& c, int64_t begin, int64_t end, bool stream) {
  const int64_t dv = DV > 0 ? DV : c.dv, dk = c.dk, tile = dk * dv;
  constexpr int64_t width = DV > 0 ? DV : kMaxDv;
  alignas(64) float ks[width], qs[width], delta[width];
  alignas(64) S line[width];
  std::vector<S> between(c.end_only ? dk * dv : 0);  // the tile after positions before the last (end_only)
  for (int64_t r = begin; r < end; ++r) {
    const S* prev = c.state + r * tile;
    const S* next_tile = r + 1 < end ? c.state + (r + 1) * tile : nullptr;
    for (int64_t t = 0; t < c.t; ++t) {
      const int64_t at = r * c.t + t;  // (row, head, position)
      const float *qt = c.q + at * dk, *kt = c.k + at * dk, *vt = c.v + at * dv;
      const float e = std::exp(c.g[at]), b = c.beta[at];
      const bool last = t == c.t - 1;  // earlier positions' states are read again at once: keep them cached
      S* nxt = c.end_only ? (last ? c.states + r * tile : between.data()) : c.states + (t * c.rows + r) * tile;
      float qk = 0.f;
      for (int64_t i = 0; i < dk; ++i) qk = std::fma(qt[i], kt[i], qk);
      read_tile<DV>(prev, kt, qt, dk, dv, ks, qs);
      float* o = c.out + at * dv;
      for (int64_t j = 0; j < dv; ++j) {
        delta[j] = std::fma(-e, ks[j], vt[j]) * b;
        o[j] = std::fma(e, qs[j], qk * delta[j]);
      }
      for (int64_t i = 0; i < dk; ++i) {
        if (last && next_tile != nullptr)
          for (int64_t j = 0; j < dv * int64_t(sizeof(S)); j += 64)
            __builtin_prefetch(reinterpret_cast<const char*>(next_tile + i * dv) + j, 0, 2);
        update_row(nxt + i * dv, prev + i * dv, delta, e, kt[i], dv, stream && last, line);
      }
      prev = nxt;
    }
  }
#if defined(__AVX512F__) || defined(__AVX__)
  if (stream) _mm_sfence();
#endif
}

template <typename S>
void run(const Chunk<S>& c) {
  const int64_t row_bytes = c.dv * int64_t(sizeof(S));
  const int64_t grain = grain_for(3 * c.t * c.dk * c.dv);  // a row's work: the state read, updated, read out
  const bool stream = kStreamBytes > 0 && row_bytes % kStreamBytes == 0 &&
                      reinterpret_cast<std::uintptr_t>(c.states) % kStreamBytes == 0;
#ifdef BEBOP_VEC
  // a verify or a prefill: the column blocks (with AVX2 for float32 states only: rounding a bfloat16 state there takes
  // more instructions than its update, and the per-position path rounds each value once)
  if (c.t > 1 && c.dv % kVec == 0 && (kVec == 16 || std::is_same_v<S, float>)) {
    parallel_blocks(c.rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<vec> block(c.dk * 4);  // (Dk, NB) vectors
      std::vector<float> qk(c.t);
      for (int64_t r = begin; r < end; ++r) {
        if (c.dv % (4 * kVec) == 0) block_tile<4>(c, r, block.data(), qk.data(), stream);
        else block_tile<1>(c, r, block.data(), qk.data(), stream);
      }
      if (stream) _mm_sfence();
    });
    return;
  }
#endif
  parallel_blocks(c.rows, grain, [&](int64_t begin, int64_t end) {
    switch (c.dv) {
      case 64: run_tiles<64>(c, begin, end, stream); break;
      case 128: run_tiles<128>(c, begin, end, stream); break;
      case 256: run_tiles<256>(c, begin, end, stream); break;
      default: run_tiles<0>(c, begin, end, stream);
    }
  });
}

void gdn_recurrent(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                   const at::Tensor& beta, const at::Tensor& state, const at::Tensor& states, const at::Tensor& out) {
  const int64_t b = k.size(0), h = k.size(1), t = k.size(2), dk = k.size(3), dv = v.size(3);
  for (const at::Tensor* x : {&q, &k, &v, &g, &beta, &state, &states, &out}) {
    TORCH_CHECK(x->is_contiguous() && x->device().is_cpu(), "gdn_recurrent: contiguous CPU tensors expected");
  }
  for (const at::Tensor* x : {&q, &k, &v, &g, &beta, &out})
    TORCH_CHECK(x->scalar_type() == at::kFloat, "gdn_recurrent: float32 operands expected");
  const auto kind = state.scalar_type();
  TORCH_CHECK((kind == at::kFloat || kind == at::kBFloat16) && states.scalar_type() == kind,
              "gdn_recurrent: float32 or bfloat16 states, the same for state and states");
  TORCH_CHECK(q.sizes() == k.sizes() && v.sizes() == at::IntArrayRef({b, h, t, dv}), "gdn_recurrent: q, k, v shapes");
  TORCH_CHECK(g.sizes() == at::IntArrayRef({b, h, t}) && beta.sizes() == g.sizes(), "gdn_recurrent: g, beta shapes");
  TORCH_CHECK(state.sizes() == at::IntArrayRef({b, h, dk, dv}), "gdn_recurrent: state shape");
  const bool end_only = t > 1 && states.size(0) == 1;
  TORCH_CHECK(states.sizes() == at::IntArrayRef({end_only ? 1 : t, b, h, dk, dv}) && out.sizes() == v.sizes(),
              "gdn_recurrent: outputs");
  TORCH_CHECK(dv <= kMaxDv, "gdn_recurrent: value head dim above ", kMaxDv);
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *gp = g.data_ptr<float>(), *bp = beta.data_ptr<float>();
  if (kind == at::kFloat) {
    run(Chunk<float>{qp, kp, vp, gp, bp, state.data_ptr<float>(), states.data_ptr<float>(), out.data_ptr<float>(),
                     b * h, t, dk, dv, end_only});
  } else {
    run(Chunk<uint16_t>{qp, kp, vp, gp, bp, reinterpret_cast<const uint16_t*>(state.data_ptr<at::BFloat16>()),
                        reinterpret_cast<uint16_t*>(states.data_ptr<at::BFloat16>()), out.data_ptr<float>(),
                        b * h, t, dk, dv, end_only});
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bebop_native, m) {
  m.def("gdn_recurrent(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor state, Tensor(a!) states, "
        "Tensor(b!) out) -> ()");
}

TORCH_LIBRARY_IMPL(bebop_native, CPU, m) { m.impl("gdn_recurrent", &gdn_recurrent); }
