// Unicode properties and full case mappings, as the Python that jinja2 runs on
// has them (tables generated into jinja_unicode.cpp by
// tests/template/make_unicode_tables.py). They make str.upper(), title(),
// isalpha(), repr() and friends match Python exactly.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace dory::jinja::unicode {

struct Range {
  uint32_t first, last;
};
struct Mapping {
  uint32_t cp;
  uint32_t to[3];  // up to three code points; unused ones are 0
};

inline bool in_ranges(const Range* r, size_t n, uint32_t c) {
  const Range* e = r + n;
  const Range* it =
      std::upper_bound(r, e, c, [](uint32_t v, const Range& x) { return v < x.first; });
  return it != r && c <= (it - 1)->last;
}

inline const Mapping* find_mapping(const Mapping* m, size_t n, uint32_t c) {
  const Mapping* e = m + n;
  const Mapping* it =
      std::lower_bound(m, e, c, [](const Mapping& x, uint32_t v) { return x.cp < v; });
  return it != e && it->cp == c ? it : nullptr;
}

bool is_cased(uint32_t c);
bool is_caseignorable(uint32_t c);
bool is_lower(uint32_t c);
bool is_upper(uint32_t c);
bool is_title(uint32_t c);
bool is_printable(uint32_t c);
bool is_alpha(uint32_t c);
bool is_decimal(uint32_t c);
bool is_digit(uint32_t c);
bool is_numeric(uint32_t c);

const Mapping* find_tolower(uint32_t c);
const Mapping* find_toupper(uint32_t c);
const Mapping* find_totitle(uint32_t c);

}  // namespace dory::jinja::unicode
