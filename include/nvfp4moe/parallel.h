// Expert parallel (EP) and tensor parallel (TP) sharding of one MoE layer (docs/parallel.md).
//
// A world of ep_size * tp_size ranks; rank = ep_rank * tp_size + tp_rank.
//   - EP: the E routed experts are split into ep_size contiguous ranges (the expert map, ExpertMap below);
//     rank (ep_rank, *) holds experts [begin(ep_rank), end(ep_rank)). Routing stays over all E experts: the
//     router weight and the correction bias are replicated on every rank.
//   - TP: the intermediate dimension I of every expert is split into tp_size equal slices [i0, i1); rank
//     (*, tp_rank) holds gate rows i0..i1-1 and up rows I+i0..I+i1-1 of w13 (with their block scales) and the
//     columns i0..i1-1 of w2 (its packed bytes i0/2.. and its block scales i0/16..). A slice boundary must be a
//     multiple of 16 (the NVFP4 block along w2's K); the sm_90a GEMM prefers 64 (its k-tile).
//   - The shared expert is one more expert owned by EP rank 0, TP-split like the routed ones: ranks
//     (0, tp_rank) hold its slice, other EP ranks hold none.
// The per-tensor scales (weight_scale_2, input_scale) are replicated with their expert. A rank's forward()
// writes its PARTIAL output; the sum over all ranks is the layer's output (an all-reduce), see
// cpu/shard.h for the fixed-order combine that makes EP bitwise equal to the unsharded layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nvfp4moe/spec.h"
#include "nvfp4moe/weights.h"

namespace nvfp4moe {

struct ParallelConfig {
  int ep_size = 1, ep_rank = 0;
  int tp_size = 1, tp_rank = 0;

  bool is_trivial() const { return ep_size == 1 && tp_size == 1; }
  int world_size() const { return ep_size * tp_size; }
  int rank() const { return ep_rank * tp_size + tp_rank; }
  static ParallelConfig of_rank(int ep_size, int tp_size, int rank) {
    return ParallelConfig{ep_size, rank / tp_size, tp_size, rank % tp_size};
  }
  // Sizes >= 1 and ranks in range; throws ArgumentError naming the field.
  void validate() const;
  std::string describe() const;  // "ep 1/4 tp 0/2" (rank/size)
};

// Contiguous expert ranges: rank r owns [begin(r), end(r)); the first E % ep_size ranks own one expert more
// (E = 5, ep = 2: [0, 3), [3, 5)). ep_size must be <= E (every rank owns at least one expert).
struct ExpertMap {
  int64_t num_experts = 0;
  int ep_size = 1;
  int64_t begin(int ep_rank) const;
  int64_t end(int ep_rank) const { return begin(ep_rank + 1); }
  int owner(int64_t expert) const;  // the EP rank holding expert (0 <= expert < num_experts)
};

// What one rank holds.
struct ShardPlan {
  ParallelConfig parallel;
  ExpertMap map;
  int64_t expert_begin = 0, expert_end = 0;  // routed experts (global ids)
  int64_t inter_begin = 0, inter_end = 0;    // columns of I of every routed expert
  bool has_shared = false;                   // this rank holds a slice of the shared expert
  int64_t shared_begin = 0, shared_end = 0;  // its columns of shared_intermediate
  int64_t local_experts() const { return expert_end - expert_begin; }
  int64_t local_intermediate() const { return inter_end - inter_begin; }
  int64_t local_shared_intermediate() const { return has_shared ? shared_end - shared_begin : 0; }
};

// The rank's plan for a layer. granule: the multiple of every TP slice boundary (16 = the NVFP4 block, the
// minimum; 64 for the sm_90a GEMM's k-tile). Throws ArgumentError with the sizes when the layer cannot be
// split so (I or shared_intermediate not divisible into tp_size slices of a multiple of granule, ep_size > E).
ShardPlan plan_shard(const MoeSpec& spec, const ParallelConfig& parallel, int64_t granule = 16);

// One rank's weights.
//   spec:   the unsharded layer (forward() takes its shapes: logits [T, E], ids [T, k], out [T, H]).
//   local:  the rank's experts as a computable MoeWeights: local.spec = spec with num_experts = local experts,
//           intermediate = local I, shared_intermediate = local shared slice (0 when none), routing fields
//           irrelevant (it is not a routable layer: top_k may exceed its num_experts, so local.spec.validate()
//           is not called; validate_shard() checks the buffers). local.experts[e] is global expert
//           plan.expert_begin + e. local.router_weight / router_bias are empty (they live below).
//   router_weight, router_bias: replicated, for routing over all E experts.
struct MoeShard {
  MoeSpec spec;
  ShardPlan plan;
  MoeWeights local;
  std::vector<uint16_t> router_weight;  // BF16 bits [E, H] (may be empty)
  std::vector<float> router_bias;       // F32 [E] (DeepSeek) or empty
};

// The compute spec of a shard (what MoeShard::local.spec is).
MoeSpec local_spec(const MoeSpec& spec, const ShardPlan& plan);

// Slices full (validated) weights into one rank's shard: bytes copied, never requantized. Throws like
// plan_shard.
MoeShard slice_weights(const MoeWeights& full, const ParallelConfig& parallel, int64_t granule = 16);

// Checks a shard's buffers against its plan and spec (ArgumentError naming the field).
void validate_shard(const MoeShard& shard);

}  // namespace nvfp4moe
