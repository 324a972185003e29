#include "backend/cpu/far_field.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dory/error.h"

namespace dory {

bool ridge_pinv(const std::vector<double>& A, int n, double lam0, std::vector<double>& out) {
  // G = A^T A
  std::vector<double> G(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j) {
      double s = 0;
      for (int r = 0; r < n; ++r) s += A[size_t(r) * n + i] * A[size_t(r) * n + j];
      G[size_t(i) * n + j] = G[size_t(j) * n + i] = s;
    }
  double md = 0;
  for (int i = 0; i < n; ++i) md += G[size_t(i) * n + i];
  md /= n;
  if (!(md > 0) || !std::isfinite(md)) return false;
  std::vector<double> L(size_t(n) * n);
  for (double lam = lam0 * md; lam <= 1e6 * md; lam *= 10) {
    // Cholesky of G + lam I
    bool ok = true;
    std::fill(L.begin(), L.end(), 0.0);
    for (int j = 0; j < n && ok; ++j) {
      double d = G[size_t(j) * n + j] + lam;
      for (int k = 0; k < j; ++k) d -= L[size_t(j) * n + k] * L[size_t(j) * n + k];
      if (!(d > 0) || !std::isfinite(d)) {
        ok = false;
        break;
      }
      const double ljj = std::sqrt(d);
      L[size_t(j) * n + j] = ljj;
      for (int i = j + 1; i < n; ++i) {
        double s = G[size_t(i) * n + j];
        for (int k = 0; k < j; ++k) s -= L[size_t(i) * n + k] * L[size_t(j) * n + k];
        L[size_t(i) * n + j] = s / ljj;
      }
    }
    if (!ok) continue;
    // out = (L L^T)^-1 A^T: solve column by column (column c of A^T is row c of A).
    out.assign(size_t(n) * n, 0.0);
    std::vector<double> y(n);
    for (int c = 0; c < n; ++c) {
      for (int i = 0; i < n; ++i) {
        double s = A[size_t(c) * n + i];
        for (int k = 0; k < i; ++k) s -= L[size_t(i) * n + k] * y[k];
        y[i] = s / L[size_t(i) * n + i];
      }
      for (int i = n - 1; i >= 0; --i) {
        double s = y[i];
        for (int k = i + 1; k < n; ++k) s -= L[size_t(k) * n + i] * out[size_t(k) * n + c];
        out[size_t(i) * n + c] = s / L[size_t(i) * n + i];
      }
    }
    return true;
  }
  return false;
}

namespace {
template <class A, class B>
double dotd(const A* a, const B* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
  return s;
}
}  // namespace

FarField::FarField(const O1Params& p, int64_t n_head, int64_t n_kv_head, int64_t head_dim)
    : p_(p), nh_(n_head), nk_(n_kv_head), hd_(head_dim), group_(n_head / n_kv_head),
      inv_sqrt_d_(1.0 / std::sqrt(double(head_dim))) {}

namespace {
int landmark_count(const O1Params& p, int64_t t) {
  const int m = static_cast<int>(std::clamp<int64_t>(t / 8, 4, p.m));
  return static_cast<int>(std::min<int64_t>(m, t - p.sink));
}
}  // namespace

std::vector<double> FarField::key_landmarks(const O1Params& p, int64_t t, int64_t nk, int64_t hd, const RowFn& k,
                                            int* m_out) {
  const int m = landmark_count(p, t);
  const int64_t L = t - p.sink, KW = nk * hd;
  std::vector<double> kt(size_t(nk) * m * hd, 0.0), acc(KW);
  for (int s = 0; s < m; ++s) {
    const int64_t b = p.sink + s * L / m, e = p.sink + (s + 1) * L / m;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = b; j < e; ++j) {
      const float* kr = k(j);
      for (int64_t i = 0; i < KW; ++i) acc[i] += kr[i];
    }
    for (int64_t g = 0; g < nk; ++g)
      for (int64_t d = 0; d < hd; ++d) kt[(size_t(g) * m + s) * hd + d] = acc[g * hd + d] / double(e - b);
  }
  *m_out = m;
  return kt;
}

