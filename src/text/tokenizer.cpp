// dory::Tokenizer: loading tokenizer.json / tokenizer_config.json, and the encode and decode
// pipelines in the order the Hugging Face library runs them.
#include "text/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dory/error.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace dory {

namespace fs = std::filesystem;
using tok::json;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(path + ": read error");
  return ss.str();
}

json parse_json(std::string_view text, const std::string& name) {
  // nlohmann's parser recurses once per nesting level; a hostile file must not exhaust the
  // stack. Real tokenizer files nest a dozen levels deep.
  int depth = 0;
  bool in_str = false, esc = false;
  for (char c : text) {
    if (in_str) {
      if (esc)
        esc = false;
      else if (c == '\\')
        esc = true;
      else if (c == '"')
        in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      if (++depth > 256) throw Error(name + ": invalid JSON: nested more than 256 levels deep");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw Error(name + ": invalid JSON: " + e.what());
  }
}

// bos_token / eos_token in tokenizer_config.json: a string or an AddedToken-like object.
std::string config_token(const json& cfg, const char* key, const std::string& where) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return tok::get_string(*it, "content", where + "." + key);
  throw Error(where + "." + key + ": expected a string or an object with \"content\"");
}

}  // namespace

namespace tok {

namespace {

// Template items of a TemplateProcessing "single": ids before and after $A.
Template parse_template(const json& pp, const std::string& where) {
  Template t;
  t.present = true;
  const json& single = field(pp, "single", where);
  if (!single.is_array()) throw Error(where + ".single: expected an array");
  const json& specials = field(pp, "special_tokens", where);
  if (!specials.is_object()) throw Error(where + ".special_tokens: expected an object");
  bool seen_a = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string w = where + ".single[" + std::to_string(i) + "]";
    const json& item = single[i];
    if (item.is_object() && item.contains("Sequence")) {
      seen_a = true;  // $A (a "single" template has only the one sequence)
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken"))
      throw Error(w + ": expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    const std::string name = get_string(item["SpecialToken"], "id", w + ".SpecialToken");
    auto sp = specials.find(name);
    if (sp == specials.end())
      throw Error(w + ": special token \"" + name + "\" is not in special_tokens");
    const json& ids = field(*sp, "ids", where + ".special_tokens." + name);
    if (!ids.is_array()) throw Error(where + ".special_tokens." + name + ".ids: expected an array");
    for (const auto& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        throw Error(where + ".special_tokens." + name + ".ids: expected token ids");
      (seen_a ? t.after : t.before).push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  return t;
}

// cls/sep processors (RobertaProcessing, BertProcessing): "cls": ["<s>", 0].
int32_t pair_id(const json& pp, const char* key, const std::string& where) {
  const json& v = field(pp, key, where);
  if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer())
    throw Error(where + "." + key + ": expected [token, id]");
  return static_cast<int32_t>(v[1].get<int64_t>());
}

Template parse_post(const json& pp, const std::string& where) {
  if (pp.is_null()) return {};
  const std::string type = get_string(pp, "type", where);
  if (type == "TemplateProcessing") return parse_template(pp, where);
  if (type == "ByteLevel") return {};
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    Template t;
    t.present = true;
    t.before.push_back(pair_id(pp, "cls", where));
    t.after.push_back(pair_id(pp, "sep", where));
    return t;
  }
  if (type == "Sequence") {
    Template t;
    const json& a = field(pp, "processors", where);
    if (!a.is_array()) throw Error(where + ".processors: expected an array");
    for (size_t i = 0; i < a.size(); ++i) {
      Template s = parse_post(a[i], where + ".processors[" + std::to_string(i) + "]");
      if (s.present) {
        // Each processor wraps what the previous one produced.
        s.before.insert(s.before.end(), t.before.begin(), t.before.end());
        s.after.insert(s.after.begin(), t.after.begin(), t.after.end());
        t = std::move(s);
      }
    }
    return t;
  }
  throw Error(where + ": post-processor " + type + " is not supported");
}

void load_bpe(Bpe& bpe, const json& m, const std::string& where) {
  const std::string type = get_string_or(m, "type", where, "BPE");
  if (type != "BPE")
    throw Error(where + ".type: model " + type + " is not supported (only BPE models are)");
  const json& vocab = field(m, "vocab", where);
  if (!vocab.is_object()) throw Error(where + ".vocab: expected an object of token: id");
  bpe.vocab.reserve(vocab.size());
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= INT32_MAX)
      throw Error(where + ".vocab: the id of \"" + it.key() + "\" is not a valid token id");
    const int32_t id = static_cast<int32_t>(it.value().get<int64_t>());
    if (!utf8::is_valid(it.key())) throw Error(where + ".vocab: a token is not valid UTF-8");
    bpe.vocab[it.key()] = id;
    max_id = std::max<int64_t>(max_id, id);
  }
  if (max_id > 16 * 1024 * 1024)
    throw Error(where + ".vocab: token id " + std::to_string(max_id) + " is implausibly large");
  bpe.id_to_token.assign(static_cast<size_t>(max_id + 1), std::string());
  bpe.has_id.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [t, id] : bpe.vocab) {
    bpe.id_to_token[id] = t;
    bpe.has_id[id] = 1;
  }
  bpe.small_char.assign(0x800, -1);
  for (const auto& [t, id] : bpe.vocab) {
    if (t.empty() || utf8::valid_seq_len(t, 0) != t.size()) continue;
    size_t len;
    const char32_t cp = utf8::decode_at(t, 0, &len);
    if (cp < bpe.small_char.size()) bpe.small_char[cp] = id;
  }
  bpe.byte_ids.fill(-1);
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string name = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
    auto it = bpe.vocab.find(name);
    if (it != bpe.vocab.end()) bpe.byte_ids[b] = it->second;
  }
  bpe.prefix = get_string_or(m, "continuing_subword_prefix", where, "");
  bpe.suffix = get_string_or(m, "end_of_word_suffix", where, "");
  bpe.fuse_unk = get_bool_or(m, "fuse_unk", where, false);
  bpe.byte_fallback = get_bool_or(m, "byte_fallback", where, false);
  bpe.ignore_merges = get_bool_or(m, "ignore_merges", where, false);
  const std::string unk = get_string_or(m, "unk_token", where, "");
  if (!unk.empty()) {
    auto it = bpe.vocab.find(unk);
    // The library errors only when an unknown character meets a missing <unk>; refusing the
    // file up front is the clearer failure.
    if (it == bpe.vocab.end())
      throw Error(where + ".unk_token: \"" + unk + "\" is not in the vocabulary");
    bpe.unk_id = it->second;
  }
  if (auto it = m.find("dropout"); it != m.end() && !it->is_null()) {
    if (!it->is_number()) throw Error(where + ".dropout: expected a number or null");
    // Dropout is a training-time regularizer; inference runs without it.
  }

  const json& merges = field(m, "merges", where);
  if (!merges.is_array()) throw Error(where + ".merges: expected an array");
  bpe.merges.reserve(merges.size());
  const size_t plen = bpe.prefix.size();
  std::string a, b;
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    const std::string w = where + ".merges[" + std::to_string(r) + "]";
    if (e.is_string()) {
      // "a b": the library splits on the space and wants exactly two parts.
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw Error(w + ": expected \"left right\" with one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      throw Error(w + ": expected \"left right\" or [left, right]");
    }
    auto ia = bpe.vocab.find(a), ib = bpe.vocab.find(b);
    if (ia == bpe.vocab.end() || ib == bpe.vocab.end())
      throw Error(w + ": token \"" + (ia == bpe.vocab.end() ? a : b) +
                  "\" is not in the vocabulary");
    // The merged token drops b's continuing-subword prefix.
    std::string merged = a + (plen && b.compare(0, plen, bpe.prefix) == 0 ? b.substr(plen) : b);
    auto im = bpe.vocab.find(merged);
    if (im == bpe.vocab.end())
      throw Error(w + ": merged token \"" + merged + "\" is not in the vocabulary");
    bpe.merges.put(ia->second, ib->second, static_cast<int32_t>(r), im->second);
  }
}

}  // namespace

