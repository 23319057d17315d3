// Unquantized (bf16/fp16/fp32) HF MoE checkpoints, quantized to NVFP4 at load (nvfp4-format.md section 3).
//
// Checkpoint::open on a checkpoint with no quantization config whose expert weights are BF16/F16/F32 gives an
// UnquantizedCheckpoint (format CheckpointFormat::Bf16). load_layer() quantizes the layer's routed and shared
// experts exactly as the exporter does, with the fmt:: quantizer: gate and up of one expert share one amax, so one
// weight_scale_2; block scales e4m3(amax_b / (6 * ws2)) (1 for an all-zero block); codes RNE with saturation. The
// result is bitwise what `nvfp4moe quantize` writes and the ModelOpt loader reads back (the quantizer uses this
// same code). Such a checkpoint carries no activation scales: MoeWeights' input scales are NaN, so w4a16 runs and
// w4a4 is refused (MoeLayer::create) with a message pointing at `nvfp4moe quantize --calibration` /
// `nvfp4moe calibrate`.
//
// The per-expert work goes through an ExpertQuantizer: the CPU one (OpenMP over rows) or, in a CUDA build, the
// GPU one (src/cuda/weight_quant.h: the source bytes staged to the device expert by expert, quantized there by
// the same __host__ __device__ fmt:: functions, the packed result copied back into MoeWeights), which
// MoeLayer::create(checkpoint, layer, {backend = cuda}) uses. Both produce the same bits.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/checkpoint_format.h"
#include "model/expert_quantizer.h"
#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/weights.h"

namespace nvfp4moe::model {

// The values of a BF16 / F16 / F32 tensor as fp32 (exact).
void tensor_to_float(const io::TensorInfo& t, float* out);
// IEEE half -> float (exact).
float half_to_float(uint16_t h);
// NaN/Inf in the router, its correction bias or the shared-expert gate silently drops or pins experts (NaN logits
// select nothing, an Inf bias puts its expert in every top-k), so both loaders refuse them: FormatError naming
// `where`, the tensor, the value and its index. `values`: t's values (tensor_to_float); held_as_bf16: MoeWeights
// keeps the tensor as bf16, where a finite F32 value can round to inf. Small tensors ([E, H] at most): the
// expert weights are not scanned.
void check_finite(const io::TensorInfo& t, const float* values, bool held_as_bf16, const std::string& where);

// One MoE layer of an unquantized checkpoint: tensor names by role, 0 gate, 1 up, 2 down ("" = absent).
struct UnquantizedExpert {
  std::string name[3];
  std::string base;  // "<module>.experts.E." / "<module>.shared_experts."
};
struct UnquantizedLayer {
  int layer = 0;
  std::string module;  // "model.layers.L.mlp" / "...block_sparse_moe"
  std::map<int64_t, UnquantizedExpert> experts;
  std::optional<UnquantizedExpert> shared;
  std::string router, bias, shared_gate;
  MoeSpec spec;
};

class UnquantizedCheckpoint : public Checkpoint {
 public:
  // dir has config.json (parsed into mc) and no quantization config. Throws FormatError when no expert weights
  // are found or they are not BF16/F16/F32 (the message starts "no NVFP4 quantization config").
  UnquantizedCheckpoint(const std::string& dir, ModelConfig mc);

  const std::string& path() const override { return dir_; }
  CheckpointFormat format() const override { return CheckpointFormat::Bf16; }
  const std::vector<LayerSummary>& layers() const override { return summaries_; }
  std::vector<int> moe_layers() const override;
  MoeSpec spec(int layer) const override { return info(layer).spec; }
  std::vector<std::string> exclude_modules() const override { return {}; }
  // Quantized on the CPU; input scales NaN.
  MoeWeights load_layer(int layer, const ProgressFn& progress = {}) const override;
  std::string inspect() const override;

  // The same with a given quantizer (the GPU one for the cuda backend).
  MoeWeights load_layer_with(int layer, ExpertQuantizer& q, const ProgressFn& progress = {}) const;
  const UnquantizedLayer& layer_source(int layer) const { return info(layer); }
  const io::SafetensorsSet& files() const { return files_; }
  const ModelConfig& model_config() const { return model_; }
  size_t layer_source_bytes(int layer) const;  // bytes of the layer's expert weights in the files

 private:
  const UnquantizedLayer& info(int layer) const;
  std::string dir_;
  ModelConfig model_;
  io::SafetensorsSet files_;
  std::map<int, UnquantizedLayer> moe_;
  std::vector<LayerSummary> summaries_;
};

// Checkpoint::open's hook: nullptr when dir's expert tensors are not unquantized (so the caller reports the
// missing quantization config); throws FormatError for an unquantized checkpoint that is malformed.
std::shared_ptr<Checkpoint> open_unquantized_checkpoint(const std::string& dir, ModelConfig mc);

}  // namespace nvfp4moe::model
