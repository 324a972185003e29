// Template values with Python's conversions: str(), repr(), ==, and json.dumps
// (transformers' tojson: ensure_ascii=False). The output of a chat template is
// made of these, so each follows CPython's algorithm, not an approximation.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "text/jinja.h"
#include "text/jinja_interp.h"
#include "text/jinja_unicode.h"
#include "text/jinja_util.h"

namespace dory::jinja {

Value Value::undefined(std::string what) {
  Value v;
  v.s = std::move(what);
  return v;
}
Value Value::none() {
  Value v;
  v.type = Type::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.type = Type::Bool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.type = Type::Int;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.type = Type::Float;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.type = Type::String;
  v.s = std::move(x);
  return v;
}
Value Value::new_list(std::vector<Value> items, bool tuple) {
  Value v;
  v.type = Type::List;
  v.list = std::make_shared<ListObj>();
  int depth = 1;
  for (const auto& x : items) depth = std::max(depth, 1 + nesting(x));
  if (depth > kMaxNesting) throw NestingError();
  v.list->items = std::move(items);
  v.list->tuple = tuple;
  v.list->depth = depth;
  return v;
}
Value Value::new_dict() {
  Value v;
  v.type = Type::Dict;
  v.dict = std::make_shared<DictObj>();
  return v;
}
Value Value::new_namespace() {
  Value v;
  v.type = Type::Namespace;
  v.dict = std::make_shared<DictObj>();
  return v;
}

const Value* DictObj::find(const std::string& key) const {
  for (const auto& kv : items)
    if (kv.first.type == Value::Type::String && kv.first.s == key) return &kv.second;
  return nullptr;
}

const Value* DictObj::find(const Value& key) const {
  if (key.type == Value::Type::String) return find(key.s);
  for (const auto& kv : items)
    if (py_equal(kv.first, key)) return &kv.second;
  return nullptr;
}

int nesting(const Value& v) {
  if (v.type == Value::Type::List) return v.list->depth;
  if (v.type == Value::Type::Dict || v.type == Value::Type::Namespace) return v.dict->depth;
  return 0;
}

void DictObj::set(const Value& key, Value v) {
  const int d = 1 + std::max(nesting(key), nesting(v));
  if (d > kMaxNesting) throw NestingError();
  depth = std::max(depth, d);
  for (auto& kv : items)
    if (py_equal(kv.first, key)) {
      kv.second = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

void DictObj::append(Value key, Value v) {
  const int d = 1 + std::max(nesting(key), nesting(v));
  if (d > kMaxNesting) throw NestingError();
  depth = std::max(depth, d);
  items.emplace_back(std::move(key), std::move(v));
}

bool truthy(const Value& v) {
  switch (v.type) {
    case Value::Type::Undefined:
    case Value::Type::None:
      return false;
    case Value::Type::Bool:
      return v.b;
    case Value::Type::Int:
      return v.i != 0;
    case Value::Type::Float:
      return v.f != 0;
    case Value::Type::String:
      return !v.s.empty();
    case Value::Type::List:
      return v.list->lazy || !v.list->items.empty();
    case Value::Type::Dict:
      return !v.dict->items.empty();
    default:
      return true;
  }
}

// CPython's repr(float): the shortest digits that round-trip, in fixed notation
// for decimal exponents -4 <= e < 16 and scientific notation otherwise.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf: [-]d.ddde[+-]xx
  std::string s = buf;
  const bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  const size_t epos = s.find('e');
  const int exp10 = std::atoi(s.c_str() + epos + 1);
  std::string digits;
  for (size_t k = 0; k < epos; ++k)
    if (s[k] != '.') digits += s[k];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exp10 + 1;  // value = 0.digits * 10^decpt
  std::string out;
  if (d == 0) {
    out = "0.0";
  } else if (decpt <= -4 || decpt > 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  } else if (decpt <= 0) {
    out = "0." + std::string(-decpt, '0') + digits;
  } else if (decpt >= (int)digits.size()) {
    out = digits + std::string(decpt - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return neg ? "-" + out : out;
}

namespace {

// Python's str.isprintable() (CPython's tables, jinja_unicode.cpp).
bool printable(uint32_t c) {
  return unicode::is_printable(c);
}

std::string repr_string(const std::string& s) {
  const bool has_sq = s.find('\'') != std::string::npos;
  const bool has_dq = s.find('"') != std::string::npos;
  const char q = has_sq && !has_dq ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = next_cp(s, i);
    char buf[16];
    if (c == (uint32_t)q || c == '\\') {
      out += '\\';
      out += (char)c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c >= 0xdc80 && c <= 0xdcff) {
      std::snprintf(buf, sizeof buf, "\\udc%02x", c - 0xdc00);
      out += buf;
    } else if (!printable(c)) {
      if (c < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
      else if (c < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", c);
      out += buf;
    } else {
      append_utf8(out, c);
    }
  }
  out += q;
  return out;
}

}  // namespace

std::string repr(const Value& v) {
  switch (v.type) {
    case Value::Type::Undefined:
      return "Undefined";
    case Value::Type::String:
      return repr_string(v.s);
    case Value::Type::List: {
      if (v.list->lazy) return "<generator object>";
      const bool t = v.list->tuple;
      std::string out = t ? "(" : "[";
      for (size_t k = 0; k < v.list->items.size(); ++k) {
        if (k) out += ", ";
        out += repr(v.list->items[k]);
      }
      if (t && v.list->items.size() == 1) out += ",";
      return out + (t ? ")" : "]");
    }
    case Value::Type::Dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& kv : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr(kv.first) + ": " + repr(kv.second);
      }
      return out + "}";
    }
    case Value::Type::Namespace: {
      // A namespace can hold itself; Python prints the inner one as {...}.
      static thread_local std::vector<const DictObj*> active;
      if (std::find(active.begin(), active.end(), v.dict.get()) != active.end())
        return "<Namespace {...}>";
      if (active.size() >= static_cast<size_t>(kMaxNesting)) throw NestingError();
      active.push_back(v.dict.get());
      Value d = Value::new_dict();
      d.dict = v.dict;
      std::string r;
      try {
        r = "<Namespace " + repr(d) + ">";
      } catch (...) {
        active.pop_back();
        throw;
      }
      active.pop_back();
      return r;
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.type) {
    case Value::Type::Undefined:
      return "";
    case Value::Type::None:
      return "None";
    case Value::Type::Bool:
      return v.b ? "True" : "False";
    case Value::Type::Int:
      return std::to_string(v.i);
    case Value::Type::Float:
      return float_repr(v.f);
    case Value::Type::String:
      return v.s;
    case Value::Type::Callable:
      return "<function " + v.fn->name + ">";
    case Value::Type::Loop:
      return "<LoopContext " + std::to_string(v.loop->index0 + 1) + "/" +
             std::to_string(v.loop->items->size()) + ">";
    default:
      return repr(v);
  }
}

namespace {
double num(const Value& v) {
  return v.type == Value::Type::Float ? v.f
         : v.type == Value::Type::Int ? (double)v.i
                                      : (v.b ? 1 : 0);
}
int64_t inum(const Value& v) {
  return v.type == Value::Type::Int ? v.i : (v.b ? 1 : 0);
}
}  // namespace

bool hashable(const Value& v) {
  if (v.type == Value::Type::Dict) return false;
  if (v.type != Value::Type::List || v.list->lazy) return true;
  if (!v.list->tuple) return false;
  for (const auto& x : v.list->items)
    if (!hashable(x)) return false;
  return true;
}

bool py_equal(const Value& a, const Value& b) {
  using T = Value::Type;
  if (a.is_number() && b.is_number()) {
    if (a.type != T::Float && b.type != T::Float) return inum(a) == inum(b);
    return num(a) == num(b);
  }
  if (a.type != b.type) return false;
  switch (a.type) {
    case T::Undefined:
    case T::None:
      return true;
    case T::String:
      return a.s == b.s;
    case T::List: {
      if (a.list == b.list) return true;
      if (a.list->lazy || b.list->lazy) return false;
      if (a.list->tuple != b.list->tuple || a.list->items.size() != b.list->items.size())
        return false;
      for (size_t k = 0; k < a.list->items.size(); ++k)
        if (!py_equal(a.list->items[k], b.list->items[k])) return false;
      return true;
    }
    case T::Dict: {
      if (a.dict == b.dict) return true;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* o = b.dict->find(kv.first);
        if (!o || !py_equal(kv.second, *o)) return false;
      }
      return true;
    }
    case T::Namespace:
      return a.dict == b.dict;
    case T::Callable:
      return a.fn == b.fn;
    case T::Loop:
      return a.loop == b.loop;
    default:
      return false;
  }
}

namespace {


void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t c = next_cp(s, i);
    char buf[16];
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
          if (c >= 0x10000) {
            const uint32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (v >> 10),
                          0xdc00 + (v & 0x3ff));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
          }
          out += buf;
        } else {
          out.append(s, start, i - start);
        }
    }
  }
  out += '"';
}