void Impl::load(std::string_view json_text, std::string_view config_text) {
  const json j = parse_json(json_text, json_name);
  const std::string& W = json_name;
  try {
    if (!j.is_object()) throw Error(W + ": expected a JSON object");
    load_bpe(bpe, field(j, "model", W), W + ": model");
    vocab_size = static_cast<int64_t>(bpe.id_to_token.size());

    if (auto it = j.find("added_tokens"); it != j.end() && !it->is_null()) {
      if (!it->is_array()) throw Error(W + ": added_tokens: expected an array");
      for (size_t i = 0; i < it->size(); ++i) {
        const json& t = (*it)[i];
        const std::string w = W + ": added_tokens[" + std::to_string(i) + "]";
        const int64_t id = get_int_or(t, "id", w, -1);
        if (id < 0 || id >= INT32_MAX) throw Error(w + ".id: expected a token id");
        AddedToken a{static_cast<int32_t>(id),
                     get_string(t, "content", w),
                     get_bool_or(t, "single_word", w, false),
                     get_bool_or(t, "lstrip", w, false),
                     get_bool_or(t, "rstrip", w, false),
                     false,
                     get_bool_or(t, "special", w, false)};
        a.normalized = get_bool_or(t, "normalized", w, !a.special);
        if (!utf8::is_valid(a.content)) throw Error(w + ".content: not valid UTF-8");
        if (a.content.empty()) continue;  // the library ignores empty added tokens
        added_by_content[a.content] = a.id;
        added_by_id[a.id] = added.size();
        if (a.special) special_contents.insert(a.content);
        vocab_size = std::max<int64_t>(vocab_size, id + 1);
        added.push_back(std::move(a));
      }
    }

    normalizer = make_normalizer(j.value("normalizer", json()), W + ": normalizer");
    pre_tokenizer = make_pre_tokenizer(j.value("pre_tokenizer", json()), W + ": pre_tokenizer");
    decoder = make_decoder(j.value("decoder", json()), W + ": decoder");
    post = parse_post(j.value("post_processor", json()), W + ": post_processor");

    // Tokens that match the text as written, and tokens that match the normalized text (their
    // content normalized the same way), as AddedVocabulary builds its two tries.
    for (const auto& a : added) {
      if (a.normalized) {
        std::string c = a.content;
        if (normalizer) normalizer->apply(c);
        trie_norm.add(c, a.id);
      } else {
        trie_raw.add(a.content, a.id);
      }
    }
    for (int32_t id : post.before)
      if (!token_string(id))
        throw Error(W + ": post_processor: token id " + std::to_string(id) +
                    " is not in the vocabulary");
    for (int32_t id : post.after)
      if (!token_string(id))
        throw Error(W + ": post_processor: token id " + std::to_string(id) +
                    " is not in the vocabulary");
  } catch (const json::exception& e) {
    throw Error(W + ": " + e.what());
  }

  // tokenizer_config.json: BOS/EOS, their add rule, the chat template.
  special_rule = post;
  json cfg = json::object();
  const std::string& C = config_name;
  if (!config_text.empty()) {
    cfg = parse_json(config_text, C);
    if (!cfg.is_object()) throw Error(C + ": expected a JSON object");
  }
  try {
    bos_token = config_token(cfg, "bos_token", C);
    eos_token = config_token(cfg, "eos_token", C);
    auto resolve = [&](const std::string& t, const char* key) -> std::optional<int32_t> {
      if (t.empty()) return std::nullopt;
      auto id = added_by_content.find(t);
      if (id != added_by_content.end()) return id->second;
      auto v = bpe.vocab.find(t);
      if (v != bpe.vocab.end()) return v->second;
      throw Error(C + ": " + key + " \"" + t + "\" is not in the vocabulary");
    };
    bos_id = resolve(bos_token, "bos_token");
    if (auto e = resolve(eos_token, "eos_token")) eos_ids.push_back(*e);
    // Without a config, the template's own tokens are the best statement of BOS/EOS.
    if (!bos_id && post.before.size() == 1) {
      bos_id = post.before[0];
      bos_token = *token_string(*bos_id);
    }
    if (eos_ids.empty() && post.after.size() == 1) {
      eos_ids.push_back(post.after[0]);
      eos_token = *token_string(post.after[0]);
    }
    const bool has_bos_flag = cfg.contains("add_bos_token") && !cfg["add_bos_token"].is_null();
    const bool has_eos_flag = cfg.contains("add_eos_token") && !cfg["add_eos_token"].is_null();
    if (has_bos_flag || has_eos_flag) {
      // As transformers' Llama-style tokenizers do: the flags rebuild the template.
      const bool ab = get_bool_or(cfg, "add_bos_token", C, false);
      const bool ae = get_bool_or(cfg, "add_eos_token", C, false);
      special_rule = {};
      special_rule.present = true;
      if (ab) {
        if (!bos_id) throw Error(C + ": add_bos_token is true but there is no bos_token");
        special_rule.before.push_back(*bos_id);
      }
      if (ae) {
        if (eos_ids.empty()) throw Error(C + ": add_eos_token is true but there is no eos_token");
        special_rule.after.push_back(eos_ids[0]);
      }
    }
    if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
      if (it->is_string()) {
        chat_template = it->get<std::string>();
      } else if (it->is_array()) {
        for (const auto& e : *it) {
          if (!e.is_object()) throw Error(C + ": chat_template: expected {name, template} objects");
          if (get_string(e, "name", C + ": chat_template[]") == "default")
            chat_template = get_string(e, "template", C + ": chat_template[]");
        }
      } else {
        throw Error(C + ": chat_template: expected a string or a list of {name, template}");
      }
    }
  } catch (const json::exception& e) {
    throw Error(C + ": " + e.what());
  }
}

