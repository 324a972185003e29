// Fuzzes the GGUF reader (header, typed metadata, nested arrays, tensor infos, alignment,
// data offsets) on bytes in memory (gguf::File's buffer constructor, the same parse as the
// mapped file), then everything that reads a parsed file: `dory info`'s rendering of each
// value, the tokenizer built from tokenizer.ggml.* (then used once), and the Dory loader
// (config from the dory.* keys, every tensor's presence, type and shape, then folding the
// 1-D scale tensors, which reads their data).
#include <memory>
#include <string>

#include "format/gguf.h"
#include "fuzz_common.h"
#include "model/weights.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<dory::gguf::File> file;
  dory::fuzz::expect_ok_or_error(
      [&] { file = std::make_unique<dory::gguf::File>(data, size, "fuzz.gguf"); });
  if (!file) return 0;
  for (const auto& [key, value] : file->metadata()) (void)value.show();
  for (const auto& t : file->tensors())
    if (t.view.numel() <= (1 << 16)) (void)t.view.to_f32();
  dory::fuzz::expect_ok_or_error([&] {
    auto tok = dory::Tokenizer::from_gguf(*file);
    const auto ids = tok->encode("Hello, world! <|im_start|>user\n caf\xc3\xa9 12345", true);
    (void)tok->decode(ids);
  });
  dory::fuzz::expect_ok_or_error([&] {
    auto w = dory::load_gguf_weights(std::move(file));
    (void)w;
  });
  return 0;
}
