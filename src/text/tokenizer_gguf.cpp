// dory::Tokenizer from a GGUF file's tokenizer.ggml.* metadata (llama.cpp's keys). The metadata
// is turned into the tokenizer.json + tokenizer_config.json it stands for, and those go through
// the very code that loads a Hugging Face directory, so both paths tokenize alike.
//
// What GGUF does not carry is lost: added tokens' single_word / lstrip / rstrip flags (every
// added token matches anywhere, as llama.cpp matches them), a normalizer other than the
// model type's own.
#include <algorithm>
#include <cstdio>
#include <map>

#include "dory/error.h"
#include "format/gguf.h"
#include "text/tokenizer.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace dory {

using tok::json;

namespace {

// The regexes llama.cpp's llm_tokenizer_bpe runs for each tokenizer.ggml.pre name, in their
// tokenizer.json spelling (llama.cpp rewrites some for its own engine; ours runs the
// originals). Each is a Split(Isolated) in turn, as unicode_regex_split applies them.
struct PreName {
  const char* names;  // '|'-separated
  std::vector<const char*> regexes;
  bool ignore_merges, add_bos;  // llama.cpp's defaults for the name
};

const char* const kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char* const kLlama3 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kTekken =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kGpt2NoTail =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

const std::vector<PreName>& pre_names() {
  static const std::vector<PreName> v = {
      {"gpt-2|mpt|olmo|jais", {kGpt2}, false, false},
      {"llama3|llama-v3|llama-bpe|falcon3|pixtral|dbrx|smaug-bpe", {kLlama3}, true, true},
      {"chatglm-bpe", {kLlama3}, false, false},
      {"qwen2|stablelm2|deepseek-r1-qwen|megrez", {kQwen2}, false, false},
      {"tekken", {kTekken}, true, true},
      {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b", {"\\p{N}", kGpt2NoTail},
       false, false},
      {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2NoTail, "[0-9][0-9][0-9]"}, false, false},
      {"poro-chat|bloom|gpt3-finnish", {" ?[^(\\s|.,!?…。，、।۔،)]+"}, false, false},
      {"viking", {" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"}, false, false},
      {"deepseek-coder",
       {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"},
       false, false},
      {"default",
       {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2NoTail, "\\p{N}+", "[0-9][0-9][0-9]"},
       false, false},
  };
  return v;
}

const PreName* find_pre(const std::string& name) {
  for (const PreName& p : pre_names()) {
    std::string_view all = p.names;
    while (!all.empty()) {
      const size_t bar = all.find('|');
      if (all.substr(0, bar) == name) return &p;
      if (bar == std::string_view::npos) break;
      all.remove_prefix(bar + 1);
    }
  }
  return nullptr;
}

std::string known_pre_names() {
  std::string s;
  for (const PreName& p : pre_names()) {
    std::string n = p.names;
    std::replace(n.begin(), n.end(), '|', ' ');
    s += (s.empty() ? "" : " ") + n;
  }
  return s;
}

struct Meta {
  const gguf::File& f;
  std::string where(const std::string& key) const { return f.path() + ": " + key; }
  const gguf::Value* get(const std::string& key) const { return f.find(key); }
  std::string str(const std::string& key, const std::string& dflt) const {
    const gguf::Value* v = get(key);
    if (!v) return dflt;
    if (v->type != gguf::VType::STRING) throw Error(where(key) + ": expected a string");
    return v->s;
  }
  std::optional<int64_t> id(const std::string& key, size_t n_tokens) const {
    const gguf::Value* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_int()) throw Error(where(key) + ": expected an integer token id");
    // llama.cpp writes -1 (as u32 0xFFFFFFFF) for "none".
    if (v->i == -1 || v->u == 0xFFFFFFFFull) return std::nullopt;
    if (v->i < 0 || static_cast<uint64_t>(v->i) >= n_tokens)
      throw Error(where(key) + ": token id " + std::to_string(v->i) + " is not in the " +
                  std::to_string(n_tokens) + "-token vocabulary");
    return v->i;
  }
  std::optional<bool> flag(const std::string& key) const {
    const gguf::Value* v = get(key);
    if (!v) return std::nullopt;
    if (v->type != gguf::VType::BOOL && !v->is_int())
      throw Error(where(key) + ": expected a bool");
    return v->u != 0;
  }
  const gguf::Value* array(const std::string& key, bool required) const {
    const gguf::Value* v = get(key);
    if (!v) {
      if (required) throw Error(f.path() + ": no " + key + " (the file has no tokenizer)");
      return nullptr;
    }
    if (v->type != gguf::VType::ARRAY) throw Error(where(key) + ": expected an array");
    return v;
  }
};

