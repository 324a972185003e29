// The regexes tokenizer.json files write (pre-tokenizer Split patterns, the GPT-2 pattern of
// ByteLevel, Replace normalizers), run through PCRE2 with the semantics of Oniguruma, which is
// what Hugging Face tokenizers compiles them with.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dory {

class Regex {
 public:
  // Throws dory::Error (message "regex <pattern>: <why>") when PCRE2 rejects the pattern.
  explicit Regex(const std::string& onig_pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every match in `text` (valid UTF-8), in order, as Oniguruma's find_iter yields them:
  // leftmost-first, and an empty match right where the previous match ended is skipped by
  // searching again one character later. Offsets are bytes.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;
  // Whether the regex matches anywhere in text.
  bool search(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }
  const std::string& pcre2_pattern() const { return converted_; }

 private:
  std::string pattern_, converted_;
  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
};

// Oniguruma (Ruby syntax) pattern -> PCRE2 pattern with the same meaning under UTF + UCP.
// Only what differs is rewritten: \s \S (Oniguruma's is White_Space; PCRE2's adds U+180E),
// \w \W (Oniguruma's is Alphabetic, marks, decimal digits and connector punctuation;
// PCRE2's is letters, all numbers and '_'), \h \H
// (hex digits in Oniguruma), and \uHHHH (not PCRE2 syntax).
std::string onig_to_pcre2(const std::string& pattern);

// Escapes every regex metacharacter of a literal string.
std::string regex_escape(std::string_view literal);

// Character classes the added-token rules use, as Rust's regex crate defines them.
bool is_rust_word_char(char32_t cp);  // \w: Alphabetic, M, Nd, Pc, Join_Control
bool is_white_space(char32_t cp);     // \s and char::is_whitespace: White_Space
bool is_rust_numeric(char32_t cp);    // char::is_numeric: Nd, Nl, No

}  // namespace dory
