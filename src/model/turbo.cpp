#include "model/turbo.h"

#include <cmath>
#include <cstring>

#include "dory/error.h"
#include "format/mapped_file.h"

namespace dory {

namespace {
constexpr const char* kExitBias = "dory.turbo.exit_bias";
constexpr const char* kO1 = "dory.turbo.o1";
constexpr const char* kBudget = "dory.turbo.exact_budget";
constexpr const char* kEasyMean = "dory_router.easy_mean";
constexpr const char* kEasyBasis = "dory_router.easy_basis";
constexpr const char* kHardMean = "dory_router.hard_mean";
constexpr const char* kHardBasis = "dory_router.hard_basis";
constexpr const char* kExact = "dory_exact.weight";

std::vector<float> f32_tensor(const gguf::File& f, const char* name, size_t dims, int64_t last_dim) {
  const gguf::TensorInfo* t = f.tensor(name);
  if (!t) return {};
  const TensorView& v = t->view;
  if (v.dtype != DType::F32)
    throw Error(f.path() + ": tensor '" + std::string(name) + "' is " + dtype_name(v.dtype) + "; it must be F32");
  if (v.shape.size() != dims || v.shape.back() != last_dim)
    throw Error(f.path() + ": tensor '" + std::string(name) + "' has the wrong shape (its rows must have " +
                std::to_string(last_dim) + " entries)");
  std::vector<float> out = v.to_f32();
  for (float x : out)
    if (!std::isfinite(x)) throw Error(f.path() + ": tensor '" + std::string(name) + "' holds a value that is not finite");
  return out;
}
}  // namespace

bool is_turbo_tensor(const std::string& n) {
  return n == kEasyMean || n == kEasyBasis || n == kHardMean || n == kHardBasis || n == kExact;
}

int64_t full_layer_count(const DoryConfig& c) {
  int64_t n = 0;
  for (char ch : c.pattern) n += ch == '*';
  return n;
}

Turbo read_turbo(const gguf::File& f, const DoryConfig& c) {
  Turbo t;
  auto bad = [&](const char* key, const std::string& why) { return Error(f.path() + ": key '" + key + "' " + why); };
  if (const gguf::Value* v = f.find(kExitBias)) {
    if (!v->is_float() || !std::isfinite(v->f)) throw bad(kExitBias, "must be a finite float");
    t.router.bias = v->f;
    t.present = true;
  }
  if (const gguf::Value* v = f.find(kO1)) {
    if (v->type != gguf::VType::ARRAY || v->arr.size() != 4) throw bad(kO1, "must be an array of 4 integers");
    int64_t x[4];
    for (int i = 0; i < 4; ++i) {
      if (!v->arr[i].is_int() || v->arr[i].i < 0 || v->arr[i].i > (1ll << 30))
        throw bad(kO1, "must hold 4 integers m, w, sink, seal");
      x[i] = v->arr[i].i;
    }
    O1Params p;
    p.on = true, p.m = int(x[0]), p.w = int(x[1]), p.sink = int(x[2]), p.seal = x[3];
    try {
      p.validate();
    } catch (const Error& e) {
      throw bad(kO1, std::string("is not a usable far field: ") + e.what());
    }
    t.o1 = p;
    t.present = true;
  }
  if (const gguf::Value* v = f.find(kBudget)) {
    if (!v->is_int() || v->i < 0 || v->i > 8192) throw bad(kBudget, "must be an integer in 0..8192");
    t.exact_budget = v->i;
    t.present = true;
  }
  const int64_t H = c.hidden;
  Router& r = t.router;
  r.easy_mean = f32_tensor(f, kEasyMean, 1, H);
  r.hard_mean = f32_tensor(f, kHardMean, 1, H);
  r.easy_basis = f32_tensor(f, kEasyBasis, 2, H);
  r.hard_basis = f32_tensor(f, kHardBasis, 2, H);
  const bool any = !r.easy_mean.empty() || !r.hard_mean.empty() || !r.easy_basis.empty() || !r.hard_basis.empty();
  if (any) {
    if (r.easy_mean.empty() || r.hard_mean.empty() || r.easy_basis.empty() || r.hard_basis.empty())
      throw Error(f.path() + ": the router needs all four of dory_router.{easy,hard}_{mean,basis}");
    r.dim = H;
    r.rank_easy = static_cast<int64_t>(r.easy_basis.size()) / H;
    r.rank_hard = static_cast<int64_t>(r.hard_basis.size()) / H;
    r.validate(f.path().c_str());
    t.present = true;
  }
  const int64_t nf = full_layer_count(c);
  t.exact_weights = f32_tensor(f, kExact, 2, 2 * c.n_kv_head);
  if (!t.exact_weights.empty()) {
    if (static_cast<int64_t>(t.exact_weights.size()) != nf * 2 * c.n_kv_head)
      throw Error(f.path() + ": tensor '" + std::string(kExact) + "' must have one row per full-attention layer (" +
                  std::to_string(nf) + ")");
    t.present = true;
  }
  return t;
}

void declare_turbo(gguf::Writer& w, const Turbo& t, const DoryConfig& c) {
  if (!t.router.empty() || t.present) w.set(kExitBias, gguf::Value::f32(static_cast<float>(t.router.bias)));
  if (t.o1)
    w.set(kO1, gguf::Value::array(gguf::VType::U32,
                                  {gguf::Value::u32(t.o1->m), gguf::Value::u32(t.o1->w), gguf::Value::u32(t.o1->sink),
                                   gguf::Value::u32(static_cast<uint32_t>(t.o1->seal))}));
  if (t.exact_budget) w.set(kBudget, gguf::Value::u32(static_cast<uint32_t>(*t.exact_budget)));
  const int64_t H = c.hidden;
  if (!t.router.empty()) {
    w.add_tensor(kEasyMean, DType::F32, {H});
    w.add_tensor(kEasyBasis, DType::F32, {t.router.rank_easy, H});
    w.add_tensor(kHardMean, DType::F32, {H});
    w.add_tensor(kHardBasis, DType::F32, {t.router.rank_hard, H});
  }
  if (!t.exact_weights.empty()) w.add_tensor(kExact, DType::F32, {full_layer_count(c), 2 * c.n_kv_head});
}

void write_turbo_data(gguf::Writer& w, const Turbo& t) {
  auto put = [&](const std::vector<float>& v) { w.write_tensor(v.data(), v.size() * sizeof(float)); };
  if (!t.router.empty()) {
    put(t.router.easy_mean);
    put(t.router.easy_basis);
    put(t.router.hard_mean);
    put(t.router.hard_basis);
  }
  if (!t.exact_weights.empty()) put(t.exact_weights);
}

namespace {
// The floats of a raw little-endian f32 side file after its first one (a header we do not
// read: cortiq's raw files start with one), or an empty vector when the file is a GGUF.
std::vector<float> raw_f32_body(const std::string& path, bool* is_gguf) {
  MappedFile m(path);
  *is_gguf = m.size() >= 4 && std::memcmp(m.data(), "GGUF", 4) == 0;
  if (*is_gguf) return {};
  if (m.size() < 8 || m.size() % 4 != 0)
    throw Error(path + ": not a GGUF made by dory calibrate, nor a raw f32 file (" + std::to_string(m.size()) +
                " bytes: raw files hold 4-byte floats, a header float first)");
  std::vector<float> w((m.size() - 4) / 4);
  std::memcpy(w.data(), m.data() + 4, 4 * w.size());
  return w;
}
void write_f32_file(const std::string& path, const std::vector<float>& w) {
  write_replacing(path, [&](const std::string& tmp) {
    write_text_file(tmp, std::string(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float)));
  });
}
}  // namespace

