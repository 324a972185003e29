// The CUDA backend's kernels, callable from plain C++ (cuda_backend.cpp): device pointers
// and sizes in, work queued on the backend's stream. Every launch is checked; a failure
// throws dory::Error with the CUDA error's text.
#pragma once
#include <cstdint>

namespace dory::cuda {

// A weight matrix on the device: rows x cols of a DType (its int value), raw blocks as in
// the file (tensor/quant.h's layouts).
struct DevMat {
  int dtype = 0;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
};

// One attention row of a pass: where its sequence's cache slot keeps keys and values
// (capacity rows of width floats; a ring when ring > 0: row p at p % ring), the row's
// position, and the first position it attends to.
struct AttnRow {
  float* k;
  float* v;
  int64_t ring;
  int64_t pos;
  int64_t lo;
};

void set_stream(void* stream);
void check_last(const char* what);

// How a product's input is taken, as the CPU backend takes it (so both compute one function):
// as it is; rounded to bf16 (BF16 weights where the CPU kernel set rounds: DORY_BF16_INPUT);
// or quantized to int8 per block of 32 (Q8_0, Q4_0) or 256 (the K types) as the CPU's integer
// dot products do (d = max|x| / 127, q = round-to-nearest-even(x / d)), here as q * d.
enum class Act { Float, Bf16, Block32, Block256 };
// Y[t*rows + r] = W[r] . X[t*cols] for t < T, the input taken as `act` says (scratch: T x cols
// floats for the taken input, unused for Act::Float).
void linear(const DevMat& w, const float* x, int T, float* y, Act act = Act::Float,
            float* scratch = nullptr);
// Up to 4 products of one input in one launch: ys[i] = ws[i] . x; the matrices must share
// their type and width (the input is taken once).
void linear_multi(const DevMat* ws, float* const* ys, int n, const float* x, int T,
                  Act act = Act::Float, float* scratch = nullptr);
// Rows t < T of n floats: x <- x / sqrt(sum x^2 + 1e-6).
void normalize_rows(float* x, int T, int64_t n);
// x <- n(n(x) + a * (n(y) - n(x))) per row (y is clobbered).
void ngpt_residual(float* x, float* y, const float* alpha, int T, int64_t n);
// LoopBegin: (first: inp = state = x); x = n(state + inp). LoopEnd: state = n(x).
void loop_begin(float* x, float* state, float* inp, int T, int64_t n, bool first);
void loop_end(const float* x, float* state, int T, int64_t n);
// RoPE (NeoX halves over the first 2*half dims of each head, angle pos * theta^(-2j/r) in
// double as the CPU computes it), then q <- q_scale * n(q) per head, k <- n(k) per head; k and
// v rows go to rows[t]'s cache.
void qk_prepare(float* q, float* k, const float* v, const float* q_scale, const AttnRow* rows,
                int T, int nh, int nk, int hd, int half, double theta, int rotary_dims);
// Softmax attention of every (row, query head) over its cache rows [lo, pos]; out [T x nh*hd].
void attention(const float* q, const AttnRow* rows, int T, int nh, int nk, int hd, float* out);
// y <- n(y * sigmoid(g * gate_scale)) over each row of w floats.
void gate_norm(float* y, const float* g, const float* gate_scale, int T, int64_t w);
// g <- n(silu(g * sg) * (u * su)) over each row of f floats (silu(a) = a * sigmoid(a)).
void swiglu_norm(float* g, const float* u, const float* sg, const float* su, int T, int64_t f);
// logits[t*V + i] *= scale[i].
void scale_cols(float* logits, const float* scale, int T, int64_t V);
// y[i] = x[idx[i]] rows of n floats (gathering the rows a head reads).
void gather_rows(const float* x, const int64_t* idx, int n_rows, int64_t n, float* y);
// Reads `bytes` of device memory once with 16-byte loads (the read-bandwidth probe of
// dory info and dory bench); returns the seconds it took.
double read_probe(const void* data, uint64_t bytes, int reps);

}  // namespace dory::cuda
