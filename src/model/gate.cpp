#include "model/gate.h"

#include <cmath>
#include <string>

#include "dory/error.h"

namespace dory {

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
