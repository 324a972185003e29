// The CUDA kernels one at a time against host references of the same function (no model, no
// chaos from a random network carrying a rounding step through its layers):
//   - the int8 products (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): the input quantized per block as the
//     kernels do (d = max|x| / 127, q = round-to-nearest-even(x / d)), the weights dequantized
//     by the CPU's reference (ggml's rules), summed in double: the kernels' integer dot products
//     are the same sums, so only float rounding of the scales differs (~1e-6 relative);
//   - BF16 products on tensor cores (16 rows and more) and on CUDA cores (fewer) with the
//     input rounded to bf16, against double sums of the same bf16 values;
//   - prompt attention on tensor cores (flash) and on CUDA cores, head dimensions 16 to 256,
//     full and sliding windows, ring caches, rows not starting at 0, against a double
//     softmax: the CUDA-core kernel in float (tight), flash with q, k, v rounded to bf16 as
//     it rounds them and P rounded to bf16 in its products (bound below), and flash with P
//     and V in fp16 (cuda::set_flash_f16, the default; DORY_CUDA_FLASH_F16=0: bf16), each
//     with the keys staged once a pass (cuda::set_flash_stage) and converted per tile;
//   - Q8_0 / Q4_0 / Q4_K prompts on int8 tensor cores (mma m16n8k32 s8), the same integer sums;
//   - the int8 decode fusions: a product whose input's norm comes from a sum (in_sum), and
//     swiglu_quant (swiglu, the int8 quants of the result, its sum of squares), and the nGPT
//     residual in a decode product's epilogue (cuda::Residual) against the row kernel.
// Exit 0: all within bounds; 1: a failure (each case prints its error); 77: no CUDA device
// (ctest lists the test as skipped). Run: build/test_cuda_kernels (ctest -L gpu).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

