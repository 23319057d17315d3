// One rank's share of a sharded MoE layer on the CPU (expert parallel + tensor parallel, docs/parallel.md),
// and the two ways its outputs add up to the unsharded layer:
//   - all-reduce: out = sum over ranks of shard_forward() (in rank order). Equal to moe_forward within fp32
//     rounding: the combine's additions happen in another order (EP) and GEMM2's K sum is split into tp_size
//     partial sums (TP).
//   - fixed-order combine (what the NCCL EP dispatch/combine does: expert outputs travel back to the token,
//     which combines its k slots in slot order): combine_slots() over shard_forward_slots() of every rank is
//     BITWISE equal to moe_forward when tp_size == 1, any ep_size (the reference computes each y row from its
//     own token only, so which rank computes it does not change a bit).
#pragma once

#include <cstdint>
#include <vector>

#include "nvfp4moe/parallel.h"
#include "nvfp4moe/spec.h"

namespace nvfp4moe::cpu {

// Global top-k ids [T, k] -> the shard's local ids (expert - expert_begin), -1 for other ranks' experts and
// for unused slots. Throws ArgumentError for an id outside [-1, E).
void localize_ids(const ShardPlan& plan, const int32_t* topk_ids, int64_t tokens, int64_t top_k, int32_t* local_ids);

// The rank's partial output out [T, H] f32: sum over its slots (slot order) of w_j * y_j, plus its slice of
// the shared expert. A token none of whose experts live here gets exact zeros (or only the shared part).
// topk_ids are GLOBAL expert ids (routing over all E).
void shard_forward(const MoeShard& shard, Mode mode, const uint16_t* hidden_bf16, int64_t tokens,
                   const int32_t* topk_ids, const float* topk_weights, float* out);

// The rank's expert outputs before the combine: slot_y [T, k, H] gets y of the slots whose expert it owns
// (its TP partial), other rows untouched; shared_y [T, H] (may be null) its slice of the shared expert's
// contribution when plan.has_shared, else untouched.
void shard_forward_slots(const MoeShard& shard, Mode mode, const uint16_t* hidden_bf16, int64_t tokens,
                         const int32_t* topk_ids, float* slot_y, float* shared_y);

// out[t] = +0; for j in 0..k-1 with id != -1: out[t] += w_j * slot_y[t, j]; then out[t] += shared_y[t] when
// shared_y is given. The combine of cpu::moe_forward, expression for expression.
void combine_slots(const MoeSpec& spec, int64_t tokens, const int32_t* topk_ids, const float* topk_weights,
                   const float* slot_y, const float* shared_y, float* out);

// Every rank of a world run one after another on this CPU (what `nvfp4moe run --ep/--tp` does).
//   allreduce: sum over ranks (rank order) of shard_forward, [T, H].
//   combined:  slot rows summed over the tp ranks of their owner (tp order), shared slices likewise, then
//              combine_slots, [T, H].
// shards[r] must be rank r's shard of one layer (same spec, parallel.rank() == r). Either output may be null.
void run_ranks(const std::vector<MoeShard>& shards, Mode mode, const uint16_t* hidden_bf16, int64_t tokens,
               const int32_t* topk_ids, const float* topk_weights, float* allreduce, float* combined);

}  // namespace nvfp4moe::cpu
