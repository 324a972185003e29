#include "server/engine.h"

#include <algorithm>
#include <optional>

#include "backend/backend.h"
#include "text/tokenizer.h"

namespace dory::server {

namespace {
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

bool Job::wait(std::vector<JobEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (events_.empty()) cv_.wait_for(lk, timeout, [&] { return !events_.empty(); });
  if (events_.empty()) return false;
  for (auto& e : events_) out.push_back(std::move(e));
  events_.clear();
  return true;
}

void Job::push(JobEvent e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

struct Engine::Slot {
  int id = 0;
  std::unique_ptr<Sequence> seq;
  uint64_t last_used = 0;

  std::shared_ptr<Job> job;  // null: idle
  bool decoding = false;     // false: still feeding the prompt
  size_t fed = 0;            // prompt ids in the cache so far
  int32_t next_id = 0;       // decoding: the id to feed next
  std::optional<Sampler> sampler;
  std::optional<TextStream> text;
  JobResult result;
  Clock::time_point t_assigned, t_prompt_done;
};

Engine::Engine(std::shared_ptr<Backend> backend, const Tokenizer& tok, EngineOptions opts)
    : backend_(std::move(backend)), tok_(tok), opts_(opts), t0_(Clock::now()) {
  const DoryConfig& c = backend_->model().config();
  if (opts_.slots < 1) throw Error("--parallel must be at least 1");
  if (opts_.ctx <= 0 || opts_.ctx > c.max_positions) opts_.ctx = c.max_positions;
  if (opts_.session.chunk == 0) opts_.session.chunk = backend_->default_chunk();
  if (opts_.prefill_rows <= 0) opts_.prefill_rows = opts_.session.chunk;
  for (int i = 0; i < opts_.slots; ++i) {
    auto s = std::make_unique<Slot>();
    s->id = i;
    s->seq = std::make_unique<Sequence>(backend_, opts_.session);
    slots_.push_back(std::move(s));
  }
  default_loops_ = slots_[0]->seq->session().loops();
  stats_.slots = opts_.slots;
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  shutdown();
}

std::shared_ptr<Job> Engine::submit(JobSpec spec) {
  auto job = std::make_shared<Job>(std::move(spec));
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) throw Error("the server is shutting down");
    queue_.push_back(job);
    stats_.queued = static_cast<int>(queue_.size());
  }
  cv_.notify_all();
  return job;
}

void Engine::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  EngineStats s = stats_;
  const int64_t now =
      static_cast<int64_t>(std::chrono::duration<double>(Clock::now() - t0_).count());
  // The last 10 whole seconds (fewer right after start).
  const int64_t span = std::max<int64_t>(1, std::min<int64_t>(10, now));
  int64_t p = 0, g = 0;
  for (const Bucket& b : buckets_)
    if (b.second >= now - span && b.second < now) {
      p += b.prompt;
      g += b.gen;
    }
  s.prompt_tps = double(p) / double(span);
  s.gen_tps = double(g) / double(span);
  return s;
}

void Engine::run() {
  for (;;) {
    bool any_busy = false;
    for (const auto& s : slots_) any_busy |= s->job != nullptr;
    std::vector<std::pair<Slot*, std::shared_ptr<Job>>> starting;
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (!any_busy) cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (stop_) break;
      // Jobs whose client left while they waited never take a slot.
      for (auto it = queue_.begin(); it != queue_.end();) {
        if ((*it)->cancelled()) {
          JobEvent e{JobEvent::Kind::Done, {}, {}};
          e.result.finish_reason = "cancelled";
          (*it)->push(std::move(e));
          ++stats_.jobs_cancelled;
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      // FIFO: each job takes the idle slot sharing the longest prefix with it.
      while (!queue_.empty()) {
        std::shared_ptr<Job>& job = queue_.front();
        const auto& prompt = job->spec().prompt;
        const int loops = job->spec().loops ? job->spec().loops : default_loops();
        Slot* best = nullptr;
        size_t best_lcp = 0;
        for (auto& s : slots_) {
          if (s->job) continue;
          bool taken = false;
          for (auto& st : starting) taken |= st.first == s.get();
          if (taken) continue;
          const size_t lcp = s->seq->reusable(prompt, loops, job->spec().lora);
          if (!best || lcp > best_lcp || (lcp == best_lcp && s->last_used < best->last_used)) {
            best = s.get();
            best_lcp = lcp;
          }
        }
        if (!best) break;
        starting.emplace_back(best, std::move(job));
        queue_.pop_front();
      }
      stats_.queued = static_cast<int>(queue_.size());
    }
    for (auto& [slot, job] : starting) {
      try {
        assign(*slot, std::move(job));
      } catch (const std::exception& e) {  // not expected: requests are checked at submit
        fail(*slot, e.what());
      }
    }
    for (auto& s : slots_)
      if (s->job && s->job->cancelled()) finish(*s, "cancelled");
    step();
  }
  // Shutting down: every job still here ends.
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    left.swap(queue_);
  }
  for (auto& s : slots_)
    if (s->job) finish(*s, "cancelled");
  for (auto& job : left) {
    JobEvent e{JobEvent::Kind::Done, {}, {}};
    e.result.finish_reason = "cancelled";
    job->push(std::move(e));
  }
}

