// Jinja lexer and parser. Mirrors jinja2's lexer.py and parser.py closely
// (operator precedence, where filters bind, whitespace control), because chat
// templates lean on those details and the rendering must match jinja2's.
#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "dory/error.h"
#include "text/jinja_ast.h"
#include "text/jinja_util.h"

namespace dory::jinja {

namespace {

[[noreturn]] void fail_at(int line, const std::string& msg) {
  throw Error("chat template line " + std::to_string(line) + ": " + one_line(msg));
}

// ---------------------------------------------------------------- lexer

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;  // Data, Name, String (decoded), Op
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

const char* tok_name(const Token& t) {
  switch (t.type) {
    case Tok::Data:
      return "template data";
    case Tok::VarBegin:
      return "'{{'";
    case Tok::VarEnd:
      return "end of print statement";
    case Tok::BlockBegin:
      return "'{%'";
    case Tok::BlockEnd:
      return "end of statement block";
    case Tok::Eof:
      return "end of template";
    default:
      return nullptr;
  }
}

std::string describe(const Token& t) {
  if (const char* n = tok_name(t)) return n;
  if (t.type == Tok::String) return "string";
  if (t.type == Tok::Int || t.type == Tok::Float) return "number";
  return "'" + t.text + "'";
}

bool is_name_start(unsigned char c) {
  return std::isalpha(c) || c == '_' || c >= 0x80;
}
bool is_name_char(unsigned char c) {
  return std::isalnum(c) || c == '_' || c >= 0x80;
}

// jinja2 splits the source on \r\n, \r and \n, joins the lines with "\n" and
// drops one trailing line break (keep_trailing_newline=False).
std::string normalize_newlines(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize_newlines(source)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    const size_t n = src_.size();
    while (pos_ < n) {
      // The earliest tag start.
      size_t start = std::string::npos;
      for (size_t p = src_.find('{', pos_); p != std::string::npos && p + 1 < n;
           p = src_.find('{', p + 1)) {
        const char c = src_[p + 1];
        if (c == '{' || c == '%' || c == '#') {
          start = p;
          break;
        }
      }
      if (start == std::string::npos) {
        push_data(src_.substr(pos_));
        break;
      }
      const char kind = src_[start + 1];
      size_t after = start + 2;
      char sign = 0;
      if (after < n && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      std::string text = src_.substr(pos_, start - pos_);
      const int text_newlines = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
      // A raw block: {% raw %} ... {% endraw %}.
      size_t raw_end = 0;
      const bool raw = kind == '%' && match_raw_begin(after, raw_end);
      strip_before(text, sign, kind, line_starting);
      push_data(text);
      line_ += text_newlines;
      if (raw) {
        lex_raw(raw_end, line_starting);
        continue;
      }
      if (kind == '#') {
        lex_comment(after, line_starting);
        continue;
      }
      const int tag_line = line_;
      tokens_.push_back({kind == '{' ? Tok::VarBegin : Tok::BlockBegin, "", 0, 0, tag_line});
      pos_ = after;
      lex_tag(kind, line_starting);
    }
    tokens_.push_back({Tok::Eof, "", 0, 0, line_});
    return std::move(tokens_);
  }

 private:
  void push_data(const std::string& text) {
    if (!text.empty()) tokens_.push_back({Tok::Data, text, 0, 0, line_});
  }

  // jinja2: "-" strips all whitespace before the tag; otherwise lstrip_blocks
  // strips spaces and tabs back to the line start for {% and {# tags.
  void strip_before(std::string& text, char sign, char kind, bool line_starting) {
    if (sign == '-') {
      text = py_rstrip(text);
    } else if (sign != '+' && kind != '{') {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
          py_rstrip(text.substr(l_pos)).empty())
        text.resize(l_pos);
    }
  }

