// The Jinja interpreter: statements, expressions, scoping, macros. Scoping
// follows jinja2: a for loop gives every iteration a fresh scope (a `set` inside
// a loop is gone at the next iteration and after the loop, hence namespace()),
// `if` shares its enclosing scope, and a macro sees its defining scope as it is
// when the macro is called.
#include <algorithm>
#include <cmath>

#include "dory/error.h"
#include "text/jinja_interp.h"
#include "text/jinja_util.h"

namespace dory::jinja {

namespace {

ScopePtr child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

// A new frame: its predeclared names start undefined (see Stmt::predeclared).
ScopePtr frame(const ScopePtr& parent, const std::vector<std::string>& predeclared) {
  auto s = child(parent);
  for (const auto& n : predeclared) s->vars[n] = Value::undefined("'" + n + "' is undefined");
  return s;
}

}  // namespace

struct DepthGuard {
  Interp& in;
  explicit DepthGuard(Interp& i) : in(i) {
    if (++in.depth_ > in.opts.limits.max_depth)
      in.fail("recursion too deep (more than " + std::to_string(in.opts.limits.max_depth) +
              " nested calls)");
  }
  ~DepthGuard() { --in.depth_; }
};

// Interpreter frames: at most kMaxFrames (about 1 KB of stack each in a release
// build, eval's frame being the largest), and at most kMaxStack bytes of the
// thread's stack (8 MB) however large the frames are: several times larger
// under AddressSanitizer or without optimization.
constexpr int kMaxFrames = 3000;
constexpr uintptr_t kMaxStack = uintptr_t(4) << 20;
struct FrameGuard {
  Interp& in;
  explicit FrameGuard(Interp& i) : in(i) {
    const auto sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
    if (in.frames_ == 0) in.stack_top_ = sp;
    if (in.frames_ + 1 > kMaxFrames || (in.stack_top_ > sp && in.stack_top_ - sp > kMaxStack))
      in.fail("the template nests or recurses too deeply");
    ++in.frames_;
  }
  ~FrameGuard() { --in.frames_; }
};

void Interp::fail(const std::string& msg) const {
  throw Error("chat template line " + std::to_string(line) + ": " + one_line(msg));
}

void Interp::check_size(int64_t n) const {
  if (n > 0 && static_cast<uint64_t>(n) > opts.limits.max_output)
    fail("a string exceeds the output limit");
}

void Interp::count_built(size_t n) {
  built_ += n;
  if (built_ / 16 > opts.limits.max_output)
    fail("the template built more than " + std::to_string(16 * uint64_t(opts.limits.max_output)) +
         " bytes of strings (a runaway template?)");
}

void Interp::fail_undefined(const Value& u) const {
  fail(u.s.empty() ? std::string("value is undefined") : u.s);
}

void Interp::step() {
  if (++steps_ > opts.limits.max_steps)
    fail("the template ran more than " + std::to_string(opts.limits.max_steps) +
         " loop iterations and calls (a runaway template?)");
}

void Interp::track(const ScopePtr& scope, const Value& v) {
  // Only these can lead back to the scope; strings and numbers cannot.
  if (v.type != Value::Type::Callable && v.type != Value::Type::List &&
      v.type != Value::Type::Dict && v.type != Value::Type::Namespace)
    return;
  tracked_scopes_.push_back(scope);
  if (tracked_scopes_.size() >= prune_at_) {
    tracked_scopes_.erase(std::remove_if(tracked_scopes_.begin(), tracked_scopes_.end(),
                                         [](const auto& w) { return w.expired(); }),
                          tracked_scopes_.end());
    prune_at_ = std::max<size_t>(64, 2 * tracked_scopes_.size());
  }
}

void Interp::track_namespace(const Value& ns) {
  if (ns.dict->tracked) return;
  ns.dict->tracked = true;
  tracked_dicts_.push_back(ns.dict);
}

void Interp::break_cycles() {
  for (auto& w : tracked_dicts_)
    if (auto d = w.lock()) d->items.clear();
  for (auto& w : tracked_scopes_)
    if (auto s = w.lock()) s->vars.clear();
  tracked_dicts_.clear();
  tracked_scopes_.clear();
}

void Interp::emit(const std::string& s) {
  out_->append(s);
  if (out_->size() > opts.limits.max_output)
    fail("the rendering exceeds " + std::to_string(opts.limits.max_output) + " bytes");
}

std::string Interp::run(const Template& t,
                        const std::vector<std::pair<std::string, Value>>& globals) {
  auto builtins = std::make_shared<Scope>();
  add_builtin_globals(*builtins, opts);
  auto g = child(builtins);
  for (const auto& kv : globals) g->vars[kv.first] = kv.second;
  auto top = frame(g, t.predeclared);
  std::string out;
  out_ = &out;
  try {
    exec(t.body, top);
  } catch (const NestingError& e) {
    break_cycles();
    fail(e.what());  // `line` is where the value was being built
  } catch (...) {
    break_cycles();
    throw;
  }
  break_cycles();
  return out;
}

std::string Interp::render_body(const Body& body, const ScopePtr& scope, Flow* flow) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    const Flow f = exec(body, scope);
    if (flow) *flow = f;
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

Interp::Flow Interp::exec(const Body& body, const ScopePtr& scope) {
  for (const auto& s : body) {
    const Flow f = exec_stmt(*s, scope);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

void Interp::assign(const Target& t, const Value& v, const ScopePtr& scope) {
  if (!t.tuple) {
    scope->vars[t.names[0]] = v;
    track(scope, v);
    return;
  }
  std::vector<Value> items = iterate(v);
  if (items.size() < t.names.size())
    fail("not enough values to unpack (expected " + std::to_string(t.names.size()) + ", got " +
         std::to_string(items.size()) + ")");
  if (items.size() > t.names.size())
    fail("too many values to unpack (expected " + std::to_string(t.names.size()) + ")");
  for (size_t k = 0; k < items.size(); ++k) {
    scope->vars[t.names[k]] = items[k];
    track(scope, items[k]);
  }
}

namespace {
// The filters of a chain `x | f | g` from the innermost out; the innermost
// input is absent (a filter block or block set supplies it).
std::vector<const Expr*> filter_chain(const Expr* e) {
  std::vector<const Expr*> chain;
  for (; e && e->kind == Expr::Kind::Filter; e = e->args[0].get()) chain.push_back(e);
  std::reverse(chain.begin(), chain.end());
  return chain;
}
}  // namespace

Interp::Flow Interp::exec_stmt(const Stmt& s, const ScopePtr& scope) {
  FrameGuard frame_guard(*this);
  line = s.line;
  switch (s.kind) {
    case Stmt::Kind::Text:
      emit(s.text);
      break;
    case Stmt::Kind::Print: {
      const Value v = eval(*s.expr, scope);
      emit(to_str(v));
      break;
    }
    case Stmt::Kind::If:
      for (const auto& br : s.branches)
        if (truthy(eval(*br.first, scope))) return exec(br.second, scope);
      return exec(s.else_body, scope);
    case Stmt::Kind::For:
      return exec_for(s, scope);
    case Stmt::Kind::Set: {
      const Value v = eval(*s.expr, scope);
      line = s.line;
      if (!s.target.ns_attr.empty()) {
        const Value* ns = scope->lookup(s.target.names[0]);
        if (!ns || ns->type != Value::Type::Namespace)
          fail("cannot assign attribute on non-namespace object");
        ns->dict->set(Value::string(s.target.ns_attr), v);
        track_namespace(*ns);
      } else {
        assign(s.target, v, scope);
      }
      break;
    }
    case Stmt::Kind::SetBlock: {
      // The body runs inline in jinja2: a break or continue in it leaves the
      // loop around it, and the assignment does not happen.
      Flow flow = Flow::Normal;
      Value v = Value::string(render_body(s.body, frame(scope, s.predeclared), &flow));
      if (flow != Flow::Normal) return flow;
      for (const Expr* f : filter_chain(s.filter.get())) {
        CallArgs a;
        for (size_t k = 1; k < f->args.size(); ++k) a.pos.push_back(eval(*f->args[k], scope));
        for (const auto& kv : f->kwargs) a.kw.emplace_back(kv.first, eval(*kv.second, scope));
        line = f->line;
        v = apply_filter(f->name, v, a);
      }
      assign(s.target, v, scope);
      break;
    }
    case Stmt::Kind::Macro:
      scope->vars[s.macro->name] = make_macro(s.macro, scope);
      track(scope, scope->vars[s.macro->name]);
      break;
    case Stmt::Kind::CallBlock: {
      const Expr& call = *s.expr;
      Value fn = eval(*call.args[0], scope);
      CallArgs a;
      for (size_t k = 1; k < call.args.size(); ++k) a.pos.push_back(eval(*call.args[k], scope));
      for (const auto& kv : call.kwargs) a.kw.emplace_back(kv.first, eval(*kv.second, scope));
      a.kw.emplace_back("caller", make_macro(s.macro, scope));
      line = s.line;
      emit(to_str(this->call(fn, a)));
      break;
    }
    case Stmt::Kind::FilterBlock: {
      Flow flow = Flow::Normal;
      Value v = Value::string(render_body(s.body, frame(scope, s.predeclared), &flow));
      if (flow != Flow::Normal) return flow;
      for (const Expr* f : filter_chain(s.filter.get())) {
        CallArgs a;
        for (size_t k = 1; k < f->args.size(); ++k) a.pos.push_back(eval(*f->args[k], scope));
        for (const auto& kv : f->kwargs) a.kw.emplace_back(kv.first, eval(*kv.second, scope));
        line = f->line;
        v = apply_filter(f->name, v, a);
      }
      emit(to_str(v));
      break;
    }
    case Stmt::Kind::Break:
      return Flow::Break;
    case Stmt::Kind::Continue:
      return Flow::Continue;
    case Stmt::Kind::With: {
      auto inner = frame(scope, s.predeclared);
      for (const auto& kv : s.with_vars) inner->vars[kv.first] = eval(*kv.second, scope);
      return exec(s.body, inner);
    }
    case Stmt::Kind::Scope:
      return exec(s.body, frame(scope, s.predeclared));
  }
  return Flow::Normal;
}

Interp::Flow Interp::exec_for(const Stmt& s, const ScopePtr& scope) {
  const Value seq = eval(*s.expr, scope);
  line = s.line;
  std::vector<Value> items = iterate(seq);
  if (s.cond) {
    // `for x in xs if cond`: jinja2 filters before counting, so loop.length and
    // loop.index see only the kept items.
    std::vector<Value> kept;
    for (auto& it : items) {
      step();
      auto sc = child(scope);  // the body's predeclared names are not in scope here
      assign(s.target, it, sc);
      if (truthy(eval(*s.cond, sc))) kept.push_back(std::move(it));
    }
    items = std::move(kept);
  }
  // jinja2 clears its "no iteration" flag at the end of the body, so the else
  // block also runs when every iteration left through break or continue.
  bool completed = false;
  auto loop = std::make_shared<LoopObj>();
  loop->items = std::make_shared<std::vector<Value>>(std::move(items));
  Value lv;
  lv.type = Value::Type::Loop;
  lv.loop = loop;
  for (size_t k = 0; k < loop->items->size(); ++k) {
    step();
    loop->index0 = k;
    auto sc = frame(scope, s.predeclared);
    sc->vars["loop"] = lv;
    line = s.line;
    assign(s.target, (*loop->items)[k], sc);
    const Flow f = exec(s.body, sc);
    if (f == Flow::Break) break;
    if (f == Flow::Normal) completed = true;
  }
  // The else block is not inside the loop: a break or continue there is the
  // enclosing loop's.
  if (!completed && !s.else_body.empty())
    return exec(s.else_body, frame(scope, s.else_predeclared));
  return Flow::Normal;
}

Value Interp::make_macro(const std::shared_ptr<MacroDef>& m, const ScopePtr& closure) {
  Value v;
  v.type = Value::Type::Callable;
  v.fn = std::make_shared<Callable>();
  v.fn->name = m->name;
  v.fn->call = [m, closure](Interp& in, CallArgs& args) -> Value {
    in.step();
    DepthGuard guard(in);
    const int call_line = in.line;
    auto sc = frame(closure, m->predeclared);  // then the parameters, which win
    const size_t np = m->params.size();
    std::vector<bool> bound(np, false);
    std::vector<Value> varargs;
    for (size_t k = 0; k < args.pos.size(); ++k) {
      if (k < np) {
        sc->vars[m->params[k]] = args.pos[k];
        bound[k] = true;
      } else if (m->uses_varargs) {
        varargs.push_back(args.pos[k]);
      } else {
        in.fail("macro '" + m->name + "' takes not more than " + std::to_string(np) +
                " argument(s)");
      }
    }
    Value kwargs = Value::new_dict();
    bool caller_given = false;
    for (auto& kv : args.kw) {
      auto it = std::find(m->params.begin(), m->params.end(), kv.first);
      if (it != m->params.end()) {
        const size_t k = it - m->params.begin();
        if (bound[k])
          in.fail("macro '" + m->name + "' got multiple values for argument '" + kv.first + "'");
        sc->vars[kv.first] = kv.second;
        bound[k] = true;
      } else if (kv.first == "caller" && m->uses_caller) {
        sc->vars["caller"] = kv.second;
        caller_given = true;
      } else if (m->uses_kwargs) {
        kwargs.dict->set(Value::string(kv.first), kv.second);
      } else {
        in.fail("macro '" + m->name + "' takes no keyword argument '" + kv.first + "'");
      }
    }
    const size_t first_default = np - m->defaults.size();
    for (size_t k = 0; k < np; ++k) {
      if (bound[k]) continue;
      if (k >= first_default)
        sc->vars[m->params[k]] = in.eval(*m->defaults[k - first_default], sc);
      else
        sc->vars[m->params[k]] =
            Value::undefined("parameter '" + m->params[k] + "' was not provided");
    }
    if (m->uses_varargs) sc->vars["varargs"] = Value::new_list(std::move(varargs), true);
    if (m->uses_kwargs) sc->vars["kwargs"] = kwargs;
    if (m->uses_caller && !caller_given) sc->vars["caller"] = Value::undefined("No caller defined");
    std::string out = in.render_body(m->body, sc);
    in.line = call_line;
    return Value::string(std::move(out));
  };
  return v;
}

Value Interp::call(const Value& fn, CallArgs& args) {
  if (fn.type == Value::Type::Callable) {
    Value r = fn.fn->call(*this, args);
    if (r.is_string()) count_built(r.s.size());
    return r;
  }
  if (fn.is_undefined()) fail_undefined(fn);
  fail(std::string("'") + python_type_name(fn) + "' object is not callable");
}

std::vector<Value> Interp::iterate(const Value& v) {
  switch (v.type) {
    case Value::Type::Undefined:
      return {};
    case Value::Type::List:
      if (v.list->lazy) {  // a generator runs once
        if (!v.list->deferred_error.empty()) throw Error(v.list->deferred_error);
        if (v.list->consumed) return {};
        v.list->consumed = true;
      }
      return v.list->items;
    case Value::Type::Dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Type::String: {
      std::vector<Value> chars;
      for (size_t i = 0; i < v.s.size();) {
        const size_t b = i;
        next_cp(v.s, i);
        chars.push_back(Value::string(v.s.substr(b, i - b)));
      }
      return chars;
    }
    case Value::Type::Loop:
      return *v.loop->items;
    default:
      fail(std::string("'") + python_type_name(v) + "' object is not iterable");
  }
}

Value Interp::getattr(const Value& obj, const std::string& name) {
  switch (obj.type) {
    case Value::Type::Undefined:
      fail_undefined(obj);
    case Value::Type::Dict: {
      Value m = builtin_method(*this, obj, name);
      if (!(m.is_undefined() && m.s.empty())) return m;
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Value::Type::Namespace:
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'Namespace' object has no attribute '" + name + "'");
    case Value::Type::Loop: {
      const LoopObj& l = *obj.loop;
      const int64_t n = static_cast<int64_t>(l.items->size());
      const int64_t i = static_cast<int64_t>(l.index0);
      if (name == "index") return Value::integer(i + 1);
      if (name == "index0") return Value::integer(i);
      if (name == "revindex") return Value::integer(n - i);
      if (name == "revindex0") return Value::integer(n - i - 1);
      if (name == "first") return Value::boolean(i == 0);
      if (name == "last") return Value::boolean(i == n - 1);
      if (name == "length") return Value::integer(n);
      if (name == "depth") return Value::integer(1);
      if (name == "depth0") return Value::integer(0);
      if (name == "previtem")
        return i > 0 ? (*l.items)[i - 1] : Value::undefined("there is no previous item");
      if (name == "nextitem")
        return i + 1 < n ? (*l.items)[i + 1] : Value::undefined("there is no next item");
      if (name == "cycle" || name == "changed") {
        Value f;
        f.type = Value::Type::Callable;
        f.fn = std::make_shared<Callable>();
        f.fn->name = "loop." + name;
        auto lp = obj.loop;
        if (name == "cycle") {
          f.fn->call = [lp](Interp& in, CallArgs& a) -> Value {
            if (a.pos.empty()) in.fail("no items for cycling given");
            return a.pos[lp->index0 % a.pos.size()];
          };
        } else {
          f.fn->call = [lp](Interp&, CallArgs& a) -> Value {
            Value cur = Value::new_list(a.pos, true);
            if (lp->has_changed && py_equal(cur, lp->last_changed)) return Value::boolean(false);
            lp->has_changed = true;
            lp->last_changed = cur;
            return Value::boolean(true);
          };
        }
        return f;
      }
      return Value::undefined("'LoopContext' object has no attribute '" + name + "'");
    }
    case Value::Type::String:
    case Value::Type::List: {
      Value m = builtin_method(*this, obj, name);
      if (!(m.is_undefined() && m.s.empty())) return m;
      break;
    }
    case Value::Type::Bool:
    case Value::Type::Int:
      // Python's int attributes (bool is an int).
      if (name == "real" || name == "numerator")
        return Value::integer(obj.type == Value::Type::Int ? obj.i : obj.b);
      if (name == "imag") return Value::integer(0);
      if (name == "denominator") return Value::integer(1);
      break;
    case Value::Type::Float:
      if (name == "real") return obj;
      if (name == "imag") return Value::number(0.0);
      break;
    default:
      break;
  }
  return Value::undefined(std::string("'") + python_type_name(obj) + " object' has no attribute '" + name +
                          "'");
}

Value Interp::getitem(const Value& obj, const Value& key) {
  switch (obj.type) {
    case Value::Type::Undefined:
      fail_undefined(obj);
    case Value::Type::Dict:
      if (const Value* v = obj.dict->find(key)) return *v;
      if (key.is_string()) {
        Value m = builtin_method(*this, obj, key.s);
        if (!(m.is_undefined() && m.s.empty())) return m;
      }
      return Value::undefined("'dict object' has no attribute " + repr(key));
    case Value::Type::List:
    case Value::Type::String: {
      if (obj.is_list() && obj.list->lazy)
        return Value::undefined("'generator' object is not subscriptable");
      if (key.type == Value::Type::Int || key.type == Value::Type::Bool) {
        int64_t i = key.type == Value::Type::Int ? key.i : key.b;
        if (obj.is_list()) {
          const int64_t n = static_cast<int64_t>(obj.list->items.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return obj.list->items[i];
        } else {
          const std::vector<uint32_t> cps = to_cps(obj.s);
          const int64_t n = static_cast<int64_t>(cps.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value::string(from_cps(cps, i, i + 1));
        }
        return Value::undefined(std::string("'") + python_type_name(obj) + " object' has no element " +
                                std::to_string(key.type == Value::Type::Int ? key.i : key.b));
      }
      if (key.is_string()) return getattr(obj, key.s);
      break;
    }
    case Value::Type::Namespace:
    case Value::Type::Loop:
      if (key.is_string()) return getattr(obj, key.s);
      break;
    default:
      break;
  }
  return Value::undefined(std::string("'") + python_type_name(obj) + " object' has no element " + repr(key));
}

bool Interp::less(const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.type != Value::Type::Float && b.type != Value::Type::Float) {
      const int64_t x = a.type == Value::Type::Int ? a.i : a.b,
                    y = b.type == Value::Type::Int ? b.i : b.b;
      return x < y;
    }
    const double x = a.type == Value::Type::Float ? a.f
                     : a.type == Value::Type::Int ? (double)a.i
                                                  : a.b;
    const double y = b.type == Value::Type::Float ? b.f
                     : b.type == Value::Type::Int ? (double)b.i
                                                  : b.b;
    return x < y;
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;  // UTF-8 byte order is code point order
  if (a.is_list() && b.is_list() && a.list->tuple == b.list->tuple && !a.list->lazy &&
      !b.list->lazy) {
    const auto& x = a.list->items;
    const auto& y = b.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (py_equal(x[k], y[k])) continue;
      return less(x[k], y[k]);
    }
    return x.size() < y.size();
  }
  fail(std::string("'<' not supported between instances of '") + python_type_name(a) + "' and '" + python_type_name(b) +
       "'");
}

bool Interp::compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return py_equal(a, b);
  if (op == "!=") return !py_equal(a, b);
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") return less(a, b) || py_equal(a, b);
  if (op == ">=") return less(b, a) || py_equal(a, b);
  // in / not in
  bool found = false;
  switch (b.type) {
    case Value::Type::Undefined:
      found = false;
      break;
    case Value::Type::String:
      if (!a.is_string())
        fail(std::string("'in <string>' requires string as left operand, not ") + python_type_name(a));
      found = b.s.find(a.s) != std::string::npos;
      break;
    case Value::Type::List:
      for (const auto& x : iterate(b))
        if (py_equal(x, a)) {
          found = true;
          break;
        }
      break;
    case Value::Type::Dict:
      if (!hashable(a)) fail(std::string("unhashable type: '") + python_type_name(a) + "'");
      found = b.dict->find(a) != nullptr;
      break;
    case Value::Type::Loop:
      for (const auto& x : *b.loop->items)
        if (py_equal(x, a)) found = true;
      break;
    default:
      fail(std::string("argument of type '") + python_type_name(b) + "' is not iterable");
  }
  return op == "in" ? found : !found;
}

namespace {
bool as_int(const Value& v, int64_t& out) {
  if (v.type == Value::Type::Int)
    out = v.i;
  else if (v.type == Value::Type::Bool)
    out = v.b;
  else
    return false;
  return true;
}
double as_float(const Value& v) {
  return v.type == Value::Type::Float ? v.f
         : v.type == Value::Type::Int ? (double)v.i
                                      : (double)v.b;
}
}  // namespace

std::string py_percent_format(Interp& in, const std::string& fmt, const Value& args);

Value Interp::eval_binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = to_str(a) + to_str(b);
    if (s.size() > opts.limits.max_output) fail("a string exceeds the output limit");
    count_built(s.size());
    return Value::string(std::move(s));
  }
  // str % args: an undefined args is like any other object there (jinja2's Undefined
  // has __getitem__, so CPython even takes it for a mapping).
  if (op == "%" && a.is_string()) return Value::string(py_percent_format(*this, a.s, b));
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if ((a.is_list() && a.list->lazy) || (b.is_list() && b.list->lazy)) {
    fail("unsupported operand type(s) for " + op + ": '" + python_type_name(a) + "' and '" + python_type_name(b) + "'");
  }
  int64_t x = 0, y = 0;
  const bool ints = as_int(a, x) && as_int(b, y);
  const bool nums = a.is_number() && b.is_number();
  auto bad = [&]() -> Value {
    fail("unsupported operand type(s) for " + op + ": '" + python_type_name(a) + "' and '" + python_type_name(b) + "'");
  };
  auto overflow = [&]() -> Value { fail("integer overflow in '" + op + "'"); };
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(x, y, &r)) return overflow();
      return Value::integer(r);
    }
    if (nums) return Value::number(as_float(a) + as_float(b));
    if (a.is_string() && b.is_string()) {
      if (a.s.size() + b.s.size() > opts.limits.max_output)
        fail("a string exceeds the output limit");
      count_built(a.s.size() + b.s.size());
      return Value::string(a.s + b.s);
    }
    if (a.is_list() && b.is_list() && a.list->tuple == b.list->tuple) {
      if (a.list->items.size() + b.list->items.size() > kMaxItems) fail("a list grows too long");
      std::vector<Value> r = a.list->items;
      r.insert(r.end(), b.list->items.begin(), b.list->items.end());
      return Value::new_list(std::move(r), a.list->tuple);
    }
    if (a.is_string())
      fail(std::string("can only concatenate str (not \"") + python_type_name(b) + "\") to str");
    return bad();
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(x, y, &r)) return overflow();
      return Value::integer(r);
    }
    if (nums) return Value::number(as_float(a) - as_float(b));
    return bad();
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(x, y, &r)) return overflow();
      return Value::integer(r);
    }
    if (nums) return Value::number(as_float(a) * as_float(b));
    const Value* seq = nullptr;
    int64_t times = 0;
    if ((a.is_string() || a.is_list()) && as_int(b, times))
      seq = &a;
    else if ((b.is_string() || b.is_list()) && as_int(a, times))
      seq = &b;
    if (!seq) return bad();
    if (times < 0) times = 0;
    if (seq->is_string()) {
      if (times && seq->s.size() > opts.limits.max_output / times)
        fail("a string exceeds the output limit");
      count_built(seq->s.size() * static_cast<uint64_t>(times));
      std::string r;
      for (int64_t k = 0; k < times; ++k) r += seq->s;
      return Value::string(std::move(r));
    }
    if (times && seq->list->items.size() > kMaxItems / times) fail("a list grows too long");
    std::vector<Value> r;
    for (int64_t k = 0; k < times; ++k)
      r.insert(r.end(), seq->list->items.begin(), seq->list->items.end());
    return Value::new_list(std::move(r), seq->list->tuple);
  }
  if (op == "/") {
    if (!nums) return bad();
    if (as_float(b) == 0) fail("division by zero");
    return Value::number(as_float(a) / as_float(b));
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return Value::string(py_percent_format(*this, a.s, b));
    if (!nums) return bad();
    if (ints) {
      if (y == 0)
        fail(op == "//" ? "integer division or modulo by zero" : "integer modulo by zero");
      if (x == INT64_MIN && y == -1) return op == "//" ? overflow() : Value::integer(0);
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        q -= 1;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    const double fa = as_float(a), fb = as_float(b);
    if (fb == 0) fail("float division by zero");
    double m = std::fmod(fa, fb);
    if (m != 0 && ((m < 0) != (fb < 0))) m += fb;
    if (op == "%") return Value::number(m == 0 ? std::copysign(0.0, fb) : m);
    double q = (fa - m) / fb;
    if (q != 0) {
      double fq = std::floor(q);
      if (q - fq > 0.5) fq += 1;
      q = fq;
    } else {
      q = std::copysign(0.0, fa / fb);
    }
    return Value::number(q);
  }
  if (op == "**") {
    if (ints && y >= 0) {
      int64_t r = 1, base = x;
      for (int64_t e = y; e > 0; e >>= 1) {
        if (e & 1)
          if (__builtin_mul_overflow(r, base, &r)) return overflow();
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow();
      }
      return Value::integer(r);
    }
    if (!nums) return bad();
    if (as_float(a) == 0 && as_float(b) < 0) fail("0.0 cannot be raised to a negative power");
    return Value::number(std::pow(as_float(a), as_float(b)));
  }
  return bad();
}

