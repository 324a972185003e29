// Jinja's builtin filters and tests, the Python str/dict/list methods templates
// call, and the globals (range, namespace, dict, joiner, raise_exception,
// strftime_now). Each follows jinja2 3.1 / CPython; the comments note where a
// Python quirk is deliberately reproduced.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <optional>

#include "dory/error.h"
#include "text/jinja_interp.h"
#include "text/jinja_unicode.h"
#include "text/jinja_util.h"

namespace dory::jinja {

namespace {

// ------------------------------------------------------------ case mapping

// Python's full case mappings (jinja_unicode.cpp has CPython's tables).
void append_mapped(std::string& out, const unicode::Mapping* m, uint32_t c) {
  if (!m) {
    append_cp(out, c);
    return;
  }
  for (int k = 0; k < 3 && m->to[k]; ++k) append_cp(out, m->to[k]);
}

// CPython's handle_capital_sigma: a capital sigma lowercases to the final form
// after a cased letter and not before one (case-ignorable characters skipped).
bool final_sigma(const std::vector<uint32_t>& c, size_t i) {
  size_t j = i;
  uint32_t ch = 0;
  bool found = false;
  while (j > 0) {
    ch = c[--j];
    if (!unicode::is_caseignorable(ch)) {
      found = true;
      break;
    }
  }
  if (!found || !unicode::is_cased(ch)) return false;
  for (j = i + 1; j < c.size(); ++j) {
    if (!unicode::is_caseignorable(c[j])) return !unicode::is_cased(c[j]);
  }
  return true;
}

void lower_at(std::string& out, const std::vector<uint32_t>& c, size_t i) {
  if (c[i] == 0x3a3)
    append_cp(out, final_sigma(c, i) ? 0x3c2 : 0x3c3);
  else
    append_mapped(out, unicode::find_tolower(c[i]), c[i]);
}
void append_upper(std::string& out, uint32_t c) {
  append_mapped(out, unicode::find_toupper(c), c);
}
void append_titlecase(std::string& out, uint32_t c) {
  append_mapped(out, unicode::find_totitle(c), c);
}

bool is_cased(uint32_t c) {
  return unicode::is_cased(c);
}
bool is_lower_cp(uint32_t c) {
  return unicode::is_lower(c);
}
bool is_upper_cp(uint32_t c) {
  return unicode::is_upper(c);
}
bool is_title_cp(uint32_t c) {
  return unicode::is_title(c);
}

std::string str_lower(const std::string& s) {
  const std::vector<uint32_t> c = to_cps(s);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) lower_at(out, c, i);
  return out;
}
std::string str_upper(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) append_upper(out, next_cp(s, i));
  return out;
}
// Python 3.8+: the first character goes to titlecase, the rest to lowercase.
std::string str_capitalize(const std::string& s) {
  const std::vector<uint32_t> c = to_cps(s);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    if (i == 0)
      append_titlecase(out, c[0]);
    else
      lower_at(out, c, i);
  }
  return out;
}
// Python's str.title(): a character after an uncased one starts a word.
std::string str_title(const std::string& s) {
  const std::vector<uint32_t> c = to_cps(s);
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < c.size(); ++i) {
    if (prev_cased)
      lower_at(out, c, i);
    else
      append_titlecase(out, c[i]);
    prev_cased = is_cased(c[i]);
  }
  return out;
}

bool is_alnum_cp(uint32_t c) {
  return unicode::is_alpha(c) || unicode::is_decimal(c) || unicode::is_digit(c) ||
         unicode::is_numeric(c);
}
// The \w of Python's re module on str patterns.
bool is_word_cp(uint32_t c) {
  return c == '_' || is_alnum_cp(c);
}

// ------------------------------------------------------------ helpers


using Opt = std::optional<Value>;

// Binds call arguments to parameter names, Python style.
std::vector<Opt> bind_args(Interp& in, const CallArgs& a, const std::string& fname,
                           std::initializer_list<const char*> names) {
  std::vector<const char*> nm(names);
  std::vector<Opt> out(nm.size());
  if (a.pos.size() > nm.size())
    in.fail(fname + "() takes at most " + std::to_string(nm.size()) + " argument(s), got " +
            std::to_string(a.pos.size()));
  for (size_t k = 0; k < a.pos.size(); ++k) out[k] = a.pos[k];
  for (const auto& kv : a.kw) {
    size_t k = 0;
    while (k < nm.size() && kv.first != nm[k]) ++k;
    if (k == nm.size()) in.fail(fname + "() got an unexpected keyword argument '" + kv.first + "'");
    if (out[k]) in.fail(fname + "() got multiple values for argument '" + kv.first + "'");
    out[k] = kv.second;
  }
  return out;
}

bool as_int(const Value& v, int64_t& out) {
  if (v.type == Value::Type::Int)
    out = v.i;
  else if (v.type == Value::Type::Bool)
    out = v.b;
  else
    return false;
  return true;
}

int64_t need_int(Interp& in, const Value& v, const char* what) {
  int64_t i;
  if (!as_int(v, i))
    in.fail(std::string(what) + ": '" + python_type_name(v) + "' object cannot be interpreted as an integer");
  return i;
}

const std::string& need_str(Interp& in, const Value& v, const char* what) {
  if (!v.is_string()) in.fail(std::string(what) + " must be str, not " + python_type_name(v));
  return v.s;
}

Value make_fn(const std::string& name, std::function<Value(Interp&, CallArgs&)> f) {
  Value v;
  v.type = Value::Type::Callable;
  v.fn = std::make_shared<Callable>();
  v.fn->name = name;
  v.fn->call = std::move(f);
  return v;
}

Value list_of(std::vector<Value> items) {
  return Value::new_list(std::move(items));
}

int64_t py_len(Interp& in, const Value& v) {
  switch (v.type) {
    case Value::Type::Undefined:
      return 0;
    case Value::Type::String:
      return static_cast<int64_t>(cp_count(v.s));
    case Value::Type::List:
      if (v.list->lazy) in.fail("object of type 'generator' has no len()");
      return static_cast<int64_t>(v.list->items.size());
    case Value::Type::Dict:
      return static_cast<int64_t>(v.dict->items.size());
    case Value::Type::Loop:
      return static_cast<int64_t>(v.loop->items->size());
    default:
      in.fail(std::string("object of type '") + python_type_name(v) + "' has no len()");
  }
}

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0.
Value attr_path(Interp& in, const Value& item, const Value& attribute, const Value* dflt) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    size_t b = 0;
    const std::string& s = attribute.s;
    while (true) {
      const size_t e = s.find('.', b);
      std::string p = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
      if (!p.empty() &&
          std::all_of(p.begin(), p.end(), [](char c) { return std::isdigit((unsigned char)c); }))
        parts.push_back(Value::integer(std::strtoll(p.c_str(), nullptr, 10)));
      else
        parts.push_back(Value::string(p));
      if (e == std::string::npos) break;
      b = e + 1;
    }
  } else {
    parts.push_back(attribute);
  }
  Value cur = item;
  for (const auto& p : parts) {
    cur = in.getitem(cur, p);
    if (dflt && cur.is_undefined()) cur = *dflt;
  }
  return cur;
}

// The sort key jinja2 uses with case_sensitive=False.
Value ignore_case(const Value& v) {
  return v.is_string() ? Value::string(str_lower(v.s)) : v;
}

// ------------------------------------------------------------ string methods