const std::string* Impl::token_string(int32_t id) const {
  auto it = added_by_id.find(id);
  if (it != added_by_id.end()) return &added[it->second].content;
  if (id >= 0 && static_cast<size_t>(id) < bpe.has_id.size() && bpe.has_id[id])
    return &bpe.id_to_token[id];
  return nullptr;
}

namespace {

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  size_t len;
  return is_rust_word_char(utf8::decode_at(s, k, &len));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t len;
  return is_rust_word_char(utf8::decode_at(s, 0, &len));
}

// Start of the run of whitespace that ends s.
size_t space_leftmost_at_end(std::string_view s) {
  size_t b = s.size();
  while (b > 0) {
    size_t k = b - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    size_t len;
    if (!is_white_space(utf8::decode_at(s, k, &len))) break;
    b = k;
  }
  return b;
}

// Length of the run of whitespace that starts s.
size_t space_rightmost_at_start(std::string_view s) {
  size_t a = 0;
  while (a < s.size()) {
    size_t len;
    if (!is_white_space(utf8::decode_at(s, a, &len))) break;
    a += len;
  }
  return a;
}

}  // namespace

// AddedVocabulary::find_matches on one piece of text, then split_with_indices.
void Impl::split_added(const std::string& s, bool at_start, const Trie& trie, bool parse_special,
                       std::vector<Segment>& out) const {
  if (trie.empty() || s.empty()) {
    if (!s.empty()) out.push_back({s, -1, at_start});
    return;
  }
  std::vector<std::pair<size_t, size_t>> ranges;
  std::vector<int32_t> ids;
  size_t start_offset = 0;
  size_t i = 0;
  while (i < s.size()) {
    if (!trie.may_start(static_cast<unsigned char>(s[i]))) {
      ++i;
      continue;
    }
    int32_t id = -1;
    const size_t len = trie.longest_at(s, i, &id);
    if (len == 0) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + len;
    i = stop;  // the matcher resumes after the match, whatever is done with it below
    const AddedToken& a = added[added_by_id.at(id)];
    if (!parse_special && a.special) continue;
    if (a.single_word) {
      const bool start_space = start == 0 || !ends_with_word(std::string_view(s).substr(0, start));
      const bool stop_space =
          stop == s.size() || !starts_with_word(std::string_view(s).substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (a.lstrip)
      start = std::max(space_leftmost_at_end(std::string_view(s).substr(0, start)), start_offset);
    if (a.rstrip) stop += space_rightmost_at_start(std::string_view(s).substr(stop));
    if (start_offset < start) {
      ranges.emplace_back(start_offset, start);
      ids.push_back(-1);
    }
    ranges.emplace_back(start, stop);
    ids.push_back(id);
    start_offset = stop;
  }
  if (start_offset < s.size()) {
    ranges.emplace_back(start_offset, s.size());
    ids.push_back(-1);
  }
  for (size_t k = 0; k < ranges.size(); ++k) {
    auto [a, b] = ranges[k];
    if (b <= a && ids[k] < 0) continue;
    out.push_back({ids[k] >= 0 ? std::string() : s.substr(a, b - a), ids[k], at_start && a == 0});
  }
}

std::vector<int32_t> Impl::encode(std::string_view text, bool add_special,
                                  bool parse_special) const {
  std::string valid = utf8::to_valid_lossy(text);
  std::vector<int32_t> ids;
  ids.reserve(valid.size() / 3 + 4);
  const Template& rule = special_rule;
  if (add_special) ids.insert(ids.end(), rule.before.begin(), rule.before.end());

  // 1. Added tokens as written; 2. normalize the rest and find the normalized added tokens.
  std::vector<Segment> raw, segs;
  split_added(valid, true, trie_raw, parse_special, raw);
  for (auto& r : raw) {
    if (r.id >= 0) {
      segs.push_back(std::move(r));
      continue;
    }
    if (normalizer) normalizer->apply(r.text);
    split_added(r.text, r.at_start, trie_norm, parse_special, segs);
  }
  // 3. Pre-tokenize each text segment and run the model on each piece.
  std::vector<Piece> pieces;
  for (auto& sg : segs) {
    if (sg.id >= 0) {
      ids.push_back(sg.id);
      continue;
    }
    pieces.clear();
    pieces.push_back({std::move(sg.text), sg.at_start});
    if (pre_tokenizer) pre_tokenizer->apply(pieces);
    for (const auto& p : pieces) bpe.tokenize(p.text, ids);
  }
  if (add_special) ids.insert(ids.end(), rule.after.begin(), rule.after.end());
  return ids;
}

std::string Impl::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* t = token_string(id);
    if (!t) continue;  // unknown ids are dropped, as the library does
    if (skip_special && special_contents.count(*t)) continue;  // (Tokenizer::decode_drops)
    tokens.push_back(*t);
  }
  if (decoder) {
    decoder->apply(tokens);
    std::string out;
    for (const auto& t : tokens) out += t;
    return out;
  }
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i) out += ' ';
    out += tokens[i];
  }
  return out;
}

}  // namespace tok

