// The CUDA backend's kernels (kernels.h). Products: a warp per one to four weight rows with
// 16-byte loads kept in flight (BF16/F16), int8 dot products (dp4a) of the quantized types
// against the input quantized as the CPU's integer kernels quantize it; a block per row for
// the norms; attention split over blocks for short batches, joined by a second kernel.
// docs/cuda.md says what was measured and what is still to be made fast.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/cublas.h"
#include "dory/error.h"

namespace dory::cuda {

namespace {

cudaStream_t g_stream = nullptr;

// DType's values (tensor/dtype.h): F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K.
enum : int { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_K, kQ5_K, kQ6_K };

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ double block_sum_d(double v) {
  __shared__ double part[32];
  __shared__ double total;
  v = warp_sum_d(v);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (l == 0) part[w] = v;
  __syncthreads();
  if (w == 0) {
    double s = l < static_cast<int>(blockDim.x / 32) ? part[l] : 0.0;
    s = warp_sum_d(s);
    if (l == 0) total = s;
  }
  __syncthreads();
  const double r = total;
  __syncthreads();
  return r;
}

// Programmatic dependent launch (sm_90): every kernel is launched so that it may start while
// the one before it finishes. pdl_wait() returns once that one has completed and its writes
// are visible (so, by induction, every earlier kernel's), and comes before any read of what
// earlier kernels wrote and before any write; pdl_launch() lets the next kernel's blocks start
// now, so a product can issue its first weight loads (weights are never written) before its
// wait, over the tail of the kernel before. No-ops on sm_80 and when launched plainly.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The CPU's quantize_block on B floats by one warp (d = max|x| / 127, q = round to nearest
// even of x / d): int8 quants to q, the scale to *d.
// That arithmetic, for every int8 quantizer here: the reciprocal of a block's scale d, and one
// quant (round to nearest even of x / d, clamped to +-127).
__device__ __forceinline__ float quant_inv(float dd) {
  return dd != 0.0f ? 1.0f / dd : 0.0f;
}
__device__ __forceinline__ int quant_one(float x, float id) {
  const int v = __float2int_rn(x * id);
  return v > 127 ? 127 : v < -127 ? -127 : v;
}

// c (when set): the block's column scales, the quants those of x c (col_quant16's values).
__device__ __forceinline__ void warp_quant_block(const float* xb, int B, int8_t* q, float* d,
                                                 const float* c = nullptr) {
  const int lane = threadIdx.x % 32;
  float amax = 0.0f;
  for (int j = lane; j < B; j += 32) amax = fmaxf(amax, fabsf(c ? xb[j] * c[j] : xb[j]));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float dd = amax / 127.0f;
  const float id = quant_inv(dd);
  for (int j = lane; j < B; j += 32) q[j] = static_cast<int8_t>(quant_one(c ? xb[j] * c[j] : xb[j], id));
  if (lane == 0) *d = dd;
}

// A row-kernel's epilogue: the block's finished row t (n floats) quantized for the product
// that reads it next (kernels.h, QOut), a warp per block of B; col0: the row's first column
// in the reader's input (a head's output is part of a row), for qo.col.
__device__ void block_quant_row(const float* row, int64_t n, const QOut& qo, int64_t t, int64_t col0 = 0) {
  if (qo.B == 0) return;
  __syncthreads();  // the row's values, written by the whole block, are visible to it
  const int64_t nb = n / qo.B;
  for (int64_t b = threadIdx.x / 32; b < nb; b += blockDim.x / 32)
    warp_quant_block(row + b * qo.B, qo.B, qo.q + t * n + b * qo.B, qo.d + t * nb + b,
                     qo.col ? qo.col + col0 + b * qo.B : nullptr);
}

// ---- products ----
//
// A warp computes R weight rows against NT input rows: lanes stride the columns with 16-byte
// loads, U of them issued for each row before the first is used, so a warp keeps U x R x 512
// bytes in flight; each input load serves R rows. R is chosen per launch from the row count so
// that every SM gets several blocks (pick_rows). Blocks of kWarps warps.
constexpr int kWarps = 4;
constexpr int kMaxT = 8;  // input rows one product launch handles (grid.y covers more)
// 16-byte loads a lane issues per row before using the first, for the int8 types: 8 in all
// (fewer for several input rows, whose registers they share). Measured on an H100 (Q8_0, one
// row a warp): 8 loads 1397 GB/s on the 4B shape's down product against 1333 with 2. BF16
// keeps 2 a row at R = 4 and 4 below: 8 at R = 1 lost 8% there (1759 against 1903 GB/s).
template <int R, int NT>
constexpr int kU = NT > 1   ? 2
                   : R >= 4 ? 2
                   : R == 2 ? 4
                            : 8;
template <int R>
constexpr int kUHalf = R >= 4 ? 2 : 4;

// Up to four matrices of one type and width that read the same input (q, k, v, g; gate, up):
// their row groups laid end to end, a warp a group, so one launch serves them all.
struct LinJob {
  int t = 0, n = 0;
  int64_t cols = 0;
  const uint8_t* w[4] = {};
  const uint8_t* sc[4] = {};
  float* y[4] = {};
  int64_t rows[4] = {};
  int64_t wend[4] = {};  // running totals of warps (groups of R rows)
  // Decode (one input row): the input's sum of squares, its norm still to be taken (BF16/F16:
  // k_lin_half scales its loads; int8: store_rows scales the sums); the BF16/F16 gate/up
  // pair's swiglu scales and the sum its outputs' squares go to.
  const double* in_sum = nullptr;
  const float* sg = nullptr;
  const float* su = nullptr;
  double* out_sum = nullptr;
  // CMF q8_2f rows (Q8_0 blocks) with their input quantized in the product (k_lin_q8_0's
  // ColQ): the float input and each matrix's column scales.
  const float* xf = nullptr;
  const float* col[4] = {};
  // Decode: the layer's nGPT residual by the last warp to finish (kernels.h, Residual).
  Residual res;
};

// The product's last warp (a ticket per warp that stored rows, job.res.counter) mixes the
// residual: x <- normalize(normalize(x) + alpha (normalize(y) - normalize(x))), y the whole
// output row, then the quants for the next product; k_ngpt_residual's arithmetic, one warp.
// (Its arguments by value: a kernel parameter passed by reference would be copied to the
// stack of every product kernel.)
__device__ __noinline__ void residual_tail(float* x, const float* a, int B, int8_t* q, float* d,
                                           unsigned* counter, const float* y, int64_t n,
                                           unsigned warps) {
  const int lane = threadIdx.x % 32;
  __threadfence();  // this warp's rows (lane 0 stored them) before its ticket
  unsigned ticket = 0;
  if (lane == 0) ticket = atomicAdd(counter, 1u);
  ticket = __shfl_sync(0xffffffffu, ticket, 0);
  if (ticket + 1 != warps) return;
  __threadfence();  // every other warp's rows, seen here
  double sx = 0, sy = 0;
  for (int64_t i = lane; i < n; i += 32) {
    const float xv = __ldcg(x + i), yv = __ldcg(y + i);
    sx += static_cast<double>(xv) * xv;
    sy += static_cast<double>(yv) * yv;
  }
  const float ix = static_cast<float>(1.0 / sqrt(warp_sum_d(sx) + 1e-6));
  const float iy = static_cast<float>(1.0 / sqrt(warp_sum_d(sy) + 1e-6));
  double ss = 0;
  for (int64_t i = lane; i < n; i += 32) {
    const float xn = __ldcg(x + i) * ix, yn = __ldcg(y + i) * iy;
    const float v = xn + a[i] * (yn - xn);
    x[i] = v;
    ss += static_cast<double>(v) * v;
  }
  const float inv = static_cast<float>(1.0 / sqrt(warp_sum_d(ss) + 1e-6));
  for (int64_t i = lane; i < n; i += 32) x[i] *= inv;
  __syncwarp();  // the lanes' values, for the quants across them
  if (B == 32) {  // a lane a block (warp_quant_block's arithmetic)
    for (int64_t b = lane; b < n / 32; b += 32) {
      const float* xb = x + b * 32;
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(xb[j]));
      const float dd = amax / 127.0f;
      const float id = quant_inv(dd);
      for (int j = 0; j < 32; ++j) q[b * 32 + j] = static_cast<int8_t>(quant_one(xb[j], id));
      d[b] = dd;
    }
  } else if (B > 0) {
    for (int64_t b = 0; b < n / B; ++b) warp_quant_block(x + b * B, B, q + b * B, d + b);
  }
  if (lane == 0) *counter = 0;  // for the next launch (stream order)
}

// Which matrix, first row and row count the warp gw takes; false past the last.
__device__ __forceinline__ bool job_rows(const LinJob& job, int R, int64_t gw, int* m, int64_t* r0,
                                         int* nr) {
  if (gw >= job.wend[job.n - 1]) return false;
  int i = 0;
  while (gw >= job.wend[i]) ++i;
  *m = i;
  *r0 = (gw - (i ? job.wend[i - 1] : 0)) * R;
  *nr = static_cast<int>(min(static_cast<int64_t>(R), job.rows[i] - *r0));
  return true;
}

// A product's epilogue: each of the warp's R rows x NT inputs summed over the lanes, lane 0
// writing the rows that exist. The int8 products' job.in_sum (decode, one input row): the
// input was quantized before its norm was taken, and int8 quantization is scale-invariant
// (the quants of c x are those of x, the block scales c times theirs), so the product of the
// normalised input is this sum times 1 / sqrt(sum x^2 + 1e-6). (k_lin_half scales its loads
// instead and passes no in_sum here.)
template <int R, int NT>
__device__ __forceinline__ void store_rows(const LinJob& job, float (&acc)[R][NT], int m,
                                           int64_t r0, int nr, int t0, int nt,
                                           const double* in_sum = nullptr) {
  const int lane = threadIdx.x % 32;
  const float in_scale = in_sum ? static_cast<float>(1.0 / sqrt(*in_sum + 1e-6)) : 1.0f;
#pragma unroll
  for (int rr = 0; rr < R; ++rr)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float v = warp_sum(acc[rr][j]) * in_scale;
      if (lane == 0 && rr < nr && j < nt)
        job.y[m][static_cast<int64_t>(t0 + j) * job.rows[m] + r0 + rr] = v;
    }
  if (job.res.counter)
    residual_tail(job.res.x, job.res.alpha, job.res.qo.B, job.res.qo.q, job.res.qo.d, job.res.counter,
                  job.y[0], job.rows[0], static_cast<unsigned>(job.wend[job.n - 1]));
}

__device__ __forceinline__ float round_bf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// 8 weights of a 16-byte load of BF16 or F16.
template <int DT>
__device__ __forceinline__ void unpack8(const uint4 raw, float* wv) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (DT == kBF16) {
      wv[2 * e] = __uint_as_float(words[e] << 16);
      wv[2 * e + 1] = __uint_as_float(words[e] & 0xffff0000u);
    } else {
      const __half2 h = *reinterpret_cast<const __half2*>(&words[e]);
      const float2 f = __half22float2(h);
      wv[2 * e] = f.x;
      wv[2 * e + 1] = f.y;
    }
  }
}

// BF16 / F16 rows (cols a multiple of 8), float input, rounded to bf16 on load when round_x.
// job.in_sum (when set): the input is a row whose norm is still to be taken, sum x^2 there (an
// earlier kernel's atomics): x * (1 / sqrt(sum + 1e-6)) is the input, as the CPU normalises
// it in place. Pair (decode, one input row): the warp's R rows of job.w[0] (gate) and the same
// R rows of job.w[1] (up), and the epilogue writes silu(g * sg) * (u * su) to job.y[0] and
// adds its squares to *job.out_sum: swiglu_norm's function less the scaling, which the down
// product takes through in_sum.
template <int DT, int R, int NT, bool Pair>
__global__ void __launch_bounds__(32 * kWarps)
    k_lin_half(LinJob job, const float* __restrict__ x, int T, bool round_x) {
  constexpr int RR = Pair ? 2 * R : R;
  const int lane = threadIdx.x % 32;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  int m, nr;
  int64_t r0;
  if (!job_rows(job, R, gw, &m, &r0, &nr)) return;
  const int t0 = blockIdx.y * NT, nt = min(NT, T - t0);
  const int64_t cols = job.cols;
  const uint8_t* rowp[RR];
#pragma unroll
  for (int rr = 0; rr < RR; ++rr)
    rowp[rr] = Pair && rr >= R ? job.w[1] + (r0 + rr - R) * cols * 2 : job.w[m] + (r0 + rr) * cols * 2;
  float acc[RR][NT] = {};
  constexpr int U = kUHalf<RR>;
  uint4 raw[U][RR];
  auto load = [&](int64_t k0) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int rr = 0; rr < RR; ++rr) {
        const int64_t k = k0 + 256 * u;
        raw[u][rr] = k < cols && rr % R < nr
                         ? __ldcs(reinterpret_cast<const uint4*>(rowp[rr] + k * 2))
                         : make_uint4(0, 0, 0, 0);
      }
  };
  load(lane * 8);
  pdl_launch();
  pdl_wait();
  const float in_scale =
      job.in_sum ? static_cast<float>(1.0 / sqrt(*job.in_sum + 1e-6)) : 1.0f;  // x * 1 is x
  for (int64_t k0 = lane * 8; k0 < cols; k0 += 256 * U) {
    if (k0 != lane * 8) load(k0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = k0 + 256 * u;
      if (k >= cols) break;
      float xv[NT][8];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (j < nt) {
          const float4* xp =
              reinterpret_cast<const float4*>(x + static_cast<int64_t>(t0 + j) * cols + k);
          const float4 a = xp[0], b = xp[1];
          xv[j][0] = a.x, xv[j][1] = a.y, xv[j][2] = a.z, xv[j][3] = a.w;
          xv[j][4] = b.x, xv[j][5] = b.y, xv[j][6] = b.z, xv[j][7] = b.w;
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            xv[j][e] *= in_scale;
            if (round_x) xv[j][e] = round_bf16(xv[j][e]);
          }
        }
      }
#pragma unroll
      for (int rr = 0; rr < RR; ++rr) {
        float wv[8];
        unpack8<DT>(raw[u][rr], wv);
#pragma unroll
        for (int j = 0; j < NT; ++j)
          if (j < nt) {
            float s = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) s += wv[e] * xv[j][e];
            acc[rr][j] += s;
          }
      }
    }
  }
  if constexpr (!Pair) {
    store_rows<R, NT>(job, acc, m, r0, nr, t0, nt);  // in_sum already in the loads
    return;
  }
  double ss = 0;
#pragma unroll
  for (int rr = 0; rr < R; ++rr) {
    const float gsum = warp_sum(acc[rr][0]), usum = warp_sum(acc[R + rr][0]);
    if (rr < nr) {
      const int64_t i = r0 + rr;
      const float a = gsum * job.sg[i];
      const float v = a * (1.0f / (1.0f + expf(-a))) * (usum * job.su[i]);
      if (lane == 0) job.y[0][i] = v;
      ss += static_cast<double>(v) * v;
    }
  }
  if (lane == 0) atomicAdd(job.out_sum, ss);
}

// Any float type, any width: a warp a row, element by element (F32, and F16/BF16 rows whose
// width is not a multiple of 8).
__global__ void k_lin_generic(LinJob job, const float* x, int T) {
  const int lane = threadIdx.x % 32;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  int m, nr;
  int64_t r;
  if (!job_rows(job, 1, gw, &m, &r, &nr)) return;
  const int t0 = blockIdx.y * kMaxT, nt = min(kMaxT, T - t0);
  const int64_t cols = job.cols;
  const int t = job.t;
  const uint8_t* row = job.w[m] + r * cols * (t == kF32 ? 4 : 2);
  pdl_launch();
  pdl_wait();
  float acc[kMaxT];
#pragma unroll
  for (int j = 0; j < kMaxT; ++j) acc[j] = 0.0f;
  for (int64_t k = lane; k < cols; k += 32) {
    const float wk = t == kF32   ? reinterpret_cast<const float*>(row)[k]
                     : t == kF16 ? __half2float(reinterpret_cast<const __half*>(row)[k])
                                 : __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[k]);
#pragma unroll
    for (int j = 0; j < kMaxT; ++j)
      if (j < nt) acc[j] += wk * x[static_cast<int64_t>(t0 + j) * cols + k];
  }