namespace {

using namespace dory;

int g_fail = 0;

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error at %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <class T>
T* up(const std::vector<T>& v) {
  T* p = nullptr;
  ck(cudaMalloc(&p, std::max<size_t>(1, v.size() * sizeof(T))), "cudaMalloc");
  ck(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return p;
}

template <class T>
std::vector<T> down(const T* p, size_t n) {
  std::vector<T> v(n);
  ck(cudaDeviceSynchronize(), "sync");
  ck(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return v;
}

void report(const std::string& what, double err, double bound) {
  const bool ok = std::isfinite(err) && err <= bound;
  std::printf("  %-64s err %.3e  bound %.1e  %s\n", what.c_str(), err, bound, ok ? "ok" : "FAIL");
  if (!ok) ++g_fail;
}

float bf16_round(float v) {  // round to nearest even (finite inputs), as __float2bfloat16_rn
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&v, &u, 4);
  return v;
}

// ---- products ----

// The kernels' input quantization (kernels.cu, warp_quant_block), on the host.
void quant_blocks(const float* x, int64_t n, int B, std::vector<float>& xq) {
  xq.resize(n);
  for (int64_t b = 0; b < n; b += B) {
    float amax = 0;
    for (int j = 0; j < B; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < B; ++j) {
      int v = static_cast<int>(std::nearbyint(x[b + j] * id));
      v = std::min(127, std::max(-127, v));
      xq[b + j] = static_cast<float>(v) * d;
    }
  }
}

cuda::DevMat upload_mat(DType t, const std::vector<uint8_t>& blocks, int64_t rows, int64_t cols) {
  cuda::DevMat d;
  d.dtype = static_cast<int>(t);
  d.rows = rows, d.cols = cols;
  std::vector<uint8_t> packed(blocks.size());
  if (t == DType::Q8_0 || t == DType::Q4_0) {
    cuda::repack_blocks(d.dtype, blocks.data(), rows, cols, packed.data());
    d.data = up(packed);
    d.scales = static_cast<const uint8_t*>(d.data) + rows * cols / (t == DType::Q8_0 ? 1 : 2);
  } else if (t == DType::Q6_K) {
    cuda::repack_q6_k(blocks.data(), rows, cols, packed.data());
    d.data = up(packed);
    d.scales = static_cast<const uint8_t*>(d.data) + rows * (cols / 256) * 192;
  } else {
    d.data = up(blocks);
  }
  return d;
}

const char* g_variant = "";  // appended to the product cases' labels (e.g. ", ldmatrix")
bool g_unstaged = false;     // attention cases: flash converting each tile per block (set_flash_stage off)

void product_case(DType t, int64_t rows, int64_t cols, int T, std::mt19937& rng) {
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::vector<float> w(rows * cols), x(T * cols);
  for (float& v : w) v = N(rng) * 0.05f;
  for (float& v : x) v = N(rng);
  const bool half = t == DType::BF16;
  std::vector<uint8_t> blocks(row_bytes(t, cols) * rows);
  for (int64_t r = 0; r < rows; ++r) quantize_row(t, w.data() + r * cols, blocks.data() + r * row_bytes(t, cols), cols);
  std::vector<float> wd(rows * cols);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(t, blocks.data() + r * row_bytes(t, cols), wd.data() + r * cols, cols);
  const cuda::DevMat m = upload_mat(t, blocks, rows, cols);
  const int B = dtype_block_elems(t) == 256 ? 256 : 32;
  const cuda::Act act = half ? cuda::Act::Bf16 : B == 256 ? cuda::Act::Block256 : cuda::Act::Block32;
  float* dx = up(x);
  std::vector<float> zeros(T * rows, 0.0f);
  float* dy = up(zeros);
  std::vector<uint8_t> scratch_h(T * cols * 4 + 1024);
  void* scratch = up(scratch_h);
  cuda::linear(m, dx, T, dy, act, scratch);
  const std::vector<float> y = down(dy, T * rows);
  double worst = 0;
  std::vector<float> xq;
  for (int t0 = 0; t0 < T; ++t0) {
    const float* xr = x.data() + t0 * cols;
    if (half) {
      xq.assign(xr, xr + cols);
      for (float& v : xq) v = bf16_round(v);
    } else {
      quant_blocks(xr, cols, B, xq);
    }
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < cols; ++c) {
        s += static_cast<double>(wd[r * cols + c]) * xq[c];
        a += std::fabs(static_cast<double>(wd[r * cols + c]) * xq[c]);
      }
      worst = std::max(worst, std::fabs(y[t0 * rows + r] - s) / std::max(a, 1e-30));
    }
  }
  char what[128];
  const bool tc = T >= 16 && (half || t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_K);
  std::snprintf(what, sizeof what, "linear %s %lldx%lld, %d input rows%s%s", dtype_name(t), (long long)rows,
                (long long)cols, T, tc ? (half ? " (tensor cores" : " (int8 tensor cores") : "",
                tc ? (std::string(g_variant) + ")").c_str() : "");
  // Relative to sum |w x|: float products and sums of 256-4096 terms, ~1e-6; a wrong block,
  // scale or lane moves a row by ~1e-1 of it.
  report(what, worst, 1e-4);
  cudaFree(dx), cudaFree(dy), cudaFree(scratch), cudaFree(const_cast<void*>(m.data));
}

