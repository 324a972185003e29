// Compute kernels, one set per instruction set, chosen once at startup from
// what the CPU reports (scalar, AVX2+FMA+F16C, AVX2 with AVX-VNNI, AVX-512,
// AVX-512 with VNNI). Model code calls them through kernels(); tests call each
// set directly.
//
// Weight types: F32, F16, BF16 (float products) and Q8_0, Q4_0, Q4_K, Q5_K,
// Q6_K (tensor/quant.h; cols must be whole blocks). The quantized types use
// integer dot products against the input quantized to int8 once (blocks of 32
// with a float scale for Q8_0/Q4_0, ggml's Q8_K blocks of 256 for the K types;
// the same values on every ISA). Callers that reuse one input across many
// calls (linear_multi) quantize it themselves (quantize_act) and call the
// *_qa entry points; matvec/matmat take floats and remember the last input
// they quantized per thread, so the row blocks of one product quantize it once.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace dory::kern {

// A row-major weight matrix [rows x cols] in place in mapped memory; each row
// is row_bytes(dtype, cols) bytes.
struct Mat {
  DType dtype;
  const void* data;
  int64_t rows, cols;
  // Per-column input scales (cols floats) or null: the product is W . (col_scale * x). A CMF
  // q8_2f matrix runs as Q8_0 blocks this way (its row scale as every block's d, its column
  // scales here): linear() in the CPU backend applies them; the kernels never see them.
  const float* col_scale = nullptr;
  // Low-rank adapters added at run time, y += scale * B (A x) each (PEFT LoRA; the base weights
  // are not rewritten): applied by linear() in the CPU backend, never seen by the kernels.
  const std::vector<struct LoraDelta>* lora = nullptr;
};

// One adapter of a matrix [rows x cols]: A [rank x cols] and B [rows x rank], in float, B
// kept transposed (bt [rank x rows]: a rank's column of B is contiguous, so y += B (A x) is
// rank axpy passes over y).
struct LoraDelta {
  int64_t rank = 0;
  float scale = 1;  // what the run applies: user scale x alpha / rank
  const float* a = nullptr;
  const float* bt = nullptr;
  int adapter = 0;  // which --lora (0, 1, ...): a pass may scale each adapter per row
  float base = 1;   // alpha / rank alone: a row's own scale multiplies this
};

// Bytes of a matrix (rows x row_bytes): what one product reads.
uint64_t mat_bytes(const Mat& m);

// Float weights: matmat below this many input rows runs two weight rows against up
// to four input rows straight from the weights (each row with matvec's bits);
// from here on, blocks of weights converted to float once for all rows.
constexpr int64_t kMatmatFewRows = 8;

struct KernelSet {
  const char* name;
  // y[r - r0] = W[r] . x  for r in [r0, r1)
  void (*matvec)(const Mat& w, const float* x, float* y, int64_t r0, int64_t r1);
  // Y[t*ldy + r] = W[r] . X[t*ldx]  for t in [0, T), r in [r0, r1)
  void (*matmat)(const Mat& w, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
                 int64_t r0, int64_t r1);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);  // y += a*x
  // n elements (whole blocks) of any weight type to float; every set gives the
  // same bits as dequantize_row (tensor/quant.h).
  void (*to_f32)(DType t, const void* src, float* dst, int64_t n);

  // Quantized weights only. One input row of n floats in this set's quantized
  // form for weight type t (Q8_0 and Q4_0 share a form, the K types another):
  // act_row_bytes(t, n) bytes (a multiple of 64) at a 64-byte aligned out.
  uint64_t (*act_row_bytes)(DType t, int64_t n);
  void (*quantize_act)(DType t, const float* x, int64_t n, uint8_t* out);
  // matvec on a quantized input row (the same bits as matvec).
  void (*matvec_qa)(const Mat& w, const uint8_t* xq, float* y, int64_t r0, int64_t r1);
  // T input rows in the batch form (the GEMM's arrangement of the same
  // values): batch_bytes(t, T, n) bytes, 64-byte aligned; quantize_batch
  // writes rows [t0, t1) (row t at x + t*ldx), so rows can be split over
  // threads.
  uint64_t (*batch_bytes)(DType t, int64_t T, int64_t n);
  void (*quantize_batch)(DType t, const float* x, int64_t ldx, int64_t n, int64_t t0, int64_t t1,
                         uint8_t* out);
  // Y[t*ldy + r] = W[r] . X[t] on a batch: a register-tiled integer GEMM
  // whose result for (t, r) does not depend on T, r0/r1 or the row's place in
  // a tile (matmat gives the same bits for T > 1; T = 1 there is matvec's
  // computation). Its float sums run in another order than matvec's, so the
  // two agree to rounding, not to the bit.
  void (*matmat_qa)(const Mat& w, const uint8_t* xb, int64_t T, float* y, int64_t ldy, int64_t r0,
                    int64_t r1);

  // Attention over n cache rows (row j at k + j*stride, hd floats) for nq query
  // heads that share them (q_i at q + i*hd):
  //   attn_scores: s[i*lds + j] = q_i . k_j
  //   attn_values: out_i (+)= sum_j w[i*ldw + j] v_j  (out_i at out + i*hd; add: accumulate)
  void (*attn_scores)(const float* q, int nq, const float* k, int64_t stride, int64_t n, int64_t hd,
                      float* s, int64_t lds);
  void (*attn_values)(const float* w, int64_t ldw, int nq, const float* v, int64_t stride,
                      int64_t n, int64_t hd, float* out, bool add);
  // out[i] = 1 / (1 + exp(-x[i] * s[i])) (out may be x). The scalar set calls
  // std::exp; the SIMD sets evaluate exp by a polynomial (within ~2 ulp of it;
  // the result within 1e-6 relative or 1e-37 absolute).
  void (*sigmoid)(const float* x, const float* s, float* out, int64_t n);

  // False on every set but avx512bf16, whose products on BF16 weights (matvec,
  // matmat, and matmat_qa on its batch form) take the input rounded to bf16, as
  // llama.cpp's BF16 path does; batches by vdpbf16ps. Other sets take float
  // weights' inputs as floats (batch_bytes 0: matmat, not matmat_qa).
  bool bf16_input;
};

