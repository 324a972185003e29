// The Jinja interpreter behind ChatTemplate: language features, Python's value
// semantics, errors that name the template line, and the limits that keep a
// runaway template from hanging or crashing the process. Character-for-character
// parity with jinja2 on real templates is tests/template/ (it runs jinja2).
#include <gtest/gtest.h>

#include <string>

#include "dory/error.h"
#include "text/chat_template.h"

namespace {

using dory::ChatTemplate;
using json = nlohmann::ordered_json;

std::string render(const std::string& src, const std::string& ctx = "{}") {
  ChatTemplate t(src);
  return t.render(json::parse(ctx));
}

// The message of the dory::Error that rendering (or parsing) throws; "" if none.
std::string error_of(const std::string& src, const std::string& ctx = "{}") {
  try {
    render(src, ctx);
  } catch (const dory::Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Jinja, TextExpressionsAndComments) {
  EXPECT_EQ(render("Hello {{ name }}!{# a comment #}", R"({"name":"Dory"})"), "Hello Dory!");
  EXPECT_EQ(
      render(
          "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }}"),
      "7 9 3 -4 1 1024");
  EXPECT_EQ(render("{{ 10 / 4 }} {{ 1 / 3 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 3.0 }}"),
            "2.5 0.3333333333333333 1e+16 0.30000000000000004 3.0");
  EXPECT_EQ(
      render("{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 2 }} {{ [1, 'b', none] }} {{ {'k': (1,)} }}"),
      "a1NoneTrue abab [1, 'b', None] {'k': (1,)}");
  EXPECT_EQ(render("{{ 'a' if x else 'b' }}{{ 'c' if not x }}", R"({"x":0})"), "bc");
}

TEST(Jinja, WhitespaceControlAsTransformers) {
  // trim_blocks and lstrip_blocks are on, as in apply_chat_template.
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render("{%- if true -%}\n  x  \n{%- endif -%}\n"), "x");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(render("x\n"), "x");  // one trailing newline is dropped, as jinja2 does
  EXPECT_EQ(render("a\r\nb"), "a\nb");
  EXPECT_EQ(render("{% raw %}{{ not parsed }}{% endraw %}"), "{{ not parsed }}");
}

TEST(Jinja, IfForLoopVariables) {
  EXPECT_EQ(
      render("{% for x in xs %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
             "{{ loop.revindex }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
             R"({"xs":["a","b"]})"),
      "1TrueFalse22b;2FalseTrue21a;");
  EXPECT_EQ(render("{% for x in [1,2,3,4] if x is even %}{{ loop.index }}/{{ loop.length }} {% "
                   "else %}none{% endfor %}"),
            "1/2 2/2 ");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(
      render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", R"({"d":{"b":1,"a":2}})"),
      "b=1;a=2;");
  EXPECT_EQ(render("{% for i in range(9) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 "
                   "%}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "023");
  EXPECT_EQ(render("{% if x > 2 %}big{% elif x > 1 %}mid{% else %}small{% endif %}", R"({"x":2})"),
            "mid");
}

TEST(Jinja, ScopingFollowsJinja2) {
  // A set inside a loop is gone at the next iteration and after the loop...
  EXPECT_EQ(
      render("{% set y = 0 %}{% for i in range(3) %}{% set y = y + 1 %}{{ y }}{% endfor %}{{ y }}"),
      "1110");
  // ...which is why templates use namespace().
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i "
                   "%}{% endfor %}{{ ns.n }}"),
            "3");
  EXPECT_EQ(render("{% if true %}{% set z = 5 %}{% endif %}{{ z }}"), "5");
  EXPECT_EQ(
      render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set blk %}x{{ a }}{% endset %}[{{ blk }}]"),
      "12[x1]");
  EXPECT_EQ(
      render("{% set messages = messages[1:] %}{{ messages|length }}", R"({"messages":[1,2,3]})"),
      "2");
  // jinja2 binds names per frame at compile time: a name the template assigns
  // (unconditionally, before any use at its level) is undefined until then, even
  // to a macro or loop that runs earlier and even when the context has it.
  EXPECT_EQ(render("{% macro m() %}[{{ a }}]{% endmacro %}{{ m() }}{% set a = 0 %}{{ m() }}",
                   R"({"a":3})"),
            "[][0]");
  EXPECT_EQ(
      render("{{ a }}{% macro m() %}[{{ a }}]{% endmacro %}{{ m() }}{% set a = 0 %}", R"({"a":3})"),
      "3[3]");
  // A loop's else block runs unless an iteration reached the end of the body.
  EXPECT_EQ(render("{% for i in [1, 2] %}{% break %}{% else %}else{% endfor %}"), "else");
  EXPECT_EQ(render("{% for i in [1] %}{% continue %}{% else %}else{% endfor %}"), "else");
  EXPECT_EQ(render("{% for i in [1] %}x{% else %}else{% endfor %}"), "x");
}

