// MoeLayer: backend selection, the argument checks every backend's forward() runs, and the CPU layer (a thin
// shell over src/cpu/reference.h).
//
// The CPU layer's forward() serializes concurrent callers with a mutex (its conversion buffers and
// calibration statistics are per layer). Its buffers grow on demand up to max_tokens and are kept;
// workspace_bytes() reports what it holds now.
#include <cmath>
#include <algorithm>
#include <cstring>
#include <mutex>

#include "api/cpu_forward_scratch.h"
#include "api/parallel_internal.h"
#include "cpu/reference.h"
#include "format/nvfp4.h"
#include "model/unquantized.h"
#include "nvfp4moe/error.h"
#include "nvfp4moe/moe.h"

#if defined(NVFP4MOE_WITH_CUDA)
#include "cuda/cuda_backend.h"
#endif

namespace nvfp4moe {

const char* backend_name(Backend b) { return b == Backend::Cpu ? "cpu" : "cuda"; }

bool backend_from_name(const std::string& name, Backend* out) {
  if (name == "cpu") *out = Backend::Cpu;
  else if (name == "cuda") *out = Backend::Cuda;
  else return false;
  return true;
}

bool cuda_backend_available() {
#if defined(NVFP4MOE_WITH_CUDA)
  return cuda::device_available();
#else
  return false;
#endif
}

namespace {

const char* device_name(DeviceType d) { return d == DeviceType::CPU ? "cpu" : "cuda"; }

std::string shape_str(std::initializer_list<int64_t> s) {
  std::string r = "[";
  bool first = true;
  for (int64_t v : s) {
    r += (first ? "" : ", ") + std::to_string(v);
    first = false;
  }
  return r + "]";
}

// One tensor's checks: dtype in `dtypes`, shape == `shape`, contiguous, device, non-null data when numel > 0,
// alignment (bytes) of the data pointer.
void check_tensor(const char* name, const TensorRef& t, std::initializer_list<DType> dtypes,
                  std::initializer_list<int64_t> shape, const MoeLayerOptions& options, DeviceType device,
                  size_t alignment) {
  std::string want;
  for (DType d : dtypes) want += (want.empty() ? "" : " or ") + std::string(dtype_name(d));
  const std::string expected = want + shape_str(shape) + " contiguous on " + device_name(device);
  const bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), t.dtype) != dtypes.end();
  NVFP4MOE_CHECK(dtype_ok, ArgumentError, name, ": wrong dtype: expected ", expected, ", got ", t.describe());
  NVFP4MOE_CHECK(t.shape.size() == shape.size(), ArgumentError, name, ": wrong rank: expected ", expected, ", got ",
                 t.describe());
  NVFP4MOE_CHECK(std::equal(shape.begin(), shape.end(), t.shape.begin()), ArgumentError, name,
                 ": wrong shape: expected ", expected, ", got ", t.describe());
  NVFP4MOE_CHECK(t.is_contiguous(), ArgumentError, name, ": not contiguous: expected ", expected, ", got ",
                 t.describe());
  NVFP4MOE_CHECK(t.device == device, ArgumentError, name, ": wrong device: expected ", expected, ", got ",
                 t.describe());
  if (device == DeviceType::CUDA)
    NVFP4MOE_CHECK(t.device_id == options.device, ArgumentError, name, ": wrong device: expected cuda:",
                   options.device, " (MoeLayerOptions.device), got ", t.describe());
  if (t.numel() > 0) {
    NVFP4MOE_CHECK(t.data != nullptr, ArgumentError, name, ": data is null: expected ", expected, ", got ",
                   t.describe());
    NVFP4MOE_CHECK(reinterpret_cast<uintptr_t>(t.data) % alignment == 0, ArgumentError, name, ": expected a ",
                   alignment, "-byte aligned data pointer, got ", t.data, " (", t.describe(), ")");
  }
}

}  // namespace

