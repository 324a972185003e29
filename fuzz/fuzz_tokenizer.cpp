// Fuzzes tokenizer.json loading (model, vocab, merges, added tokens, normalizers,
// pre-tokenizers and their regexes, post-processor, decoders) and tokenizer_config.json,
// then encoding and decoding with what loaded.
//
// Input layout: TOKENIZER_JSON [\0 TEXT [\0 TOKENIZER_CONFIG_JSON]]. JSON text cannot hold a
// raw NUL, so the split never cuts a valid file. Without a TEXT part a fixed mixed-script
// string is encoded. Tokenizer::from_json is the in-memory entry point from_files uses.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "text/tokenizer.h"

namespace {
constexpr std::string_view kDefaultText =
    "Hello, world! It's 2024: caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
    "\xd0\x9f\xd1\x80\xd0\xb8 \xf0\x9f\x98\x80  tabs\tand\nnewlines\r\n <s></s><|endoftext|> "
    "\xff\xfe bad bytes";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  bool has_text = false;
  const std::string_view json = dory::fuzz::split_at(rest, '\0', &has_text);
  const std::string_view text = has_text ? dory::fuzz::split_at(rest, '\0') : kDefaultText;
  const std::string_view config = rest;
  dory::fuzz::expect_ok_or_error([&] {
    auto tok = dory::Tokenizer::from_json(json, config);
    (void)tok->chat_template();
    (void)tok->bos_token();
    (void)tok->eos_token();
    const int64_t vocab = tok->vocab_size();
    std::vector<int32_t> ids = tok->encode(text, true, true);
    for (int32_t id : ids)
      if (id < 0 || id >= vocab) __builtin_trap();  // encode must only make known ids
    (void)tok->decode(ids);
    (void)tok->decode(ids, true);
    ids = tok->encode(text, false, false);
    dory::StreamDecoder stream(*tok);
    std::string streamed;
    for (int32_t id : ids) {
      streamed += stream.push(id);
      (void)tok->token_text(id);
      (void)tok->is_special(id);
    }
    streamed += stream.flush();
    // StreamDecoder's promise (tokenizer.h): the pieces add up to decode() of all ids.
    if (streamed != tok->decode(ids, true)) {
      std::fprintf(stderr, "stream decode differs from decode\n");
      std::abort();
    }
    // Arbitrary ids, unknown ones included, decode without complaint.
    std::vector<int32_t> raw;
    for (size_t k = 0; k + 1 < text.size() && k < 64; k += 2)
      raw.push_back(static_cast<int32_t>(static_cast<uint8_t>(text[k]) << 8 |
                                         static_cast<uint8_t>(text[k + 1])) - 4096);
    (void)tok->decode(raw);
    (void)tok->decode(raw, true);
    for (int32_t id : raw) (void)tok->token_text(id);
  });
  return 0;
}
