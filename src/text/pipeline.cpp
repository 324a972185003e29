// The tokenizer.json components around the model: normalizers, pre-tokenizers, decoders,
// each doing what the Hugging Face library's component of the same name does.
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

#include "dory/error.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace dory::tok {

// --- JSON helpers ------------------------------------------------------------------------

const json& field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": expected an object");
  auto it = j.find(key);
  if (it == j.end()) throw Error(where + ": missing \"" + key + "\"");
  return *it;
}

std::string get_string(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  if (!v.is_string()) throw Error(where + "." + key + ": expected a string");
  return v.get<std::string>();
}

std::string get_string_or(const json& j, const char* key, const std::string& where,
                          const std::string& dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_string()) throw Error(where + "." + key + ": expected a string");
  return it->get<std::string>();
}

bool get_bool_or(const json& j, const char* key, const std::string& where, bool dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) throw Error(where + "." + key + ": expected true or false");
  return it->get<bool>();
}

int64_t get_int_or(const json& j, const char* key, const std::string& where, int64_t dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number_integer()) throw Error(where + "." + key + ": expected an integer");
  return it->get<int64_t>();
}

namespace {

std::string type_of(const json& j, const std::string& where) {
  return get_string(j, "type", where);
}

char32_t single_char(const std::string& s, const std::string& where) {
  size_t len = 0;
  if (s.empty() || utf8::valid_seq_len(s, 0) != s.size())
    throw Error(where + ": expected exactly one character");
  return utf8::decode_at(s, 0, &len);
}

// Each character for which pred holds is its own match (the library's Fn(char) Pattern).
template <class Pred>
void char_matches(std::string_view s, Pred pred, std::vector<std::pair<size_t, size_t>>& ranges,
                  std::vector<char>& is_match) {
  ranges.clear();
  is_match.clear();
  if (s.empty()) {
    ranges.emplace_back(0, 0);
    is_match.push_back(0);
    return;
  }
  size_t last = 0, i = 0;
  while (i < s.size()) {
    size_t len = 0;
    const char32_t c = utf8::decode_at(s, i, &len);
    if (pred(c)) {
      if (last < i) {
        ranges.emplace_back(last, i);
        is_match.push_back(0);
      }
      ranges.emplace_back(i, i + len);
      is_match.push_back(1);
      last = i + len;
    }
    i += len;
  }
  if (last < s.size()) {
    ranges.emplace_back(last, s.size());
    is_match.push_back(0);
  }
}

SplitBehavior behavior_of(const std::string& b, const std::string& where) {
  // Serialized as the Rust enum's variant names; older files used lowercase.
  std::string l = b;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "removed") return SplitBehavior::Removed;
  if (l == "isolated") return SplitBehavior::Isolated;
  if (l == "mergedwithprevious" || l == "merged_with_previous")
    return SplitBehavior::MergedWithPrevious;
  if (l == "mergedwithnext" || l == "merged_with_next") return SplitBehavior::MergedWithNext;
  if (l == "contiguous") return SplitBehavior::Contiguous;
  throw Error(where + ".behavior: unknown split behavior \"" + b + "\"");
}

void replace_all(std::string& s, const Pattern& p, const std::string& content) {
  std::vector<std::pair<size_t, size_t>> r;
  std::vector<char> m;
  p.find_matches(s, r, m);
  bool any = false;
  for (char x : m) any |= x != 0;
  if (!any) return;
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k < r.size(); ++k) {
    if (m[k])
      out += content;
    else
      out.append(s, r[k].first, r[k].second - r[k].first);
  }
  s = std::move(out);
}

}  // namespace

// --- Patterns and splitting -----------------------------------------------------------------