TEST(Jinja, MacrosAndCallBlocks) {
  EXPECT_EQ(render("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, 2) }} {{ "
                   "m(a=3, b=4) }}"),
            "1B 12 34");
  EXPECT_EQ(render("{% macro w(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call w('b') "
                   "%}hi{% endcall %}"),
            "<b>hi</b>");
  EXPECT_EQ(
      render(
          "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(3) }}"),
      "0123");
  EXPECT_TRUE(
      has(error_of("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"), "takes not more than 1"));
}

TEST(Jinja, StringsAreCodePoints) {
  EXPECT_EQ(
      render("{{ s[::-1] }} {{ s[1:3] }} {{ s|length }} {{ s[-1] }}", R"({"s":"héllo🙂"})"),
      "🙂olléh él 6 🙂");
  EXPECT_EQ(render("{{ ' a b '.strip() }}|{{ 'a,b,c'.split(',') }}|{{ 'Hi'.startswith('H') }}|{{ "
                   "'ab'.upper() }}|"
                   "{{ 'x y'.title() }}|{{ 'ÉCOLE straße'.lower() }}|{{ 'straße'.upper() }}|{{ "
                   "'ΣΑΣ'.lower() }}"),
            "a b|['a', 'b', 'c']|True|AB|X Y|école straße|STRASSE|σας");
  EXPECT_EQ(render("{{ ws|trim }}|", R"({"ws":"\u3000 x\u00a0"})"), "x|");
}

TEST(Jinja, Filters) {
  EXPECT_EQ(
      render("{{ xs|join(', ') }} {{ xs|first }} {{ xs|last }} {{ xs|length }} {{ xs|sort|list }} "
             "{{ xs|reverse|list }} {{ xs|sum }} {{ xs|max }} {{ xs|unique|list }}",
             R"({"xs":[3,1,3,2]})"),
      "3, 1, 3, 2 3 2 4 [1, 2, 3, 3] [2, 3, 1, 3] 9 3 [3, 1, 2]");
  EXPECT_EQ(
      render("{{ u|map(attribute='n')|join }} {{ u|selectattr('ok')|map(attribute='n')|list }} "
             "{{ u|rejectattr('ok')|list|length }} {{ [1, 2, 3]|select('odd')|list }}",
             R"({"u":[{"n":"a","ok":true},{"n":"b","ok":false}]})"),
      "ab ['a'] 1 [1, 3]");
  EXPECT_EQ(render("{{ missing|default('d') }} {{ ''|default('d', true) }} {{ '7'|int + 1 }} {{ "
                   "'2.5'|float }} "
                   "{{ 2.5|round }} {{ -3|abs }} {{ 'a\nb'|indent(2) }} {{ 'x'|string }} {{ 'a "
                   "b'|replace(' ', '_') }}"),
            "d d 8 2.5 2.0 3 a\n  b x a_b");
  EXPECT_EQ(render("{{ d|items|list }} {{ d|dictsort }}", R"({"d":{"b":1,"a":2}})"),
            "[('b', 1), ('a', 2)] [('a', 2), ('b', 1)]");
}

TEST(Jinja, TojsonIsTransformersTojson) {
  // ensure_ascii=False, key order kept, Python's separators and float repr.
  EXPECT_EQ(render("{{ v|tojson }}", R"({"v":{"z":"é\n<&>","a":[1,2.5,null,true,{}]}})"),
            R"({"z": "é\n<&>", "a": [1, 2.5, null, true, {}]})");
  EXPECT_EQ(render("{{ v|tojson(indent=2) }}", R"({"v":{"a":[1],"b":{}}})"),
            "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(
      render("{{ v|tojson(sort_keys=true, separators=(',', ':')) }}", R"({"v":{"b":1,"a":2}})"),
      R"({"a":2,"b":1})");
}

