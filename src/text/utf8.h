// UTF-8 helpers for the tokenizer: decoding code points, validation, and the lossy repair
// Hugging Face tokenizers apply (Rust's String::from_utf8_lossy), which decode parity needs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dory::utf8 {

constexpr char32_t kReplacement = 0xFFFD;

// Length of the valid UTF-8 sequence starting at s[i] (1-4), or 0 when the bytes there are not
// a valid sequence (bad lead byte, bad or missing continuation, overlong, surrogate, > U+10FFFF).
size_t valid_seq_len(std::string_view s, size_t i);

// The code point at s[i]; s must be valid UTF-8 there (check with valid_seq_len first).
// Sets *len to the sequence length.
char32_t decode_at(std::string_view s, size_t i, size_t* len);

// Appends the UTF-8 encoding of cp (cp must be a scalar value).
void append(std::string& out, char32_t cp);

// Byte offset of the first invalid sequence, or npos when all of s is valid UTF-8.
size_t first_invalid(std::string_view s);
inline bool is_valid(std::string_view s) {
  return first_invalid(s) == std::string_view::npos;
}

// s with every invalid sequence replaced by U+FFFD, exactly as Rust's from_utf8_lossy does:
// each maximal prefix of a valid sequence (at least one byte) becomes one U+FFFD.
std::string to_valid_lossy(std::string_view s);

// Length of the longest prefix of s that does not end in the middle of a sequence that could
// still be completed by more bytes. Bytes that can never become valid do not hold it back.
size_t complete_prefix_len(std::string_view s);

}  // namespace dory::utf8