void validate_forward_args(const MoeSpec& spec, const MoeLayerOptions& options, const TensorRef& hidden,
                           const RoutingArgs& routing, const TensorRef& out, DeviceType expected_device) {
  const int64_t H = spec.hidden, E = spec.num_experts, K = spec.top_k;
  NVFP4MOE_CHECK(hidden.shape.size() == 2, ArgumentError, "hidden: wrong rank: expected BF16 or F32[T, ", H,
                 "], got ", hidden.describe());
  const int64_t T = hidden.shape[0];
  NVFP4MOE_CHECK(T >= 0, ArgumentError, "hidden: expected T >= 0 rows, got ", hidden.describe());
  NVFP4MOE_CHECK(T <= options.max_tokens, ArgumentError, "hidden: T = ", T, " tokens exceeds max_tokens = ",
                 options.max_tokens, " (MoeLayerOptions.max_tokens), got ", hidden.describe());
  // CUDA kernels read hidden/out with 16-byte vectors; the routing tensors need their element alignment.
  const bool cuda = expected_device == DeviceType::CUDA;
  const size_t big_align = cuda ? 16 : 1;
  check_tensor("hidden", hidden, {DType::BF16, DType::F32}, {T, H}, options, expected_device,
               std::max(big_align, dtype_size(hidden.dtype)));
  check_tensor("out", out, {DType::F32, DType::BF16}, {T, H}, options, expected_device,
               std::max(big_align, dtype_size(out.dtype)));
  const bool logits = routing.router_logits != nullptr;
  const bool given = routing.topk_ids != nullptr || routing.topk_weights != nullptr;
  NVFP4MOE_CHECK(logits != given, ArgumentError,
                 "routing: expected exactly one form, router_logits or topk_ids + topk_weights, got ",
                 logits ? "both" : "neither");
  if (logits) {
    check_tensor("router_logits", *routing.router_logits, {DType::F32}, {T, E}, options, expected_device, 4);
    return;
  }
  NVFP4MOE_CHECK(routing.topk_ids != nullptr, ArgumentError,
                 "topk_ids: expected I32[T, top_k] together with topk_weights, got none");
  NVFP4MOE_CHECK(routing.topk_weights != nullptr, ArgumentError,
                 "topk_weights: expected F32[T, top_k] together with topk_ids, got none");
  check_tensor("topk_ids", *routing.topk_ids, {DType::I32}, {T, K}, options, expected_device, 4);
  check_tensor("topk_weights", *routing.topk_weights, {DType::F32}, {T, K}, options, expected_device, 4);
}

namespace {

// The CPU backend: the reference layer behind the MoeLayer interface.
class CpuMoeLayer final : public MoeLayer {
 public:
  CpuMoeLayer(MoeWeights w, const MoeLayerOptions& options) : w_(std::move(w)), options_(options) {}

  const MoeSpec& spec() const override { return w_.spec; }
  const MoeLayerOptions& options() const override { return options_; }
  size_t weight_bytes() const override { return w_.packed_bytes(); }
  size_t workspace_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return scratch_.bytes();
  }

  void forward(const TensorRef& hidden, const RoutingArgs& routing, const TensorRef& out, void*) override {
    validate_forward_args(w_.spec, options_, hidden, routing, out, DeviceType::CPU);
    if (hidden.dim(0) == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    scratch_.run(w_.spec, w_.router_bias, hidden, routing, out,
                 [&](const uint16_t* x, int64_t T, const int32_t* ids, const float* ws, float* y) {
                   cpu::moe_forward(w_, options_.mode, x, T, ids, ws, y, calibrating_ ? &stats_ : nullptr);
                 });
  }

  void begin_calibration() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = cpu::CalibrationStats{};
    calibrating_ = true;
  }

  // input_scale = amax / (6 * 448); an expert that saw no tokens gets the max of the others' amax (what the
  // exporter does), and with shared_max_input_scale every expert gets the max. Nothing seen at all: the
  // checkpoint's scales stay.
  void end_calibration() override {
    std::lock_guard<std::mutex> lock(mu_);
    NVFP4MOE_CHECK(calibrating_, ArgumentError, "end_calibration: no calibration in progress (call begin_calibration)");
    calibrating_ = false;
    auto apply = [&](const std::vector<float>& amax, std::vector<float>& scale) {
      if (amax.empty() || amax.size() != scale.size()) return;
      const float mx = *std::max_element(amax.begin(), amax.end());
      if (!(mx > 0.0f)) return;
      for (size_t e = 0; e < scale.size(); ++e) {
        const float a = (amax[e] > 0.0f && !options_.shared_max_input_scale) ? amax[e] : mx;
        scale[e] = a / fmt::kWeightScaleDenom;
      }
    };
    apply(stats_.gemm1_amax, w_.experts.w13_input_scale);
    apply(stats_.gemm2_amax, w_.experts.w2_input_scale);
    if (w_.has_shared()) {
      apply(stats_.shared_gemm1_amax, w_.shared.w13_input_scale);
      apply(stats_.shared_gemm2_amax, w_.shared.w2_input_scale);
    }
  }

