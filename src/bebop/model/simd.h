// The CPU kernels' vector layer: one vector of float32 lanes, AVX-512's 16 or AVX2's 8 (with FMA), under a few
// names, so that a kernel's vector code is written once. Each lane's arithmetic is the scalar code's (fused
// multiply-adds written out; the library is built with -ffp-contract=off). BEBOP_VEC is defined (the lanes) where
// one of the two is there; elsewhere the kernels keep their scalar code.
#pragma once

#include <cstdint>
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <sleef.h>  // torch's vector exp (libtorch_cpu exports it)
#endif

#if defined(__AVX__)
inline float sum8(__m256 x) {  // eight lanes' sum: halves, then quarters, then the last two
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

#if defined(__AVX512F__)
#define BEBOP_VEC 16
using vec = __m512;
using vbits = __m256i;  // a vector's bfloat16 bits
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vset(float x) { return _mm512_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }    // a b + c
inline vec vfnma(vec a, vec b, vec c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vec x) { _mm512_storeu_ps(p, x); }
inline vec widen_bits(vbits bits) {  // bfloat16 -> float32
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
inline vec vload(const uint16_t* p) { return widen_bits(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline vbits bf16_bits(vec x) {  // to_bf16 on every lane
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC00000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}
inline void put_bits(uint16_t* p, vbits bits, bool stream) {
  if (stream) _mm256_stream_si256(reinterpret_cast<__m256i*>(p), bits);
  else _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
}
inline void vput(float* p, vec x, bool stream) { stream ? _mm512_stream_ps(p, x) : _mm512_storeu_ps(p, x); }
inline vec vsub(vec a, vec b) { return _mm512_sub_ps(a, b); }
inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
inline vec vexp(vec x) { return Sleef_expf16_u10avx512f(x); }  // within 1 ulp, lane by lane
inline vec vmax(vec x, vec m) { return _mm512_max_ps(x, m); }  // lane by lane; m where x is NaN
inline vec vhide(vec x, const bool* seen, float hidden) {  // x where seen (a vector's bools), else hidden
  const __mmask16 off = _mm512_cmpeq_epi32_mask(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(seen))),
                                                _mm512_setzero_si512());
  return _mm512_mask_mov_ps(x, off, _mm512_set1_ps(hidden));
}
inline float vtop(vec x) { return _mm512_reduce_max_ps(x); }
inline float vsum(vec x) {  // the lanes' sum, always in the same order: halves added, then as AVX2's
  return sum8(_mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
}
#elif defined(__AVX2__) && defined(__FMA__)
#define BEBOP_VEC 8
using vec = __m256;
using vbits = __m128i;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vset(float x) { return _mm256_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec vfnma(vec a, vec b, vec c) { return _mm256_fnmadd_ps(a, b, c); }
inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vec x) { _mm256_storeu_ps(p, x); }
inline vec widen_bits(vbits bits) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16)); }
inline vec vload(const uint16_t* p) { return widen_bits(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline vbits bf16_bits(vec x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC00000), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
  r = _mm256_srli_epi32(r, 16);  // each lane's bits below 2^16: the unsigned pack keeps them
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8));
}
inline void put_bits(uint16_t* p, vbits bits, bool stream) {
  if (stream) _mm_stream_si128(reinterpret_cast<__m128i*>(p), bits);
  else _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bits);
}
inline void vput(float* p, vec x, bool stream) { stream ? _mm256_stream_ps(p, x) : _mm256_storeu_ps(p, x); }
inline vec vsub(vec a, vec b) { return _mm256_sub_ps(a, b); }
inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
inline vec vexp(vec x) { return Sleef_expf8_u10avx2(x); }
inline vec vmax(vec x, vec m) { return _mm256_max_ps(x, m); }
inline vec vhide(vec x, const bool* seen, float hidden) {
  const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(seen)));
  return _mm256_blendv_ps(x, _mm256_set1_ps(hidden), _mm256_castsi256_ps(_mm256_cmpeq_epi32(bytes, _mm256_setzero_si256())));
}
inline float vtop(vec x) {  // the lanes' max
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
inline float vsum(vec x) { return sum8(x); }
#endif

#ifdef BEBOP_VEC
constexpr int64_t kVec = BEBOP_VEC;
// a vector's values stored (a bfloat16 state rounded as torch rounds), streamed past the cache when asked (p aligned
// to the values' bytes: the caller checked)
inline void vput(uint16_t* p, vec x, bool stream) { put_bits(p, bf16_bits(x), stream); }
#endif