#pragma unroll
  for (int j = 0; j < kMaxT; ++j) {
    const float s = warp_sum(acc[j]);
    if (lane == 0 && j < nt) job.y[m][static_cast<int64_t>(t0 + j) * job.rows[m] + r] = s;
  }
}

__device__ __forceinline__ int dot4(int a, int b, int c) {
  return __dp4a(a, b, c);
}

// A lane's 16 inputs x[0..15] times their column scales c[0..15], quantized as
// warp_quant_block quantizes (d = max|x c| / 127 over the block of 32, which this lane shares
// with its neighbour lane ^ 1; q = round to nearest even of x c / d, clamped to +-127): the
// 16 quants packed as an int4 of bytes (the scratch's layout) and the block's d.
__device__ __forceinline__ void col_quant16(const float* __restrict__ x, const float* __restrict__ c,
                                            int lane, int4* a, float* d) {
  float v[16];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 xv = reinterpret_cast<const float4*>(x)[i];
    const float4 cv = reinterpret_cast<const float4*>(c)[i];
    v[4 * i] = xv.x * cv.x, v[4 * i + 1] = xv.y * cv.y;
    v[4 * i + 2] = xv.z * cv.z, v[4 * i + 3] = xv.w * cv.w;
  }
#pragma unroll
  for (int e = 0; e < 16; ++e) amax = fmaxf(amax, fabsf(v[e]));
  amax = fmaxf(amax, __shfl_xor_sync(3u << (lane & 30), amax, 1));
  const float dd = amax / 127.0f;
  const float id = quant_inv(dd);
  int w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) w[i] |= (quant_one(v[4 * i + b], id) & 0xff) << (8 * b);
  }
  *a = make_int4(w[0], w[1], w[2], w[3]);
  *d = dd;
}

// Repacked Q8_0 (DevMat): a lane takes 16 quants (half a block) of each of R rows and the
// input's 16 int8 values, four dp4a each; the block's two halves are scaled apart. ColQ (CMF
// q8_2f): the input is job.xf, multiplied by the warp's matrix's column scales and quantized
// here (col_quant16) rather than read from xq / xd: q/k/v/g in one launch though each has its
// own scales, and no launch to scale and quantize the input.
template <int R, int NT, bool ColQ = false>
__global__ void __launch_bounds__(32 * kWarps)
    k_lin_q8_0(LinJob job, const int8_t* __restrict__ xq, const float* __restrict__ xd, int T) {
  const int lane = threadIdx.x % 32;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  int m, nr;
  int64_t r0;
  if (!job_rows(job, R, gw, &m, &r0, &nr)) return;
  const int t0 = blockIdx.y * NT, nt = min(NT, T - t0);
  const int64_t cols = job.cols, nb = cols / 32;
  const uint8_t* qs = job.w[m] + r0 * cols;
  const __half* sc = reinterpret_cast<const __half*>(job.sc[m]) + r0 * nb;
  float acc[R][NT] = {};
  constexpr int U = kU<R, NT>;
  int4 raw[U][R];
  float dw[U][R];
  auto load = [&](int64_t k0) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        const int64_t k = k0 + 512 * u;
        const bool ok = k < cols && rr < nr;
        raw[u][rr] =
            ok ? __ldcs(reinterpret_cast<const int4*>(qs + rr * cols + k)) : make_int4(0, 0, 0, 0);
        dw[u][rr] = ok ? __half2float(sc[rr * nb + k / 32]) : 0.0f;
      }
  };
  load(lane * 16);
  pdl_launch();
  pdl_wait();
  for (int64_t k0 = lane * 16; k0 < cols; k0 += 512 * U) {
    if (k0 != lane * 16) load(k0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = k0 + 512 * u;
      if (k >= cols) break;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (j >= nt) break;
        const int64_t t = t0 + j;
        int4 a;
        float d;
        if constexpr (ColQ) {
          col_quant16(job.xf + t * cols + k, job.col[m] + k, lane, &a, &d);
        } else {
          a = *reinterpret_cast<const int4*>(xq + t * cols + k);
          d = xd[t * nb + k / 32];
        }
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          const int4 w = raw[u][rr];
          const int s = dot4(w.w, a.w, dot4(w.z, a.z, dot4(w.y, a.y, dot4(w.x, a.x, 0))));
          acc[rr][j] += static_cast<float>(s) * (dw[u][rr] * d);
        }
      }
    }
  }
  store_rows<R, NT>(job, acc, m, r0, nr, t0, nt, job.in_sum);
}

// Repacked Q4_0: a lane takes a block (16 bytes: quant i in the low nibble of byte i, quant
// i + 16 in the high one) of each of R rows: dp4a of the nibbles with the input's 32 int8
// values, less 8 x their sum.
template <int R, int NT>
__global__ void __launch_bounds__(32 * kWarps)
    k_lin_q4_0(LinJob job, const int8_t* __restrict__ xq, const float* __restrict__ xd, int T) {
  const int lane = threadIdx.x % 32;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  int m, nr;
  int64_t r0;
  if (!job_rows(job, R, gw, &m, &r0, &nr)) return;
  const int t0 = blockIdx.y * NT, nt = min(NT, T - t0);
  const int64_t cols = job.cols, nb = cols / 32;
  const uint8_t* qs = job.w[m] + r0 * (cols / 2);
  const __half* sc = reinterpret_cast<const __half*>(job.sc[m]) + r0 * nb;
  float acc[R][NT] = {};
  constexpr int U = kU<R, NT>;
  int4 raw[U][R];
  float dw[U][R];
  auto load = [&](int64_t b0) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int rr = 0; rr < R; ++rr) {
        const int64_t b = b0 + 32 * u;
        const bool ok = b < nb && rr < nr;
        raw[u][rr] = ok ? __ldcs(reinterpret_cast<const int4*>(qs + rr * (cols / 2) + b * 16))
                        : make_int4(0, 0, 0, 0);
        dw[u][rr] = ok ? __half2float(sc[rr * nb + b]) : 0.0f;
      }
  };
  load(lane);
  pdl_launch();
  pdl_wait();
  for (int64_t b0 = lane; b0 < nb; b0 += 32 * U) {
    if (b0 != lane) load(b0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t b = b0 + 32 * u;
      if (b >= nb) break;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        if (j >= nt) break;
        const int64_t t = t0 + j;
        const int4* xp = reinterpret_cast<const int4*>(xq + t * cols + b * 32);
        const int4 a = xp[0], c = xp[1];
        const float d = xd[t * nb + b];
        const int ones = 0x01010101;
        const int xs = dot4(
            ones, a.x,
            dot4(
                ones, a.y,
                dot4(ones, a.z,
                     dot4(ones, a.w,
                          dot4(ones, c.x, dot4(ones, c.y, dot4(ones, c.z, dot4(ones, c.w, 0))))))));
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          const int4 w = raw[u][rr];
          const int lo = 0x0F0F0F0F;
          int s = dot4(w.x & lo, a.x, 0);
          s = dot4(w.y & lo, a.y, s);
          s = dot4(w.z & lo, a.z, s);
          s = dot4(w.w & lo, a.w, s);
          s = dot4((w.x >> 4) & lo, c.x, s);
          s = dot4((w.y >> 4) & lo, c.y, s);
          s = dot4((w.z >> 4) & lo, c.z, s);
          s = dot4((w.w >> 4) & lo, c.w, s);
          acc[rr][j] += static_cast<float>(s - 8 * xs) * (dw[u][rr] * d);
        }
      }
    }
  }
  store_rows<R, NT>(job, acc, m, r0, nr, t0, nt, job.in_sum);
}

// The K types with 16-byte loads. Q4_K (144-byte super-blocks: d, dmin, 12 bytes of 6-bit
// scales and mins, 128 bytes of nibbles) and Q5_K (176: the same header, 32 bytes of fifth
// bits, 128 of nibbles) keep the file's layout, whose blocks are multiples of 16 bytes: 8 lanes
// take a super-block, lane c reading the header and bytes 16c..16c+15 of the nibbles (the
// low nibbles are 16 quants of sub-block 2(c/2), the high ones the same 16 of the next), so a
// warp steps over 4 super-blocks of each of its rows. Q6_K (210 bytes, not a multiple of 16)
// goes up repacked (repack_q6_k): every block's 192 bytes of quants end to end, then the
// blocks' 16 int8 scales, then their f16 d; 4 lanes a super-block, lane c reading 16 bytes of
// each of ql's two 32-byte halves and of qh for half c/2 (64 quants), 8 super-blocks a step.
template <int DT>
__host__ __device__ constexpr int kq_stride() {  // bytes of a super-block in `data`
  return DT == kQ4_K ? 144 : DT == kQ5_K ? 176 : 192;
}

__device__ __forceinline__ int dot16(const uint32_t (&w)[4], const int4 x, int c) {
  return dot4(static_cast<int>(w[3]), x.w,
              dot4(static_cast<int>(w[2]), x.z,
                   dot4(static_cast<int>(w[1]), x.y, dot4(static_cast<int>(w[0]), x.x, c))));
}

__device__ __forceinline__ int sum16(const int4 x) {
  const int ones = 0x01010101;
  return dot4(ones, x.w, dot4(ones, x.z, dot4(ones, x.y, dot4(ones, x.x, 0))));
}

// Scale and min of sub-block j of a Q4_K/Q5_K header (ggml's get_scale_min_k4) from the
// header's words 1..3 (the 12 scale bytes).
__device__ __forceinline__ void kq_scale_min(int j, const uint4 h, int* sc, int* mn) {
  if (j < 4) {
    *sc = (h.y >> (8 * j)) & 63;
    *mn = (h.z >> (8 * j)) & 63;
  } else {
    const int s = 8 * (j - 4);
    *sc = ((h.w >> s) & 0xF) | (((h.y >> (s + 6)) & 3) << 4);
    *mn = ((h.w >> (s + 4)) & 0xF) | (((h.z >> (s + 6)) & 3) << 4);
  }
}

template <int DT, int R, int NT>
__global__ void __launch_bounds__(32 * kWarps)
    k_lin_kq(LinJob job, const int8_t* __restrict__ xq, const float* __restrict__ xd, int T) {
  const int lane = threadIdx.x % 32;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  int m, nr;
  int64_t r0;
  if (!job_rows(job, R, gw, &m, &r0, &nr)) return;
  const int t0 = blockIdx.y * NT, nt = min(NT, T - t0);
  const int64_t cols = job.cols, nsb = cols / 256, rowb = nsb * kq_stride<DT>();
  constexpr int LPS = DT == kQ6_K ? 4 : 8;  // lanes a super-block
  constexpr int SPS = 32 / LPS;             // super-blocks a warp step
  const int sub = lane / LPS, c = lane % LPS, half = c / 2, hh = c % 2;
  const uint8_t* base = job.w[m] + r0 * rowb;
  // Q6_K: the scales and d of the matrix's blocks, after its quants.
  const uint8_t* sc6 = job.sc[m] + r0 * nsb * 16;
  const __half* d6 = reinterpret_cast<const __half*>(job.sc[m] + job.rows[m] * nsb * 16) + r0 * nsb;
  float acc[R][NT] = {};
  uint4 ra[R], rb[R], rc[R], rs[R];
  float rd[R];
  auto load = [&](int64_t sb0) {
    const int64_t sb = sb0 + sub;
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const bool ok = rr < nr && sb < nsb;
      const uint8_t* b = base + rr * rowb + sb * kq_stride<DT>();
      const uint4 z = make_uint4(0, 0, 0, 0);
      if (DT == kQ6_K) {
        ra[rr] = ok ? __ldcs(reinterpret_cast<const uint4*>(b + 64 * half + 16 * hh)) : z;
        rb[rr] = ok ? __ldcs(reinterpret_cast<const uint4*>(b + 64 * half + 32 + 16 * hh)) : z;
        rc[rr] = ok ? __ldcs(reinterpret_cast<const uint4*>(b + 128 + 32 * half + 16 * hh)) : z;
        rs[rr] = ok ? __ldg(reinterpret_cast<const uint4*>(sc6 + (rr * nsb + sb) * 16)) : z;
        rd[rr] = ok ? __half2float(d6[rr * nsb + sb]) : 0.0f;
      } else {
        ra[rr] = ok ? __ldg(reinterpret_cast<const uint4*>(b)) : z;  // the header
        rb[rr] = ok ? __ldcs(reinterpret_cast<const uint4*>(
                          b + (DT == kQ4_K ? 16 : 48) + 32 * half + 16 * hh))
                    : z;
        if (DT == kQ5_K) rc[rr] = ok ? __ldcs(reinterpret_cast<const uint4*>(b + 16 + 16 * hh)) : z;
      }
    }
  };
  load(0);
  pdl_launch();
  pdl_wait();
  for (int64_t sb0 = 0; sb0 < nsb; sb0 += SPS) {
    if (sb0) load(sb0);
    const int64_t sb = sb0 + sub;
    if (sb >= nsb) continue;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (j >= nt) break;
      const int64_t t = t0 + j;
      const int8_t* xr = xq + t * cols + sb * 256;
      const float dx = xd[t * nsb + sb];
      if (DT == kQ6_K) {
        int4 x[4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
          x[q] = *reinterpret_cast<const int4*>(xr + 128 * half + 32 * q + 16 * hh);
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          const uint32_t A[4] = {ra[rr].x, ra[rr].y, ra[rr].z, ra[rr].w};
          const uint32_t B[4] = {rb[rr].x, rb[rr].y, rb[rr].z, rb[rr].w};
          const uint32_t H[4] = {rc[rr].x, rc[rr].y, rc[rr].z, rc[rr].w};
          // The four groups' scales: bytes 8 half + hh + 2q of the 16.
          const uint32_t slo = half ? rs[rr].z : rs[rr].x, shi = half ? rs[rr].w : rs[rr].y;
          float sum = 0.0f;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            uint32_t w[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const uint32_t lo = q & 1 ? B[e] : A[e];
              const uint32_t v =
                  ((lo >> (q >= 2 ? 4 : 0)) & 0x0F0F0F0Fu) | (((H[e] >> (2 * q)) & 0x03030303u) << 4);
              w[e] = static_cast<uint32_t>(__vsub4(static_cast<int>(v), 0x20202020));
            }
            const int k = hh + 2 * q;  // byte of slo (k < 4) or shi
            const int8_t scq = static_cast<int8_t>(((k < 4 ? slo : shi) >> (8 * (k & 3))) & 0xFF);
            sum += static_cast<float>(scq) * static_cast<float>(dot16(w, x[q], 0));
          }
          acc[rr][j] += dx * rd[rr] * sum;
        }
      } else {
        const int4 xa = *reinterpret_cast<const int4*>(xr + 64 * half + 16 * hh);
        const int4 xb = *reinterpret_cast<const int4*>(xr + 64 * half + 32 + 16 * hh);
        const int sa = sum16(xa), sbs = sum16(xb);
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
          const uint32_t Q[4] = {rb[rr].x, rb[rr].y, rb[rr].z, rb[rr].w};
          uint32_t lo[4], hi[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            lo[e] = Q[e] & 0x0F0F0F0Fu;
            hi[e] = (Q[e] >> 4) & 0x0F0F0F0Fu;
          }
          if (DT == kQ5_K) {
            const uint32_t Hq[4] = {rc[rr].x, rc[rr].y, rc[rr].z, rc[rr].w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              lo[e] |= ((Hq[e] >> (2 * half)) & 0x01010101u) << 4;
              hi[e] |= ((Hq[e] >> (2 * half + 1)) & 0x01010101u) << 4;
            }
          }
          int sc0, m0, sc1, m1;
          kq_scale_min(2 * half, ra[rr], &sc0, &m0);
          kq_scale_min(2 * half + 1, ra[rr], &sc1, &m1);
          const float d = __half2float(__ushort_as_half(static_cast<uint16_t>(ra[rr].x & 0xFFFF)));
          const float dm = __half2float(__ushort_as_half(static_cast<uint16_t>(ra[rr].x >> 16)));
          const int ia = dot16(lo, xa, 0), ib = dot16(hi, xb, 0);
          acc[rr][j] += dx * (d * static_cast<float>(sc0 * ia + sc1 * ib) -
                              dm * static_cast<float>(m0 * sa + m1 * sbs));
        }
      }
    }
  }
  store_rows<R, NT>(job, acc, m, r0, nr, t0, nt, job.in_sum);
}

