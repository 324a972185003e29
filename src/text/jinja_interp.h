// The Jinja interpreter's internals, shared by jinja_eval.cpp (statements and
// expressions) and jinja_builtins.cpp (filters, tests, methods, globals).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "text/jinja_ast.h"

namespace dory::jinja {

constexpr size_t kMaxItems = 10'000'000;  // elements of one list built by a template

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

struct LoopObj {
  std::shared_ptr<std::vector<Value>> items;
  size_t index0 = 0;
  bool has_changed = false;
  Value last_changed;
};

class Interp {
 public:
  explicit Interp(const Options& o) : opts(o) {}
  std::string run(const Template& t, const std::vector<std::pair<std::string, Value>>& globals);

  [[noreturn]] void fail(const std::string& msg) const;
  [[noreturn]] void fail_undefined(const Value& u) const;
  // Fails when a string about to be built from a template's number (a pad width, an indent,
  // a repeat) would pass the output limit: checking the result comes too late for 2^31.
  void check_size(int64_t n) const;
  // Counts a string just built toward the rendering's total (Limits::max_output).
  void count_built(size_t n);
  void step();

  Value call(const Value& fn, CallArgs& args);
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  Value apply_filter(const std::string& name, const Value& in, CallArgs& args);
  bool apply_test(const std::string& name, const Value& v, CallArgs& args);
  // Python's iter(): the items a for loop (or list()) sees.
  std::vector<Value> iterate(const Value& v);
  // Python's <, for sort/min/max and the comparison operators.
  bool less(const Value& a, const Value& b);
  // Python's binary operators (+ - * / // % ** and Jinja's ~).
  Value eval_binary(const std::string& op, const Value& a, const Value& b);
  // A macro kept in the scope it closes over, or a namespace holding itself,
  // makes a reference cycle; the interpreter breaks the cycles it tracked when
  // a rendering ends, so repeated renderings do not leak.
  void track(const ScopePtr& scope, const Value& v);
  void track_namespace(const Value& ns);

  const Options& opts;
  int line = 0;

 private:
  enum class Flow { Normal, Break, Continue };
  Flow exec(const Body& body, const ScopePtr& scope);
  Flow exec_stmt(const Stmt& s, const ScopePtr& scope);
  Flow exec_for(const Stmt& s, const ScopePtr& scope);
  void assign(const Target& t, const Value& v, const ScopePtr& scope);
  Value eval(const Expr& e, const ScopePtr& scope);
  bool compare(const std::string& op, const Value& a, const Value& b);
  Value make_macro(const std::shared_ptr<MacroDef>& m, const ScopePtr& closure);
  std::string render_body(const Body& body, const ScopePtr& scope, Flow* flow = nullptr);
  void emit(const std::string& s);

  void break_cycles();
  std::vector<std::weak_ptr<Scope>> tracked_scopes_;
  std::vector<std::weak_ptr<DictObj>> tracked_dicts_;
  size_t prune_at_ = 64;

  std::string* out_ = nullptr;
  uint64_t steps_ = 0;
  uint64_t built_ = 0;  // bytes of strings built so far
  int depth_ = 0;
  // Interpreter frames on the stack (expressions, statements, calls): a bound on
  // the stack a template can use however its recursion and nesting combine.
  int frames_ = 0;
  uintptr_t stack_top_ = 0;  // the stack address of the outermost frame
  friend struct FrameGuard;
  friend struct DepthGuard;
};

// Builtins (jinja_builtins.cpp).
Value builtin_filter(Interp& in, const std::string& name, const Value& v, CallArgs& args);
bool builtin_test(Interp& in, const std::string& name, const Value& v, CallArgs& args);
// A bound method of a str, dict or list (Python's own methods), or undefined.
Value builtin_method(Interp& in, const Value& self, const std::string& name);
void add_builtin_globals(Scope& scope, const Options& opts);

}  // namespace dory::jinja