// --- Public API ---------------------------------------------------------------------------

Tokenizer::Tokenizer() : impl_(std::make_unique<tok::Impl>()) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json,
                                                std::string_view tokenizer_config_json,
                                                const std::string& json_name,
                                                const std::string& config_name) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->impl_->json_name = json_name;
  t->impl_->config_name = config_name;
  t->impl_->load(tokenizer_json, tokenizer_config_json);
  return t;
}

std::unique_ptr<Tokenizer> Tokenizer::from_files(const std::string& tokenizer_json,
                                                 const std::string& tokenizer_config_json) {
  const std::string j = read_file(tokenizer_json);
  const std::string c =
      tokenizer_config_json.empty() ? std::string() : read_file(tokenizer_config_json);
  return from_json(j, c, tokenizer_json, tokenizer_config_json);
}

std::unique_ptr<Tokenizer> Tokenizer::from_path(const std::string& path) {
  std::error_code ec;
  fs::path dir, tj;
  if (fs::is_directory(path, ec)) {
    dir = path;
    tj = dir / "tokenizer.json";
    if (!fs::exists(tj, ec)) throw Error(path + ": no tokenizer.json in this directory");
  } else {
    if (!fs::exists(path, ec)) throw Error(path + ": no such file or directory");
    if (tok::is_gguf_file(path)) return tok::from_gguf_path(path);
    tj = path;
    dir = tj.parent_path();
    if (dir.empty()) dir = ".";
  }
  const fs::path cfg = dir / "tokenizer_config.json";
  auto t = from_files(tj.string(), fs::exists(cfg, ec) ? cfg.string() : std::string());
  tok::Impl& im = *t->impl_;
  // transformers writes the template beside the config when it is long.
  const fs::path jinja = dir / "chat_template.jinja";
  if (im.chat_template.empty() && fs::exists(jinja, ec))
    im.chat_template = read_file(jinja.string());
  // generation_config.json often lists more EOS ids (e.g. end-of-turn tokens).
  const fs::path gen = dir / "generation_config.json";
  if (fs::exists(gen, ec)) {
    const json g = parse_json(read_file(gen.string()), gen.string());
    if (g.is_object() && g.contains("eos_token_id") && !g["eos_token_id"].is_null()) {
      const json& e = g["eos_token_id"];
      std::vector<json> list =
          e.is_array() ? std::vector<json>(e.begin(), e.end()) : std::vector<json>{e};
      for (const auto& v : list) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= im.vocab_size)
          throw Error(gen.string() + ": eos_token_id: expected token ids of this vocabulary");
        const int32_t id = static_cast<int32_t>(v.get<int64_t>());
        if (std::find(im.eos_ids.begin(), im.eos_ids.end(), id) == im.eos_ids.end())
          im.eos_ids.push_back(id);
      }
    }
  }
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  return impl_->encode(text, add_special, parse_special);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  return impl_->decode(ids, skip_special);
}