// ---- prefill products on tensor cores ----
//
// BF16 weights against inputs rounded to bf16 (exactly the products the CPU's AVX512_BF16
// kernels form; k_to_bf16 rounds the input once), float accumulation: a block computes a
// BM (input rows) x 128 (weight rows) tile of Y with 8 warps (2 x 4), each BM/2 x 32 of
// mma.sync m16n8k16 tiles; 32-column slices of both operands stream through shared memory
// in a 3-stage cp.async pipeline (16-byte copies, zero-filled past the edges). Rows padded by
// 8 bf16 in shared memory: the fragments' 32-bit loads hit 32 distinct banks. Row tiles never
// straddle two matrices of a job (tile counts per matrix in job.wend).
constexpr int kTcN = 128, kTcK = 32, kTcStages = 3;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool ok) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(gmem),
               "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__global__ void k_to_bf16(const float* x, int64_t total, __nv_bfloat16* out) {
  pdl_launch();
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total / 4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    reinterpret_cast<__nv_bfloat162*>(out)[2 * i] = __floats2bfloat162_rn(v.x, v.y);
    reinterpret_cast<__nv_bfloat162*>(out)[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

// A block's BM x 128 tile of Y from its 8 warps' m16n8 accumulators (warp (wm, wn) holds rows
// wm BM/2 + 16 i + g (+8), columns wn 32 + 8 j + 2 tq (+1)): the tensor-core kernels' epilogue.
template <int BM>
__device__ __forceinline__ void store_tc_tile(float* y, const float (&acc)[BM / 32][4][4], int64_t r0,
                                              int64_t t0, int T, int64_t rows) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const int wm = warp / 4, wn = warp % 4;
#pragma unroll
  for (int i = 0; i < BM / 32; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = r0 + wn * 32 + j * 8 + 2 * tq;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int64_t t = t0 + wm * (BM / 2) + i * 16 + g + 8 * hh;
        if (t >= T) continue;
        float* yp = y + t * rows + n;
        if (n + 1 < rows && (rows % 2) == 0) {
          *reinterpret_cast<float2*>(yp) = make_float2(acc[i][j][2 * hh], acc[i][j][2 * hh + 1]);
        } else {
          if (n < rows) yp[0] = acc[i][j][2 * hh];
          if (n + 1 < rows) yp[1] = acc[i][j][2 * hh + 1];
        }
      }
    }
}

// The same product with fewer instructions a k-step (LDM, DORY_CUDA_TC2=1, opt-in until it has
// run on a GPU): 64-column slices (half the barriers of the 32-column ones) and the fragments
// taken from shared memory by ldmatrix.x4 (one instruction a 16 x 16 A tile or two 8-row B
// tiles, where the default issues four 32-bit loads). Its rows padded to 72 bf16 (144 bytes:
// 16-byte aligned, the eight row addresses of a matrix on distinct banks). Needs cols % 64 == 0.
constexpr int kTc2K = 64;

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

template <int BM, bool LDM>
__global__ void __launch_bounds__(256)
    k_lin_tc(LinJob job, const __nv_bfloat16* __restrict__ x, int T) {
  constexpr int MT = BM / 32;  // m16 tiles a warp (its BM/2 rows)
  constexpr int BK = LDM ? kTc2K : kTcK, LD = BK + 8, CH = BK / 8;  // CH: 16-byte copies a row
  extern __shared__ __align__(16) unsigned char tc_smem[];
  __nv_bfloat16* As = reinterpret_cast<__nv_bfloat16*>(tc_smem);  // [stage][BM][LD]
  __nv_bfloat16* Bs = As + kTcStages * BM * LD;                    // [stage][kTcN][LD]
  const int64_t tile = blockIdx.x;
  int m = 0;
  while (tile >= job.wend[m]) ++m;
  const int64_t r0 = (tile - (m ? job.wend[m - 1] : 0)) * kTcN, rows = job.rows[m];
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * BM, cols = job.cols;
  const __nv_bfloat16* W = reinterpret_cast<const __nv_bfloat16*>(job.w[m]);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  const int wm = warp / 4, wn = warp % 4;
  const int nk = static_cast<int>(cols / BK);
  auto load = [&](int stage, int kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * BK;
    __nv_bfloat16* a = As + stage * BM * LD;
    __nv_bfloat16* b = Bs + stage * kTcN * LD;
#pragma unroll
    for (int i = tid; i < BM * CH; i += 256) {
      const int rr = i / CH, c = i % CH;
      const bool ok = kt < nk && t0 + rr < T;
      cp_async16(a + rr * LD + c * 8, ok ? x + (t0 + rr) * cols + k0 + c * 8 : x, ok);
    }
#pragma unroll
    for (int i = tid; i < kTcN * CH; i += 256) {
      const int rr = i / CH, c = i % CH;
      const bool ok = kt < nk && r0 + rr < rows;
      cp_async16(b + rr * LD + c * 8, ok ? W + (r0 + rr) * cols + k0 + c * 8 : W, ok);
    }
  };
  // The weights are never written: their first slices may load before the wait (pdl_wait).
  pdl_launch();
  pdl_wait();
#pragma unroll
  for (int st = 0; st < kTcStages - 1; ++st) {
    load(st, st);
    cp_async_commit();
  }
  float acc[MT][4][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
  // A lane's first element in a stage. Scalar loads: A row g, B row g of the warp's tiles, at
  // column 2 tq. ldmatrix row addresses: A, lane l gives row l % 16 of the m16 tile at column
  // 8 (l / 16); B, lane l gives weight row (l % 8) + 8 (l / 16) of an n-tile pair at column
  // 8 ((l / 8) % 2), so the four matrices are {b0, b1} of n-tile 2p and {b0, b1} of 2p + 1.
  const int a_off = LDM ? (wm * (BM / 2) + lane % 16) * LD + 8 * (lane / 16) : (wm * (BM / 2) + g) * LD + 2 * tq;
  const int b_off = LDM ? (wn * 32 + lane % 8 + 8 * (lane / 16)) * LD + 8 * ((lane / 8) % 2)
                        : (wn * 32 + g) * LD + 2 * tq;
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kTcStages - 2>();
    __syncthreads();  // slice kt is in; every warp is done with the stage refilled next
    load((kt + kTcStages - 1) % kTcStages, kt + kTcStages - 1);
    cp_async_commit();
    const __nv_bfloat16* a = As + (kt % kTcStages) * BM * LD + a_off;
    const __nv_bfloat16* b = Bs + (kt % kTcStages) * kTcN * LD + b_off;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t bf[4][2];
      if constexpr (LDM) {
        uint32_t r[2][4];
        ldmatrix_x4(r[0], b + kk);
        ldmatrix_x4(r[1], b + 16 * LD + kk);
#pragma unroll
        for (int j = 0; j < 4; ++j) bf[j][0] = r[j / 2][2 * (j % 2)], bf[j][1] = r[j / 2][2 * (j % 2) + 1];
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          bf[j][0] = *reinterpret_cast<const uint32_t*>(b + j * 8 * LD + kk);
          bf[j][1] = *reinterpret_cast<const uint32_t*>(b + j * 8 * LD + kk + 8);
        }
      }
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const __nv_bfloat16* ai = a + i * 16 * LD + kk;
        uint32_t af[4];
        if constexpr (LDM) {
          ldmatrix_x4(af, ai);
        } else {
          af[0] = *reinterpret_cast<const uint32_t*>(ai);
          af[1] = *reinterpret_cast<const uint32_t*>(ai + 8 * LD);
          af[2] = *reinterpret_cast<const uint32_t*>(ai + 8);
          af[3] = *reinterpret_cast<const uint32_t*>(ai + 8 * LD + 8);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_bf16(acc[i][j], af[0], af[1], af[2], af[3], bf[j][0], bf[j][1]);
      }
    }
  }
  cp_async_wait<0>();
  store_tc_tile<BM>(job.y[m], acc, r0, t0, T, rows);
}

// ---- prompt attention on tensor cores (flash attention) ----
//
// For a pass whose rows are one sequence's consecutive positions (a prompt chunk): a block
// takes 16 x WN query rows of one head, WN warps of 16 rows (WN = 4 or 8: the key tiles'
// loads and bf16 conversion shared by 64 or 128 rows; DORY_CUDA_FLASH_WARPS); key tiles of 64 positions go through
// shared memory as bf16 (keys row-major, values transposed), S = Q K^T and O += P V are
// mma.sync m16n8k16 (bf16 in, float accumulation), the softmax online in registers (the
// accumulator layout of S is the A-operand layout of P, so P never leaves registers). Inputs
// rounded to bf16: used where the products take bf16 inputs too (Act::Bf16's function).
constexpr int kFaN = 64;

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);  // a in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_f16(float a, float b) {
  const __half2 v = __floats2half2_rn(a, b);  // a in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A value as flash attention's P V takes it: fp16 saturated at its largest value (F16), else
// bf16 (both the per-tile conversion and k_kv_stage).
template <bool F16>
__device__ __forceinline__ std::conditional_t<F16, __half, __nv_bfloat16> fa_value(float v) {
  if constexpr (F16) return __float2half_rn(fminf(fmaxf(v, -65504.f), 65504.f));
  else return __float2bfloat16_rn(v);
}

// F16: P and V in fp16 for O += P V (P lies in [0, 1]; fp16 keeps 3 more bits than bf16; V
// saturates at fp16's largest value rather than turning into inf); Q K^T stays bf16 (a
// query's range is the model's). The default since it ran on an H100 (built-in model, default
// inputs: top-1 0.9956 / KL 3.3e-5 against the CPU, bf16 P: 0.9946 / 3.5e-5);
// DORY_CUDA_FLASH_F16=0: bf16.
//
// ST (staged): the chunk's keys and values were converted once (k_kv_stage: keys bf16 row-major,
// values fp16 / bf16 transposed per tile of 64, tiles from the chunk's first row's first key),
// so a tile arrives by cp.async at half the bytes, with no conversion, into two buffers where
// shared memory allows (the next tile's copies in flight while this one's products run).
// Without it (the staging scratch could not be had) each block converts every tile itself.
template <int HD, int WN, bool ST>
__host__ __device__ constexpr int fa_buffers() {
  return ST && !(WN == 4 && HD == 256) ? 2 : 1;  // 4 warps at 256: two blocks an SM instead
}
template <int HD, int WN, bool ST>
__host__ __device__ constexpr size_t fa_smem_bytes() {
  return (static_cast<size_t>(16 * WN) * (HD + 8) +
          fa_buffers<HD, WN, ST>() * (static_cast<size_t>(kFaN) * (HD + 8) + HD * (kFaN + 8))) * 2;
}

template <int HD, bool F16, int WN, bool ST>
__global__ void __launch_bounds__(32 * WN)
    k_flash_attn(const float* __restrict__ q, const AttnRow* __restrict__ rows, int T, int nh,
                 int nk, float* __restrict__ out, const uint16_t* __restrict__ kst,
                 const uint16_t* __restrict__ vst, int64_t ncap) {
  constexpr int kFaM = 16 * WN, NT = 32 * WN, NB = fa_buffers<HD, WN, ST>();
  constexpr int QS = HD + 8, VS = kFaN + 8;  // row strides in bf16 (conflict-free fragments)
  constexpr int BUF = kFaN * QS + HD * VS;   // one buffer: keys [kFaN][QS], values [HD][VS]
  extern __shared__ __align__(16) unsigned char fa_smem[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(fa_smem);  // [kFaM][QS]
  using VT = std::conditional_t<F16, __half, __nv_bfloat16>;
  pdl_launch();
  pdl_wait();
  const int t0 = blockIdx.x * kFaM, h = blockIdx.y, kvh = h / (nh / nk);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  const int64_t w = static_cast<int64_t>(nk) * HD;
  const AttnRow r0 = rows[t0];
  const int tl = min(T, t0 + kFaM) - 1;  // the tile's last row
  const int64_t kstart = r0.lo, kend = rows[tl].pos;
  // Staged tiles start at the chunk's first key (rows[0].lo); this block's first is the one
  // holding its first row's first key (the masks drop the keys before it).
  const int64_t base = ST ? rows[0].lo : kstart;
  const int64_t kfirst = base + ((kstart - base) / kFaN) * kFaN;
  const int ntl = static_cast<int>((kend - kfirst) / kFaN) + 1;
  // Buffer b's keys and values.
  auto kbuf = [&](int b) { return Qs + kFaM * QS + b * BUF; };
  auto vbuf = [&](int b) { return reinterpret_cast<VT*>(Qs + kFaM * QS + b * BUF + kFaN * QS); };
  // The staged tile at key kb into buffer b (cp.async, committed by the caller).
  auto copy_tile = [&](int b, int64_t kb) {
    const int64_t tix = static_cast<int64_t>(kvh) * ncap + (kb - base) / kFaN;
    const uint16_t* ks = kst + tix * kFaN * HD;
    const uint16_t* vs = vst + tix * HD * kFaN;
    __nv_bfloat16* Kb = kbuf(b);
    VT* Vb = vbuf(b);
    for (int i = tid; i < kFaN * HD / 8; i += NT) {
      const int r = i / (HD / 8), c = i % (HD / 8);
      cp_async16(Kb + r * QS + c * 8, ks + r * HD + c * 8, true);
    }
    for (int i = tid; i < HD * kFaN / 8; i += NT) {
      const int d = i / (kFaN / 8), c = i % (kFaN / 8);
      cp_async16(Vb + d * VS + c * 8, vs + d * kFaN + c * 8, true);
    }
  };
  // Q tile, rounded to bf16.
  for (int i = tid; i < kFaM * HD / 4; i += NT) {
    const int rr = i / (HD / 4), c4 = i % (HD / 4);
    float4 v = make_float4(0, 0, 0, 0);
    if (t0 + rr < T)
      v = *reinterpret_cast<const float4*>(q + (static_cast<int64_t>(t0 + rr) * nh + h) * HD + c4 * 4);
    uint2 pk;
    pk.x = pack_bf16(v.x, v.y);
    pk.y = pack_bf16(v.z, v.w);
    *reinterpret_cast<uint2*>(Qs + rr * QS + c4 * 4) = pk;
  }
  // This thread's two rows (g and g + 8 of the warp's 16): position and first position.
  const int ra = t0 + warp * 16 + g, rb = ra + 8;
  int64_t pa = -1, la = 0, pb = -1, lb = 0;
  if (ra < T) pa = rows[ra].pos, la = rows[ra].lo;
  if (rb < T) pb = rows[rb].pos, lb = rows[rb].lo;
  // The warp's range of keys: its first row's lo to its last row's pos.
  const int wl = min(T - 1, t0 + warp * 16 + 15), wf = t0 + warp * 16;
  const int64_t wlo = wf < T ? rows[wf].lo : 0, whi = wf < T ? rows[wl].pos : -1;
  constexpr int NO = HD / 8;
  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float ma = -INFINITY, mb = -INFINITY, sa = 0.0f, sb = 0.0f;
  const float sl2 = 1.4426950408889634f / sqrtf(static_cast<float>(HD));  // 1/sqrt(hd), log2
  if constexpr (ST && NB == 2) {
    copy_tile(0, kfirst);
    cp_async_commit();
  }
  for (int it = 0; it < ntl; ++it) {
    const int64_t kb = kfirst + static_cast<int64_t>(it) * kFaN;
    const int b = NB == 2 ? it & 1 : 0;
    const __nv_bfloat16* Ks = kbuf(b);
    __syncthreads();  // the buffer refilled next is used up (and Q is in place, the first time)
    if constexpr (ST && NB == 2) {
      if (it + 1 < ntl) copy_tile(b ^ 1, kb + kFaN);
      cp_async_commit();      // (an empty group past the last tile)
      cp_async_wait<1>();     // this thread's copies of tile it are in
    } else if constexpr (ST) {
      copy_tile(0, kb);
      cp_async_commit();
      cp_async_wait<0>();
    } else {
      __nv_bfloat16* Kw = kbuf(0);
      VT* Vw = vbuf(0);
      for (int i = tid; i < kFaN * HD / 4; i += NT) {
        const int key = i % kFaN, c4 = i / kFaN;
        const int64_t p = kb + key;
        float4 kv = make_float4(0, 0, 0, 0), vv = kv;
        if (p <= kend) {
          const int64_t slot = r0.ring ? p % r0.ring : p;
          kv = *reinterpret_cast<const float4*>(r0.k + slot * w + kvh * HD + c4 * 4);
          vv = *reinterpret_cast<const float4*>(r0.v + slot * w + kvh * HD + c4 * 4);
        }
        uint2 pk;
        pk.x = pack_bf16(kv.x, kv.y);
        pk.y = pack_bf16(kv.z, kv.w);
        *reinterpret_cast<uint2*>(Kw + key * QS + c4 * 4) = pk;
        Vw[(c4 * 4 + 0) * VS + key] = fa_value<F16>(vv.x);
        Vw[(c4 * 4 + 1) * VS + key] = fa_value<F16>(vv.y);
        Vw[(c4 * 4 + 2) * VS + key] = fa_value<F16>(vv.z);
        Vw[(c4 * 4 + 3) * VS + key] = fa_value<F16>(vv.w);
      }
    }
    __syncthreads();
    const VT* Vt = vbuf(b);
    if (kb > whi || kb + kFaN - 1 < wlo) continue;  // no row of this warp sees these keys
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    const __nv_bfloat16* qa = Qs + (warp * 16 + g) * QS + 2 * tq;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks) {
      const uint32_t a0 = *reinterpret_cast<const uint32_t*>(qa + ks * 16);
      const uint32_t a1 = *reinterpret_cast<const uint32_t*>(qa + 8 * QS + ks * 16);
      const uint32_t a2 = *reinterpret_cast<const uint32_t*>(qa + ks * 16 + 8);
      const uint32_t a3 = *reinterpret_cast<const uint32_t*>(qa + 8 * QS + ks * 16 + 8);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const __nv_bfloat16* kp = Ks + (j * 8 + g) * QS + ks * 16 + 2 * tq;
        mma_bf16(s[j], a0, a1, a2, a3, *reinterpret_cast<const uint32_t*>(kp),
                 *reinterpret_cast<const uint32_t*>(kp + 8));
      }
    }
    // Mask, scale (log2 units) and the online softmax of rows a (g) and b (g + 8).
    float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t p = kb + j * 8 + 2 * tq + (e & 1);
        const bool ok = e < 2 ? (p >= la && p <= pa) : (p >= lb && p <= pb);
        s[j][e] = ok ? s[j][e] * sl2 : -INFINITY;
        if (e < 2)
          xa = fmaxf(xa, s[j][e]);
        else
          xb = fmaxf(xb, s[j][e]);
      }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, off));
      xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, off));
    }
    const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
    const float ua = na == -INFINITY ? 0.0f : na, ub = nb == -INFINITY ? 0.0f : nb;
    const float ca = exp2f(ma - ua), cb = exp2f(mb - ub);
    ma = na, mb = nb;
    sa *= ca, sb *= cb;
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] *= ca, o[n][1] *= ca, o[n][2] *= cb, o[n][3] *= cb;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[j][0] = exp2f(s[j][0] - ua), s[j][1] = exp2f(s[j][1] - ua);
      s[j][2] = exp2f(s[j][2] - ub), s[j][3] = exp2f(s[j][3] - ub);
      sa += s[j][0] + s[j][1], sb += s[j][2] + s[j][3];
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      auto pk = [](float a, float b) { return F16 ? pack_f16(a, b) : pack_bf16(a, b); };
      const uint32_t a0 = pk(s[2 * kk][0], s[2 * kk][1]);
      const uint32_t a1 = pk(s[2 * kk][2], s[2 * kk][3]);
      const uint32_t a2 = pk(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      const uint32_t a3 = pk(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        const VT* vp = Vt + (n * 8 + g) * VS + kk * 16 + 2 * tq;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(vp),
                       b1 = *reinterpret_cast<const uint32_t*>(vp + 8);
        if constexpr (F16) mma_f16(o[n], a0, a1, a2, a3, b0, b1);
        else mma_bf16(o[n], a0, a1, a2, a3, b0, b1);
      }
    }
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    sa += __shfl_xor_sync(0xffffffffu, sa, off);
    sb += __shfl_xor_sync(0xffffffffu, sb, off);
  }
  const float ia = sa > 0.0f ? 1.0f / sa : 0.0f, ib = sb > 0.0f ? 1.0f / sb : 0.0f;
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    const int d = n * 8 + 2 * tq;
    if (ra < T)
      *reinterpret_cast<float2*>(out + (static_cast<int64_t>(ra) * nh + h) * HD + d) =
          make_float2(o[n][0] * ia, o[n][1] * ia);
    if (rb < T)
      *reinterpret_cast<float2*>(out + (static_cast<int64_t>(rb) * nh + h) * HD + d) =
          make_float2(o[n][2] * ib, o[n][3] * ib);
  }
}