Pattern make_pattern(const json& j, const std::string& where) {
  Pattern p;
  if (!j.is_object()) throw Error(where + ": expected {\"String\": ...} or {\"Regex\": ...}");
  if (auto it = j.find("String"); it != j.end()) {
    if (!it->is_string()) throw Error(where + ".String: expected a string");
    p.literal = it->get<std::string>();
  } else if (auto it = j.find("Regex"); it != j.end()) {
    if (!it->is_string()) throw Error(where + ".Regex: expected a string");
    try {
      p.regex = std::make_unique<Regex>(it->get<std::string>());
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
  } else {
    throw Error(where + ": expected {\"String\": ...} or {\"Regex\": ...}");
  }
  return p;
}

void Pattern::find_matches(std::string_view s, std::vector<std::pair<size_t, size_t>>& ranges,
                           std::vector<char>& is_match) const {
  ranges.clear();
  is_match.clear();
  if (s.empty()) {
    ranges.emplace_back(0, 0);
    is_match.push_back(0);
    return;
  }
  std::vector<std::pair<size_t, size_t>> found;
  if (regex) {
    regex->find_all(s, found);
  } else {
    if (literal.empty()) {  // the library matches nothing with an empty pattern
      ranges.emplace_back(0, s.size());
      is_match.push_back(0);
      return;
    }
    for (size_t pos = s.find(literal); pos != std::string_view::npos;
         pos = s.find(literal, pos + literal.size()))
      found.emplace_back(pos, pos + literal.size());
  }
  size_t prev = 0;
  for (auto [a, b] : found) {
    if (prev != a) {
      ranges.emplace_back(prev, a);
      is_match.push_back(0);
    }
    ranges.emplace_back(a, b);
    is_match.push_back(1);
    prev = b;
  }
  if (prev != s.size()) {
    ranges.emplace_back(prev, s.size());
    is_match.push_back(0);
  }
}

void split_pieces(const Piece& p, const std::vector<std::pair<size_t, size_t>>& ranges,
                  const std::vector<char>& is_match, SplitBehavior b, std::vector<Piece>& out) {
  // (range, remove) after the behavior, as NormalizedString::split computes them.
  std::vector<std::pair<size_t, size_t>> keep;
  std::vector<char> remove;
  const size_t n = ranges.size();
  switch (b) {
    case SplitBehavior::Isolated:
      keep = ranges;
      remove.assign(n, 0);
      break;
    case SplitBehavior::Removed:
      keep = ranges;
      remove.assign(is_match.begin(), is_match.end());
      break;
    case SplitBehavior::Contiguous: {
      bool prev = false;
      for (size_t k = 0; k < n; ++k) {
        const bool m = is_match[k];
        if (m == prev && !keep.empty())
          keep.back().second = ranges[k].second;
        else {
          keep.push_back(ranges[k]);
          remove.push_back(0);
        }
        prev = m;
      }
      break;
    }
    case SplitBehavior::MergedWithPrevious: {
      bool prev = false;
      for (size_t k = 0; k < n; ++k) {
        const bool m = is_match[k];
        if (m && !prev && !keep.empty())
          keep.back().second = ranges[k].second;
        else {
          keep.push_back(ranges[k]);
          remove.push_back(0);
        }
        prev = m;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool prev = false;
      for (size_t k = n; k-- > 0;) {
        const bool m = is_match[k];
        if (m && !prev && !keep.empty())
          keep.back().first = ranges[k].first;
        else {
          keep.push_back(ranges[k]);
          remove.push_back(0);
        }
        prev = m;
      }
      std::reverse(keep.begin(), keep.end());
      std::reverse(remove.begin(), remove.end());
      break;
    }
  }
  for (size_t k = 0; k < keep.size(); ++k) {
    if (remove[k] || keep[k].first == keep[k].second) continue;
    out.push_back({p.text.substr(keep[k].first, keep[k].second - keep[k].first),
                   p.at_start && keep[k].first == 0});
  }
}

// --- Byte level ------------------------------------------------------------------------------

const ByteMap& ByteMap::get() {
  static const ByteMap m = [] {
    ByteMap bm;
    bm.to_byte.fill(-1);
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b) direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = direct[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      bm.to_char[b] = c;
      utf8::append(bm.to_utf8[b], c);
      bm.to_byte[c] = static_cast<int16_t>(b);
    }
    return bm;
  }();
  return m;
}

void byte_level_map(std::string& s) {
  const ByteMap& bm = ByteMap::get();
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) out += bm.to_utf8[c];
  s = std::move(out);
}

