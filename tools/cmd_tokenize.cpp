// dory tokenize: text to token ids with the model's own tokenizer.json, like llama-tokenize.
//   dory tokenize -m MODEL_DIR|TOKENIZER_JSON|MODEL.gguf -p TEXT [--show] [--special]
//   dory tokenize -m MODEL_DIR --jsonl FILE      one JSON string per line in, one array out
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "common.h"
#include "dory/error.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace dory::cli {

namespace {

struct TokenizeOpts {
  std::string model, prompt, jsonl;
  bool prompt_set = false, show = false, special = false, no_parse_special = false;
};

std::string ids_line(const std::vector<int32_t>& ids, const char* sep) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += sep;
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

int run_tokenize(const TokenizeOpts& o) {
  if (o.prompt_set == !o.jsonl.empty())
    throw Error("tokenize: give exactly one of -p TEXT and --jsonl FILE");
  auto tok = Tokenizer::from_path(o.model.empty() ? default_model_path() : o.model);
  const bool parse_special = !o.no_parse_special;
  if (o.prompt_set) {
    if (const size_t bad = utf8::first_invalid(o.prompt); bad != std::string::npos)
      throw Error("prompt: not valid UTF-8 at byte " + std::to_string(bad));
    const auto ids = tok->encode(o.prompt, o.special, parse_special);
    if (!o.show) {
      std::printf("%s\n", ids_line(ids, ", ").c_str());
      return 0;
    }
    for (int32_t id : ids) {
      const int32_t one[1] = {id};
      // The raw vocabulary string and what the token reads as, both JSON-quoted so spaces,
      // newlines and partial characters are visible.
      std::printf("%8d  %-24s %s\n", id, nlohmann::json(tok->token_text(id)).dump().c_str(),
                  nlohmann::json(tok->decode(one))
                      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                      .c_str());
    }
    return 0;
  }
  std::ifstream file;
  std::istream* in = &std::cin;
  if (o.jsonl != "-") {
    file.open(o.jsonl, std::ios::binary);
    if (!file) throw Error(o.jsonl + ": cannot open");
    in = &file;
  }
  std::string line, out;
  for (size_t n = 1; std::getline(*in, line); ++n) {
    const std::string where = o.jsonl + ":" + std::to_string(n);
    if (const size_t bad = utf8::first_invalid(line); bad != std::string::npos)
      throw Error(where + ": not valid UTF-8 at byte " + std::to_string(bad));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(where + ": bad JSON: " + e.what());
    }
    if (!j.is_string()) throw Error(where + ": expected a JSON string");
    out = ids_line(tok->encode(j.get_ref<const std::string&>(), o.special, parse_special), ",");
    out += '\n';
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  if (in->bad()) throw Error(o.jsonl + ": read error");
  return 0;
}

}  // namespace

Runner add_tokenize(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("tokenize", "print the token ids of a text (the model's tokenizer.json or GGUF tokenizer)");
  auto o = std::make_shared<TokenizeOpts>();
  cmd->add_option("-m,--model", o->model, "model directory, tokenizer.json, or .gguf (its tokenizer.ggml.* metadata; "
                  "default: the built-in model's)");
  auto* p = cmd->add_option("-p,--prompt", o->prompt, "text to tokenize");
  cmd->add_option(
      "--jsonl", o->jsonl,
      "file of JSON strings, one per line ('-' = stdin); prints one JSON array of ids per line");
  cmd->add_flag("--show", o->show, "one token per line: id, vocabulary string, decoded text");
  cmd->add_flag("--special", o->special, "add BOS/EOS as the tokenizer files say (default: none)");
  cmd->add_flag("--no-parse-special", o->no_parse_special,
                "treat special-token spellings in the text as plain text");
  return [o, p] {
    o->prompt_set = p->count() > 0;
    return run_tokenize(*o);
  };
}

static const bool registered = register_command(20, add_tokenize);

}  // namespace dory::cli