// The chunk's keys and values for k_flash_attn<..., ST>: kv head blockIdx.y, tile blockIdx.x
// of 64 positions from rows[0].lo (to rows[T - 1].pos; blocks past it return): keys as bf16
// [ncap tiles][64][HD], values as VT transposed per tile [ncap][HD][64], zeros past the last
// key; the rounding the unstaged kernel does per tile (values clamped to fp16's range).
template <int HD, bool F16>
__global__ void __launch_bounds__(256)
    k_kv_stage(const AttnRow* __restrict__ rows, int T, int nk, uint16_t* __restrict__ kst,
               uint16_t* __restrict__ vst, int64_t ncap) {
  pdl_launch();
  pdl_wait();
  const AttnRow r0 = rows[0];
  const int64_t base = r0.lo, kend = rows[T - 1].pos, kb = base + static_cast<int64_t>(blockIdx.x) * kFaN;
  if (kb > kend) return;
  const int kvh = blockIdx.y;
  const int64_t w = static_cast<int64_t>(nk) * HD, tix = static_cast<int64_t>(kvh) * ncap + blockIdx.x;
  auto at = [&](const float* c, int key, int d) {
    const int64_t p = kb + key;
    if (p > kend) return make_float4(0, 0, 0, 0);
    const int64_t slot = r0.ring ? p % r0.ring : p;
    return *reinterpret_cast<const float4*>(c + slot * w + kvh * HD + d);
  };
  // Keys: a row's float4s side by side (reads and writes along the row).
  for (int i = threadIdx.x; i < kFaN * HD / 4; i += blockDim.x) {
    const int key = i / (HD / 4), c4 = i % (HD / 4);
    const float4 v = at(r0.k, key, c4 * 4);
    uint2 pk;
    pk.x = pack_bf16(v.x, v.y);
    pk.y = pack_bf16(v.z, v.w);
    *reinterpret_cast<uint2*>(kst + (tix * kFaN + key) * HD + c4 * 4) = pk;
  }
  // Values, transposed: neighbouring threads take neighbouring keys (writes along a row of Vt).
  uint16_t* vt = vst + tix * HD * kFaN;
  for (int i = threadIdx.x; i < kFaN * HD / 4; i += blockDim.x) {
    const int key = i % kFaN, c4 = i / kFaN;
    const float4 v = at(r0.v, key, c4 * 4);
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const auto hv = fa_value<F16>(e[j]);
      vt[(c4 * 4 + j) * kFaN + key] = *reinterpret_cast<const uint16_t*>(&hv);
    }
  }
}

// One warp per block of B inputs: the CPU's quantize_block (d = max|x| / 127, q = round to
// nearest even of x / d), int8 quants and the float scale.
__global__ void k_quant_act(const float* x, int64_t blocks, int B, int8_t* q, float* d) {
  pdl_launch();
  pdl_wait();
  const int64_t b = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  if (b >= blocks) return;
  // Rows are whole blocks, so block b of the flat array.
  warp_quant_block(x + b * B, B, q + b * B, d + b);
}

__global__ void k_round_bf16(const float* x, int64_t total, float* out) {
  pdl_launch();
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = round_bf16(x[i]);
}

__global__ void k_normalize_rows(float* x, int64_t n) {
  pdl_launch();
  pdl_wait();
  float* row = x + static_cast<int64_t>(blockIdx.x) * n;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += static_cast<double>(row[i]) * row[i];
  const float inv = static_cast<float>(1.0 / sqrt(block_sum_d(ss) + 1e-6));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) row[i] *= inv;
}

__global__ void k_ngpt_residual(float* x, const float* y, const float* a, int64_t n, QOut qo) {
  pdl_launch();
  pdl_wait();
  float* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  const float* yr = y + static_cast<int64_t>(blockIdx.x) * n;
  double sx = 0, sy = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    sx += static_cast<double>(xr[i]) * xr[i];
    sy += static_cast<double>(yr[i]) * yr[i];
  }
  const float ix = static_cast<float>(1.0 / sqrt(block_sum_d(sx) + 1e-6));
  const float iy = static_cast<float>(1.0 / sqrt(block_sum_d(sy) + 1e-6));
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float xn = xr[i] * ix, yn = yr[i] * iy;
    const float v = xn + a[i] * (yn - xn);
    xr[i] = v;
    s += static_cast<double>(v) * v;
  }
  const float inv = static_cast<float>(1.0 / sqrt(block_sum_d(s) + 1e-6));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] *= inv;
  block_quant_row(xr, n, qo, blockIdx.x);
}

__global__ void k_loop_begin(float* x, float* state, float* inp, int64_t n, bool first, QOut qo) {
  pdl_launch();
  pdl_wait();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * n;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (first) inp[o + i] = state[o + i] = x[o + i];
    const float v = state[o + i] + inp[o + i];
    x[o + i] = v;
    ss += static_cast<double>(v) * v;
  }
  const float inv = static_cast<float>(1.0 / sqrt(block_sum_d(ss) + 1e-6));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) x[o + i] *= inv;
  block_quant_row(x + o, n, qo, blockIdx.x);
}

__global__ void k_loop_end(const float* x, float* state, int64_t n) {
  pdl_launch();
  pdl_wait();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * n;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    ss += static_cast<double>(x[o + i]) * x[o + i];
  const float inv = static_cast<float>(1.0 / sqrt(block_sum_d(ss) + 1e-6));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) state[o + i] = x[o + i] * inv;
}

// One block per (row, head): heads [0, nh) are query heads, [nh, nh + nk) key heads (whose
// value head is copied too). blockDim.x >= hd.
__global__ void k_qk_prepare(float* q, float* k, const float* v, const float* q_scale,
                             const AttnRow* rows, int nh, int nk, int hd, int half, double theta,
                             int rotary_dims) {
  extern __shared__ float buf[];
  const int t = blockIdx.x, h = blockIdx.y, j = threadIdx.x;
  const bool is_q = h < nh;
  const int head = is_q ? h : h - nh;
  float* src = is_q ? q + (static_cast<int64_t>(t) * nh + head) * hd
                    : k + (static_cast<int64_t>(t) * nk + head) * hd;
  pdl_launch();
  pdl_wait();
  const AttnRow r = rows[t];
  if (j < hd) buf[j] = src[j];
  __syncthreads();
  float val = 0.0f;
  if (j < hd) {
    val = buf[j];
    if (j < 2 * half) {
      const int p = j < half ? j : j - half;
      const double inv_freq =
          pow(theta, -2.0 * static_cast<double>(p) / static_cast<double>(rotary_dims));
      const double ang = static_cast<double>(r.pos) * inv_freq;
      const float c = static_cast<float>(cos(ang)), s = static_cast<float>(sin(ang));
      const float a = buf[p], b = buf[p + half];
      val = j < half ? a * c - b * s : b * c + a * s;
    }
  }
  const double ss = block_sum_d(j < hd ? static_cast<double>(val) * val : 0.0);
  const float inv = static_cast<float>(1.0 / sqrt(ss + 1e-6));
  if (j >= hd) return;
  val *= inv;
  if (is_q) {
    src[j] = val * q_scale[head * hd + j];
  } else {
    const int64_t slot = r.ring ? r.pos % r.ring : r.pos;
    const int64_t w = static_cast<int64_t>(nk) * hd;
    r.k[slot * w + head * hd + j] = val;
    r.v[slot * w + head * hd + j] = v[static_cast<int64_t>(t) * w + head * hd + j];
  }
}

constexpr int kMaxDimsPerLane = 16;  // hd <= 512
constexpr int kAttWarps = 4;         // warps per attention block

// Block (row t, query head h, split s): its warps take the split's positions in turn, two at
// a time (two independent dot products in flight), each keeping an online softmax (m, l, acc);
// the block joins its warps in shared memory, then either writes the row's output (one split)
// or its partial (m, l, unnormalised acc); the last of a row's S blocks to finish (a counter
// per (row, head), left at zero again) joins the partials.
// A decode row's RoPE and head norms (qk_prepare's function) done by the attention blocks
// themselves (Fused, T = 1): each block rotates and normalises its query head and its key
// head into shared memory, uses that key and value for the row's own position, and the
// blocks of split 0 whose query head is the first of its group write them to the cache for
// later tokens (nothing in this launch reads that row from the cache).
struct FuseArgs {
  const float* k = nullptr;  // the row's k and v before RoPE and norm
  const float* v = nullptr;
  const float* q_scale = nullptr;
  int half = 0, rotary_dims = 0;
  double theta = 0;
  // When set: the output gate (gate_norm's function less the scaling): out * sigmoid(g * gs),
  // its squares added to *sum for the o product to normalise by (LinJob::in_sum).
  const float* g = nullptr;
  const float* gs = nullptr;
  double* sum = nullptr;
  // When qo.B is set: each head's output (the row not yet normalised: int8 quantization is
  // scale-invariant) quantized for the o product by the block that writes it, blocks of qo.B
  // within the head (hd a multiple of qo.B), so the o product's own quantizing launch goes.
  QOut qo;
};

// An attention block's output element j of head row th, gated when fa asks.
__device__ __forceinline__ float att_out(const FuseArgs& fa, int64_t th, int hd, int h, int j,
                                         float val, double* ss) {
  if (!fa.sum) return val;
  const float v = val * (1.0f / (1.0f + expf(-fa.g[th * hd + j] * fa.gs[h * hd + j])));
  *ss += static_cast<double>(v) * v;
  return v;
}

