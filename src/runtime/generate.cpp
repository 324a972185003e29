#include "dory/generate.h"

#include <algorithm>
#include <chrono>

#include "runtime/sampler.h"
#include "text/tokenizer.h"

namespace dory {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
}  // namespace

size_t stop_holdback(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops)
    for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), text.size()); k > hold; --k)
      if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
  return hold;
}

// ---- Sequence ----

Sequence::Sequence(std::shared_ptr<Backend> backend, SessionOptions opts)
    : backend_(std::move(backend)), opts_(std::move(opts)) {
  reset();
}

Sequence::~Sequence() = default;

void Sequence::reset() {
  session_ = std::make_unique<Session>(backend_, opts_);
  tokens_.clear();
  tokens_loops_ = session_->loops();
}

size_t Sequence::reusable(std::span<const int32_t> prompt, int loops,
                          const std::vector<float>& lora) const {
  if (prompt.empty() || loops != tokens_loops_ || lora != tokens_lora_) return 0;
  size_t keep = 0;
  while (keep < tokens_.size() && keep < prompt.size() && tokens_[keep] == prompt[keep]) ++keep;
  return std::min(keep, prompt.size() - 1);
}

size_t Sequence::start(std::span<const int32_t> prompt, int loops, const std::vector<float>& lora) {
  if (prompt.empty()) throw Error("the prompt is empty");
  size_t keep = reusable(prompt, loops, lora);
  try {
    session_->rollback(static_cast<int64_t>(keep));
  } catch (const Error&) {
    // A sliding window or a sealed far field cannot go back that far: start over.
    reset();
    keep = 0;
  }
  if (session_->loops() != loops) session_->set_loops(loops);
  if (session_->lora() != lora) session_->set_lora(lora);
  tokens_.resize(keep);
  tokens_loops_ = loops;
  tokens_lora_ = lora;
  session_->prompt_end(static_cast<int64_t>(prompt.size()));
  return keep;
}

void Sequence::took(std::span<const int32_t> ids) {
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
}

// ---- TextStream ----

TextStream::TextStream(const Tokenizer& tok, const DoryConfig& c, std::vector<std::string> stops,
                       bool ignore_eos, std::function<bool(std::string_view)> emit)
    : dec_(std::make_unique<StreamDecoder>(tok)),
      stops_(std::move(stops)),
      ignore_eos_(ignore_eos),
      emit_(std::move(emit)) {
  for (int32_t id : tok.eos_ids()) eos_.push_back(id);
  for (int64_t id : c.eos_ids) eos_.push_back(static_cast<int32_t>(id));
}

TextStream::~TextStream() = default;
TextStream::TextStream(TextStream&&) noexcept = default;

TextStream::Next TextStream::push(int32_t id) {
  if (!ignore_eos_ && std::find(eos_.begin(), eos_.end(), id) != eos_.end()) return Next::Eos;
  pending_ += dec_->push(id);
  // The earliest stop string ends the text where it starts.
  size_t cut = std::string::npos;
  for (const std::string& s : stops_)
    if (!s.empty()) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    if (cut && emit_) emit_(std::string_view(pending_).substr(0, cut));
    pending_.clear();
    ended_ = true;
    return Next::Stop;
  }
  return send(false) ? Next::More : Next::Refused;
}

bool TextStream::send(bool final) {
  const size_t hold = final ? 0 : stop_holdback(pending_, stops_);
  if (pending_.size() <= hold) return true;
  const bool ok = !emit_ || emit_(std::string_view(pending_).substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  if (!ok) ended_ = true;
  return ok;
}

void TextStream::finish() {
  if (ended_) return;
  pending_ += dec_->flush();
  send(true);
  ended_ = true;
}

// ---- TextSession ----

TextSession::TextSession(std::shared_ptr<Backend> backend, SessionOptions opts,
                         const Tokenizer& tok)
    : tok_(tok), seq_(std::move(backend), std::move(opts)) {}

TextSession::~TextSession() = default;

void TextSession::reset() {
  seq_.reset();
  last_logits_.clear();
}

PrefillStats TextSession::prefill(std::span<const int32_t> prompt,
                                  const std::function<void(int64_t, int64_t)>& progress) {
  if (prompt.empty()) throw Error("the prompt is empty");
  const int64_t ctx = seq_.session().model().config().max_positions;
  if (static_cast<int64_t>(prompt.size()) >= ctx)
    throw Error("the prompt has " + std::to_string(prompt.size()) +
                " tokens; the model's context is " + std::to_string(ctx));
  const auto t0 = Clock::now();
  const size_t keep = seq_.start(prompt, seq_.session().loops());
  PrefillStats st;
  st.reused = static_cast<int64_t>(keep);
  const int64_t total = static_cast<int64_t>(prompt.size() - keep);
  Session& s = seq_.session();
  for (int64_t done = 0; done < total;) {
    const int64_t n = std::min(std::max<int64_t>(1, s.options().chunk), total - done);
    auto part = prompt.subspan(keep + done, n);
    const bool last = done + n == total;
    auto logits = s.forward(part, last ? Logits::Last : Logits::None);
    seq_.took(part);
    if (last) last_logits_ = std::move(logits);
    done += n;
    if (progress) progress(done, total);
  }
  st.fed = total;
  st.seconds = since(t0);
  return st;
}

GenerateStats TextSession::generate(Sampler& sampler, const GenerateParams& params,
                                    const std::function<bool(std::string_view)>& on_text,
                                    const std::atomic<bool>* cancel) {
  if (last_logits_.empty()) throw Error("generate() needs a prompt first (prefill)");
  const auto t0 = Clock::now();
  Session& s = seq_.session();
  const DoryConfig& c = s.model().config();
  for (int32_t id : seq_.tokens()) sampler.accept(id);

  GenerateStats st;
  TextStream text(tok_, c, params.stop, params.ignore_eos, on_text);
  for (;;) {
    if (cancel && cancel->load()) {
      st.stop_reason = "cancelled";
      break;
    }
    if (params.max_tokens >= 0 && st.tokens >= params.max_tokens) {
      st.stop_reason = "length";
      break;
    }
    if (s.position() >= c.max_positions) {
      st.stop_reason = "context";
      break;
    }
    const int32_t id = sampler.sample(last_logits_.data(), c.vocab);
    sampler.accept(id);
    const TextStream::Next next = text.push(id);
    if (next == TextStream::Next::Eos) {
      st.stop_reason = "eos";
      break;
    }
    ++st.tokens;
    if (next == TextStream::Next::Stop || next == TextStream::Next::Refused) {
      st.stop_reason = next == TextStream::Next::Stop ? "stop" : "callback";
      break;
    }
    last_logits_ = s.forward({&id, 1}, Logits::Last);
    seq_.took({&id, 1});
    if (params.after_token) params.after_token(s);
  }
  text.finish();
  st.seconds = since(t0);
  return st;
}

}  // namespace dory
