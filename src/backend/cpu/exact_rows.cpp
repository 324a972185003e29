#include "backend/cpu/exact_rows.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <numeric>

#include "dory/error.h"
#include "dory/options.h"

namespace dory {

namespace {
std::atomic<uint64_t> g_store_serial{0};

bool write_all(int fd, const void* p, size_t n) {
  const auto* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n, off_t off) {
  auto* c = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = ::pread(fd, c, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    off += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
}  // namespace

RowStore::RowStore(int64_t kv_width, int64_t q_width, const std::string& spill_dir, const std::string& tag)
    : kvw_(kv_width), qw_(q_width), qbuf_(q_width) {
  if (spill_dir.empty()) return;
  const std::string base = spill_dir + "/dory-" + std::to_string(::getpid()) + "-" +
                           std::to_string(g_store_serial.fetch_add(1)) + "-" + tag;
  for (const char* ext : {".kv", ".q"}) {
    const std::string path = base + ext;
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      fail("cannot create " + path + ": " + std::strerror(errno));
      return;
    }
    paths_.push_back(path);
    (std::strcmp(ext, ".kv") == 0 ? fd_kv_ : fd_q_) = fd;
  }
}

RowStore::~RowStore() {
  for (int fd : {fd_kv_, fd_q_})
    if (fd >= 0) ::close(fd);
  for (const std::string& p : paths_) ::unlink(p.c_str());
}

void RowStore::fail(const std::string& why) {
  if (!ok_) return;
  ok_ = false;
  error_ = why;
  // What was stored is of no use any more: give the memory and the disk back.
  std::vector<float>().swap(kv_);
  std::vector<float>().swap(q_);
  q_index_.clear();
  for (int* fd : {&fd_kv_, &fd_q_})
    if (*fd >= 0) ::close(*fd), *fd = -1;
  for (const std::string& p : paths_) ::unlink(p.c_str());
  paths_.clear();
}

void RowStore::put(int64_t pos, const float* k, const float* v) {
  if (!ok_) return;
  if (first_ < 0) first_ = pos;
  if (pos != end()) return fail("rows out of order");
  if (fd_kv_ >= 0) {
    if (!write_all(fd_kv_, k, kvw_ * 4) || !write_all(fd_kv_, v, kvw_ * 4))
      return fail("cannot write " + paths_[0] + ": " + std::strerror(errno ? errno : EIO));
  } else {
    kv_.insert(kv_.end(), k, k + kvw_);
    kv_.insert(kv_.end(), v, v + kvw_);
  }
  ++count_;
}

void RowStore::put_q(int64_t pos, const float* q) {
  if (!ok_ || q_index_.count(pos)) return;
  const int64_t row = static_cast<int64_t>(q_index_.size());
  if (fd_q_ >= 0) {
    if (!write_all(fd_q_, q, qw_ * 4))
      return fail("cannot write " + paths_[1] + ": " + std::strerror(errno ? errno : EIO));
  } else {
    q_.insert(q_.end(), q, q + qw_);
  }
  q_index_[pos] = row;
}

bool RowStore::get(int64_t pos, float* k, float* v) {
  if (!ok_ || pos < first_ || pos >= end()) return false;
  const int64_t r = pos - first_;
  if (fd_kv_ < 0) {
    std::copy_n(kv_.data() + r * 2 * kvw_, kvw_, k);
    std::copy_n(kv_.data() + r * 2 * kvw_ + kvw_, kvw_, v);
    return true;
  }
  std::vector<float> both(2 * kvw_);
  if (!read_all(fd_kv_, both.data(), both.size() * 4, static_cast<off_t>(r) * 2 * kvw_ * 4)) {
    fail("cannot read " + paths_[0]);
    return false;
  }
  std::copy_n(both.data(), kvw_, k);
  std::copy_n(both.data() + kvw_, kvw_, v);
  return true;
}

const float* RowStore::q(int64_t pos) {
  if (!ok_) return nullptr;
  auto it = q_index_.find(pos);
  if (it == q_index_.end()) return nullptr;
  if (fd_q_ < 0) return q_.data() + it->second * qw_;
  if (!read_all(fd_q_, qbuf_.data(), qw_ * 4, static_cast<off_t>(it->second) * qw_ * 4)) {
    fail("cannot read " + paths_[1]);
    return nullptr;
  }
  return qbuf_.data();
}

uint64_t RowStore::ram_bytes() const { return (kv_.capacity() + q_.capacity() + qbuf_.capacity()) * 4; }

std::vector<double> rank_shares(const std::vector<double>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<double> out(n, 0.0);
  if (n <= 1) return out;
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return x[a] < x[b]; });
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j + 1 < n && x[idx[j + 1]] == x[idx[i]]) ++j;
    const double r = 0.5 * double(i + j) / double(n - 1);
    for (int64_t k = i; k <= j; ++k) out[idx[k]] = r;
    i = j + 1;
  }
  return out;
}