template <bool Fused>
__global__ void __launch_bounds__(32 * kAttWarps)
    k_attention(const float* q, const AttnRow* rows, int nh, int nk, int hd, int S, float* out,
                float* part, int* counters, FuseArgs fa) {
  // kAttWarps x hd accumulators, m and l per warp; Fused: the row's q, k, v heads.
  extern __shared__ float sm[];
  __shared__ bool last;
  pdl_launch();
  pdl_wait();
  const int t = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
  const int lane = threadIdx.x % 32, wi = threadIdx.x / 32;
  const AttnRow r = rows[t];
  const int kvh = h / (nh / nk), nd = (hd + 31) / 32;
  const int64_t w = static_cast<int64_t>(nk) * hd;
  const int64_t n = r.pos - r.lo + 1, chunk = (n + S - 1) / S;
  const int64_t p0 = r.lo + s * chunk, p1 = min(r.pos + 1, p0 + chunk);
  const float* qh = q + (static_cast<int64_t>(t) * nh + h) * hd;
  float* qf = sm + kAttWarps * hd + 2 * kAttWarps;  // Fused: q, k, v of the row
  float* kf = qf + hd;
  float* vf = kf + hd;
  if (Fused) {
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
      qf[j] = qh[j];
      kf[j] = fa.k[kvh * hd + j];
      vf[j] = fa.v[kvh * hd + j];
    }
    __syncthreads();
    constexpr int kPer = 32 * kMaxDimsPerLane / (32 * kAttWarps);  // dims a thread
    float vq[kPer], vk[kPer];
    double sq = 0, sk = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = threadIdx.x + i * blockDim.x;
      vq[i] = vk[i] = 0.0f;
      if (j >= hd) continue;
      vq[i] = qf[j], vk[i] = kf[j];
      if (j < 2 * fa.half) {
        const int p = j < fa.half ? j : j - fa.half;
        const double inv_freq = pow(fa.theta, -2.0 * static_cast<double>(p) /
                                                   static_cast<double>(fa.rotary_dims));
        const double ang = static_cast<double>(r.pos) * inv_freq;
        const float c = static_cast<float>(cos(ang)), sn = static_cast<float>(sin(ang));
        const float qa = qf[p], qb = qf[p + fa.half], ka = kf[p], kb = kf[p + fa.half];
        vq[i] = j < fa.half ? qa * c - qb * sn : qb * c + qa * sn;
        vk[i] = j < fa.half ? ka * c - kb * sn : kb * c + ka * sn;
      }
      sq += static_cast<double>(vq[i]) * vq[i];
      sk += static_cast<double>(vk[i]) * vk[i];
    }
    const float iq = static_cast<float>(1.0 / sqrt(block_sum_d(sq) + 1e-6));
    const float ik = static_cast<float>(1.0 / sqrt(block_sum_d(sk) + 1e-6));
    const bool writer = s == 0 && h % (nh / nk) == 0;
    const int64_t slot = r.ring ? r.pos % r.ring : r.pos;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = threadIdx.x + i * blockDim.x;
      if (j >= hd) continue;
      qf[j] = vq[i] * iq * fa.q_scale[h * hd + j];
      kf[j] = vk[i] * ik;
      if (writer) {
        r.k[slot * w + kvh * hd + j] = kf[j];
        r.v[slot * w + kvh * hd + j] = vf[j];
      }
    }
    __syncthreads();
    qh = qf;
  }
  float qv[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    qv[i] = i < nd && i * 32 + lane < hd ? qh[i * 32 + lane] : 0.0f;
    acc[i] = 0.0f;
  }
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  float m = -INFINITY, l = 0.0f;
  for (int64_t p = p0 + wi; p < p1; p += 2 * kAttWarps) {
    const int64_t pb = p + kAttWarps;
    const bool two = pb < p1;
    const int64_t sa = r.ring ? p % r.ring : p, sbb = r.ring ? pb % r.ring : pb;
    const int64_t pbb = two ? pb : p;
    const float* ka = Fused && p == r.pos ? kf : r.k + sa * w + kvh * hd;
    const float* kb = Fused && pbb == r.pos ? kf : r.k + (two ? sbb : sa) * w + kvh * hd;
    float da = 0.0f, db = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i)
      if (i < nd && i * 32 + lane < hd) {
        da += qv[i] * ka[i * 32 + lane];
        db += qv[i] * kb[i * 32 + lane];
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      da += __shfl_xor_sync(0xffffffffu, da, o);
      db += __shfl_xor_sync(0xffffffffu, db, o);
    }
    da *= scale;
    db = two ? db * scale : -INFINITY;
    const float mn = fmaxf(m, fmaxf(da, db));
    const float c = expf(m - mn), ea = expf(da - mn), eb = two ? expf(db - mn) : 0.0f;
    l = l * c + ea + eb;
    const float* va = Fused && p == r.pos ? vf : r.v + sa * w + kvh * hd;
    const float* vb = Fused && pbb == r.pos ? vf : r.v + (two ? sbb : sa) * w + kvh * hd;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i)
      if (i < nd && i * 32 + lane < hd)
        acc[i] = acc[i] * c + ea * va[i * 32 + lane] + eb * vb[i * 32 + lane];
    m = mn;
  }
  float* A = sm;
  float* M = sm + kAttWarps * hd;
  float* L = M + kAttWarps;
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i)
    if (i < nd && i * 32 + lane < hd) A[wi * hd + i * 32 + lane] = acc[i];
  if (lane == 0) M[wi] = m, L[wi] = l;
  __syncthreads();
  float mm = -INFINITY;
  for (int i = 0; i < kAttWarps; ++i) mm = fmaxf(mm, M[i]);
  float f[kAttWarps], ll = 0.0f;
  for (int i = 0; i < kAttWarps; ++i) {
    f[i] = M[i] == -INFINITY ? 0.0f : expf(M[i] - mm);
    ll += L[i] * f[i];
  }
  const int64_t th = static_cast<int64_t>(t) * nh + h;
  double ss = 0;
  for (int j = threadIdx.x; j < hd; j += blockDim.x) {
    float a = 0.0f;
    for (int i = 0; i < kAttWarps; ++i) a += A[i * hd + j] * f[i];
    if (S == 1) {
      out[th * hd + j] = att_out(fa, th, hd, h, j, a / ll, &ss);
    } else {
      part[(th * S + s) * (hd + 2) + 2 + j] = a;
    }
  }
  if (S == 1) {
    if (fa.sum) {
      ss = block_sum_d(ss);
      if (threadIdx.x == 0) atomicAdd(fa.sum, ss);
    }
    if (Fused) block_quant_row(out + th * hd, hd, fa.qo, th, static_cast<int64_t>(h) * hd);
    return;
  }
  if (threadIdx.x == 0) {
    part[(th * S + s) * (hd + 2)] = mm;
    part[(th * S + s) * (hd + 2) + 1] = ll;
  }
  __threadfence();  // this block's partial is visible to the device before it counts itself
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counters[th], 1) == S - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Read through L2 (__ldcg): the other blocks' partials, never cached in this SM's L1. The
  // splits' weights exp(m_i - m) once, in shared memory (S <= 32).
  __shared__ float wt[32];
  __shared__ float inv_l;
  const float* P = part + th * S * (hd + 2);
  if (threadIdx.x < 32) {
    const int i = threadIdx.x;
    const float ms = i < S ? __ldcg(P + i * (hd + 2)) : -INFINITY;
    float mj = ms;
    for (int o = 16; o > 0; o >>= 1) mj = fmaxf(mj, __shfl_xor_sync(0xffffffffu, mj, o));
    const float f = ms == -INFINITY ? 0.0f : expf(ms - mj);
    wt[i] = f;
    float lj = i < S ? f * __ldcg(P + i * (hd + 2) + 1) : 0.0f;
    for (int o = 16; o > 0; o >>= 1) lj += __shfl_xor_sync(0xffffffffu, lj, o);
    if (i == 0) inv_l = 1.0f / lj;
  }
  __syncthreads();
  double sj = 0;
  for (int j = threadIdx.x; j < hd; j += blockDim.x) {
    float a = 0.0f;
#pragma unroll 8
    for (int i = 0; i < S; ++i) a += __ldcg(P + i * (hd + 2) + 2 + j) * wt[i];
    out[th * hd + j] = att_out(fa, th, hd, h, j, a * inv_l, &sj);
  }
  if (fa.sum) {
    sj = block_sum_d(sj);
    if (threadIdx.x == 0) atomicAdd(fa.sum, sj);
  }
  if (Fused) block_quant_row(out + th * hd, hd, fa.qo, th, static_cast<int64_t>(h) * hd);
  if (threadIdx.x == 0) counters[th] = 0;
}

__global__ void k_gate_norm(float* y, const float* g, const float* gs, int64_t n, QOut qo) {
  pdl_launch();
  pdl_wait();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * n;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = y[o + i] * (1.0f / (1.0f + expf(-g[o + i] * gs[i])));
    y[o + i] = v;
    ss += static_cast<double>(v) * v;
  }
  const float inv = static_cast<float>(1.0 / sqrt(block_sum_d(ss) + 1e-6));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[o + i] *= inv;
  block_quant_row(y + o, n, qo, blockIdx.x);
}

__global__ void k_swiglu_norm(float* g, const float* u, const float* sg, const float* su, int64_t n,
                              QOut qo) {
  pdl_launch();
  pdl_wait();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * n;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float a = g[o + i] * sg[i];
    const float v = a * (1.0f / (1.0f + expf(-a))) * (u[o + i] * su[i]);
    g[o + i] = v;
    ss += static_cast<double>(v) * v;
  }
  const float inv = static_cast<float>(1.0 / sqrt(block_sum_d(ss) + 1e-6));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) g[o + i] *= inv;
  block_quant_row(g + o, n, qo, blockIdx.x);
}

// Decode (one row of f floats) into an int8 down product: a warp a block of qo.B: v =
// silu(g * sg) * (u * su) written to g, quantized (warp_quant_block) into qo, and its squares
// added to *sum (zero before): swiglu_norm less the scaling, which the down product takes
// from the sum (LinJob::in_sum; the quants of v and of v / |v| are the same). Many blocks
// where swiglu_norm is one.
__global__ void k_swiglu_quant(float* g, const float* u, const float* sg, const float* su,
                               int64_t f, QOut qo, double* sum) {
  pdl_launch();
  pdl_wait();
  const int64_t b = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  if (b * qo.B >= f) return;
  const int lane = threadIdx.x % 32;
  float* gb = g + b * qo.B;
  double ss = 0;
  for (int j = lane; j < qo.B; j += 32) {
    const int64_t i = b * qo.B + j;
    const float a = gb[j] * sg[i];
    const float v = a * (1.0f / (1.0f + expf(-a))) * (u[i] * su[i]);
    gb[j] = v;
    ss += static_cast<double>(v) * v;
  }
  __syncwarp();
  warp_quant_block(gb, qo.B, qo.q + b * qo.B, qo.d + b, qo.col ? qo.col + b * qo.B : nullptr);
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) atomicAdd(sum, ss);
}

// out[i] = x[i] * s[i % n] (in place when out is x): the logit scale, a q8_2f input's columns.
__global__ void k_scale_cols(const float* x, const float* s, int64_t total, int64_t n, float* out) {
  pdl_launch();
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = x[i] * s[i % n];
}

__global__ void k_gather_rows(const float* x, const int64_t* idx, int64_t n, int64_t total,
                              float* y) {
  pdl_launch();
  pdl_wait();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = x[idx[i / n] * n + i % n];
}

__global__ void k_read(const uint4* p, uint64_t n, unsigned* sink) {
  unsigned acc = 0;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads; almost never true
}

int g_sms = 0;

int sms() {
  if (g_sms == 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev);
    if (g_sms <= 0) g_sms = 1;
  }
  return g_sms;
}

bool g_pdl = false;  // programmatic dependent launch: sm_90 and up, unless DORY_CUDA_PDL=0
// Tensor-core products for BF16 weights from kTcMinT input rows (DORY_CUDA_TC=0: off). They
// take bf16-rounded inputs; with float inputs asked for (DORY_BF16_INPUT=float) they are used
// only when g_tc_float (set_tc_float_inputs).
bool g_tc = true, g_tc_float = false;
// Prompts' Q8_0 / Q4_0 / Q4_K products on int8 tensor cores (k_lin_tc8, k_lin_tc8_q4k; 3-5x
// dp4a's pp512 on an H100); DORY_CUDA_TC_INT8=0: dp4a, to compare against.
bool g_tc_int8 = true;
// BF16 prompts' products with k_lin_tc<BM, true> (ldmatrix, 64-column slices) where cuBLAS is
// not used: on by default (DORY_CUDA_TC2=0: the first kernel). H100, 4B shape, 2026-12-07:
// pp512 9756 against 8472 t/s, pp4096 7991 against 6941 (docs/cuda.md).
bool g_tc2 = true;
// BF16 prompts' products through cuBLAS (cublas.cpp), where libcublas loads: on by default
// (DORY_CUDA_CUBLAS=0: our kernels; =1: an error if it does not load). Same call: pp512 15734,
// pp4096 11534 t/s.
bool g_cublas = false;
bool g_flash = true;  // prompt attention on tensor cores (DORY_CUDA_FLASH=0: off)
bool g_flash_f16 = true;  // its P V in fp16 (DORY_CUDA_FLASH_F16=0: bf16)
bool g_q8_col = true;     // q8_2f's input quantized in its product (DORY_CUDA_Q8_COL=0: off)
int g_flash_warps = 0;    // query rows a block: 16 x this (DORY_CUDA_FLASH_WARPS=4|8; 0: by keys)
bool g_flash_stage = false;  // keys and values converted once a chunk (DORY_CUDA_FLASH_STAGE=1: on)
constexpr int kTcMinT = 16;

// Every kernel goes through here: on the backend's stream, with programmatic dependent launch
// where the device has it (see pdl_wait), the launch's error thrown.
template <typename... P, typename... A>
void launch(const char* what, void (*k)(P...), dim3 g, dim3 b, size_t smem, A... a) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = g;
  cfg.blockDim = b;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = g_stream;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = g_pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, k, static_cast<P>(a)...);
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

// The profile (prof_enable): events recorded before each launch, the name and bytes of each.
struct ProfMark {
  std::string name;
  uint64_t bytes;
  cudaEvent_t ev;
};
struct ProfTotal {
  int64_t n = 0;
  double ms = 0, bytes = 0;
};
bool g_prof = false;
std::vector<ProfMark> g_marks;
std::vector<cudaEvent_t> g_free_events;
std::map<std::string, ProfTotal> g_totals;
const char* g_label = nullptr;
std::string g_phase = "pass";

void prof_mark(const char* name, uint64_t bytes = 0) {
  if (!g_prof) return;
  cudaEvent_t e;
  if (g_free_events.empty()) {
    cudaEventCreate(&e);
  } else {
    e = g_free_events.back();
    g_free_events.pop_back();
  }
  cudaEventRecord(e, g_stream);
  g_marks.push_back({g_phase + " | " + name, bytes, e});
}

int64_t weight_bytes(int t, int64_t rows, int64_t cols) {
  switch (t) {
    case kF32:
      return rows * cols * 4;
    case kF16:
    case kBF16:
      return rows * cols * 2;
    case kQ8_0:
      return rows * cols / 32 * 34;
    case kQ4_0:
      return rows * cols / 32 * 18;
    case kQ4_K:
      return rows * cols / 256 * 144;
    case kQ5_K:
      return rows * cols / 256 * 176;
    default:
      return rows * cols / 256 * 210;
  }
}

// Rows a warp takes: as many as leave every SM at least 4 blocks of kWarps warps.
int pick_rows(int64_t rows, int nt) {
  if (nt > 1) return 1;
  const int64_t want = 16LL * sms();
  return rows / 4 >= want ? 4 : rows / 2 >= want ? 2 : 1;
}

// Launches kernel family F for the (R, NT) picked: F::template run<R, NT>(grid, ...).
template <class F, class... A>
void dispatch(int R, int NT, dim3 grid, A... a) {
  const dim3 block(32 * kWarps);
  if (NT == 1) {
    if (R == 4) return F::template run<4, 1>(grid, block, a...);
    if (R == 2) return F::template run<2, 1>(grid, block, a...);
    return F::template run<1, 1>(grid, block, a...);
  }
  if (NT == 4) return F::template run<1, 4>(grid, block, a...);
  return F::template run<1, 8>(grid, block, a...);
}

template <int DT>
struct RunHalf {
  template <int R, int NT>
  static void run(dim3 g, dim3 b, LinJob job, const float* x, int T, bool round_x) {
    launch("linear", k_lin_half<DT, R, NT, false>, g, b, 0, job, x, T, round_x);
  }
};
struct RunQ8 {
  template <int R, int NT>
  static void run(dim3 g, dim3 b, LinJob job, const int8_t* q, const float* d, int T) {
    launch("linear", k_lin_q8_0<R, NT>, g, b, 0, job, q, d, T);
  }
};
struct RunQ8Col {
  template <int R, int NT>
  static void run(dim3 g, dim3 b, LinJob job, int T) {
    launch("linear", k_lin_q8_0<R, NT, true>, g, b, 0, job, nullptr, nullptr, T);
  }
};
struct RunQ4 {
  template <int R, int NT>
  static void run(dim3 g, dim3 b, LinJob job, const int8_t* q, const float* d, int T) {
    launch("linear", k_lin_q4_0<R, NT>, g, b, 0, job, q, d, T);
  }
};
template <int DT>
struct RunKq {
  template <int R, int NT>
  static void run(dim3 g, dim3 b, LinJob job, const int8_t* q, const float* d, int T) {
    launch("linear", k_lin_kq<DT, R, NT>, g, b, 0, job, q, d, T);
  }
};

int row_threads(int64_t n) {
  return n >= 1024 ? 1024 : n >= 256 ? 256 : 128;
}

}  // namespace

void use_stream(void* s) {
  g_stream = static_cast<cudaStream_t>(s);
}