namespace {
// Python's slice.indices() and the items it selects.
bool slice_bounds(const Value& v, int64_t& out, bool& given) {
  given = false;
  if (v.is_none() || v.is_undefined()) return true;
  if (!as_int(v, out)) return false;
  given = true;
  return true;
}
}  // namespace

Value Interp::eval(const Expr& e, const ScopePtr& scope) {
  FrameGuard frame_guard(*this);
  line = e.line;
  switch (e.kind) {
    case Expr::Kind::Const:
      return e.value;
    case Expr::Kind::Name: {
      if (const Value* v = scope->lookup(e.name)) return *v;
      return Value::undefined("'" + e.name + "' is undefined");
    }
    case Expr::Kind::List: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) items.push_back(eval(*a, scope));
      return Value::new_list(std::move(items), e.flag);
    }
    case Expr::Kind::Dict: {
      Value d = Value::new_dict();
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        Value key = eval(*e.args[k], scope);
        Value val = eval(*e.args[k + 1], scope);
        if (!hashable(key)) {
          line = e.line;
          fail(std::string("unhashable type: '") + python_type_name(key) + "'");
        }
        d.dict->set(key, std::move(val));
      }
      return d;
    }
    case Expr::Kind::Getattr: {
      Value obj = eval(*e.args[0], scope);
      line = e.line;
      return getattr(obj, e.name);
    }
    case Expr::Kind::Getitem: {
      Value obj = eval(*e.args[0], scope);
      Value key = eval(*e.args[1], scope);
      line = e.line;
      return getitem(obj, key);
    }
    case Expr::Kind::Slice: {
      Value obj = eval(*e.args[0], scope);
      Value parts[3];
      for (int k = 0; k < 3; ++k)
        if (e.args[k + 1]) parts[k] = eval(*e.args[k + 1], scope);
      line = e.line;
      if (obj.is_undefined()) fail_undefined(obj);
      // jinja2 slices with Python's [] directly (not environment.getitem), so a
      // value that cannot be sliced is an error rather than undefined.
      if (obj.is_dict()) fail("unhashable type: 'slice'");
      if ((!obj.is_list() && !obj.is_string()) || (obj.is_list() && obj.list->lazy))
        fail(std::string("'") + python_type_name(obj) + "' object is not subscriptable");
      int64_t start = 0, stop = 0, stp = 1;
      bool has_start, has_stop, has_step;
      if (!slice_bounds(parts[0], start, has_start) || !slice_bounds(parts[1], stop, has_stop) ||
          !slice_bounds(parts[2], stp, has_step))
        fail("slice indices must be integers or None or have an __index__ method");
      if (!has_step) stp = 1;
      if (stp == 0) fail("slice step cannot be zero");
      std::vector<uint32_t> cps;
      if (obj.is_string()) cps = to_cps(obj.s);
      const int64_t n = obj.is_string() ? (int64_t)cps.size() : (int64_t)obj.list->items.size();
      auto adjust = [&](int64_t& i, bool given, bool is_start) {
        if (!given) {
          i = stp < 0 ? (is_start ? n - 1 : -1) : (is_start ? 0 : n);
          return;
        }
        if (i < 0) {
          i += n;
          if (i < 0) i = stp < 0 ? -1 : 0;
        } else if (i >= n) {
          i = stp < 0 ? n - 1 : n;
        }
      };
      adjust(start, has_start, true);
      adjust(stop, has_stop, false);
      std::vector<int64_t> idx;
      if (stp > 0)
        for (int64_t i = start; i < stop; i += stp) idx.push_back(i);
      else
        for (int64_t i = start; i > stop; i += stp) idx.push_back(i);
      if (obj.is_string()) {
        std::string r;
        for (int64_t i : idx) append_cp(r, cps[i]);
        return Value::string(std::move(r));
      }
      std::vector<Value> r;
      for (int64_t i : idx) r.push_back(obj.list->items[i]);
      return Value::new_list(std::move(r), obj.list->tuple);
    }
    case Expr::Kind::Call: {
      Value fn = eval(*e.args[0], scope);
      CallArgs a;
      for (size_t k = 1; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], scope));
      for (const auto& kv : e.kwargs) a.kw.emplace_back(kv.first, eval(*kv.second, scope));
      line = e.line;
      return call(fn, a);
    }
    case Expr::Kind::Filter: {
      Value in = eval(*e.args[0], scope);
      CallArgs a;
      for (size_t k = 1; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], scope));
      for (const auto& kv : e.kwargs) a.kw.emplace_back(kv.first, eval(*kv.second, scope));
      line = e.line;
      return apply_filter(e.name, in, a);
    }
    case Expr::Kind::Test: {
      Value in = eval(*e.args[0], scope);
      CallArgs a;
      for (size_t k = 1; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], scope));
      for (const auto& kv : e.kwargs) a.kw.emplace_back(kv.first, eval(*kv.second, scope));
      line = e.line;
      return Value::boolean(apply_test(e.name, in, a) != e.flag);
    }
    case Expr::Kind::Neg:
    case Expr::Kind::Pos: {
      Value v = eval(*e.args[0], scope);
      line = e.line;
      const bool neg = e.kind == Expr::Kind::Neg;
      if (v.is_undefined()) fail_undefined(v);
      int64_t i;
      if (as_int(v, i)) {
        if (neg && i == INT64_MIN) fail("integer overflow in unary '-'");
        return Value::integer(neg ? -i : i);
      }
      if (v.type == Value::Type::Float) return Value::number(neg ? -v.f : v.f);
      fail(std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" + python_type_name(v) + "'");
    }
    case Expr::Kind::Not:
      return Value::boolean(!truthy(eval(*e.args[0], scope)));
    case Expr::Kind::Binary: {
      Value a = eval(*e.args[0], scope);
      Value b = eval(*e.args[1], scope);
      line = e.line;
      return eval_binary(e.name, a, b);
    }
    case Expr::Kind::And: {
      Value a = eval(*e.args[0], scope);
      if (!truthy(a)) return a;
      return eval(*e.args[1], scope);
    }
    case Expr::Kind::Or: {
      Value a = eval(*e.args[0], scope);
      if (truthy(a)) return a;
      return eval(*e.args[1], scope);
    }
    case Expr::Kind::Compare: {
      Value left = eval(*e.args[0], scope);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.args[k + 1], scope);
        line = e.line;
        if (!compare(e.ops[k], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case Expr::Kind::CondExpr: {
      if (truthy(eval(*e.args[0], scope))) return eval(*e.args[1], scope);
      if (e.args[2]) return eval(*e.args[2], scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  return Value::undefined();
}

Value Interp::apply_filter(const std::string& name, const Value& in, CallArgs& args) {
  // jinja2 returns generators from these; their truthiness and len() differ from a
  // list's, and their errors only surface when something iterates them.
  const bool gen = name == "map" || name == "select" || name == "reject" || name == "selectattr" ||
                   name == "rejectattr" || name == "unique" || name == "items" || name == "batch";
  Value r;
  if (name == "reverse") {  // an iterator, but its argument is checked at once
    r = builtin_filter(*this, name, in, args);
    if (r.is_list() && !(in.is_list() && in.list->lazy)) r.list->lazy = true;
    return r;
  }
  if (gen) {
    try {
      r = builtin_filter(*this, name, in, args);
    } catch (const Error& e) {
      r = Value::new_list();
      r.list->deferred_error = e.what();
    }
    if (r.is_list()) r.list->lazy = true;
    return r;
  }
  r = builtin_filter(*this, name, in, args);
  if (r.is_string() && r.s.size() > opts.limits.max_output)
    fail("a string exceeds the output limit");
  if (r.is_string()) count_built(r.s.size());
  return r;
}

bool Interp::apply_test(const std::string& name, const Value& v, CallArgs& args) {
  return builtin_test(*this, name, v, args);
}

std::string render(const Template& t, const std::vector<std::pair<std::string, Value>>& globals,
                   const Options& options) {
  Interp in(options);
  return in.run(t, globals);
}

}  // namespace dory::jinja