TEST(Jinja, TestsAndOperators) {
  EXPECT_EQ(render("{{ x is defined }}{{ y is defined }}{{ none is none }}{{ 's' is string }}{{ {} "
                   "is mapping }}"
                   "{{ 's' is iterable }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 'a' in 'cat' "
                   "}}{{ 2 not in [1] }}",
                   R"({"x":1})"),
            "TrueFalseTrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(
      render("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ 1 < 2 < 3 }} {{ [1] == [1] }} {{ 1 == 1.0 }}"),
      "x y True True True");
}

TEST(Jinja, UndefinedIsLikeJinja2) {
  // Printing, iterating, testing and default() are fine...
  EXPECT_EQ(render("[{{ nope }}]{% for x in nope %}x{% endfor %}{{ nope|length }}{{ nope is "
                   "defined }}{{ d.k is defined }}",
                   R"({"d":{}})"),
            "[]0FalseFalse");
  // ...but arithmetic and attribute access on an undefined value are errors, as in jinja2.
  EXPECT_TRUE(has(error_of("{{ nope + 1 }}"), "'nope' is undefined"));
  EXPECT_TRUE(has(error_of("{{ nope.attr }}"), "'nope' is undefined"));
  EXPECT_TRUE(
      has(error_of("{{ messages[0]['role'] }}", R"({"messages":[]})"), "chat template line 1:"));
}