namespace {

// The regex ByteLevel splits with when use_regex is set (GPT-2's).
const Regex& gpt2_regex() {
  static const Regex re(
      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
  return re;
}

// ===== Normalizers =====

struct NormSequence : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> items;
  void apply(std::string& s) const override {
    for (const auto& n : items) n->apply(s);
  }
};

struct NormPrepend : Normalizer {
  std::string prepend;
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend);
  }
};

struct NormReplace : Normalizer {
  Pattern pattern;
  std::string content;
  void apply(std::string& s) const override { replace_all(s, pattern, content); }
};

// Unicode normalization forms and lowercasing through utf8proc (Debian's libutf8proc):
// writing the decomposition and composition tables by hand is not worth it. Input is
// valid UTF-8 here (encode() replaces invalid bytes first).
struct NormUnicode : Normalizer {
  int options = 0;  // UTF8PROC_* flags
  bool lowercase = false;
  void apply(std::string& s) const override {
    if (lowercase) {
      std::string out;
      out.reserve(s.size());
      for (size_t i = 0; i < s.size();) {
        size_t len = 0;
        const char32_t c = utf8::decode_at(s, i, &len);
        utf8proc_uint8_t buf[4];
        const utf8proc_ssize_t n = utf8proc_encode_char(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)), buf);
        out.append(reinterpret_cast<const char*>(buf), n);
        i += len;
      }
      s = std::move(out);
      return;
    }
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                            static_cast<utf8proc_ssize_t>(s.size()), &out,
                                            static_cast<utf8proc_option_t>(options));
    if (n < 0) {  // cannot happen on valid UTF-8; keep the text as it is
      std::free(out);
      return;
    }
    s.assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
  }
};

struct NormStrip : Normalizer {
  bool left = true, right = true;
  void apply(std::string& s) const override {
    size_t a = 0, b = s.size();
    if (left) {
      while (a < b) {
        size_t len = 0;
        const char32_t c = utf8::decode_at(s, a, &len);
        if (!is_white_space(c)) break;
        a += len;
      }
    }
    if (right) {
      while (b > a) {
        size_t k = b - 1;
        while (k > a && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t len = 0;
        const char32_t c = utf8::decode_at(s, k, &len);
        if (!is_white_space(c)) break;
        b = k;
      }
    }
    s = s.substr(a, b - a);
  }
};

struct NormByteLevel : Normalizer {
  void apply(std::string& s) const override { byte_level_map(s); }
};

// ===== Pre-tokenizers =====

struct PreSequence : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> items;
  void apply(std::vector<Piece>& pieces) const override {
    for (const auto& p : items) p->apply(pieces);
  }
};

struct PreByteLevel : PreTokenizer {
  bool add_prefix_space = false, use_regex = true;
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 2);
    std::vector<std::pair<size_t, size_t>> found;
    for (auto& p : pieces) {
      if (add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
      if (!use_regex) {
        out.push_back(std::move(p));
        continue;
      }
      // Isolated: every match and every gap is a piece of its own.
      found.clear();
      gpt2_regex().find_all(p.text, found);
      size_t prev = 0;
      for (auto [a, b] : found) {
        if (prev < a) out.push_back({p.text.substr(prev, a - prev), p.at_start && prev == 0});
        if (a < b) out.push_back({p.text.substr(a, b - a), p.at_start && a == 0});
        prev = b;
      }
      if (prev < p.text.size()) out.push_back({p.text.substr(prev), p.at_start && prev == 0});
    }
    for (auto& p : out) byte_level_map(p.text);
    pieces = std::move(out);
  }
};

struct PreSplit : PreTokenizer {
  Pattern pattern;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 2);
    std::vector<std::pair<size_t, size_t>> r;
    std::vector<char> m;
    for (const auto& p : pieces) {
      pattern.find_matches(p.text, r, m);
      if (invert)
        for (auto& x : m) x = !x;
      split_pieces(p, r, m, behavior, out);
    }
    pieces = std::move(out);
  }
};

// A pre-tokenizer that splits on a character predicate with a fixed behavior.
template <class Pred>
struct PreCharSplit : PreTokenizer {
  Pred pred;
  SplitBehavior behavior;
  PreCharSplit(Pred p, SplitBehavior b) : pred(p), behavior(b) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 2);
    std::vector<std::pair<size_t, size_t>> r;
    std::vector<char> m;
    for (const auto& p : pieces) {
      char_matches(p.text, pred, r, m);
      split_pieces(p, r, m, behavior, out);
    }
    pieces = std::move(out);
  }
};
template <class Pred>
std::unique_ptr<PreTokenizer> char_split(Pred p, SplitBehavior b) {
  return std::make_unique<PreCharSplit<Pred>>(p, b);
}

