// The parsed form of a Jinja template, shared by the parser (jinja_parse.cpp)
// and the interpreter (jinja_eval.cpp). Not part of the public interface.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja.h"

namespace dory::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Const,     // value
    Name,      // name
    List,      // args (tuple: flag)
    Dict,      // args: key, value, key, value, ...
    Getattr,   // args[0] . name
    Getitem,   // args[0] [ args[1] ]
    Slice,     // args[0] [ args[1] : args[2] : args[3] ] (null parts are absent)
    Call,      // args[0] ( args[1..], kwargs )
    Filter,    // name: args[0] | name( args[1..], kwargs ); args[0] null in a filter block
    Test,      // args[0] is [not] name( args[1..], kwargs )
    Neg,       // - args[0]
    Pos,       // + args[0]
    Not,       // not args[0]
    Binary,    // args[0] op args[1]; op in + - * / // % ** ~
    And,       // args[0] and args[1]
    Or,        // args[0] or args[1]
    Compare,   // args[0] ops[0] args[1] ops[1] args[2] ...
    CondExpr,  // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool flag = false;  // List: tuple; Test: negated
  Expr(Kind k, int l) : kind(k), line(l) {}
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// An assignment target: a name, a tuple of names, or namespace.attr.
struct Target {
  std::vector<std::string> names;  // one name, or the names of a tuple
  bool tuple = false;
  std::string ns_attr;  // set ns.attr = ...: names[0] is the namespace
};

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned to the last params
  Body body;
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
  std::vector<std::string> predeclared;  // see Stmt::predeclared
};

struct Stmt {
  enum class Kind {
    Text,         // text
    Print,        // expr
    If,           // branches (cond, body); else_body
    For,          // target in expr [if cond]: body; else_body
    Set,          // target = expr
    SetBlock,     // target = rendered body, through filter (may be null)
    Macro,        // macro
    CallBlock,    // expr (a Call) with caller = macro
    FilterBlock,  // filter (a Filter chain with a null innermost arg): body
    Break,
    Continue,
    With,   // with_targets = with_values: body
    Scope,  // body (block, generation): rendered in place
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr, cond, filter;
  Target target;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::shared_ptr<MacroDef> macro;
  std::vector<std::pair<std::string, ExprPtr>> with_vars;
  // jinja2 resolves names per frame at compile time: a name that a frame (a
  // loop body, macro, with/set/filter block, the template itself) first meets
  // as an unconditional assignment, and that no enclosing frame knows, is that
  // frame's local from its start: before the assignment it is undefined, also
  // to nested loops and macros, rather than the context's value. These are the
  // body's such names (else_predeclared: the for loop's else block's).
  std::vector<std::string> predeclared, else_predeclared;
  Stmt(Kind k, int l) : kind(k), line(l) {}
};

struct Template {
  Body body;
  std::vector<std::string> predeclared;  // see Stmt::predeclared
};

}  // namespace dory::jinja
