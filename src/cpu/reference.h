// The CPU reference backend: the layer exactly as nvfp4-format.md section 9 defines it, fp32 accumulation,
// threaded over tokens/experts. It is the oracle every other backend is tested against.
#pragma once

#include <cstdint>
#include <vector>

#include "nvfp4moe/spec.h"
#include "nvfp4moe/weights.h"

namespace nvfp4moe::cpu {

// Routing from logits [T, E] (f32). bias: e_score_correction_bias [E] or nullptr. ids/weights: [T, k].
// Ties go to the lower expert id.
void route(const MoeSpec& spec, const float* logits, const float* bias, int64_t tokens, int32_t* topk_ids,
           float* topk_weights);

// router logits = hidden(bf16 values) . router_weight^T in fp32; out [T, E]. (Used by the CLI for random
// inputs; the layer API takes logits.)
void router_logits(const MoeWeights& w, const uint16_t* hidden_bf16, int64_t tokens, float* logits);

// Optional per-expert activation amax recording (calibration). Sized [E] each; shared expert separately.
struct CalibrationStats {
  std::vector<float> gemm1_amax, gemm2_amax;          // routed experts
  std::vector<float> shared_gemm1_amax, shared_gemm2_amax;
};

// The whole layer. hidden: bf16 bits [T, H]; topk_ids/weights [T, k] (-1 = unused slot); out: f32 [T, H].
void moe_forward(const MoeWeights& w, Mode mode, const uint16_t* hidden_bf16, int64_t tokens,
                 const int32_t* topk_ids, const float* topk_weights, float* out,
                 CalibrationStats* calibration = nullptr);

// The layer up to the combine: slot_y [T, k, H] gets each used slot's expert output y (unweighted; rows of
// unused slots, id -1, are left untouched), shared_y [T, H] (may be null) the shared expert's contribution
// (sigmoid gate applied for a gated shared expert) when the layer has one. moe_forward's combine of these
// (cpu/shard.h combine_slots) is bitwise its out. Used by expert parallel (docs/parallel.md).
void moe_forward_slots(const MoeWeights& w, Mode mode, const uint16_t* hidden_bf16, int64_t tokens,
                       const int32_t* topk_ids, float* slot_y, float* shared_y);

// The unquantized fp32 layer over the dequantized weights (code * block scale * weight_scale_2) and
// unquantized fp32 activations: the accuracy baseline `run` reports against.
void moe_forward_fp32(const MoeWeights& w, const float* hidden, int64_t tokens, const int32_t* topk_ids,
                      const float* topk_weights, float* out);

}  // namespace nvfp4moe::cpu