Router load_router(const std::string& path, const DoryConfig& c) {
  bool gguf = false;
  std::vector<float> w = raw_f32_body(path, &gguf);
  if (gguf) {
    gguf::File f(path);
    Router r = read_turbo(f, c).router;
    if (r.empty()) throw Error(path + ": no router (dory_router.* tensors; make one with dory calibrate)");
    return r;
  }
  // Raw: easy mean [H], easy basis [r x H], hard mean [H], hard basis [r x H], one rank r for
  // both; the size gives r. (How cortiq lays out its router file is not in CMF.md; this is
  // the order of the GGUF router's tensors, the header float as in its exact-row file.)
  const int64_t H = c.hidden, n = static_cast<int64_t>(w.size());
  if (n % (2 * H) != 0 || n / (2 * H) < 2)
    throw Error(path + ": a raw router for this model holds 1 + 2 x (1 + rank) x " + std::to_string(H) +
                " floats (easy mean and basis, hard mean and basis; rank >= 1); this file holds 1 + " +
                std::to_string(n));
  Router r;
  r.dim = H;
  r.rank_easy = r.rank_hard = n / (2 * H) - 1;
  const size_t half = static_cast<size_t>(n / 2), hh = static_cast<size_t>(H);
  r.easy_mean.assign(w.begin(), w.begin() + hh);
  r.easy_basis.assign(w.begin() + hh, w.begin() + half);
  r.hard_mean.assign(w.begin() + half, w.begin() + half + hh);
  r.hard_basis.assign(w.begin() + half + hh, w.end());
  r.validate(path.c_str());
  return r;
}