void set_stream(void* s) {
  g_stream = static_cast<cudaStream_t>(s);
  sms();
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  const char* e = std::getenv("DORY_CUDA_PDL");
  g_pdl = major >= 9 && !(e && std::string(e) == "0");
  const char* tc = std::getenv("DORY_CUDA_TC");
  g_tc = major >= 8 && !(tc && std::string(tc) == "0");
  const char* t8 = std::getenv("DORY_CUDA_TC_INT8");
  g_tc_int8 = !(t8 && std::string(t8) == "0");
  const char* t2 = std::getenv("DORY_CUDA_TC2");
  g_tc2 = !(t2 && std::string(t2) == "0");
  const char* cb = std::getenv("DORY_CUDA_CUBLAS");
  const std::string cbv = cb ? cb : "";
  std::string why;
  g_cublas = cbv != "0" && cublas_available(&why);
  if (cbv == "1" && !g_cublas) throw Error("DORY_CUDA_CUBLAS=1: " + why);
  const char* fl = std::getenv("DORY_CUDA_FLASH");
  g_flash = !(fl && std::string(fl) == "0");
  const char* f16 = std::getenv("DORY_CUDA_FLASH_F16");
  g_flash_f16 = !(f16 && std::string(f16) == "0");
  const char* qc = std::getenv("DORY_CUDA_Q8_COL");
  g_q8_col = !(qc && std::string(qc) == "0");
  const char* fw = std::getenv("DORY_CUDA_FLASH_WARPS");
  g_flash_warps = fw && std::string(fw) == "8" ? 8 : fw && std::string(fw) == "4" ? 4 : 0;
  const char* fs = std::getenv("DORY_CUDA_FLASH_STAGE");
  g_flash_stage = fs && std::string(fs) == "1";
}

void set_flash_stage(bool on) {
  g_flash_stage = on;
}

void set_flash_f16(bool on) {
  g_flash_f16 = on;
}

void set_tc_int8(bool on) {
  g_tc_int8 = on;
}

void set_tc2(bool on) {
  g_tc2 = on;
}

bool set_cublas(bool on) {
  g_cublas = on && cublas_available();
  return g_cublas == on;
}

void set_tc_float_inputs(bool on) {
  g_tc_float = on;
}

QOut act_layout(Act act, void* scratch, int T, int64_t cols) {
  if (act != Act::Block32 && act != Act::Block256) return {};
  int8_t* q = static_cast<int8_t*>(scratch);
  return {act == Act::Block32 ? 32 : 256, q,
          reinterpret_cast<float*>(q + ((static_cast<int64_t>(T) * cols + 255) / 256) * 256)};
}

void check_last(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

void repack_blocks(int dtype, const void* src, int64_t rows, int64_t cols, void* dst) {
  const int64_t nb = cols / 32;
  const int bb = dtype == kQ8_0 ? 34 : 18, qb = bb - 2;
  const uint8_t* s = static_cast<const uint8_t*>(src);
  uint8_t* q = static_cast<uint8_t*>(dst);
  uint8_t* sc = q + rows * nb * qb;
  for (int64_t i = 0; i < rows * nb; ++i) {
    std::memcpy(q + i * qb, s + i * bb + 2, qb);
    std::memcpy(sc + i * 2, s + i * bb, 2);
  }
}

// Int8 tensor cores for repacked Q8_0 / Q4_0 weights (prompts, 16 input rows and more): the
// CPU's integer function (kernels above): per 32-column block, the int8 input's quants against
// the weights' quants summed exactly (mma.sync m16n8k32, s8 x s8 -> s32), then scaled by the
// block's two scales into float accumulators. Tiles as k_lin_tc: BM input rows x 128 weight
// rows, 8 warps (2 x 4), one quant block (32 columns) a pipeline stage, 4 stages of cp.async.
// Shared rows padded to 48 bytes, so the fragments' 32-bit loads hit 32 distinct banks. Q4_0's
// 16 bytes a block hold quant i in byte i's low nibble and i + 16 in its high one, which is
// exactly the split of an m16n8k32 B fragment (k = 4 tq + i and 16 + 4 tq + i): one 32-bit
// load gives both registers, less 8 a byte (__vsub4).
// Fragments (PTX ISA, m16n8k32 .s8): a0 = A[g][4tq..], a1 = A[g+8][4tq..], a2 = A[g][16+4tq..],
// a3 = A[g+8][16+4tq..]; b0 = B[4tq..][g], b1 = B[16+4tq..][g]; c0, c1 = C[g][2tq, 2tq+1],
// c2, c3 = C[g+8][2tq, 2tq+1].
constexpr int kTc8Stages = 4, kTc8Ld = 48;

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// The int8 tensor-core kernels' epilogue: a warp's BM/2 x 32 of the tile (m16n8 accumulator
// layout: rows g and g + 8, columns 2 tq and 2 tq + 1) to Y, the rows and inputs that exist.

template <int DT, int BM>
__global__ void __launch_bounds__(256)
    k_lin_tc8(LinJob job, const int8_t* __restrict__ xq, const float* __restrict__ xd, int T) {
  constexpr int MT = BM / 32;
  constexpr int WB = DT == kQ8_0 ? 32 : 16;  // weight bytes a block
  extern __shared__ __align__(16) unsigned char tc_smem[];
  int8_t* As = reinterpret_cast<int8_t*>(tc_smem);                       // [stage][BM][kTc8Ld]
  uint8_t* Bs = reinterpret_cast<uint8_t*>(As + kTc8Stages * BM * kTc8Ld);  // [stage][kTcN][kTc8Ld]
  float* Ad = reinterpret_cast<float*>(Bs + kTc8Stages * kTcN * kTc8Ld);   // [stage][BM]
  float* Bd = Ad + kTc8Stages * BM;                                        // [stage][kTcN]
  const int64_t tile = blockIdx.x;
  int m = 0;
  while (tile >= job.wend[m]) ++m;
  const int64_t r0 = (tile - (m ? job.wend[m - 1] : 0)) * kTcN, rows = job.rows[m];
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * BM, cols = job.cols, nb = cols / 32;
  const uint8_t* W = job.w[m];
  const __half* Wd = reinterpret_cast<const __half*>(job.sc[m]);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  const int wm = warp / 4, wn = warp % 4;
  auto load = [&](int stage, int64_t kb) {
    int8_t* a = As + stage * BM * kTc8Ld;
    uint8_t* b = Bs + stage * kTcN * kTc8Ld;
    for (int i = tid; i < BM * 2; i += 256) {
      const int rr = i / 2, c = i % 2;
      const bool ok = kb < nb && t0 + rr < T;
      cp_async16(a + rr * kTc8Ld + c * 16, ok ? xq + (t0 + rr) * cols + kb * 32 + c * 16 : xq, ok);
    }
    for (int i = tid; i < kTcN * (WB / 16); i += 256) {
      const int rr = i / (WB / 16), c = i % (WB / 16);
      const bool ok = kb < nb && r0 + rr < rows;
      cp_async16(b + rr * kTc8Ld + c * 16, ok ? W + (r0 + rr) * nb * WB + kb * WB + c * 16 : W, ok);
    }
    // The scales: plain loads (a float or half a row), visible after the barrier that comes
    // before this stage is read.
    for (int i = tid; i < BM + kTcN; i += 256) {
      if (i < BM) {
        const bool ok = kb < nb && t0 + i < T;
        Ad[stage * BM + i] = ok ? xd[(t0 + i) * nb + kb] : 0.0f;
      } else {
        const int rr = i - BM;
        const bool ok = kb < nb && r0 + rr < rows;
        Bd[stage * kTcN + rr] = ok ? __half2float(Wd[(r0 + rr) * nb + kb]) : 0.0f;
      }
    }
  };
  pdl_launch();
  pdl_wait();
#pragma unroll
  for (int st = 0; st < kTc8Stages - 1; ++st) {
    load(st, st);
    cp_async_commit();
  }
  float acc[MT][4][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
  for (int64_t kb = 0; kb < nb; ++kb) {
    cp_async_wait<kTc8Stages - 2>();
    __syncthreads();  // block kb is in; every warp is done with the stage refilled next
    load(static_cast<int>((kb + kTc8Stages - 1) % kTc8Stages), kb + kTc8Stages - 1);
    cp_async_commit();
    const int st = static_cast<int>(kb % kTc8Stages);
    const int8_t* a = As + st * BM * kTc8Ld + (wm * (BM / 2) + g) * kTc8Ld + 4 * tq;
    const uint8_t* b = Bs + st * kTcN * kTc8Ld + (wn * 32 + g) * kTc8Ld + 4 * tq;
    const float* ad = Ad + st * BM + wm * (BM / 2) + g;
    const float* bd = Bd + st * kTcN + wn * 32 + 2 * tq;
    uint32_t bf[4][2];
    float sw[4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (DT == kQ8_0) {
        bf[j][0] = *reinterpret_cast<const uint32_t*>(b + j * 8 * kTc8Ld);
        bf[j][1] = *reinterpret_cast<const uint32_t*>(b + j * 8 * kTc8Ld + 16);
      } else {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(b + j * 8 * kTc8Ld);
        bf[j][0] = __vsub4(w & 0x0F0F0F0Fu, 0x08080808u);
        bf[j][1] = __vsub4((w >> 4) & 0x0F0F0F0Fu, 0x08080808u);
      }
      sw[j][0] = bd[j * 8], sw[j][1] = bd[j * 8 + 1];
    }
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const int8_t* ai = a + i * 16 * kTc8Ld;
      const uint32_t a0 = *reinterpret_cast<const uint32_t*>(ai);
      const uint32_t a1 = *reinterpret_cast<const uint32_t*>(ai + 8 * kTc8Ld);
      const uint32_t a2 = *reinterpret_cast<const uint32_t*>(ai + 16);
      const uint32_t a3 = *reinterpret_cast<const uint32_t*>(ai + 8 * kTc8Ld + 16);
      const float s0 = ad[i * 16], s1 = ad[i * 16 + 8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int c[4] = {0, 0, 0, 0};
        mma_s8(c, a0, a1, a2, a3, bf[j][0], bf[j][1]);
        acc[i][j][0] += static_cast<float>(c[0]) * (s0 * sw[j][0]);
        acc[i][j][1] += static_cast<float>(c[1]) * (s0 * sw[j][1]);
        acc[i][j][2] += static_cast<float>(c[2]) * (s1 * sw[j][0]);
        acc[i][j][3] += static_cast<float>(c[3]) * (s1 * sw[j][1]);
      }
    }
  }
  cp_async_wait<0>();
  store_tc_tile<BM>(job.y[m], acc, r0, t0, T, rows);
}

template <int BM, bool LDM>
void tc_launch(const LinJob& job, const __nv_bfloat16* xb, int T, int64_t tiles) {
  constexpr size_t smem = static_cast<size_t>(kTcStages) * (BM + kTcN) * ((LDM ? kTc2K : kTcK) + 8) * 2;
  static bool raised = false;  // over 48 KB of shared memory needs an opt-in
  if (!raised) {
    const cudaError_t e = cudaFuncSetAttribute(k_lin_tc<BM, LDM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) throw Error(std::string("CUDA: tensor-core product: ") + cudaGetErrorString(e));
    raised = true;
  }
  launch("linear", k_lin_tc<BM, LDM>, dim3(static_cast<unsigned>(tiles), (T + BM - 1) / BM), dim3(256),
         smem, job, xb, T);
}

// Q4_K prompts on int8 tensor cores: a pipeline stage is one pair of sub-blocks (64 columns,
// whose 32 bytes of nibbles hold sub-block 2p in the low nibbles and 2p + 1 in the high ones,
// quant k of each at byte k), so one 32-bit load gives a B fragment register of either. The
// header's 6-bit scale and min of both sub-blocks become d sc and dmin m per weight row as the
// stage is loaded; the input's sum over a sub-block (the min's term) comes from the A
// fragments (dp4a with ones, then two shuffles over the quad). Per sub-block and (t, n): y +=
// dx (d sc isum - dmin m bsum), the CPU's integer function (Q4_K x Q8_K) with the float terms
// ordered per sub-block.
constexpr int kTcQ4kLd = 80;  // 64 input quants a row, padded: 32 distinct banks

template <int BM>
__global__ void __launch_bounds__(256)
    k_lin_tc8_q4k(LinJob job, const int8_t* __restrict__ xq, const float* __restrict__ xd, int T) {
  constexpr int MT = BM / 32;
  extern __shared__ __align__(16) unsigned char tc_smem[];
  int8_t* As = reinterpret_cast<int8_t*>(tc_smem);                         // [stage][BM][80]
  uint8_t* Bs = reinterpret_cast<uint8_t*>(As + kTc8Stages * BM * kTcQ4kLd);  // [stage][kTcN][48]
  float* Ad = reinterpret_cast<float*>(Bs + kTc8Stages * kTcN * kTc8Ld);     // [stage][BM]
  float* Bsc = Ad + kTc8Stages * BM;                                         // [stage][2][kTcN]
  float* Bmn = Bsc + kTc8Stages * 2 * kTcN;                                  // [stage][2][kTcN]
  const int64_t tile = blockIdx.x;
  int m = 0;
  while (tile >= job.wend[m]) ++m;
  const int64_t r0 = (tile - (m ? job.wend[m - 1] : 0)) * kTcN, rows = job.rows[m];
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * BM, cols = job.cols;
  const int64_t nsb = cols / 256, np = cols / 64, rowb = nsb * 144;
  const uint8_t* W = job.w[m];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  const int wm = warp / 4, wn = warp % 4;
  auto load = [&](int stage, int64_t p) {  // pair p: super-block p / 4, pair p % 4 in it
    const int64_t sb = p / 4;
    const int pp = static_cast<int>(p % 4);
    int8_t* a = As + stage * BM * kTcQ4kLd;
    uint8_t* b = Bs + stage * kTcN * kTc8Ld;
    for (int i = tid; i < BM * 4; i += 256) {
      const int rr = i / 4, c = i % 4;
      const bool ok = p < np && t0 + rr < T;
      cp_async16(a + rr * kTcQ4kLd + c * 16, ok ? xq + (t0 + rr) * cols + p * 64 + c * 16 : xq, ok);
    }
    for (int i = tid; i < kTcN * 2; i += 256) {
      const int rr = i / 2, c = i % 2;
      const bool ok = p < np && r0 + rr < rows;
      cp_async16(b + rr * kTc8Ld + c * 16, ok ? W + (r0 + rr) * rowb + sb * 144 + 16 + 32 * pp + c * 16 : W, ok);
    }
    for (int i = tid; i < BM + kTcN; i += 256) {
      if (i < BM) {
        const bool ok = p < np && t0 + i < T;
        Ad[stage * BM + i] = ok ? xd[(t0 + i) * nsb + sb] : 0.0f;
      } else {
        const int rr = i - BM;
        float s0 = 0, s1 = 0, m0 = 0, m1 = 0;
        if (p < np && r0 + rr < rows) {
          const uint4 h = __ldg(reinterpret_cast<const uint4*>(W + (r0 + rr) * rowb + sb * 144));
          const float d = __half2float(__ushort_as_half(static_cast<uint16_t>(h.x & 0xFFFF)));
          const float dm = __half2float(__ushort_as_half(static_cast<uint16_t>(h.x >> 16)));
          int sc, mn;
          kq_scale_min(2 * pp, h, &sc, &mn);
          s0 = d * static_cast<float>(sc), m0 = dm * static_cast<float>(mn);
          kq_scale_min(2 * pp + 1, h, &sc, &mn);
          s1 = d * static_cast<float>(sc), m1 = dm * static_cast<float>(mn);
        }
        Bsc[(stage * 2) * kTcN + rr] = s0, Bsc[(stage * 2 + 1) * kTcN + rr] = s1;
        Bmn[(stage * 2) * kTcN + rr] = m0, Bmn[(stage * 2 + 1) * kTcN + rr] = m1;
      }
    }
  };
  pdl_launch();
  pdl_wait();
#pragma unroll
  for (int st = 0; st < kTc8Stages - 1; ++st) {
    load(st, st);
    cp_async_commit();
  }
  float acc[MT][4][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
  for (int64_t p = 0; p < np; ++p) {
    cp_async_wait<kTc8Stages - 2>();
    __syncthreads();
    load(static_cast<int>((p + kTc8Stages - 1) % kTc8Stages), p + kTc8Stages - 1);
    cp_async_commit();
    const int st = static_cast<int>(p % kTc8Stages);
    const int8_t* a = As + st * BM * kTcQ4kLd + (wm * (BM / 2) + g) * kTcQ4kLd + 4 * tq;
    const uint8_t* b = Bs + st * kTcN * kTc8Ld + (wn * 32 + g) * kTc8Ld + 4 * tq;
    const float* ad = Ad + st * BM + wm * (BM / 2) + g;
    uint32_t wlo[4], whi[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      wlo[j] = *reinterpret_cast<const uint32_t*>(b + j * 8 * kTc8Ld);
      whi[j] = *reinterpret_cast<const uint32_t*>(b + j * 8 * kTc8Ld + 16);
    }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const float* sc = Bsc + (st * 2 + s) * kTcN + wn * 32 + 2 * tq;
      const float* mn = Bmn + (st * 2 + s) * kTcN + wn * 32 + 2 * tq;
      uint32_t bf[4][2];
      float ws[4][2], wm2[4][2];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        bf[j][0] = (wlo[j] >> (4 * s)) & 0x0F0F0F0Fu;
        bf[j][1] = (whi[j] >> (4 * s)) & 0x0F0F0F0Fu;
        ws[j][0] = sc[j * 8], ws[j][1] = sc[j * 8 + 1];
        wm2[j][0] = mn[j * 8], wm2[j][1] = mn[j * 8 + 1];
      }
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        const int8_t* ai = a + i * 16 * kTcQ4kLd + 32 * s;
        const uint32_t a0 = *reinterpret_cast<const uint32_t*>(ai);
        const uint32_t a1 = *reinterpret_cast<const uint32_t*>(ai + 8 * kTcQ4kLd);
        const uint32_t a2 = *reinterpret_cast<const uint32_t*>(ai + 16);
        const uint32_t a3 = *reinterpret_cast<const uint32_t*>(ai + 8 * kTcQ4kLd + 16);
        // The sub-block's input sums of rows g and g + 8: this lane's 8 quants of each, then
        // the quad's four lanes (tq) added.
        int bs0 = dot4(0x01010101, static_cast<int>(a2), dot4(0x01010101, static_cast<int>(a0), 0));
        int bs1 = dot4(0x01010101, static_cast<int>(a3), dot4(0x01010101, static_cast<int>(a1), 0));
        bs0 += __shfl_xor_sync(0xffffffffu, bs0, 1);
        bs0 += __shfl_xor_sync(0xffffffffu, bs0, 2);
        bs1 += __shfl_xor_sync(0xffffffffu, bs1, 1);
        bs1 += __shfl_xor_sync(0xffffffffu, bs1, 2);
        const float x0 = ad[i * 16], x1 = ad[i * 16 + 8];
        const float f0 = static_cast<float>(bs0), f1 = static_cast<float>(bs1);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          int c[4] = {0, 0, 0, 0};
          mma_s8(c, a0, a1, a2, a3, bf[j][0], bf[j][1]);
          acc[i][j][0] += x0 * (ws[j][0] * static_cast<float>(c[0]) - wm2[j][0] * f0);
          acc[i][j][1] += x0 * (ws[j][1] * static_cast<float>(c[1]) - wm2[j][1] * f0);
          acc[i][j][2] += x1 * (ws[j][0] * static_cast<float>(c[2]) - wm2[j][0] * f1);
          acc[i][j][3] += x1 * (ws[j][1] * static_cast<float>(c[3]) - wm2[j][1] * f1);
        }
      }
    }
  }
  cp_async_wait<0>();
  store_tc_tile<BM>(job.y[m], acc, r0, t0, T, rows);
}