 private:
  MoeWeights w_;
  MoeLayerOptions options_;
  mutable std::mutex mu_;
  cpu_layer_detail::CpuForwardScratch scratch_;
  bool calibrating_ = false;
  cpu::CalibrationStats stats_;
};

}  // namespace

std::unique_ptr<MoeLayer> MoeLayer::create(MoeWeights weights, const MoeLayerOptions& options) {
  if (!options.parallel.is_trivial()) {
    parallel_detail::check_sharded_options(options);
    return parallel_detail::create_sharded(slice_weights(weights, options.parallel), options);
  }
  // NaN input scales: the checkpoint has none (compressed-tensors W4A16). w4a4 needs them; w4a16 ignores them.
  for (auto* v : {&weights.experts.w13_input_scale, &weights.experts.w2_input_scale, &weights.shared.w13_input_scale,
                  &weights.shared.w2_input_scale})
    for (float& x : *v)
      if (std::isnan(x)) {
        NVFP4MOE_CHECK(options.mode != Mode::W4A4, ArgumentError, "MoeLayerOptions.mode: layer ", weights.spec.layer,
                       " has no activation input scales (a W4A16 checkpoint, e.g. compressed-tensors with "
                       "input_activations null); expected w4a16, or input scales from `nvfp4moe calibrate`, got w4a4");
        x = 1.0f;
      }
  weights.validate();
  NVFP4MOE_CHECK(options.max_tokens >= 0, ArgumentError, "MoeLayerOptions.max_tokens: expected >= 0, got ",
                 options.max_tokens);
  if (options.shared_max_input_scale) use_shared_max_input_scales(weights);
  if (options.backend == Backend::Cuda) {
#if defined(NVFP4MOE_WITH_CUDA)
    return cuda::create_cuda_moe_layer(std::move(weights), options);
#else
    throw ArgumentError("MoeLayerOptions.backend: expected cpu, got cuda (this nvfp4moe was built without CUDA)");
#endif
  }
  return std::make_unique<CpuMoeLayer>(std::move(weights), options);
}

std::unique_ptr<MoeLayer> MoeLayer::create(const Checkpoint& checkpoint, int layer, const MoeLayerOptions& options) {
  // An unquantized checkpoint is quantized at load (model/unquantized.h): on the GPU for the cuda backend, on the
  // CPU otherwise; it has no input scales, so w4a4 is refused before the (large) quantization runs.
  // A parallel config is refused for the cuda backend here, before an unquantized layer is quantized on the GPU
  // below only to be refused afterwards in create(weights).
  if (!options.parallel.is_trivial()) parallel_detail::check_sharded_options(options);
  if (const auto* u = dynamic_cast<const model::UnquantizedCheckpoint*>(&checkpoint)) {
    NVFP4MOE_CHECK(options.mode != Mode::W4A4, ArgumentError, "MoeLayerOptions.mode: layer ", layer, " of ",
                   checkpoint.path(), " is unquantized (bf16, quantized to NVFP4 at load) and has no activation input "
                   "scales; expected w4a16, or w4a4 on a checkpoint with input scales: `nvfp4moe quantize IN OUT "
                   "--calibration FILE` (or `nvfp4moe calibrate` on its output), got w4a4");
    if (options.backend == Backend::Cuda) {  // (a parallel config slices the quantized layer in create(weights))
      auto q = model::make_cuda_expert_quantizer(options.device);
      return create(u->load_layer_with(layer, *q), options);
    }
  }
  if (!options.parallel.is_trivial()) {
    parallel_detail::check_sharded_options(options);  // before reading any bytes
    return parallel_detail::create_sharded(checkpoint.load_shard(layer, options.parallel), options);
  }
  return create(checkpoint.load_layer(layer), options);
}

}  // namespace nvfp4moe