int64_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  auto a = impl_->added_by_content.find(token);
  if (a != impl_->added_by_content.end()) return a->second;
  auto v = impl_->bpe.vocab.find(token);
  if (v != impl_->bpe.vocab.end()) return v->second;
  return std::nullopt;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  static const std::string empty;
  const std::string* t = impl_->token_string(id);
  return t ? *t : empty;
}

bool Tokenizer::decode_drops(int32_t id, bool skip_special) const {
  const std::string* t = impl_->token_string(id);
  return !t || (skip_special && impl_->special_contents.count(*t));
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos_id;
}
std::vector<int32_t> Tokenizer::eos_ids() const {
  return impl_->eos_ids;
}
std::string Tokenizer::bos_token() const {
  return impl_->bos_token;
}
std::string Tokenizer::eos_token() const {
  return impl_->eos_token;
}
const std::string& Tokenizer::chat_template() const {
  return impl_->chat_template;
}
bool Tokenizer::adds_bos() const {
  return !impl_->special_rule.before.empty();
}
bool Tokenizer::adds_eos() const {
  return !impl_->special_rule.after.empty();
}

// --- StreamDecoder ----------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tok_(tokenizer), skip_(skip_special) {}

namespace {
bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}
}  // namespace

std::string StreamDecoder::push(int32_t id) {
  // The library's DecodeStream: decode a window that starts one emitted token back (decoders
  // such as Strip or Metaspace treat a window's first token differently, and that token's text
  // is already out), emit what the new ids added, and wait while the text ends in U+FFFD,
  // which is what an unfinished UTF-8 character decodes to.
  ids_.push_back(id);
  // A byte-fallback token (<0xNN>) may still be joined by the next one: ByteFallback decodes a
  // run of them as a whole (all of it, or one U+FFFD per byte), so wait for the run to end.
  // A token that decode drops leaves the run open.
  if (!tok_.decode_drops(id, skip_)) {
    const std::string& t = tok_.token_text(id);
    in_byte_run_ = t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>';
  }
  if (in_byte_run_) return "";
  std::string s = tok_.decode(ids_, skip_);
  if (s.size() <= prefix_.size() || ends_with_replacement(s)) return "";
  std::string out;
  if (s.compare(0, prefix_.size(), prefix_) == 0) {
    out = s.substr(prefix_.size());
  } else {
    // A decoder that rewrote earlier text; emit only what follows the common part, at a
    // character boundary.
    size_t k = 0;
    while (k < prefix_.size() && k < s.size() && s[k] == prefix_[k]) ++k;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    out = s.substr(k);
  }
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tok_.decode(ids_, skip_);
  prefix_index_ = ids_.size();
  return out;
}

std::string StreamDecoder::flush() {
  std::string s = tok_.decode(ids_, skip_);
  std::string out;
  if (s.size() > prefix_.size() && s.compare(0, prefix_.size(), prefix_) == 0)
    out = s.substr(prefix_.size());
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  in_byte_run_ = false;
  return out;
}

}  // namespace dory