extern const KernelSet kScalar;
extern const KernelSet kAvx2;
extern const KernelSet kAvx2Vnni;  // AVX2 + AVX-VNNI (vpdpbusd, VEX)
extern const KernelSet kAvx512;
extern const KernelSet kAvx512Vnni;  // AVX-512 + AVX512_VNNI
// AVX-512 + VNNI + AVX512_BF16: kAvx512Vnni, but BF16 weights' products on the
// input rounded to bf16 (bf16_input), as llama.cpp's BF16 path does, batches
// by vdpbf16ps: BF16 batched products ~1.5x as fast (4B-shaped prefill
// 1.3-1.7x), within ~1e-4 of sum |w*x| instead of ~1e-7 (the trained built-in
// model: top-1 agreement 0.998 with the float input, mean KL 1.1e-5). The
// default where present; DORY_BF16_INPUT=float keeps the float input. (An input
// split into two bf16 parts keeps float accuracy but measured no faster than FMA.)
extern const KernelSet kAvx512Bf16;

// The sets this CPU can run, best last (avx512bf16, where present).
std::vector<const KernelSet*> supported();
// The active set: the best supported (with DORY_BF16_INPUT=float, the best that
// computes on float inputs), or DORY_ISA=scalar|avx2|avx2vnni|avx512|avx512vnni|
// avx512bf16 if set.
const KernelSet& active();
inline const KernelSet& kernels() {
  return active();
}

// A growable 64-byte aligned scratch buffer (e.g. a thread's quantized copy
// of an input); get() does not keep the old contents.
class AlignedBuf {
 public:
  AlignedBuf() = default;
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  ~AlignedBuf();
  uint8_t* get(uint64_t bytes);

 private:
  uint8_t* p_ = nullptr;
  uint64_t cap_ = 0;
};

namespace detail {
// Per-thread scratch of the integer-dot kernels (owned by kernels.cpp, so no
// ISA-specific code touches a std:: container): a copy of the last input a
// set quantized, to recognise it, and its quantized form.
struct ActScratch {
  int tag;             // which set and activation format made buf; -1: none
  int64_t rows, cols;  // of the input
  float* src;          // rows*cols floats, a copy of the input
  uint64_t src_cap;    // floats
  uint8_t* buf;        // the quantized input, 64-byte aligned
  uint64_t buf_cap;    // bytes
};
constexpr int kActSlots = 8;
ActScratch& act_scratch(int slot);  // this thread's, slot < kActSlots
// Makes room (contents lost); sets tag = -1.
void act_reserve(ActScratch& s, uint64_t src_floats, uint64_t buf_bytes);
}  // namespace detail

}  // namespace dory::kern