std::vector<std::string> split_ws(const std::string& s, int64_t maxsplit) {
  const std::vector<uint32_t> c = to_cps(s);
  std::vector<std::string> out;
  size_t i = 0;
  const size_t n = c.size();
  while (true) {
    while (i < n && py_isspace(c[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && (int64_t)out.size() == maxsplit) {
      out.push_back(from_cps(c, i, n));  // the rest keeps its trailing whitespace
      break;
    }
    size_t j = i;
    while (j < n && !py_isspace(c[j])) ++j;
    out.push_back(from_cps(c, i, j));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit_ws(const std::string& s, int64_t maxsplit) {
  const std::vector<uint32_t> c = to_cps(s);
  std::vector<std::string> out;
  size_t e = c.size();
  while (true) {
    while (e > 0 && py_isspace(c[e - 1])) --e;
    if (e == 0) break;
    if (maxsplit >= 0 && (int64_t)out.size() == maxsplit) {
      out.push_back(from_cps(c, 0, e));  // the rest keeps its leading whitespace
      break;
    }
    size_t b = e;
    while (b > 0 && !py_isspace(c[b - 1])) --b;
    out.push_back(from_cps(c, b, e));
    e = b;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> split_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t b = 0;
  while (maxsplit < 0 || (int64_t)out.size() < maxsplit) {
    const size_t e = s.find(sep, b);
    if (e == std::string::npos) break;
    out.push_back(s.substr(b, e - b));
    b = e + sep.size();
  }
  out.push_back(s.substr(b));
  return out;
}

std::vector<std::string> rsplit_sep(const std::string& s, const std::string& sep,
                                    int64_t maxsplit) {
  std::vector<std::string> out;
  size_t e = s.size();
  while (maxsplit < 0 || (int64_t)out.size() < maxsplit) {
    if (e < sep.size()) break;
    const size_t p = s.rfind(sep, e - sep.size());
    if (p == std::string::npos) break;
    out.push_back(s.substr(p + sep.size(), e - p - sep.size()));
    e = p;
  }
  out.push_back(s.substr(0, e));
  std::reverse(out.begin(), out.end());
  return out;
}

bool is_line_break(uint32_t c) {
  return c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e) ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

std::vector<std::string> splitlines(const std::string& s, bool keepends) {
  const std::vector<uint32_t> c = to_cps(s);
  std::vector<std::string> out;
  size_t b = 0, i = 0;
  while (i < c.size()) {
    if (!is_line_break(c[i])) {
      ++i;
      continue;
    }
    size_t e = i + 1;
    if (c[i] == '\r' && e < c.size() && c[e] == '\n') ++e;
    out.push_back(from_cps(c, b, keepends ? e : i));
    b = i = e;
  }
  if (b < c.size()) out.push_back(from_cps(c, b));
  return out;
}

// Checks the output limit as it grows: a long replacement at every character of a long
// string is far past the limit long before it is done.
std::string py_replace(const Interp& in, const std::string& s, const std::string& old,
                       const std::string& rep, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts the replacement around every character.
    int64_t done = 0;
    for (size_t i = 0; i <= s.size();) {
      if (count < 0 || done < count) {
        out += rep;
        ++done;
        in.check_size(static_cast<int64_t>(out.size()));
      }
      if (i == s.size()) break;
      const size_t b = i;
      next_cp(s, i);
      out.append(s, b, i - b);
    }
    return out;
  }
  size_t b = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t e = s.find(old, b);
    if (e == std::string::npos) break;
    out.append(s, b, e - b);
    out += rep;
    in.check_size(static_cast<int64_t>(out.size()));
    b = e + old.size();
    ++done;
  }
  out.append(s, b, std::string::npos);
  return out;
}

// Python's slice-style (start, end) for find/count/startswith, in code points.
void cp_range(Interp& in, const std::vector<Opt>& a, size_t first, int64_t n, int64_t& b,
              int64_t& e) {
  b = 0;
  e = n;
  auto fix = [n](int64_t& x) {
    if (x < 0) x = std::max<int64_t>(0, x + n);
    if (x > n) x = n;
  };
  if (a.size() > first && a[first] && !a[first]->is_none()) {
    b = need_int(in, *a[first], "slice index");
    fix(b);
  }
  if (a.size() > first + 1 && a[first + 1] && !a[first + 1]->is_none()) {
    e = need_int(in, *a[first + 1], "slice index");
    fix(e);
  }
}

int64_t cp_find(const std::vector<uint32_t>& h, const std::vector<uint32_t>& n, int64_t b,
                int64_t e, bool reverse) {
  if ((int64_t)n.size() > e - b) return -1;
  if (!reverse) {
    for (int64_t i = b; i + (int64_t)n.size() <= e; ++i)
      if (std::equal(n.begin(), n.end(), h.begin() + i)) return i;
  } else {
    for (int64_t i = e - (int64_t)n.size(); i >= b; --i)
      if (std::equal(n.begin(), n.end(), h.begin() + i)) return i;
  }
  return -1;
}

// Whether a double converts to int64 without undefined behaviour (false for NaN).
bool fits_int64(double d) { return d >= -9223372036854775808.0 && d < 9223372036854775808.0; }

std::string pad(const std::string& s, int64_t width, const std::string& fill, char how) {
  const int64_t n = static_cast<int64_t>(cp_count(s));
  if (width <= n) return s;
  const int64_t marg = width - n;
  int64_t left = 0;
  if (how == '^')
    left = marg / 2 + (marg & width & 1);  // CPython's str.center
  else if (how == '>')
    left = marg;
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < marg - left; ++k) out += fill;
  return out;
}

std::string str_format(Interp& in, const std::string& fmt, const CallArgs& a);

Value string_method(Interp&, const std::string& s, const std::string& name) {
  auto fn = [&](std::function<Value(Interp&, CallArgs&)> f) {
    return make_fn("str." + name, std::move(f));
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return fn([s, l, r, name](Interp& in, CallArgs& a) {
      auto p = bind_args(in, a, name, {"chars"});
      if (p[0] && !p[0]->is_none())
        return Value::string(py_strip(s, &need_str(in, *p[0], "chars"), l, r));
      return Value::string(py_strip(s, nullptr, l, r));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool rev = name == "rsplit";
    return fn([s, rev, name](Interp& in, CallArgs& a) {
      auto p = bind_args(in, a, name, {"sep", "maxsplit"});
      const int64_t maxsplit = p[1] ? need_int(in, *p[1], "maxsplit") : -1;
      std::vector<std::string> parts;
      if (!p[0] || p[0]->is_none()) {
        parts = rev ? rsplit_ws(s, maxsplit) : split_ws(s, maxsplit);
      } else {
        const std::string& sep = need_str(in, *p[0], "sep");
        if (sep.empty()) in.fail("empty separator");
        parts = rev ? rsplit_sep(s, sep, maxsplit) : split_sep(s, sep, maxsplit);
      }
      std::vector<Value> out;
      for (auto& x : parts) out.push_back(Value::string(std::move(x)));
      return list_of(std::move(out));
    });
  }
  if (name == "splitlines") {
    return fn([s](Interp& in, CallArgs& a) {
      auto p = bind_args(in, a, "splitlines", {"keepends"});
      std::vector<Value> out;
      for (auto& x : splitlines(s, p[0] && truthy(*p[0])))
        out.push_back(Value::string(std::move(x)));
      return list_of(std::move(out));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool ends = name == "endswith";
    return fn([s, ends, name](Interp& in, CallArgs& a) {
      auto p = bind_args(in, a, name, {"prefix", "start", "end"});
      if (!p[0]) in.fail(name + "() takes at least 1 argument");
      const std::vector<uint32_t> h = to_cps(s);
      int64_t b, e;
      cp_range(in, p, 1, (int64_t)h.size(), b, e);
      std::vector<Value> cands;
      if (p[0]->is_list() && p[0]->list->tuple)
        cands = p[0]->list->items;
      else if (p[0]->is_string())
        cands.push_back(*p[0]);
      else
        in.fail(name + " first arg must be str or a tuple of str, not " + python_type_name(*p[0]));
      for (const auto& c : cands) {
        const std::vector<uint32_t> n = to_cps(need_str(in, c, name.c_str()));
        if ((int64_t)n.size() > e - b) continue;
        const int64_t at = ends ? e - (int64_t)n.size() : b;
        if (std::equal(n.begin(), n.end(), h.begin() + at)) return Value::boolean(true);
      }
      return Value::boolean(false);
    });
  }
  if (name == "upper")
    return fn([s](Interp& in, CallArgs& a) {
      bind_args(in, a, "upper", {});
      return Value::string(str_upper(s));
    });
  if (name == "lower" || name == "casefold")
    return fn([s, name](Interp& in, CallArgs& a) {
      bind_args(in, a, name, {});
      return Value::string(str_lower(s));
    });
  if (name == "title")
    return fn([s](Interp& in, CallArgs& a) {
      bind_args(in, a, "title", {});
      return Value::string(str_title(s));
    });
  if (name == "capitalize")
    return fn([s](Interp& in, CallArgs& a) {
      bind_args(in, a, "capitalize", {});
      return Value::string(str_capitalize(s));
    });
  if (name == "swapcase")
    return fn([s](Interp& in, CallArgs& a) {
      bind_args(in, a, "swapcase", {});
      const std::vector<uint32_t> c = to_cps(s);
      std::string out;
      for (size_t i = 0; i < c.size(); ++i) {
        if (is_upper_cp(c[i]))
          lower_at(out, c, i);
        else if (is_lower_cp(c[i]))
          append_upper(out, c[i]);
        else
          append_cp(out, c[i]);
      }
      return Value::string(out);
    });
  if (name == "replace") {
    return fn([s](Interp& in, CallArgs& a) {
      auto p = bind_args(in, a, "replace", {"old", "new", "count"});
      if (!p[0] || !p[1]) in.fail("replace() takes at least 2 arguments");
      const int64_t count = p[2] ? need_int(in, *p[2], "count") : -1;
      return Value::string(py_replace(in, s, need_str(in, *p[0], "replace() argument 1"),
                                      need_str(in, *p[1], "replace() argument 2"), count));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return fn([s, name](Interp& in, CallArgs& a) {
      auto p = bind_args(in, a, name, {"sub", "start", "end"});
      if (!p[0]) in.fail(name + "() takes at least 1 argument");
      const std::vector<uint32_t> h = to_cps(s), n = to_cps(need_str(in, *p[0], name.c_str()));
      int64_t b, e;
      cp_range(in, p, 1, (int64_t)h.size(), b, e);
      if (name == "count") {
        if (e < b) return Value::integer(0);
        if (n.empty()) return Value::integer(e - b + 1);
        int64_t c = 0;
        for (int64_t i = b; i + (int64_t)n.size() <= e;) {
          if (std::equal(n.begin(), n.end(), h.begin() + i)) {
            ++c;
            i += n.size();
          } else {
            ++i;
          }
        }
        return Value::integer(c);
      }
      const int64_t at = cp_find(h, n, b, e, name[0] == 'r');
      if (at < 0 && (name == "index" || name == "rindex")) in.fail("substring not found");
      return Value::integer(at);
    });
  }
  if (name == "join") {
    return fn([s](Interp& in, CallArgs& a) {
      auto p = bind_args(in, a, "join", {"iterable"});
      if (!p[0]) in.fail("join() takes exactly one argument");
      std::string out;
      size_t k = 0;
      for (const auto& v : in.iterate(*p[0])) {
        if (!v.is_string())
          in.fail("sequence item " + std::to_string(k) + ": expected str instance, " + python_type_name(v) +
                  " found");
        if (k++) out += s;
        out += v.s;
      }
      return Value::string(out);
    });
  }
  if (name == "format")
    return fn([s](Interp& in, CallArgs& a) { return Value::string(str_format(in, s, a)); });
  if (name == "center" || name == "ljust" || name == "rjust") {
    const char how = name == "center" ? '^' : name == "ljust" ? '<' : '>';
    return fn([s, how, name](Interp& in, CallArgs& a) {
      auto p = bind_args(in, a, name, {"width", "fillchar"});
      if (!p[0]) in.fail(name + "() takes at least 1 argument");
      std::string fill = " ";
      if (p[1]) {
        fill = need_str(in, *p[1], "fillchar");
        if (cp_count(fill) != 1) in.fail("The fill character must be exactly one character long");
      }
      const int64_t width = need_int(in, *p[0], "width");
      in.check_size(width);
      return Value::string(pad(s, width, fill, how));
    });
  }
  if (name == "zfill") {
    return fn([s](Interp& in, CallArgs& a) {
      auto p = bind_args(in, a, "zfill", {"width"});
      if (!p[0]) in.fail("zfill() takes exactly one argument");
      const int64_t w = need_int(in, *p[0], "width");
      in.check_size(w);
      const int64_t n = static_cast<int64_t>(cp_count(s));
      if (w <= n) return Value::string(s);
      std::string body = s, sign;
      if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
        sign = s.substr(0, 1);
        body = s.substr(1);
      }
      return Value::string(sign + std::string(w - n, '0') + body);
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const bool pre = name == "removeprefix";
    return fn([s, pre, name](Interp& in, CallArgs& a) {
      auto p = bind_args(in, a, name, {"x"});
      if (!p[0]) in.fail(name + "() takes exactly one argument");
      const std::string& x = need_str(in, *p[0], name.c_str());
      if (pre && s.compare(0, x.size(), x) == 0) return Value::string(s.substr(x.size()));
      if (!pre && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
        return Value::string(s.substr(0, s.size() - x.size()));
      return Value::string(s);
    });
  }
  if (name == "partition" || name == "rpartition") {
    const bool rev = name == "rpartition";
    return fn([s, rev, name](Interp& in, CallArgs& a) {
      auto p = bind_args(in, a, name, {"sep"});
      if (!p[0]) in.fail(name + "() takes exactly one argument");
      const std::string& sep = need_str(in, *p[0], name.c_str());
      if (sep.empty()) in.fail("empty separator");
      const size_t at = rev ? s.rfind(sep) : s.find(sep);
      std::vector<Value> r;
      if (at == std::string::npos) {
        if (rev)
          r = {Value::string(""), Value::string(""), Value::string(s)};
        else
          r = {Value::string(s), Value::string(""), Value::string("")};
      } else {
        r = {Value::string(s.substr(0, at)), Value::string(sep),
             Value::string(s.substr(at + sep.size()))};
      }
      return Value::new_list(std::move(r), true);
    });
  }
  if (name.rfind("is", 0) == 0) {
    static const char* preds[] = {"isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum",
                                  "isspace", "islower",   "isupper",   "istitle", "isascii"};
    if (std::find_if(std::begin(preds), std::end(preds),
                     [&](const char* x) { return name == x; }) != std::end(preds)) {
      return fn([s, name](Interp& in, CallArgs& a) {
        bind_args(in, a, name, {});
        const std::vector<uint32_t> c = to_cps(s);
        if (name == "isascii") return Value::boolean(all_ascii(s));
        if (c.empty()) return Value::boolean(false);
        auto all = [&](bool (*pred)(uint32_t)) {
          return Value::boolean(std::all_of(c.begin(), c.end(), pred));
        };
        if (name == "isdigit") return all(unicode::is_digit);
        if (name == "isdecimal") return all(unicode::is_decimal);
        if (name == "isnumeric") return all(unicode::is_numeric);
        if (name == "isalpha") return all(unicode::is_alpha);
        if (name == "isalnum") return all(is_alnum_cp);
        if (name == "isspace") return all(py_isspace);
        bool any_cased = false, ok = true;
        if (name == "istitle") {
          bool prev_cased = false;
          for (uint32_t x : c) {
            if (is_upper_cp(x) || is_title_cp(x)) {
              if (prev_cased) ok = false;
              prev_cased = any_cased = true;
            } else if (is_lower_cp(x)) {
              if (!prev_cased) ok = false;
              prev_cased = any_cased = true;
            } else {
              prev_cased = false;
            }
          }
          return Value::boolean(ok && any_cased);
        }
        const bool want_lower = name == "islower";
        for (uint32_t x : c) {
          if (is_title_cp(x)) ok = false;
          if (is_upper_cp(x)) {
            any_cased = true;
            if (want_lower) ok = false;
          } else if (is_lower_cp(x)) {
            any_cased = true;
            if (!want_lower) ok = false;
          }
        }
        return Value::boolean(ok && any_cased);
      });
    }
  }
  return Value::undefined();
}

// str.format with automatic or explicit field numbering and names, conversions
// !s / !r, and no format specs beyond a plain field.
// Python's format(value, spec): [[fill]align][sign][#][0][width][,|_][.precision][type].
std::string format_spec(Interp& in, const Value& v, const std::string& spec) {
  if (spec.empty()) return to_str(v);
  const std::vector<uint32_t> c = to_cps(spec);
  size_t i = 0;
  std::string fill = " ";
  char align = 0, sign = '-', group = 0, type = 0;
  bool alt = false, zero = false;
  int64_t width = 0, prec = -1;
  // Decimal digits at i, saturating (any value past the limits below is refused anyway).
  auto number = [&](int64_t& v) {
    for (; i < c.size() && c[i] >= '0' && c[i] <= '9'; ++i) v = std::min<int64_t>(v * 10 + (c[i] - '0'), 1'000'000'000);
  };
  auto is_align = [](uint32_t x) { return x == '<' || x == '>' || x == '=' || x == '^'; };
  if (c.size() >= 2 && is_align(c[1])) {
    fill.clear();
    append_cp(fill, c[0]);
    align = static_cast<char>(c[1]);
    i = 2;
  } else if (!c.empty() && is_align(c[0])) {
    align = static_cast<char>(c[0]);
    i = 1;
  }
  if (i < c.size() && (c[i] == '+' || c[i] == '-' || c[i] == ' ')) sign = static_cast<char>(c[i++]);
  if (i < c.size() && c[i] == '#') alt = (++i, true);
  if (i < c.size() && c[i] == '0') zero = (++i, true);
  number(width);
  if (i < c.size() && (c[i] == ',' || c[i] == '_')) group = static_cast<char>(c[i++]);
  if (i < c.size() && c[i] == '.') {
    ++i;
    prec = 0;
    if (i >= c.size() || c[i] < '0' || c[i] > '9') in.fail("Format specifier missing precision");
    number(prec);
  }
  if (i < c.size()) type = static_cast<char>(c[i++]);
  if (i != c.size() || width > 100000 || prec > 1000)
    in.fail("Invalid format specifier '" + spec + "'");
  if (zero && !align) {
    fill = "0";
    align = '=';
  }
  std::string body, prefix;  // prefix: sign and 0x-style markers, before '=' padding
  if (v.is_string()) {
    if (type && type != 's')
      in.fail(std::string("Unknown format code '") + type + "' for object of type 'str'");
    if (sign != '-' || alt || align == '=' || group)
      in.fail("invalid format specifier for a string");
    body = prec >= 0 ? from_cps(to_cps(v.s), 0, static_cast<size_t>(prec)) : v.s;
    if (!align) align = '<';
  } else if (v.is_number()) {
    int64_t iv = 0;
    const bool is_int = as_int(v, iv);
    const bool int_type = type == 0 || type == 'd' || type == 'n' || type == 'b' || type == 'o' ||
                          type == 'x' || type == 'X' || type == 'c';
    if (!align) align = '>';
    if (is_int && int_type) {
      if (prec >= 0) in.fail("Precision not allowed in integer format specifier");
      if (type == 'c') {
        append_utf8(body, static_cast<uint32_t>(iv));
      } else {
        const int base = type == 'b' ? 2 : type == 'o' ? 8 : (type == 'x' || type == 'X') ? 16 : 10;
        uint64_t u = iv < 0 ? 0 - static_cast<uint64_t>(iv) : static_cast<uint64_t>(iv);
        std::string digits;
        do {
          const int d = static_cast<int>(u % base);
          digits += static_cast<char>(d < 10 ? '0' + d : (type == 'X' ? 'A' : 'a') + d - 10);
          u /= base;
        } while (u);
        if (group) {
          const size_t every = base == 10 ? 3 : 4;
          std::string g;
          for (size_t k = 0; k < digits.size(); ++k) {
            if (k && k % every == 0) g += group;
            g += digits[k];
          }
          digits = g;
        }
        std::reverse(digits.begin(), digits.end());
        body = digits;
        if (alt && base != 10)
          prefix = base == 2 ? "0b" : base == 8 ? "0o" : (type == 'X' ? "0X" : "0x");
        prefix = (iv < 0 ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "") + prefix;
      }
    } else {
      if (!is_int && int_type && type) {
        in.fail(std::string("Unknown format code '") + type + "' for object of type 'float'");
      }
      double d = v.type == Value::Type::Float ? v.f : static_cast<double>(iv);
      const bool neg = std::signbit(d) && !std::isnan(d);
      d = std::fabs(d);
      char buf[1200];
      if (!type && prec < 0) {
        body = float_repr(d);
      } else if (type == '%') {
        std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(prec < 0 ? 6 : prec), d * 100);
        body = std::string(buf) + "%";
      } else if (!type || type == 'g' || type == 'G') {
        const int p = static_cast<int>(prec < 0 ? 6 : (prec == 0 ? 1 : prec));
        std::snprintf(buf, sizeof buf, alt ? "%#.*g" : "%.*g", p, d);
        body = buf;
        if (type == 'G')
          for (auto& ch : body)
            ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
        // Python's no-type form keeps one digit after the point in fixed notation.
        if (!type && body.find_first_of(".en") == std::string::npos) body += ".0";
      } else if (type == 'e' || type == 'E' || type == 'f' || type == 'F') {
        const std::string f = std::string(alt ? "%#.*" : "%.*") + type;
        std::snprintf(buf, sizeof buf, f.c_str(), static_cast<int>(prec < 0 ? 6 : prec), d);
        body = buf;
      } else {
        in.fail(std::string("Unknown format code '") + type + "' for object of type 'float'");
      }
      if (body == "inf" || body == "nan") {
        if (type == 'E' || type == 'F' || type == 'G') body = body == "inf" ? "INF" : "NAN";
      }
      if (group) {
        const size_t dot = body.find_first_of(".eE%");
        const std::string ip = body.substr(0, dot),
                          rest = dot == std::string::npos ? "" : body.substr(dot);
        std::string g;
        for (size_t k = 0; k < ip.size(); ++k) {
          if (k && (ip.size() - k) % 3 == 0) g += group;
          g += ip[k];
        }
        body = g + rest;
      }
      prefix = neg ? "-" : sign == '+' ? "+" : sign == ' ' ? " " : "";
    }
  } else {
    in.fail(std::string("unsupported format string passed to ") + python_type_name(v) + ".__format__");
  }
  if (align == '=') {
    const int64_t n = static_cast<int64_t>(cp_count(prefix) + cp_count(body));
    std::string padding;
    for (int64_t k = n; k < width; ++k) padding += fill;
    return prefix + padding + body;
  }
  return pad(prefix + body, width, fill, align);
}

// str.format: automatic or explicit field numbers, names, .attr and [key]
// lookups, !s / !r conversions and format specs.
std::string str_format(Interp& in, const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    in.check_size(static_cast<int64_t>(out.size()));  // '{0}{0}...' of a long argument
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      in.fail("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    // The field runs to its matching '}' (a spec may hold nested {..}: unsupported).
    const size_t e = fmt.find('}', i);
    if (e == std::string::npos) in.fail("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, e - i - 1);
    i = e;
    if (field.find('{') != std::string::npos)
      in.fail("nested replacement fields are not supported");
    std::string spec;
    const size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    char conv = 0;
    const size_t bang = field.find('!');
    if (bang != std::string::npos) {
      if (bang + 2 != field.size() || !std::strchr("rsa", field[bang + 1]))
        in.fail("invalid conversion in format string");
      conv = field[bang + 1];
      field.resize(bang);
    }
    const size_t rest_at = field.find_first_of(".[");
    const std::string head = field.substr(0, rest_at);
    Value v;
    if (head.empty()) {
      if (auto_idx >= a.pos.size())
        in.fail("Replacement index " + std::to_string(auto_idx) + " out of range");
      v = a.pos[auto_idx++];
    } else if (std::all_of(head.begin(), head.end(),
                           [](char ch) { return std::isdigit((unsigned char)ch); })) {
      const size_t k = std::strtoull(head.c_str(), nullptr, 10);
      if (k >= a.pos.size()) in.fail("Replacement index " + head + " out of range");
      v = a.pos[k];
    } else {
      bool found = false;
      for (const auto& kv : a.kw)
        if (kv.first == head) {
          v = kv.second;
          found = true;
        }
      if (!found) in.fail("missing format argument '" + head + "'");
    }
    for (size_t p = rest_at; p != std::string::npos && p < field.size();) {
      if (field[p] == '.') {
        const size_t q = field.find_first_of(".[", p + 1);
        v = in.getattr(v,
                       field.substr(p + 1, q == std::string::npos ? std::string::npos : q - p - 1));
        p = q;
      } else {
        const size_t q = field.find(']', p);
        if (q == std::string::npos) in.fail("Missing ']' in format string");
        const std::string key = field.substr(p + 1, q - p - 1);
        const bool num = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) {
          return std::isdigit((unsigned char)ch);
        });
        v = in.getitem(
            v, num ? Value::integer(std::strtoll(key.c_str(), nullptr, 10)) : Value::string(key));
        p = q + 1;
      }
      if (v.is_undefined()) in.fail_undefined(v);
    }
    if (conv == 'r' || conv == 'a')
      v = Value::string(repr(v));
    else if (conv == 's')
      v = Value::string(to_str(v));
    out += format_spec(in, v, spec);
  }
  return out;
}

// ------------------------------------------------------------ dict / list methods

Value dict_method(const Value& self, const std::string& name) {
  auto d = self.dict;
  if (name == "items" || name == "keys" || name == "values") {
    return make_fn("dict." + name, [d, name](Interp& in, CallArgs& a) {
      bind_args(in, a, name, {});
      std::vector<Value> out;
      for (const auto& kv : d->items) {
        if (name == "items")
          out.push_back(Value::new_list({kv.first, kv.second}, true));
        else
          out.push_back(name == "keys" ? kv.first : kv.second);
      }
      return list_of(std::move(out));
    });
  }
  if (name == "get") {
    return make_fn("dict.get", [d](Interp& in, CallArgs& a) {
      if (!a.kw.empty()) in.fail("get() takes no keyword arguments");
      if (a.pos.empty() || a.pos.size() > 2) in.fail("get expected 1 or 2 arguments");
      if (const Value* v = d->find(a.pos[0])) return *v;
      return a.pos.size() > 1 ? a.pos[1] : Value::none();
    });
  }
  if (name == "copy") {
    return make_fn("dict.copy", [d](Interp& in, CallArgs& a) {
      bind_args(in, a, "copy", {});
      Value r = Value::new_dict();
      r.dict->items = d->items;
      r.dict->depth = d->depth;
      return r;
    });
  }
  if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" ||
      name == "clear")
    return Value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe.");
  return Value::undefined();
}

Value list_method(const Value& self, const std::string& name) {
  auto l = self.list;
  if (name == "index" || name == "count") {
    return make_fn("list." + name, [l, name](Interp& in, CallArgs& a) {
      if (a.pos.empty()) in.fail(name + "() takes at least 1 argument");
      int64_t c = 0;
      for (size_t k = 0; k < l->items.size(); ++k) {
        if (!py_equal(l->items[k], a.pos[0])) continue;
        if (name == "index") return Value::integer(static_cast<int64_t>(k));
        ++c;
      }
      if (name == "index") in.fail(repr(a.pos[0]) + " is not in list");
      return Value::integer(c);
    });
  }
  static const char* unsafe[] = {"append", "extend",  "insert", "pop",
                                 "remove", "reverse", "sort",   "clear"};
  for (const char* u : unsafe)
    if (name == u)
      return Value::undefined("access to attribute '" + name + "' of '" + python_type_name(self) +
                              "' object is unsafe.");
  return Value::undefined();
}

// ------------------------------------------------------------ conversions

bool parse_py_int(const std::string& raw, int64_t base, int64_t& out) {
  std::string s = py_strip(raw, nullptr, true, true);
  bool neg = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    const char p = (char)std::tolower((unsigned char)s[i + 1]);
    if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2)) {
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (i >= s.size()) return false;
  unsigned long long v = 0;
  bool prev_us = true;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      if (prev_us) return false;
      prev_us = true;
      continue;
    }
    int d;
    if (std::isdigit((unsigned char)c))
      d = c - '0';
    else if (std::isalpha((unsigned char)c))
      d = std::tolower((unsigned char)c) - 'a' + 10;
    else
      return false;
    if (d >= base) return false;
    if (v > (unsigned long long)INT64_MAX / (unsigned long long)base) return false;
    v = v * base + d;
    prev_us = false;
  }
  if (prev_us || v > (unsigned long long)INT64_MAX) return false;
  out = neg ? -(int64_t)v : (int64_t)v;
  return true;
}

bool parse_py_float(const std::string& raw, double& out) {
  std::string s = py_strip(raw, nullptr, true, true);
  std::string lower = str_lower(s);
  std::string body = lower;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body = body.substr(1);
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : INFINITY;
    if (lower[0] == '-') out = -out;
    return true;
  }
  std::string clean;
  char prev = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      if (!std::isdigit((unsigned char)prev) || i + 1 >= s.size() ||
          !std::isdigit((unsigned char)s[i + 1]))
        return false;
      prev = c;
      continue;
    }
    if (!std::isdigit((unsigned char)c) && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-')
      return false;
    clean += c;
    prev = c;
  }
  if (clean.empty()) return false;
  char* end = nullptr;
  out = std::strtod(clean.c_str(), &end);
  return end && *end == 0 && end != clean.c_str();
}

// Python's round(x, ndigits): correctly rounded, ties to even.
double py_round(double x, int64_t nd) {
  if (!std::isfinite(x)) return x;
  if (nd > 300) return x;
  if (nd >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(nd), x);
    return std::strtod(buf, nullptr);
  }
  const double p = std::pow(10.0, static_cast<double>(-nd));
  const double y = x / p;
  double z = std::nearbyint(y);  // the default rounding mode: ties to even
  return z * p;
}

}  // namespace

// snprintf into a string of the size it needs (a fixed buffer cut "%600d" at 511 bytes).
template <class T>
std::string c_format(const char* f, T v) {
  const int n = std::snprintf(nullptr, 0, f, v);
  if (n <= 0) return std::string();
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), f, v);
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string py_percent_format(Interp& in, const std::string& fmt, const Value& args) {
  std::vector<Value> items;
  const bool mapping = args.is_dict();
  if (args.is_list() && args.list->tuple)
    items = args.list->items;
  else
    items.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    in.check_size(static_cast<int64_t>(out.size()));  // '%(a)s%(a)s...' of a long value
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) in.fail("incomplete format");
    Value v;
    bool have = false;
    if (fmt[i] == '(') {
      const size_t e = fmt.find(')', i);
      if (args.is_undefined()) in.fail_undefined(args);
      if (e == std::string::npos || !mapping) in.fail("format requires a mapping");
      const Value* f = args.dict->find(fmt.substr(i + 1, e - i - 1));
      if (!f) in.fail("KeyError: " + fmt.substr(i + 1, e - i - 1));
      v = *f;
      have = true;
      i = e + 1;
    }
    std::string spec = "%";
    // (fmt[i] != 0: strchr would match the terminator.) Width and precision are read as
    // numbers too, so that a result past the output limit is refused before snprintf.
    int64_t width_n = 0, prec_n = 0;
    auto digits = [&](int64_t& n) {
      while (i < fmt.size() && std::isdigit((unsigned char)fmt[i])) {
        n = n > INT64_MAX / 10 - 9 ? INT64_MAX / 10 : n * 10 + (fmt[i] - '0');
        spec += fmt[i++];
      }
    };
    while (i < fmt.size() && fmt[i] && std::strchr("-+ 0#", fmt[i])) spec += fmt[i++];
    digits(width_n);
    if (i < fmt.size() && fmt[i] == '.') {
      spec += fmt[i++];
      digits(prec_n);
    }
    if (i >= fmt.size()) in.fail("incomplete format");
    const char conv = fmt[i];
    if (conv == 0) in.fail("unsupported format character '\\x0'");
    in.check_size(width_n);
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!have) {
      if (next >= items.size()) in.fail("not enough arguments for format string");
      v = items[next++];
    }
    if (conv == 's' || conv == 'r' || conv == 'a') {
      const std::string s = conv == 's' ? to_str(v) : repr(v);
      // width/precision apply to code points; apply by hand
      std::string body = s;
      size_t dot = spec.find('.');
      if (dot != std::string::npos) {
        const size_t prec = std::strtoull(spec.c_str() + dot + 1, nullptr, 10);
        body = from_cps(to_cps(body), 0, prec);
      }
      size_t k = 1;
      bool left = false;
      while (k < spec.size() && std::strchr("-+ 0#", spec[k])) left |= spec[k++] == '-';
      const int64_t width = std::strtoll(spec.c_str() + k, nullptr, 10);
      out += pad(body, width, " ", left ? '<' : '>');
    } else if (std::strchr("diuxXoc", conv)) {
      int64_t iv;
      if (v.type == Value::Type::Float && conv != 'c') {
        if (std::isnan(v.f)) in.fail("cannot convert float NaN to integer");
        if (!fits_int64(v.f)) in.fail("integer overflow in %" + std::string(1, conv));
        iv = static_cast<int64_t>(v.f);
      } else if (!as_int(v, iv))
        in.fail(std::string("%") + conv + " format: a real number is required, not " + python_type_name(v));
      if (conv == 'c') {
        std::string ch;
        append_utf8(ch, static_cast<uint32_t>(iv));
        out += ch;
        continue;
      }
      const char c2 = conv == 'i' || conv == 'u' ? 'd' : conv;
      in.check_size(prec_n);
      out += c_format((spec + "ll" + c2).c_str(), static_cast<long long>(iv));
    } else if (std::strchr("eEfFgG", conv)) {
      if (!v.is_number()) in.fail(std::string("must be real number, not ") + python_type_name(v));
      const double d = v.type == Value::Type::Float ? v.f
                       : v.type == Value::Type::Int ? (double)v.i
                                                    : v.b;
      in.check_size(prec_n);
      out += c_format((spec + conv).c_str(), d);
    } else {
      in.fail(std::string("unsupported format character '") + conv + "'");
    }
  }
  // CPython takes any non-tuple, non-str object with __getitem__ (dict, list) as
  // a mapping and then never complains about unused arguments.
  const bool maplike =
      mapping || args.is_undefined() || (args.is_list() && !args.list->tuple && !args.list->lazy);
  if (!maplike && next < items.size())
    in.fail("not all arguments converted during string formatting");
  return out;
}

