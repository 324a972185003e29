#include "model_text.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "model/weights.h"

namespace dory::cli {

Loaded load_model_and_tokenizer(const RunOpts& run, const std::string& tokenizer_path) {
  Loaded l;
  check_device(run.backend_options());
  if (run.skill == "auto")
    throw Error("--skill auto: routing a prompt to a skill is not there yet (give --skill ID or none)");
  l.model = Model::load(run.model_path(), run.placement(), run.skill, run.lora);
  l.backend = run.open(l.model);
  // Without --tokenizer: the model's directory (tokenizer.json), or for a GGUF model the
  // tokenizer.ggml.* metadata inside it (Tokenizer::from_path tells them apart).
  try {
    if (const cmf::File* f = l.model->weights().cmf.get(); f && tokenizer_path.empty()) {
      // A CMF file carries tokenizer.json's bytes and the chat template in its header.
      if (f->vocab().empty()) throw Error(f->path() + ": the CMF file has no tokenizer section");
      nlohmann::json tc = nlohmann::json::object();
      if (!f->chat_template().empty()) tc["chat_template"] = f->chat_template();
      l.tok = Tokenizer::from_json(f->vocab(), tc.dump(), f->path() + " (tokenizer section)",
                                   f->path() + " (header tokenizer_config)");
    } else {
      l.tok = Tokenizer::from_path(tokenizer_path.empty() ? l.model->path() : tokenizer_path);
    }
  } catch (const Error& e) {
    if (!tokenizer_path.empty()) throw;
    throw Error(std::string(e.what()) + " (give --tokenizer DIR|tokenizer.json)");
  }
  const int64_t V = l.model->config().vocab, tv = l.tok->vocab_size();
  if (tv > V)
    throw Error("the tokenizer has " + std::to_string(tv) + " tokens but the model's vocabulary is " +
                std::to_string(V) + ": they do not belong together");
  return l;
}

std::string chat_template_source(const Tokenizer& tok) {
  if (!tok.chat_template().empty()) return tok.chat_template();
  std::fprintf(stderr, "note: the model has no chat template; using ChatML\n");
  return "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
         "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
}

}  // namespace dory::cli
