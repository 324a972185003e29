// The CUDA backend's kernels, callable from plain C++ (cuda_backend.cpp): device pointers
// and sizes in, work queued on the backend's stream. Every launch is checked; a failure
// throws dory::Error with the CUDA error's text.
#pragma once
#include <cstdint>
#include <string>

namespace dory::cuda {

// A weight matrix on the device: rows x cols of a DType (its int value), raw blocks as in
// the file (tensor/quant.h's layouts).
// Q8_0 and Q4_0 go up repacked (cuda_backend.cpp, repack_blocks): `data` holds the quants of
// every row end to end (cols bytes a row for Q8_0, cols / 2 for Q4_0, the nibbles of a block
// in the file's order) and `scales` the blocks' f16 scales, rows x cols / 32; 16-byte loads
// of quants then line up with the blocks. Q6_K goes up repacked too (repack_q6_k): `data`
// the quants, `scales` the scale bytes then the d's. The other types keep the file's layout.
// col_scale (CMF q8_2f, which runs as Q8_0 rows): cols floats the input is multiplied by
// before the product (scale_input), as the CPU backend does.
struct DevMat {
  int dtype = 0;
  const void* data = nullptr;
  const void* scales = nullptr;
  int64_t rows = 0, cols = 0;
  const float* col_scale = nullptr;
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

// The stream every launch goes to, and the switches read from the environment (once per
// backend). use_stream only points the launches at a backend's stream: every backend does so
// before its launches, since several may live in one process (--skill-dynamic's engines, the
// server's skill engines) and each has its own stream.
void set_stream(void* stream);
void use_stream(void* stream);
void check_last(const char* what);

// How a product's input is taken, as the CPU backend takes it (so both compute one function):
// as it is; rounded to bf16 (BF16 weights where the CPU kernel set rounds: DORY_BF16_INPUT);
// or quantized to int8 per block of 32 (Q8_0, Q4_0) or 256 (the K types) as the CPU's integer
// dot products do (d = max|x| / 127, q = round-to-nearest-even(x / d)), here as q * d.
enum class Act { Float, Bf16, Block32, Block256 };
// A row kernel's output also quantized for the product that reads it next (B = 32 or 256; 0:
// none): int8 quants at q (row t at t x n), block scales at d, as linear() keeps its input in
// its scratch (act_layout), so that product skips its own quantizing (x_ready).
// col (CMF q8_2f, decode): the reading matrix's column scales; the quants are then those of
// the output times them, as that product's input is (its only reader: attn o, mlp down).
struct QOut {
  int B = 0;
  int8_t* q = nullptr;
  float* d = nullptr;
  const float* col = nullptr;
};
QOut act_layout(Act act, void* scratch, int T, int64_t cols);
// Products of BF16 weights with 16 or more input rows run on tensor cores with the input
// rounded to bf16 (Act::Bf16's function). With Act::Float they do so only when this is on;
// else those run on CUDA cores in float.
void set_tc_float_inputs(bool on);
// Prompts' Q8_0 / Q4_0 / Q4_K products on int8 tensor cores (on by default; DORY_CUDA_TC_INT8=0
// at set_stream turns them off, to compare with the dp4a products).
void set_tc_int8(bool on);
// BF16 prompts' products with ldmatrix and 64-column slices where cuBLAS is not used (on by
// default; DORY_CUDA_TC2=0 at set_stream: the first kernel; test_cuda_kernels checks both).
void set_tc2(bool on);
// BF16 prompts' products through cuBLAS, loaded at run time (on where it loads; at set_stream
// DORY_CUDA_CUBLAS=0 turns it off, =1 makes a failed load an error). Returns false when asked
// on and cuBLAS cannot be loaded.
bool set_cublas(bool on);
// The nGPT residual of the layer a decode product ends (ngpt_residual's function on x, the
// product's output as y, then the quants for the next product as qo says), done in that
// product's epilogue by the last warp to finish (`counter`: a zero uint, left zero), so the
// row kernel's launch goes. For one input row of BF16/F16 (half_decode) or int8 weights
// (q8_2f where it quantizes in the product) whose output is the whole row of x.
struct Residual {
  float* x = nullptr;
  const float* alpha = nullptr;
  QOut qo;
  unsigned* counter = nullptr;
};
bool residual_fusable(const DevMat& w, int T);
// Y[t*rows + r] = W[r] . X[t*cols] for t < T, the input taken as `act` says. Bf16 rounds in
// the product's own loads; Block32/Block256 quantize the input to int8 and a float scale per
// block into `scratch` (T x cols x 4 bytes is enough) and the product takes integer dot
// products (dp4a) of those with the weights' quants, as the CPU's integer kernels do.
// in_sum (T = 1 only; BF16/F16 and the int8 types): x is a row still to be normalised, sum x^2
// at in_sum; the product takes x / sqrt(sum + 1e-6) (normalize_rows' function): BF16/F16 in
// its loads, the int8 types by scaling the sums (quantization is scale-invariant). res (T = 1,
// residual_fusable): the layer's residual in the epilogue (above).
void linear(const DevMat& w, const float* x, int T, float* y, Act act = Act::Float,
            void* scratch = nullptr, bool x_ready = false, const double* in_sum = nullptr,
            const Residual* res = nullptr);
// Whether w takes the decode fusions (in_sum, linear_swiglu): BF16/F16, width a multiple of 8.
bool half_decode(const DevMat& w);
// Decode (one input row) gate/up in one launch with swiglu in its epilogue: v = silu((gate.x)
// * sg) * ((up.x) * su), its squares added to *sum (zero before): swiglu_norm less the
// scaling, which the down product takes through in_sum.
void linear_swiglu(const DevMat& gate, const DevMat& up, const float* x, float* v, const float* sg,
                   const float* su, double* sum, Act act);
// Up to 4 products of one input in one launch: ys[i] = ws[i] . x; the matrices must share
// their type and width (the input is taken once).
void linear_multi(const DevMat* ws, float* const* ys, int n, const float* x, int T,
                  Act act = Act::Float, void* scratch = nullptr, bool x_ready = false,
                  const double* in_sum = nullptr, const Residual* res = nullptr);
// Bytes of Q8_0 / Q4_0 blocks repacked as DevMat says (quants, then f16 scales).
void repack_blocks(int dtype, const void* src, int64_t rows, int64_t cols, void* dst);
// Q6_K blocks repacked as DevMat says: every block's 192 bytes of quants (ql, qh) end to end,
// then the blocks' 16 scale bytes, then their f16 d (the same 210 bytes a block in all).
void repack_q6_k(const void* src, int64_t rows, int64_t cols, void* dst);
// Rows t < T of n floats: x <- x / sqrt(sum x^2 + 1e-6).
void normalize_rows(float* x, int T, int64_t n);
// x <- n(n(x) + a * (n(y) - n(x))) per row (y is clobbered).
void ngpt_residual(float* x, float* y, const float* alpha, int T, int64_t n, QOut qo = {});
// LoopBegin: (first: inp = state = x); x = n(state + inp). LoopEnd: state = n(x).
void loop_begin(float* x, float* state, float* inp, int T, int64_t n, bool first, QOut qo = {});
void loop_end(const float* x, float* state, int T, int64_t n);
// RoPE (NeoX halves over the first 2*half dims of each head, angle pos * theta^(-2j/r) in
// double as the CPU computes it), then q <- q_scale * n(q) per head, k <- n(k) per head; k and
// v rows go to rows[t]'s cache.
void qk_prepare(float* q, float* k, const float* v, const float* q_scale, const AttnRow* rows,
                int T, int nh, int nk, int hd, int half, double theta, int rotary_dims);
// Softmax attention of every (row, query head) over its cache rows [lo, pos]; out [T x nh*hd].
// A row's positions are split over attention_splits(T, nh) blocks (a fixed number for a pass
// shape, so a captured graph stays valid as the sequence grows), each a few warps, whose partial softmax
// sums `part` holds (attention_part_floats(T', nh, hd) floats, enough for every T' <= T) until
// the last of them joins them, found by `counters` (T x nh ints, zero before, zero after).
void attention(const float* q, const AttnRow* rows, int T, int nh, int nk, int hd, float* out,
               float* part, int* counters);
// The same on tensor cores (bf16 inputs, Act::Bf16's rounding) for a pass whose rows are one
// sequence's consecutive positions (same cache slot, rows[t].pos = rows[0].pos + t): false,
// nothing launched, where it does not apply (tensor cores off, float inputs asked for, fewer
// than 16 rows, a head dimension other than 16, 32, 64, 128 or 256). `keys`: the pass's last
// row's position + 1 (0: unknown, and the keys are not staged: set_flash_stage).
bool flash_attention(const float* q, const AttnRow* rows, int T, int nh, int nk, int hd, float* out,
                     int64_t keys = 0);
// Flash attention's P and V in fp16 (the default) or bf16 (DORY_CUDA_FLASH_F16=0 at
// set_stream); test_cuda_kernels checks both.
void set_flash_f16(bool on);
// Flash attention with the chunk's keys and values converted once into a scratch (where
// `keys` is given and the scratch can be had; DORY_CUDA_FLASH_STAGE=1 until it has run on a
// GPU) or by each block per tile; test_cuda_kernels checks both.
void set_flash_stage(bool on);
// One decode row (T = 1): qk_prepare and attention in one launch (the row's own key and value
// used from the block's shared memory, written to the cache for the tokens after it). With
// `sum` set, also the output gate: out * sigmoid(g * gate_scale), its squares added to *sum
// (zero before): gate_norm less the scaling, which the o product takes through in_sum. With
// qo.B set (a divisor of hd), each head's output also quantized into qo for an int8 o product
// (k_quant_act's function on the same values), by the block that writes it.
void attention_decode(float* q, const float* k, const float* v, const float* q_scale,
                      const AttnRow* rows, int nh, int nk, int hd, int half, double theta,
                      int rotary_dims, float* out, float* part, int* counters,
                      const float* g = nullptr, const float* gate_scale = nullptr,
                      double* sum = nullptr, int64_t keys = 0, QOut qo = {});
// Blocks a row's keys are split over: 2 x SMs / (T x nh), and 32 for a decode row (T = 1)
// of 1,024 keys or more. attention_decode's `keys`: the
// most keys the row attends (0: unknown); a decode graph is captured per split count.
int attention_splits(int T, int nh, int64_t keys = 0);
int64_t attention_part_floats(int T, int nh, int hd);
// y <- n(y * sigmoid(g * gate_scale)) over each row of w floats.
void gate_norm(float* y, const float* g, const float* gate_scale, int T, int64_t w, QOut qo = {});
// g <- n(silu(g * sg) * (u * su)) over each row of f floats (silu(a) = a * sigmoid(a)).
void swiglu_norm(float* g, const float* u, const float* sg, const float* su, int T, int64_t f,
                 QOut qo = {});
// Decode (one row of f floats) into an int8 product: g <- silu(g * sg) * (u * su), quantized
// into qo (B = 32 or 256, f a multiple of B), its squares added to *sum (zero before):
// swiglu_norm less the scaling, which the down product takes through in_sum. Many blocks.
void swiglu_quant(float* g, const float* u, const float* sg, const float* su, int64_t f, QOut qo,
                  double* sum);
// Whether w is an int8 product's type (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): decode rows of these
// take in_sum too.
bool int8_decode(const DevMat& w);
// Whether a product of T input rows of w (CMF q8_2f: Q8_0 rows with column scales) takes the
// float input and quantizes x * col inside the product (one launch for several such matrices,
// each with its own scales) rather than after scale_input: Q8_0 with fewer than 16 rows, and
// switched on (the default; DORY_CUDA_Q8_COL=0 or set_q8_col(false): off).
bool q8_col_in_kernel(const DevMat& w, int T);
void set_q8_col(bool on);
// out[t*cols + c] = x[t*cols + c] * col[c] (a q8_2f matrix's input).
void scale_input(const float* x, const float* col, int T, int64_t cols, float* out);
// logits[t*V + i] *= scale[i].
void scale_cols(float* logits, const float* scale, int T, int64_t V);
// y[i] = x[idx[i]] rows of n floats (gathering the rows a head reads).
void gather_rows(const float* x, const int64_t* idx, int n_rows, int64_t n, float* y);
// Reads `bytes` of device memory once with 16-byte loads (the read-bandwidth probe of
// dory info and dory bench); returns the seconds it took.
double read_probe(const void* data, uint64_t bytes, int reps);

// The per-kernel profile (DORY_CUDA_PROFILE=1, graphs off): an event before each launch, the
// time to the next one charged to the launch's name with the weight bytes it read.
void prof_enable(bool on);
// The kind of pass the next launches belong to ("decode", "prefill").
void prof_phase(const char* name);
// The name the next product's time goes under ("attn qkvg", "mlp down", ...).
void prof_label(const char* name);
bool prof_on();
// Ends the events of the pass in progress (waits for the stream) and adds them up.
void prof_flush();
// The table so far: name, launches, total ms, mean us, GB read, GB/s; empty when off.
std::string prof_report();

}  // namespace dory::cuda