struct JsonWriter {
  const std::string* indent;  // null: compact
  bool sort_keys;
  bool ensure_ascii;
  std::string item_sep, key_sep;
  std::string out;
  int depth = 0;
  size_t max_bytes = SIZE_MAX;

  void check_size() const {
    if (out.size() > max_bytes) throw std::runtime_error("the JSON text exceeds the output limit");
  }
  void newline(int level) {
    out += '\n';
    for (int k = 0; k < level; ++k) {
      out += *indent;
      check_size();
    }
  }

  std::string key_of(const Value& k) {
    switch (k.type) {
      case Value::Type::String:
        return k.s;
      case Value::Type::Int:
        return std::to_string(k.i);
      case Value::Type::Float:
        return float_repr(k.f);
      case Value::Type::Bool:
        return k.b ? "true" : "false";
      case Value::Type::None:
        return "null";
      default:
        throw std::runtime_error(std::string("keys must be str, int, float, bool or None, not ") +
                                 python_type_name(k));
    }
  }

  void write(const Value& v) {
    if (++depth > kMaxNesting) throw std::runtime_error("value nests too deeply");
    check_size();
    switch (v.type) {
      case Value::Type::None:
        out += "null";
        break;
      case Value::Type::Bool:
        out += v.b ? "true" : "false";
        break;
      case Value::Type::Int:
        out += std::to_string(v.i);
        break;
      case Value::Type::Float:
        if (std::isnan(v.f))
          out += "NaN";
        else if (std::isinf(v.f))
          out += v.f > 0 ? "Infinity" : "-Infinity";
        else
          out += float_repr(v.f);
        break;
      case Value::Type::String:
        json_string(out, v.s, ensure_ascii);
        break;
      case Value::Type::List: {
        if (v.list->lazy)
          throw std::runtime_error("Object of type generator is not JSON serializable");
        const auto& items = v.list->items;
        if (items.empty()) {
          out += "[]";
          break;
        }
        out += '[';
        for (size_t k = 0; k < items.size(); ++k) {
          if (k) out += item_sep;
          if (indent) newline(depth);
          write(items[k]);
        }
        if (indent) newline(depth - 1);
        out += ']';
        break;
      }
      case Value::Type::Dict: {
        std::vector<std::pair<std::string, const Value*>> items;
        for (const auto& kv : v.dict->items) items.emplace_back(key_of(kv.first), &kv.second);
        if (sort_keys)
          std::stable_sort(items.begin(), items.end(),
                           [](const auto& a, const auto& b) { return a.first < b.first; });
        if (items.empty()) {
          out += "{}";
          break;
        }
        out += '{';
        for (size_t k = 0; k < items.size(); ++k) {
          if (k) out += item_sep;
          if (indent) newline(depth);
          json_string(out, items[k].first, ensure_ascii);
          out += key_sep;
          write(*items[k].second);
        }
        if (indent) newline(depth - 1);
        out += '}';
        break;
      }
      default:
        throw std::runtime_error(std::string("Object of type ") + python_type_name(v) +
                                 " is not JSON serializable");
    }
    --depth;
  }
};

}  // namespace

