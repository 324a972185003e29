// Fuzzes config.json: JSON parsing, every key's type and range checks, the cross-key
// validation (DoryConfig::validate), and what the loader derives from a config that passed:
// the tensor list it implies and the loop plan for every loop count a request may ask for.
// parse_hf_config_text is the in-memory half of parse_hf_config (which only reads the file).
#include <string>

#include "format/hf_config.h"
#include "fuzz_common.h"
#include "model/loop_plan.h"
#include "model/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  dory::fuzz::expect_ok_or_error([&] {
    const dory::DoryConfig c = dory::parse_hf_config_text(text, "config.json");
    (void)c.g0();
    (void)c.rotary_dims(1);
    (void)c.rotary_dims(2);
    const auto expected = dory::expected_tensors(c);
    (void)expected;
    for (int loops = 1; loops <= 16; loops *= 2) (void)dory::build_plan(c, dory::KvMode::PerLoop, loops);
  });
  return 0;
}