Value builtin_method(Interp& in, const Value& self, const std::string& name) {
  switch (self.type) {
    case Value::Type::String:
      return string_method(in, self.s, name);
    case Value::Type::Dict:
      return dict_method(self, name);
    case Value::Type::List:
      return list_method(self, name);
    default:
      return Value::undefined();
  }
}

// ------------------------------------------------------------ tests

namespace {
const char* kTests[] = {"boolean",     "callable",  "defined", "divisibleby", "eq",       "equalto",
                        "escaped",     "even",      "false",   "filter",      "float",    "ge",
                        "greaterthan", "gt",        "in",      "integer",     "iterable", "le",
                        "lessthan",    "lower",     "lt",      "mapping",     "ne",       "none",
                        "number",      "odd",       "sameas",  "sequence",    "string",   "test",
                        "true",        "undefined", "upper",   "==",          "!=",       "<",
                        "<=",          ">",         ">="};
const char* kFilters[] = {
    "abs",      "attr",       "batch",  "capitalize", "center",  "count",       "d",      "default",
    "dictsort", "e",          "escape", "first",      "float",   "forceescape", "format", "indent",
    "int",      "items",      "join",   "last",       "length",  "list",        "lower",  "map",
    "max",      "min",        "reject", "rejectattr", "replace", "reverse",     "round",  "safe",
    "select",   "selectattr", "sort",   "string",     "sum",     "title",       "tojson", "trim",
    "truncate", "unique",     "upper",  "wordcount"};
}  // namespace