bool is_pad_placeholder(const std::string& t, size_t id) {
  return t == "[PAD" + std::to_string(id) + "]";
}

// SentencePiece BPE without merges: merges from the scores, as transformers'
// SentencePieceExtractor builds them (every split of a piece into two pieces, ranked by the
// score of the merged piece, best first). llama.cpp's SPM merges by the same scores.
json merges_from_scores(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                        const tok::StrMap<int32_t>& ids, const std::vector<int32_t>& types) {
  struct M {
    float score;
    int32_t merged, left, right;
    std::string a, b;
  };
  std::vector<M> ms;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] != 1) continue;  // normal pieces only
    const std::string& t = tokens[i];
    size_t k = 0, len = 0;
    while (k < t.size()) {
      utf8::decode_at(t, k, &len);
      k += std::max<size_t>(len, 1);
      if (k >= t.size()) break;
      auto l = ids.find(std::string_view(t).substr(0, k));
      auto r = ids.find(std::string_view(t).substr(k));
      if (l != ids.end() && r != ids.end())
        ms.push_back({scores[i], static_cast<int32_t>(i), l->second, r->second, t.substr(0, k),
                      t.substr(k)});
    }
  }
  std::stable_sort(ms.begin(), ms.end(), [](const M& x, const M& y) {
    if (x.score != y.score) return x.score > y.score;
    if (x.merged != y.merged) return x.merged < y.merged;
    if (x.left != y.left) return x.left < y.left;
    return x.right < y.right;
  });
  json out = json::array();
  for (const M& m : ms) out.push_back(json::array({m.a, m.b}));
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& f) {
  const Meta m{f};
  const std::string model = m.str("tokenizer.ggml.model", "");
  if (model.empty()) throw Error(f.path() + ": no tokenizer.ggml.model (the file has no tokenizer)");
  if (model != "gpt2" && model != "llama")
    throw Error(f.path() + ": tokenizer.ggml.model \"" + model +
                "\" is not supported (only \"gpt2\" byte-level BPE and \"llama\" SentencePiece BPE)");
  const bool spm = model == "llama";

  const gguf::Value* tv = m.array("tokenizer.ggml.tokens", true);
  if (tv->elem != gguf::VType::STRING)
    throw Error(m.where("tokenizer.ggml.tokens") + ": expected an array of strings");
  const size_t n = tv->arr.size();
  if (n == 0) throw Error(m.where("tokenizer.ggml.tokens") + ": empty");
  std::vector<std::string> tokens(n);
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = tv->arr[i].s;
    if (!utf8::is_valid(tokens[i]))
      throw Error(m.where("tokenizer.ggml.tokens") + "[" + std::to_string(i) + "]: not valid UTF-8");
  }
  std::vector<int32_t> types(n, 1);
  if (const gguf::Value* ty = m.array("tokenizer.ggml.token_type", false)) {
    if (ty->arr.size() != n)
      throw Error(m.where("tokenizer.ggml.token_type") + ": " + std::to_string(ty->arr.size()) +
                  " entries for " + std::to_string(n) + " tokens");
    for (size_t i = 0; i < n; ++i) {
      if (!ty->arr[i].is_int()) throw Error(m.where("tokenizer.ggml.token_type") + ": expected integers");
      types[i] = static_cast<int32_t>(ty->arr[i].i);
    }
  }

  const std::string pre_name = m.str("tokenizer.ggml.pre", "default");
  const PreName* pre = nullptr;
  if (!spm) {
    pre = find_pre(pre_name);
    if (!pre)
      throw Error(f.path() + ": tokenizer.ggml.pre \"" + pre_name +
                  "\" is not a pre-tokenizer this engine knows (known: " + known_pre_names() + ")");
  }

  // The model: every token in the vocabulary (later duplicates win, as in llama.cpp).
  json vocab = json::object();
  tok::StrMap<int32_t> ids;
  for (size_t i = 0; i < n; ++i) {
    vocab[tokens[i]] = static_cast<int64_t>(i);
    ids[tokens[i]] = static_cast<int32_t>(i);
  }
  json merges = json::array();
  if (const gguf::Value* mv = m.array("tokenizer.ggml.merges", false)) {
    if (mv->elem != gguf::VType::STRING)
      throw Error(m.where("tokenizer.ggml.merges") + ": expected an array of strings");
    // Checked here: the JSON the pipeline is built from cannot hold invalid UTF-8.
    for (size_t k = 0; k < mv->arr.size(); ++k) {
      if (!utf8::is_valid(mv->arr[k].s))
        throw Error(m.where("tokenizer.ggml.merges") + "[" + std::to_string(k) + "]: not valid UTF-8");
      merges.push_back(mv->arr[k].s);
    }
  } else if (spm) {
    const gguf::Value* sv = m.array("tokenizer.ggml.scores", true);
    if (sv->arr.size() != n)
      throw Error(m.where("tokenizer.ggml.scores") + ": " + std::to_string(sv->arr.size()) +
                  " scores for " + std::to_string(n) + " tokens");
    std::vector<float> scores(n);
    for (size_t i = 0; i < n; ++i) scores[i] = static_cast<float>(sv->arr[i].f);
    merges = merges_from_scores(tokens, scores, ids, types);
  } else {
    throw Error(f.path() + ": no tokenizer.ggml.merges (a gpt2 tokenizer needs them)");
  }

  const auto bos = m.id("tokenizer.ggml.bos_token_id", n);
  const auto eos = m.id("tokenizer.ggml.eos_token_id", n);
  const auto unk = m.id("tokenizer.ggml.unknown_token_id", n);
  const auto eot = m.id("tokenizer.ggml.eot_token_id", n);
  const auto eom = m.id("tokenizer.ggml.eom_token_id", n);

  json tj;
  tj["version"] = "1.0";
  json bpe = {{"type", "BPE"},         {"vocab", std::move(vocab)},
              {"merges", std::move(merges)}, {"fuse_unk", spm},
              {"byte_fallback", spm},  {"ignore_merges", pre ? pre->ignore_merges : false}};
  if (spm && unk) bpe["unk_token"] = tokens[*unk];
  tj["model"] = std::move(bpe);

  // Control tokens (and SentencePiece's unknown) are special added tokens; user-defined ones
  // plain added tokens, except the [PADn] fillers a conversion pads the list with.
  json added = json::array();
  for (size_t i = 0; i < n; ++i) {
    const int32_t t = types[i];
    const bool special = t == 3 || (spm && t == 2);
    if (!special && t != 4) continue;
    if (t == 4 && is_pad_placeholder(tokens[i], i)) continue;
    added.push_back({{"id", static_cast<int64_t>(i)}, {"content", tokens[i]},
                     {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", !special}, {"special", special}});
  }
  tj["added_tokens"] = std::move(added);

  if (spm) {
    const bool prefix = m.flag("tokenizer.ggml.add_space_prefix").value_or(true);
    tj["normalizer"] = nullptr;
    tj["pre_tokenizer"] = {{"type", "Metaspace"},
                           {"replacement", "\xe2\x96\x81"},
                           {"prepend_scheme", prefix ? "first" : "never"},
                           {"split", false}};
    tj["decoder"] = {{"type", "Sequence"},
                     {"decoders",
                      json::array({{{"type", "Replace"},
                                    {"pattern", {{"String", "\xe2\x96\x81"}}},
                                    {"content", " "}},
                                   {{"type", "ByteFallback"}},
                                   {{"type", "Fuse"}},
                                   {{"type", "Strip"},
                                    {"content", " "},
                                    {"start", prefix ? 1 : 0},
                                    {"stop", 0}}})}};
  } else {
    tj["normalizer"] = nullptr;
    json seq = json::array();
    if (pre->regexes.size() == 1 && pre->regexes[0] == kGpt2) {
      seq.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}});
    } else {
      for (const char* r : pre->regexes)
        seq.push_back({{"type", "Split"},
                       {"pattern", {{"Regex", r}}},
                       {"behavior", "Isolated"},
                       {"invert", false}});
      seq.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
    }
    tj["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", std::move(seq)}};
    tj["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  }
  tj["post_processor"] = nullptr;

  // The config: BOS/EOS and whether they are added (the file's flags, else llama.cpp's
  // default: BOS for SentencePiece and for the llama3/tekken pre-tokenizers).
  json cfg = json::object();
  if (bos) cfg["bos_token"] = tokens[*bos];
  if (eos) cfg["eos_token"] = tokens[*eos];
  const bool add_bos =
      m.flag("tokenizer.ggml.add_bos_token").value_or(spm || (pre && pre->add_bos));
  const bool add_eos = m.flag("tokenizer.ggml.add_eos_token").value_or(false);
  if (add_bos && !bos)
    throw Error(f.path() + ": tokenizer.ggml.add_bos_token is true but there is no bos_token_id");
  if (add_eos && !eos)
    throw Error(f.path() + ": tokenizer.ggml.add_eos_token is true but there is no eos_token_id");
  cfg["add_bos_token"] = add_bos;
  cfg["add_eos_token"] = add_eos;
  const std::string tmpl = m.str("tokenizer.chat_template", "");
  if (!utf8::is_valid(tmpl)) throw Error(m.where("tokenizer.chat_template") + ": not valid UTF-8");
  if (!tmpl.empty()) cfg["chat_template"] = tmpl;

  const std::string name = f.path() + ": tokenizer.ggml";
  auto t = from_json(tj.dump(), cfg.dump(), name, f.path() + ": tokenizer.ggml (config)");
  tok::Impl& im = *t->impl_;
  // bos/eos by id (a token string may occur twice in a GGUF list).
  if (bos) im.bos_id = static_cast<int32_t>(*bos);
  if (eos) {
    im.eos_ids.assign(1, static_cast<int32_t>(*eos));
    if (add_eos) im.special_rule.after.assign(1, static_cast<int32_t>(*eos));
  }
  if (add_bos) im.special_rule.before.assign(1, static_cast<int32_t>(*bos));
  for (auto e : {eot, eom})
    if (e && std::find(im.eos_ids.begin(), im.eos_ids.end(), *e) == im.eos_ids.end())
      im.eos_ids.push_back(static_cast<int32_t>(*e));
  // The list is the model's vocabulary, fillers included.
  im.vocab_size = std::max<int64_t>(im.vocab_size, static_cast<int64_t>(n));
  return t;
}

namespace tok {

bool is_gguf_file(const std::string& path) {
  std::FILE* fp = std::fopen(path.c_str(), "rb");
  if (!fp) return false;
  char magic[4] = {};
  const size_t got = std::fread(magic, 1, 4, fp);
  std::fclose(fp);
  return got == 4 && magic[0] == 'G' && magic[1] == 'G' && magic[2] == 'U' && magic[3] == 'F';
}

std::unique_ptr<Tokenizer> from_gguf_path(const std::string& path) {
  const gguf::File f(path);
  return Tokenizer::from_gguf(f);
}

}  // namespace tok

}  // namespace dory
