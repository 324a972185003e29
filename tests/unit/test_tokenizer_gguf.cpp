// The tokenizer from a GGUF's tokenizer.ggml.* metadata against the tokenizer.json it was
// converted from (the same write_tokenizer_metadata `dory convert` runs), on every golden
// string of tests/data/tokenizers: ids, ids with BOS/EOS, special spellings as text, decodes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dory/error.h"
#include "format/gguf.h"
#include "model/gguf_dory.h"
#include "scratch_dir.h"
#include "text/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using dory::Tokenizer;
namespace gguf = dory::gguf;

fs::path data_dir() { return fs::path(__FILE__).parent_path().parent_path() / "data" / "tokenizers"; }

fs::path tmp_path(const std::string& name) { return test_scratch::file(name); }

// A GGUF holding only the tokenizer metadata of an HF directory (no tensors).
fs::path gguf_of(const std::string& base, int64_t vocab = 0) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::str("dory"));
  dory::write_tokenizer_metadata(w, (data_dir() / base).string(), vocab);
  const fs::path out = tmp_path(base + ".gguf");
  w.begin(out.string());
  w.finish();
  return out;
}

std::vector<int32_t> ids_of(const json& a) { return a.get<std::vector<int32_t>>(); }

// Checks one GGUF tokenizer against the directory's and the goldens. `lossy`: added-token
// spellings whose single_word/lstrip/rstrip flags GGUF cannot carry; strings holding one may
// differ (they are counted, and no other string may).
void check(const std::string& base, const std::vector<std::string>& lossy) {
  const fs::path g = gguf_of(base);
  auto from_dir = Tokenizer::from_path((data_dir() / base).string());
  auto from_file = Tokenizer::from_path(g.string());  // sniffs the GGUF magic
  EXPECT_EQ(from_file->vocab_size(), from_dir->vocab_size());
  EXPECT_EQ(from_file->bos_id(), from_dir->bos_id());
  EXPECT_EQ(from_file->eos_ids(), from_dir->eos_ids());
  EXPECT_EQ(from_file->bos_token(), from_dir->bos_token());
  EXPECT_EQ(from_file->eos_token(), from_dir->eos_token());
  EXPECT_EQ(from_file->adds_bos(), from_dir->adds_bos());
  EXPECT_EQ(from_file->adds_eos(), from_dir->adds_eos());
  EXPECT_EQ(from_file->chat_template(), from_dir->chat_template());
  EXPECT_FALSE(from_file->chat_template().empty());

  std::ifstream f(data_dir() / base / "golden.jsonl");
  std::string line;
  int n = 0, bad = 0, lossy_diff = 0, shown = 0;
  while (std::getline(f, line)) {
    const json gl = json::parse(line);
    const std::string text = gl["text"];
    ++n;
    const bool is_lossy = std::any_of(lossy.begin(), lossy.end(),
                                      [&](const std::string& s) { return text.find(s) != std::string::npos; });
    const auto ids = ids_of(gl["ids"]), ids_sp = ids_of(gl["ids_special"]);
    const auto a = from_file->encode(text, false), b = from_file->encode(text, true),
               c = from_file->encode(text, false, false);
    const bool same = a == from_dir->encode(text, false) && b == from_dir->encode(text, true) &&
                      c == from_dir->encode(text, false, false);
    const bool golden = a == ids && b == ids_sp;
    if (!same || !golden) {
      if (is_lossy) {
        ++lossy_diff;
      } else {
        ++bad;
        if (shown++ < 8) ADD_FAILURE() << base << ": GGUF tokenizer differs on " << json(text).dump();
      }
    }
    // Decoding does not depend on the added-token flags: always identical.
    EXPECT_EQ(from_file->decode(ids), from_dir->decode(ids)) << json(text).dump();
    EXPECT_EQ(from_file->decode(ids), gl["decoded"].get<std::string>()) << json(text).dump();
    EXPECT_EQ(from_file->decode(ids_sp, true), gl["decoded_skip"].get<std::string>())
        << json(text).dump();
  }
  EXPECT_GT(n, 500);
  EXPECT_EQ(bad, 0);
  std::printf("[ gguf tok ] %-12s %d strings: %d identical, %d differ only through "
              "single_word/lstrip/rstrip added tokens GGUF cannot carry\n",
              base.c_str(), n, n - lossy_diff - bad, lossy_diff);
}