bool has_test(const std::string& name) {
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

bool has_filter(const std::string& name) {
  for (const char* f : kFilters)
    if (name == f) return true;
  return false;
}

bool builtin_test(Interp& in, const std::string& name, const Value& v, CallArgs& args) {
  using T = Value::Type;
  auto arg = [&](const char* what) -> const Value& {
    if (args.pos.empty()) {
      for (const auto& kv : args.kw) return kv.second;
      in.fail(std::string("test '") + name + "' needs an argument (" + what + ")");
    }
    return args.pos[0];
  };
  static const char* no_arg[] = {
      "defined", "undefined", "none",   "boolean", "true",     "false",    "integer",
      "float",   "number",    "string", "mapping", "iterable", "sequence", "callable",
      "escaped", "lower",     "upper",  "even",    "odd",      "filter",   "test"};
  for (const char* t : no_arg)
    if (name == t && (!args.pos.empty() || !args.kw.empty()))
      in.fail("test_" + name + "() takes 1 positional argument but " +
              std::to_string(1 + args.pos.size() + args.kw.size()) + " were given");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.type == T::Bool;
  if (name == "true") return v.type == T::Bool && v.b;
  if (name == "false") return v.type == T::Bool && !v.b;
  if (name == "integer") return v.type == T::Int;
  if (name == "float") return v.type == T::Float;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  // Python's iter() and len()+__getitem__: jinja2's Undefined has both.
  if (name == "iterable")
    return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() || v.type == T::Loop;
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.type == T::Callable || v.is_undefined();
  if (name == "escaped") return false;
  if (name == "lower" || name == "upper") {
    CallArgs none;
    return truthy(
        string_method(in, to_str(v), name == "lower" ? "islower" : "isupper").fn->call(in, none));
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    // jinja2: value % 2 == 1, value % 2 == 0, value % num == 0, with Python's %.
    const Value m = in.eval_binary("%", v, name == "divisibleby" ? arg("num") : Value::integer(2));
    return py_equal(m, Value::integer(name == "odd" ? 1 : 0));
  }
  if (name == "sameas") {
    const Value& o = arg("other");
    if (v.type != o.type) return false;
    switch (v.type) {
      case T::None:
        return true;
      case T::Bool:
        return v.b == o.b;
      case T::Int:
        return v.i == o.i && v.i >= -5 && v.i <= 256;  // CPython's cached small ints
      case T::String:
        return v.s == o.s;
      case T::List:
        return v.list == o.list;
      case T::Dict:
      case T::Namespace:
        return v.dict == o.dict;
      case T::Callable:
        return v.fn == o.fn;
      default:
        return false;
    }
  }
  if (name == "eq" || name == "equalto" || name == "==") return py_equal(v, arg("other"));
  if (name == "ne" || name == "!=") return !py_equal(v, arg("other"));
  if (name == "lt" || name == "lessthan" || name == "<") return in.less(v, arg("other"));
  if (name == "gt" || name == "greaterthan" || name == ">") return in.less(arg("other"), v);
  if (name == "le" || name == "<=") return !in.less(arg("other"), v);
  if (name == "ge" || name == ">=") return !in.less(v, arg("other"));
  if (name == "in") {
    const Value& seq = arg("seq");
    if (seq.is_string()) {
      if (!v.is_string()) in.fail("'in <string>' requires string as left operand");
      return seq.s.find(v.s) != std::string::npos;
    }
    for (const auto& x : in.iterate(seq))
      if (py_equal(x, v)) return true;
    return false;
  }
  if (name == "filter" || name == "test") {  // `name in environment.filters`
    if (!hashable(v)) in.fail(std::string("unhashable type: '") + python_type_name(v) + "'");
    return v.is_string() && (name == "filter" ? has_filter(v.s) : has_test(v.s));
  }
  in.fail("no test named '" + name + "'");
}

// ------------------------------------------------------------ filters

namespace {

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string do_indent(std::string s, const Value& width, bool first, bool blank) {
  std::string ind = width.is_string() ? width.s : std::string(std::max<int64_t>(0, width.i), ' ');
  s += "\n";  // jinja2's quirk so that splitlines keeps a trailing empty line
  std::vector<std::string> lines = splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) rv += "\n" + ind;
      rv += lines[k];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
  }
  if (first) rv = ind + rv;
  return rv;
}

