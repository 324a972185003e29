// Internals of dory::Tokenizer, shared by the files of src/text that implement it.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "text/regex.h"
#include "text/tokenizer.h"

namespace dory::tok {

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StrMap = std::unordered_map<std::string, V, SvHash, std::equal_to<>>;

// GPT-2's byte <-> printable character table (bytes_to_unicode).
struct ByteMap {
  std::array<char32_t, 256> to_char{};
  std::array<std::string, 256> to_utf8;  // to_char as UTF-8
  std::array<int16_t, 324> to_byte{};    // code point (all < 324) -> byte, -1 if none
  static const ByteMap& get();
};

// A piece of text on its way through normalizer and pre-tokenizers. at_start: the piece
// begins at offset 0 of the original text (Metaspace's prepend_scheme "first" asks).
struct Piece {
  std::string text;
  bool at_start;
};

// --- Normalizers -----------------------------------------------------------------------
struct Normalizer {
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
};

// --- Pre-tokenizers ----------------------------------------------------------------------
struct PreTokenizer {
  virtual ~PreTokenizer() = default;
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};

// --- Decoders ------------------------------------------------------------------------------
struct Decoder {
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};

// A literal string or a regex, as tokenizer.json's {"String": ...} / {"Regex": ...}.
struct Pattern {
  std::string literal;
  std::unique_ptr<Regex> regex;
  // (start, end, is_match) covering all of s, like the library's Pattern::find_matches.
  void find_matches(std::string_view s, std::vector<std::pair<size_t, size_t>>& ranges,
                    std::vector<char>& is_match) const;
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
// Applies a split behavior to matches covering s; appends the kept pieces (non-empty).
void split_pieces(const Piece& p, const std::vector<std::pair<size_t, size_t>>& ranges,
                  const std::vector<char>& is_match, SplitBehavior b, std::vector<Piece>& out);

// --- BPE model -----------------------------------------------------------------------------
class MergeMap {
 public:
  void reserve(size_t n);
  void put(int32_t a, int32_t b, int32_t rank, int32_t new_id);  // later puts win
  // Returns false when (a, b) has no merge.
  bool get(int32_t a, int32_t b, int32_t* rank, int32_t* new_id) const {
    if (slots_.empty()) return false;
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    size_t i = hash(key) & mask_;
    for (;;) {
      const Slot& s = slots_[i];
      if (s.key == key && s.rank >= 0) {
        *rank = s.rank;
        *new_id = s.new_id;
        return true;
      }
      if (s.rank < 0) return false;
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return n_; }

 private:
  struct Slot {
    uint64_t key = 0;
    int32_t rank = -1, new_id = -1;
  };
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, n_ = 0;
};

struct Bpe {
  StrMap<int32_t> vocab;
  std::vector<std::string> id_to_token;  // "" where the model has no such id
  std::vector<char> has_id;
  MergeMap merges;
  std::optional<int32_t> unk_id;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string prefix, suffix;           // continuing_subword_prefix, end_of_word_suffix
  std::array<int32_t, 256> byte_ids{};  // <0xNN>, -1 when absent
  std::vector<int32_t> small_char;      // id of the one-character token for code points < 0x800

  // Appends the ids of one pre-token.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  // Bounded cache of words already merged (the same words recur all the time in text).
  mutable std::mutex cache_mu;
  mutable StrMap<std::vector<int32_t>> cache;
  static constexpr size_t kCacheMax = 1 << 17;  // entries, then it starts over
  static constexpr size_t kCacheWordMax = 256;  // longer words are not cached

 private:
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_cached(std::string_view word, std::vector<int32_t>& out) const;
  // Long words (a whole text, when a file has no pre-tokenizer) are cut where no merge can
  // ever join the characters on both sides: where that character pair occurs inside no
  // vocabulary token. Merging the parts is then exactly merging the whole, and fast.
  void build_pairs() const;
  mutable std::once_flag pairs_once;
  mutable std::vector<uint64_t> pairs;  // open-addressing set of (left << 32 | right) + 1
  bool pair_inside_token(char32_t a, char32_t b) const;
};

// --- Added tokens ----------------------------------------------------------------------
struct AddedToken {
  int32_t id;
  std::string content;
  bool single_word, lstrip, rstrip, normalized, special;
};

// Leftmost-longest multi-pattern matcher over bytes (the library uses Aho-Corasick with
// MatchKind::LeftmostLongest).
class Trie {
 public:
  void add(std::string_view s, int32_t value);
  bool empty() const { return nodes_.size() <= 1; }
  // Longest pattern starting at text[i]: its length and value, or 0.
  size_t longest_at(std::string_view text, size_t i, int32_t* value) const;
  bool may_start(unsigned char c) const { return first_[c]; }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;
    int32_t value = -1;
  };
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
};

// A segment of input after the added-token split: text, or one added token (id >= 0).
struct Segment {
  std::string text;
  int32_t id;
  bool at_start;
};

// --- Post-processing -------------------------------------------------------------------
struct Template {
  std::vector<int32_t> before, after;  // ids around $A in the "single" template
  bool present = false;
};

struct Impl {
  std::string json_name, config_name;
  Bpe bpe;
  std::vector<AddedToken> added;  // in file order
  std::unordered_map<int32_t, size_t> added_by_id;
  StrMap<int32_t> added_by_content;
  std::unordered_set<std::string> special_contents;
  Trie trie_raw, trie_norm;  // non-normalized / normalized added tokens
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  Template post;          // from the post_processor
  Template special_rule;  // what add_special adds (config or post)
  int64_t vocab_size = 0;
  std::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;
  std::string bos_token, eos_token, chat_template;

  void load(std::string_view json, std::string_view config);
  void split_added(const std::string& text, bool at_start, const Trie& trie, bool parse_special,
                   std::vector<Segment>& out) const;
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;
  const std::string* token_string(int32_t id) const;
};

// Builders from tokenizer.json objects (src/text/pipeline.cpp). `where` names the place in
// the file for errors, e.g. "tokenizer.json: pre_tokenizer.pretokenizers[1]".
using json = nlohmann::json;
std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where);
std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where);
Pattern make_pattern(const json& j, const std::string& where);
// Typed field access that throws dory::Error("<where>.<key>: ...").
const json& field(const json& j, const char* key, const std::string& where);
std::string get_string(const json& j, const char* key, const std::string& where);
std::string get_string_or(const json& j, const char* key, const std::string& where,
                          const std::string& dflt);
bool get_bool_or(const json& j, const char* key, const std::string& where, bool dflt);
int64_t get_int_or(const json& j, const char* key, const std::string& where, int64_t dflt);
void byte_level_map(std::string& s);  // bytes -> GPT-2 characters, in place

// src/text/tokenizer_gguf.cpp: whether a file starts with the GGUF magic, and its tokenizer.
bool is_gguf_file(const std::string& path);
std::unique_ptr<Tokenizer> from_gguf_path(const std::string& path);

}  // namespace dory::tok