TEST(TokenizerGguf, MatchesTokenizerJsonGpt2) {
  // gpt2's test file gives "Hello" single_word, <sep> lstrip+rstrip, <mask> lstrip, [WORD]
  // single_word: llama.cpp's keys have no place for those flags.
  check("gpt2", {"Hello", "<sep>", "<mask>", "[WORD]"});
}

TEST(TokenizerGguf, MatchesTokenizerJsonLlama3) { check("llama3-131k", {}); }

TEST(TokenizerGguf, PaddedVocabulary) {
  // A conversion pads the list to the model's vocabulary with [PADn] fillers; they are no
  // added tokens (text spelling "[PAD50262]" stays text) but count in vocab_size.
  const fs::path g = gguf_of("gpt2", 50300);
  auto t = Tokenizer::from_path(g.string());
  auto d = Tokenizer::from_path((data_dir() / "gpt2").string());
  EXPECT_EQ(t->vocab_size(), 50300);
  EXPECT_EQ(t->encode("x [PAD50270] y", false), d->encode("x [PAD50270] y", false));
}

// Rewrites one key of a tokenizer GGUF, for the error cases.
fs::path with_key(const std::string& key, gguf::Value v, bool drop = false) {
  const gguf::File src(gguf_of("gpt2").string());
  gguf::Writer w;
  for (const auto& [k, val] : src.metadata())
    if (k != key) w.set(k, val);
  if (!drop) w.set(key, std::move(v));
  const fs::path out = tmp_path("edited.gguf");
  w.begin(out.string());
  w.finish();
  return out;
}

std::string error_of(const fs::path& p) {
  try {
    Tokenizer::from_path(p.string());
  } catch (const dory::Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerGguf, PreTokenizerNames) {
  // The same gpt2 vocabulary under other pre names loads (each regex compiles) ...
  for (const char* name : {"gpt-2", "llama-bpe", "llama3", "qwen2", "tekken", "default",
                           "starcoder", "falcon", "deepseek-coder", "bloom"}) {
    EXPECT_NO_THROW(Tokenizer::from_path(with_key("tokenizer.ggml.pre", gguf::Value::str(name)).string()))
        << name;
  }
  // ... and llama3's split digits in threes where gpt-2 keeps them whole.
  auto l3 = Tokenizer::from_path(with_key("tokenizer.ggml.pre", gguf::Value::str("llama3")).string());
  auto g2 = Tokenizer::from_path(with_key("tokenizer.ggml.pre", gguf::Value::str("gpt-2")).string());
  EXPECT_NE(l3->encode("12345678", false), g2->encode("12345678", false));
  // An unknown name is one clear error.
  const std::string e = error_of(with_key("tokenizer.ggml.pre", gguf::Value::str("no-such-pre")));
  EXPECT_NE(e.find("tokenizer.ggml.pre \"no-such-pre\" is not a pre-tokenizer"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST(TokenizerGguf, Errors) {
  EXPECT_NE(error_of(with_key("tokenizer.ggml.model", gguf::Value::str("bert"))).find(
                "tokenizer.ggml.model \"bert\" is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(with_key("tokenizer.ggml.model", {}, true)).find("no tokenizer.ggml.model"),
            std::string::npos);
  EXPECT_NE(error_of(with_key("tokenizer.ggml.bos_token_id", gguf::Value::u32(999999)))
                .find("tokenizer.ggml.bos_token_id: token id 999999 is not in the"),
            std::string::npos);
  EXPECT_NE(error_of(with_key("tokenizer.ggml.token_type", gguf::Value::i32s({1, 2})))
                .find("tokenizer.ggml.token_type: 2 entries for"),
            std::string::npos);
  EXPECT_NE(error_of(with_key("tokenizer.ggml.merges", gguf::Value::strings({"zzzq qqqz"})))
                .find("is not in the vocabulary"),
            std::string::npos);
  // add_bos from the file's flag.
  auto t = Tokenizer::from_path(with_key("tokenizer.ggml.add_bos_token", gguf::Value::boolean(true)).string());
  EXPECT_TRUE(t->adds_bos());
  EXPECT_EQ(t->encode("hi", true).front(), *t->bos_id());
}

}  // namespace
