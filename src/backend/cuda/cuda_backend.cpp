#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "dory/error.h"
#include "model/weights.h"
#include "tensor/kernels.h"

namespace dory {

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

std::string gib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  return buf;
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear it: no driver or no device means "none"
    return 0;
  }
  return n;
}

double cuda_read_bandwidth() {
  if (cuda_device_count() == 0) return 0;
  size_t free_b = 0, total = 0;
  ck(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
  const uint64_t bytes = std::min<uint64_t>(1ull << 30, free_b / 4) & ~uint64_t(15);
  if (bytes < (16u << 20)) return 0;
  cuda::DevBuf buf(bytes);
  ck(cudaMemset(buf.get(), 1, bytes), "cudaMemset");
  return bytes / cuda::read_probe(buf.get(), bytes, 5);
}

std::string cuda_device_report() {
  if (cuda_device_count() == 0) return "no CUDA device found (driver or device missing)";
  cudaDeviceProp p{};
  ck(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  size_t free_b = 0, total = 0;
  ck(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
  // The read bandwidth the backend's own read-only kernel gets over 1 GiB (or a quarter of
  // what is free), 16-byte streaming loads, median-free mean of 5 passes after a warm-up.
  const uint64_t bytes = std::min<uint64_t>(1ull << 30, free_b / 4) & ~uint64_t(15);
  char line[640];
  std::string bw = "not measured";
  if (bytes >= (16u << 20)) {
    cuda::DevBuf buf(bytes);
    ck(cudaMemset(buf.get(), 1, bytes), "cudaMemset");
    const double s = cuda::read_probe(buf.get(), bytes, 5);
    std::snprintf(line, sizeof line, "read %.2f TB/s measured (a read-only kernel over %s)",
                  bytes / s / 1e12, gib(bytes).c_str());
    bw = line;
  }
  std::snprintf(line, sizeof line, "%s (sm_%d%d, %d SMs), %s (%s free), ", p.name, p.major, p.minor,
                p.multiProcessorCount, gib(total).c_str(), gib(free_b).c_str());
  return line + bw;
}

namespace cuda {

DevBuf::DevBuf(size_t bytes) {
  reserve(bytes);
}

DevBuf::~DevBuf() {
  if (p_) cudaFree(p_);
}

DevBuf& DevBuf::operator=(DevBuf&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFree(p_);
    p_ = o.p_, n_ = o.n_;
    o.p_ = nullptr, o.n_ = 0;
  }
  return *this;
}

void DevBuf::reserve(size_t bytes) {
  if (bytes <= n_) return;
  if (p_) cudaFree(p_);
  p_ = nullptr;
  n_ = 0;
  ck(cudaMalloc(&p_, bytes), ("cudaMalloc of " + gib(bytes)).c_str());
  n_ = bytes;
}

void DevKv::begin_write(int64_t /*start*/, int64_t end) {
  const int64_t want = ring ? std::min(end, ring) : end;
  if (want > cap) {
    // Full slots grow geometrically, keeping their rows; rings are made once at full size.
    const int64_t ncap = ring ? ring : std::max<int64_t>(want, cap * 3 / 2 + 16);
    DevBuf nk(ncap * width * sizeof(float)), nv(ncap * width * sizeof(float));
    if (cap > 0) {
      ck(cudaMemcpy(nk.get(), k.get(), cap * width * sizeof(float), cudaMemcpyDeviceToDevice),
         "KV copy");
      ck(cudaMemcpy(nv.get(), v.get(), cap * width * sizeof(float), cudaMemcpyDeviceToDevice),
         "KV copy");
    }
    k = std::move(nk);
    v = std::move(nv);
    cap = ncap;
  }
  rows = end;
  if (ring) first = std::max(first, end - ring);
}

}  // namespace cuda

// ---- one sequence's caches ----

CudaCaches::CudaCaches(const DoryConfig& c, const CacheSpec& spec) : c_(c), spec_(spec) {
  if (spec.o1.on)
    throw Error(
        "--device cuda: the far field (--o1) and exact rows run on the CPU backend only so far "
        "(give "
        "--o1 off, or --device cpu)");
  slots_.resize(c.n_layer);
}

void CudaCaches::prepare(std::span<const Step> plan, int64_t pos) {
  const int64_t ring = c_.swa_window + spec_.rewind_margin + spec_.chunk;
  make_missing_slots(c_, plan, slots_, [&](int layer, int, cuda::DevKv* seed) {
    auto kv = std::make_unique<cuda::DevKv>();
    kv->width = c_.n_kv_head * c_.head_dim;
    kv->ring = c_.is_sliding(layer) ? ring : 0;
    if (seed && pos > 0 && seed->cap > 0) {
      kv->begin_write(0, seed->cap);
      const size_t b = seed->cap * seed->width * sizeof(float);
      ck(cudaMemcpy(kv->k.get(), seed->k.get(), b, cudaMemcpyDeviceToDevice), "KV seed copy");
      ck(cudaMemcpy(kv->v.get(), seed->v.get(), b, cudaMemcpyDeviceToDevice), "KV seed copy");
      kv->rows = seed->rows;
      kv->first = seed->first;
    }
    return kv;
  });
}

void CudaCaches::check_rollback(int64_t n) const {
  for (int64_t layer = 0; layer < c_.n_layer; ++layer)
    for (const auto& kv : slots_[layer]) {
      if (!kv || !kv->ring) continue;
      const int64_t floor = kv->first > 0 ? kv->first + c_.swa_window - 1 : 0;
      if (n < floor)
        throw Error("cannot roll back to position " + std::to_string(n) + ": layer " +
                    std::to_string(layer) + " keeps its sliding window only from position " +
                    std::to_string(floor) +
                    " on (raise the rewind margin, or start a new session)");
    }
}

void CudaCaches::truncate(int64_t n) {
  for (auto& per_layer : slots_)
    for (auto& kv : per_layer)
      if (kv) {
        kv->rows = std::min(kv->rows, n);
        kv->first = std::min(kv->first, kv->rows);
      }
}

KvBytes CudaCaches::bytes() const {
  KvBytes b;
  for (const auto& per_layer : slots_)
    for (const auto& kv : per_layer)
      if (kv) b.exact += 2 * kv->cap * kv->width * sizeof(float);
  return b;
}

// ---- the backend ----

namespace {
// The input form the CPU backend's kernels give a product on these weights (kernels.h: Act).
cuda::Act act_for(const cuda::DevMat& w, bool bf16_input) {
  switch (static_cast<DType>(w.dtype)) {
    case DType::BF16:
      return bf16_input ? cuda::Act::Bf16 : cuda::Act::Float;
    case DType::Q8_0:
    case DType::Q4_0:
      return cuda::Act::Block32;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return cuda::Act::Block256;
    default:
      return cuda::Act::Float;
  }
}
}  // namespace

struct CudaBackend::Layer {
  char kind = '-';
  int rope_profile = 1;
  cuda::DevMat wq, wk, wv, wg, wo, w_gate, w_up, w_down;
  float *q_scale = nullptr, *gate_scale = nullptr, *suv_gate = nullptr, *suv_up = nullptr,
        *alpha = nullptr;
};

CudaBackend::CudaBackend(std::shared_ptr<const Model> model, int host_threads)
    : model_(std::move(model)),
      pool_(host_threads > 0 ? host_threads : ThreadPool::default_threads()) {
  if (cuda_device_count() == 0)
    throw Error(
        "--device cuda: no CUDA device found (is the NVIDIA driver loaded and a GPU visible?)");
  ck(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t s;
  ck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = s;
  cuda::set_stream(s);
  const Weights& w = model_->weights();
  const DoryConfig& c = w.cfg;
  bf16_input_ = kern::kernels().bf16_input;
  // Prefill products of BF16 weights on tensor cores take bf16-rounded inputs: the CPU's own
  // function where its kernels round (AVX512_BF16), and the GPU's default elsewhere too, unless
  // DORY_BF16_INPUT=float asks for float inputs (then they run in float on CUDA cores).
  {
    const char* in = std::getenv("DORY_BF16_INPUT");
    cuda::set_tc_float_inputs(!(in && std::string(in) == "float"));
  }
  // DORY_CUDA_FUSE=0: decode rows without the fusions (qk_prepare, gate and SwiGLU kernels of
  // their own), to compare against.
  if (const char* f = std::getenv("DORY_CUDA_FUSE")) fuse_ = std::string(f) != "0";
  if (const char* f = std::getenv("DORY_CUDA_FUSE_INT8")) fuse_int8_ = std::string(f) != "0";
  fuse_int8_ = fuse_int8_ && fuse_;
  if (const char* f = std::getenv("DORY_CUDA_FUSE_RESID")) fuse_resid_ = std::string(f) == "1";
  fuse_resid_ = fuse_resid_ && fuse_;
  if (const char* f = std::getenv("DORY_CUDA_FUSE_ATTQ")) fuse_attq_ = std::string(f) != "0";
  fuse_attq_ = fuse_attq_ && fuse_int8_;
  if (const char* f = std::getenv("DORY_CUDA_COL_QUANTS")) col_quants_ = std::string(f) == "1";
  res_cnt_ = cuda::DevBuf(sizeof(unsigned));
  ck(cudaMemset(res_cnt_.get(), 0, res_cnt_.size()), "residual counter");
  // DORY_CUDA_GRAPHS=0: every launch on its own (to compare, or to debug a kernel).
  if (const char* g = std::getenv("DORY_CUDA_GRAPHS")) use_graphs_ = std::string(g) != "0";
  // DORY_CUDA_PROFILE=1: every launch timed on its own (graphs off), a table at exit.
  if (const char* g = std::getenv("DORY_CUDA_PROFILE"); g && std::string(g) != "0") {
    cuda::prof_enable(true);
    use_graphs_ = false;
  }

  // What goes up: every matrix as its file's blocks, the folded float vectors.
  uint64_t need = kern::mat_bytes(w.lm_head) + c.vocab * sizeof(float);
  for (const LayerWeights& L : w.layers) {
    for (const kern::Mat* m : {&L.wq, &L.wk, &L.wv, &L.wg, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      if (m->data) need += kern::mat_bytes(*m);
    need += (L.q_scale.size() + L.gate_scale.size() + L.suv_gate.size() + L.suv_up.size() +
             L.alpha.size()) *
            4;
  }
  size_t free_b = 0, total = 0;
  ck(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo");
  cudaDeviceProp p{};
  ck(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  // A margin for the pass buffers and the KV caches of a first request.
  const uint64_t margin = 512ull << 20;
  if (need + margin > free_b)
    throw Error("--device cuda: the model's weights need " + gib(need) + " of GPU memory (plus " +
                gib(margin) + " for caches and buffers); " + p.name + " has " + gib(free_b) +
                " free of " + gib(total));

  const bool show = need > (1ull << 30);
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t done = 0;
  auto shown = t0;
  auto up = [&](const void* src, size_t bytes) -> void* {
    store_.emplace_back(bytes);
    ck(cudaMemcpy(store_.back().get(), src, bytes, cudaMemcpyHostToDevice), "weight upload");
    done += bytes;
    // A line at most every 0.25 s (a matrix at a time would print thousands).
    const auto now = std::chrono::steady_clock::now();
    if (show && now - shown > std::chrono::milliseconds(250)) {
      shown = now;
      std::fprintf(stderr, "\ruploading weights to %s: %s / %s", p.name, gib(done).c_str(),
                   gib(need).c_str());
    }
    return store_.back().get();
  };
  auto mat = [&](const kern::Mat& m) {
    cuda::DevMat d;
    if (!m.data) return d;
    if (m.lora)
      throw Error(
          "--device cuda: LoRA adapters (--lora) run on the CPU backend only so far (--device "
          "cpu)");
    if (m.col_scale) {  // CMF q8_2f: Q8_0 rows, the column scales on the input
      d.col_scale = static_cast<const float*>(up(m.col_scale, m.cols * sizeof(float)));
      col_scaled_ = true;
    }
    d.dtype = static_cast<int>(m.dtype);
    d.rows = m.rows;
    d.cols = m.cols;
    if (m.dtype == DType::Q8_0 || m.dtype == DType::Q4_0) {
      // Quants end to end, then the scales (kernels.h, DevMat), so 16-byte loads line up.
      std::vector<uint8_t> packed(kern::mat_bytes(m));
      cuda::repack_blocks(d.dtype, m.data, m.rows, m.cols, packed.data());
      d.data = up(packed.data(), packed.size());
      d.scales =
          static_cast<const uint8_t*>(d.data) + m.rows * m.cols / (m.dtype == DType::Q8_0 ? 1 : 2);
      return d;
    }
    if (m.dtype == DType::Q6_K) {
      std::vector<uint8_t> packed(kern::mat_bytes(m));
      cuda::repack_q6_k(m.data, m.rows, m.cols, packed.data());
      d.data = up(packed.data(), packed.size());
      d.scales = static_cast<const uint8_t*>(d.data) + m.rows * (m.cols / 256) * 192;
      return d;
    }
    d.data = up(m.data, kern::mat_bytes(m));
    return d;
  };
  auto vec = [&](const std::vector<float>& v) {
    return v.empty() ? nullptr : static_cast<float*>(up(v.data(), v.size() * sizeof(float)));
  };
  store_.reserve(16 * w.layers.size() + 4);
  layers_.resize(w.layers.size());
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& L = w.layers[i];
    Layer& D = layers_[i];
    D.kind = L.kind;
    D.rope_profile = L.rope_profile;
    D.wq = mat(L.wq), D.wk = mat(L.wk), D.wv = mat(L.wv), D.wg = mat(L.wg), D.wo = mat(L.wo);
    D.w_gate = mat(L.w_gate), D.w_up = mat(L.w_up), D.w_down = mat(L.w_down);
    D.q_scale = vec(L.q_scale), D.gate_scale = vec(L.gate_scale);
    D.suv_gate = vec(L.suv_gate), D.suv_up = vec(L.suv_up), D.alpha = vec(L.alpha);
  }
  lm_head_ = mat(w.lm_head);
  logit_scale_ = vec(w.logit_scale);
  weight_bytes_ = done;
  if (show) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "\ruploading weights to %s: %s in %.1f s\n", p.name, gib(done).c_str(), s);
  }
  char buf[512];
  std::snprintf(buf, sizeof buf, "cuda: %s, %s of weights on the device", p.name,
                gib(weight_bytes_).c_str());
  describe_ = buf;
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  if (cuda::prof_on()) {
    cuda::prof_flush();
    std::fprintf(stderr, "\nDORY_CUDA_PROFILE: time between launches, by kernel\n%s",
                 cuda::prof_report().c_str());
  }
  drop_graphs();
  if (pinned_) cudaFreeHost(pinned_);
  store_.clear();
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

std::unique_ptr<SeqCaches> CudaBackend::new_caches(const CacheSpec& spec) {
  return std::make_unique<CudaCaches>(model_->config(), spec);
}

void CudaBackend::reserve(int64_t T) {
  if (T <= cap_T_) return;
  drop_graphs();  // they hold the old buffers' addresses
  const DoryConfig& c = model_->config();
  const int64_t H = c.hidden, QW = c.n_head * c.head_dim, KW = c.n_kv_head * c.head_dim, F = c.ffn;
  const size_t f = sizeof(float);
  for (auto* b : {&x_, &inp_, &state_, &out_}) b->reserve(T * H * f);
  for (auto* b : {&q_, &g_, &att_}) b->reserve(T * QW * f);
  for (auto* b : {&k_, &v_}) b->reserve(T * KW * f);
  for (auto* b : {&ffg_, &ffu_}) b->reserve(T * F * f);
  act_.reserve(T * std::max({H, QW, F}) * f + 256);
  if (col_scaled_) xs_.reserve(T * std::max({H, QW, F}) * f);
  part_.reserve(std::max<int64_t>(
                    1, cuda::attention_part_floats(static_cast<int>(T), static_cast<int>(c.n_head),
                                                   static_cast<int>(c.head_dim))) *
                f);
  cnt_ = cuda::DevBuf(T * c.n_head * sizeof(int));
  ck(cudaMemset(cnt_.get(), 0, cnt_.size()), "attention counters");
  idx_.reserve(T * sizeof(int64_t));
  cap_T_ = T;
}

void CudaBackend::begin(const PassRows& r) {
  cuda::use_stream(stream_);  // another backend in this process may have pointed launches elsewhere
  const DoryConfig& c = model_->config();
  const int64_t T = static_cast<int64_t>(r.ids.size()), H = c.hidden;
  T_ = T;
  pos_.resize(T);
  seq_.resize(T);
  for (int64_t t = 0; t < T; ++t) {
    pos_[t] = r.pos.empty() ? r.start + t : r.pos[t];
    seq_[t] = r.seq.empty() ? 0 : r.seq[t];
  }
  one_run_ = true;  // one sequence's consecutive positions: prompt attention on tensor cores
  for (int64_t t = 1; t < T; ++t) one_run_ = one_run_ && seq_[t] == seq_[0] && pos_[t] == pos_[0] + t;
  caches_.resize(r.caches.size());
  for (size_t i = 0; i < r.caches.size(); ++i) caches_[i] = static_cast<CudaCaches*>(r.caches[i]);
  reserve(T);
  // The previous pass's row tables may still be on their way: wait, then reuse them.
  cuda::prof_flush();
  cuda::prof_phase(T == 1 ? "decode" : "prefill");
  ck(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "pass start");
  pinned_used_ = 0;
  // The embedding rows are dequantized on the host (a row a token) and go up together.
  host_.resize(T * H);
  for (int64_t t = 0; t < T; ++t)
    model_->weights().embd.to_f32(int64_t(r.ids[t]) * H, H, host_.data() + t * H);
  ck(cudaMemcpyAsync(x_.get(), host_.data(), T * H * sizeof(float), cudaMemcpyHostToDevice,
                     static_cast<cudaStream_t>(stream_)),
     "embedding upload");
}

void CudaBackend::lin(const cuda::DevMat& w, const float* x, int T, float* y, const double* in_sum,
                      const cuda::Residual* res) {
  if (w.col_scale && act_src_ == x && act_col_ == w.col_scale && act_kind_ == cuda::Act::Block32) {
    // q8_2f whose input's writer quantized it times these columns (quant_for, sole): the
    // Q8_0 product on those quants.
    cuda::DevMat plain = w;
    plain.col_scale = nullptr;
    cuda::linear(plain, x, T, y, cuda::Act::Block32, act_.get(), true, in_sum, res);
    written(y);
    return;
  }
  if (cuda::q8_col_in_kernel(w, T)) {  // q8_2f quantizing x * col itself
    cuda::linear(w, x, T, y, cuda::Act::Block32, nullptr, false, in_sum, res);
    written(y);
    return;
  }
  if (w.col_scale) {  // q8_2f: its own input, scaled per column
    if (xs_.size() < T * w.cols * sizeof(float)) throw Error("CUDA: q8_2f input buffer too small");
    cuda::scale_input(x, w.col_scale, T, w.cols, xs_.f());
    cuda::DevMat plain = w;
    plain.col_scale = nullptr;
    lin(plain, xs_.f(), T, y, in_sum);
    act_src_ = nullptr;  // the scratch holds xs_'s form, which the next scaled input replaces
    return;
  }
  const cuda::Act a = act_for(w, bf16_input_);
  const bool quant = a == cuda::Act::Block32 || a == cuda::Act::Block256;
  cuda::linear(w, x, T, y, a, act_.get(), quant && act_src_ == x && act_kind_ == a && !act_col_, in_sum,
               res);
  if (quant) act_src_ = x, act_kind_ = a, act_col_ = nullptr;
  else act_src_ = nullptr;  // tensor-core products round their input into the scratch
  written(y);
}

void CudaBackend::lin_residual(const cuda::DevMat& w, const float* in, const double* in_sum,
                               const float* alpha, const cuda::DevMat* next) {
  const DoryConfig& c = model_->config();
  const int T = static_cast<int>(T_);
  if (fuse_resid_ && cuda::residual_fusable(w, T) && w.rows == c.hidden) {
    // The quants for `next` go to the scratch once the product has read its own input from
    // it (the last warp runs after every warp's sums), so the layout is taken first and the
    // bookkeeping (quant_for) after.
    const cuda::Act a = next && !next->col_scale ? act_for(*next, bf16_input_) : cuda::Act::Float;
    cuda::Residual res;
    res.x = x_.f();
    res.alpha = alpha;
    if (a == cuda::Act::Block32 || a == cuda::Act::Block256) res.qo = cuda::act_layout(a, act_.get(), T, next->cols);
    res.counter = static_cast<unsigned*>(res_cnt_.get());
    lin(w, in, T, out_.f(), in_sum, &res);
    written(x_.f());
    quant_for(next, x_.f(), T);
    return;
  }
  lin(w, in, T, out_.f(), in_sum);
  cuda::ngpt_residual(x_.f(), out_.f(), alpha, T, c.hidden, quant_for(next, x_.f(), T));
}

cuda::QOut CudaBackend::quant_for(const cuda::DevMat* next, const float* buf, int T, bool sole) {
  const cuda::Act a = next ? act_for(*next, bf16_input_) : cuda::Act::Float;
  if (a != cuda::Act::Block32 && a != cuda::Act::Block256) {
    written(buf);
    return {};
  }
  cuda::QOut qo = cuda::act_layout(a, act_.get(), T, next->cols);
  // q8_2f (DORY_CUDA_COL_QUANTS=1): quants of buf times the matrix's columns, where it is buf's
  // only reader (attn o, mlp down) in a decode row. Otherwise a q8_2f product scales its input
  // itself (in the product, or scale_input first) and these quants go unread.
  if (next->col_scale && col_quants_ && sole && T == 1 && a == cuda::Act::Block32 && next->cols % 32 == 0)
    qo.col = next->col_scale;
  act_src_ = buf;
  act_kind_ = a;
  act_col_ = qo.col;
  return qo;
}

void CudaBackend::written(const float* buf) {
  if (buf == act_src_) act_src_ = nullptr;
}

const cuda::DevMat* CudaBackend::first_reader(std::span<const Step> plan, size_t i) const {
  if (i >= plan.size() || plan[i].op != Step::Op::Layer) return nullptr;
  const Layer& L = layers_[plan[i].layer];
  return L.kind == '-' ? &L.w_gate : &L.wq;
}

void CudaBackend::lin_multi(std::initializer_list<cuda::DevMat> ws,
                            std::initializer_list<float*> ys, const float* x, int T) {
  // One launch when the matrices share their type and width (a mix like q4_k_m's Q6_K attn_v
  // takes one launch per run of equal types).
  std::vector<cuda::DevMat> w(ws);
  std::vector<float*> y(ys);
  for (size_t i = 0; i < w.size();) {
    size_t j = i + 1;
    if (cuda::q8_col_in_kernel(w[i], T)) {
      // q8_2f quantizing x * col in the product: the run of such matrices of one width in
      // one launch, each with its own column scales.
      while (j < w.size() && w[j].cols == w[i].cols && cuda::q8_col_in_kernel(w[j], T))
        ++j;
      cuda::linear_multi(w.data() + i, y.data() + i, static_cast<int>(j - i), x, T, cuda::Act::Block32,
                         nullptr, false);
      i = j;
      continue;
    }
    if (w[i].col_scale) {  // q8_2f takes its own input
      lin(w[i], x, T, y[i]);
      ++i;
      continue;
    }
    while (j < w.size() && w[j].dtype == w[i].dtype && w[j].cols == w[i].cols && !w[j].col_scale)
      ++j;
    const cuda::Act a = act_for(w[i], bf16_input_);
    const bool quant = a == cuda::Act::Block32 || a == cuda::Act::Block256;
    cuda::linear_multi(w.data() + i, y.data() + i, static_cast<int>(j - i), x, T, a, act_.get(),
                       quant && act_src_ == x && act_kind_ == a && !act_col_);
    if (quant) act_src_ = x, act_kind_ = a, act_col_ = nullptr;
    else act_src_ = nullptr;  // tensor-core products round their input into the scratch
    i = j;
  }
  for (float* p : y) written(p);
}

// The host's part of an attention step, before any launch: each sequence's run of rows
// becomes writable in its cache slot (a full slot may move when it grows), then every row's
// entry of the step's table says where its keys and values are. Returns the table's offset.
int64_t CudaBackend::write_rows(const Layer& L, const Step& st) {
  const DoryConfig& c = model_->config();
  const int T = static_cast<int>(T_);
  for (int t0 = 0, t1; t0 < T; t0 = t1) {
    for (t1 = t0 + 1; t1 < T && seq_[t1] == seq_[t0];) ++t1;
    caches_[seq_[t0]]->slot(st.layer, st.slot).begin_write(pos_[t0], pos_[t1 - 1] + 1);
  }
  cuda::AttnRow* rows = pinned_ + pinned_used_;
  const bool sliding = L.kind == 'S';
  for (int t = 0; t < T; ++t) {
    cuda::DevKv& kv = caches_[seq_[t]]->slot(st.layer, st.slot);
    rows[t] = {kv.k.f(), kv.v.f(), kv.ring, pos_[t],
               sliding ? std::max<int64_t>(0, pos_[t] - c.swa_window + 1) : 0};
  }
  const int64_t off = pinned_used_;
  pinned_used_ += T;
  return off;
}

int64_t CudaBackend::decode_keys(bool sliding) const {
  const int64_t n = pos_.empty() ? 0 : pos_[0] + 1;
  return sliding ? std::min<int64_t>(n, model_->config().swa_window) : n;
}

void CudaBackend::attention_layer(const Layer& L, int64_t table, const cuda::DevMat* next) {
  const DoryConfig& c = model_->config();
  const int T = static_cast<int>(T_);
  const int nh = static_cast<int>(c.n_head), nk = static_cast<int>(c.n_kv_head),
            hd = static_cast<int>(c.head_dim);
  cuda::prof_label("attn q/k/v/g");
  lin_multi({L.wq, L.wk, L.wv, L.wg}, {q_.f(), k_.f(), v_.f(), g_.f()}, x_.f(), T);
  const cuda::AttnRow* dr = static_cast<const cuda::AttnRow*>(rows_.get()) + table;
  const int prof = L.rope_profile;
  const int rd = static_cast<int>(c.rotary_dims(prof));
  const double theta = prof == 1 ? c.rope_theta : c.rope_theta_2;
  // Decode: the gate in the attention launch, the norm in the o product (BF16/F16 in its loads,
  // the int8 types from the sum after quantizing the un-normalised row: gate_norm's launch goes).
  double* gsum = fuse_ && T == 1 && (cuda::half_decode(L.wo) || (fuse_int8_ && cuda::int8_decode(L.wo)))
                     ? next_sum()
                     : nullptr;
  // An int8 o product's quants written by attention's blocks, a head each (the quant blocks
  // must tile a head); the bookkeeping says the scratch holds att_'s form. aq.B: it did.
  cuda::QOut aq;
  if (fuse_ && T == 1) {
    if (fuse_attq_ && gsum && cuda::int8_decode(L.wo) && (!L.wo.col_scale || col_quants_)) {
      const cuda::Act a = act_for(L.wo, bf16_input_);
      const int B = a == cuda::Act::Block32 ? 32 : a == cuda::Act::Block256 ? 256 : 0;
      if (B && hd % B == 0) aq = quant_for(&L.wo, att_.f(), T, true);
    }
    cuda::attention_decode(q_.f(), k_.f(), v_.f(), L.q_scale, dr, nh, nk, hd, rd / 2, theta, rd,
                           att_.f(), part_.f(), static_cast<int*>(cnt_.get()), g_.f(),
                           L.gate_scale, gsum, decode_keys(L.kind == 'S'), aq);
  } else {
    cuda::qk_prepare(q_.f(), k_.f(), v_.f(), L.q_scale, dr, T, nh, nk, hd, rd / 2, theta, rd);
    if (!one_run_ || !cuda::flash_attention(q_.f(), dr, T, nh, nk, hd, att_.f(), pos_[T - 1] + 1))
      cuda::attention(q_.f(), dr, T, nh, nk, hd, att_.f(), part_.f(), static_cast<int*>(cnt_.get()));
  }
  if (gsum) {
    if (!aq.B) written(att_.f());
  } else {
    cuda::gate_norm(att_.f(), g_.f(), L.gate_scale, T, c.n_head * c.head_dim,
                    quant_for(&L.wo, att_.f(), T, true));
  }
  cuda::prof_label("attn o");
  lin_residual(L.wo, att_.f(), gsum, L.alpha, next);
}

void CudaBackend::mlp_layer(const Layer& L, const cuda::DevMat* next) {
  const DoryConfig& c = model_->config();
  const int T = static_cast<int>(T_);
  cuda::prof_label("mlp gate/up");
  // Decode of BF16/F16 weights: swiglu in the gate/up product's epilogue, its norm in down's.
  if (fuse_ && T == 1 && cuda::half_decode(L.w_gate) && cuda::half_decode(L.w_down) &&
      L.w_up.dtype == L.w_gate.dtype) {
    double* sum = next_sum();
    cuda::linear_swiglu(L.w_gate, L.w_up, x_.f(), ffg_.f(), L.suv_gate, L.suv_up, sum,
                        act_for(L.w_gate, bf16_input_));
    written(ffg_.f());
    cuda::prof_label("mlp down");
    lin_residual(L.w_down, ffg_.f(), sum, L.alpha, next);
  } else if (fuse_int8_ && T == 1 && cuda::int8_decode(L.w_down) &&
             (!L.w_down.col_scale || cuda::q8_col_in_kernel(L.w_down, T))) {
    // Int8 decode: swiglu and the down product's quantizing in one many-block launch, the
    // norm in down's epilogue (quantization is scale-invariant): swiglu_norm's one-block pass
    // goes. (A q8_2f down that quantizes x * col itself uses swiglu's output and sum only.)
    lin_multi({L.w_gate, L.w_up}, {ffg_.f(), ffu_.f()}, x_.f(), T);
    double* sum = next_sum();
    cuda::swiglu_quant(ffg_.f(), ffu_.f(), L.suv_gate, L.suv_up, c.ffn,
                       quant_for(&L.w_down, ffg_.f(), T, true), sum);
    cuda::prof_label("mlp down");
    lin_residual(L.w_down, ffg_.f(), sum, L.alpha, next);
  } else {
    lin_multi({L.w_gate, L.w_up}, {ffg_.f(), ffu_.f()}, x_.f(), T);
    cuda::swiglu_norm(ffg_.f(), ffu_.f(), L.suv_gate, L.suv_up, T, c.ffn,
                      quant_for(&L.w_down, ffg_.f(), T, true));
    cuda::prof_label("mlp down");
    lin_residual(L.w_down, ffg_.f(), nullptr, L.alpha, next);
  }
}

void CudaBackend::steps(std::span<const Step> plan) {
  const DoryConfig& c = model_->config();
  const int T = static_cast<int>(T_);
  auto st = static_cast<cudaStream_t>(stream_);
  // Room for this run's row tables (growing waits for the copies in flight to finish; the
  // captured graphs read the old tables' addresses, so they go too).
  int64_t need = pinned_used_;
  for (const Step& s : plan) need += s.op == Step::Op::Layer && c.is_attention(s.layer) ? T : 0;
  if (need > pinned_cap_) {
    ck(cudaStreamSynchronize(st), "row tables");
    const int64_t cap = std::max<int64_t>(need, pinned_cap_ * 2);
    cuda::AttnRow* p = nullptr;
    ck(cudaMallocHost(reinterpret_cast<void**>(&p), cap * sizeof(cuda::AttnRow)), "cudaMallocHost");
    if (pinned_) {
      std::copy_n(pinned_, pinned_used_, p);
      cudaFreeHost(pinned_);
    }
    cuda::DevBuf d(cap * sizeof(cuda::AttnRow));
    if (pinned_used_ > 0)
      ck(cudaMemcpy(d.get(), rows_.get(), pinned_used_ * sizeof(cuda::AttnRow),
                    cudaMemcpyDeviceToDevice),
         "row tables");
    rows_ = std::move(d);
    pinned_ = p;
    pinned_cap_ = cap;
    drop_graphs();
  }
  // Two sums of squares at most a layer step (decode fusions); growing drops the graphs.
  if (sums_.size() < 2 * plan.size() * sizeof(double)) {
    ck(cudaStreamSynchronize(st), "decode sums");
    drop_graphs();
    sums_ = cuda::DevBuf(std::max<size_t>(4096, 2 * plan.size()) * sizeof(double));
  }
  // A Probe step's copy of the hidden state (allocated here: not while a graph is captured).
  if (std::any_of(plan.begin(), plan.end(), [](const Step& s) { return s.op == Step::Op::Probe; }) &&
      probed_.size() < static_cast<size_t>(T) * c.hidden * sizeof(float)) {
    ck(cudaStreamSynchronize(st), "probe buffer");
    drop_graphs();
    probed_ = cuda::DevBuf(static_cast<size_t>(std::max(T, 64)) * c.hidden * sizeof(float));
  }
  // 1. The host's part: cache slots and row tables, then one copy of all the tables.
  const int64_t base = pinned_used_;
  tables_.clear();
  for (const Step& s : plan)
    if (s.op == Step::Op::Layer && layers_[s.layer].kind != '-')
      tables_.push_back(write_rows(layers_[s.layer], s));
  if (pinned_used_ > base)
    ck(cudaMemcpyAsync(static_cast<cuda::AttnRow*>(rows_.get()) + base, pinned_ + base,
                       (pinned_used_ - base) * sizeof(cuda::AttnRow), cudaMemcpyHostToDevice, st),
       "row tables");
  // 2. The launches. A one-row pass (decode) replays a graph captured the first time this plan
  // ran at this table offset: one launch instead of ~8 a layer.
  if (T != 1 || !use_graphs_) return launch(plan);
  std::string key(reinterpret_cast<const char*>(plan.data()), plan.size() * sizeof(Step));
  key.append(reinterpret_cast<const char*>(&base), sizeof base);
  // The attention launches' split counts move with the context (attention_splits).
  const int nh = static_cast<int>(c.n_head);
  for (bool sliding : {false, true}) key.push_back(static_cast<char>(cuda::attention_splits(1, nh, decode_keys(sliding))));
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    cudaGraph_t g = nullptr;
    ck(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "graph capture");
    try {
      launch(plan);
    } catch (...) {
      cudaStreamEndCapture(st, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    ck(cudaStreamEndCapture(st, &g), "graph capture");
    cudaGraphExec_t e = nullptr;
    const cudaError_t r = cudaGraphInstantiate(&e, g, 0);
    cudaGraphDestroy(g);
    ck(r, "graph instantiate");
    it = graphs_.emplace(std::move(key), e).first;
  }
  ck(cudaGraphLaunch(static_cast<cudaGraphExec_t>(it->second), st), "graph launch");
}

void CudaBackend::launch(std::span<const Step> plan) {
  const DoryConfig& c = model_->config();
  const int T = static_cast<int>(T_);
  const int64_t H = c.hidden;
  size_t a = 0;
  // Host-side bookkeeping of what the input scratch holds starts afresh with each launch
  // sequence (a replayed graph does none of it).
  act_src_ = nullptr;
  // The decode fusions' sums of squares: a slot each, zero at the start of the pass.
  sum_next_ = 0;
  if (T == 1)
    ck(cudaMemsetAsync(sums_.get(), 0, sums_.size(), static_cast<cudaStream_t>(stream_)),
       "decode sums");
  for (size_t i = 0; i < plan.size(); ++i) {
    const Step& st = plan[i];
    const cuda::DevMat* next = first_reader(plan, i + 1);
    switch (st.op) {
      case Step::Op::Layer: {
        const Layer& L = layers_[st.layer];
        if (L.kind == '-')
          mlp_layer(L, next);
        else
          attention_layer(L, tables_[a++], next);
        break;
      }
      case Step::Op::LoopBegin:
        cuda::loop_begin(x_.f(), state_.f(), inp_.f(), T, H, st.loop == 0,
                         quant_for(next, x_.f(), T));
        break;
      case Step::Op::LoopEnd:  // reads x_, writes state_
        cuda::loop_end(x_.f(), state_.f(), T, H);
        break;
      case Step::Op::OutputBegin:
        written(x_.f());
        ck(cudaMemcpyAsync(x_.get(), state_.get(), T * H * sizeof(float), cudaMemcpyDeviceToDevice,
                           static_cast<cudaStream_t>(stream_)),
           "output begin");
        break;
      case Step::Op::Probe:  // the layer's output (on the unit sphere already: nGPT), kept
        ck(cudaMemcpyAsync(probed_.get(), x_.get(), T * H * sizeof(float), cudaMemcpyDeviceToDevice,
                           static_cast<cudaStream_t>(stream_)),
           "probe");
        break;
    }
  }
  act_src_ = nullptr;
}

double* CudaBackend::next_sum() {
  if ((sum_next_ + 1) * sizeof(double) > sums_.size()) throw Error("CUDA: out of decode sums");
  return static_cast<double*>(sums_.get()) + sum_next_++;
}

void CudaBackend::drop_graphs() {
  for (auto& [k, e] : graphs_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e));
  graphs_.clear();
}

void CudaBackend::logits(std::span<const int64_t> rows, float* out) {
  cuda::use_stream(stream_);
  if (rows.empty()) return;
  const DoryConfig& c = model_->config();
  const int n = static_cast<int>(rows.size());
  const int64_t H = c.hidden, V = c.vocab;
  auto st = static_cast<cudaStream_t>(stream_);
  logits_.reserve(n * V * sizeof(float));
  ck(cudaMemcpyAsync(idx_.get(), rows.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice, st),
     "row index");
  cuda::gather_rows(x_.f(), static_cast<const int64_t*>(idx_.get()), n, H, out_.f());
  written(out_.f());
  cuda::prof_label("lm_head");
  lin(lm_head_, out_.f(), n, logits_.f());
  cuda::scale_cols(logits_.f(), logit_scale_, n, V);
  ck(cudaMemcpyAsync(out, logits_.get(), n * V * sizeof(float), cudaMemcpyDeviceToHost, st),
     "logits download");
  cuda::prof_flush();
  ck(cudaStreamSynchronize(st), "logits");
}

void CudaBackend::probe(std::span<const int64_t> rows, float* out) {
  cuda::use_stream(stream_);
  const int64_t H = model_->config().hidden;
  if (static_cast<int64_t>(probed_.size()) < (rows.empty() ? 0 : (*std::max_element(rows.begin(), rows.end()) + 1) * H * 4))
    throw Error("probe: the last pass had no Probe step");
  auto st = static_cast<cudaStream_t>(stream_);
  for (size_t r = 0; r < rows.size(); ++r)
    ck(cudaMemcpyAsync(out + r * H, static_cast<const float*>(probed_.get()) + rows[r] * H, H * sizeof(float),
                       cudaMemcpyDeviceToHost, st),
       "probe download");
  ck(cudaStreamSynchronize(st), "probe");
}

void CudaBackend::state(std::span<const int64_t> rows, float* out) {
  cuda::use_stream(stream_);
  const int64_t H = model_->config().hidden;
  auto st = static_cast<cudaStream_t>(stream_);
  for (size_t r = 0; r < rows.size(); ++r)
    ck(cudaMemcpyAsync(out + r * H, state_.f() + rows[r] * H, H * sizeof(float),
                       cudaMemcpyDeviceToHost, st),
       "state download");
  ck(cudaStreamSynchronize(st), "state");
}

}  // namespace dory