void FarField::build(int64_t t, const RowFn& k, const RowFn& v, const RowFn& q, std::span<const int64_t> exact) {
  const int64_t KW = nk_ * hd_, sink = p_.sink, w = p_.w;
  if (t <= w + sink + 8) throw Error("far field: " + std::to_string(t) + " rows are too few to seal");
  // Pinned rows: the sinks, then the chosen exact rows.
  pinned_pos_.clear();
  for (int64_t j = 0; j < sink; ++j) pinned_pos_.push_back(j);
  for (int64_t j : exact)
    if (j >= sink && j < t - w && (pinned_pos_.empty() || j > pinned_pos_.back())) pinned_pos_.push_back(j);
  pinned_k_.resize(pinned_pos_.size() * KW);
  pinned_v_.resize(pinned_pos_.size() * KW);
  for (size_t i = 0; i < pinned_pos_.size(); ++i) {
    std::copy_n(k(pinned_pos_[i]), KW, pinned_k_.data() + i * KW);
    std::copy_n(v(pinned_pos_[i]), KW, pinned_v_.data() + i * KW);
  }

  // Landmarks: m_ contiguous segments of rows [sink, t); queries where kept.
  const int64_t L = t - sink;
  kt_ = key_landmarks(p_, t, nk_, hd_, k, &m_);
  auto seg_begin = [&](int64_t s) { return sink + s * L / m_; };
  qt_.assign(size_t(nh_) * m_ * hd_, 0.0);
  std::vector<double> qall(nh_ * hd_, 0.0);
  int64_t qall_n = 0;
  std::vector<int64_t> qn(m_, 0);
  std::vector<double> qacc(size_t(m_) * nh_ * hd_, 0.0);
  for (int s = 0; s < m_; ++s) {
    const int64_t b = seg_begin(s), e = seg_begin(s + 1);
    for (int64_t j = b; j < e; ++j) {
      if (const float* qr = q(j)) {
        double* qa = qacc.data() + size_t(s) * nh_ * hd_;
        for (int64_t i = 0; i < nh_ * hd_; ++i) qa[i] += qr[i], qall[i] += qr[i];
        ++qn[s];
        ++qall_n;
      }
    }
  }
  if (qall_n == 0) throw Error("far field: no query rows were kept for the landmarks");
  for (int s = 0; s < m_; ++s) {
    // A segment without kept queries takes the mean of all kept queries.
    const double* src = qn[s] ? qacc.data() + size_t(s) * nh_ * hd_ : qall.data();
    const double cnt = double(qn[s] ? qn[s] : qall_n);
    for (int64_t h = 0; h < nh_; ++h)
      for (int64_t d = 0; d < hd_; ++d)
        qt_[(size_t(h) * m_ + s) * hd_ + d] = src[h * hd_ + d] / cnt;
  }

  // M_h = ridge pinv(exp(Q~_h K~^T / sqrt(d) - s_h)).
  M_.assign(size_t(nh_) * m_ * m_, 0.0);
  shift_.assign(nh_, 0.0);
  std::vector<double> A(size_t(m_) * m_), Mi;
  for (int64_t h = 0; h < nh_; ++h) {
    const int64_t g = h / group_;
    double mx = -std::numeric_limits<double>::infinity();
    for (int a = 0; a < m_; ++a)
      for (int b = 0; b < m_; ++b) {
        const double s = dotd(qt_.data() + (size_t(h) * m_ + a) * hd_, kt_.data() + (size_t(g) * m_ + b) * hd_, hd_) *
                         inv_sqrt_d_;
        A[size_t(a) * m_ + b] = s;
        mx = std::max(mx, s);
      }
    for (double& x : A) x = std::exp(x - mx);
    shift_[h] = mx;
    if (!ridge_pinv(A, m_, 1e-6, Mi)) throw Error("far field: the landmark kernel has no ridge inverse");
    std::copy(Mi.begin(), Mi.end(), M_.begin() + size_t(h) * m_ * m_);
  }

  // The accumulators, then every far row in order.
  T_.assign(size_t(nh_) * m_ * hd_, 0.0);
  Z_.assign(size_t(nh_) * m_, 0.0);
  mx_.assign(size_t(nh_) * m_, -std::numeric_limits<double>::infinity());
  far_end_ = sink;
  size_t pi = 0;
  for (int64_t j = sink; j < t - w; ++j) {
    while (pi < pinned_pos_.size() && pinned_pos_[pi] < j) ++pi;
    if (pi < pinned_pos_.size() && pinned_pos_[pi] == j) {
      far_end_ = j + 1;  // pinned: stays exact, not in the accumulators
      continue;
    }
    insert(k(j), v(j));
  }
  far_end_ = t - w;
}

