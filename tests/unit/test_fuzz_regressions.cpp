// One test per fuzzing finding (fuzz/README.md lists them): the input that crashed or hit
// undefined behaviour now gets a one-line dory::Error naming the problem. The same inputs
// are in fuzz/corpus/<harness>/regress-*, replayed under ASan + UBSan by ctest
// (fuzz_replay_<harness>); these tests check the message in the ordinary build.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dory/error.h"
#include "format/gguf.h"
#include "format/hf_config.h"
#include "format/safetensors.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace {

nlohmann::json good_config() {
  return {{"hidden_size", 64},        {"intermediate_size", 96}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"attention_head_dim", 16}, {"vocab_size", 256},
          {"num_hidden_layers", 4},   {"hybrid_layer_pattern", "S-*-"}, {"n_input_layers", 1},
          {"n_recurrent_layers", 2},  {"n_output_layers", 1},    {"n_recurrent_loops", 2},
          {"swa_window_size", 4},     {"rope_theta", 10000.0},   {"init_method_std", 0.02},
          {"ngpt_alpha_init", 0.05}};
}

// A GGUF v3 file in memory: string keys and string-array keys (enough for a tokenizer).
struct GgufBytes {
  std::vector<uint8_t> b;
  uint64_t n_kv = 0;
  void put(uint64_t v, int n) {
    for (int k = 0; k < n; ++k) b.push_back(static_cast<uint8_t>(v >> (8 * k)));
  }
  void str(const std::string& s) {
    put(s.size(), 8);
    b.insert(b.end(), s.begin(), s.end());
  }
  void kv_str(const std::string& key, const std::string& v) {
    str(key), put(8, 4), str(v), ++n_kv;
  }
  void kv_strs(const std::string& key, const std::vector<std::string>& v) {
    str(key), put(9, 4), put(8, 4), put(v.size(), 8), ++n_kv;
    for (const auto& s : v) str(s);
  }
  std::vector<uint8_t> file() const {
    GgufBytes h;
    h.b = {'G', 'G', 'U', 'F'};
    h.put(3, 4), h.put(0, 8), h.put(n_kv, 8);
    h.b.insert(h.b.end(), b.begin(), b.end());
    return h.b;
  }
};