std::vector<int64_t> choose_exact_rows(const std::vector<double>& score, int64_t lo, int64_t hi, int64_t budget,
                                       int neighbours) {
  std::vector<int64_t> order(score.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
  std::vector<bool> taken(score.size(), false);
  std::vector<int64_t> out;
  for (int64_t i : order) {
    if (static_cast<int64_t>(out.size()) >= budget) break;
    if (taken[i]) continue;
    for (int64_t d = -neighbours; d <= neighbours && static_cast<int64_t>(out.size()) < budget; ++d) {
      const int64_t j = i + d;
      if (j < 0 || lo + j >= hi || taken[j]) continue;
      taken[j] = true;
      out.push_back(lo + j);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<double> exact_scores(const std::function<const float*(int64_t)>& k,
                                 const std::function<const float*(int64_t)>& v, int64_t lo, int64_t hi,
                                 const std::vector<double>& landmarks, int m, int64_t nk, int64_t hd,
                                 std::span<const float> weights) {
  const int64_t n = std::max<int64_t>(0, hi - lo);
  const std::vector<double> f = exact_features(k, v, lo, hi, landmarks, m, nk, hd);
  std::vector<double> score(n, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < 2 * nk; ++j) score[i] += weights[j] * f[i * 2 * nk + j];
  return score;
}

std::vector<double> exact_features(const std::function<const float*(int64_t)>& k,
                                   const std::function<const float*(int64_t)>& v, int64_t lo, int64_t hi,
                                   const std::vector<double>& landmarks, int m, int64_t nk, int64_t hd) {
  const int64_t n = std::max<int64_t>(0, hi - lo);
  std::vector<double> out(n * 2 * nk, 0.0);
  if (n == 0) return out;
  // Per KV head: the Cholesky factor of K~ K~^T + lambda I, lambda = 1e-4 mean diag.
  std::vector<std::vector<double>> chol(nk);
  for (int64_t g = 0; g < nk; ++g) {
    const double* L = landmarks.data() + g * m * hd;
    std::vector<double> G(size_t(m) * m);
    double md = 0;
    for (int a = 0; a < m; ++a)
      for (int b = 0; b < m; ++b) {
        double s = 0;
        for (int64_t d = 0; d < hd; ++d) s += L[a * hd + d] * L[b * hd + d];
        G[size_t(a) * m + b] = s;
        if (a == b) md += s;
      }
    md = md / m;
    const double lam = 1e-4 * (md > 0 ? md : 1.0);
    for (int a = 0; a < m; ++a) G[size_t(a) * m + a] += lam;
    std::vector<double>& C = chol[g];
    C.assign(size_t(m) * m, 0.0);
    for (int j = 0; j < m; ++j) {
      double dj = G[size_t(j) * m + j];
      for (int q = 0; q < j; ++q) dj -= C[size_t(j) * m + q] * C[size_t(j) * m + q];
      C[size_t(j) * m + j] = std::sqrt(std::max(dj, 1e-300));
      for (int i = j + 1; i < m; ++i) {
        double s = G[size_t(i) * m + j];
        for (int q = 0; q < j; ++q) s -= C[size_t(i) * m + q] * C[size_t(j) * m + q];
        C[size_t(i) * m + j] = s / C[size_t(j) * m + j];
      }
    }
  }
  std::vector<std::vector<double>> resid(nk, std::vector<double>(n)), vnorm(nk, std::vector<double>(n));
  std::vector<double> c(m), y(m), r(hd);
  for (int64_t i = 0; i < n; ++i) {
    const float* kr = k(lo + i);
    for (int64_t g = 0; g < nk; ++g) {
      const double* L = landmarks.data() + g * m * hd;
      const float* kg = kr + g * hd;
      for (int a = 0; a < m; ++a) {
        double s = 0;
        for (int64_t d = 0; d < hd; ++d) s += L[a * hd + d] * kg[d];
        c[a] = s;
      }
      // (K~ K~^T + lambda I) y = K~ k; the projection is K~^T y.
      const std::vector<double>& C = chol[g];
      for (int a = 0; a < m; ++a) {
        double s = c[a];
        for (int q = 0; q < a; ++q) s -= C[size_t(a) * m + q] * y[q];
        y[a] = s / C[size_t(a) * m + a];
      }
      for (int a = m - 1; a >= 0; --a) {
        double s = y[a];
        for (int q = a + 1; q < m; ++q) s -= C[size_t(q) * m + a] * y[q];
        y[a] = s / C[size_t(a) * m + a];
      }
      double rr = 0;
      for (int64_t d = 0; d < hd; ++d) {
        double p = 0;
        for (int a = 0; a < m; ++a) p += L[a * hd + d] * y[a];
        rr += (kg[d] - p) * (kg[d] - p);
      }
      resid[g][i] = rr;
    }
    const float* vr = v(lo + i);
    for (int64_t g = 0; g < nk; ++g) {
      double s = 0;
      for (int64_t d = 0; d < hd; ++d) s += double(vr[g * hd + d]) * vr[g * hd + d];
      vnorm[g][i] = s;
    }
  }
  for (int64_t g = 0; g < nk; ++g) {
    const std::vector<double> rk = rank_shares(resid[g]), vk = rank_shares(vnorm[g]);
    for (int64_t i = 0; i < n; ++i) {
      out[i * 2 * nk + 2 * g] = rk[i];
      out[i * 2 * nk + 2 * g + 1] = vk[i];
    }
  }
  return out;
}

}  // namespace dory
