#include "text/utf8.h"

namespace dory::utf8 {

namespace {

// How many continuation bytes a lead byte wants and the allowed range of the first one
// (the Unicode "well-formed byte sequences" table): this rules out overlongs, surrogates
// and code points above U+10FFFF without decoding.
struct Lead {
  uint8_t need;  // continuation bytes; 0xFF = not a lead byte
  uint8_t lo, hi;
};

inline Lead lead_info(uint8_t b) {
  if (b < 0x80) return {0, 0, 0};
  if (b < 0xC2) return {0xFF, 0, 0};
  if (b < 0xE0) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b < 0xF0) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b < 0xF4) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {0xFF, 0, 0};
}

// Number of bytes at s[i] that form a valid prefix of a sequence (>= 1 when s[i] is a lead
// byte), and whether the sequence is complete.
inline size_t prefix_len(std::string_view s, size_t i, bool* complete) {
  const uint8_t b = static_cast<uint8_t>(s[i]);
  const Lead l = lead_info(b);
  *complete = false;
  if (l.need == 0) {
    *complete = true;
    return 1;
  }
  if (l.need == 0xFF) return 0;
  size_t k = 1;
  for (; k <= l.need; ++k) {
    if (i + k >= s.size()) return k;
    const uint8_t c = static_cast<uint8_t>(s[i + k]);
    const uint8_t lo = k == 1 ? l.lo : 0x80, hi = k == 1 ? l.hi : 0xBF;
    if (c < lo || c > hi) return k;
  }
  *complete = true;
  return k;
}

}  // namespace

size_t valid_seq_len(std::string_view s, size_t i) {
  bool complete;
  const size_t n = prefix_len(s, i, &complete);
  return complete ? n : 0;
}

char32_t decode_at(std::string_view s, size_t i, size_t* len) {
  const uint8_t b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) {
    *len = 1;
    return b;
  }
  size_t n = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  char32_t cp = b & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t first_invalid(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = valid_seq_len(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string to_valid_lossy(std::string_view s) {
  size_t bad = first_invalid(s);
  if (bad == std::string_view::npos) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  out.append(s.substr(0, bad));
  size_t i = bad;
  while (i < s.size()) {
    bool complete;
    size_t n = prefix_len(s, i, &complete);
    if (complete) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      append(out, kReplacement);
      i += n == 0 ? 1 : n;
    }
  }
  return out;
}

size_t complete_prefix_len(std::string_view s) {
  // Only the last 3 bytes can start a sequence that more bytes would complete.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const uint8_t b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) return n;
    if (b >= 0xC0) {
      bool complete;
      const size_t k = prefix_len(s, i, &complete);
      // Incomplete only when every byte from i to the end is a valid prefix.
      if (!complete && k == back) return i;
      return n;
    }
  }
  return n;
}

}  // namespace dory::utf8