template <int BM>
void tc8_q4k_launch(const LinJob& job, const int8_t* q, const float* d, int T, int64_t tiles) {
  constexpr size_t smem = static_cast<size_t>(kTc8Stages) *
                          (BM * kTcQ4kLd + kTcN * kTc8Ld + (BM + 4 * kTcN) * 4);
  static bool raised = false;
  if (!raised) {
    const cudaError_t e = cudaFuncSetAttribute(k_lin_tc8_q4k<BM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) throw Error(std::string("CUDA: int8 tensor-core product: ") + cudaGetErrorString(e));
    raised = true;
  }
  launch("linear", k_lin_tc8_q4k<BM>, dim3(static_cast<unsigned>(tiles), (T + BM - 1) / BM), dim3(256),
         smem, job, q, d, T);
}

template <int DT, int BM>
void tc8_launch(const LinJob& job, const int8_t* q, const float* d, int T, int64_t tiles) {
  constexpr size_t smem = static_cast<size_t>(kTc8Stages) * (BM + kTcN) * (kTc8Ld + 4);
  static bool raised = false;  // over 48 KB of shared memory needs an opt-in
  if (!raised) {
    const cudaError_t e = cudaFuncSetAttribute(k_lin_tc8<DT, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) throw Error(std::string("CUDA: int8 tensor-core product: ") + cudaGetErrorString(e));
    raised = true;
  }
  launch("linear", k_lin_tc8<DT, BM>, dim3(static_cast<unsigned>(tiles), (T + BM - 1) / BM), dim3(256),
         smem, job, q, d, T);
}

void repack_q6_k(const void* src, int64_t rows, int64_t cols, void* dst) {
  const int64_t blocks = rows * (cols / 256);
  const uint8_t* s = static_cast<const uint8_t*>(src);
  uint8_t* q = static_cast<uint8_t*>(dst);
  uint8_t* sc = q + blocks * 192;
  uint8_t* d = sc + blocks * 16;
  for (int64_t i = 0; i < blocks; ++i) {
    std::memcpy(q + i * 192, s + i * 210, 192);
    std::memcpy(sc + i * 16, s + i * 210 + 192, 16);
    std::memcpy(d + i * 2, s + i * 210 + 208, 2);
  }
}

void linear(const DevMat& w, const float* x, int T, float* y, Act act, void* scratch,
            bool x_ready, const double* in_sum, const Residual* res) {
  linear_multi(&w, &y, 1, x, T, act, scratch, x_ready, in_sum, res);
}

bool residual_fusable(const DevMat& w, int T) {
  // The products whose epilogue is store_rows: k_lin_half (one row) and the int8 kernels
  // (not the tensor-core ones, from 16 rows); q8_2f only where it quantizes in the product.
  return T == 1 && (half_decode(w) || int8_decode(w)) && (!w.col_scale || q8_col_in_kernel(w, T));
}

bool half_decode(const DevMat& w) {
  return (w.dtype == kBF16 || w.dtype == kF16) && w.cols % 8 == 0;
}

void linear_swiglu(const DevMat& gate, const DevMat& up, const float* x, float* v, const float* sg,
                   const float* su, double* sum, Act act) {
  if (!half_decode(gate) || up.dtype != gate.dtype || up.cols != gate.cols || up.rows != gate.rows)
    throw Error("linear_swiglu: gate and up must be BF16/F16 of one shape");
  LinJob job;
  job.t = gate.dtype;
  job.cols = gate.cols;
  job.n = 1;
  job.w[0] = static_cast<const uint8_t*>(gate.data);
  job.w[1] = static_cast<const uint8_t*>(up.data);
  job.y[0] = v;
  job.rows[0] = gate.rows;
  job.sg = sg, job.su = su, job.out_sum = sum;
  // Pairs of R rows: 2R rows a warp, as many as still leave every SM four blocks.
  const int R = gate.rows / 2 >= 16LL * sms() ? 2 : 1;
  job.wend[0] = (gate.rows + R - 1) / R;
  const dim3 grid(static_cast<unsigned>((job.wend[0] + kWarps - 1) / kWarps)), block(32 * kWarps);
  prof_mark(g_label ? g_label : "linear", 2 * weight_bytes(gate.dtype, gate.rows, gate.cols));
  const bool rx = act == Act::Bf16;
  if (gate.dtype == kBF16) {
    if (R == 2) launch("linear", k_lin_half<kBF16, 2, 1, true>, grid, block, 0, job, x, 1, rx);
    else launch("linear", k_lin_half<kBF16, 1, 1, true>, grid, block, 0, job, x, 1, rx);
  } else {
    if (R == 2) launch("linear", k_lin_half<kF16, 2, 1, true>, grid, block, 0, job, x, 1, rx);
    else launch("linear", k_lin_half<kF16, 1, 1, true>, grid, block, 0, job, x, 1, rx);
  }
  g_label = nullptr;
  check_last("linear");
}

void linear_multi(const DevMat* ws, float* const* ys, int n, const float* x, int T, Act act,
                  void* scratch, bool x_ready, const double* in_sum, const Residual* res) {
  if (T <= 0 || n <= 0) return;
  if (n > 4) throw Error("linear_multi: at most 4 matrices");
  if (res && (n != 1 || !residual_fusable(ws[0], T) || !res->counter))
    throw Error("linear: a fused residual is for one decode product that residual_fusable takes");
  const int t = ws[0].dtype;
  const int64_t cols = ws[0].cols;
  const bool quant = t == kQ8_0 || t == kQ4_0 || t == kQ4_K || t == kQ5_K || t == kQ6_K;
  const bool half = half_decode(ws[0]);
  int64_t rows_all = 0;
  for (int i = 0; i < n; ++i) rows_all += ws[i].rows;
  const int NT = quant || half ? (T == 1 ? 1 : T <= 4 ? 4 : 8) : kMaxT;
  const int R = quant || half ? pick_rows(rows_all, NT) : 1;
  LinJob job;
  job.t = t;
  job.cols = cols;
  job.n = n;
  job.in_sum = in_sum;
  if (res) job.res = *res;
  if (in_sum && !((half || quant) && T == 1))
    throw Error("linear: an input normalised in the product is for BF16/F16 and int8 decode rows only");
  int64_t warps = 0;
  uint64_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    if (ws[i].dtype != t || ws[i].cols != cols)
      throw Error("linear_multi: matrices differ in type or width");
    job.w[i] = static_cast<const uint8_t*>(ws[i].data);
    job.sc[i] = static_cast<const uint8_t*>(ws[i].scales);
    job.y[i] = ys[i];
    job.rows[i] = ws[i].rows;
    job.wend[i] = warps += (ws[i].rows + R - 1) / R;
    bytes += weight_bytes(t, ws[i].rows, cols);
  }
  if (t == kBF16 && (act == Act::Bf16 || g_tc_float) && g_tc && T >= kTcMinT && cols % kTcK == 0) {
    int64_t tiles = 0;
    for (int i = 0; i < n; ++i) job.wend[i] = tiles += (ws[i].rows + kTcN - 1) / kTcN;
    if (!scratch) throw Error("linear: tensor-core products need a scratch buffer");
    __nv_bfloat16* xb = static_cast<__nv_bfloat16*>(scratch);
    const int64_t total = static_cast<int64_t>(T) * cols;
    prof_mark("round input");
    launch("linear input", k_to_bf16,
           dim3(static_cast<unsigned>(std::min<int64_t>(4096, (total / 4 + 255) / 256))), dim3(256),
           0, x, total, xb);
    prof_mark(g_label ? g_label : "linear", bytes);
    if (g_cublas) {
      for (int i = 0; i < n; ++i)
        cublas_gemm_bf16(ws[i].data, ws[i].rows, cols, xb, T, ys[i], g_stream);
      g_label = nullptr;
      check_last("linear");
      return;
    }
    // 128 input rows a tile where that still gives every SM two tiles, else 64.
    const bool big = tiles * ((T + 127) / 128) >= 2 * sms();
    const bool ldm = g_tc2 && cols % kTc2K == 0;
    if (big) ldm ? tc_launch<128, true>(job, xb, T, tiles) : tc_launch<128, false>(job, xb, T, tiles);
    else ldm ? tc_launch<64, true>(job, xb, T, tiles) : tc_launch<64, false>(job, xb, T, tiles);
    g_label = nullptr;
    return;
  }
  const dim3 grid(static_cast<unsigned>((warps + kWarps - 1) / kWarps), (T + NT - 1) / NT);
  if (ws[0].col_scale) {
    if (!q8_col_in_kernel(ws[0], T))
      throw Error("linear: column-scaled (q8_2f) rows quantize their input in the product only "
                  "for Q8_0 blocks and fewer than 16 input rows");
    for (int i = 0; i < n; ++i) {
      if (!ws[i].col_scale) throw Error("linear_multi: column-scaled and plain matrices in one launch");
      job.col[i] = ws[i].col_scale;
    }
    job.xf = x;
    prof_mark(g_label ? g_label : "linear", bytes);
    dispatch<RunQ8Col>(R, NT, grid, job, T);
    g_label = nullptr;
    check_last("linear");
    return;
  }
  if (quant) {
    if (act != Act::Block32 && act != Act::Block256)
      throw Error("linear: quantized weights take int8 inputs");
    const QOut qo = act_layout(act, scratch, T, cols);
    const int B = qo.B;
    const int64_t blocks = static_cast<int64_t>(T) * cols / B;
    int8_t* q = qo.q;
    float* d = qo.d;
    if (!x_ready) {
      prof_mark("quantize input");
      launch("linear input", k_quant_act, dim3(static_cast<unsigned>((blocks + 7) / 8)), dim3(256),
             0, x, blocks, B, q, d);
    }
    prof_mark(g_label ? g_label : "linear", bytes);
    if ((t == kQ8_0 || t == kQ4_0 || t == kQ4_K) && g_tc && g_tc_int8 && T >= kTcMinT) {
      int64_t tiles = 0;
      for (int i = 0; i < n; ++i) job.wend[i] = tiles += (ws[i].rows + kTcN - 1) / kTcN;
      const bool big = tiles * ((T + 127) / 128) >= 2 * sms();  // as the BF16 tiles choose
      if (t == kQ4_K) {
        if (big) tc8_q4k_launch<128>(job, q, d, T, tiles);
        else tc8_q4k_launch<64>(job, q, d, T, tiles);
      } else if (t == kQ8_0) {
        if (big) tc8_launch<kQ8_0, 128>(job, q, d, T, tiles);
        else tc8_launch<kQ8_0, 64>(job, q, d, T, tiles);
      } else {
        if (big) tc8_launch<kQ4_0, 128>(job, q, d, T, tiles);
        else tc8_launch<kQ4_0, 64>(job, q, d, T, tiles);
      }
      g_label = nullptr;
      check_last("linear");
      return;
    }
    switch (t) {
      case kQ8_0:
        dispatch<RunQ8>(R, NT, grid, job, static_cast<const int8_t*>(q),
                        static_cast<const float*>(d), T);
        break;
      case kQ4_0:
        dispatch<RunQ4>(R, NT, grid, job, static_cast<const int8_t*>(q),
                        static_cast<const float*>(d), T);
        break;
      case kQ4_K:
        dispatch<RunKq<kQ4_K>>(R, NT, grid, job, static_cast<const int8_t*>(q),
                               static_cast<const float*>(d), T);
        break;
      case kQ5_K:
        dispatch<RunKq<kQ5_K>>(R, NT, grid, job, static_cast<const int8_t*>(q),
                               static_cast<const float*>(d), T);
        break;
      default:
        dispatch<RunKq<kQ6_K>>(R, NT, grid, job, static_cast<const int8_t*>(q),
                               static_cast<const float*>(d), T);
        break;
    }
  } else if (half) {
    prof_mark(g_label ? g_label : "linear", bytes);
    if (t == kBF16)
      dispatch<RunHalf<kBF16>>(R, NT, grid, job, x, T, act == Act::Bf16);
    else
      dispatch<RunHalf<kF16>>(R, NT, grid, job, x, T, act == Act::Bf16);
  } else {
    if (act == Act::Bf16) {
      const int64_t elems = static_cast<int64_t>(T) * cols;
      float* r = static_cast<float*>(scratch);
      prof_mark("round input");
      launch("linear input", k_round_bf16,
             dim3(static_cast<unsigned>(std::min<int64_t>(4096, (elems + 255) / 256))), dim3(256),
             0, x, elems, r);
      check_last("linear input");
      x = r;
    }
    prof_mark(g_label ? g_label : "linear", bytes);
    launch("linear", k_lin_generic, grid, dim3(32 * kWarps), 0, job, x, T);
  }
  g_label = nullptr;
  check_last("linear");
}

void prof_label(const char* name) {
  g_label = name;
}

void normalize_rows(float* x, int T, int64_t n) {
  if (T <= 0) return;
  prof_mark("normalize");
  launch("normalize", k_normalize_rows, dim3(T), dim3(row_threads(n)), 0, x, n);
  check_last("normalize");
}

