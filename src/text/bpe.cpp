// The BPE model of tokenizer.json: characters (or <0xNN> bytes) merged by rank, lowest rank
// first and leftmost on ties, exactly the order of the library's Word::merge_all.
#include <algorithm>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace dory::tok {

void MergeMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  n_ = 0;
}

void MergeMap::put(int32_t a, int32_t b, int32_t rank, int32_t new_id) {
  if (slots_.empty() || (n_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(16, n_ * 2 + 2));
    for (const Slot& s : old)
      if (s.rank >= 0)
        put(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key & 0xFFFFFFFFu), s.rank,
            s.new_id);
  }
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  size_t i = hash(key) & mask_;
  for (;;) {
    Slot& s = slots_[i];
    if (s.rank < 0) {
      s = {key, rank, new_id};
      ++n_;
      return;
    }
    if (s.key == key) {  // a repeated merge: the later line wins, as in the library's map
      s.rank = rank;
      s.new_id = new_id;
      return;
    }
    i = (i + 1) & mask_;
  }
}

void Trie::add(std::string_view s, int32_t value) {
  if (s.empty()) return;
  int32_t cur = 0;
  for (unsigned char c : s) {
    int32_t nxt = -1;
    for (auto& [k, v] : nodes_[cur].next)
      if (k == c) {
        nxt = v;
        break;
      }
    if (nxt < 0) {
      nxt = static_cast<int32_t>(nodes_.size());
      nodes_[cur].next.emplace_back(c, nxt);
      nodes_.emplace_back();
    }
    cur = nxt;
  }
  nodes_[cur].value = value;
  first_[static_cast<unsigned char>(s[0])] = true;
}

size_t Trie::longest_at(std::string_view text, size_t i, int32_t* value) const {
  int32_t cur = 0;
  size_t best = 0;
  for (size_t k = i; k < text.size(); ++k) {
    const unsigned char c = static_cast<unsigned char>(text[k]);
    int32_t nxt = -1;
    for (const auto& [key, v] : nodes_[cur].next)
      if (key == c) {
        nxt = v;
        break;
      }
    if (nxt < 0) break;
    cur = nxt;
    if (nodes_[cur].value >= 0) {
      best = k + 1 - i;
      *value = nodes_[cur].value;
    }
  }
  return best;
}

namespace {

struct Sym {
  int32_t id;
  int32_t prev, next;
};

struct Cand {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  // std heap is a max-heap: "greater" = lower rank, then lower position.
  bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

void Bpe::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  std::vector<Sym> syms;
  syms.reserve(w.size());
  auto add = [&](int32_t id) {
    const int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, n + 1});
  };
  // Pending unknown run: with fuse_unk consecutive unknown characters become one <unk>.
  bool unk_pending = false;
  std::string key;
  size_t i = 0;
  while (i < w.size()) {
    size_t len = utf8::valid_seq_len(w, i);
    if (len == 0) len = 1;  // cannot happen on validated text; keep going regardless
    const bool first = i == 0, last = i + len >= w.size();
    int32_t id = -1;
    if ((first || prefix.empty()) && (!last || suffix.empty())) {
      size_t l2;
      const char32_t cp = utf8::decode_at(w, i, &l2);
      if (cp < small_char.size()) {
        id = small_char[cp];
      } else {
        auto it = vocab.find(w.substr(i, len));
        if (it != vocab.end()) id = it->second;
      }
    } else {
      key.clear();
      if (!first) key += prefix;
      key.append(w.substr(i, len));
      if (last) key += suffix;
      auto it = vocab.find(key);
      if (it != vocab.end()) id = it->second;
    }
    if (id >= 0) {
      if (unk_pending) {
        add(*unk_id);
        unk_pending = false;
      }
      add(id);
    } else {
      bool done = false;
      if (byte_fallback) {
        // The bytes of the character as it was looked up (prefix/suffix included).
        std::string_view bytes = w.substr(i, len);
        if (!((first || prefix.empty()) && (!last || suffix.empty()))) bytes = key;
        bool all = true;
        for (unsigned char b : bytes) all &= byte_ids[b] >= 0;
        if (all) {
          // The library does not flush a pending <unk> here (it is added after the bytes).
          for (unsigned char b : bytes) add(byte_ids[b]);
          done = true;
        }
      }
      if (!done && unk_id) {
        if (unk_pending && !fuse_unk) add(*unk_id);
        unk_pending = true;
      }
    }
    i += len;
  }
  if (unk_pending) add(*unk_id);
  if (syms.empty()) return;
  syms.back().next = -1;
  const int32_t n = static_cast<int32_t>(syms.size());

  int32_t rank, nid;
  if (n < 48) {
    // Short words: scan for the lowest-ranked adjacent pair each round (no heap needed).
    for (;;) {
      int32_t best_rank = INT32_MAX, best_pos = -1, best_id = -1;
      for (int32_t p = 0; p != -1 && syms[p].next != -1; p = syms[p].next) {
        if (merges.get(syms[p].id, syms[syms[p].next].id, &rank, &nid) && rank < best_rank) {
          best_rank = rank;
          best_pos = p;
          best_id = nid;
        }
      }
      if (best_pos < 0) break;
      const int32_t r = syms[best_pos].next;
      syms[best_pos].id = best_id;
      syms[best_pos].next = syms[r].next;
      if (syms[r].next != -1) syms[syms[r].next].prev = best_pos;
      syms[r].id = -1;
    }
  } else {
    std::vector<Cand> heap;
    heap.reserve(n);
    for (int32_t p = 0; p + 1 < n; ++p)
      if (merges.get(syms[p].id, syms[p + 1].id, &rank, &nid)) heap.push_back({rank, p, nid});
    std::make_heap(heap.begin(), heap.end());
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end());
      const Cand top = heap.back();
      heap.pop_back();
      Sym& s = syms[top.pos];
      if (s.id < 0 || s.next == -1) continue;
      const int32_t r = s.next;
      // Stale entry: the pair at this position has changed since it was queued.
      if (!merges.get(s.id, syms[r].id, &rank, &nid) || nid != top.new_id) continue;
      s.id = top.new_id;
      s.next = syms[r].next;
      if (syms[r].next != -1) syms[syms[r].next].prev = top.pos;
      syms[r].id = -1;
      if (s.prev != -1 && merges.get(syms[s.prev].id, s.id, &rank, &nid))
        heap.push_back({rank, s.prev, nid}), std::push_heap(heap.begin(), heap.end());
      if (s.next != -1 && merges.get(s.id, syms[s.next].id, &rank, &nid))
        heap.push_back({rank, top.pos, nid}), std::push_heap(heap.begin(), heap.end());
    }
  }
  for (int32_t p = 0; p != -1; p = syms[p].next) out.push_back(syms[p].id);
}