enum class Prepend { Always, First, Never };

struct PreMetaspace : PreTokenizer {
  std::string rep;  // the replacement character, UTF-8
  char32_t rep_cp = 0x2581;
  Prepend scheme = Prepend::Always;
  bool split = true;
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 2);
    std::vector<std::pair<size_t, size_t>> r;
    std::vector<char> m;
    for (auto& p : pieces) {
      std::string t;
      t.reserve(p.text.size() + 8);
      for (char c : p.text) {
        if (c == ' ')
          t += rep;
        else
          t += c;
      }
      const bool starts = t.compare(0, rep.size(), rep) == 0;
      if (!starts && (scheme == Prepend::Always || (scheme == Prepend::First && p.at_start)))
        t.insert(0, rep);
      Piece q{std::move(t), p.at_start};
      if (!split) {
        out.push_back(std::move(q));
        continue;
      }
      const char32_t rc = rep_cp;
      char_matches(
          q.text, [rc](char32_t c) { return c == rc; }, r, m);
      split_pieces(q, r, m, SplitBehavior::MergedWithNext, out);
    }
    pieces = std::move(out);
  }
};

struct PreWhitespace : PreTokenizer {
  // The library's Whitespace is the regex crate's \w+|[^\w\s]+ (Unicode \w and \s), inverted
  // and removed: runs of word characters and runs of other non-space characters.
  PreWhitespace()
      : re("[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]+|"
           "[^\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}\\p{White_Space}]+") {}
  Regex re;
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    std::vector<std::pair<size_t, size_t>> found;
    for (const auto& p : pieces) {
      found.clear();
      re.find_all(p.text, found);
      for (auto [a, b] : found)
        if (a < b) out.push_back({p.text.substr(a, b - a), p.at_start && a == 0});
    }
    pieces = std::move(out);
  }
};

// ===== Decoders =====

struct DecSequence : Decoder {
  std::vector<std::unique_ptr<Decoder>> items;
  void apply(std::vector<std::string>& t) const override {
    for (const auto& d : items) d->apply(t);
  }
};

struct DecByteLevel : Decoder {
  void apply(std::vector<std::string>& tokens) const override {
    const ByteMap& bm = ByteMap::get();
    std::string bytes;
    for (const auto& t : tokens) {
      // A token whose characters are not all in the byte map goes through as its own bytes.
      const size_t mark = bytes.size();
      bool ok = true;
      size_t i = 0;
      while (i < t.size()) {
        const size_t len = utf8::valid_seq_len(t, i);
        size_t l2 = 0;
        const char32_t c = len ? utf8::decode_at(t, i, &l2) : 0xFFFFFFFF;
        if (!len || c >= bm.to_byte.size() || bm.to_byte[c] < 0) {
          ok = false;
          break;
        }
        bytes += static_cast<char>(bm.to_byte[c]);
        i += len;
      }
      if (!ok) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, utf8::to_valid_lossy(bytes));
  }
};