  bool match_raw_begin(size_t p, size_t& end) {
    const size_t n = src_.size();
    while (p < n && py_isspace_ascii(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < n && is_name_char(src_[p])) return false;
    while (p < n && py_isspace_ascii(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < n && py_isspace_ascii(src_[p])) ++p;
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;  // jinja2 applies no trim_blocks after {% raw %}
    } else {
      return false;
    }
    end = p;
    return true;
  }

  void lex_raw(size_t body_start, bool& line_starting) {
    const int open_line = line_;
    line_ += count_nl(pos_, body_start);
    const size_t n = src_.size();
    for (size_t p = src_.find("{%", body_start); p != std::string::npos;
         p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = 0;
      if (q < n && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < n && py_isspace_ascii(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < n && py_isspace_ascii(src_[q])) ++q;
      size_t end;
      if (src_.compare(q, 3, "+%}") == 0) {
        end = q + 3;
      } else if (src_.compare(q, 3, "-%}") == 0) {
        end = q + 3;
        while (end < n && py_isspace_ascii(src_[end])) ++end;
      } else if (src_.compare(q, 2, "%}") == 0) {
        end = q + 2;
        if (end < n && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      std::string text = src_.substr(body_start, p - body_start);
      const int nl = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
      strip_before(text, sign, '%', false);
      push_data(text);
      line_ += nl + count_nl(p, end);
      line_starting = src_[end - 1] == '\n';
      pos_ = end;
      return;
    }
    fail_at(open_line, "'raw' block is never closed (expected 'endraw')");
  }

  void lex_comment(size_t p, bool& line_starting) {
    const size_t n = src_.size();
    const size_t q = src_.find("#}", p);
    if (q == std::string::npos) fail_at(line_, "comment is never closed (expected '#}')");
    size_t end = q + 2;
    if (q > p && src_[q - 1] == '-') {
      while (end < n && py_isspace_ascii(src_[end])) ++end;
    } else if (!(q > p && src_[q - 1] == '+')) {
      if (end < n && src_[end] == '\n') ++end;  // trim_blocks
    }
    line_ += count_nl(pos_, end);
    line_starting = src_[end - 1] == '\n';
    pos_ = end;
  }

  int count_nl(size_t a, size_t b) const {
    return static_cast<int>(std::count(src_.begin() + a, src_.begin() + b, '\n'));
  }

  void lex_tag(char kind, bool& line_starting) {
    const size_t n = src_.size();
    const int open_line = line_;
    std::vector<char> balance;
    while (true) {
      while (pos_ < n && py_isspace_ascii(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= n)
        fail_at(open_line, kind == '{' ? "'{{' is never closed (expected '}}')"
                                       : "'{%' is never closed (expected '%}')");
      // The end of the tag, only where brackets balance (as jinja2).
      if (balance.empty()) {
        size_t end = 0;
        if (kind == '{') {
          if (src_.compare(pos_, 3, "-}}") == 0) {
            end = pos_ + 3;
            while (end < n && py_isspace_ascii(src_[end])) ++end;
          } else if (src_.compare(pos_, 2, "}}") == 0) {
            end = pos_ + 2;
          }
        } else {
          if (src_.compare(pos_, 3, "+%}") == 0) {
            end = pos_ + 3;
          } else if (src_.compare(pos_, 3, "-%}") == 0) {
            end = pos_ + 3;
            while (end < n && py_isspace_ascii(src_[end])) ++end;
          } else if (src_.compare(pos_, 2, "%}") == 0) {
            end = pos_ + 2;
            if (end < n && src_[end] == '\n') ++end;  // trim_blocks
          }
        }
        if (end) {
          tokens_.push_back({kind == '{' ? Tok::VarEnd : Tok::BlockEnd, "", 0, 0, line_});
          line_ += count_nl(pos_, end);
          line_starting = src_[end - 1] == '\n';
          pos_ = end;
          return;
        }
      }
      const unsigned char c = src_[pos_];
      if (is_name_start(c)) {
        size_t e = pos_;
        while (e < n && is_name_char(src_[e])) ++e;
        tokens_.push_back({Tok::Name, src_.substr(pos_, e - pos_), 0, 0, line_});
        pos_ = e;
      } else if (std::isdigit(c)) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string();
      } else {
        static const char* ops2[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (const char* o : ops2)
          if (src_.compare(pos_, 2, o) == 0) op = o;
        if (op.empty()) {
          if (!std::strchr("+-/*%~[](){}><=.:|,;", c) || c == 0)
            fail_at(line_,
                    std::string("unexpected character '") + src_.substr(pos_, utf8_len(c)) + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") {
          balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (balance.empty()) fail_at(line_, "unexpected '" + op + "'");
          if (balance.back() != op[0])
            fail_at(line_,
                    "unexpected '" + op + "', expected '" + std::string(1, balance.back()) + "'");
          balance.pop_back();
        }
        tokens_.push_back({Tok::Op, op, 0, 0, line_});
        pos_ += op.size();
      }
    }
  }

  static size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4; }

  void lex_number() {
    const size_t n = src_.size();
    size_t e = pos_;
    auto digits = [&](auto pred) {
      while (e < n && (pred((unsigned char)src_[e]) ||
                       (src_[e] == '_' && e + 1 < n && pred((unsigned char)src_[e + 1]))))
        ++e;
    };
    auto isdig = [](unsigned char ch) { return std::isdigit(ch) != 0; };
    const char c1 = pos_ + 1 < n ? (char)std::tolower((unsigned char)src_[pos_ + 1]) : 0;
    if (src_[pos_] == '0' && (c1 == 'b' || c1 == 'o' || c1 == 'x')) {
      const int base = c1 == 'b' ? 2 : c1 == 'o' ? 8 : 16;
      e = pos_ + 2;
      if (e < n && src_[e] == '_') ++e;
      const size_t ds = e;
      digits([base](unsigned char ch) {
        return base == 16 ? std::isxdigit(ch) != 0 : (ch >= '0' && ch < '0' + base);
      });
      if (e == ds) fail_at(line_, "invalid number literal");
      std::string d;
      for (size_t k = ds; k < e; ++k)
        if (src_[k] != '_') d += src_[k];
      errno = 0;
      const unsigned long long v = std::strtoull(d.c_str(), nullptr, base);
      if (errno || v > (unsigned long long)INT64_MAX) fail_at(line_, "integer literal too large");
      tokens_.push_back({Tok::Int, src_.substr(pos_, e - pos_), (int64_t)v, 0, line_});
      pos_ = e;
      return;
    }
    digits(isdig);
    bool is_float = false;
    if (e + 1 < n && src_[e] == '.' && std::isdigit((unsigned char)src_[e + 1])) {
      ++e;
      digits(isdig);
      is_float = true;
    }
    if (e < n && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t k = e + 1;
      if (k < n && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < n && std::isdigit((unsigned char)src_[k])) {
        e = k;
        digits(isdig);
        is_float = true;
      }
    }
    std::string d;
    for (size_t k = pos_; k < e; ++k)
      if (src_[k] != '_') d += src_[k];
    Token t{is_float ? Tok::Float : Tok::Int, d, 0, 0, line_};
    if (is_float) {
      t.f = std::strtod(d.c_str(), nullptr);
    } else {
      // Python forbids leading zeros in decimal literals ("007"); jinja2 too.
      if (d.size() > 1 && d[0] == '0' && d.find_first_not_of('0') != std::string::npos)
        fail_at(line_, "invalid number literal '" + d + "'");
      errno = 0;
      const unsigned long long v = std::strtoull(d.c_str(), nullptr, 10);
      if (errno || v > (unsigned long long)INT64_MAX) fail_at(line_, "integer literal too large");
      t.i = (int64_t)v;
    }
    tokens_.push_back(t);
    pos_ = e;
  }

  // A string literal, decoded like Python's "unicode-escape" (what jinja2 does).
  void lex_string() {
    const size_t n = src_.size();
    const char q = src_[pos_];
    const int start_line = line_;
    size_t p = pos_ + 1;
    std::string out;
    while (true) {
      if (p >= n) fail_at(start_line, "unterminated string literal");
      const char c = src_[p];
      if (c == q) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= n) fail_at(start_line, "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n':
          ++line_;
          break;  // a line continuation
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < len; ++k) {
            if (p + k >= n || !std::isxdigit((unsigned char)src_[p + k]))
              fail_at(line_, std::string("truncated \\") + e + " escape in string literal");
            const char h = src_[p + k];
            cp =
                cp * 16 + (std::isdigit((unsigned char)h) ? h - '0' : (std::tolower(h) - 'a' + 10));
          }
          p += len;
          if (cp > 0x10ffff) fail_at(line_, "illegal Unicode character in string literal");
          append_utf8(out, cp);
          break;
        }
        case 'N':
          fail_at(line_, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = e - '0';
            for (int k = 0; k < 2 && p < n && src_[p] >= '0' && src_[p] <= '7'; ++k)
              cp = cp * 8 + (src_[p++] - '0');
            append_utf8(out, cp);
          } else {
            out += '\\';  // unknown escapes stay as written
            --p;
          }
      }
    }
    tokens_.push_back({Tok::String, out, 0, 0, start_line});
    pos_ = p + 1;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

// ---------------------------------------------------------------- parser

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  std::shared_ptr<Template> run() {
    auto tpl = std::make_shared<Template>();
    tpl->body = subparse({}, "", 0);
    return tpl;
  }

 private:
  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == Tok::Name && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++p_;
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    ++p_;
    return true;
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    fail_at(cur().line, "expected " + expected + ", got " + describe(cur()));
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) unexpected(std::string("'") + op + "'");
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) unexpected("a name");
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) unexpected("end of statement block");
    ++p_;
  }

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& pp) : p(pp) {
      if (++p.depth_ > kMaxDepth) fail_at(p.cur().line, "template nests too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };
  // A left-deep chain (a + b + c, x.y.z, x|f|g) deepens the tree one level per
  // link; the links count against the same depth until the chain's parse ends.
  struct ChainGuard {
    Parser& p;
    int saved;
    explicit ChainGuard(Parser& pp) : p(pp), saved(pp.depth_) {}
    void link() {
      if (++p.depth_ > kMaxDepth) fail_at(p.cur().line, "template nests too deeply");
    }
    ~ChainGuard() { p.depth_ = saved; }
  };
  // Bounds the parse tree's depth, hence the stack the parser, the interpreter
  // and the tree's destructor use on any template.
  static constexpr int kMaxDepth = 400;

  // Statements up to one of `ends` (left unconsumed, just after its '{%').
  static std::string closer(const std::vector<std::string>& ends) {
    for (const auto& e : ends)
      if (e.rfind("end", 0) == 0) return e;
    return ends.back();
  }

  Body subparse(const std::vector<std::string>& ends, const std::string& opener, int open_line) {
    DepthGuard g(*this);
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::Eof) {
        if (!ends.empty())
          fail_at(open_line,
                  "'" + opener + "' block is never closed (expected '" + closer(ends) + "')");
        return body;
      }
      if (tk.type == Tok::Data) {
        auto s = std::make_unique<Stmt>(Stmt::Kind::Text, tk.line);
        s->text = tk.text;
        body.push_back(std::move(s));
        ++p_;
      } else if (tk.type == Tok::VarBegin) {
        ++p_;
        auto s = std::make_unique<Stmt>(Stmt::Kind::Print, tk.line);
        s->expr = parse_tuple(true, {}, false);
        if (cur().type != Tok::VarEnd) unexpected("end of print statement");
        ++p_;
        body.push_back(std::move(s));
      } else if (tk.type == Tok::BlockBegin) {
        ++p_;
        if (cur().type != Tok::Name) unexpected("a statement name");
        const std::string& name = cur().text;
        if (std::find(ends.begin(), ends.end(), name) != ends.end()) return body;
        if (name == "elif" || name == "else" || name.rfind("end", 0) == 0) {
          if (ends.empty()) fail_at(cur().line, "unexpected '" + name + "': no block is open");
          fail_at(cur().line, "unexpected '" + name + "': the innermost open block is '" + opener +
                                  "' (line " + std::to_string(open_line) + "), which expects '" +
                                  closer(ends) + "'");
        }
        body.push_back(parse_statement());
      } else {
        unexpected("template data");
      }
    }
  }

  // After a subparse: consume the end tag `name` and its '%}'.
  void end_tag(const char* name) {
    if (!skip_name(name)) unexpected(std::string("'") + name + "'");
    expect_block_end();
  }

  StmtPtr parse_statement() {
    const Token& tk = cur();
    const int line = tk.line;
    const std::string name = tk.text;
    ++p_;
    if (name == "for") return parse_for(line);
    if (name == "if") return parse_if(line);
    if (name == "set") return parse_set(line);
    if (name == "macro") return parse_macro(line);
    if (name == "call") return parse_call_block(line);
    if (name == "filter") return parse_filter_block(line);
    if (name == "with") return parse_with(line);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail_at(line, "'" + name + "' outside of a loop");
      expect_block_end();
      return std::make_unique<Stmt>(name == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue,
                                    line);
    }
    if (name == "generation") {  // transformers' assistant-mask extension: renders its body
      expect_block_end();
      auto s = std::make_unique<Stmt>(Stmt::Kind::Scope, line);
      s->body = subparse({"endgeneration"}, name, line);
      end_tag("endgeneration");
      return s;
    }
    if (name == "block") {  // in a standalone template a block renders in place
      expect_name();
      while (skip_name("scoped") || skip_name("required")) {
      }
      expect_block_end();
      auto s = std::make_unique<Stmt>(Stmt::Kind::Scope, line);
      s->body = subparse({"endblock"}, name, line);
      skip_name("endblock");
      if (cur().type == Tok::Name) ++p_;
      expect_block_end();
      return s;
    }
    if (name == "extends" || name == "include" || name == "import" || name == "from")
      fail_at(line,
              "'" + name + "' is not supported in a chat template (no other templates to load)");
    fail_at(line, "unknown tag '" + name + "'");
  }

  Target parse_target(bool with_namespace) {
    Target t;
    if (with_namespace && cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
      t.names.push_back(next().text);
      ++p_;
      t.ns_attr = expect_name();
      return t;
    }
    const bool paren = skip_op("(");
    while (true) {
      t.names.push_back(expect_name());
      if (!skip_op(",")) break;
      t.tuple = true;
      if (cur().type != Tok::Name) break;  // a trailing comma
    }
    if (paren) {
      t.tuple = true;
      expect_op(")");
    }
    for (const auto& n : t.names)
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
        fail_at(cur().line, "cannot assign to '" + n + "'");
    return t;
  }

  StmtPtr parse_for(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::For, line);
    s->target = parse_target(false);
    if (!skip_name("in")) unexpected("'in'");
    s->expr = parse_tuple(false, {"recursive"}, false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name("recursive")) fail_at(cur().line, "recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    s->body = subparse({"endfor", "else"}, "for", line);
    --loop_depth_;
    if (skip_name("else")) {
      expect_block_end();
      s->else_body = subparse({"endfor"}, "for", line);
    }
    end_tag("endfor");
    return s;
  }

  StmtPtr parse_if(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::If, line);
    while (true) {
      ExprPtr cond = parse_tuple(false, {}, false);
      expect_block_end();
      Body b = subparse({"elif", "else", "endif"}, "if", line);
      s->branches.emplace_back(std::move(cond), std::move(b));
      if (skip_name("elif")) continue;
      if (skip_name("else")) {
        expect_block_end();
        s->else_body = subparse({"endif"}, "if", line);
      }
      end_tag("endif");
      return s;
    }
  }

  StmtPtr parse_set(int line) {
    Target target = parse_target(true);
    if (skip_op("=")) {
      auto s = std::make_unique<Stmt>(Stmt::Kind::Set, line);
      s->target = std::move(target);
      s->expr = parse_tuple(true, {}, false);
      expect_block_end();
      return s;
    }
    auto s = std::make_unique<Stmt>(Stmt::Kind::SetBlock, line);
    if (target.tuple || !target.ns_attr.empty())
      fail_at(line, "a block set assigns one plain name");
    s->target = std::move(target);
    if (is_op("|")) s->filter = parse_filter(nullptr, false);
    expect_block_end();
    s->body = subparse({"endset"}, "set", line);
    end_tag("endset");
    return s;
  }

  void parse_signature(MacroDef& m) {
    expect_op("(");
    while (!is_op(")")) {
      if (!m.params.empty()) expect_op(",");
      if (is_op(")")) break;  // trailing comma
      m.params.push_back(expect_name());
      if (skip_op("=")) {
        m.defaults.push_back(parse_expression(true));
      } else if (!m.defaults.empty()) {
        fail_at(cur().line, "non-default argument follows default argument");
      }
    }
    ++p_;
  }

  static void collect_names(const Expr* e, std::set<std::string>& out) {
    if (!e) return;
    if (e->kind == Expr::Kind::Name) out.insert(e->name);
    for (const auto& a : e->args) collect_names(a.get(), out);
    for (const auto& kv : e->kwargs) collect_names(kv.second.get(), out);
  }
  static void collect_names(const Body& body, std::set<std::string>& out) {
    for (const auto& s : body) {
      collect_names(s->expr.get(), out);
      collect_names(s->cond.get(), out);
      collect_names(s->filter.get(), out);
      for (const auto& br : s->branches) {
        collect_names(br.first.get(), out);
        collect_names(br.second, out);
      }
      collect_names(s->body, out);
      collect_names(s->else_body, out);
      for (const auto& kv : s->with_vars) collect_names(kv.second.get(), out);
      if (s->macro) {
        for (const auto& d : s->macro->defaults) collect_names(d.get(), out);
        collect_names(s->macro->body, out);
      }
    }
  }
  static void finish_macro(MacroDef& m) {
    std::set<std::string> names;
    collect_names(m.body, names);
    for (const auto& d : m.defaults) collect_names(d.get(), names);
    m.uses_caller = names.count("caller") > 0;
    m.uses_varargs = names.count("varargs") > 0;
    m.uses_kwargs = names.count("kwargs") > 0;
  }

  StmtPtr parse_macro(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::Macro, line);
    s->macro = std::make_shared<MacroDef>();
    s->macro->name = expect_name();
    parse_signature(*s->macro);
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->macro->body = subparse({"endmacro"}, "macro", line);
    loop_depth_ = saved;
    end_tag("endmacro");
    finish_macro(*s->macro);
    return s;
  }

  StmtPtr parse_call_block(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::CallBlock, line);
    s->macro = std::make_shared<MacroDef>();
    s->macro->name = "caller";
    if (is_op("(")) parse_signature(*s->macro);
    s->expr = parse_expression(true);
    if (s->expr->kind != Expr::Kind::Call) fail_at(line, "expected a call after 'call'");
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;  // the body is a macro: no break/continue out of it
    s->macro->body = subparse({"endcall"}, "call", line);
    loop_depth_ = saved;
    end_tag("endcall");
    finish_macro(*s->macro);
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::FilterBlock, line);
    s->filter = parse_filter(nullptr, true);
    expect_block_end();
    s->body = subparse({"endfilter"}, "filter", line);
    end_tag("endfilter");
    return s;
  }

  StmtPtr parse_with(int line) {
    auto s = std::make_unique<Stmt>(Stmt::Kind::With, line);
    while (cur().type != Tok::BlockEnd) {
      if (!s->with_vars.empty()) expect_op(",");
      std::string n = expect_name();
      expect_op("=");
      s->with_vars.emplace_back(n, parse_expression(true));
    }
    expect_block_end();
    s->body = subparse({"endwith"}, "with", line);
    end_tag("endwith");
    return s;
  }

  // ------------------------------------------------------------ expressions

  ExprPtr make(Expr::Kind k, int line) { return std::make_unique<Expr>(k, line); }

  bool is_tuple_end(const std::vector<std::string>& extra, bool explicit_parens) const {
    const Token& tk = cur();
    if (tk.type == Tok::VarEnd || tk.type == Tok::BlockEnd || tk.type == Tok::Eof) return true;
    if (explicit_parens && tk.type == Tok::Op && tk.text == ")") return true;
    if (tk.type == Tok::Name)
      for (const auto& e : extra)
        if (tk.text == e) return true;
    return false;
  }

  ExprPtr parse_tuple(bool with_condexpr, const std::vector<std::string>& extra,
                      bool explicit_parens) {
    const int line = cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra, explicit_parens)) break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) unexpected("an expression");
    }
    auto e = make(Expr::Kind::List, line);
    e->flag = true;
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(*this);
    if (!with_condexpr) return parse_or();
    ChainGuard chain(*this);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      chain.link();
      const int line = next().line;
      auto c = make(Expr::Kind::CondExpr, line);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (skip_name("else")) other = parse_expression(true);
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ChainGuard chain(*this);
    ExprPtr l = parse_and();
    while (is_name("or")) {
      chain.link();
      const int line = next().line;
      auto e = make(Expr::Kind::Or, line);
      e->args.push_back(std::move(l));
      e->args.push_back(parse_and());
      l = std::move(e);
    }
    return l;
  }

  ExprPtr parse_and() {
    ChainGuard chain(*this);
    ExprPtr l = parse_not();
    while (is_name("and")) {
      chain.link();
      const int line = next().line;
      auto e = make(Expr::Kind::And, line);
      e->args.push_back(std::move(l));
      e->args.push_back(parse_not());
      l = std::move(e);
    }
    return l;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this);
      const int line = next().line;
      auto e = make(Expr::Kind::Not, line);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = next().text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        p_ += 2;
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::Compare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto e = make(Expr::Kind::Binary, line);
    e->name = op;
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_math1() {
    ChainGuard chain(*this);
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      chain.link();
      const Token& op = next();
      l = binary(op.text, std::move(l), parse_concat(), op.line);
    }
    return l;
  }

  ExprPtr parse_concat() {
    ChainGuard chain(*this);
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      chain.link();
      const int line = next().line;
      l = binary("~", std::move(l), parse_math2(), line);
    }
    return l;
  }

  ExprPtr parse_math2() {
    ChainGuard chain(*this);
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      chain.link();
      const Token& op = next();
      l = binary(op.text, std::move(l), parse_pow(), op.line);
    }
    return l;
  }

  ExprPtr parse_pow() {
    ChainGuard chain(*this);
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      chain.link();
      const int line = next().line;
      l = binary("**", std::move(l), parse_unary(true), line);
    }
    return l;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      node = make(op.text == "-" ? Expr::Kind::Neg : Expr::Kind::Pos, op.line);
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    const int line = tk.line;
    if (tk.type == Tok::Name) {
      ++p_;
      auto e = make(Expr::Kind::Const, line);
      if (tk.text == "true" || tk.text == "True")
        e->value = Value::boolean(true);
      else if (tk.text == "false" || tk.text == "False")
        e->value = Value::boolean(false);
      else if (tk.text == "none" || tk.text == "None")
        e->value = Value::none();
      else {
        e->kind = Expr::Kind::Name;
        e->name = tk.text;
      }
      return e;
    }
    if (tk.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += next().text;  // adjacent literals join
      auto e = make(Expr::Kind::Const, line);
      e->value = Value::string(std::move(s));
      return e;
    }
    if (tk.type == Tok::Int || tk.type == Tok::Float) {
      ++p_;
      auto e = make(Expr::Kind::Const, line);
      e->value = tk.type == Tok::Int ? Value::integer(tk.i) : Value::number(tk.f);
      return e;
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(true, {}, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = make(Expr::Kind::List, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      ++p_;
      return e;
    }
    if (skip_op("{")) {
      auto e = make(Expr::Kind::Dict, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      ++p_;
      return e;
    }
    unexpected("an expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    ChainGuard chain(*this);
    while (true) {
      chain.link();
      if (is_op(".") || is_op("["))
        node = parse_subscript(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        return node;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    ChainGuard chain(*this);
    while (true) {
      chain.link();
      if (is_op("|"))
        node = parse_filter(std::move(node), false);
      else if (is_name("is"))
        node = parse_test(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        return node;
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& tk = next();
    if (tk.text == ".") {
      const Token& attr = next();
      if (attr.type == Tok::Name) {
        auto e = make(Expr::Kind::Getattr, attr.line);
        e->name = attr.text;
        e->args.push_back(std::move(node));
        return e;
      }
      if (attr.type != Tok::Int) fail_at(attr.line, "expected a name or number after '.'");
      auto e = make(Expr::Kind::Getitem, attr.line);
      auto k = make(Expr::Kind::Const, attr.line);
      k->value = Value::integer(attr.i);
      e->args.push_back(std::move(node));
      e->args.push_back(std::move(k));
      return e;
    }
    // '[' ... ']'
    std::vector<ExprPtr> keys;
    while (!is_op("]")) {
      if (!keys.empty()) {
        expect_op(",");
        if (is_op("]")) break;
      }
      keys.push_back(parse_subscribed());
    }
    ++p_;
    if (keys.size() == 1 && keys[0]->kind == Expr::Kind::Slice) {
      keys[0]->args[0] = std::move(node);
      return std::move(keys[0]);
    }
    auto e = make(Expr::Kind::Getitem, tk.line);
    e->args.push_back(std::move(node));
    if (keys.size() == 1) {
      e->args.push_back(std::move(keys[0]));
    } else {  // x[a, b] is x[(a, b)], and x[] is x[()]
      // A slice has no meaning in the tuple (its object slot would stay empty); jinja2 turns
      // x[:, 1] into Python that does not compile and reports a syntax error too.
      for (const auto& k : keys)
        if (k->kind == Expr::Kind::Slice)
          fail_at(tk.line, "invalid syntax: a slice inside a subscript tuple (x[a:b, c])");
      auto t = make(Expr::Kind::List, tk.line);
      t->flag = true;
      t->args = std::move(keys);
      e->args.push_back(std::move(t));
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    const int line = cur().line;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) return start;
    }
    ++p_;  // ':'
    auto s = make(Expr::Kind::Slice, line);
    s->args.resize(4);
    s->args[1] = std::move(start);
    if (!is_op("]") && !is_op(",") && !is_op(":")) s->args[2] = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) s->args[3] = parse_expression(true);
    }
    return s;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) {
        expect_op(",");
        if (is_op(")")) break;
      }
      first = false;
      if (is_op("*") || is_op("**"))
        fail_at(cur().line, "*args and **kwargs in calls are not supported");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string key = next().text;
        ++p_;
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail_at(cur().line, "positional argument follows keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    ++p_;
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(Expr::Kind::Call, cur().line);
    e->args.push_back(std::move(node));
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".") && peek().type == Tok::Name) {
      ++p_;
      n += "." + next().text;
    }
    return n;
  }

  // `node | f(args) | g ...`; with start_inline the first '|' is implied (filter block).
  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    ChainGuard chain(*this);
    while (is_op("|") || start_inline) {
      chain.link();
      if (!start_inline) ++p_;
      start_inline = false;
      const int line = cur().line;
      auto e = make(Expr::Kind::Filter, line);
      e->name = dotted_name();
      if (!has_filter(e->name)) fail_at(line, "no filter named '" + e->name + "'");
      e->args.push_back(std::move(node));
      if (is_op("(")) parse_call_args(*e);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const int line = next().line;  // 'is'
    auto e = make(Expr::Kind::Test, line);
    e->flag = skip_name("not");
    e->name = dotted_name();
    if (!has_test(e->name)) fail_at(line, "no test named '" + e->name + "'");
    e->args.push_back(std::move(node));
    const Token& tk = cur();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((tk.type == Tok::Name || tk.type == Tok::String || tk.type == Tok::Int ||
                tk.type == Tok::Float || is_op("[") || is_op("{")) &&
               !(tk.type == Tok::Name &&
                 (tk.text == "else" || tk.text == "or" || tk.text == "and"))) {
      if (is_name("is")) fail_at(tk.line, "tests cannot be chained with 'is'");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    return e;
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

namespace {

enum class First { Load, CondStore, Store };

void note_loads(const Expr* e, std::unordered_map<std::string, First>& seen) {
  if (!e) return;
  if (e->kind == Expr::Kind::Name) seen.emplace(e->name, First::Load);
  for (const auto& a : e->args) note_loads(a.get(), seen);
  for (const auto& kv : e->kwargs) note_loads(kv.second.get(), seen);
}

void note_store(const Target& t, bool cond, std::unordered_map<std::string, First>& seen) {
  if (!t.ns_attr.empty()) {  // set ns.attr reads ns
    seen.emplace(t.names[0], First::Load);
    return;
  }
  for (const auto& n : t.names) seen.emplace(n, cond ? First::CondStore : First::Store);
}

// The occurrences at one frame's level, in order; nested frames are not entered.
void walk_frame(const Body& body, bool cond, std::unordered_map<std::string, First>& seen) {
  for (const auto& s : body) {
    switch (s->kind) {
      case Stmt::Kind::Print:
        note_loads(s->expr.get(), seen);
        break;
      case Stmt::Kind::If:
        for (const auto& br : s->branches) {
          note_loads(br.first.get(), seen);
          walk_frame(br.second, true, seen);
        }
        walk_frame(s->else_body, true, seen);
        break;
      case Stmt::Kind::For:
        note_loads(s->expr.get(), seen);
        break;
      case Stmt::Kind::Set:
        note_loads(s->expr.get(), seen);
        note_store(s->target, cond, seen);
        break;
      case Stmt::Kind::SetBlock:
        note_loads(s->filter.get(), seen);
        note_store(s->target, cond, seen);
        break;
      case Stmt::Kind::Macro:
        seen.emplace(s->macro->name, cond ? First::CondStore : First::Store);
        break;
      case Stmt::Kind::CallBlock:
        note_loads(s->expr.get(), seen);
        break;
      case Stmt::Kind::FilterBlock:
        note_loads(s->filter.get(), seen);
        break;
      case Stmt::Kind::With:
        for (const auto& kv : s->with_vars) note_loads(kv.second.get(), seen);
        break;
      default:
        break;
    }
  }
}

using Names = std::unordered_set<std::string>;

// jinja2's Symbols.store(): a name a frame first meets as an assignment aliases
// the variable of an enclosing frame that knows the name (loads or assigns it at
// its own level); only when none does is it undefined until assigned.
std::vector<std::string> frame_locals(const Body& body, const Names& outer, Names& refs) {
  std::unordered_map<std::string, First> seen;
  walk_frame(body, false, seen);
  std::vector<std::string> out;
  for (const auto& kv : seen) {
    refs.insert(kv.first);
    if (kv.second == First::Store && !outer.count(kv.first)) out.push_back(kv.first);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void annotate(Body& body, const Names& outer);

// A nested frame: its locals, then the frames inside it, which see `outer` plus
// this frame's names (and `own`: parameters, loop targets, with names).
std::vector<std::string> nested_frame(Body& body, const Names& outer,
                                      const std::vector<std::string>& own) {
  Names refs(own.begin(), own.end());
  std::vector<std::string> locals = frame_locals(body, outer, refs);
  locals.erase(std::remove_if(locals.begin(), locals.end(),
                              [&](const std::string& n) {
                                return std::find(own.begin(), own.end(), n) != own.end();
                              }),
               locals.end());
  Names inner = outer;
  inner.insert(refs.begin(), refs.end());
  annotate(body, inner);
  return locals;
}

void annotate_stmt(Stmt& s, const Names& outer) {
  switch (s.kind) {
    case Stmt::Kind::If:  // the same frame
      for (auto& br : s.branches) annotate(br.second, outer);
      annotate(s.else_body, outer);
      break;
    case Stmt::Kind::For:
      s.predeclared = nested_frame(s.body, outer, s.target.names);
      s.else_predeclared = nested_frame(s.else_body, outer, {});
      break;
    case Stmt::Kind::Macro:
    case Stmt::Kind::CallBlock: {
      std::vector<std::string> own = s.macro->params;
      own.insert(own.end(), {"varargs", "kwargs", "caller"});
      s.macro->predeclared = nested_frame(s.macro->body, outer, own);
      break;
    }
    case Stmt::Kind::With: {
      std::vector<std::string> own;
      for (const auto& kv : s.with_vars) own.push_back(kv.first);
      s.predeclared = nested_frame(s.body, outer, own);
      break;
    }
    case Stmt::Kind::SetBlock:
    case Stmt::Kind::FilterBlock:
    case Stmt::Kind::Scope:
      s.predeclared = nested_frame(s.body, outer, {});
      break;
    default:
      break;
  }
}

// `outer`: the names that the frames enclosing `body` know.
void annotate(Body& body, const Names& outer) {
  for (auto& s : body) annotate_stmt(*s, outer);
}

}  // namespace

std::shared_ptr<const Template> parse(const std::string& source) {
  Lexer lx(source);
  Parser ps(lx.run());
  std::shared_ptr<Template> t = ps.run();
  Names refs;
  t->predeclared = frame_locals(t->body, Names{}, refs);
  annotate(t->body, refs);
  return t;
}

}  // namespace dory::jinja
