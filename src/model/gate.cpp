#include "model/gate.h"

#include <cmath>
#include <string>

#include "dory/error.h"

namespace dory {

namespace {
bool parse_double(const std::string& s, double* out) {
  size_t used = 0;
  try {
    *out = std::stod(s, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == s.size() && std::isfinite(*out);
}
std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
}  // namespace

GateParams parse_gate(const std::string& s) {
  GateParams g;
  const std::string bad = "--gate: '" + s + "' is not off, conf:THETA, recon, recon:BIAS or auto";
  if (s == "off") return g;
  if (s == "auto") {
    g.kind = GateParams::Kind::Auto;
    return g;
  }
  if (s == "recon") {
    g.kind = GateParams::Kind::Recon;
    return g;
  }
  const size_t colon = s.find(':');
  if (colon == std::string::npos) throw Error(bad);
  const std::string kind = s.substr(0, colon), val = s.substr(colon + 1);
  double v = 0;
  if (!parse_double(val, &v)) throw Error(bad);
  if (kind == "conf") {
    if (!(v > 0 && v <= 1)) throw Error("--gate conf:" + val + ": the threshold must lie in (0, 1]");
    g.kind = GateParams::Kind::Conf;
    g.theta = v;
  } else if (kind == "recon") {
    if (std::fabs(v) > 1e6) throw Error("--gate recon:" + val + ": the bias is out of range");
    g.kind = GateParams::Kind::Recon;
    g.bias = v;
  } else {
    throw Error(bad);
  }
  return g;
}

std::string GateParams::str() const {
  switch (kind) {
    case Kind::Off: return "off";
    case Kind::Auto: return "auto";
    case Kind::Conf: return "conf:" + fmt(theta);
    case Kind::Recon: return bias ? "recon:" + fmt(*bias) : "recon";
  }
  return "?";
}

double top_probability(const float* logits, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float d = logits[i] - mx;
    if (d > -20.0f) sum += std::exp(double(d));
  }
  return 1.0 / sum;
}

namespace {
double topo_err(const float* x, const std::vector<float>& mu, const std::vector<float>& basis, int64_t rank,
                int64_t dim, std::vector<double>& d) {
  double e = 0;
  for (int64_t i = 0; i < dim; ++i) {
    d[i] = double(x[i]) - mu[i];
    e += d[i] * d[i];
  }
  for (int64_t r = 0; r < rank; ++r) {
    const float* b = basis.data() + r * dim;
    double p = 0;
    for (int64_t i = 0; i < dim; ++i) p += b[i] * d[i];
    e -= p * p;
  }
  return e;
}
}  // namespace

double Router::score(const float* x) const {
  std::vector<double> d(dim);
  return topo_err(x, hard_mean, hard_basis, rank_hard, dim, d) - topo_err(x, easy_mean, easy_basis, rank_easy, dim, d);
}

void Router::validate(const char* where) const {
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw Error(std::string(where) + ": router " + what);
  };
  need(dim > 0, "has no dimension");
  need(static_cast<int64_t>(easy_mean.size()) == dim && static_cast<int64_t>(hard_mean.size()) == dim,
       "means must have " + std::to_string(dim) + " entries");
  need(rank_easy >= 0 && rank_hard >= 0 && rank_easy <= dim && rank_hard <= dim, "rank out of range");
  need(static_cast<int64_t>(easy_basis.size()) == rank_easy * dim &&
           static_cast<int64_t>(hard_basis.size()) == rank_hard * dim,
       "bases must be [rank x " + std::to_string(dim) + "]");
  need(std::isfinite(bias), "bias is not finite");
  for (const auto* v : {&easy_mean, &hard_mean, &easy_basis, &hard_basis})
    for (float f : *v) need(std::isfinite(f), "holds a value that is not finite");
}

bool ExitTracker::read_out(bool* probe) {
  *probe = false;
  if (rate_ >= 0.35) return true;
  if (++skipped_ % 8 == 0) {
    *probe = true;
    return true;
  }
  return false;
}

void ExitTracker::record(bool exited) { rate_ = 0.9 * rate_ + 0.1 * (exited ? 1.0 : 0.0); }

}  // namespace dory