void ngpt_residual(float* x, float* y, const float* alpha, int T, int64_t n, QOut qo) {
  if (T <= 0) return;
  prof_mark("ngpt_residual");
  launch("ngpt_residual", k_ngpt_residual, dim3(T), dim3(row_threads(n)), 0, x, y, alpha, n, qo);
  check_last("ngpt_residual");
}

void loop_begin(float* x, float* state, float* inp, int T, int64_t n, bool first, QOut qo) {
  prof_mark("loop_begin");
  launch("loop_begin", k_loop_begin, dim3(T), dim3(row_threads(n)), 0, x, state, inp, n, first, qo);
  check_last("loop_begin");
}

void loop_end(const float* x, float* state, int T, int64_t n) {
  prof_mark("loop_end");
  launch("loop_end", k_loop_end, dim3(T), dim3(row_threads(n)), 0, x, state, n);
  check_last("loop_end");
}

void qk_prepare(float* q, float* k, const float* v, const float* q_scale, const AttnRow* rows,
                int T, int nh, int nk, int hd, int half, double theta, int rotary_dims) {
  const int threads = ((hd + 31) / 32) * 32;
  prof_mark("qk_prepare");
  launch("qk_prepare", k_qk_prepare, dim3(T, nh + nk), dim3(threads), hd * sizeof(float), q, k, v,
         q_scale, rows, nh, nk, hd, half, theta, rotary_dims);
  check_last("qk_prepare");
}

int attention_splits(int T, int nh, int64_t keys) {
  // DORY_CUDA_ATT_SPLITS=N fixes the count (1-32) for every pass: to measure what the splits
  // cost a decode token at short contexts against what they buy at long ones.
  static const int fixed = [] {
    const char* e = std::getenv("DORY_CUDA_ATT_SPLITS");
    return e && *e ? std::max(1, std::min(32, std::atoi(e))) : 0;
  }();
  if (fixed) return fixed;
  // Two blocks an SM over the (row, head) pairs; a decode row of 1,024 keys or more takes 32.
  // H100, 4B shape (sliding window 1,024), Q4_K_M tg64 (2026-12-07): at 64 keys 16 splits (the
  // first term) 226.5 / 225.0 t/s, 32 222.9 / 222.4; 4,096 keys deep, 16 156.7 / 157.8, 32 on
  // the full-attention layers only (over 2,048 keys) 169.8, 32 on every layer 184.0 / 183.3.
  int s = 2 * sms() / std::max(1, T * nh);
  if (T == 1 && keys >= 1024) s = std::max<int64_t>(s, std::min<int64_t>(32, keys / 32));
  return std::max(1, std::min(32, s));
}

int64_t attention_part_floats(int T, int nh, int hd) {
  int64_t most = 0;  // a pass of fewer rows may take more splits
  for (int t = 1; t <= T; ++t) {
    const int S = attention_splits(t, nh, INT64_MAX);
    if (S > 1) most = std::max<int64_t>(most, static_cast<int64_t>(t) * nh * S * (hd + 2));
  }
  return most;
}

void attention(const float* q, const AttnRow* rows, int T, int nh, int nk, int hd, float* out,
               float* part, int* counters) {
  if (hd > 32 * kMaxDimsPerLane)
    throw Error("--device cuda: head dimension " + std::to_string(hd) + " is over 512");
  const int S = attention_splits(T, nh);
  const size_t smem = (kAttWarps * hd + 2 * kAttWarps) * sizeof(float);
  prof_mark("attention");
  launch("attention", k_attention<false>, dim3(T, nh, S), dim3(32 * kAttWarps), smem, q, rows, nh,
         nk, hd, S, out, part, counters, FuseArgs{});
}

void attention_decode(float* q, const float* k, const float* v, const float* q_scale,
                      const AttnRow* rows, int nh, int nk, int hd, int half, double theta,
                      int rotary_dims, float* out, float* part, int* counters, const float* g,
                      const float* gate_scale, double* sum, int64_t keys, QOut qo) {
  if (hd > 32 * kMaxDimsPerLane)
    throw Error("--device cuda: head dimension " + std::to_string(hd) + " is over 512");
  if (qo.B && hd % qo.B != 0) throw Error("attention_decode: quant blocks must tile a head");
  const int S = attention_splits(1, nh, keys);
  const size_t smem = (kAttWarps * hd + 2 * kAttWarps + 3 * hd) * sizeof(float);
  FuseArgs fa;
  fa.k = k, fa.v = v, fa.q_scale = q_scale, fa.half = half, fa.rotary_dims = rotary_dims;
  fa.theta = theta;
  fa.g = g, fa.gs = gate_scale, fa.sum = sum;
  fa.qo = qo;
  prof_mark(sum ? "attention (+ qk_prepare, gate)" : "attention (+ qk_prepare)");
  launch("attention", k_attention<true>, dim3(1, nh, S), dim3(32 * kAttWarps), smem, q, rows, nh,
         nk, hd, S, out, part, counters, fa);
}

// The staging scratch of flash attention (k_kv_stage): one for the process, grown on demand,
// never while a graph is captured; nullptr where it cannot be had (the unstaged kernel runs
// instead). Several backends (each its own stream) share it: each use waits for the last
// (g_stage_done, recorded after every staged launch).
void* g_stage = nullptr;
size_t g_stage_bytes = 0;
cudaEvent_t g_stage_done = nullptr;
constexpr size_t kStageMax = size_t(1) << 30;

void* stage_scratch(size_t bytes) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (bytes > kStageMax || cudaStreamIsCapturing(g_stream, &cs) != cudaSuccess ||
      cs != cudaStreamCaptureStatusNone)
    return nullptr;
  if (bytes <= g_stage_bytes) return g_stage;
  const cudaError_t e = cudaDeviceSynchronize();  // the old scratch may be in use on any stream
  if (e != cudaSuccess) throw Error(std::string("CUDA: flash staging: ") + cudaGetErrorString(e));
  if (g_stage) cudaFree(g_stage);
  g_stage = nullptr, g_stage_bytes = 0;
  const size_t want = std::min(kStageMax, bytes + bytes / 2);  // room for the next chunks
  for (size_t n : {want, bytes}) {
    if (cudaMalloc(&g_stage, n) == cudaSuccess) {
      g_stage_bytes = n;
      return g_stage;
    }
    cudaGetLastError();  // out of memory is not sticky; the unstaged kernel needs no scratch
    g_stage = nullptr;
  }
  return nullptr;
}

template <int HD, bool F16, int WN, bool ST>
void flash_launch(const float* q, const AttnRow* rows, int T, int nh, int nk, float* out,
                  const uint16_t* kst, const uint16_t* vst, int64_t ncap) {
  constexpr int kFaM = 16 * WN;
  constexpr size_t smem = fa_smem_bytes<HD, WN, ST>();
  static bool raised = false;  // the block's shared memory over 48 KB needs an opt-in
  if (!raised) {
    const cudaError_t e = cudaFuncSetAttribute(k_flash_attn<HD, F16, WN, ST>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) throw Error(std::string("CUDA: flash attention: ") + cudaGetErrorString(e));
    raised = true;
  }
  launch("flash attention", k_flash_attn<HD, F16, WN, ST>, dim3((T + kFaM - 1) / kFaM, nh),
         dim3(32 * WN), smem, q, rows, T, nh, nk, out, kst, vst, ncap);
}

template <int HD, bool F16, int WN>
void flash_run(const float* q, const AttnRow* rows, int T, int nh, int nk, float* out, int64_t keys) {
  // Staged where the caller gave the key count (tiles <= keys / 64 rounded up) and the
  // scratch is there: keys and values of every kv head, 2 bytes each.
  const int64_t ncap = (keys + kFaN - 1) / kFaN;
  void* st = g_flash_stage && keys > 0
                 ? stage_scratch(static_cast<size_t>(2 * 2) * nk * ncap * kFaN * HD)
                 : nullptr;
  if (!st) {
    prof_mark("attention (tensor cores)");
    return flash_launch<HD, F16, WN, false>(q, rows, T, nh, nk, out, nullptr, nullptr, 0);
  }
  uint16_t* kst = static_cast<uint16_t*>(st);
  uint16_t* vst = kst + static_cast<size_t>(nk) * ncap * kFaN * HD;
  if (!g_stage_done && cudaEventCreateWithFlags(&g_stage_done, cudaEventDisableTiming) != cudaSuccess)
    throw Error("CUDA: flash staging: cudaEventCreate failed");
  if (cudaStreamWaitEvent(g_stream, g_stage_done, 0) != cudaSuccess)  // another stream's last use
    throw Error("CUDA: flash staging: cudaStreamWaitEvent failed");
  prof_mark("attention (staging K/V)");
  launch("flash staging", k_kv_stage<HD, F16>, dim3(static_cast<unsigned>(ncap), nk), dim3(256), 0,
         rows, T, nk, kst, vst, ncap);
  prof_mark("attention (tensor cores)");
  flash_launch<HD, F16, WN, true>(q, rows, T, nh, nk, out, kst, vst, ncap);
  if (cudaEventRecord(g_stage_done, g_stream) != cudaSuccess)
    throw Error("CUDA: flash staging: cudaEventRecord failed");
}

bool flash_attention(const float* q, const AttnRow* rows, int T, int nh, int nk, int hd,
                     float* out, int64_t keys) {
  if (!g_tc || !g_flash || !g_tc_float || T < kTcMinT) return false;
  auto go = [&](auto hdc) {
    constexpr int H = decltype(hdc)::value;
    // 8 warps (128 query rows a block, the key tiles' loads and conversion shared by twice
    // the rows) where a chunk sees many keys: H100, 4B shape, pp4096 in chunks of 512, all
    // chunks on 8 warps against 4, alternated: 12023 / 12180 against 10989 / 10745 t/s
    // (+9% / +13%). Chunks over fewer keys keep 4 (twice the blocks, and little attention).
    const int wn = g_flash_warps ? g_flash_warps : keys >= 1024 ? 8 : 4;
    if (wn == 8) {
      if (g_flash_f16) flash_run<H, true, 8>(q, rows, T, nh, nk, out, keys);
      else flash_run<H, false, 8>(q, rows, T, nh, nk, out, keys);
    } else {
      if (g_flash_f16) flash_run<H, true, 4>(q, rows, T, nh, nk, out, keys);
      else flash_run<H, false, 4>(q, rows, T, nh, nk, out, keys);
    }
  };
  switch (hd) {
    case 16: go(std::integral_constant<int, 16>{}); break;
    case 32: go(std::integral_constant<int, 32>{}); break;
    case 64: go(std::integral_constant<int, 64>{}); break;
    case 128: go(std::integral_constant<int, 128>{}); break;
    case 256: go(std::integral_constant<int, 256>{}); break;
    default: return false;
  }
  check_last("flash attention");
  return true;
}

void gate_norm(float* y, const float* g, const float* gate_scale, int T, int64_t w, QOut qo) {
  prof_mark("gate_norm");
  launch("gate_norm", k_gate_norm, dim3(T), dim3(row_threads(w)), 0, y, g, gate_scale, w, qo);
  check_last("gate_norm");
}

void swiglu_norm(float* g, const float* u, const float* sg, const float* su, int T, int64_t f,
                 QOut qo) {
  prof_mark("swiglu_norm");
  launch("swiglu_norm", k_swiglu_norm, dim3(T), dim3(row_threads(f)), 0, g, u, sg, su, f, qo);
  check_last("swiglu_norm");
}

void swiglu_quant(float* g, const float* u, const float* sg, const float* su, int64_t f, QOut qo,
                  double* sum) {
  if (qo.B != 32 && qo.B != 256) throw Error("swiglu_quant: an int8 block layout is needed");
  if (f % qo.B) throw Error("swiglu_quant: the width is not a multiple of the block");
  prof_mark("swiglu_quant");
  const int64_t blocks = f / qo.B;
  launch("swiglu_quant", k_swiglu_quant, dim3(static_cast<unsigned>((blocks + 7) / 8)), dim3(256), 0,
         g, u, sg, su, f, qo, sum);
  check_last("swiglu_quant");
}

bool q8_col_in_kernel(const DevMat& w, int T) {
  return w.col_scale && w.dtype == kQ8_0 && w.cols % 32 == 0 && T < kTcMinT && g_q8_col;
}

void set_q8_col(bool on) {
  g_q8_col = on;
}

bool int8_decode(const DevMat& w) {
  return w.dtype == kQ8_0 || w.dtype == kQ4_0 || w.dtype == kQ4_K || w.dtype == kQ5_K ||
         w.dtype == kQ6_K;
}

void scale_input(const float* x, const float* col, int T, int64_t cols, float* out) {
  const int64_t total = static_cast<int64_t>(T) * cols;
  prof_mark(x == out ? "scale_cols" : "scale_input");
  launch("scale_cols", k_scale_cols,
         dim3(static_cast<unsigned>(std::min<int64_t>(4096, (total + 255) / 256))), dim3(256), 0, x,
         col, total, cols, out);
  check_last("scale_cols");
}

void scale_cols(float* logits, const float* scale, int T, int64_t V) {
  scale_input(logits, scale, T, V, logits);
}

void gather_rows(const float* x, const int64_t* idx, int n_rows, int64_t n, float* y) {
  const int64_t total = static_cast<int64_t>(n_rows) * n;
  if (total == 0) return;
  prof_mark("gather_rows");
  launch("gather_rows", k_gather_rows,
         dim3(static_cast<unsigned>(std::min<int64_t>(4096, (total + 255) / 256))), dim3(256), 0, x,
         idx, n, total, y);
  check_last("gather_rows");
}

void prof_phase(const char* name) {
  g_phase = name;
}

void prof_enable(bool on) {
  g_prof = on;
}

bool prof_on() {
  return g_prof;
}

void prof_flush() {
  if (!g_prof || g_marks.empty()) return;
  prof_mark("(end)");
  cudaEventSynchronize(g_marks.back().ev);
  for (size_t i = 0; i + 1 < g_marks.size(); ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, g_marks[i].ev, g_marks[i + 1].ev);
    ProfTotal& p = g_totals[g_marks[i].name];
    ++p.n;
    p.ms += ms;
    p.bytes += static_cast<double>(g_marks[i].bytes);
  }
  for (auto& m : g_marks) g_free_events.push_back(m.ev);
  g_marks.clear();
}

std::string prof_report() {
  if (g_totals.empty()) return "";
  std::vector<std::pair<std::string, ProfTotal>> v(g_totals.begin(), g_totals.end());
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) {
    const std::string pa = a.first.substr(0, a.first.find(" | ")),
                      pb = b.first.substr(0, b.first.find(" | "));
    return pa != pb ? pa < pb : a.second.ms > b.second.ms;
  });
  std::map<std::string, double> all;  // each pass kind's total
  for (auto& e : v) all[e.first.substr(0, e.first.find(" | "))] += e.second.ms;
  std::string out =
      "| pass | kernel | launches | total ms | share | mean us | GB read | GB/s |\n"
      "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  char line[256];
  for (auto& [name, p] : v) {
    std::snprintf(
        line, sizeof line, "| %s | %lld | %.2f | %.1f%% | %.1f | %.2f | %s |\n", name.c_str(),
        static_cast<long long>(p.n), p.ms, 100 * p.ms / all[name.substr(0, name.find(" | "))],
        1e3 * p.ms / p.n, p.bytes / 1e9,
        p.bytes > 0 ? std::to_string(static_cast<int>(p.bytes / p.ms / 1e6)).c_str() : "");
    out += line;
  }
  return out;
}

double read_probe(const void* data, uint64_t bytes, int reps) {
  unsigned* sink = nullptr;
  if (cudaMalloc(&sink, sizeof(unsigned)) != cudaSuccess)
    throw Error("CUDA: read probe: cudaMalloc failed");
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const uint64_t n = bytes / 16;
  k_read<<<sms * 8, 512, 0, g_stream>>>(static_cast<const uint4*>(data), n, sink);  // warm-up
  cudaEventRecord(a, g_stream);
  for (int i = 0; i < reps; ++i)
    k_read<<<sms * 8, 512, 0, g_stream>>>(static_cast<const uint4*>(data), n, sink);
  cudaEventRecord(b, g_stream);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(sink);
  check_last("read probe");
  return ms / 1e3 / reps;
}

}  // namespace dory::cuda