TEST(Jinja, ChatTemplateContext) {
  const char* chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
      "+ "
      "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' "
      "}}{% endif %}";
  ChatTemplate t(chatml);
  json ctx = {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})},
              {"add_generation_prompt", true}};
  EXPECT_EQ(t.render(ctx), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  nlohmann::json plain = nlohmann::json::parse(R"({"messages":[{"role":"user","content":"Hi"}]})");
  EXPECT_EQ(t.render(plain), "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_THROW(t.render(json::array()), dory::Error);

  json cfg = json::parse(
      R"({"chat_template":[{"name":"default","template":"A"},{"name":"tool_use","template":"B"}]})");
  EXPECT_EQ(ChatTemplate::from_tokenizer_config(cfg), "A");
  EXPECT_EQ(ChatTemplate::from_tokenizer_config(cfg, "tool_use"), "B");
  EXPECT_THROW(ChatTemplate::from_tokenizer_config(json::parse("{}")), dory::Error);
}

TEST(Jinja, StrftimeNowReadsTheClock) {
  ChatTemplate t("{{ strftime_now('%d %b %Y') }}");
  t.set_clock(1721999100);  // 2024-07-26 13:05 UTC
  EXPECT_EQ(t.render(json::object()), "26 Jul 2024");
}

TEST(Jinja, RaiseExceptionNamesItsLineAndMessage) {
  const std::string e = error_of(
      "line one\n{% if true %}\n{{ raise_exception('Roles must alternate!') }}\n{% endif %}");
  EXPECT_EQ(e, "chat template line 3: Roles must alternate!");
}

// Broken templates: a dory::Error naming the line, never a crash.
TEST(Jinja, SyntaxErrorsNameTheirLine) {
  struct Case {
    const char* src;
    const char* line;
    const char* what;
  };
  const Case cases[] = {
      {"a\n{% for x in xs %}\n{{ x }}\n", "line 2:", "'for' block is never closed"},
      {"a\nb\n{% if x %}{% for y in z %}{% endif %}", "line 3:",
       "unexpected 'endif': the innermost open block is 'for' (line 3), which expects 'endfor'"},
      {"\n\n\n{{ 1 + }}", "line 4:", "expected an expression"},
      {"x\n{{ name | nosuchfilter }}", "line 2:", "no filter named 'nosuchfilter'"},
      {"{% nosuchtag %}", "line 1:", "unknown tag 'nosuchtag'"},
      {"\n{{ x is nosuchtest }}", "line 2:", "no test named 'nosuchtest'"},
      {"a\n\n{{ 'unterminated }}", "line 3:", "unterminated string"},
      {"{# never closed", "line 1:", "comment is never closed"},
      {"a\n{{ x", "line 2:", "never closed"},
      {"{% endif %}", "line 1:", "unexpected 'endif': no block is open"},
      {"{% include 'x.jinja' %}", "line 1:", "not supported"},
      {"{% break %}", "line 1:", "outside of a loop"},
      {"{{ (1, 2 }}", "line 1:", ""},
      {"{{ x.1.2 }}", "line 1:", ""},
  };
  for (const auto& c : cases) {
    try {
      ChatTemplate t(c.src);
      ADD_FAILURE() << "no error for: " << c.src;
    } catch (const dory::Error& e) {
      const std::string m = e.what();
      EXPECT_TRUE(has(m, std::string("chat template ") + c.line)) << c.src << " -> " << m;
      EXPECT_TRUE(has(m, c.what)) << c.src << " -> " << m;
      EXPECT_FALSE(has(m, "\n")) << m;
    }
  }
}

TEST(Jinja, RuntimeErrorsNameTheirLine) {
  EXPECT_EQ(error_of("ok\n\n{{ 'a' + 1 }}"),
            "chat template line 3: can only concatenate str (not \"int\") to str");
  EXPECT_TRUE(has(error_of("a\n{{ 1 / 0 }}"), "line 2: division by zero"));
  EXPECT_TRUE(has(error_of("{% set x = 5 %}\n{% for a in x %}{% endfor %}"),
                  "line 2: 'int' object is not iterable"));
  EXPECT_TRUE(has(error_of("{{ missing|tojson }}"), "line 1:"));
  // A message with a newline still makes a one-line error.
  EXPECT_EQ(error_of("{{ raise_exception('two\nlines') }}"), "chat template line 1: two\\nlines");
}

TEST(Jinja, RunawayTemplatesAreRefused) {
  // Unbounded recursion: an error, not a stack overflow ("recursion too deep" at the
  // 200-call limit; under AddressSanitizer's larger frames the stack bound may come first:
  // "nests or recurses too deeply").
  EXPECT_TRUE(has(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), "too deep"));
  // Huge loops: the step limit.
  {
    ChatTemplate t(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
    t.limits().max_steps = 1'000'000;
    try {
      t.render(json::object());
      ADD_FAILURE() << "no error";
    } catch (const dory::Error& e) {
      EXPECT_TRUE(has(e.what(), "loop iterations")) << e.what();
    }
  }
  // The sandbox's range limit.
  EXPECT_TRUE(has(error_of("{{ range(1000000)|length }}"), "Range too big"));
  // Output and string size.
  {
    ChatTemplate t("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}");
    t.limits().max_output = 1 << 20;
    EXPECT_THROW(t.render(json::object()), dory::Error);
  }
  EXPECT_TRUE(has(error_of("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = "
                           "ns.s + ns.s %}{% endfor %}"),
                  "exceeds"));
  EXPECT_TRUE(has(error_of("{{ 'x' * 10000000000 }}"), "exceeds"));
  // Values nested without bound.
  EXPECT_TRUE(has(error_of("{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = "
                           "[ns.v] %}{% endfor %}"),
                  "nests"));
  // Source nested without bound: the parser refuses, it does not recurse to death.
  EXPECT_TRUE(has(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
                  "nests too deeply"));
  std::string ifs;
  for (int i = 0; i < 2000; ++i) ifs += "{% if true %}";
  EXPECT_TRUE(has(error_of(ifs), "nests too deeply"));
  EXPECT_TRUE(has(error_of("{{ " + std::string(5000, '-') + "1 }}"), "nests too deeply"));
  EXPECT_TRUE(has(error_of("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}"),
                  "nests too deeply"));
  // Long left-deep chains build deep trees too.
  std::string sum = "1";
  for (int i = 0; i < 50000; ++i) sum += "+1";
  EXPECT_TRUE(has(error_of("{{ " + sum + " }}"), "nests too deeply"));
  std::string attrs = "x";
  for (int i = 0; i < 50000; ++i) attrs += ".a";
  EXPECT_TRUE(has(error_of("{{ " + attrs + " }}"), "nests too deeply"));
  // Recursion through deep expressions: bounded by interpreter frames, not the stack.
  EXPECT_TRUE(has(error_of("{% macro f(n) %}{{ " + std::string(150, '[') + "f(n + 1)" +
                           std::string(150, ']') + " }}{% endmacro %}{{ f(0) }}"),
                  "too deeply"));
  // A deeply nested context.
  std::string deep = std::string(2000, '[') + std::string(2000, ']');
  EXPECT_THROW(render("{{ v }}", "{\"v\":" + deep + "}"), dory::Error);
}

TEST(Jinja, ImmutableSandbox) {
  // Mutating methods are refused, as in transformers' ImmutableSandboxedEnvironment.
  EXPECT_TRUE(has(error_of("{% set xs = [1] %}{{ xs.append(2) }}"), "unsafe"));
  EXPECT_TRUE(has(error_of("{% set d = {} %}{{ d.update({'a': 1}) }}"), "unsafe"));
}

}  // namespace
