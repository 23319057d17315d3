// MoeWeights: one MoE layer's NVFP4 weights stacked per expert, the single packed host copy every backend
// prepares from. The FP4 bytes and e4m3 block scales are the checkpoint's, unchanged (never requantized).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "nvfp4moe/spec.h"

namespace nvfp4moe {

// An owned, 64-byte aligned host allocation that never copies implicitly.
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes);
  HostBuffer(HostBuffer&&) noexcept = default;
  HostBuffer& operator=(HostBuffer&&) noexcept = default;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  template <typename T> T* as() { return reinterpret_cast<T*>(data_.get()); }
  template <typename T> const T* as() const { return reinterpret_cast<const T*>(data_.get()); }

 private:
  struct Free { void operator()(uint8_t* p) const; };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
};

// A group of experts with identical shapes, stacked along the expert axis.
//   GEMM1 (w13): N1 = gated ? 2*I : I rows (gate rows 0..I-1, then up rows I..2I-1), K1 = H.
//   GEMM2 (w2):  N2 = H rows, K2 = I.
struct StackedExperts {
  int64_t num_experts = 0;   // E (1 for the fused shared expert)
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  bool gated = true;

  HostBuffer w13;            // U8      [E, N1, H/2]   two e2m1 codes per byte, element 2i in the low nibble
  HostBuffer w13_scale;      // F8_E4M3 [E, N1, H/16]  row-major block scales
  std::vector<float> w13_gate_scale2;  // [E] weight_scale_2 of gate_proj (empty when not gated)
  std::vector<float> w13_up_scale2;    // [E] weight_scale_2 of up_proj
  std::vector<float> w13_input_scale;  // [E] GEMM1 activation input_scale (max of gate's and up's)
  HostBuffer w2;             // U8      [E, H, I/2]
  HostBuffer w2_scale;       // F8_E4M3 [E, H, I/16]
  std::vector<float> w2_scale2;        // [E] weight_scale_2 of down_proj
  std::vector<float> w2_input_scale;   // [E] GEMM2 activation input_scale

  int64_t n1() const { return gated ? 2 * intermediate : intermediate; }
  size_t w13_bytes_per_expert() const { return static_cast<size_t>(n1() * hidden / 2); }
  size_t w13_scale_bytes_per_expert() const { return static_cast<size_t>(n1() * hidden / 16); }
  size_t w2_bytes_per_expert() const { return static_cast<size_t>(hidden * intermediate / 2); }
  size_t w2_scale_bytes_per_expert() const { return static_cast<size_t>(hidden * intermediate / 16); }
  // Allocates the buffers for the shapes above (contents uninitialized).
  void allocate(int64_t experts, int64_t hidden, int64_t intermediate, bool gated);
  size_t packed_bytes() const;  // FP4 bytes + block scales
};

struct MoeWeights {
  MoeSpec spec;
  StackedExperts experts;         // the E routed experts
  StackedExperts shared;          // num_experts == 0 when the layer has no shared expert
  std::vector<uint16_t> router_weight;      // BF16 bits [E, H] (mlp.gate.weight); may be empty
  std::vector<float> router_bias;           // F32 [E] e_score_correction_bias (DeepSeek); empty otherwise
  std::vector<uint16_t> shared_gate_weight; // BF16 bits [H] (Qwen shared_expert_gate); empty otherwise

  bool has_shared() const { return shared.num_experts > 0; }
  // Checks every buffer size and scale vector length against spec; throws ArgumentError naming the field.
  void validate() const;
  size_t packed_bytes() const { return experts.packed_bytes() + shared.packed_bytes(); }
};

// Replaces every expert's GEMM1 and GEMM2 input scales by their max over experts (what FlashInfer backends
// use); the default keeps them per expert, exact to the checkpoint (nvfp4-format.md section 5).
void use_shared_max_input_scales(MoeWeights& w);

}  // namespace nvfp4moe