std::string config_error(const nlohmann::json& j) {
  try {
    dory::parse_hf_config_text(j.dump(), "cfg.json");
  } catch (const dory::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// partial_rotary_factor 1e300: head_dim * f was converted to int64 before the range check
// (UBSan: "4e+300 is outside the range of representable values of type 'long'").
TEST(FuzzRegressions, HugePartialRotaryFactorIsAnErrorNotUB) {
  for (const char* key : {"partial_rotary_factor", "partial_rotary_factor_2"}) {
    for (double f : {1e300, -1e300, 1e19, 3.0}) {
      nlohmann::json j = good_config();
      j[key] = f;
      const std::string e = config_error(j);
      EXPECT_NE(e.find(key), std::string::npos) << e;
      EXPECT_NE(e.find("expected a fraction in (0, 1]"), std::string::npos) << e;
    }
  }
}

// rope_profile_layers entries were narrowed to int before the check: 4294967297 became 1.
TEST(FuzzRegressions, RopeProfileIsCheckedBeforeNarrowing) {
  nlohmann::json j = good_config();
  j["rope_profile_layers"] = {1, 4294967297LL, 2, 1};
  const std::string e = config_error(j);
  EXPECT_NE(e.find("rope_profile_layers"), std::string::npos) << e;
  EXPECT_NE(e.find("4294967297"), std::string::npos) << e;
}

// A GGUF key holding a newline and an ESC, followed by an unknown value type: the error named
// the raw key, so the "one-line" message spanned two lines and sent ESC to the terminal.
// dory::Error now writes control characters as escapes, for every error from every parser.
TEST(FuzzRegressions, ErrorsNamingFileContentStayOnOneLine) {
  EXPECT_STREQ(dory::Error("a\nb\tc\x1b[2J\x7f").what(), "a\\nb\\tc\\x1b[2J\\x7f");
  EXPECT_STREQ(dory::Error("caf\xc3\xa9").what(), "caf\xc3\xa9");  // UTF-8 is kept

  std::vector<uint8_t> b;
  auto put = [&](uint64_t v, int n) {
    for (int k = 0; k < n; ++k) b.push_back(static_cast<uint8_t>(v >> (8 * k)));
  };
  const std::string key = "dory.at\n\x1b[31m";
  b.insert(b.end(), {'G', 'G', 'U', 'F'});
  put(3, 4);            // version
  put(0, 8);            // tensors
  put(1, 8);            // metadata
  put(key.size(), 8);
  b.insert(b.end(), key.begin(), key.end());
  put(4150435325u, 4);  // value type
  put(0, 8);            // room for a value
  try {
    dory::gguf::File f(b.data(), b.size(), "x.gguf");
    FAIL() << "parsed";
  } catch (const dory::Error& e) {
    EXPECT_STREQ(e.what(), "x.gguf: key 'dory.at\\n\\x1b[31m': unknown metadata value type 4150435325");
  }

  // The same through a safetensors tensor name (a JSON "\n" escape is a real newline).
  const std::string header = R"({"a\nb": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}})";
  std::vector<uint8_t> st(8, 0);
  st[0] = static_cast<uint8_t>(header.size());
  st.insert(st.end(), header.begin(), header.end());
  st.resize(st.size() + 8, 0);
  try {
    dory::SafeTensorsFile f(st.data(), st.size(), "x.safetensors");
    FAIL() << "parsed";
  } catch (const dory::Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find("tensor 'a\\nb'"), std::string::npos) << m;
  }
}

// A GGUF tokenizer whose merges (or chat template) held invalid UTF-8: the JSON the
// tokenizer pipeline is built from could not be written, and nlohmann's type_error escaped
// Tokenizer::from_gguf (std::terminate in the fuzzer; a message naming neither file nor key
// in `dory`). Both are now checked like the tokens are.
TEST(FuzzRegressions, GgufTokenizerStringsMustBeUtf8) {
  for (const bool bad_template : {false, true}) {
    GgufBytes g;
    g.kv_str("tokenizer.ggml.model", "gpt2");
    g.kv_strs("tokenizer.ggml.tokens", {"a", "b", "ab"});
    g.kv_strs("tokenizer.ggml.merges", {"a b", bad_template ? "a b" : "a \xff"});
    if (bad_template) g.kv_str("tokenizer.chat_template", "{{ x }}\xc3");
    const std::vector<uint8_t> bytes = g.file();
    dory::gguf::File f(bytes.data(), bytes.size(), "t.gguf");
    try {
      dory::Tokenizer::from_gguf(f);
      FAIL() << "loaded";
    } catch (const dory::Error& e) {
      EXPECT_STREQ(e.what(), bad_template ? "t.gguf: tokenizer.chat_template: not valid UTF-8"
                                          : "t.gguf: tokenizer.ggml.merges[1]: not valid UTF-8");
    }
  }
}

namespace {
std::string template_error(const std::string& src, size_t max_output = 64u << 20) {
  try {
    dory::ChatTemplate t(src);
    t.limits().max_output = max_output;
    t.render(nlohmann::ordered_json::object());
  } catch (const dory::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// Template builtins that size their result from a number, and loops that build strings:
// each allocated gigabytes (or ran for minutes) before the output limit was checked on the
// result. Now they are refused up front, or as the result grows. (Found by probing the
// template harness with large literals; fuzz/README.md.)
TEST(FuzzRegressions, TemplateSizesAreCheckedBeforeBuilding) {
  const std::string limit = "a string exceeds the output limit";
  for (const char* src :
       {"{{ 'x'|center(2000000000) }}", "{{ 'a'.ljust(3000000000) }}", "{{ 'a'.rjust(3000000000) }}",
        "{{ 'abc'.zfill(2000000000) }}", "{{ '%2000000000s' % 'x' }}",
        "{{ '%.1000000000f' % 1.5 }}", "{{ '%.1000000000d' % 1 }}", "{{ 'a'|indent(1000000000) }}",
        "{{ {'a': [1]}|tojson(indent=100000000) }}",
        "{{ ('{0}' * 100000).format('x' * 100000) }}",
        "{{ ('%(a)s' * 100000) % {'a': 'x' * 100000} }}",
        "{% set s = 'ab' * 1000 %}{{ s|replace('', s * 100) }}"}) {
    const std::string e = template_error(src);
    EXPECT_NE(e.find(limit), std::string::npos) << src << " -> " << e;
  }
  EXPECT_NE(template_error("{{ ('a\n' * 100000)|indent(1000) }}").find(limit), std::string::npos);
  EXPECT_NE(template_error("{{ ([[[[[1]]]]] * 100000)|tojson(indent=1000) }}")
                .find("tojson: the JSON text exceeds the output limit"),
            std::string::npos);
  EXPECT_NE(template_error("{{ [1, 2, 3]|batch(1000000000, 'x')|list|length }}")
                .find("a list grows too long"),
            std::string::npos);
  // 16 x the output limit of strings built in all (1 MiB here): the loop would copy 40 GB.
  EXPECT_NE(template_error("{% set s = 'ab' * 100000 %}{% for i in range(100000) %}"
                           "{% set t = s ~ s %}{% endfor %}",
                           1u << 20)
                .find("the template built more than 16777216 bytes of strings"),
            std::string::npos);
  // Widths that fit still work, and are no longer cut at 511 bytes.
  EXPECT_EQ(template_error("{{ 'x'|center(1000) }}{{ '%600d' % 5 }}"), "");
  dory::ChatTemplate t("{{ '%600d' % 5 }}|{{ '%.3f' % 2.5 }}|{{ '%-4s|' % 'ab' }}");
  EXPECT_EQ(t.render(nlohmann::ordered_json::object()), std::string(599, ' ') + "5|2.500|ab  |");
}

// Float-to-int conversions and a range near INT64_MAX were undefined behaviour (UBSan).
TEST(FuzzRegressions, TemplateIntegerConversionsAreChecked) {
  EXPECT_NE(template_error("{{ '%d' % 1e300 }}").find("integer overflow in %d"), std::string::npos);
  EXPECT_NE(template_error("{{ '%i' % -1e19 }}").find("integer overflow in %i"), std::string::npos);
  EXPECT_NE(template_error("{{ 1e300|int }}").find("integer overflow in int"), std::string::npos);
  EXPECT_NE(template_error("{{ '1e300'|int }}").find("integer overflow in int"), std::string::npos);
  dory::ChatTemplate r(
      "{{ range(-9223372036854775807, 9223372036854775807, 4611686018427387904)|list }}");
  EXPECT_EQ(r.render(nlohmann::ordered_json::object()),
            "[-9223372036854775807, -4611686018427387903, 1, 4611686018427387905]");
  EXPECT_EQ(template_error("{{ '%d' % 1e18 }}{{ 1e18|int }}"), "");
  // str.format widths and precisions of any length (the accumulation overflowed int64 past
  // 19 digits: UBSan, found by fuzz_template after 346k executions).
  EXPECT_NE(template_error("{{ '{:>" + std::string(40, '7') + "}'.format('x') }}").find("Invalid format specifier"),
            std::string::npos);
  EXPECT_NE(template_error("{{ '{:." + std::string(40, '9') + "}'.format(1.5) }}").find("Invalid format specifier"),
            std::string::npos);
}

// x[:, 1]: a slice inside a subscript tuple kept an empty object slot, and rendering it
// dereferenced a null expression (UBSan: reference binding to null pointer; a segfault in a
// release build). Found by fuzz_template after 134k executions. Now a syntax error, as in
// jinja2 (whose generated Python does not compile).
TEST(FuzzRegressions, SliceInsideSubscriptTupleIsASyntaxError) {
  for (const char* src : {"{{ x[:, 1] }}", "{{ x[1, ::2] }}", "{{ x[:, :] }}"}) {
    try {
      dory::ChatTemplate t(src);
      FAIL() << src << " parsed";
    } catch (const dory::Error& e) {
      EXPECT_STREQ(e.what(),
                   "chat template line 1: invalid syntax: a slice inside a subscript tuple (x[a:b, c])");
    }
  }
  dory::ChatTemplate ok("{{ x[1:] }}{{ x[::2] }}{{ d[1, 2] }}");
  EXPECT_EQ(ok.render(nlohmann::ordered_json{{"x", {1, 2, 3}}, {"d", nlohmann::ordered_json::object()}}),
            "[2, 3][1, 3]");
}

// fuzz_tokenizer: a vocab token whose text is a special token's is dropped by decode (the
// library matches special tokens by text), but the stream decoder judged "is it dropped?"
// by id, so such a token ended a run of byte-fallback tokens early and the stream lost the
// spaces Metaspace makes of the run's U+2581 bytes. The pieces must add up to decode().
TEST(FuzzRegressions, StreamDecoderDropsWhatDecodeDrops) {
  nlohmann::json vocab = {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"<s>", 3}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 4 + b;
  }
  const nlohmann::json meta = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"},
                               {"split", true}};
  const nlohmann::json tj = {
      {"version", "1.0"},
      {"added_tokens", {{{"id", 3}, {"content", "<unk>"}, {"single_word", false}, {"lstrip", false},
                         {"rstrip", false}, {"normalized", false}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", meta},
      {"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, meta}}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}, {"byte_fallback", true}}}};
  auto tok = dory::Tokenizer::from_json(tj.dump(), "");
  ASSERT_TRUE(tok->decode_drops(0, true));  // "<unk>" (id 0) has the special token's text
  ASSERT_FALSE(tok->is_special(0));         // though the special token is id 3
  const int32_t e2 = 4 + 0xE2, x96 = 4 + 0x96, x81 = 4 + 0x81;  // U+2581 in UTF-8
  const std::vector<int32_t> ids = {1, e2, x96, x81, 0, e2, x96, x81, e2, x96, x81, 2, 0};
  dory::StreamDecoder stream(*tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.push(id);
  streamed += stream.flush();
  const std::string whole = tok->decode(ids, true);
  EXPECT_EQ(whole, "a   b");
  EXPECT_EQ(streamed, whole);
}
