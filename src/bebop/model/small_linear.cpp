// A float32 linear layer over a few rows (a decode step's or a verify's tokens at a small batch), as a CPU kernel.
//
//     y = small_linear(x, weight, bias)   // x (..., K), weight (N, K), bias (N) or none -> y (..., N)
//
// At one to a few rows a product reads far more weight than it computes with; a general matmul library prices each
// call for large products, and on CPUs it does not tune for (AVX2 EPYCs) its one-to-eight-row calls cost several
// times the time the weight takes to stream. Here each block of output features is read once for all the rows: the
// rows' dot products with that block accumulate lane by lane over K in one pass, so a product of four rows costs
// about what one does. Each (row, feature) sum is formed the same way whatever the other rows are (its lanes in K
// order, then the lanes' sum in a fixed order, then the scalar tail, then the bias), so a row's numbers depend neither
// on the batch nor on the chunk: a verify's position gets the numbers a decode step would. More rows than kMaxRows,
// another dtype or a layout the kernel does not take: torch's own linear, the same call the layer would make.
#include <torch/extension.h>

#include "parallel.h"
#include "simd.h"

namespace {

constexpr int64_t kMaxRows = 8;  // rows the kernel takes; more go to torch's matmul (packed_linear.py: SMALL_ROWS)
constexpr int kCols = 4;         // output features a block (each read once for all the rows)
static_assert(kCols == 4, "small_linear's block switch names each width up to kCols");
constexpr int kRowStep = 2;      // rows accumulated together: kCols x kRowStep vectors of sums, in registers

// y[r, n] for rows [0, R) and features [n0, n0 + C): R x C vectors of sums, held in registers (R and C known to the
// compiler), each weight vector loaded once for the R rows
template <int R, int C>
inline void dot_block(const float* x, const float* w, int64_t n0, int64_t k_dim, const float* bias, float* y,
                      int64_t n_dim) {
  int64_t k = 0;
  float sums[R][C] = {};
#ifdef BEBOP_VEC
  vec acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = vzero();
  for (; k + kVec <= k_dim; k += kVec) {
    vec xs[R];
    for (int r = 0; r < R; ++r) xs[r] = vload(x + r * k_dim + k);
    for (int c = 0; c < C; ++c) {
      const vec wv = vload(w + (n0 + c) * k_dim + k);
      for (int r = 0; r < R; ++r) acc[r][c] = vfma(xs[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) sums[r][c] = vsum(acc[r][c]);
#endif
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = sums[r][c];
      const float* wr = w + (n0 + c) * k_dim;
      for (int64_t j = k; j < k_dim; ++j) s += x[r * k_dim + j] * wr[j];  // the tail past the last whole vector
      y[r * n_dim + n0 + c] = bias ? s + bias[n0 + c] : s;
    }
}

// rows [0, rows) of features [n0, n0 + cols), cols <= kCols: the rows in steps of kRowStep (then one), the block's
// weights staying in cache from one step to the next
template <int C>
inline void block_rows(const float* x, int64_t rows, const float* w, int64_t n0, int64_t k_dim, const float* bias,
                       float* y, int64_t n_dim) {
  int64_t r = 0;
  for (; r + kRowStep <= rows; r += kRowStep)
    dot_block<kRowStep, C>(x + r * k_dim, w, n0, k_dim, bias, y + r * n_dim, n_dim);
  for (; r < rows; ++r) dot_block<1, C>(x + r * k_dim, w, n0, k_dim, bias, y + r * n_dim, n_dim);
}

bool takes(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const int64_t k_dim = weight.size(-1);
  return x.device().is_cpu() && x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
         weight.dim() == 2 && weight.is_contiguous() && x.size(-1) == k_dim && k_dim > 0 &&
         x.numel() / k_dim <= kMaxRows &&
         (!bias.has_value() || (bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                                bias->numel() == weight.size(0)));
}

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  if (!takes(x, weight, bias)) return at::linear(x, weight, bias);
  const int64_t k_dim = weight.size(1), n_dim = weight.size(0), rows = x.numel() / k_dim;
  const at::Tensor xc = x.reshape({rows, k_dim}).contiguous();  // (M, K)
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n_dim;
  at::Tensor y = at::empty(shape, x.options());  // (..., N)
  if (rows == 0) return y;
  const float* xp = xc.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t blocks = (n_dim + kCols - 1) / kCols;
  parallel_blocks(blocks, grain_for(rows * kCols * k_dim), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * kCols;
      switch (std::min<int64_t>(kCols, n_dim - n0)) {  // a last block of fewer features
        case 4: block_rows<4>(xp, rows, wp, n0, k_dim, bp, yp, n_dim); break;
        case 3: block_rows<3>(xp, rows, wp, n0, k_dim, bp, yp, n_dim); break;
        case 2: block_rows<2>(xp, rows, wp, n0, k_dim, bp, yp, n_dim); break;
        default: block_rows<1>(xp, rows, wp, n0, k_dim, bp, yp, n_dim);
      }
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(bebop_native, m) {
  m.def("small_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(bebop_native, CPU, m) { m.impl("small_linear", &small_linear); }