void FarField::insert(const float* k, const float* v) {
  for (int64_t h = 0; h < nh_; ++h) {
    const int64_t g = h / group_;
    const float* kh = k + g * hd_;
    const float* vh = v + g * hd_;
    for (int i = 0; i < m_; ++i) {
      const size_t li = size_t(h) * m_ + i;
      const double s = dotd(qt_.data() + li * hd_, kh, hd_) * inv_sqrt_d_;
      double* T = T_.data() + li * hd_;
      if (s > mx_[li]) {
        const double r = std::exp(mx_[li] - s);  // 0 for the first row
        for (int64_t d = 0; d < hd_; ++d) T[d] *= r;
        Z_[li] *= r;
        mx_[li] = s;
      }
      const double e = std::exp(s - mx_[li]);
      for (int64_t d = 0; d < hd_; ++d) T[d] += e * vh[d];
      Z_[li] += e;
    }
  }
  ++far_end_;
}

void FarField::attend(int64_t h, const float* q, int64_t p, const RowFn& wk, const RowFn& wv, float* out) const {
  const int64_t KW = nk_ * hd_, g = h / group_, np = static_cast<int64_t>(pinned_pos_.size());
  // Exact scores: pinned rows, then the window [far_end_, p].
  const int64_t nw = std::max<int64_t>(0, p - far_end_ + 1);
  std::vector<double> sc(np + nw);
  double c = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < np; ++i) {
    sc[i] = dotd(q, pinned_k_.data() + i * KW + g * hd_, hd_) * inv_sqrt_d_;
    c = std::max(c, sc[i]);
  }
  for (int64_t j = 0; j < nw; ++j) {
    sc[np + j] = dotd(q, wk(far_end_ + j) + g * hd_, hd_) * inv_sqrt_d_;
    c = std::max(c, sc[np + j]);
  }
  // Far weights: u = exp(a - f) M_h, exponent f + mx_b - s_h per landmark.
  const size_t base = size_t(h) * m_;
  std::vector<double> u(m_, 0.0), ex(m_);
  bool far = false;
  for (int b = 0; b < m_; ++b) far |= Z_[base + b] > 0;
  if (far) {
    std::vector<double> a(m_);
    double f = -std::numeric_limits<double>::infinity();
    for (int i = 0; i < m_; ++i) {
      a[i] = dotd(q, kt_.data() + (size_t(g) * m_ + i) * hd_, hd_) * inv_sqrt_d_;
      f = std::max(f, a[i]);
    }
    const double* M = M_.data() + size_t(h) * m_ * m_;
    for (int i = 0; i < m_; ++i) {
      const double fh = std::exp(a[i] - f);
      for (int b = 0; b < m_; ++b) u[b] += fh * M[size_t(i) * m_ + b];
    }
    for (int b = 0; b < m_; ++b) {
      if (p_.clamp) u[b] = std::max(0.0, u[b]);
      ex[b] = Z_[base + b] > 0 ? f + mx_[base + b] - shift_[h] : -std::numeric_limits<double>::infinity();
      if (Z_[base + b] > 0 && u[b] != 0) c = std::max(c, ex[b]);
    }
  }
  std::vector<double> num(hd_, 0.0);
  double den = 0;
  for (int64_t i = 0; i < np + nw; ++i) {
    const double e = std::exp(sc[i] - c);
    const float* vr = i < np ? pinned_v_.data() + i * KW + g * hd_ : wv(far_end_ + (i - np)) + g * hd_;
    for (int64_t d = 0; d < hd_; ++d) num[d] += e * vr[d];
    den += e;
  }
  if (far) {
    std::vector<double> gb(m_);
    double fden = 0;
    for (int b = 0; b < m_; ++b) {
      gb[b] = Z_[base + b] > 0 ? u[b] * std::exp(ex[b] - c) : 0.0;
      fden += gb[b] * Z_[base + b];
    }
    // Aggregate rectifier: a far part whose denominator is negative is dropped.
    if (fden > 0) {
      for (int b = 0; b < m_; ++b) {
        if (gb[b] == 0) continue;
        const double* T = T_.data() + (base + b) * hd_;
        for (int64_t d = 0; d < hd_; ++d) num[d] += gb[b] * T[d];
      }
      den += fden;
    }
  }
  const double inv = den > 0 ? 1.0 / den : 0.0;
  for (int64_t d = 0; d < hd_; ++d) out[d] = static_cast<float>(num[d] * inv);
}

uint64_t FarField::bytes() const {
  return pinned_k_.capacity() * 4 + pinned_v_.capacity() * 4 + kt_.capacity() * 8 + qt_.capacity() * 8 +
         M_.capacity() * 8 + shift_.capacity() * 8 + T_.capacity() * 8 + Z_.capacity() * 8 + mx_.capacity() * 8 +
         pinned_pos_.capacity() * 8;
}

}  // namespace dory