// CMF q8_2f (Q8_0 rows with column scales), its input quantized inside the product
// (cuda::q8_col_in_kernel): two matrices of one width in one launch, each with its own column
// scales; reference: x * col in float, quantized per block of 32 (the CPU's order), times the
// dequantized rows. The same integer sums as a plain Q8_0 product, so the same bound.
void col_scaled_case(int64_t rows, int64_t cols, int T, std::mt19937& rng) {
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::uniform_real_distribution<float> U(0.25f, 4.0f);
  std::vector<float> x(T * cols);
  for (float& v : x) v = N(rng);
  const int64_t rb = row_bytes(DType::Q8_0, cols);
  std::vector<uint8_t> blocks[2];
  std::vector<float> wd[2], col[2];
  cuda::DevMat m[2];
  float* dy[2];
  std::vector<float> zeros(T * rows, 0.0f);
  for (int i = 0; i < 2; ++i) {
    std::vector<float> w(rows * cols);
    for (float& v : w) v = N(rng) * 0.05f;
    blocks[i].resize(rb * rows);
    wd[i].resize(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(DType::Q8_0, w.data() + r * cols, blocks[i].data() + r * rb, cols);
      dequantize_row(DType::Q8_0, blocks[i].data() + r * rb, wd[i].data() + r * cols, cols);
    }
    col[i].resize(cols);
    for (float& v : col[i]) v = U(rng);
    m[i] = upload_mat(DType::Q8_0, blocks[i], rows, cols);
    m[i].col_scale = up(col[i]);
    dy[i] = up(zeros);
  }
  float* dx = up(x);
  cuda::linear_multi(m, dy, 2, dx, T, cuda::Act::Block32, nullptr, false);
  double worst = 0;
  std::vector<float> xs(cols), xq;
  for (int i = 0; i < 2; ++i) {
    const std::vector<float> y = down(dy[i], T * rows);
    for (int t0 = 0; t0 < T; ++t0) {
      for (int64_t c = 0; c < cols; ++c) xs[c] = x[t0 * cols + c] * col[i][c];
      quant_blocks(xs.data(), cols, 32, xq);
      for (int64_t r = 0; r < rows; ++r) {
        double sum = 0, a = 0;
        for (int64_t c = 0; c < cols; ++c) {
          sum += static_cast<double>(wd[i][r * cols + c]) * xq[c];
          a += std::fabs(static_cast<double>(wd[i][r * cols + c]) * xq[c]);
        }
        worst = std::max(worst, std::fabs(y[t0 * rows + r] - sum) / std::max(a, 1e-30));
      }
    }
    cudaFree(dy[i]), cudaFree(const_cast<void*>(m[i].data)), cudaFree(const_cast<float*>(m[i].col_scale));
  }
  char what[128];
  std::snprintf(what, sizeof what, "linear q8_2f (Q8_0 + column scales) 2 x %lldx%lld, %d input rows",
                (long long)rows, (long long)cols, T);
  report(what, worst, 1e-4);
  cudaFree(dx);
}

// Decode into an int8 product with the input's norm still to be taken (LinJob::in_sum): the
// product quantizes the un-normalised row and scales its sums by 1 / sqrt(sum x^2 + 1e-6).
// Reference: the row normalised first, then quantized (the CPU's order). The quants are the
// same (int8 quantization is scale-invariant) except where x / d lies within float rounding of
// a half step, where one quant moves by one: ~1/127 of one of 256-1024 terms, so the bound is
// 1e-3 of sum |w x| rather than the plain products' 1e-4.
void decode_norm_case(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::vector<float> w(rows * cols), x(cols);
  for (float& v : w) v = N(rng) * 0.05f;
  double ss = 0;
  for (float& v : x) v = N(rng) * 7.3f, ss += static_cast<double>(v) * v;
  std::vector<uint8_t> blocks(row_bytes(t, cols) * rows);
  for (int64_t r = 0; r < rows; ++r) quantize_row(t, w.data() + r * cols, blocks.data() + r * row_bytes(t, cols), cols);
  std::vector<float> wd(rows * cols);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(t, blocks.data() + r * row_bytes(t, cols), wd.data() + r * cols, cols);
  const cuda::DevMat m = upload_mat(t, blocks, rows, cols);
  const int B = dtype_block_elems(t) == 256 ? 256 : 32;
  float* dx = up(x);
  std::vector<float> zeros(rows, 0.0f);
  float* dy = up(zeros);
  std::vector<uint8_t> scratch_h(cols * 4 + 1024);
  void* scratch = up(scratch_h);
  double* dsum = up(std::vector<double>{ss});
  cuda::linear(m, dx, 1, dy, B == 256 ? cuda::Act::Block256 : cuda::Act::Block32, scratch, false, dsum);
  const std::vector<float> y = down(dy, rows);
  std::vector<float> xn(cols), xq;
  const float inv = static_cast<float>(1.0 / std::sqrt(ss + 1e-6));
  for (int64_t c = 0; c < cols; ++c) xn[c] = x[c] * inv;
  quant_blocks(xn.data(), cols, B, xq);
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0, a = 0;
    for (int64_t c = 0; c < cols; ++c) {
      s += static_cast<double>(wd[r * cols + c]) * xq[c];
      a += std::fabs(static_cast<double>(wd[r * cols + c]) * xq[c]);
    }
    worst = std::max(worst, std::fabs(y[r] - s) / std::max(a, 1e-30));
  }
  char what[128];
  std::snprintf(what, sizeof what, "linear %s %lldx%lld, decode, norm from the sum", dtype_name(t),
                (long long)rows, (long long)cols);
  report(what, worst, 1e-3);
  cudaFree(dx), cudaFree(dy), cudaFree(scratch), cudaFree(dsum), cudaFree(const_cast<void*>(m.data));
}

