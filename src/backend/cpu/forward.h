// The CPU forward pass: plain functions over float buffers, one chunk of rows
// at a time. Weights are read-only; everything mutable lives in the backend's
// Scratch and the sequences' KV caches.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/loop_plan.h"
#include "model/weights.h"
#include "backend/cpu/kv_cache.h"
#include "backend/cpu/pool.h"

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
  std::vector<float> probe;           // [T x H]: x where the plan's Probe step stood
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

void attention_layer(const Weights& w, const LayerWeights& L, ThreadPool& pool, Scratch& s,
                     const ChunkArgs& a, KvCache& cache);
// Batched rows: caches[a.sequence(t)] is the cache row t reads and writes.
void attention_layer(const Weights& w, const LayerWeights& L, ThreadPool& pool, Scratch& s,
                     const ChunkArgs& a, std::span<KvCache* const> caches);
void mlp_layer(const Weights& w, const LayerWeights& L, ThreadPool& pool, Scratch& s,
               const ChunkArgs& a);

// A pass, in pieces (the backend's begin / steps / logits): the chunk's scratch, RoPE
// tables and embeddings; a run of plan steps on the rows in s.x, where caches(step)
// gives each sequence's cache for an attention step (the slot the step names); the head
// on `rows` hidden rows at h ([rows x V] logits: (lm_head . h) * logit_scale / sigma).
using StepCaches = std::function<std::span<KvCache* const>(const Step&)>;
void forward_begin(const Weights& w, Scratch& s, const ChunkArgs& a);
void forward_steps(const Weights& w, ThreadPool& pool, Scratch& s, const ChunkArgs& a,
                   std::span<const Step> plan, const StepCaches& caches);
void forward_head(const Weights& w, ThreadPool& pool, const float* h, int64_t rows, float* logits);

}  // namespace dory