struct DecByteFallback : Decoder {
  static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // "<0xNN>" -> the byte (Rust's u8::from_str_radix(&t[3..5], 16), which also takes "+N").
  static int byte_of(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    if (t[3] == '+') return hexval(t[4]);
    const int hi = hexval(t[3]), lo = hexval(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (utf8::is_valid(pending))
        out.push_back(pending);
      else
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      pending.clear();
    };
    for (auto& t : tokens) {
      const int b = byte_of(t);
      if (b >= 0) {
        pending += static_cast<char>(b);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

struct DecFuse : Decoder {
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

struct DecStrip : Decoder {
  char32_t content = ' ';
  size_t start = 0, stop = 0;
  void apply(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<size_t, char32_t>> cs;  // (byte offset, char)
      for (size_t i = 0; i < t.size();) {
        size_t len = utf8::valid_seq_len(t, i);
        size_t l2 = 1;
        const char32_t c = len ? utf8::decode_at(t, i, &l2) : 0xFFFD;
        cs.emplace_back(i, c);
        i += len ? len : 1;
      }
      size_t a = 0;
      for (size_t k = 0; k < start && k < cs.size(); ++k) {
        if (cs[k].second != content) break;
        a = k + 1;
      }
      size_t b = cs.size();
      for (size_t k = 0; k < stop && k < cs.size(); ++k) {
        const size_t idx = cs.size() - k - 1;
        if (cs[idx].second != content) break;
        b = idx;
      }
      if (b < a) b = a;
      const size_t from = a < cs.size() ? cs[a].first : t.size();
      const size_t to = b < cs.size() ? cs[b].first : t.size();
      t = t.substr(from, to - from);
    }
  }
};

struct DecReplace : Decoder {
  Pattern pattern;
  std::string content;
  void apply(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) replace_all(t, pattern, content);
  }
};

struct DecMetaspace : Decoder {
  std::string rep;
  Prepend scheme = Prepend::Always;
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string& t = tokens[i];
      if (t.find(rep) == std::string::npos) continue;
      std::string out;
      const bool drop = i == 0 && scheme != Prepend::Never;
      for (size_t k = 0; k < t.size();) {
        if (t.compare(k, rep.size(), rep) == 0) {
          if (!drop) out += ' ';
          k += rep.size();
        } else {
          out += t[k++];
        }
      }
      tokens[i] = std::move(out);
    }
  }
};

struct DecBpeSuffix : Decoder {
  std::string suffix;
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string with = i + 1 == tokens.size() ? "" : " ";
      std::string& t = tokens[i];
      std::string out;
      for (size_t k = 0; k < t.size();) {
        if (!suffix.empty() && t.compare(k, suffix.size(), suffix) == 0) {
          out += with;
          k += suffix.size();
        } else {
          out += t[k++];
        }
      }
      t = std::move(out);
    }
  }
};

Prepend prepend_scheme(const json& j, const std::string& where) {
  if (auto it = j.find("prepend_scheme"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) throw Error(where + ".prepend_scheme: expected a string");
    const std::string s = it->get<std::string>();
    if (s == "always") return Prepend::Always;
    if (s == "first") return Prepend::First;
    if (s == "never") return Prepend::Never;
    throw Error(where + ".prepend_scheme: unknown value \"" + s + "\"");
  }
  // Files from before prepend_scheme: add_prefix_space true/false.
  return get_bool_or(j, "add_prefix_space", where, true) ? Prepend::Always : Prepend::Never;
}

std::string replacement_of(const json& j, const std::string& where) {
  std::string rep = get_string_or(j, "replacement", where, "\xE2\x96\x81");
  single_char(rep, where + ".replacement");
  return rep;
}

const json& array_field(const json& j, const char* key, const std::string& where) {
  const json& a = field(j, key, where);
  if (!a.is_array()) throw Error(where + "." + key + ": expected an array");
  return a;
}

}  // namespace