// The nGPT residual in a decode product's epilogue (cuda::Residual: the last warp mixes it)
// against the same product followed by the row kernel (ngpt_residual) on the device: the same
// float arithmetic over sums of squares taken in another order (one warp against a block, in
// double), so x within a few float ulps (2e-6 of its largest element) and the quants for the
// next product (blocks of nb) the same but where an input sits within that of a rounding
// step (at most 1 in 1,000 quants). Run three times in a row: the ticket counter must come
// back to zero.
void residual_case(DType t, int64_t n, int64_t cols, int nb, std::mt19937& rng) {
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::vector<float> w(n * cols), xin(cols), x0(n), alpha(n);
  for (float& v : w) v = N(rng) * 0.05f;
  for (float& v : xin) v = N(rng);
  for (float& v : x0) v = N(rng);
  for (float& v : alpha) v = 0.05f + 0.1f * std::fabs(N(rng));
  const bool half = t == DType::BF16;
  std::vector<uint8_t> blocks(row_bytes(t, cols) * n);
  for (int64_t r = 0; r < n; ++r) quantize_row(t, w.data() + r * cols, blocks.data() + r * row_bytes(t, cols), cols);
  const cuda::DevMat m = upload_mat(t, blocks, n, cols);
  const int B = dtype_block_elems(t) == 256 ? 256 : 32;
  const cuda::Act act = half ? cuda::Act::Bf16 : B == 256 ? cuda::Act::Block256 : cuda::Act::Block32;
  float *dxin = up(xin), *da = up(alpha);
  std::vector<float> zeros(n, 0.0f);
  float *dy = up(zeros), *dxa = up(x0), *dxb = up(x0);
  std::vector<uint8_t> scratch_h(cols * 4 + n * 4 + 1024);
  void *sa = up(scratch_h), *sb = up(scratch_h);
  unsigned* cnt = up(std::vector<unsigned>{0u});
  const cuda::Act nact = nb == 256 ? cuda::Act::Block256 : nb == 32 ? cuda::Act::Block32 : cuda::Act::Float;
  int64_t qbad = 0;
  double worst = 0;
  for (int round = 0; round < 3; ++round) {
    // Reference: the product, then the row kernel quantizing x into scratch b.
    cuda::linear(m, dxin, 1, dy, act, sb);
    const cuda::QOut qb = nb ? cuda::act_layout(nact, sb, 1, n) : cuda::QOut{};
    cuda::ngpt_residual(dxb, dy, da, 1, n, qb);
    // Fused: scratch a holds the product's input quants, then the residual's.
    cuda::Residual res;
    res.x = dxa, res.alpha = da, res.counter = cnt;
    if (nb) res.qo = cuda::act_layout(nact, sa, 1, n);
    cuda::linear(m, dxin, 1, dy, act, sa, false, nullptr, &res);
    const std::vector<float> xa = down(dxa, n), xb = down(dxb, n);
    float mx = 0;
    for (float v : xb) mx = std::max(mx, std::fabs(v));
    for (int64_t i = 0; i < n; ++i) worst = std::max(worst, static_cast<double>(std::fabs(xa[i] - xb[i])) / mx);
    if (nb) {
      const std::vector<int8_t> qa = down(res.qo.q, n), qr = down(qb.q, n);
      for (int64_t i = 0; i < n; ++i) qbad += qa[i] != qr[i];
    }
  }
  const unsigned left = down(cnt, 1)[0];
  char what[160];
  std::snprintf(what, sizeof what, "residual in the %s %lldx%lld decode product (next quants: %d)", dtype_name(t),
                (long long)n, (long long)cols, nb);
  report(std::string(what) + ": x", worst, 2e-6);
  report(std::string(what) + ": quants differing (3 rounds)", static_cast<double>(qbad), 3.0 * n / 1000);
  report(std::string(what) + ": counter left", static_cast<double>(left), 0);
  cudaFree(dxin), cudaFree(da), cudaFree(dy), cudaFree(dxa), cudaFree(dxb), cudaFree(sa), cudaFree(sb), cudaFree(cnt);
  cudaFree(const_cast<void*>(m.data));
}

