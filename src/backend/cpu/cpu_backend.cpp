#include "backend/cpu/cpu_backend.h"

#include <algorithm>

#include "backend/cpu/ops.h"
#include "dory/error.h"
#include "model/weights.h"
#include "tensor/kernels.h"

namespace dory {

// ---- one sequence's caches ----

CpuCaches::CpuCaches(const DoryConfig& c, const CacheSpec& spec) : c_(c), spec_(spec) {
  slots_.resize(c.n_layer);
}

void CpuCaches::prepare(std::span<const Step> plan, int64_t pos) {
  const DoryConfig& c = c_;
  const int64_t ring = c.swa_window + spec_.rewind_margin + spec_.chunk;
  make_missing_slots(c, plan, slots_, [&](int layer, int slot, KvCache* seed) {
    if (seed && pos > 0) return std::make_unique<KvCache>(*seed);
    auto kc = std::make_unique<KvCache>(c.n_kv_head * c.head_dim, c.is_sliding(layer) ? ring : 0);
    if (c.is_sliding(layer) || !spec_.o1.on) return kc;
    kc->enable_far(spec_.o1, c.n_head, c.n_kv_head, c.head_dim,
                   spec_.o1.w + spec_.rewind_margin + spec_.chunk);
    if (!spec_.exact.on) return kc;
    // This layer's row of the weights: full layers in order.
    int64_t idx = 0;
    for (int l = 0; l < layer; ++l) idx += c.pattern[l] == '*';
    const int64_t wn = 2 * c.n_kv_head;
    const auto& ew = spec_.exact.weights;
    kc->enable_exact(std::vector<float>(ew.begin() + idx * wn, ew.begin() + (idx + 1) * wn),
                     spec_.exact.budget, spec_.exact.spill_dir,
                     "L" + std::to_string(layer) + "-" + std::to_string(slot));
    return kc;
  });
}

void CpuCaches::check_rollback(int64_t n) const {
  for (int64_t layer = 0; layer < c_.n_layer; ++layer)
    for (const auto& kc : slots_[layer]) {
      if (!kc) continue;
      const int64_t floor = kc->rollback_floor(c_.swa_window);
      if (n >= floor) continue;
      if (kc->far())
        throw Error("cannot roll back to position " + std::to_string(n) + ": layer " +
                    std::to_string(layer) + " holds rows before position " + std::to_string(floor) +
                    " only in its far field (start a new session)");
      throw Error("cannot roll back to position " + std::to_string(n) + ": layer " +
                  std::to_string(layer) + " keeps its sliding window only from position " +
                  std::to_string(floor) + " on (raise the rewind margin, or start a new session)");
    }
}

void CpuCaches::truncate(int64_t n) {
  for (auto& per_layer : slots_)
    for (auto& kc : per_layer)
      if (kc) kc->truncate(n);
}

KvBytes CpuCaches::bytes() const {
  KvBytes b;
  for (const auto& per_layer : slots_)
    for (const auto& kc : per_layer)
      if (kc) {
        b.far += kc->far_bytes();
        b.exact += kc->bytes() - kc->far_bytes();
      }
  return b;
}

bool CpuCaches::exact_waiting() const {
  for (const auto& per_layer : slots_)
    for (const auto& kc : per_layer)
      if (kc && kc->has_store()) return true;
  return false;
}

std::string CpuCaches::rebuild_exact(bool final) {
  std::string first;
  for (auto& per_layer : slots_)
    for (auto& kc : per_layer) {
      if (!kc || !kc->has_store()) continue;
      std::string why;
      if (!kc->rebuild_exact(final, &why) && first.empty()) first = why.empty() ? "failed" : why;
    }
  return first;
}

std::vector<SlotFeatures> CpuCaches::exact_features() {
  std::vector<SlotFeatures> out;
  for (size_t layer = 0; layer < slots_.size(); ++layer)
    for (size_t s = 0; s < slots_[layer].size(); ++s) {
      KvCache* kc = slots_[layer][s].get();
      if (!kc || !kc->has_store()) continue;
      SlotFeatures f;
      f.layer = static_cast<int>(layer);
      f.loop = static_cast<int>(s);
      if (kc->exact_features(&f.lo, &f.hi, &f.f)) out.push_back(std::move(f));
    }
  return out;
}

// ---- the backend ----

CpuBackend::CpuBackend(std::shared_ptr<const Model> model, int threads)
    : model_(std::move(model)), pool_(threads > 0 ? threads : ThreadPool::default_threads()) {}

std::string CpuBackend::describe() const {
  return "cpu: " + std::to_string(pool_.size()) + " threads, kernels " + kern::kernels().name;
}

std::unique_ptr<SeqCaches> CpuBackend::new_caches(const CacheSpec& spec) {
  return std::make_unique<CpuCaches>(model_->config(), spec);
}

void CpuBackend::begin(const PassRows& r) {
  args_ = ChunkArgs{r.ids.data(), static_cast<int64_t>(r.ids.size()), r.start,
                    r.pos.empty() ? nullptr : r.pos.data(), r.seq.empty() ? nullptr : r.seq.data()};
  n_seq_ = static_cast<int>(r.caches.size());
  caches_.resize(n_seq_);
  for (int i = 0; i < n_seq_; ++i) caches_[i] = static_cast<CpuCaches*>(r.caches[i]);
  layer_caches_.resize(n_seq_);
  lora_.assign(r.lora.begin(), r.lora.end());
  forward_begin(model_->weights(), scratch_, args_);
}

void CpuBackend::steps(std::span<const Step> plan) {
  const int na = static_cast<int>(model_->weights().adapter_names.size());
  LoraRowScales scales(lora_.empty() ? nullptr : lora_.data(), na);
  forward_steps(model_->weights(), pool_, scratch_, args_, plan, [&](const Step& st) {
    for (int i = 0; i < n_seq_; ++i) layer_caches_[i] = &caches_[i]->slot(st.layer, st.slot);
    return std::span<KvCache* const>(layer_caches_);
  });
}

void CpuBackend::logits(std::span<const int64_t> rows, float* out) {
  if (rows.empty()) return;
  const Weights& w = model_->weights();
  const int64_t H = w.cfg.hidden, n = static_cast<int64_t>(rows.size());
  // One sequence's consecutive rows go through the head where they are; other sets are
  // gathered into s.out (free after the last layer) for one product.
  // The head's adapters take the chosen rows' scales.
  const int na = static_cast<int>(w.adapter_names.size());
  std::vector<float> head_lora;
  if (!lora_.empty())
    for (int64_t r = 0; r < n; ++r)
      head_lora.insert(head_lora.end(), lora_.begin() + rows[r] * na,
                       lora_.begin() + (rows[r] + 1) * na);
  LoraRowScales scales(head_lora.empty() ? nullptr : head_lora.data(), na);
  bool run = args_.pos == nullptr;
  for (int64_t r = 1; r < n && run; ++r) run = rows[r] == rows[0] + r;
  if (run) return forward_head(w, pool_, scratch_.x.data() + rows[0] * H, n, out);
  for (int64_t r = 0; r < n; ++r)
    std::copy_n(scratch_.x.data() + rows[r] * H, H, scratch_.out.data() + r * H);
  forward_head(w, pool_, scratch_.out.data(), n, out);
}

void CpuBackend::probe(std::span<const int64_t> rows, float* out) {
  const int64_t H = model_->config().hidden;
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy_n(scratch_.probe.data() + rows[r] * H, H, out + r * H);
}

void CpuBackend::state(std::span<const int64_t> rows, float* out) {
  const int64_t H = model_->config().hidden;
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy_n(scratch_.state.data() + rows[r] * H, H, out + r * H);
}

}  // namespace dory
