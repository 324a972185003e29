#include "text/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>
#include <cstring>

#include "dory/error.h"
#include "text/utf8.h"

namespace dory {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state: one ovector pair is all we read (the whole match), and a JIT stack
// larger than PCRE2's 32 KiB default so long whitespace or letter runs never run out of it.
struct ThreadMatch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mc = nullptr;
  pcre2_jit_stack* js = nullptr;
  ThreadMatch() {
    md = pcre2_match_data_create(1, nullptr);
    mc = pcre2_match_context_create(nullptr);
    js = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (mc && js) pcre2_jit_stack_assign(mc, nullptr, js);
  }
  ~ThreadMatch() {
    if (md) pcre2_match_data_free(md);
    if (mc) pcre2_match_context_free(mc);
    if (js) pcre2_jit_stack_free(js);
  }
};

ThreadMatch& thread_match() {
  thread_local ThreadMatch tm;
  if (!tm.md || !tm.mc) throw std::bad_alloc();
  return tm;
}

bool is_hex(char c) {
  return std::isxdigit(static_cast<unsigned char>(c)) != 0;
}

}  // namespace

std::string onig_to_pcre2(const std::string& p) {
  // Oniguruma's Unicode \w, as the goldens show it: Alphabetic, marks, decimal digits, connector
  // punctuation, and (its Latin-1 table) the superscripts and fractions; not Join_Control.
  static const char* kWord =
      "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
  std::string out;
  out.reserve(p.size() + 16);
  int depth = 0;              // character-class nesting (Oniguruma allows [a[b]])
  std::vector<bool> dropped;  // per open class: whether its brackets were dropped (flattened)
  const size_t n = p.size();
  size_t i = 0;
  auto fail = [&](const std::string& why) { throw Error("regex " + p + ": " + why); };
  while (i < n) {
    const char c = p[i];
    if (c == '\\' && i + 1 < n) {
      const char d = p[i + 1];
      const bool in = depth > 0;
      switch (d) {
        case 's':
          out += "\\p{White_Space}";
          i += 2;
          continue;
        case 'S':
          out += "\\P{White_Space}";
          i += 2;
          continue;
        case 'w':
          out += in ? std::string(kWord) : "[" + std::string(kWord) + "]";
          i += 2;
          continue;
        case 'W':
          if (!in) {
            out += "[^" + std::string(kWord) + "]";
            i += 2;
            continue;
          }
          break;
        case 'h':
          out += in ? "0-9a-fA-F" : "[0-9a-fA-F]";
          i += 2;
          continue;
        case 'H':
          if (!in) {
            out += "[^0-9a-fA-F]";
            i += 2;
            continue;
          }
          break;
        case 'u':
          if (i + 5 < n && is_hex(p[i + 2]) && is_hex(p[i + 3]) && is_hex(p[i + 4]) &&
              is_hex(p[i + 5])) {
            out += "\\x{" + p.substr(i + 2, 4) + "}";
            i += 6;
            continue;
          }
          break;
        case 'p':
        case 'P':
        case 'x':
          if (i + 2 < n && p[i + 2] == '{') {
            const size_t close = p.find('}', i + 3);
            if (close == std::string::npos) fail("unterminated \\" + std::string(1, d) + "{");
            out.append(p, i, close + 1 - i);
            i = close + 1;
            continue;
          }
          break;
        default:
          break;
      }
      out += c;
      out += d;
      i += 2;
      continue;
    }
    if (c == '[') {
      if (depth > 0 && i + 1 < n && p[i + 1] == ':') {  // POSIX bracket [:alpha:]
        const size_t close = p.find(":]", i + 2);
        if (close == std::string::npos) fail("unterminated POSIX class");
        out.append(p, i, close + 2 - i);
        i = close + 2;
        continue;
      }
      if (depth > 0) {
        // A nested class is a union in Oniguruma: flatten it into the enclosing one.
        if (i + 1 < n && p[i + 1] == '^')
          fail("negated nested character classes are not supported");
        ++depth;
        dropped.push_back(true);
        ++i;
        continue;
      }
      ++depth;
      dropped.push_back(false);
      out += '[';
      ++i;
      if (i < n && p[i] == '^') {
        out += '^';
        ++i;
      }
      if (i < n && p[i] == ']') {  // a ']' first in a class is literal
        out += "\\]";
        ++i;
      }
      continue;
    }
    if (c == ']' && depth > 0) {
      if (!dropped.back()) out += ']';
      dropped.pop_back();
      --depth;
      ++i;
      continue;
    }
    if (c == '&' && depth > 0 && i + 1 < n && p[i + 1] == '&')
      fail("character class intersection (&&) is not supported");
    out += c;
    ++i;
  }
  return out;
}

