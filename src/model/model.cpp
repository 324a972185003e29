#include <set>

#include "model/loop_plan.h"
#include "model/weights.h"

namespace dory {

std::shared_ptr<const Model> Model::load(const std::string& path, WeightPlacement place, const std::string& skill,
                                         const std::vector<std::string>& loras) {
  std::shared_ptr<Model> m(new Model());
  m->weights_ = load_weights(path, &m->path_, skill);
  if (!loras.empty()) apply_loras(*m->weights_, loras);
  Weights& w = *m->weights_;
  if (place == WeightPlacement::Memory) {
    for (auto& f : w.files) f->read_into_memory();
    if (w.gguf) w.gguf->read_into_memory();
  }
  return m;
}

Model::~Model() = default;

const DoryConfig& Model::config() const { return weights_->cfg; }

int64_t Model::n_params() const {
  int64_t n = 0;
  for (const auto& t : weights_->all) n += t.numel();
  return n;
}

bool Model::weights_in_memory() const {
  for (const auto& f : weights_->files)
    if (!f->in_memory()) return false;
  return !weights_->gguf || weights_->gguf->in_memory();
}

uint64_t Model::file_bytes() const {
  uint64_t b = 0;
  for (const auto& f : weights_->files) b += f->size();
  if (weights_->gguf) b += weights_->gguf->size();
  if (weights_->cmf) b += weights_->cmf->size();
  for (const auto& f : weights_->cmf_shards) b += f->size();
  return b;
}

std::vector<std::string> Model::files() const {
  std::vector<std::string> v;
  for (const auto& f : weights_->files) v.push_back(f->path());
  if (weights_->gguf) v.push_back(weights_->gguf->path());
  if (weights_->cmf) v.push_back(weights_->cmf->path());
  for (const auto& f : weights_->cmf_shards) v.push_back(f->path());
  return v;
}

std::map<std::string, std::pair<int64_t, int64_t>> Model::dtype_mix() const {
  std::map<std::string, std::pair<int64_t, int64_t>> mix;
  for (const auto& t : weights_->all) {
    auto& e = mix[dtype_name(t.dtype)];
    e.first += 1;
    e.second += t.numel();
  }
  return mix;
}

uint64_t Model::bytes_per_token(int loops) const {
  using kern::mat_bytes;
  const Weights& w = *weights_;
  uint64_t b = mat_bytes(w.lm_head) + row_bytes(w.embd.dtype, w.cfg.hidden);
  for (const Step& st : build_plan(w.cfg, KvMode::PerLoop, loops)) {
    if (st.op != Step::Op::Layer) continue;
    const LayerWeights& L = w.layers[st.layer];
    if (L.kind == '-') b += mat_bytes(L.w_gate) + mat_bytes(L.w_up) + mat_bytes(L.w_down);
    else
      b += mat_bytes(L.wq) + mat_bytes(L.wk) + mat_bytes(L.wv) + mat_bytes(L.wg) + mat_bytes(L.wo);
  }
  return b;
}

}  // namespace dory