// swiglu_quant: v = silu(g sg) (u su) in float as the kernel computes it, its quants and block
// scales exactly the host quantization of the v the kernel wrote, the sum of squares to
// double rounding. col: the quants are of v times a q8_2f down product's column scales (QOut::col).
void swiglu_quant_case(int64_t f, int B, std::mt19937& rng, bool col = false) {
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::vector<float> g(f), u(f), sg(f), su(f), cs(f, 1.0f);
  for (int64_t i = 0; i < f; ++i) g[i] = N(rng) * 2, u[i] = N(rng), sg[i] = 1 + 0.3f * N(rng), su[i] = 1 + 0.3f * N(rng);
  if (col)
    for (float& c : cs) c = std::exp(0.5f * N(rng));
  float *dg = up(g), *du = up(u), *dsg = up(sg), *dsu = up(su), *dcs = up(cs);
  std::vector<int8_t> q0(f, 0);
  std::vector<float> d0(f / B, 0.0f);
  int8_t* dq = up(q0);
  float* dd = up(d0);
  double* dsum = up(std::vector<double>{0.0});
  cuda::swiglu_quant(dg, du, dsg, dsu, f, {B, dq, dd, col ? dcs : nullptr}, dsum);
  const std::vector<float> v = down(dg, f);
  const std::vector<int8_t> q = down(dq, f);
  const std::vector<float> d = down(dd, f / B);
  const double sum = down(dsum, 1)[0];
  double ev = 0, ss = 0;
  for (int64_t i = 0; i < f; ++i) {
    const float a = g[i] * sg[i];
    const double ref = static_cast<double>(a) / (1.0 + std::exp(-static_cast<double>(a))) * (u[i] * su[i]);
    ev = std::max(ev, std::fabs(v[i] - ref) / (std::fabs(ref) + 1e-3));
    ss += static_cast<double>(v[i]) * v[i];
  }
  int64_t qbad = 0;
  for (int64_t b = 0; b < f / B; ++b) {
    float amax = 0;
    for (int j = 0; j < B; ++j) amax = std::max(amax, std::fabs(col ? v[b * B + j] * cs[b * B + j] : v[b * B + j]));
    const float dref = amax / 127.0f, id = dref != 0 ? 1.0f / dref : 0.0f;
    if (d[b] != dref) ++qbad;
    for (int j = 0; j < B; ++j) {
      const float x = col ? v[b * B + j] * cs[b * B + j] : v[b * B + j];
      int qi = static_cast<int>(std::nearbyint(x * id));
      qi = std::min(127, std::max(-127, qi));
      if (q[b * B + j] != qi) ++qbad;
    }
  }
  char what[128];
  const char* cw = col ? ", column-scaled quants" : "";
  std::snprintf(what, sizeof what, "swiglu_quant %lld wide, blocks of %d%s: values", (long long)f, B, cw);
  report(what, ev, 1e-5);  // expf against exp: a few float ulps
  std::snprintf(what, sizeof what, "swiglu_quant %lld wide, blocks of %d%s: quants, scales differing", (long long)f, B, cw);
  report(what, static_cast<double>(qbad), 0);
  std::snprintf(what, sizeof what, "swiglu_quant %lld wide, blocks of %d%s: sum of squares", (long long)f, B, cw);
  report(what, std::fabs(sum - ss) / ss, 1e-12);
  cudaFree(dg), cudaFree(du), cudaFree(dsg), cudaFree(dsu), cudaFree(dcs), cudaFree(dq), cudaFree(dd), cudaFree(dsum);
}