void Engine::assign(Slot& s, std::shared_ptr<Job> job) {
  const JobSpec& spec = job->spec();
  const int loops = spec.loops ? spec.loops : default_loops();
  s.job = std::move(job);
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.busy;
  }
  s.t_assigned = Clock::now();
  s.result = JobResult{};
  s.result.slot = s.id;
  s.result.prompt_tokens = static_cast<int64_t>(spec.prompt.size());
  s.result.queue_ms = ms_between(s.job->submitted_, s.t_assigned);
  if (spec.hooks) {
    s.seq->reset();
    spec.hooks->start(s.seq->session());
  }
  const size_t keep = s.seq->start(spec.prompt, loops, spec.lora);
  s.fed = keep;
  s.decoding = false;
  s.result.cached_tokens = static_cast<int64_t>(keep);
  s.sampler.emplace(spec.sampling);
  for (int32_t id : spec.prompt) s.sampler->accept(id);
  Job* j = s.job.get();
  s.text.emplace(tok_, backend_->model().config(), spec.stop, spec.ignore_eos,
                 [j](std::string_view piece) {
                   j->push({JobEvent::Kind::Text, std::string(piece), {}});
                   return true;
                 });
  std::lock_guard<std::mutex> lk(mu_);
  stats_.cached_tokens += static_cast<int64_t>(keep);
}

// One batched forward over every busy slot. Returns false if nothing ran.
bool Engine::step() {
  std::vector<BatchEntry> entries;
  std::vector<Slot*> owner;
  int64_t budget = opts_.prefill_rows, prompt_rows = 0, decode_rows = 0;
  for (auto& s : slots_)
    if (s->job && s->decoding) {
      entries.push_back(
          {&s->seq->session(), std::span<const int32_t>(&s->next_id, 1), Logits::Last, {}});
      owner.push_back(s.get());
      ++decode_rows;
    }
  // Prompts in the order their jobs arrived, so the oldest gets its first token first.
  std::vector<Slot*> reading;
  for (auto& s : slots_)
    if (s->job && !s->decoding) reading.push_back(s.get());
  std::sort(reading.begin(), reading.end(),
            [](const Slot* a, const Slot* b) { return a->job->submitted_ < b->job->submitted_; });
  for (Slot* s : reading) {
    if (budget <= 0) break;
    const auto& prompt = s->job->spec().prompt;
    // At most what the session takes in one pass (its chunk, cut at an exact-row rebuild point).
    const int64_t n = std::min<int64_t>(
        {budget, static_cast<int64_t>(prompt.size() - s->fed), s->seq->session().next_rows()});
    const bool last = s->fed + n == prompt.size();
    entries.push_back({&s->seq->session(),
                       std::span<const int32_t>(prompt.data() + s->fed, n),
                       last ? Logits::Last : Logits::None,
                       {}});
    owner.push_back(s);
    budget -= n;
    prompt_rows += n;
  }
  if (entries.empty()) return false;

  const auto t0 = Clock::now();
  try {
    Session::forward_batch(entries);
  } catch (const std::exception& e) {
    // Not expected (ids are checked at submit); fail these jobs, keep serving.
    for (Slot* s : owner) fail(*s, e.what());
    return true;
  }
  const auto t1 = Clock::now();
  // The caches as this pass left them go into the stats before any job of it is answered, so a
  // client that reads /metrics right after its response sees them (nothing below moves a cache).
  uint64_t kv = 0;
  for (auto& s : slots_) kv += s->seq->session().kv_bytes();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.kv_bytes = kv;
    ++stats_.steps;
    stats_.rows += prompt_rows + decode_rows;
    stats_.decode_rows += decode_rows;
    stats_.prompt_tokens += prompt_rows;
    stats_.busy_seconds += std::chrono::duration<double>(t1 - t0).count();
    const int64_t sec = static_cast<int64_t>(std::chrono::duration<double>(t1 - t0_).count());
    Bucket& b = buckets_[sec % 16];
    if (b.second != sec) b = Bucket{sec, 0, 0};
    b.prompt += prompt_rows;
  }
  // Slots with new logits draw their next token; the draws (a partial sort of
  // the vocabulary each) run in parallel on the pool.
  std::vector<size_t> drawing;
  for (size_t i = 0; i < entries.size(); ++i) {
    Slot& s = *owner[i];
    s.seq->took(entries[i].ids);
    if (s.decoding && s.job->spec().hooks) {
      try {
        s.job->spec().hooks->after_token(s.seq->session());
      } catch (const std::exception& e) {
        fail(s, e.what());
        continue;
      }
    }
    if (!s.decoding) {
      s.fed += entries[i].ids.size();
      if (s.fed < s.job->spec().prompt.size()) continue;
      s.decoding = true;
      s.t_prompt_done = t1;
      s.result.prompt_ms = ms_between(s.t_assigned, t1);
    }
    const int64_t max = s.job->spec().max_tokens;
    if (max >= 0 && s.result.completion_tokens >= max)
      finish(s, "length");
    else
      drawing.push_back(i);
  }
  std::vector<int32_t> drawn(entries.size(), -1);
  std::vector<std::string> errors(entries.size());
  const int64_t V = backend_->model().config().vocab;
  backend_->host_parallel(static_cast<int64_t>(drawing.size()), [&](int64_t k) {
    const size_t i = drawing[k];
    try {
      drawn[i] = owner[i]->sampler->sample(entries[i].logits.data(), V);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  });
  for (size_t i : drawing) {
    if (!errors[i].empty())
      fail(*owner[i], errors[i]);
    else
      take_token(*owner[i], drawn[i]);
  }
  return true;
}

