// Parsing and printing of the runtime options of docs/model.md sections 4-6 (--gate,
// --o1, --exact): every bad value is one clear error naming the flag.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "dory/error.h"
#include "dory/options.h"

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
// The whole of s as a decimal integer.
bool parse_int(const std::string& s, long long* out) {
  size_t used = 0;
  try {
    *out = std::stoll(s, &used);
  } catch (const std::exception&) {
    return false;
  }
  return !s.empty() && used == s.size();
}
std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
}  // namespace

GateParams parse_gate(const std::string& s) {
  GateParams g;
  const std::string bad =
      "--gate: '" + s + "' is not off, conf:THETA, recon, recon:BIAS, recon:FILE[:BIAS] or auto";
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
  if (kind == "recon" && !parse_double(val, &v)) {
    // recon:FILE or recon:FILE:BIAS (a number after the last colon is the bias).
    std::string file = val;
    const size_t c2 = val.rfind(':');
    const bool has_bias = c2 != std::string::npos && parse_double(val.substr(c2 + 1), &v);
    if (has_bias) file = val.substr(0, c2);
    std::error_code ec;
    if (file.empty() || !std::filesystem::is_regular_file(file, ec))
      throw Error("--gate recon:" + val + ": no file '" + file +
                  "' (recon:BIAS takes a number, recon:FILE[:BIAS] a router file)");
    g.router_file = file;
    if (!has_bias) {
      g.kind = GateParams::Kind::Recon;
      return g;
    }
  } else if (!parse_double(val, &v)) {
    throw Error(bad);
  }
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
    case Kind::Recon: {
      std::string r = "recon";
      if (!router_file.empty()) r += ":" + router_file;
      return bias ? r + ":" + fmt(*bias) : r;
    }
  }
  return "?";
}

void O1Params::validate() const {
  if (!on) return;
  if (m < 1 || m > 1024) throw Error("--o1: m = " + std::to_string(m) + " is out of range (1..1024 landmarks)");
  if (w < 1 || w > 65536) throw Error("--o1: w = " + std::to_string(w) + " is out of range (1..65536 window rows)");
  if (sink < 0 || sink > 4096) throw Error("--o1: sink = " + std::to_string(sink) + " is out of range (0..4096)");
  if (seal < int64_t(w) + sink + 16)
    throw Error("--o1: seal = " + std::to_string(seal) + " must be at least w + sink + 16 = " +
                std::to_string(int64_t(w) + sink + 16));
  if (seal > (int64_t(1) << 30)) throw Error("--o1: seal = " + std::to_string(seal) + " is too large");
}

std::string O1Params::str() const {
  if (!on) return "off";
  return std::to_string(m) + "," + std::to_string(w) + "," + std::to_string(sink) + "," + std::to_string(seal);
}

O1Params parse_o1(const std::string& s) {
  O1Params p;
  if (s == "off") return p;
  std::vector<long long> v;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    long long x = 0;
    if (!parse_int(s.substr(i, j - i), &x))
      throw Error("--o1: '" + s + "' is not off or m,w,sink,seal (e.g. 32,128,4,1024)");
    v.push_back(x);
    i = j + 1;
  }
  if (v.size() != 4) throw Error("--o1: '" + s + "' is not off or m,w,sink,seal (e.g. 32,128,4,1024)");
  for (long long x : v)
    if (x < 0 || x > (1ll << 30)) throw Error("--o1: '" + s + "' has a value out of range");
  p.on = true;
  p.m = static_cast<int>(v[0]);
  p.w = static_cast<int>(v[1]);
  p.sink = static_cast<int>(v[2]);
  p.seal = v[3];
  p.validate();
  return p;
}

ExactParams parse_exact(const std::string& s) {
  ExactParams e;
  if (s == "off") return e;
  const std::string bad = "--exact: '" + s + "' is not off, ROWS or FILE:ROWS (e.g. 256 or turbo.gguf:256)";
  const size_t colon = s.rfind(':');
  const std::string rows = colon == std::string::npos ? s : s.substr(colon + 1);
  long long n = 0;
  if (!parse_int(rows, &n)) throw Error(bad);
  if (n < 1 || n > 8192) throw Error("--exact: " + rows + " rows is out of range (1..8192)");
  e.on = true;
  e.budget = n;
  if (colon != std::string::npos) {
    e.source = s.substr(0, colon);
    if (e.source.empty()) throw Error(bad);
  }
  return e;
}

std::string ExactParams::str() const {
  if (!on) return "off";
  return (source.empty() || source == "the model file" ? "" : source + ":") + std::to_string(budget);
}

const char* device_name(Device d) {
  switch (d) {
    case Device::Cpu: return "cpu";
    case Device::Cuda: return "cuda";
    case Device::Auto: break;
  }
  return "auto";
}

Device parse_device(const std::string& s) {
  if (s == "auto") return Device::Auto;
  if (s == "cpu") return Device::Cpu;
  if (s == "cuda") return Device::Cuda;
  throw Error("--device: '" + s + "' is not a device (expected cpu, cuda or auto)");
}

}  // namespace dory