// ---- attention ----

struct AttnCase {
  int hd, nh, nk, T;
  int64_t start;   // position of the first row
  int64_t window;  // 0: full attention
  bool ring;
};

void attention_case(const AttnCase& a, std::mt19937& rng) {
  std::normal_distribution<float> N(0.0f, 1.0f);
  const int64_t end = a.start + a.T;  // positions [0, end) are in the cache
  const int64_t ring = a.ring ? a.window + a.T + 3 : 0;
  const int64_t cap = a.ring ? ring : end;
  const int64_t w = static_cast<int64_t>(a.nk) * a.hd;
  // Keys at unit length per head, queries scaled so the softmax is neither flat nor one-hot.
  std::vector<float> K(cap * w), V(cap * w), Q(static_cast<int64_t>(a.T) * a.nh * a.hd);
  std::vector<float> kfull(end * w), vfull(end * w);
  for (int64_t p = 0; p < end; ++p)
    for (int h = 0; h < a.nk; ++h) {
      double n2 = 0;
      for (int j = 0; j < a.hd; ++j) {
        kfull[p * w + h * a.hd + j] = N(rng);
        n2 += kfull[p * w + h * a.hd + j] * kfull[p * w + h * a.hd + j];
      }
      for (int j = 0; j < a.hd; ++j) {
        kfull[p * w + h * a.hd + j] /= static_cast<float>(std::sqrt(n2));
        vfull[p * w + h * a.hd + j] = N(rng);
      }
    }
  for (float& v : Q) v = N(rng) * 3.0f;
  // What the cache holds: a ring keeps position p at p % ring (the last `ring` positions).
  for (int64_t p = 0; p < end; ++p) {
    if (a.ring && p < end - ring) continue;
    const int64_t s = a.ring ? p % ring : p;
    std::memcpy(&K[s * w], &kfull[p * w], w * 4);
    std::memcpy(&V[s * w], &vfull[p * w], w * 4);
  }
  float* dk = up(K);
  float* dv = up(V);
  float* dq = up(Q);
  std::vector<cuda::AttnRow> rows(a.T);
  for (int t = 0; t < a.T; ++t) {
    const int64_t pos = a.start + t;
    rows[t] = {dk, dv, ring, pos, a.window ? std::max<int64_t>(0, pos - a.window + 1) : 0};
  }
  cuda::AttnRow* drows = up(rows);
  std::vector<float> zeros(static_cast<int64_t>(a.T) * a.nh * a.hd, 0.0f);
  float* out_flash = up(zeros);
  float* out_core = up(zeros);
  float* out_f16 = up(zeros);
  std::vector<float> part_h(std::max<int64_t>(1, cuda::attention_part_floats(a.T, a.nh, a.hd)));
  float* part = up(part_h);
  std::vector<int> cnt_h(a.T * a.nh, 0);
  int* cnt = up(cnt_h);
  // Staged (keys and values converted once into a scratch, the default) or not (g_unstaged).
  cuda::set_flash_stage(!g_unstaged);
  const int64_t keys = end;
  cuda::set_flash_f16(false);
  const bool flashed = cuda::flash_attention(dq, drows, a.T, a.nh, a.nk, a.hd, out_flash, keys);
  cuda::set_flash_f16(true);  // the default
  cuda::flash_attention(dq, drows, a.T, a.nh, a.nk, a.hd, out_f16, keys);
  cuda::attention(dq, drows, a.T, a.nh, a.nk, a.hd, out_core, part, cnt);
  const std::vector<float> of = down(out_flash, zeros.size()), oc = down(out_core, zeros.size()),
                           oh = down(out_f16, zeros.size());
  // References in double: plain (bf 0); q, k, v rounded to bf16 (1: flash's inputs); q, k in
  // bf16 and v in fp16 (2: DORY_CUDA_FLASH_F16).
  double err_core = 0, err_flash = 0, err_f16 = 0;
  for (int bf = 0; bf < 3; ++bf)
    for (int t = 0; t < a.T; ++t)
      for (int h = 0; h < a.nh; ++h) {
        const int kvh = h / (a.nh / a.nk);
        const int64_t pos = rows[t].pos, lo = rows[t].lo;
        auto r = [&](float v) { return bf ? static_cast<double>(bf16_round(v)) : static_cast<double>(v); };
        auto rv = [&](float v) {
          return bf == 2 ? static_cast<double>(f16_to_f32(f32_to_f16(v))) : r(v);
        };
        const float* q = &Q[(static_cast<int64_t>(t) * a.nh + h) * a.hd];
        std::vector<double> s(pos - lo + 1);
        double mx = -1e300;
        for (int64_t p = lo; p <= pos; ++p) {
          double d = 0;
          for (int j = 0; j < a.hd; ++j) d += r(q[j]) * r(kfull[p * w + kvh * a.hd + j]);
          s[p - lo] = d / std::sqrt(static_cast<double>(a.hd));
          mx = std::max(mx, s[p - lo]);
        }
        double z = 0;
        for (double& v : s) z += (v = std::exp(v - mx));
        for (int j = 0; j < a.hd; ++j) {
          double o = 0;
          for (int64_t p = lo; p <= pos; ++p) o += s[p - lo] * rv(vfull[p * w + kvh * a.hd + j]);
          o /= z;
          const int64_t i = (static_cast<int64_t>(t) * a.nh + h) * a.hd + j;
          if (bf == 2) err_f16 = std::max(err_f16, std::fabs(oh[i] - o));
          else if (bf) err_flash = std::max(err_flash, std::fabs(of[i] - o));
          else err_core = std::max(err_core, std::fabs(oc[i] - o));
        }
      }
  char what[160];
  std::snprintf(what, sizeof what, "attention hd %d, %d/%d heads, %d rows from %lld, window %lld%s%s",
                a.hd, a.nh, a.nk, a.T, (long long)a.start, (long long)a.window, a.ring ? ", ring" : "",
                g_unstaged ? ", unstaged" : "");
  // CUDA cores: float sums and expf against double, outputs of magnitude ~1: 1e-4.
  report(std::string(what) + ": cuda cores", err_core, 1e-4);
  // Flash: P rounded to bf16 (2^-9 relative each) in P V: |sum (p_i e_i) v_i| <= 2^-9 max|v|
  // ~ 8e-3 for |v| <= 4; the online rescaling adds float rounding only. A wrong key, mask,
  // tile or fragment moves outputs by ~1e-1 and more.
  // P and V in fp16 (2^-11 each): a quarter of that bound and more.
  if (flashed) {
    report(std::string(what) + ": flash (tensor cores)", err_flash, 1e-2);
    report(std::string(what) + ": flash, P V in fp16", err_f16, 2.5e-3);
  } else {
    std::printf("  %-64s (flash does not apply)\n", what);
  }
  cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(drows), cudaFree(out_flash), cudaFree(out_core);
  cudaFree(out_f16);
  cudaFree(part), cudaFree(cnt);
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("test_cuda_kernels: skipped: no CUDA device\n");
    return 77;
  }
  cudaStream_t s;
  ck(cudaStreamCreate(&s), "stream");
  cuda::set_stream(s);
  // The first product cases check the first tensor-core kernel: cuBLAS and the ldmatrix kernel,
  // both on by default, are switched on for their own cases below.
  cuda::set_cublas(false);
  cuda::set_tc2(false);
  cuda::set_tc_float_inputs(true);
  cuda::set_tc_int8(true);
  std::mt19937 rng(7);
  try {
    std::printf("products\n");
    for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K})
      for (int T : {1, 3, 9})
        for (int64_t cols : {256, 1024}) product_case(t, 300, cols, T, rng);
    // Prompts of Q8_0 / Q4_0 / Q4_K on int8 tensor cores (16 input rows and more): the same integer
    // sums, so the same bound; row counts off the 128-row tile and the 16-row fragment.
    for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K})
      for (int T : {16, 40, 130}) {
        product_case(t, 300, 1024, T, rng);
        product_case(t, 72, 256, T, rng);
      }
    for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K})
      for (int64_t cols : {256, 1024}) decode_norm_case(t, 300, cols, rng);
    cuda::set_q8_col(true);
    for (int T : {1, 3, 9})
      for (int64_t cols : {256, 1024, 2560}) col_scaled_case(300, cols, T, rng);
    for (DType t : {DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K, DType::Q6_K})
      for (int nb : {0, 32, 256}) residual_case(t, 2560, 1024, nb, rng);
    residual_case(DType::Q8_0, 300, 256, 32, rng);
    for (int B : {32, 256}) swiglu_quant_case(9728, B, rng);
    swiglu_quant_case(768, 256, rng);
    swiglu_quant_case(9728, 32, rng, true);  // a q8_2f down product's input
    for (int T : {1, 5, 16, 40, 130}) product_case(DType::BF16, 300, 512, T, rng);
    product_case(DType::BF16, 1000, 2560, 100, rng);
    // Enough tiles for 128-row input tiles (tiles x row tiles >= 2 x SMs on an H100).
    product_case(DType::BF16, 2304, 512, 2000, rng);
    product_case(DType::Q8_0, 2304, 512, 2000, rng);
    // The ldmatrix kernel (the default where cuBLAS is not used): the same cases.
    cuda::set_tc2(true);
    g_variant = ", ldmatrix";
    for (int T : {16, 40, 130}) product_case(DType::BF16, 300, 512, T, rng);
    product_case(DType::BF16, 1000, 2560, 100, rng);
    product_case(DType::BF16, 2304, 512, 2000, rng);
    cuda::set_tc2(false);
    // cuBLAS (the default where it loads), where it can be loaded.
    if (cuda::set_cublas(true)) {
      g_variant = ", cuBLAS";
      for (int T : {16, 130}) product_case(DType::BF16, 300, 512, T, rng);
      product_case(DType::BF16, 1000, 2560, 100, rng);
      product_case(DType::BF16, 2304, 512, 2000, rng);
      cuda::set_cublas(false);
    } else {
      std::printf("  cuBLAS: not loadable here, its cases skipped\n");
    }
    g_variant = "";
    std::printf("attention\n");
    // Flash with the chunk's keys staged once, then converted per tile by each block.
    for (bool unstaged : {false, true}) {
      g_unstaged = unstaged;
      for (int hd : {16, 32, 64, 128, 256}) {
        attention_case({hd, 4, 2, 70, 0, 0, false}, rng);
        attention_case({hd, 4, 2, 70, 30, 0, false}, rng);
        attention_case({hd, 4, 2, 70, 30, 20, false}, rng);
        attention_case({hd, 4, 2, 70, 100, 20, true}, rng);
      }
      attention_case({256, 16, 4, 100, 0, 0, false}, rng);
      attention_case({64, 4, 4, 130, 500, 1024, true}, rng);
      // Rows seeing 1,024 keys and more (8 warps a block); a window (ring) whose rows' first
      // keys are not on the chunk's tile boundaries.
      attention_case({128, 8, 2, 200, 1000, 0, false}, rng);
      attention_case({256, 4, 1, 150, 1100, 1000, true}, rng);
    }
    g_unstaged = false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_cuda_kernels: %s\n", e.what());
    return 1;
  }
  std::printf("%s: %d case(s) failed\n", g_fail ? "FAILED" : "OK", g_fail);
  return g_fail ? 1 : 0;
}
