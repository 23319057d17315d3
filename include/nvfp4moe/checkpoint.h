// Checkpoint: an NVFP4 MoE checkpoint directory (ModelOpt layout; compressed-tensors planned), its config,
// its MoE layers, and the loader that stacks one layer's experts into MoeWeights.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nvfp4moe/parallel.h"
#include "nvfp4moe/spec.h"
#include "nvfp4moe/weights.h"

namespace nvfp4moe {

// Bf16: an unquantized (BF16/F16/F32) HF MoE checkpoint, quantized to NVFP4 at load (src/model/unquantized.h).
enum class CheckpointFormat : uint8_t { ModelOpt, CompressedTensors, Bf16 };

struct LayerSummary {
  int layer = 0;
  bool is_moe = false;       // false: a dense layer (first_k_dense_replace, mlp_only_layers ...)
  std::string prefix;        // e.g. "model.layers.3.mlp"
  int64_t experts_found = 0;
};

// Called while a load runs longer than a second: (done bytes, total bytes).
using ProgressFn = std::function<void(size_t done, size_t total)>;

class Checkpoint {
 public:
  // Reads config.json, the quantization config (hf_quant_config.json or quantization_config), and the
  // safetensors index; throws FormatError with a specific message for anything unsupported or malformed.
  static std::shared_ptr<Checkpoint> open(const std::string& dir);
  virtual ~Checkpoint() = default;

  virtual const std::string& path() const = 0;
  virtual CheckpointFormat format() const = 0;
  virtual const std::vector<LayerSummary>& layers() const = 0;  // every decoder layer
  virtual std::vector<int> moe_layers() const = 0;
  virtual MoeSpec spec(int layer) const = 0;                     // throws ArgumentError for a non-MoE layer
  virtual std::vector<std::string> exclude_modules() const = 0;
  // Validates every tensor of the layer against its spec (names, dtypes, shapes, rank-0 scales, missing or
  // extra experts), then streams the bytes straight into the stacked buffers.
  virtual MoeWeights load_layer(int layer, const ProgressFn& progress = {}) const = 0;
  // One expert/tensor-parallel rank's shard of the layer (parallel.h): == slice_weights(load_layer(layer),
  // parallel) bit for bit. The NVFP4 loaders read (and validate) only the rank's experts and, with TP, only
  // its rows/columns; this default loads the whole layer and slices it.
  virtual MoeShard load_shard(int layer, const ParallelConfig& parallel, const ProgressFn& progress = {}) const;
  // A human-readable report for `nvfp4moe inspect`.
  virtual std::string inspect() const = 0;
};

}  // namespace nvfp4moe
