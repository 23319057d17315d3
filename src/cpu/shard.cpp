#include "cpu/shard.h"

#include <cstring>

#include "cpu/reference.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::cpu {

void localize_ids(const ShardPlan& plan, const int32_t* ids, int64_t tokens, int64_t top_k, int32_t* local) {
  const int64_t E = plan.map.num_experts;
  for (int64_t i = 0; i < tokens * top_k; ++i) {
    const int32_t id = ids[i];
    NVFP4MOE_CHECK(id >= -1 && id < E, ArgumentError, "topk_ids[", i / top_k, ", ", i % top_k,
                   "]: expected -1 or an expert id in [0, ", E, "), got ", id);
    local[i] = (id >= plan.expert_begin && id < plan.expert_end) ? static_cast<int32_t>(id - plan.expert_begin) : -1;
  }
}

void shard_forward(const MoeShard& shard, Mode mode, const uint16_t* hidden_bf16, int64_t tokens,
                   const int32_t* topk_ids, const float* topk_weights, float* out) {
  if (tokens <= 0) return;
  const int64_t K = shard.spec.top_k;
  std::vector<int32_t> local(static_cast<size_t>(tokens * K));
  localize_ids(shard.plan, topk_ids, tokens, K, local.data());
  moe_forward(shard.local, mode, hidden_bf16, tokens, local.data(), topk_weights, out);
}

void shard_forward_slots(const MoeShard& shard, Mode mode, const uint16_t* hidden_bf16, int64_t tokens,
                         const int32_t* topk_ids, float* slot_y, float* shared_y) {
  if (tokens <= 0) return;
  const int64_t K = shard.spec.top_k;
  std::vector<int32_t> local(static_cast<size_t>(tokens * K));
  localize_ids(shard.plan, topk_ids, tokens, K, local.data());
  moe_forward_slots(shard.local, mode, hidden_bf16, tokens, local.data(), slot_y, shared_y);
}

void combine_slots(const MoeSpec& spec, int64_t tokens, const int32_t* ids, const float* topk_w, const float* slot_y,
                   const float* shared_y, float* out) {
  const int64_t H = spec.hidden, K = spec.top_k;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    float* o = out + t * H;
    for (int64_t c = 0; c < H; ++c) o[c] = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      if (ids[t * K + j] < 0) continue;
      const float wj = topk_w[t * K + j];
      const float* yr = slot_y + (t * K + j) * H;
      for (int64_t c = 0; c < H; ++c) o[c] += wj * yr[c];
    }
    if (shared_y) {
      const float* yr = shared_y + t * H;
      for (int64_t c = 0; c < H; ++c) o[c] += yr[c];
    }
  }
}

void run_ranks(const std::vector<MoeShard>& shards, Mode mode, const uint16_t* hidden_bf16, int64_t tokens,
               const int32_t* ids, const float* topk_w, float* allreduce, float* combined) {
  NVFP4MOE_CHECK(!shards.empty(), ArgumentError, "run_ranks: no shards");
  const MoeSpec& spec = shards[0].spec;
  const ParallelConfig& p0 = shards[0].plan.parallel;
  NVFP4MOE_CHECK(static_cast<int>(shards.size()) == p0.world_size(), ArgumentError, "run_ranks: expected ",
                 p0.world_size(), " shards (ep ", p0.ep_size, " x tp ", p0.tp_size, "), got ", shards.size());
  for (size_t r = 0; r < shards.size(); ++r) {
    const ParallelConfig& p = shards[r].plan.parallel;
    NVFP4MOE_CHECK(p.ep_size == p0.ep_size && p.tp_size == p0.tp_size && p.rank() == static_cast<int>(r),
                   ArgumentError, "run_ranks: shards[", r, "] is ", p.describe(), ", expected rank ", r, " of ep ",
                   p0.ep_size, " x tp ", p0.tp_size);
    // The buffers below are sized from shards[0].spec and filled by each shard's own forward: a shard of
    // another layer shape would write past them, one with a plan unlike its spec would compute a wrong part.
    const MoeSpec& sp = shards[r].spec;
    NVFP4MOE_CHECK(sp.layer == spec.layer && sp.hidden == spec.hidden && sp.intermediate == spec.intermediate &&
                       sp.num_experts == spec.num_experts && sp.top_k == spec.top_k &&
                       sp.shared_intermediate == spec.shared_intermediate,
                   ArgumentError, "run_ranks: shards[", r, "].spec is ", sp.describe(), ", expected shards[0].spec ",
                   spec.describe(), " (one layer)");
    validate_shard(shards[r]);
  }
  if (tokens <= 0) return;
  const int64_t H = spec.hidden, K = spec.top_k;
  const size_t th = static_cast<size_t>(tokens * H), tkh = static_cast<size_t>(tokens * K * H);
  if (allreduce) {
    std::vector<float> part(th);
    for (size_t i = 0; i < th; ++i) allreduce[i] = 0.0f;
    for (const MoeShard& s : shards) {
      shard_forward(s, mode, hidden_bf16, tokens, ids, topk_w, part.data());
      for (size_t i = 0; i < th; ++i) allreduce[i] += part[i];
    }
  }
  if (combined) {
    // Every slot row is written by the tp ranks of exactly one EP rank: total = (0 + tp0) + tp1 + ... (with
    // tp_size 1 that is y itself, exactly).
    std::vector<float> slot_total(tkh, 0.0f), slot_rank(tkh), shared_total, shared_rank;
    const bool any_shared = spec.shared_intermediate > 0;
    if (any_shared) {
      shared_total.assign(th, 0.0f);
      shared_rank.resize(th);
    }
    for (const MoeShard& s : shards) {
      shard_forward_slots(s, mode, hidden_bf16, tokens, ids, slot_rank.data(),
                          s.plan.has_shared ? shared_rank.data() : nullptr);
      for (int64_t i = 0; i < tokens * K; ++i) {
        const int32_t id = ids[i];
        if (id < s.plan.expert_begin || id >= s.plan.expert_end) continue;
        float* dst = slot_total.data() + i * H;
        const float* src = slot_rank.data() + i * H;
        for (int64_t c = 0; c < H; ++c) dst[c] += src[c];
      }
      if (s.plan.has_shared)
        for (size_t i = 0; i < th; ++i) shared_total[i] += shared_rank[i];
    }
    combine_slots(spec, tokens, ids, topk_w, slot_total.data(), any_shared ? shared_total.data() : nullptr, combined);
  }
}

}  // namespace nvfp4moe::cpu