// jinja2's do_title: words begin after '-', whitespace, or an opening bracket.
std::string filter_title(const std::string& s) {
  const std::vector<uint32_t> c = to_cps(s);
  auto sep = [](uint32_t x) {
    return py_isspace(x) || x == '-' || x == '(' || x == '{' || x == '[' || x == '<';
  };
  std::string out;
  size_t i = 0;
  while (i < c.size()) {
    size_t j = i;
    const bool is_sep = sep(c[i]);
    while (j < c.size() && sep(c[j]) == is_sep) ++j;
    if (is_sep) {
      out += from_cps(c, i, j);
    } else {
      append_upper(out, c[i]);  // item[0].upper() + item[1:].lower()
      out += str_lower(from_cps(c, i + 1, j));
    }
    i = j;
  }
  return out;
}

}  // namespace

Value builtin_filter(Interp& in, const std::string& name, const Value& v, CallArgs& args) {
  using T = Value::Type;
  auto P = [&](std::initializer_list<const char*> names) {
    return bind_args(in, args, name, names);
  };

  if (name == "default" || name == "d") {
    auto p = P({"default_value", "boolean"});
    const bool boolean = p[1] && truthy(*p[1]);
    if (v.is_undefined() || (boolean && !truthy(v))) return p[0] ? *p[0] : Value::string("");
    return v;
  }
  if (name == "length" || name == "count") {
    P({});
    return Value::integer(py_len(in, v));
  }
  if (name == "string") {
    P({});
    return Value::string(to_str(v));
  }
  if (name == "safe") {
    P({});
    return v.is_string() ? v : Value::string(to_str(v));
  }
  if (name == "trim") {
    auto p = P({"chars"});
    if (p[0] && !p[0]->is_none())
      return Value::string(py_strip(to_str(v), &need_str(in, *p[0], "chars"), true, true));
    return Value::string(py_strip(to_str(v), nullptr, true, true));
  }
  if (name == "upper") {
    P({});
    return Value::string(str_upper(to_str(v)));
  }
  if (name == "lower") {
    P({});
    return Value::string(str_lower(to_str(v)));
  }
  if (name == "capitalize") {
    P({});
    return Value::string(str_capitalize(to_str(v)));
  }
  if (name == "title") {
    P({});
    return Value::string(filter_title(to_str(v)));
  }
  if (name == "replace") {
    auto p = P({"old", "new", "count"});
    if (!p[0] || !p[1]) in.fail("replace filter needs old and new");
    const int64_t count = p[2] && !p[2]->is_none() ? need_int(in, *p[2], "count") : -1;
    return Value::string(py_replace(in, to_str(v), to_str(*p[0]), to_str(*p[1]), count));
  }
  if (name == "e" || name == "escape" || name == "forceescape") {
    P({});
    return Value::string(html_escape(to_str(v)));
  }
  if (name == "tojson") {
    // transformers' own tojson: json.dumps(x, ensure_ascii=False, ...), so no
    // HTML escaping, and keys keep their order unless sort_keys.
    auto p = P({"ensure_ascii", "indent", "separators", "sort_keys"});
    std::string indent;
    const std::string* ip = nullptr;
    if (p[1] && !p[1]->is_none()) {
      if (p[1]->is_string())
        indent = p[1]->s;
      else {
        const int64_t n = need_int(in, *p[1], "indent");
        in.check_size(n);
        indent = std::string(std::max<int64_t>(0, n), ' ');
      }
      ip = &indent;
    }
    std::string item_sep, key_sep;
    const std::string *isp = nullptr, *ksp = nullptr;
    if (p[2] && !p[2]->is_none()) {
      std::vector<Value> seps = in.iterate(*p[2]);
      if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string())
        in.fail("tojson separators must be a pair of strings");
      item_sep = seps[0].s;
      key_sep = seps[1].s;
      isp = &item_sep;
      ksp = &key_sep;
    }
    try {
      return Value::string(to_json(v, ip, p[3] && truthy(*p[3]), p[0] && truthy(*p[0]), isp, ksp,
                                   in.opts.limits.max_output));
    } catch (const std::runtime_error& e) {
      if (v.is_undefined()) in.fail_undefined(v);
      in.fail(std::string("tojson: ") + e.what());
    }
  }
  if (name == "items") {
    P({});
    if (v.is_undefined()) return list_of({});
    if (!v.is_dict()) in.fail("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& kv : v.dict->items)
      out.push_back(Value::new_list({kv.first, kv.second}, true));
    return list_of(std::move(out));
  }
  if (name == "list") {
    P({});
    return list_of(in.iterate(v));
  }
  if (name == "first" || name == "last") {
    P({});
    if (name == "last" && v.is_list() && v.list->lazy)
      in.fail("'generator' object is not reversible");
    std::vector<Value> items = in.iterate(v);
    if (items.empty())
      return Value::undefined(std::string("No ") + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    auto p = P({"d", "attribute"});
    const std::string sep = p[0] ? to_str(*p[0]) : "";
    std::string out;
    size_t k = 0;
    for (const auto& x : in.iterate(v)) {
      if (k++) out += sep;
      out += to_str(p[1] && !p[1]->is_none() ? attr_path(in, x, *p[1], nullptr) : x);
      if (out.size() > in.opts.limits.max_output) in.fail("a string exceeds the output limit");
    }
    return Value::string(out);
  }
  if (name == "reverse") {
    P({});
    if (v.is_string()) {
      std::vector<uint32_t> c = to_cps(v.s);
      std::reverse(c.begin(), c.end());
      return Value::string(from_cps(c));
    }
    std::vector<Value> items = in.iterate(v);
    std::reverse(items.begin(), items.end());
    return list_of(std::move(items));
  }
  if (name == "int") {
    auto p = P({"default", "base"});
    const Value dflt = p[0] ? *p[0] : Value::integer(0);
    const int64_t base = p[1] ? need_int(in, *p[1], "base") : 10;
    int64_t i;
    if (v.is_undefined()) in.fail_undefined(v);
    if (v.is_string()) {
      if (parse_py_int(v.s, base, i)) return Value::integer(i);
      double d;
      if (parse_py_float(v.s, d) && std::isfinite(d)) {
        if (!fits_int64(d)) in.fail("integer overflow in int");  // Python's int is unbounded
        return Value::integer(static_cast<int64_t>(d));
      }
      return dflt;
    }
    if (as_int(v, i)) return Value::integer(i);
    if (v.type == T::Float) {
      if (!std::isfinite(v.f)) in.fail("cannot convert float infinity or NaN to integer");
      if (!fits_int64(v.f)) in.fail("integer overflow in int");  // Python's int is unbounded
      return Value::integer(static_cast<int64_t>(v.f));
    }
    return dflt;
  }
  if (name == "float") {
    auto p = P({"default"});
    const Value dflt = p[0] ? *p[0] : Value::number(0.0);
    if (v.is_undefined()) in.fail_undefined(v);
    if (v.is_number())
      return Value::number(v.type == T::Float ? v.f : v.type == T::Int ? (double)v.i : v.b);
    double d;
    if (v.is_string() && parse_py_float(v.s, d)) return Value::number(d);
    return dflt;
  }
  if (name == "abs") {
    P({});
    int64_t i;
    if (as_int(v, i)) {
      if (i == INT64_MIN) in.fail("integer overflow in abs");
      return Value::integer(i < 0 ? -i : i);
    }
    if (v.type == T::Float) return Value::number(std::fabs(v.f));
    if (v.is_undefined()) in.fail_undefined(v);
    in.fail(std::string("bad operand type for abs(): '") + python_type_name(v) + "'");
  }
  if (name == "round") {
    auto p = P({"precision", "method"});
    const int64_t prec = p[0] ? need_int(in, *p[0], "precision") : 0;
    const std::string method = p[1] ? to_str(*p[1]) : "common";
    if (method != "common" && method != "ceil" && method != "floor")
      in.fail("method must be 'common', 'ceil' or 'floor'");
    if (v.is_undefined()) in.fail_undefined(v);
    if (!v.is_number())
      in.fail(std::string("type ") + python_type_name(v) + " doesn't define __round__ method");
    if (method == "common" && v.type != T::Float)
      return Value::integer(v.type == T::Int ? v.i : v.b);
    const double x = v.type == T::Float ? v.f : v.type == T::Int ? (double)v.i : v.b;
    if (method == "common") return Value::number(py_round(x, prec));
    const double m = std::pow(10.0, static_cast<double>(prec));
    return Value::number((method == "ceil" ? std::ceil(x * m) : std::floor(x * m)) / m);
  }
  if (name == "center") {
    auto p = P({"width"});
    const int64_t width = p[0] ? need_int(in, *p[0], "width") : 80;
    in.check_size(width);
    return Value::string(pad(to_str(v), width, " ", '^'));
  }
  if (name == "indent") {
    auto p = P({"width", "first", "blank"});
    Value width = p[0] ? *p[0] : Value::integer(4);
    if (!width.is_string()) width = Value::integer(need_int(in, width, "width"));
    if (v.is_undefined()) in.fail_undefined(v);
    if (!v.is_string()) in.fail(std::string("indent needs a string, not ") + python_type_name(v));
    {  // every line gets the indent: refuse a result past the limit before building it
      const int64_t ind = width.is_string() ? static_cast<int64_t>(width.s.size()) : width.i;
      const int64_t lines = 1 + std::count(v.s.begin(), v.s.end(), '\n');
      if (ind > 0) in.check_size(lines > INT64_MAX / ind ? INT64_MAX : ind * lines);
    }
    return Value::string(do_indent(to_str(v), width, p[1] && truthy(*p[1]), p[2] && truthy(*p[2])));
  }
  if (name == "truncate") {
    auto p = P({"length", "killwords", "end", "leeway"});
    const int64_t length = p[0] ? need_int(in, *p[0], "length") : 255;
    const std::string end = p[2] ? to_str(*p[2]) : "...";
    const int64_t leeway = p[3] && !p[3]->is_none() ? need_int(in, *p[3], "leeway") : 5;
    const int64_t end_len = static_cast<int64_t>(cp_count(end));
    if (!v.is_string()) {
      // jinja2 takes len() of anything: a short list or dict comes back as it is.
      const int64_t n = py_len(in, v);
      if (length >= end_len && leeway >= 0 && n <= length + leeway) return v;
      in.fail(std::string("truncate needs a string, not ") + python_type_name(v));
    }
    const std::vector<uint32_t> c = to_cps(v.s);
    if (length < end_len)
      in.fail("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
    if (leeway < 0) in.fail("expected leeway >= 0");
    if ((int64_t)c.size() <= length + leeway) return Value::string(to_str(v));
    std::string head = from_cps(c, 0, length - end_len);
    if (p[1] && truthy(*p[1])) return Value::string(head + end);
    const size_t sp = head.rfind(' ');
    if (sp != std::string::npos) head.resize(sp);
    return Value::string(head + end);
  }
  if (name == "wordcount") {
    P({});
    const std::vector<uint32_t> c = to_cps(to_str(v));
    int64_t n = 0;
    bool in_word = false;
    for (uint32_t x : c) {
      const bool w = is_word_cp(x);
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value::integer(n);
  }
  if (name == "format")
    return Value::string(py_percent_format(
        in, to_str(v), args.kw.empty() ? Value::new_list(args.pos, true) : [&] {
          Value d = Value::new_dict();
          for (const auto& kv : args.kw) d.dict->set(Value::string(kv.first), kv.second);
          return d;
        }()));
  if (name == "attr") {
    auto p = P({"name"});
    if (!p[0]) in.fail("attr filter needs a name");
    const std::string an = to_str(*p[0]);
    if (v.is_undefined()) in.fail_undefined(v);
    // getattr() only: dict keys are not attributes.
    if (v.type == T::Namespace || v.type == T::Loop) return in.getattr(v, an);
    Value m = builtin_method(in, v, an);
    if (!(m.is_undefined() && m.s.empty())) return m;
    return Value::undefined(std::string("'") + python_type_name(v) + " object' has no attribute '" + an + "'");
  }
  if (name == "batch") {
    auto p = P({"linecount", "fill_with"});
    if (!p[0]) in.fail("batch filter needs a line count");
    const int64_t n = need_int(in, *p[0], "linecount");
    if (n <= 0) in.fail("batch linecount must be positive");
    if (p[1] && !p[1]->is_none() && static_cast<uint64_t>(n) > kMaxItems)
      in.fail("a list grows too long");  // the last batch is filled up to n items
    std::vector<Value> out, cur;
    for (const auto& x : in.iterate(v)) {
      cur.push_back(x);
      if ((int64_t)cur.size() == n) {
        out.push_back(list_of(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      if (p[1] && !p[1]->is_none())
        while ((int64_t)cur.size() < n) cur.push_back(*p[1]);
      out.push_back(list_of(std::move(cur)));
    }
    return list_of(std::move(out));
  }
  if (name == "sum") {
    auto p = P({"attribute", "start"});
    Value acc = p[1] ? *p[1] : Value::integer(0);
    for (const auto& x : in.iterate(v))
      acc =
          in.eval_binary("+", acc, p[0] && !p[0]->is_none() ? attr_path(in, x, *p[0], nullptr) : x);
    return acc;
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    std::vector<Opt> p;
    if (name == "sort")
      p = P({"reverse", "case_sensitive", "attribute"});
    else {
      auto q = P({"case_sensitive", "attribute"});
      p = {std::nullopt, q[0], q[1]};
    }
    const bool rev = p[0] && truthy(*p[0]);
    const bool cs = p[1] && truthy(*p[1]);
    const Value* attribute = p[2] && !p[2]->is_none() ? &*p[2] : nullptr;
    std::vector<Value> items = in.iterate(v);
    auto key = [&](const Value& x) {
      Value k = attribute ? attr_path(in, x, *attribute, nullptr) : x;
      return cs ? k : ignore_case(k);
    };
    if (name == "unique") {
      for (const auto& x : items)
        if (!hashable(key(x))) in.fail(std::string("unhashable type: '") + python_type_name(key(x)) + "'");
      std::vector<Value> out, seen;
      for (const auto& x : items) {
        Value k = key(x);
        bool dup = false;
        for (const auto& s : seen)
          if (py_equal(s, k)) dup = true;
        if (!dup) {
          seen.push_back(k);
          out.push_back(x);
        }
      }
      return list_of(std::move(out));
    }
    std::vector<std::pair<Value, Value>> keyed;
    for (const auto& x : items) keyed.emplace_back(key(x), x);
    if (name == "min" || name == "max") {
      if (keyed.empty()) return Value::undefined("No aggregated item, sequence was empty.");
      size_t best = 0;
      for (size_t k = 1; k < keyed.size(); ++k) {
        const bool better = name == "min" ? in.less(keyed[k].first, keyed[best].first)
                                          : in.less(keyed[best].first, keyed[k].first);
        if (better) best = k;
      }
      return keyed[best].second;
    }
    // Python's sort is stable, also with reverse=True.
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      return rev ? in.less(b.first, a.first) : in.less(a.first, b.first);
    });
    std::vector<Value> out;
    for (auto& kv : keyed) out.push_back(std::move(kv.second));
    return list_of(std::move(out));
  }
  if (name == "dictsort") {
    auto p = P({"case_sensitive", "by", "reverse"});
    if (!v.is_dict()) in.fail("You can only sort by either \"key\" or \"value\" of a mapping");
    const bool cs = p[0] && truthy(*p[0]);
    const std::string by = p[1] ? to_str(*p[1]) : "key";
    if (by != "key" && by != "value") in.fail("You can only sort by either \"key\" or \"value\"");
    const bool rev = p[2] && truthy(*p[2]);
    std::vector<std::pair<Value, Value>> items = v.dict->items;
    std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
      Value ka = by == "key" ? a.first : a.second, kb = by == "key" ? b.first : b.second;
      if (!cs) {
        ka = ignore_case(ka);
        kb = ignore_case(kb);
      }
      return rev ? in.less(kb, ka) : in.less(ka, kb);
    });
    std::vector<Value> out;
    for (auto& kv : items) out.push_back(Value::new_list({kv.first, kv.second}, true));
    return list_of(std::move(out));
  }
  if (name == "map") {
    std::vector<Value> out;
    if (!truthy(v)) return list_of({});
    const Value* attr = nullptr;
    Value dflt;
    bool has_default = false;
    for (const auto& kv : args.kw) {
      if (kv.first == "attribute" && args.pos.empty())
        attr = &kv.second;
      else if (kv.first == "default" && args.pos.empty()) {
        dflt = kv.second;
        has_default = !kv.second.is_none();
      }
    }
    if (attr) {
      for (const auto& kv : args.kw)
        if (kv.first != "attribute" && kv.first != "default")
          in.fail("Unexpected keyword argument '" + kv.first + "'");
      for (const auto& x : in.iterate(v))
        out.push_back(attr_path(in, x, *attr, has_default ? &dflt : nullptr));
      return list_of(std::move(out));
    }
    if (args.pos.empty()) in.fail("map requires a filter argument");
    const std::string fname = to_str(args.pos[0]);
    if (!has_filter(fname)) in.fail("no filter named '" + fname + "'");
    CallArgs rest;
    rest.pos.assign(args.pos.begin() + 1, args.pos.end());
    rest.kw = args.kw;
    for (const auto& x : in.iterate(v)) {
      CallArgs a = rest;
      out.push_back(in.apply_filter(fname, x, a));
    }
    return list_of(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool want = name == "select" || name == "selectattr";
    std::vector<Value> out;
    if (!truthy(v)) return list_of({});
    size_t off = 0;
    if (by_attr && args.pos.empty()) in.fail("Missing parameter for attribute name");
    if (by_attr) off = 1;
    std::string test;
    const bool has = args.pos.size() > off;
    if (has) {
      test = to_str(args.pos[off]);
      if (!has_test(test)) in.fail("no test named '" + test + "'");
    }
    CallArgs rest;
    if (has) rest.pos.assign(args.pos.begin() + off + 1, args.pos.end());
    rest.kw = args.kw;
    for (const auto& x : in.iterate(v)) {
      const Value t = by_attr ? attr_path(in, x, args.pos[0], nullptr) : x;
      bool r;
      if (has) {
        CallArgs a = rest;
        r = in.apply_test(test, t, a);
      } else {
        r = truthy(t);
      }
      if (r == want) out.push_back(x);
    }
    return list_of(std::move(out));
  }
  in.fail("no filter named '" + name + "'");
}

// ------------------------------------------------------------ globals

void add_builtin_globals(Scope& scope, const Options& opts) {
  scope.vars["range"] = make_fn("range", [](Interp& in, CallArgs& a) {
    if (!a.kw.empty()) in.fail("range() takes no keyword arguments");
    if (a.pos.empty() || a.pos.size() > 3) in.fail("range expected 1 to 3 arguments");
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) {
      stop = need_int(in, a.pos[0], "range");
    } else {
      start = need_int(in, a.pos[0], "range");
      stop = need_int(in, a.pos[1], "range");
      if (a.pos.size() == 3) step = need_int(in, a.pos[2], "range");
    }
    if (step == 0) in.fail("range() arg 3 must not be zero");
    // The sandbox's MAX_RANGE, which also keeps a template from allocating without bound.
    const long double n = step > 0 ? ((long double)stop - start + step - 1) / step
                                   : ((long double)start - stop - step - 1) / -step;
    if (n > 100000)
      in.fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    std::vector<Value> out;
    // Stops where the next value would leave int64 (it would be past stop anyway).
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      out.push_back(Value::integer(i));
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    return list_of(std::move(out));
  });
  auto fill = [](Interp& in, CallArgs& a, Value& d, const char* fname) {
    if (a.pos.size() > 1) in.fail(std::string(fname) + " expected at most 1 positional argument");
    if (!a.pos.empty()) {
      const Value& src = a.pos[0];
      if (src.is_dict() || src.type == Value::Type::Namespace) {
        for (const auto& kv : src.dict->items) d.dict->set(kv.first, kv.second);
      } else {
        for (const auto& item : in.iterate(src)) {
          std::vector<Value> pair = in.iterate(item);
          if (pair.size() != 2)
            in.fail(std::string(fname) + ": sequence elements must have length 2");
          d.dict->set(pair[0], pair[1]);
        }
      }
    }
    for (const auto& kv : a.kw) d.dict->set(Value::string(kv.first), kv.second);
  };
  scope.vars["namespace"] = make_fn("namespace", [fill](Interp& in, CallArgs& a) {
    Value ns = Value::new_namespace();
    fill(in, a, ns, "namespace");
    return ns;
  });
  scope.vars["dict"] = make_fn("dict", [fill](Interp& in, CallArgs& a) {
    Value d = Value::new_dict();
    fill(in, a, d, "dict");
    return d;
  });
  scope.vars["joiner"] = make_fn("joiner", [](Interp& in, CallArgs& a) {
    auto p = bind_args(in, a, "joiner", {"sep"});
    const std::string sep = p[0] ? to_str(*p[0]) : ", ";
    auto used = std::make_shared<bool>(false);
    return make_fn("joiner", [sep, used](Interp&, CallArgs&) {
      if (!*used) {
        *used = true;
        return Value::string("");
      }
      return Value::string(sep);
    });
  });
  // transformers' globals.
  scope.vars["raise_exception"] = make_fn("raise_exception", [](Interp& in, CallArgs& a) -> Value {
    auto p = bind_args(in, a, "raise_exception", {"message"});
    in.fail(p[0] ? to_str(*p[0]) : std::string("raise_exception() called"));
  });
  auto clock = opts.strftime_now;
  scope.vars["strftime_now"] = make_fn("strftime_now", [clock](Interp& in, CallArgs& a) {
    auto p = bind_args(in, a, "strftime_now", {"format"});
    if (!p[0]) in.fail("strftime_now() missing required argument 'format'");
    const std::string& fmt = need_str(in, *p[0], "strftime_now format");
    if (clock) return Value::string(clock(fmt));
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);  // datetime.now(): local time
    return Value::string(format_time(fmt, tm));
  });
}

std::string format_time(const std::string& fmt, const struct tm& tm) {
  // A trailing space tells an empty result from a buffer too small.
  const std::string f = fmt + " ";
  for (size_t size = 256; size <= (1u << 20); size *= 4) {
    std::string buf(size, '\0');
    const size_t n = std::strftime(buf.data(), size, f.c_str(), &tm);
    if (n > 0) return buf.substr(0, n - 1);
  }
  return "";
}

}  // namespace dory::jinja
