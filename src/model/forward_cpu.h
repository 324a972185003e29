// The CPU forward pass: plain functions over float buffers, one chunk of rows
// at a time. Weights are read-only; everything mutable lives in the caller's
// Scratch and KV caches.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/loop_plan.h"
#include "model/weights.h"
#include "runtime/kv_cache.h"
#include "runtime/pool.h"

namespace dory {

// cos/sin of position * inv_freq for each rotary pair, per row of the chunk.
struct ChunkArgs;

struct RopeTable {
  int64_t half = 0;               // r/2 pairs
  std::vector<float> cos, sin;    // [T x half]
  void build(double theta, int64_t rotary_dims, const ChunkArgs& a);  // row t at a.position(t)
};

struct Scratch {
  std::vector<float> x, inp, state;   // [T x H]
  std::vector<float> q, g, att;       // [T x nh*hd]
  std::vector<float> k, v;            // [T x nk*hd]
  std::vector<float> out;             // [T x H]
  std::vector<float> ff_g, ff_u;      // [T x F]
  RopeTable rope[2];                  // profile 1 and 2
  void reserve(const DoryConfig& c, int64_t T);
};

struct ChunkArgs {
  const int32_t* ids;
  int64_t T;
  int64_t start;  // position of ids[0]
  // Rows of several sequences in one chunk (forward_rows): row t is at position
  // pos[t] of sequence seq[t]; a sequence's rows are contiguous, at consecutive
  // positions. Null: one sequence, row t at start + t.
  const int64_t* pos = nullptr;
  const int32_t* seq = nullptr;
  int64_t position(int64_t t) const { return pos ? pos[t] : start + t; }
  int32_t sequence(int64_t t) const { return seq ? seq[t] : 0; }
};

// Finds (or creates) the cache a layer uses at a given loop pass.
using CacheFor = std::function<KvCache&(int layer, int loop)>;

void attention_layer(const Weights& w, const LayerWeights& L, ThreadPool& pool, Scratch& s,
                     const ChunkArgs& a, KvCache& cache);
// Batched rows: caches[a.sequence(t)] is the cache row t reads and writes.
void attention_layer(const Weights& w, const LayerWeights& L, ThreadPool& pool, Scratch& s,
                     const ChunkArgs& a, std::span<KvCache* const> caches);
void mlp_layer(const Weights& w, const LayerWeights& L, ThreadPool& pool, Scratch& s,
               const ChunkArgs& a);

// The pieces of forward_chunk, for callers that decide between steps (the
// early-exit gate): the chunk's scratch, RoPE tables and embeddings; a run of
// plan steps on the rows in s.x; the head on the rows from logit_row0 on.
void forward_begin(const Weights& w, Scratch& s, const ChunkArgs& a);
void forward_steps(const Weights& w, ThreadPool& pool, Scratch& s, const ChunkArgs& a,
                   const std::vector<Step>& plan, const CacheFor& cache_for);
void forward_head(const Weights& w, ThreadPool& pool, Scratch& s, const ChunkArgs& a, int64_t logit_row0,
                  float* logits);

// Runs the whole plan on one chunk. Writes logits of rows [logit_row0, T) to
// `logits` ([T - logit_row0] x V); logit_row0 == T means none.
void forward_chunk(const Weights& w, ThreadPool& pool, Scratch& s, const ChunkArgs& a,
                   const std::vector<Step>& plan, const CacheFor& cache_for, int64_t logit_row0,
                   float* logits);

// Continuous batching: one chunk holding rows of n_seq sequences (a.pos and
// a.seq set), so every weight product runs once for all of them while each
// row's attention reads its own sequence's cache. Every sequence runs the same
// plan. Writes logits of the rows listed in logit_rows, in that order
// ([logit_rows.size()] x V).
using SeqCacheFor = std::function<KvCache&(int seq, int layer, int loop)>;
void forward_rows(const Weights& w, ThreadPool& pool, Scratch& s, const ChunkArgs& a, int n_seq,
                  const std::vector<Step>& plan, const SeqCacheFor& cache_for,
                  std::span<const int64_t> logit_rows, float* logits);

}  // namespace dory
