// The CPU backend: the forward pass of forward.h over the host weights (used in place
// from the mapped files, or read into memory), a thread pool, one scratch for the pass
// in progress, and KvCache slots per sequence.
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/forward.h"
#include "backend/cpu/kv_cache.h"
#include "backend/cpu/pool.h"

namespace dory {

class CpuCaches final : public SeqCaches {
 public:
  CpuCaches(const DoryConfig& c, const CacheSpec& spec);
  void prepare(std::span<const Step> plan, int64_t pos) override;
  void check_rollback(int64_t n) const override;
  void truncate(int64_t n) override;
  KvBytes bytes() const override;
  bool exact_waiting() const override;
  std::string rebuild_exact(bool final) override;
  std::vector<SlotFeatures> exact_features() override;
  // The slot a step names (prepare() made it).
  KvCache& slot(int layer, int slot) { return *slots_[layer][slot]; }

 private:
  const DoryConfig& c_;
  CacheSpec spec_;
  std::vector<std::vector<std::unique_ptr<KvCache>>> slots_;  // [layer][slot]
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(std::shared_ptr<const Model> model, int threads);
  const Model& model() const override { return *model_; }
  std::shared_ptr<const Model> model_ptr() const override { return model_; }
  const char* name() const override { return "cpu"; }
  std::string describe() const override;
  std::unique_ptr<SeqCaches> new_caches(const CacheSpec& spec) override;
  void begin(const PassRows& rows) override;
  void steps(std::span<const Step> plan) override;
  void logits(std::span<const int64_t> rows, float* out) override;
  void state(std::span<const int64_t> rows, float* out) override;
  void probe(std::span<const int64_t> rows, float* out) override;
  void host_parallel(int64_t n, const std::function<void(int64_t)>& fn) override {
    pool_.run(n, fn);
  }
  int host_threads() const override { return pool_.size(); }
  ThreadPool& pool() { return pool_; }

 private:
  std::shared_ptr<const Model> model_;
  ThreadPool pool_;
  Scratch scratch_;
  std::vector<float> lora_;  // the pass's adapter scales per row (PassRows::lora)
  // The pass in progress.
  ChunkArgs args_{};
  int n_seq_ = 0;
  std::vector<CpuCaches*> caches_;
  std::vector<KvCache*> layer_caches_;
};

}  // namespace dory
