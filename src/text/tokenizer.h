// Hugging Face tokenizer.json (+ tokenizer_config.json) as the `tokenizers` library runs it:
// added/special tokens split out first, the declared normalizer, pre-tokenizers with their
// regexes run through PCRE2 with Oniguruma's meaning, byte-level or SentencePiece-style BPE
// (ranked merges, byte fallback, ignore_merges), the post-processor's BOS/EOS, and the
// decoder chain. Ids match the library id for id (tests/unit/test_tokenizer.cpp checks it on
// thousands of strings for several files).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dory {

namespace tok {
struct Impl;
}
namespace gguf {
class File;
}

class Tokenizer {
 public:
  // tokenizer.json (+ optional tokenizer_config.json; "" = none). Throws dory::Error naming the
  // file and the problem; a model or component this engine does not implement is an Error too.
  static std::unique_ptr<Tokenizer> from_files(const std::string& tokenizer_json,
                                               const std::string& tokenizer_config_json);
  // A directory holding tokenizer.json (and maybe tokenizer_config.json, chat_template.jinja,
  // generation_config.json for extra EOS ids); or a path to a tokenizer.json, with its
  // directory's tokenizer_config.json when there is one; or a .gguf file (from_gguf).
  static std::unique_ptr<Tokenizer> from_path(const std::string& path);
  // A GGUF file's tokenizer.ggml.* metadata (llama.cpp's keys) and tokenizer.chat_template,
  // turned into the tokenizer.json pipeline it stands for and loaded by the same code:
  // model "gpt2" (byte-level BPE: tokens, merges, token_type 3 = control -> special added
  // token, 4 = user-defined -> added token), "llama" (SentencePiece BPE: scores -> merges,
  // byte fallback); tokenizer.ggml.pre names the pre-tokenizer regex as llama.cpp does.
  // BOS/EOS/UNK ids, add_bos_token/add_eos_token (else llama.cpp's default for the pre name).
  // An unknown model or pre name, or inconsistent metadata, is a dory::Error naming the file.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file);
  // The same from JSON text already in memory; the names are what errors call them.
  static std::unique_ptr<Tokenizer> from_json(
      std::string_view tokenizer_json, std::string_view tokenizer_config_json = {},
      const std::string& json_name = "tokenizer.json",
      const std::string& config_name = "tokenizer_config.json");
  ~Tokenizer();

  // add_special: BOS/EOS per the file's own rule (tokenizer_config add_bos_token/add_eos_token
  // when it sets them, else the post_processor). parse_special: split added/special tokens out
  // of the text (true for prompts); false treats special-token spellings as plain text, like
  // the library's encode_special_tokens. Text that is not valid UTF-8 is encoded as if each
  // invalid sequence were U+FFFD (callers that must refuse it check utf8::first_invalid).
  std::vector<int32_t> encode(std::string_view text, bool add_special,
                              bool parse_special = true) const;
  // Ids unknown to the vocabulary are skipped, as the library does.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int64_t vocab_size() const;  // max id + 1 over vocab and added tokens
  std::optional<int32_t> token_id(std::string_view token) const;  // exact token string -> id
  const std::string& token_text(int32_t id) const;  // raw vocab string; "" for unknown ids
  bool is_special(int32_t id) const;
  // Whether decode(..., skip_special) leaves this id out: unknown ids always, and with
  // skip_special, ids whose text is a special token's (as the library matches them).
  bool decode_drops(int32_t id, bool skip_special) const;
  std::optional<int32_t> bos_id() const;
  std::vector<int32_t> eos_ids() const;
  std::string bos_token() const;  // "" if none
  std::string eos_token() const;  // "" if none
  // tokenizer_config.json "chat_template" (a string, or a list of {name, template}: the one
  // named "default"), else chat_template.jinja beside it; "" if none.
  const std::string& chat_template() const;
  // Whether encode(..., add_special=true) adds anything before / after the text.
  bool adds_bos() const;
  bool adds_eos() const;

 private:
  Tokenizer();
  std::unique_ptr<tok::Impl> impl_;
  friend struct tok::Impl;
};

// Streaming detokenizer: push ids one by one; each push returns the new text that is final,
// never half a UTF-8 character (a token that ends inside a character waits for the next).
// The concatenation of all pushes and flush() equals tokenizer.decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  std::string push(int32_t id);
  // What is left (an incomplete character comes out as U+FFFD); the stream starts over.
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_;
  std::vector<int32_t> ids_;
  std::string prefix_;
  bool in_byte_run_ = false;  // the last token decode keeps is a <0xNN> byte token
  size_t prefix_index_ = 0;   // ids_[0, prefix_index_) decode to text already emitted
};

}  // namespace dory