namespace {
inline size_t pair_hash(uint64_t k) {
  k ^= k >> 31;
  k *= 0x9E3779B97F4A7C15ULL;
  return static_cast<size_t>(k ^ (k >> 29));
}
}  // namespace

void Bpe::build_pairs() const {
  std::vector<uint64_t> keys;
  for (const auto& [t, id] : vocab) {
    char32_t prev = 0;
    bool have = false;
    for (size_t i = 0; i < t.size();) {
      size_t len = utf8::valid_seq_len(t, i);
      if (len == 0) break;
      size_t l2;
      const char32_t c = utf8::decode_at(t, i, &l2);
      if (have) keys.push_back((static_cast<uint64_t>(prev) << 32 | c) + 1);
      prev = c;
      have = true;
      i += len;
    }
  }
  size_t cap = 16;
  while (cap < keys.size() * 2) cap <<= 1;
  pairs.assign(cap, 0);
  for (uint64_t k : keys) {
    size_t i = pair_hash(k) & (cap - 1);
    while (pairs[i] != 0 && pairs[i] != k) i = (i + 1) & (cap - 1);
    pairs[i] = k;
  }
}

bool Bpe::pair_inside_token(char32_t a, char32_t b) const {
  const uint64_t k = (static_cast<uint64_t>(a) << 32 | b) + 1;
  const size_t mask = pairs.size() - 1;
  for (size_t i = pair_hash(k) & mask;; i = (i + 1) & mask) {
    if (pairs[i] == k) return true;
    if (pairs[i] == 0) return false;
  }
}

void Bpe::merge_cached(std::string_view word, std::vector<int32_t>& out) const {
  const bool cacheable = word.size() < kCacheWordMax;
  if (cacheable) {
    std::lock_guard<std::mutex> lk(cache_mu);
    auto it = cache.find(word);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t mark = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(mark), out.end());
    std::lock_guard<std::mutex> lk(cache_mu);
    if (cache.size() >= kCacheMax) cache.clear();
    cache.emplace(std::string(word), std::move(ids));
  }
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    auto it = vocab.find(word);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Cutting needs each character to start as its own vocabulary token: no subword prefix or
  // suffix, and no unknown character (byte fallback and fused <unk> runs span characters).
  if (word.size() < 64 || !prefix.empty() || !suffix.empty()) return merge_cached(word, out);
  std::call_once(pairs_once, [this] { build_pairs(); });
  size_t start = 0, i = 0;
  char32_t prev = 0;
  bool prev_known = false;
  while (i < word.size()) {
    size_t len = utf8::valid_seq_len(word, i);
    if (len == 0) len = 1;
    size_t l2;
    const char32_t c = utf8::decode_at(word, i, &l2);
    const bool known =
        c < small_char.size() ? small_char[c] >= 0 : vocab.count(word.substr(i, len)) > 0;
    if (i > start && prev_known && known && !pair_inside_token(prev, c)) {
      merge_cached(word.substr(start, i - start), out);
      start = i;
    }
    prev = c;
    prev_known = known;
    i += len;
  }
  merge_cached(word.substr(start), out);
}

}  // namespace dory::tok