void write_raw_router(const std::string& path, const Router& r) {
  if (r.rank_easy != r.rank_hard)
    throw Error(path + ": a raw router file holds one rank for both topologies (easy " + std::to_string(r.rank_easy) +
                ", hard " + std::to_string(r.rank_hard) + ")");
  std::vector<float> w{static_cast<float>(r.rank_easy)};
  for (const auto* v : {&r.easy_mean, &r.easy_basis, &r.hard_mean, &r.hard_basis}) w.insert(w.end(), v->begin(), v->end());
  write_f32_file(path, w);
}

void write_raw_exact(const std::string& path, const std::vector<float>& weights, const DoryConfig& c) {
  std::vector<float> w{static_cast<float>(full_layer_count(c))};
  w.insert(w.end(), weights.begin(), weights.end());
  write_f32_file(path, w);
}

std::vector<float> load_exact_weights(const std::string& path, const DoryConfig& c) {
  const int64_t want = full_layer_count(c) * 2 * c.n_kv_head;
  {
    // cortiq's raw weight file: little-endian f32, the first float skipped (a header we do not
    // read), then the weights in dory_exact.weight's order (full layer, then per KV head the
    // key residual's and the value norm's). A GGUF (dory calibrate's) starts with "GGUF".
    bool gguf = false;
    std::vector<float> w = raw_f32_body(path, &gguf);
    if (!gguf) {
      if (static_cast<int64_t>(w.size()) != want)
        throw Error(path + ": not cortiq's raw f32 exact-row weights for this model (1 + " + std::to_string(want) +
                    " floats = " + std::to_string(4 * (1 + want)) + " bytes: " +
                    std::to_string(full_layer_count(c)) + " full layers x 2 x " + std::to_string(c.n_kv_head) +
                    " KV heads); it holds 1 + " + std::to_string(w.size()) + " floats");
      for (float v : w)
        if (!std::isfinite(v)) throw Error(path + ": raw exact-row weights hold a non-finite value");
      return w;
    }
  }
  gguf::File f(path);
  std::vector<float> w = f32_tensor(f, kExact, 2, 2 * c.n_kv_head);
  if (w.empty()) throw Error(path + ": no tensor '" + std::string(kExact) + "' (make one with dory calibrate)");
  if (static_cast<int64_t>(w.size()) != full_layer_count(c) * 2 * c.n_kv_head)
    throw Error(path + ": tensor '" + std::string(kExact) + "' has " + std::to_string(w.size() / (2 * c.n_kv_head)) +
                " rows; this model has " + std::to_string(full_layer_count(c)) + " full-attention layers");
  return w;
}

}  // namespace dory