// --- Builders ---------------------------------------------------------------------------------

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    auto n = std::make_unique<NormSequence>();
    const json& a = array_field(j, "normalizers", where);
    for (size_t i = 0; i < a.size(); ++i) {
      auto c = make_normalizer(a[i], where + ".normalizers[" + std::to_string(i) + "]");
      if (c) n->items.push_back(std::move(c));
    }
    return n;
  }
  if (type == "Prepend") {
    auto n = std::make_unique<NormPrepend>();
    n->prepend = get_string(j, "prepend", where);
    return n;
  }
  if (type == "Replace") {
    auto n = std::make_unique<NormReplace>();
    n->pattern = make_pattern(field(j, "pattern", where), where + ".pattern");
    n->content = get_string(j, "content", where);
    return n;
  }
  if (type == "Strip") {
    auto n = std::make_unique<NormStrip>();
    n->left = get_bool_or(j, "strip_left", where, true);
    n->right = get_bool_or(j, "strip_right", where, true);
    return n;
  }
  if (type == "ByteLevel") return std::make_unique<NormByteLevel>();
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD" || type == "Lowercase") {
    auto n = std::make_unique<NormUnicode>();
    n->lowercase = type == "Lowercase";
    n->options = UTF8PROC_STABLE | (type[2] == 'K' ? UTF8PROC_COMPAT : 0) |
                 (type.back() == 'C' ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE);
    return n;
  }
  // BertNormalizer/Precompiled (SentencePiece's charsmap) are not implemented; refusing
  // beats tokenizing differently from the model's own tokenizer.
  throw Error(where + ": normalizer " + type + " is not supported");
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    auto p = std::make_unique<PreSequence>();
    const json& a = array_field(j, "pretokenizers", where);
    for (size_t i = 0; i < a.size(); ++i) {
      auto c = make_pre_tokenizer(a[i], where + ".pretokenizers[" + std::to_string(i) + "]");
      if (c) p->items.push_back(std::move(c));
    }
    return p;
  }
  if (type == "ByteLevel") {
    auto p = std::make_unique<PreByteLevel>();
    p->add_prefix_space = get_bool_or(j, "add_prefix_space", where, true);
    p->use_regex = get_bool_or(j, "use_regex", where, true);
    gpt2_regex();
    return p;
  }
  if (type == "Split") {
    auto p = std::make_unique<PreSplit>();
    p->pattern = make_pattern(field(j, "pattern", where), where + ".pattern");
    p->behavior = behavior_of(get_string(j, "behavior", where), where);
    p->invert = get_bool_or(j, "invert", where, false);
    return p;
  }
  if (type == "Digits") {
    const bool individual = get_bool_or(j, "individual_digits", where, false);
    return char_split([](char32_t c) { return is_rust_numeric(c); },
                      individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous);
  }
  if (type == "Metaspace") {
    auto p = std::make_unique<PreMetaspace>();
    p->rep = replacement_of(j, where);
    p->rep_cp = single_char(p->rep, where);
    p->scheme = prepend_scheme(j, where);
    p->split = get_bool_or(j, "split", where, true);
    return p;
  }
  if (type == "WhitespaceSplit")
    return char_split([](char32_t c) { return is_white_space(c); }, SplitBehavior::Removed);
  if (type == "Whitespace") return std::make_unique<PreWhitespace>();
  if (type == "CharDelimiterSplit") {
    const char32_t d = single_char(get_string(j, "delimiter", where), where + ".delimiter");
    return char_split([d](char32_t c) { return c == d; }, SplitBehavior::Removed);
  }
  throw Error(where + ": pre-tokenizer " + type + " is not supported");
}

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  const std::string type = type_of(j, where);
  if (type == "Sequence") {
    auto d = std::make_unique<DecSequence>();
    const json& a = array_field(j, "decoders", where);
    for (size_t i = 0; i < a.size(); ++i) {
      auto c = make_decoder(a[i], where + ".decoders[" + std::to_string(i) + "]");
      if (c) d->items.push_back(std::move(c));
    }
    return d;
  }
  if (type == "ByteLevel") return std::make_unique<DecByteLevel>();
  if (type == "ByteFallback") return std::make_unique<DecByteFallback>();
  if (type == "Fuse") return std::make_unique<DecFuse>();
  if (type == "Strip") {
    auto d = std::make_unique<DecStrip>();
    d->content = single_char(get_string(j, "content", where), where + ".content");
    const int64_t a = get_int_or(j, "start", where, 0), b = get_int_or(j, "stop", where, 0);
    if (a < 0 || b < 0) throw Error(where + ": start and stop must not be negative");
    d->start = static_cast<size_t>(a);
    d->stop = static_cast<size_t>(b);
    return d;
  }
  if (type == "Replace") {
    auto d = std::make_unique<DecReplace>();
    d->pattern = make_pattern(field(j, "pattern", where), where + ".pattern");
    d->content = get_string(j, "content", where);
    return d;
  }
  if (type == "Metaspace") {
    auto d = std::make_unique<DecMetaspace>();
    d->rep = replacement_of(j, where);
    d->scheme = prepend_scheme(j, where);
    return d;
  }
  if (type == "BPEDecoder") {
    auto d = std::make_unique<DecBpeSuffix>();
    d->suffix = get_string_or(j, "suffix", where, "</w>");
    return d;
  }
  throw Error(where + ": decoder " + type + " is not supported");
}

}  // namespace dory::tok
