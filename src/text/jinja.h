// A small Jinja interpreter: the subset of the Jinja2 language that Hugging Face
// chat templates use, with the semantics of Python's jinja2 as transformers
// configures it (trim_blocks, lstrip_blocks, loop controls, no autoescape, an
// immutable sandbox: templates read their inputs and never mutate them).
//
// No Jinja library for C++ is packaged for Debian 12, hence this one. The aim is
// character-for-character parity with jinja2 on real templates; where a feature
// is missing the template gets a clean error naming its line, never a crash.
#pragma once
#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dory::jinja {

struct ListObj;
struct DictObj;
struct Callable;
struct LoopObj;

// A template value: Python's types as templates see them. Lists, dicts and
// namespaces are shared by reference, like Python objects.
struct Value {
  enum class Type {
    Undefined,
    None,
    Bool,
    Int,
    Float,
    String,
    List,
    Dict,
    Namespace,
    Callable,
    Loop
  };
  Type type = Type::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String; for Undefined, what was looked up (for error messages)
  std::shared_ptr<ListObj> list;
  std::shared_ptr<DictObj> dict;  // Dict and Namespace
  std::shared_ptr<Callable> fn;
  std::shared_ptr<LoopObj> loop;

  static Value undefined(std::string what = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value new_list(std::vector<Value> items = {}, bool tuple = false);
  static Value new_dict();
  static Value new_namespace();

  bool is_undefined() const { return type == Type::Undefined; }
  bool is_none() const { return type == Type::None; }
  bool is_string() const { return type == Type::String; }
  bool is_list() const { return type == Type::List; }
  bool is_dict() const { return type == Type::Dict; }
  bool is_number() const { return type == Type::Int || type == Type::Float || type == Type::Bool; }
};

// Values nest at most this deep, so that printing, comparing, serializing and
// freeing them (all recursive) stay far from the stack's end. Deeper nesting
// throws NestingError.
constexpr int kMaxNesting = 512;
struct NestingError : std::runtime_error {
  NestingError() : std::runtime_error("a value nests more than 512 levels deep") {}
};
int nesting(const Value& v);

struct ListObj {
  std::vector<Value> items;
  bool tuple = false;  // a tuple literal: printed as (a, b)
  // A generator (what jinja2's map, select, unique, items, batch and reverse
  // return): always truthy, no len(), not subscriptable, and iterable once.
  bool lazy = false;
  bool consumed = false;
  std::string deferred_error;  // raised when the generator is iterated
  int depth = 1;
};

// An insertion-ordered dict (Python 3.7+ semantics).
struct DictObj {
  std::vector<std::pair<Value, Value>> items;
  int depth = 1;
  bool tracked = false;  // a namespace the interpreter clears after rendering
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  void set(const Value& key, Value v);  // replaces an equal key's value
  void append(Value key, Value v);      // the key is known to be new
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

class Interp;
struct Callable {
  std::string name;
  std::function<Value(Interp&, CallArgs&)> call;
};

// Python-compatible conversions, shared by the interpreter and the tests.
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(v)
std::string repr(const Value& v);    // repr(v)
std::string float_repr(double d);    // repr(float)
bool py_equal(const Value& a, const Value& b);
bool hashable(const Value& v);  // may be a dict key or a set member
const char* python_type_name(const Value& v);  // type(v).__name__
// json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...); a null
// indent is compact. Throws std::runtime_error for values JSON cannot hold, and as soon as
// the text passes max_bytes (an indent or separator times many items can be huge).
std::string to_json(const Value& v, const std::string* indent, bool sort_keys, bool ensure_ascii,
                    const std::string* item_sep, const std::string* key_sep,
                    size_t max_bytes = SIZE_MAX);

// C strftime with Python's behaviour for long results (no 512-byte cut).
std::string format_time(const std::string& fmt, const struct tm& tm);

struct Template;  // the parsed form, opaque

// Limits that keep a runaway template from taking the process down.
struct Limits {
  // Bytes of rendered text. A rendering may also build at most 16 times this in strings
  // all told (concatenations, repeats, filter and call results), so that a loop of big
  // concatenations ends in seconds, not hours.
  size_t max_output = 64u << 20;
  int max_depth = 200;             // nested macro calls / block nesting
  uint64_t max_steps = 5'000'000;  // loop iterations + macro calls
};

struct Options {
  Limits limits;
  std::function<std::string(const std::string&)> strftime_now;  // null: the local clock
};

std::shared_ptr<const Template> parse(const std::string& source);  // throws dory::Error
// globals: name -> value, the render context. Throws dory::Error.
std::string render(const Template& t, const std::vector<std::pair<std::string, Value>>& globals,
                   const Options& options);

}  // namespace dory::jinja
