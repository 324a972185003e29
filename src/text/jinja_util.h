// String helpers with Python's semantics (code points, Unicode whitespace) for
// the Jinja interpreter. Not part of the public interface.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dory/error.h"

namespace dory::jinja {

inline bool py_isspace_ascii(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
         (c >= 0x1c && c <= 0x1f);
}

// Python's str.isspace() for one code point.
inline bool py_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// Decodes one code point at s[i] and advances i. Invalid bytes decode as
// themselves (U+0080..U+00FF would be wrong, so they map to 0xDC00+byte, the way
// Python's surrogateescape does) and re-encode to the same bytes.
inline uint32_t next_cp(const std::string& s, size_t& i) {
  const unsigned char c = s[i];
  auto cont = [&](size_t k) {
    return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
  };
  if (c < 0x80) {
    ++i;
    return c;
  }
  if (c >= 0xc2 && c < 0xe0 && cont(1)) {
    const uint32_t cp = ((c & 0x1f) << 6) | (s[i + 1] & 0x3f);
    i += 2;
    return cp;
  }
  if (c >= 0xe0 && c < 0xf0 && cont(1) && cont(2)) {
    const uint32_t cp = ((c & 0x0f) << 12) | ((s[i + 1] & 0x3f) << 6) | (s[i + 2] & 0x3f);
    if (cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff)) {
      i += 3;
      return cp;
    }
  }
  if (c >= 0xf0 && c < 0xf5 && cont(1) && cont(2) && cont(3)) {
    const uint32_t cp = ((c & 0x07) << 18) | ((s[i + 1] & 0x3f) << 12) | ((s[i + 2] & 0x3f) << 6) |
                        (s[i + 3] & 0x3f);
    if (cp >= 0x10000 && cp <= 0x10ffff) {
      i += 4;
      return cp;
    }
  }
  ++i;
  return 0xdc00 + c;
}

inline std::vector<uint32_t> to_cps(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(next_cp(s, i));
  return out;
}

inline void append_cp(std::string& out, uint32_t cp) {
  if (cp >= 0xdc80 && cp <= 0xdcff)
    out += static_cast<char>(cp - 0xdc00);
  else
    append_utf8(out, cp);
}

inline std::string from_cps(const std::vector<uint32_t>& cps, size_t b = 0, size_t e = SIZE_MAX) {
  std::string out;
  if (e > cps.size()) e = cps.size();
  for (size_t k = b; k < e; ++k) append_cp(out, cps[k]);
  return out;
}

inline size_t cp_count(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    next_cp(s, i);
    ++n;
  }
  return n;
}

inline bool all_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// Python's str.strip / lstrip / rstrip; chars == nullptr strips whitespace.
inline std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<uint32_t> cps = to_cps(s);
  std::vector<uint32_t> set;
  if (chars) set = to_cps(*chars);
  auto strip_it = [&](uint32_t c) {
    if (!chars) return py_isspace(c);
    for (uint32_t x : set)
      if (x == c) return true;
    return false;
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return from_cps(cps, b, e);
}

inline std::string py_rstrip(const std::string& s) {
  return py_strip(s, nullptr, false, true);
}

// An error message is one line: dory::one_line (dory/error.h), which dory::Error applies.

bool has_filter(const std::string& name);
bool has_test(const std::string& name);

}  // namespace dory::jinja