// The slot drew `id`: stream it and decide whether it goes on.
void Engine::take_token(Slot& s, int32_t id) {
  const JobSpec& spec = s.job->spec();
  s.sampler->accept(id);
  const TextStream::Next next = s.text->push(id);
  if (next == TextStream::Next::Eos) return finish(s, "stop");
  ++s.result.completion_tokens;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.generated_tokens;
    const int64_t sec =
        static_cast<int64_t>(std::chrono::duration<double>(Clock::now() - t0_).count());
    Bucket& b = buckets_[sec % 16];
    if (b.second != sec) b = Bucket{sec, 0, 0};
    ++b.gen;
  }
  if (next != TextStream::Next::More) return finish(s, "stop");
  if (spec.max_tokens >= 0 && s.result.completion_tokens >= spec.max_tokens)
    return finish(s, "length");
  // This token takes the last position: nothing after it would fit.
  if (s.seq->session().position() + 1 >= opts_.ctx) return finish(s, "length");
  s.next_id = id;
}

void Engine::finish(Slot& s, const std::string& reason) {
  // A stop string ends the text where it starts; otherwise what is held back goes out.
  if (reason != "cancelled") s.text->finish();
  const auto now = Clock::now();
  s.result.finish_reason = reason;
  s.result.gen_ms = s.decoding ? ms_between(s.t_prompt_done, now) : 0;
  // The slot is idle in the stats before the answer goes out: a client that asks /health
  // right after its response sees it so.
  const std::shared_ptr<Job> job = std::move(s.job);
  s.text.reset();
  s.decoding = false;
  release(s, job->spec());
  s.last_used = ++use_counter_;
  {
    std::lock_guard<std::mutex> lk(mu_);
    --stats_.busy;
    if (reason == "cancelled")
      ++stats_.jobs_cancelled;
    else
      ++stats_.jobs_done;
  }
  job->push({JobEvent::Kind::Done, {}, s.result});
}

void Engine::fail(Slot& s, const std::string& message) {
  JobEvent e{JobEvent::Kind::Error, message, s.result};
  e.result.finish_reason = "error";
  const std::shared_ptr<Job> job = std::move(s.job);
  s.text.reset();
  s.decoding = false;
  // The cache may hold half a step: start this slot over.
  release(s, job->spec());
  s.seq->reset();
  s.last_used = ++use_counter_;
  {
    std::lock_guard<std::mutex> lk(mu_);
    --stats_.busy;
    ++stats_.jobs_done;
  }
  job->push(std::move(e));
}

void Engine::release(Slot& s, const JobSpec& spec) {
  if (!spec.hooks) return;
  Session& ss = s.seq->session();
  ss.switch_backend(backend_);
  ss.set_probe(-1);
  s.seq->reset();
}

}  // namespace dory::server