std::string regex_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != '\0' && std::strchr("\\^$.|?*+()[]{}#&-~", c) != nullptr) out += '\\';
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern) : pattern_(pattern), converted_(onig_to_pcre2(pattern)) {
  int err = 0;
  PCRE2_SIZE off = 0;
  // UTF + UCP: classes such as \p{L} and \d are Unicode-aware as in Oniguruma. MULTILINE: ^ and
  // $ are line anchors in Oniguruma's Ruby syntax, the one tokenizers uses.
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(converted_.data()), converted_.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &off, nullptr);
  if (!code)
    throw Error("regex " + pattern + ": " + pcre2_message(err) + " at offset " +
                std::to_string(off));
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

namespace {
// Returns false on no match; throws on a matcher error. Fills [s, e).
bool match_at(pcre2_code* code, bool jit, std::string_view text, size_t start, size_t* s, size_t* e,
              const std::string& pattern) {
  ThreadMatch& tm = thread_match();
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc;
  if (jit) {
    rc = pcre2_jit_match(code, subj, text.size(), start, PCRE2_NO_UTF_CHECK, tm.md, tm.mc);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)  // e.g. JIT stack limit: let the interpreter try
      rc = pcre2_match(code, subj, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, tm.md,
                       tm.mc);
  } else {
    rc = pcre2_match(code, subj, text.size(), start, PCRE2_NO_UTF_CHECK, tm.md, tm.mc);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) throw Error("regex " + pattern + ": matching failed: " + pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tm.md);
  *s = ov[0];
  *e = ov[1];
  return true;
}
}  // namespace

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    size_t s, e;
    if (!match_at(code, jit_, text, last_end, &s, &e, pattern_)) break;
    if (s == e && have_last && last_match_end == e) {
      // Oniguruma's iterator: no empty match right after the previous one; step one character.
      if (last_end >= text.size()) break;
      size_t len = utf8::valid_seq_len(text, last_end);
      last_end += len ? len : 1;
      continue;
    }
    last_end = e;
    last_match_end = e;
    have_last = true;
    out.emplace_back(s, e);
    if (s == e && e >= text.size()) break;
  }
}

bool Regex::search(std::string_view text) const {
  size_t s, e;
  return match_at(static_cast<pcre2_code*>(code_), jit_, text, 0, &s, &e, pattern_);
}

namespace {
// One code point against a Unicode class, through PCRE2's own tables (no second copy of the
// Unicode database in this program).
class CharClass {
 public:
  explicit CharClass(const char* cls) : re_(std::string("^") + cls) {}
  bool has(char32_t cp) const {
    std::string s;
    utf8::append(s, cp);
    return re_.search(s);
  }

 private:
  Regex re_;
};
}  // namespace

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_rust_word_char(char32_t cp) {
  if (cp < 0x80) return std::isalnum(static_cast<int>(cp)) || cp == '_';
  static const CharClass cls("[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]");
  return cls.has(cp);
}

bool is_rust_numeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  static const CharClass cls("\\p{N}");
  return cls.has(cp);
}

}  // namespace dory
