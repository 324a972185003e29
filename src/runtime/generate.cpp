#include "dory/generate.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "runtime/sampler.h"
#include "text/tokenizer.h"

namespace dory {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
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

TextSession::TextSession(std::shared_ptr<const Model> model, ThreadPool& pool, SessionOptions opts,
                         const Tokenizer& tok)
    : model_(std::move(model)), pool_(pool), opts_(opts), tok_(tok) {
  reset();
}

TextSession::~TextSession() = default;

void TextSession::reset() {
  session_ = std::make_unique<Session>(model_, pool_, opts_);
  tokens_.clear();
  last_logits_.clear();
}

PrefillStats TextSession::prefill(std::span<const int32_t> prompt,
                                  const std::function<void(int64_t, int64_t)>& progress) {
  if (prompt.empty()) throw Error("the prompt is empty");
  const int64_t ctx = model_->config().max_positions;
  if (static_cast<int64_t>(prompt.size()) >= ctx)
    throw Error("the prompt has " + std::to_string(prompt.size()) +
                " tokens; the model's context is " + std::to_string(ctx));
  const auto t0 = Clock::now();
  // Keep the common prefix, but always feed at least the last id: its
  // logits are what the first sampled token needs.
  size_t keep = 0;
  while (keep < tokens_.size() && keep < prompt.size() && tokens_[keep] == prompt[keep]) ++keep;
  keep = std::min(keep, prompt.size() - 1);
  try {
    session_->rollback(static_cast<int64_t>(keep));
  } catch (const Error&) {
    // A sliding window already dropped rows that far back: start over.
    reset();
    keep = 0;
  }
  tokens_.resize(keep);
  session_->prompt_end(static_cast<int64_t>(prompt.size()));
  PrefillStats st;
  st.reused = static_cast<int64_t>(keep);
  const int64_t total = static_cast<int64_t>(prompt.size() - keep);
  const int64_t chunk = std::max(1, opts_.chunk);
  for (int64_t done = 0; done < total;) {
    const int64_t n = std::min(chunk, total - done);
    auto part = prompt.subspan(keep + done, n);
    const bool last = done + n == total;
    auto logits = session_->forward(part, last ? Logits::Last : Logits::None);
    tokens_.insert(tokens_.end(), part.begin(), part.end());
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
  const DoryConfig& c = model_->config();
  std::set<int32_t> eos;
  for (int32_t id : tok_.eos_ids()) eos.insert(id);
  for (int64_t id : c.eos_ids) eos.insert(static_cast<int32_t>(id));
  for (int32_t id : tokens_) sampler.accept(id);

  GenerateStats st;
  StreamDecoder dec(tok_);
  std::string pending;  // decoded text not yet shown (it may start a stop string)
  auto emit = [&](std::string_view s) { return !on_text || on_text(s); };
  // Returns false when generation must end (stop string found or callback said so).
  auto push_text = [&](std::string piece, bool final) {
    pending += piece;
    for (const std::string& s : params.stop) {
      if (s.empty()) continue;
      size_t at = pending.find(s);
      if (at != std::string::npos) {
        if (at) emit(std::string_view(pending).substr(0, at));
        pending.clear();
        st.stop_reason = "stop";
        return false;
      }
    }
    const size_t hold = final ? 0 : stop_holdback(pending, params.stop);
    if (pending.size() > hold) {
      if (!emit(std::string_view(pending).substr(0, pending.size() - hold))) {
        st.stop_reason = "callback";
        return false;
      }
      pending.erase(0, pending.size() - hold);
    }
    return true;
  };

  for (;;) {
    if (cancel && cancel->load()) {
      st.stop_reason = "cancelled";
      break;
    }
    if (params.max_tokens >= 0 && st.tokens >= params.max_tokens) {
      st.stop_reason = "length";
      break;
    }
    if (session_->position() >= c.max_positions) {
      st.stop_reason = "context";
      break;
    }
    const int32_t id = sampler.sample(last_logits_.data(), c.vocab);
    sampler.accept(id);
    if (!params.ignore_eos && eos.count(id)) {
      st.stop_reason = "eos";
      break;
    }
    ++st.tokens;
    if (!push_text(dec.push(id), false)) break;
    last_logits_ = session_->forward({&id, 1}, Logits::Last);
    tokens_.push_back(id);
  }
  if (st.stop_reason != "stop" && st.stop_reason != "callback") push_text(dec.flush(), true);
  st.seconds = since(t0);
  return st;
}

}  // namespace dory
