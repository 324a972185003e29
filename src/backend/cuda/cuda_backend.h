// The CUDA backend: the model's weights uploaded once to the GPU at open, KV caches in GPU
// memory, a pass as a sequence of kernels on one stream (kernels.h). Logits and recurrent
// states cross to the host only for the rows asked for. The far field and exact rows are
// the CPU backend's alone for now: a session that asks for them here is refused.
#pragma once
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/pool.h"
#include "backend/cuda/kernels.h"

namespace dory {

// How many CUDA devices this process sees (0 when the driver or a device is missing).
int cuda_device_count();
// Bytes a second the backend's read-only kernel gets from device memory (16-byte streaming
// loads over 1 GiB, the mean of 5 passes after a warm-up); 0 without a device.
double cuda_read_bandwidth();
// "NVIDIA H100 80GB HBM3, 79.1 GiB (78.5 free), read 2.95 TB/s measured": one line for dory info.
std::string cuda_device_report();

namespace cuda {

// A device allocation (cudaMalloc), freed with its owner.
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes);
  ~DevBuf();
  DevBuf(DevBuf&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DevBuf& operator=(DevBuf&& o) noexcept;
  DevBuf(const DevBuf&) = delete;
  void* get() const { return p_; }
  float* f() const { return static_cast<float*>(p_); }
  size_t size() const { return n_; }
  // At least `bytes`, growing (contents not kept) when smaller.
  void reserve(size_t bytes);

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// One attention cache slot on the device: keys and values, a row of `width` floats per
// position; a ring of `ring` rows for sliding layers, else every row (grown by copying).
struct DevKv {
  int64_t width = 0, ring = 0, cap = 0, rows = 0, first = 0;
  DevBuf k, v;
  void begin_write(int64_t start, int64_t end);
};

}  // namespace cuda

class CudaCaches final : public SeqCaches {
 public:
  CudaCaches(const DoryConfig& c, const CacheSpec& spec);
  void prepare(std::span<const Step> plan, int64_t pos) override;
  void check_rollback(int64_t n) const override;
  void truncate(int64_t n) override;
  KvBytes bytes() const override;
  bool exact_waiting() const override { return false; }
  std::string rebuild_exact(bool) override { return ""; }
  std::vector<SlotFeatures> exact_features() override { return {}; }
  cuda::DevKv& slot(int layer, int s) { return *slots_[layer][s]; }

 private:
  const DoryConfig& c_;
  CacheSpec spec_;
  std::vector<std::vector<std::unique_ptr<cuda::DevKv>>> slots_;
};

class CudaBackend final : public Backend {
 public:
  // Uploads the weights (a progress line on stderr for large models). Throws Error when no
  // device is there or the weights do not fit in its free memory (saying how much each is).
  CudaBackend(std::shared_ptr<const Model> model, int host_threads);
  ~CudaBackend() override;
  const Model& model() const override { return *model_; }
  std::shared_ptr<const Model> model_ptr() const override { return model_; }
  const char* name() const override { return "cuda"; }
  std::string describe() const override { return describe_; }
  std::unique_ptr<SeqCaches> new_caches(const CacheSpec& spec) override;
  void begin(const PassRows& rows) override;
  void steps(std::span<const Step> plan) override;
  void logits(std::span<const int64_t> rows, float* out) override;
  void state(std::span<const int64_t> rows, float* out) override;
  void probe(std::span<const int64_t> rows, float* out) override;
  // The keys a decode row attends in a full (sliding = false) or sliding-window layer.
  int64_t decode_keys(bool sliding) const;
  void host_parallel(int64_t n, const std::function<void(int64_t)>& fn) override {
    pool_.run(n, fn);
  }
  int host_threads() const override { return pool_.size(); }
  double measured_read_bandwidth() override { return cuda_read_bandwidth(); }
  // A pass reads every weight once whatever its row count: 512 rows keep the tensor cores
  // busy (64 left a product's tiles too few to fill the GPU).
  int default_chunk() const override { return 512; }
  // Bytes of weights on the device.
  uint64_t weight_bytes() const { return weight_bytes_; }