std::string to_json(const Value& v, const std::string* indent, bool sort_keys, bool ensure_ascii,
                    const std::string* item_sep, const std::string* key_sep, size_t max_bytes) {
  JsonWriter w;
  w.max_bytes = max_bytes;
  w.indent = indent;
  w.sort_keys = sort_keys;
  w.ensure_ascii = ensure_ascii;
  w.item_sep = item_sep ? *item_sep : (indent ? "," : ", ");
  w.key_sep = key_sep ? *key_sep : ": ";
  w.write(v);
  w.check_size();
  return std::move(w.out);
}

// Python's type(v).__name__, for error messages that read like jinja2's.
const char* python_type_name(const Value& v) {
  switch (v.type) {
    case Value::Type::Undefined:
      return "Undefined";
    case Value::Type::None:
      return "NoneType";
    case Value::Type::Bool:
      return "bool";
    case Value::Type::Int:
      return "int";
    case Value::Type::Float:
      return "float";
    case Value::Type::String:
      return "str";
    case Value::Type::List:
      return v.list->lazy ? "generator" : v.list->tuple ? "tuple" : "list";
    case Value::Type::Dict:
      return "dict";
    case Value::Type::Namespace:
      return "Namespace";
    case Value::Type::Callable:
      return "function";
    case Value::Type::Loop:
      return "LoopContext";
  }
  return "object";
}

}  // namespace dory::jinja
