// bf16/fp16/fp32 HF MoE checkpoints -> NVFP4 ModelOpt-layout checkpoints (`nvfp4moe quantize`), and input-scale
// re-calibration of an NVFP4 checkpoint (`nvfp4moe calibrate`). The experts are quantized on the CPU or the GPU
// (QuantizeOptions::cuda; bitwise the same), through model/unquantized.h, the code that quantizes at load.
//
// quantize: every routed and shared expert projection (<...>.layers.L.<module>.experts.E.{gate,up,down}_proj.weight,
// Mixtral w1/w3/w2, <module>.shared_expert(s).*) is quantized exactly as nvfp4-format.md section 3 with the fmt::
// quantizer (gate and up of one expert share one amax, so one weight_scale_2); every other tensor is copied through
// unchanged. input_scale: per expert, amax of the GEMM1 input (the routed tokens' hidden states) and of the GEMM2
// input (act(gate) * up in bf16), divided by 6*448, measured by the cpu reference layer in w4a16 over sample hidden
// states routed by the checkpoint's own router; an expert that saw no token gets the max over the layer (what the
// exporter does, and what MoeLayer::end_calibration does). Gate and up get the same (GEMM1) input_scale.
//
// Output: OUT/config.json (the input's, plus quantization_config quant_method "modelopt"), OUT/hf_quant_config.json,
// sharded safetensors + index, and every other file of IN copied. Written to OUT.tmp-<pid> and renamed at the end;
// on failure nothing is left. Streaming: the output tensors are ordered by layer and each MoE layer is quantized and
// calibrated when the writer reaches its first tensor, then dropped, so peak memory is one layer's MoeWeights (packed
// NVFP4) plus one expert of staging, whatever the checkpoint size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nvfp4moe/weights.h"

namespace nvfp4moe::model {

constexpr int64_t kMaxRandomCalibrationTokens = 65536;  // CalibrationSource::random_tokens: 0 (none) or 1..65536

// Sample activations: a safetensors file with "layer.L.hidden" [N, H] (BF16, F16 or F32) per MoE layer, or
// random_tokens random N(0, 1) bf16 tokens per layer (a smoke test; seeded).
struct CalibrationSource {
  std::string file;
  int64_t random_tokens = 0;
  uint64_t seed = 1;
};

// Per MoE layer: the time to quantize its experts (source bytes read, fp32 conversion, amax, block scales,
// codes, into MoeWeights; on the GPU including the host staging copies and transfers) and to calibrate.
struct LayerTiming {
  int layer = 0;
  size_t source_bytes = 0;  // unquantized expert bytes of the layer
  double quantize_seconds = 0, calibrate_seconds = 0;
};

struct QuantizeOptions {
  CalibrationSource calibration;
  size_t max_shard_bytes = size_t(4) << 30;
  bool cuda = false;   // quantize the experts on the GPU (cuda_device)
  int cuda_device = 0;
  std::function<void(const LayerTiming&)> on_layer;  // called after each layer is quantized (progress)
};

struct QuantizeResult {
  std::vector<int> moe_layers;
  size_t quantized_projections = 0;
  size_t copied_tensors = 0;
  double seconds = 0;
  std::string device;  // "cpu" / "cuda"
  std::vector<LayerTiming> layers;
  double quantize_seconds = 0;  // sum over layers
  size_t source_bytes = 0;
};

QuantizeResult quantize_checkpoint(const std::string& in_dir, const std::string& out_dir, const QuantizeOptions& options);

struct CalibrateResult {
  std::vector<int> moe_layers;
  size_t input_scales_written = 0;
  double seconds = 0;
};
// Re-measures every MoE layer's input scales of an NVFP4 checkpoint and writes a copy with them: ModelOpt
// input_scale tensors, or for compressed-tensors input_global_scale = 1.0f / input_scale (fp32; loading takes
// 1.0f / that again, which is the measured scale or 1 ulp away), added where a W4A16 checkpoint had none, with
// config_groups.*.input_activations set to NVFP4 (dynamic "local") so the result is a W4A4 checkpoint.
CalibrateResult calibrate_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                     const CalibrationSource& calibration);

// One weight [n, k] (fp32 values) quantized with weight_scale_2 = ws2: packed codes [n, k/2], block scales [n, k/16].
void quantize_weight(const float* w, int64_t n, int64_t k, float ws2, uint8_t* packed, uint8_t* scales);

// Replaces w's input scales by the calibrated ones (the rule above) from tokens hidden_bf16 [T, H].
void calibrate_input_scales(MoeWeights& w, const uint16_t* hidden_bf16, int64_t tokens, const std::string& what);

}  // namespace nvfp4moe::model