 private:
  struct Layer;
  int64_t write_rows(const Layer& L, const Step& st);
  // `next`: the first matrix that reads x_ after this step (its input form is made at once).
  void attention_layer(const Layer& L, int64_t table, const cuda::DevMat* next);
  void launch(std::span<const Step> plan);
  void drop_graphs();
  void mlp_layer(const Layer& L, const cuda::DevMat* next);
  const cuda::DevMat* first_reader(std::span<const Step> plan, size_t i) const;
  // A row kernel writing `buf` also quantizes it for `next` when that takes int8 input.
  cuda::QOut quant_for(const cuda::DevMat* next, const float* buf, int T, bool sole = false);
  // `buf` changed: the scratch no longer holds its int8 form.
  void written(const float* buf);
  void reserve(int64_t T);
  // A product with its input taken as the CPU backend takes it (kernels.h: Act).
  void lin(const cuda::DevMat& w, const float* x, int T, float* y, const double* in_sum = nullptr,
           const cuda::Residual* res = nullptr);
  // The product that ends a layer (attn o, mlp down), then the layer's nGPT residual into x_
  // (quantized for `next`): in the product's epilogue where it can (fuse_resid_), else the
  // row kernel after it.
  void lin_residual(const cuda::DevMat& w, const float* in, const double* in_sum,
                    const float* alpha, const cuda::DevMat* next);
  // A zeroed double for a decode fusion's sum of squares (sums_, reset each pass).
  double* next_sum();
  // Products of one input (q/k/v/g, gate/up) in as few launches as their types allow.
  void lin_multi(std::initializer_list<cuda::DevMat> ws, std::initializer_list<float*> ys,
                 const float* x, int T);

  std::shared_ptr<const Model> model_;
  ThreadPool pool_;
  std::string describe_;
  void* stream_ = nullptr;
  uint64_t weight_bytes_ = 0;
  std::vector<cuda::DevBuf> store_;  // every weight allocation
  std::vector<Layer> layers_;
  cuda::DevMat lm_head_{};
  float* logit_scale_ = nullptr;
  // The pass in progress.
  int64_t T_ = 0, cap_T_ = 0;
  std::vector<int64_t> pos_;
  std::vector<int32_t> seq_;
  std::vector<CudaCaches*> caches_;
  bool one_run_ = false;  // the pass's rows: one sequence, consecutive positions
  cuda::DevBuf sums_;     // the decode fusions' sums of squares, zeroed per pass
  cuda::DevBuf probed_;   // the hidden state where a pass's Probe step stood [T x H]
  int64_t sum_next_ = 0;
  bool bf16_input_ = false;  // BF16 products round their input to bf16, as the CPU kernel set does
  cuda::DevBuf xs_;  // a q8_2f matrix's input scaled by its columns
  bool col_scaled_ = false;  // some matrix is q8_2f
  cuda::DevBuf x_, inp_, state_, q_, g_, att_, k_, v_, out_, ffg_, ffu_, logits_, rows_, idx_, act_,
      part_, cnt_;
  // What act_ holds: the int8 form (act_kind_) of act_src_, or nothing usable (nullptr).
  const float* act_src_ = nullptr;
  cuda::Act act_kind_ = cuda::Act::Float;
  // ... times these column scales (a q8_2f decode product's own input: quant_for with sole).
  const float* act_col_ = nullptr;
  std::vector<float> host_;
  // The attention row tables of the pass in progress: written to pinned host memory, one
  // table per attention step, copied without stalling the stream (a copy from pageable memory
  // would wait for the GPU at every attention layer). Reused once the pass has synchronised.
  cuda::AttnRow* pinned_ = nullptr;
  int64_t pinned_cap_ = 0, pinned_used_ = 0;
  std::vector<int64_t> tables_;  // the row table of each attention step of the current steps()
  // Captured one-row passes: (the plan's steps, its table offset) -> an executable graph.
  std::map<std::string, void*> graphs_;
  bool use_graphs_ = true;
  bool fuse_ = true;  // decode fusions (DORY_CUDA_FUSE=0: off)
  // The int8 types' decode fusions (gate in attention, swiglu_quant, norms from sums; Q8_0
  // decode +15% on an H100): DORY_CUDA_FUSE_INT8=0 turns them off, DORY_CUDA_FUSE=0 too.
  bool fuse_int8_ = true;
  // The residual in the decode products' epilogue (DORY_CUDA_FUSE_RESID=1), its ticket
  // counter. Off: on an H100 it made decode 0.49-0.68x as fast (docs/cuda.md, seventh session).
  bool fuse_resid_ = false;
  // An int8 o product's input quantized by decode attention itself (DORY_CUDA_FUSE_ATTQ=0:
  // off): its quantizing launch goes; the same quants, so the same logits (checked on an H100).
  bool fuse_attq_ = true;
  // q8_2f decode: attention / the swiglu kernels write the o / down product's quants times its
  // column scales (QOut::col), so that product runs as plain Q8_0 (DORY_CUDA_COL_QUANTS=1; off
  // until it has run on a GPU: scripts/dev/gpu_q8col.sh).
  bool col_quants_ = false;
  cuda::DevBuf res_cnt_;
};

}  // namespace dory
