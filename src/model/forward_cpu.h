// The CPU forward pass: plain functions over float buffers, one chunk of rows
// at a time. Weights are read-only; everything mutable lives in the caller's
// Scratch and KV caches.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/loop_plan.h"
#include "model/weights.h"
#include "runtime/kv_cache.h"
#include "runtime/pool.h"

namespace dory {

// cos/sin of position * inv_freq for each rotary pair, per row of the chunk.
struct RopeTable {
  int64_t half = 0;               // r/2 pairs
  std::vector<float> cos, sin;    // [T x half]
  void build(double theta, int64_t rotary_dims, int64_t start, int64_t T);
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
};

// Finds (or creates) the cache a layer uses at a given loop pass.
using CacheFor = std::function<KvCache&(int layer, int loop)>;

void attention_layer(const Weights& w, const LayerWeights& L, ThreadPool& pool, Scratch& s,
                     const ChunkArgs& a, KvCache& cache);
void mlp_layer(const Weights& w, const LayerWeights& L, ThreadPool& pool, Scratch& s,
               const ChunkArgs& a);

// Runs the whole plan on one chunk. Writes logits of rows [logit_row0, T) to
// `logits` ([T - logit_row0] x V); logit_row0 == T means none.
void forward_chunk(const Weights& w, ThreadPool& pool, Scratch& s, const ChunkArgs& a,
                   const std::vector<Step>& plan, const CacheFor& cache_for, int64_t logit_row0,
                   float* logits);

}  // namespace dory
