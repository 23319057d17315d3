// MoeLayer: the public entry point. Create one per MoE layer from MoeWeights (or a checkpoint layer), then
// call forward() with raw pointers. forward() never allocates, synchronizes or makes a host-side decision
// that depends on tensor contents (CUDA-graph safe); every argument is checked before anything launches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/parallel.h"
#include "nvfp4moe/spec.h"
#include "nvfp4moe/tensor.h"
#include "nvfp4moe/weights.h"

namespace nvfp4moe {

enum class Backend : uint8_t { Cpu, Cuda };
const char* backend_name(Backend b);
bool backend_from_name(const std::string& name, Backend* out);
bool cuda_backend_available();  // built with CUDA and a device is present

struct MoeLayerOptions {
  Backend backend = Backend::Cpu;
  Mode mode = Mode::W4A16;
  int64_t max_tokens = 1024;         // forward() accepts T <= max_tokens; the workspace is sized for it
  int device = 0;                    // CUDA device ordinal
  bool shared_max_input_scale = false;  // one activation scale per GEMM (max over experts) instead of per expert
  // Expert/tensor parallel rank of this layer (parallel.h, docs/parallel.md); 1x1 = unsharded. Sharded: the cpu
  // backend only; forward() writes the rank's partial output (the sum over ranks is the layer's).
  ParallelConfig parallel;
};

// Routing arguments: either router_logits [T, E] F32, or topk_ids [T, k] I32 (-1 = unused slot) together
// with topk_weights [T, k] F32. Exactly one of the two forms. An id outside [-1, E): the cpu backend refuses it
// (ArgumentError naming the slot); the cuda backend, which cannot read device data in forward() without a sync,
// reads it as an unused slot.
struct RoutingArgs {
  const TensorRef* router_logits = nullptr;
  const TensorRef* topk_ids = nullptr;
  const TensorRef* topk_weights = nullptr;
};

class MoeLayer {
 public:
  static std::unique_ptr<MoeLayer> create(MoeWeights weights, const MoeLayerOptions& options);
  static std::unique_ptr<MoeLayer> create(const Checkpoint& checkpoint, int layer, const MoeLayerOptions& options);
  virtual ~MoeLayer() = default;

  virtual const MoeSpec& spec() const = 0;
  virtual const MoeLayerOptions& options() const = 0;
  // hidden [T, H] BF16 (or F32, rounded to bf16 first); out [T, H] F32 or BF16; all on the layer's device
  // (CPU tensors for the cpu backend). stream: a cudaStream_t (nullptr = default stream); ignored on CPU.
  virtual void forward(const TensorRef& hidden, const RoutingArgs& routing, const TensorRef& out,
                       void* stream = nullptr) = 0;
  virtual size_t weight_bytes() const = 0;     // device (or host) bytes of the prepared weights
  virtual size_t workspace_bytes() const = 0;  // bytes allocated at creation for max_tokens

  // Calibration (w4a4): between begin and end, forward() also records the activation amax of the GEMM1 and
  // GEMM2 inputs per expert; end_calibration() replaces the input scales by amax / (6 * 448).
  virtual void begin_calibration() = 0;
  virtual void end_calibration() = 0;
};

// One rank's layer from an already sliced shard (slice_weights, Checkpoint::load_shard); options.parallel
// must name the shard's rank. MoeLayer::create(weights, options) with a non-trivial options.parallel slices the
// full weights itself; create(checkpoint, layer, options) loads only the rank's shard.
std::unique_ptr<MoeLayer> create_moe_layer_shard(MoeShard shard, const MoeLayerOptions& options);

// The argument checks forward() runs (shared by every backend). Throws ArgumentError naming the argument, the
// expected and the actual value.
void validate_forward_args(const MoeSpec& spec, const MoeLayerOptions& options, const TensorRef& hidden,
                           const RoutingArgs& routing, const TensorRef& out, DeviceType expected_device);

}  // namespace nvfp4moe
