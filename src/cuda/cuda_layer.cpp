// The cuda backend's runner: upload (streamed through a bounded pinned staging buffer; on the sm90 path also
// through a bounded device scratch, prepared into the final allocation), workspace, and the graph-safe forward()
// that enqueues route -> plan -> gather(+quant) -> GEMM1(+act+quant) -> GEMM2 -> combine.
#include "cuda/cuda_layer.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "cuda/cuda_backend.h"
#include "cuda/moe_kernels.h"
#include "format/nvfp4.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::cuda {
namespace {

void check_cuda(cudaError_t err, const char* what) {
  NVFP4MOE_CHECK(err == cudaSuccess, Error, "cuda backend: ", what, " failed: ", cudaGetErrorName(err), " (",
                 cudaGetErrorString(err), ")");
}

// A launch failure: the launcher's status, named.
void check_launch(cudaError_t err, const char* launch) {
  NVFP4MOE_CHECK(err == cudaSuccess, Error, "cuda backend: kernel launch '", launch, "' failed: ",
                 cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

// An sm90 GEMM / prepare failure: cudaErrorInvalidValue carries the API's reason.
void check_sm90(cudaError_t err, const char* launch) {
  NVFP4MOE_CHECK(err == cudaSuccess, Error, "cuda backend: kernel launch '", launch, "' failed: ",
                 cudaGetErrorName(err), " (",
                 err == cudaErrorInvalidValue ? sm90_gemm_last_error_message() : cudaGetErrorString(err), ")");
}

// Makes `device` current for the scope (and restores the caller's device).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
    restore_ = prev_ != device;
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool restore_ = false;
};

constexpr size_t kAlign = 256;
size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Bump layout over one allocation: pass 1 (base == nullptr) sizes it, pass 2 hands out the pointers.
class Carver {
 public:
  explicit Carver(uint8_t* base) : base_(base) {}
  template <typename T>
  T* take(size_t count) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += align_up(count * sizeof(T));
    return p;
  }
  size_t used() const { return used_; }

 private:
  uint8_t* base_;
  size_t used_ = 0;
};

// Host -> device through two pinned buffers: fill one (parallel memcpy) while the other is in flight.
class PinnedStager {
 public:
  static constexpr size_t kBufferBytes = size_t(32) << 20;  // x2 = 64 MB of pinned host memory in all

  PinnedStager() {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate (upload)");
    for (int i = 0; i < 2; ++i) {
      check_cuda(cudaHostAlloc(&buf_[i], kBufferBytes, cudaHostAllocDefault), "cudaHostAlloc (staging)");
      check_cuda(cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming), "cudaEventCreate (staging)");
    }
  }
  ~PinnedStager() {
    cudaStreamSynchronize(stream_);
    for (int i = 0; i < 2; ++i) {
      if (done_[i]) cudaEventDestroy(done_[i]);
      if (buf_[i]) cudaFreeHost(buf_[i]);
    }
    if (stream_) cudaStreamDestroy(stream_);
  }
  PinnedStager(const PinnedStager&) = delete;
  PinnedStager& operator=(const PinnedStager&) = delete;

  void copy(void* dst, const void* src, size_t bytes) {
    const uint8_t* s = static_cast<const uint8_t*>(src);
    uint8_t* d = static_cast<uint8_t*>(dst);
    for (size_t off = 0; off < bytes; off += kBufferBytes) {
      const size_t n = std::min(kBufferBytes, bytes - off);
      check_cuda(cudaEventSynchronize(done_[cur_]), "cudaEventSynchronize (staging)");  // buffer free again
      uint8_t* pinned = static_cast<uint8_t*>(buf_[cur_]);
      constexpr size_t kPiece = size_t(1) << 20;
      const int64_t pieces = static_cast<int64_t>((n + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < pieces; ++i) {
        const size_t o = static_cast<size_t>(i) * kPiece;
        std::memcpy(pinned + o, s + off + o, std::min(kPiece, n - o));
      }
      check_cuda(cudaMemcpyAsync(d + off, pinned, n, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (upload)");
      check_cuda(cudaEventRecord(done_[cur_], stream_), "cudaEventRecord (staging)");
      cur_ ^= 1;
    }
  }
  void finish() { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (upload)"); }
  // The copies' stream: work enqueued on it after copy() runs after those bytes have landed, and later copies
  // into the same device memory wait for it (so one device scratch can be reused chunk after chunk).
  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  void* buf_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};
  int cur_ = 0;
};

// A device allocation freed at scope exit (after the caller synchronized what uses it).
struct DeviceScratch {
  void* p = nullptr;
  DeviceScratch() = default;
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  ~DeviceScratch() {
    if (p) cudaFree(p);
  }
};

}  // namespace

const char* gemm_path_name(GemmPath p) { return p == GemmPath::kMmaSync ? "mma_sync" : "sm90_wgmma"; }

GemmPath gemm_path_from_env() {
  const char* v = std::getenv("NVFP4MOE_GEMM");
  const std::string s = v ? v : "";
  if (s.empty() || s == "sm90_wgmma" || s == "sm90" || s == "wgmma") return GemmPath::kSm90Wgmma;
  if (s == "mma_sync" || s == "mma") return GemmPath::kMmaSync;
  throw ArgumentError("NVFP4MOE_GEMM: expected sm90_wgmma (the default) or mma_sync, got '" + s + "'");
}

Sm90ConfigOverride parse_sm90_config_override(const std::string& value) {
  Sm90ConfigOverride o;
  if (value.empty()) return o;
  auto refuse = [&](const std::string& why) {
    std::string names;
    for (const auto& c : sm90_gemm_configs()) names += (names.empty() ? "" : ", ") + to_string(c);
    throw ArgumentError("NVFP4MOE_SM90_CONFIG: " + why + " in '" + value +
                        "'; expected a config name for both GEMMs or gemm1=NAME,gemm2=NAME[,mma=sync|wgmma] or "
                        "mma=sync|wgmma, names: " + names);
  };
  auto config = [&](const std::string& name) {
    Sm90GemmConfig c{};
    if (!sm90_gemm_config_by_name(name, &c)) refuse("unknown config '" + name + "'");
    return c;
  };
  if (value.find('=') == std::string::npos) {
    o.gemm1 = o.gemm2 = config(value);
    o.gemm1_set = o.gemm2_set = true;
    return o;
  }
  size_t pos = 0;
  while (pos <= value.size()) {
    const size_t end = std::min(value.find(',', pos), value.size());
    const std::string item = value.substr(pos, end - pos);
    const size_t eq = item.find('=');
    if (eq == std::string::npos) refuse("item '" + item + "' is not gemm1=NAME or gemm2=NAME");
    const std::string key = item.substr(0, eq);
    if (key == "mma") {
      const std::string v = item.substr(eq + 1);
      if (o.mma_sync >= 0 || (v != "sync" && v != "wgmma")) refuse("mma= must be sync or wgmma, once");
      o.mma_sync = v == "sync" ? 1 : 0;
      pos = end + 1;
      continue;
    }
    const Sm90GemmConfig c = config(item.substr(eq + 1));
    if (key == "gemm1" && !o.gemm1_set) {
      o.gemm1 = c;
      o.gemm1_set = true;
    } else if (key == "gemm2" && !o.gemm2_set) {
      o.gemm2 = c;
      o.gemm2_set = true;
    } else {
      refuse("key '" + key + "' is not gemm1 or gemm2, or given twice");
    }
    pos = end + 1;
  }
  return o;
}

Sm90ConfigOverride sm90_config_override_from_env() {
  const char* v = std::getenv("NVFP4MOE_SM90_CONFIG");
  return parse_sm90_config_override(v ? v : "");
}

ConsumerStagger parse_consumer_stagger(const std::string& value) {
  ConsumerStagger st;
  if (value.empty()) return st;
  auto refuse = [&]() {
    throw ArgumentError("NVFP4MOE_CONSUMER_STAGGER_NS: expected N (both GEMMs) or N1,N2 (GEMM1, GEMM2), each a "
                        "decimal integer in [0, " + std::to_string(kSm90MaxConsumerStaggerNs) + "], got '" +
                        value + "'");
  };
  auto number = [&](const std::string& t) {
    long long v = 0;
    if (!parse_env_decimal(t, 0, kSm90MaxConsumerStaggerNs, &v)) refuse();
    return static_cast<int>(v);
  };
  const size_t comma = value.find(',');
  if (comma == std::string::npos) {
    st.gemm1 = st.gemm2 = number(value);
  } else {
    st.gemm1 = number(value.substr(0, comma));
    st.gemm2 = number(value.substr(comma + 1));  // a second comma makes this part non-numeric: refused
  }
  return st;
}

ConsumerStagger consumer_stagger_from_env() {
  const char* v = std::getenv("NVFP4MOE_CONSUMER_STAGGER_NS");
  return parse_consumer_stagger(v ? v : "");
}

int parse_gather_token_major_min_tokens(const std::string& value) {
  if (value.empty()) return kGatherTokenMajorMinTokens;
  long long v = 0;
  if (!parse_env_decimal(value, 1, 2147483647LL, &v))
    throw ArgumentError("NVFP4MOE_GATHER_TOKEN_MAJOR_MIN_TOKENS: expected a decimal integer in [1, 2147483647] (the "
                        "routed gather is token-major from that T on; default " +
                        std::to_string(kGatherTokenMajorMinTokens) + "), got '" + value + "'");
  return static_cast<int>(v);
}

int gather_token_major_min_tokens_from_env() {
  const char* v = std::getenv("NVFP4MOE_GATHER_TOKEN_MAJOR_MIN_TOKENS");
  return parse_gather_token_major_min_tokens(v ? v : "");
}

bool device_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::unique_ptr<MoeLayer> create_cuda_moe_layer(MoeWeights weights, const MoeLayerOptions& options) {
  return std::make_unique<CudaMoeLayer>(std::move(weights), options);
}

CudaMoeLayer::CudaMoeLayer(MoeWeights w, const MoeLayerOptions& options)
    : CudaMoeLayer(std::move(w), options, gemm_path_from_env()) {}

CudaMoeLayer::CudaMoeLayer(MoeWeights w, const MoeLayerOptions& options, GemmPath gemm)
    : gemm_(gemm), sm90_override_(sm90_config_override_from_env()), spec_(w.spec), options_(options) {
  w.validate();
  (void)block_route_max_tokens();  // NVFP4MOE_BLOCK_ROUTE_MAX_TOKENS: a bad value fails here, not in forward()
  NVFP4MOE_CHECK(options.backend == Backend::Cuda, ArgumentError, "MoeLayerOptions.backend: expected cuda, got ",
                 backend_name(options.backend));
  NVFP4MOE_CHECK(options.max_tokens >= 0, ArgumentError, "MoeLayerOptions.max_tokens: expected >= 0, got ",
                 options.max_tokens);
  NVFP4MOE_CHECK(spec_.num_experts <= kMaxExperts, ArgumentError, "MoeSpec.num_experts: the cuda backend supports <= ",
                 kMaxExperts, ", got ", spec_.num_experts);
  NVFP4MOE_CHECK(spec_.intermediate % 16 == 0 && spec_.shared_intermediate % 16 == 0 && spec_.hidden % 16 == 0,
                 ArgumentError, "MoeSpec: the cuda backend needs hidden, intermediate and shared_intermediate % 16 == 0,"
                 " got ", spec_.hidden, ", ", spec_.intermediate, ", ", spec_.shared_intermediate);
  // (divided, not multiplied: max_tokens is the caller's, and a product that wraps would size the workspace for
  // almost nothing)
  const int64_t max_tokens_limit = ((int64_t(1) << 30) - 1) / std::max<int64_t>(1, spec_.top_k);
  NVFP4MOE_CHECK(options.max_tokens <= max_tokens_limit, ArgumentError,
                 "MoeLayerOptions.max_tokens: expected <= ", max_tokens_limit, " (max_tokens * top_k < 2^30: int32 row "
                 "indices; top_k = ", spec_.top_k, "), got ", options.max_tokens);
  int count = 0;
  check_cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  NVFP4MOE_CHECK(options.device >= 0 && options.device < count, ArgumentError,
                 "MoeLayerOptions.device: expected 0..", count - 1, ", got ", options.device);
  if (gemm_ == GemmPath::kSm90Wgmma) {
    // wgmma / setmaxnreg / TMA exist on sm_90 only, and the kernels are built for sm_90a alone.
    int major = 0, minor = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, options.device), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, options.device), "cudaDeviceGetAttribute");
    NVFP4MOE_CHECK(major == 9 && minor == 0, Error, "cuda backend: the sm90_wgmma grouped GEMM needs an sm_90 device"
                   " (H100/H200), cuda:", options.device, " is sm_", major, minor);
  }
  if (options.shared_max_input_scale) use_shared_max_input_scales(w);
  shared_reads_hidden_ = env_switch("NVFP4MOE_SHARED_HIDDEN");  // A/B and tests: "0" = the shared gather copies
  fused_gather_enabled_ = env_switch("NVFP4MOE_FUSED_GATHER");  // A/B and tests: "0" = route + plan, then gather
  gather_token_major_min_tokens_ = gather_token_major_min_tokens_from_env();  // A/B and tests
  route_warp_kept_groups_ = env_opt_in("NVFP4MOE_ROUTE_WARP_GROUPS");  // A/B and tests: "1" = groups by one warp
  DeviceGuard warm(options.device);
  (void)device_sm_count();  // cached now, so no attribute query ever happens inside a captured forward()
  DeviceGuard guard(options.device);
  try {
    upload(w);
    layout_workspace(true);
    if (gemm_ == GemmPath::kSm90Wgmma) {
      chain_enabled_ = env_switch("NVFP4MOE_CHAINED_GEMMS");     // A/B: "0" = two launches per group
      warp_stream_enabled_ = env_switch("NVFP4MOE_WARP_STREAM");  // A/B: "0" = the tile rule at decode too
      early_gemm2_enabled_ = env_switch("NVFP4MOE_EARLY_GEMM2");  // A/B: "0" = GEMM2 waits first
      dynamic_tiles_enabled_ = env_switch("NVFP4MOE_DYNAMIC_TILES");  // A/B: "0" = static tile round-robin
      consumer_stagger_ = consumer_stagger_from_env();                 // A/B: ns, default 0
      mixed_last_pass_ = env_opt_in("NVFP4MOE_SM90_MIXED_LAST_PASS");  // A/B: "1" = the mixed last prefill pass
      gemm1_gather_enabled_ = env_opt_in("NVFP4MOE_GEMM1_GATHER");  // A/B: "1" = gathered A at prefill
      t1_broadcast_enabled_ = env_switch("NVFP4MOE_T1_BROADCAST");  // A/B: "0" = the gather copies at T = 1
      ws_gather_enabled_ = env_opt_in("NVFP4MOE_WS_GATHER");  // A/B: "1" = decode GEMM1 gathers
      t1_route_in_gemm_enabled_ = env_switch("NVFP4MOE_T1_ROUTE_IN_GEMM");    // A/B: "0" = the routing launch
      t1_gemm2_reads_ids_ = env_switch("NVFP4MOE_T1_GEMM2_READS_IDS");  // A/B: "0" = GEMM2 seeks the offsets
      t1_gemm2_guesses_ids_ = env_switch("NVFP4MOE_T1_GEMM2_GUESSES_IDS");  // A/B: "0" = reads them after its wait
      t1_w4a4_quant_rows_enabled_ = env_switch("NVFP4MOE_T1_W4A4_QUANT_ROWS");  // A/B: "0" = w4a4 T = 1 gathers
      gemm1_routes_tokens_enabled_ = env_switch("NVFP4MOE_GEMM1_ROUTES_TOKENS");  // A/B: "0" = T = 2 .. 4 launch
      // A/B: "0" = w4a4 T = 2 .. 4 take the routing launch with the quantizing gather
      gemm1_quantizes_token_rows_enabled_ = env_switch("NVFP4MOE_GEMM1_QUANTIZES_TOKEN_ROWS");
      // "1": also with a separate shared expert (measured slower there; A/B and the bitwise test)
      gemm1_quantizes_token_rows_separate_shared_ = env_opt_in("NVFP4MOE_GEMM1_QUANTIZES_TOKEN_ROWS");
      gemm2_reads_token_ids_ = env_switch("NVFP4MOE_GEMM2_READS_TOKEN_IDS");  // A/B: "0" = T = 2 .. 4 GEMM2 seeks
      gemm2_guesses_token_ids_ = env_switch("NVFP4MOE_GEMM2_GUESSES_TOKEN_IDS");  // A/B: "0" = after its wait
      // Zero once; every chained launch leaves its counters zero (sm90_nvfp4_chained_gemms), every dynamically
      // scheduled one its tile counter.
      const size_t routed_n = sm90_chain_counter_count(static_cast<int>(spec_.num_experts) + 1);
      const size_t shared_n = sm90_chain_counter_count(1);
      const size_t n = routed_n + shared_n + 4;
      check_cuda(cudaMalloc(&chain_counters_, n * sizeof(int32_t)), "cudaMalloc (chain and tile counters)");
      check_cuda(cudaMemset(chain_counters_, 0, n * sizeof(int32_t)), "cudaMemset (chain and tile counters)");
      shared_chain_counters_ = chain_counters_ + routed_n;
      tile_counters_ = shared_chain_counters_ + shared_n;
      warm_up_sm90();
    }
  } catch (...) {
    if (weights_) cudaFree(weights_);
    if (calib_) cudaFree(calib_);
    if (workspace_) cudaFree(workspace_);
    if (chain_counters_) cudaFree(chain_counters_);
    throw;
  }
}

CudaMoeLayer::~CudaMoeLayer() {
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(options_.device);
  if (weights_) cudaFree(weights_);
  if (calib_) cudaFree(calib_);
  if (workspace_) cudaFree(workspace_);
  if (chain_counters_) cudaFree(chain_counters_);
  cudaSetDevice(prev);
}

void CudaMoeLayer::upload(MoeWeights& w) {
  auto describe = [](const StackedExperts& s, DeviceExperts& d) {
    d.num_experts = s.num_experts;
    d.hidden = s.hidden;
    d.intermediate = s.intermediate;
    d.gated = s.gated;
    d.n1 = s.n1();
    d.gate_scale2 = s.gated ? s.w13_gate_scale2 : s.w13_up_scale2;
    d.up_scale2 = s.w13_up_scale2;
    d.input_scale13 = s.w13_input_scale;
    d.scale2 = s.w2_scale2;
    d.input_scale2 = s.w2_input_scale;
  };
  describe(w.experts, routed_);
  if (w.has_shared()) describe(w.shared, shared_);
  const bool sm90 = gemm_ == GemmPath::kSm90Wgmma;
  // A shared expert of the routed experts' shape (DeepSeek) becomes expert E of the routed launches: its
  // prepared weights, factors and rows follow the routed ones, so one GEMM launch covers both (the shared
  // expert alone at decode is one expert's tiles on a handful of SMs). A gated (Qwen2) or differently sized
  // shared expert keeps its own launches.
  shared_in_routed_ = sm90 && shared_.num_experts == 1 && !spec_.shared_expert_gated &&
                      shared_.intermediate == routed_.intermediate && shared_.gated == routed_.gated &&
                      shared_.hidden == routed_.hidden;
  if (sm90) {
    for (DeviceExperts* d : {&routed_, &shared_}) {
      if (d->num_experts == 0) continue;
      const int e = static_cast<int>(d->num_experts), h = static_cast<int>(d->hidden);
      const int i = static_cast<int>(d->intermediate), n1 = static_cast<int>(d->n1);
      d->w13_shape = sm90_prepared_shape(e, n1, h, d->gated);  // gated: [gate; up] rows -> the SwiGLU units
      d->w2_shape = sm90_prepared_shape(e, h, i, false);
    }
  }

  // Pass 1 sizes the allocation, pass 2 carves it.
  auto carve = [&](uint8_t* base) {
    Carver c(base);
    for (DeviceExperts* d : {&routed_, &shared_}) {
      const StackedExperts& s = d == &routed_ ? w.experts : w.shared;
      if (d->num_experts == 0) continue;
      if (sm90 && shared_in_routed_ && d == &shared_) {  // right after the routed experts' bytes
        d->w13_sm90 = routed_.w13_sm90 ? routed_.w13_sm90 + routed_.w13_shape.bytes : nullptr;
        d->w2_sm90 = routed_.w2_sm90 ? routed_.w2_sm90 + routed_.w2_shape.bytes : nullptr;
      } else if (sm90) {  // only the layout the chosen GEMM reads is allocated
        const bool with_shared = shared_in_routed_ && d == &routed_;
        d->w13_sm90 = c.take<uint8_t>(d->w13_shape.bytes + (with_shared ? shared_.w13_shape.bytes : 0));
        d->w2_sm90 = c.take<uint8_t>(d->w2_shape.bytes + (with_shared ? shared_.w2_shape.bytes : 0));
      } else {
        d->w13 = c.take<uint8_t>(s.w13.size());
        d->w13_scale = c.take<uint8_t>(s.w13_scale.size());
        d->w2 = c.take<uint8_t>(s.w2.size());
        d->w2_scale = c.take<uint8_t>(s.w2_scale.size());
      }
    }
    // Per-expert factors [E + S] each, the shared expert's after the routed ones (expert index E).
    const size_t er = static_cast<size_t>(routed_.num_experts), es = static_cast<size_t>(shared_.num_experts);
    float** routed_factors[5] = {&routed_.alpha13_gate, &routed_.alpha13_up, &routed_.alpha2, &routed_.gs13,
                                 &routed_.gs2};
    float** shared_factors[5] = {&shared_.alpha13_gate, &shared_.alpha13_up, &shared_.alpha2, &shared_.gs13,
                                 &shared_.gs2};
    for (int i = 0; i < 5; ++i) {
      *routed_factors[i] = c.take<float>(er + es);
      *shared_factors[i] = (es && *routed_factors[i]) ? *routed_factors[i] + er : nullptr;
    }
    router_bias_ = w.router_bias.empty() ? nullptr : c.take<float>(w.router_bias.size());
    shared_gate_weight_ = (spec_.shared_expert_gated && !w.shared_gate_weight.empty())
                              ? c.take<uint16_t>(w.shared_gate_weight.size())
                              : nullptr;
    return c.used();
  };
  weight_bytes_ = carve(nullptr);
  check_cuda(cudaMalloc(&weights_, weight_bytes_), "cudaMalloc (weights)");
  carve(weights_);
  NVFP4MOE_CHECK(!spec_.shared_expert_gated || shared_gate_weight_, ArgumentError,
                 "MoeWeights.shared_gate_weight: expected ", spec_.hidden, " values for a gated shared expert, got ",
                 w.shared_gate_weight.size());

  const size_t experts_total = static_cast<size_t>(routed_.num_experts + shared_.num_experts);
  check_cuda(cudaMalloc(&calib_, std::max<size_t>(1, 2 * experts_total) * sizeof(float)), "cudaMalloc (calibration)");
  // [E + S] amax of GEMM1's inputs, then [E + S] of GEMM2's (the shared expert at index E of each).
  routed_.amax13 = calib_;
  routed_.amax2 = calib_ + experts_total;
  if (shared_.num_experts) {
    shared_.amax13 = routed_.amax13 + routed_.num_experts;
    shared_.amax2 = routed_.amax2 + routed_.num_experts;
  }

  const auto t0 = std::chrono::steady_clock::now();
  size_t bytes = 0;
  {
    DeviceScratch scratch;  // declared first: freed after the stager's destructor drained its stream
    PinnedStager stager;
    load_stats_.staging_bytes = 2 * PinnedStager::kBufferBytes;
    if (!sm90) {
      auto put = [&](const void* dst, const HostBuffer& src) {
        stager.copy(const_cast<void*>(dst), src.data(), src.size());
        bytes += src.size();
      };
      for (DeviceExperts* d : {&routed_, &shared_}) {
        if (d->num_experts == 0) continue;
        const StackedExperts& s = d == &routed_ ? w.experts : w.shared;
        put(d->w13, s.w13);
        put(d->w13_scale, s.w13_scale);
        put(d->w2, s.w2);
        put(d->w2_scale, s.w2_scale);
      }
    } else {
      // One packed copy on the device: the checkpoint-layout bytes of `chunk` experts at a time go through one
      // device scratch and are prepared straight into their final place (the prepared layout is per expert
      // contiguous, so expert e0's bytes start at e0 * shape.bytes / E). The copy and the prepare kernel share
      // the stager's stream, so the next chunk's copy into the scratch waits for the previous prepare.
      struct Job {
        const HostBuffer* codes;
        const HostBuffer* scales;
        Sm90PreparedShape shape;
        uint8_t* out;
        const char* what;
      };
      std::vector<Job> jobs;
      for (DeviceExperts* d : {&routed_, &shared_}) {
        if (d->num_experts == 0) continue;
        const StackedExperts& s = d == &routed_ ? w.experts : w.shared;
        const bool r = d == &routed_;
        jobs.push_back({&s.w13, &s.w13_scale, d->w13_shape, const_cast<uint8_t*>(d->w13_sm90),
                        r ? "sm90_prepare_weights (w13)" : "sm90_prepare_weights (shared w13)"});
        jobs.push_back({&s.w2, &s.w2_scale, d->w2_shape, const_cast<uint8_t*>(d->w2_sm90),
                        r ? "sm90_prepare_weights (w2)" : "sm90_prepare_weights (shared w2)"});
      }
      auto per_expert = [](const Job& j, const HostBuffer* b) { return b->size() / j.shape.num_experts; };
      auto chunk_of = [&](const Job& j) {
        const size_t pe = per_expert(j, j.codes) + per_expert(j, j.scales);
        return std::clamp<size_t>(kSm90UploadStagingBytes / pe, 1, j.shape.num_experts);
      };
      auto scratch_of = [&](const Job& j, size_t n) {  // codes, then the scales at an aligned offset
        return align_up(n * per_expert(j, j.codes)) + n * per_expert(j, j.scales);
      };
      size_t scratch_bytes = 0;
      for (const Job& j : jobs) scratch_bytes = std::max(scratch_bytes, scratch_of(j, chunk_of(j)));
      check_cuda(cudaMalloc(&scratch.p, std::max<size_t>(scratch_bytes, 1)), "cudaMalloc (upload scratch)");
      load_stats_.device_staging_bytes = scratch_bytes;
      uint8_t* stage = static_cast<uint8_t*>(scratch.p);
      for (const Job& j : jobs) {
        const size_t E = static_cast<size_t>(j.shape.num_experts), chunk = chunk_of(j);
        const size_t pc = per_expert(j, j.codes), ps = per_expert(j, j.scales), pp = j.shape.bytes / E;
        for (size_t e0 = 0; e0 < E; e0 += chunk) {
          const size_t n = std::min(chunk, E - e0);
          uint8_t* stage_scales = stage + align_up(n * pc);
          stager.copy(stage, j.codes->data() + e0 * pc, n * pc);
          stager.copy(stage_scales, j.scales->data() + e0 * ps, n * ps);
          const Sm90PreparedShape part =
              sm90_prepared_shape(static_cast<int>(n), j.shape.n, j.shape.k, j.shape.gated);
          check_sm90(sm90_prepare_weights(stage, stage_scales, part, j.out + e0 * pp, stager.stream()), j.what);
          bytes += n * (pc + ps);
        }
      }
    }
    stager.finish();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  load_stats_.bytes = bytes;
  load_stats_.seconds = secs;
  load_stats_.gb_per_s = secs > 0 ? static_cast<double>(bytes) / secs / 1e9 : 0.0;

  if (router_bias_)
    check_cuda(cudaMemcpy(const_cast<float*>(router_bias_), w.router_bias.data(), w.router_bias.size() * 4,
                          cudaMemcpyHostToDevice), "cudaMemcpy (router bias)");
  if (shared_gate_weight_)
    check_cuda(cudaMemcpy(const_cast<uint16_t*>(shared_gate_weight_), w.shared_gate_weight.data(),
                          w.shared_gate_weight.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy (shared gate)");
  upload_factors(routed_);
  if (shared_.num_experts) upload_factors(shared_);
  update_routed_uniform_gs13();
}

// alpha / gs per expert from the (possibly calibrated) host scalars, for this layer's mode.
void CudaMoeLayer::upload_factors(DeviceExperts& d) {
  const size_t e = static_cast<size_t>(d.num_experts);
  const bool a4 = options_.mode == Mode::W4A4;
  std::vector<float> host(5 * e);
  for (size_t x = 0; x < e; ++x) {
    host[0 * e + x] = a4 ? d.gate_scale2[x] * d.input_scale13[x] : d.gate_scale2[x];
    host[1 * e + x] = a4 ? d.up_scale2[x] * d.input_scale13[x] : d.up_scale2[x];
    host[2 * e + x] = a4 ? d.scale2[x] * d.input_scale2[x] : d.scale2[x];
    host[3 * e + x] = fmt::activation_global_scale(d.input_scale13[x]);
    host[4 * e + x] = fmt::activation_global_scale(d.input_scale2[x]);
  }
  float* dst[5] = {d.alpha13_gate, d.alpha13_up, d.alpha2, d.gs13, d.gs2};
  for (int i = 0; i < 5; ++i)
    check_cuda(cudaMemcpy(dst[i], host.data() + i * e, e * sizeof(float), cudaMemcpyHostToDevice),
               "cudaMemcpy (per-expert factors)");
}

// One GEMM1 activation scale for every routed expert: the same bits of gs13 (shared_max_input_scale, or a
// checkpoint whose scales are equal). A merged shared expert may have its own (shared_max_input_scale leaves it).
void CudaMoeLayer::update_routed_uniform_gs13() {
  const std::vector<float>& in = routed_.input_scale13;
  routed_uniform_gs13_ = !in.empty();
  for (float s : in)
    if (fmt::float_bits(fmt::activation_global_scale(s)) != fmt::float_bits(fmt::activation_global_scale(in[0])))
      routed_uniform_gs13_ = false;
}

void CudaMoeLayer::layout_workspace(bool allocate) {
  const size_t T = static_cast<size_t>(options_.max_tokens);
  const size_t K = static_cast<size_t>(spec_.top_k), E = static_cast<size_t>(spec_.num_experts);
  const size_t H = static_cast<size_t>(spec_.hidden), I = static_cast<size_t>(spec_.intermediate);
  const size_t Is = static_cast<size_t>(spec_.shared_intermediate);
  const size_t pairs = T * K;
  // Rows of the routed launches: the T*k routed rows, then (shared expert as expert E) the T shared rows.
  const size_t rows = pairs + (shared_in_routed_ ? T : 0);
  auto carve = [&](uint8_t* base) {
    Carver c(base);
    topk_ids_ = c.take<int32_t>(pairs);
    topk_weights_ = c.take<float>(pairs);
    chunk_counts_ = c.take<int32_t>(static_cast<size_t>(plan_chunks(static_cast<int64_t>(pairs))) * E);
    counts_ = c.take<int32_t>(E);
    offsets_ = c.take<int32_t>(E + 2);
    tile_offsets_ = c.take<int32_t>(E + 2);
    perm_ = c.take<int32_t>(pairs);
    inv_ = c.take<int32_t>(pairs);
    shared_offsets_ = c.take<int32_t>(2);
    shared_tile_offsets_ = c.take<int32_t>(2);
    // GEMM1's operand rows and GEMM2's f32 output share one region: the operand is dead once GEMM1 ran.
    float* region = c.take<float>(rows * H);
    a1_ = reinterpret_cast<uint16_t*>(region);
    y_ = region;
    act_ = c.take<uint16_t>(rows * I);
    if (shared_.num_experts && !shared_in_routed_) {
      float* sregion = c.take<float>(T * H);
      sa1_ = reinterpret_cast<uint16_t*>(sregion);
      sy_ = sregion;
      sact_ = c.take<uint16_t>(T * Is);
      sgate_ = c.take<float>(T);
    }
    if (gemm_ == GemmPath::kSm90Wgmma) {
      const size_t tc = std::min<size_t>(T, static_cast<size_t>(kChainMaxTokens));
      chain_y_ = c.take<float>(std::max<size_t>(1, tc * K + (shared_in_routed_ ? tc : 0)) * H);
      if (shared_.num_experts && !shared_in_routed_) chain_sy_ = c.take<float>(std::max<size_t>(1, tc) * H);
    }
    return c.used();
  };
  workspace_bytes_ = carve(nullptr);
  if (!allocate) return;
  check_cuda(cudaMalloc(&workspace_, std::max<size_t>(workspace_bytes_, 1)), "cudaMalloc (workspace)");
  // Defined bytes once: the sm90 GEMM's TMA loads whole token tiles, i.e. also rows past an expert's end that
  // no kernel wrote yet (masked at the store, so their values never matter, but compute-sanitizer initcheck
  // would report the reads). Not a forward-time cost.
  check_cuda(cudaMemset(workspace_, 0, std::max<size_t>(workspace_bytes_, 1)), "cudaMemset (workspace)");
  carve(workspace_);
}

// Launches every configuration of the sm90 GEMM once, for every GEMM of this layer, on zero rows (offsets all 0:
// each CTA finds no tile and exits). This does the one-time per-kernel host work (module load, the shared-memory
// attribute, the register-budget check that refuses a config which would hang) here at creation, where a
// failure is reported with its reason, instead of inside the first (possibly captured) forward().
void CudaMoeLayer::warm_up_sm90() {
  if (options_.max_tokens == 0) return;  // forward() never launches a GEMM (T <= max_tokens = 0)
  const size_t E = static_cast<size_t>(spec_.num_experts);
  check_cuda(cudaMemset(offsets_, 0, (E + 2) * sizeof(int32_t)), "cudaMemset (warm-up offsets)");
  if (shared_.num_experts) check_cuda(cudaMemset(shared_offsets_, 0, 2 * sizeof(int32_t)), "cudaMemset (warm-up offsets)");
  const int64_t cap = routed_rows_capacity();
  for (const DeviceExperts* d : {&routed_, &shared_}) {
    if (d->num_experts == 0 || (d == &shared_ && shared_in_routed_)) continue;
    const bool routed = d == &routed_;
    const int32_t* offsets = routed ? offsets_ : shared_offsets_;
    for (const Sm90GemmConfig& c : sm90_gemm_configs()) {
      // What this layer may launch: every config but the opt-in ones, and those only where NVFP4MOE_SM90_CONFIG
      // names them (an unmeasured kernel never stands in the default path's creation: 1c1aa36's launch bug had
      // failed every warm-up).
      if (sm90_opt_in_config(c) && !(sm90_override_.gemm1_set && sm90_override_.gemm1 == c) &&
          !(sm90_override_.gemm2_set && sm90_override_.gemm2 == c))
        continue;
      Sm90GemmArgs g1;
      g1.a = routed ? a1_ : sa1_;
      g1.a_rows_capacity = routed ? cap : std::max<int64_t>(1, options_.max_tokens);
      g1.w = d->w13_sm90;
      g1.shape = routed ? routed_launch_shape(d->w13_shape) : d->w13_shape;
      g1.offsets = offsets;
      g1.alpha0 = d->alpha13_gate;
      g1.alpha1 = d->alpha13_up;
      g1.out = routed ? act_ : sact_;
      g1.epilogue = d->gated ? Sm90GemmEpilogue::kSwiGLU : Sm90GemmEpilogue::kRelu2;
      check_sm90(sm90_nvfp4_grouped_gemm(g1, c, nullptr, device_sm_count()), "sm90 gemm1 (warm-up)");
      // The routed GEMM2 over GEMM1's output, from a GEMM1 warm-up launch's arguments (its routed kernels).
      auto routed_gemm2_of = [&](const Sm90GemmArgs& gemm1) {
        Sm90GemmArgs g2 = gemm1;
        g2.a = act_;
        g2.a_rows_capacity = cap;
        g2.a_broadcast_row = false;
        g2.w = d->w2_sm90;
        g2.shape = routed_launch_shape(d->w2_shape);
        g2.alpha1 = nullptr;
        g2.out = y_;
        g2.epilogue = Sm90GemmEpilogue::kF32;
        return g2;
      };
      if (routed && t1_broadcast_enabled_ && c.warp_stream &&
          d->w13_shape.k <= sm90_broadcast_row_max_k(c)) {  // its broadcast-row kernel (no rows)
        Sm90GemmArgs gb = g1;
        gb.a_broadcast_row = true;
        check_sm90(sm90_nvfp4_grouped_gemm(gb, c, nullptr, device_sm_count()), "sm90 gemm1 broadcast (warm-up)");
        const int E = static_cast<int>(spec_.num_experts), K = static_cast<int>(spec_.top_k);
        if (t1_route_in_gemm_enabled_ && sm90_one_token_route_available(c, g1.epilogue, true) &&
            sm90_one_token_route_fits(c, E, K)) {  // its routed kernels, routing no token
          Sm90OneTokenRoute rt{};  // forward()'s, with no token: nothing is read or written
          rt.route = route_args(topk_weights_, 0);
          rt.plan = plan_args(0);
          rt.write_outputs = true;
          gb.one_token_route = &rt;
          check_sm90(sm90_nvfp4_grouped_gemm(gb, c, nullptr, device_sm_count()), "sm90 gemm1 routed (warm-up)");
          if (t1_quant_rows_fit(c)) {  // w4a4: the routed kernel quantizing the row per expert
            Sm90GemmArgs gq = gb;
            gq.a_broadcast_quant_gs = d->gs13;
            check_sm90(sm90_nvfp4_grouped_gemm(gq, c, nullptr, device_sm_count()),
                       "sm90 gemm1 routed, quantized rows (warm-up)");
          }
          if (sm90_one_token_route_available(c, Sm90GemmEpilogue::kF32, false)) {
            Sm90GemmArgs g2r = routed_gemm2_of(gb);
            rt.read_ids = true;
            rt.write_outputs = false;
            check_sm90(sm90_nvfp4_grouped_gemm(g2r, c, nullptr, device_sm_count()), "sm90 gemm2 routed (warm-up)");
          }
        }
      }
      if (routed && gemm1_routes_tokens_enabled_ && gemm1_token_rows_fit(c, 2)) {  // its T = 2 .. 4 kernel, no token
        Sm90GemmArgs gt = g1;
        if (options_.mode == Mode::W4A4) gt.a_routed_token_quant_gs = d->gs13;  // (quantized per expert)
        Sm90OneTokenRoute rt{};
        rt.route = route_args(topk_weights_, 0);
        rt.plan = plan_args(0);
        rt.write_outputs = true;
        gt.a_routed_token_rows = true;
        gt.one_token_route = &rt;
        check_sm90(sm90_nvfp4_grouped_gemm(gt, c, nullptr, device_sm_count()), "sm90 gemm1 routing tokens (warm-up)");
        if (gemm2_reads_token_ids_ && c.blocks_per_warp == 2) {  // GEMM2 reading those ids
          Sm90GemmArgs g2t = routed_gemm2_of(g1);
          g2t.read_token_ids = true;
          rt.read_ids = true;
          rt.write_outputs = false;
          g2t.one_token_route = &rt;
          check_sm90(sm90_nvfp4_grouped_gemm(g2t, c, nullptr, device_sm_count()), "sm90 gemm2 token ids (warm-up)");
        }
      }
      if (routed && (c.warp_stream ? ws_gather_enabled_ : gemm1_gather_enabled_) &&
          sm90_gather_available(c)) {  // its gathered-A kernel (no rows)
        Sm90GemmArgs gg = g1;
        gg.a_gather_src = a1_;
        gg.a_gather_src_rows = 1;
        gg.a_gather_perm = perm_;
        gg.a_gather_top_k = static_cast<int>(spec_.top_k);
        gg.a_gather_perm_experts = static_cast<int>(spec_.num_experts);
        check_sm90(sm90_nvfp4_grouped_gemm(gg, c, nullptr, device_sm_count()), "sm90 gemm1 gathered (warm-up)");
      }
      Sm90GemmArgs g2 = g1;
      g2.a = routed ? act_ : sact_;
      g2.w = d->w2_sm90;
      g2.shape = routed ? routed_launch_shape(d->w2_shape) : d->w2_shape;
      g2.alpha1 = nullptr;
      g2.out = routed ? y_ : sy_;
      g2.epilogue = Sm90GemmEpilogue::kF32;
      check_sm90(sm90_nvfp4_grouped_gemm(g2, c, nullptr, device_sm_count()), "sm90 gemm2 (warm-up)");
      if (sm90_chained_available(c)) {
        g2.out = routed ? chain_y_ : chain_sy_;
        check_sm90(sm90_nvfp4_chained_gemms(g1, g2, c, routed ? chain_counters_ : shared_chain_counters_, nullptr,
                                            device_sm_count()),
                   "sm90 chained gemm1 + gemm2 (warm-up)");
      }
    }
  }
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (sm90 warm-up)");
}

PlanView CudaMoeLayer::plan_view() const {
  return PlanView{topk_ids_, topk_weights_, counts_, offsets_, perm_, inv_};
}

void CudaMoeLayer::begin_calibration() {
  DeviceGuard guard(options_.device);
  const size_t n = static_cast<size_t>(2 * (routed_.num_experts + shared_.num_experts));
  check_cuda(cudaMemset(calib_, 0, n * sizeof(float)), "cudaMemset (calibration)");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (begin_calibration)");
  calibrating_ = true;
}

void CudaMoeLayer::end_calibration() {
  NVFP4MOE_CHECK(calibrating_, ArgumentError, "end_calibration: no calibration in progress (call begin_calibration)");
  DeviceGuard guard(options_.device);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (end_calibration)");
  calibrating_ = false;
  // scale = amax / (6 * 448); an expert that saw no tokens takes the max of the others' amax (what the
  // exporter does); nothing seen at all keeps the checkpoint's scales.
  auto fix = [&](DeviceExperts& d) {
    const size_t e = static_cast<size_t>(d.num_experts);
    std::vector<float> a13(e), a2(e);
    check_cuda(cudaMemcpy(a13.data(), d.amax13, e * 4, cudaMemcpyDeviceToHost), "cudaMemcpy (amax)");
    check_cuda(cudaMemcpy(a2.data(), d.amax2, e * 4, cudaMemcpyDeviceToHost), "cudaMemcpy (amax)");
    auto apply = [&](std::vector<float>& amax, std::vector<float>& scale) {
      const float mx = *std::max_element(amax.begin(), amax.end());
      if (!(mx > 0.0f)) return;
      for (size_t x = 0; x < e; ++x) {
        const float a = (amax[x] > 0.0f && !options_.shared_max_input_scale) ? amax[x] : mx;
        scale[x] = a / fmt::kWeightScaleDenom;
      }
    };
    apply(a13, d.input_scale13);
    apply(a2, d.input_scale2);
    upload_factors(d);
  };
  fix(routed_);
  if (shared_.num_experts) fix(shared_);
  update_routed_uniform_gs13();
}

void CudaMoeLayer::forward(const TensorRef& hidden, const RoutingArgs& routing, const TensorRef& out,
                           void* stream_ptr) {
  validate_forward_args(spec_, options_, hidden, routing, out, DeviceType::CUDA);
  // What the kernels additionally assume (checked, so nothing bad is launched).
  auto contiguous = [](const TensorRef* t, const char* name) {
    if (!t) return;
    NVFP4MOE_CHECK(t->is_contiguous(), ArgumentError, name, ": the cuda backend needs a contiguous tensor, got ",
                   t->describe());
  };
  contiguous(&hidden, "hidden");
  contiguous(&out, "out");
  contiguous(routing.router_logits, "router_logits");
  contiguous(routing.topk_ids, "topk_ids");
  contiguous(routing.topk_weights, "topk_weights");
  auto aligned = [](const TensorRef& t, const char* name) {
    NVFP4MOE_CHECK(reinterpret_cast<uintptr_t>(t.data) % 16 == 0, ArgumentError, name,
                   ": expected a 16-byte aligned data pointer, got ", t.data);
  };
  aligned(hidden, "hidden");
  aligned(out, "out");
  NVFP4MOE_CHECK(hidden.device_id == options_.device && out.device_id == options_.device, ArgumentError,
                 "hidden/out: expected tensors on cuda:", options_.device, ", got ", hidden.describe(), " and ",
                 out.describe());

  const int T = static_cast<int>(hidden.dim(0));
  if (T == 0) return;  // nothing to compute: nothing is launched
  DeviceGuard guard(options_.device);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int E = static_cast<int>(spec_.num_experts), K = static_cast<int>(spec_.top_k);
  const int H = static_cast<int>(spec_.hidden);
  const int pairs = T * K;
  const bool a4 = options_.mode == Mode::W4A4;
  const bool f32_in = hidden.dtype == DType::F32;

  // 1. routing (with logits: launched together with the plan, fused into one kernel at decode)
  std::optional<RouteArgs> route;
  if (routing.router_logits) {
    route = route_args(static_cast<const float*>(routing.router_logits->data), T);
  } else {
    check_launch(launch_copy_topk(static_cast<const int32_t*>(routing.topk_ids->data),
                                  static_cast<const float*>(routing.topk_weights->data), pairs, E, topk_ids_,
                                  topk_weights_, stream),
                 "copy_topk");
  }

  // 2. plan (the shared expert's plan comes with it: expert E, or its own {0, T})
  const bool merged = shared_in_routed_;
  const PlanArgs pl = plan_args(T);
  // 3-5. gather(+quant) -> GEMM1(+act+quant) -> GEMM2, for the routed experts (with the shared one as expert E
  // when merged) and then the shared expert's own launches.
  // experts: of the launch (E, E + 1, or 1); max_rows: this forward's upper bound of its rows; capacity: the
  // rows the workspace holds (fixed at creation: the sm90 GEMM's TMA descriptor encodes it, so a captured graph
  // stays valid for any routing).
  auto gather_args = [&](const DeviceExperts& d, int experts, const int32_t* perm, const int32_t* offsets,
                         int max_rows, uint16_t* a1) {
    GatherArgs g;
    g.hidden = hidden.data;
    g.hidden_f32 = f32_in;
    g.tokens = T;
    g.hidden_size = H;
    g.top_k = K;
    g.experts = perm ? E : 1;
    g.perm = perm;
    g.topk_ids = topk_ids_;
    g.offsets = offsets;
    g.gs = a4 ? d.gs13 : nullptr;
    g.amax = calibrating_ ? d.amax13 : nullptr;
    g.gate_weight = perm ? nullptr : shared_gate_weight_;
    g.gate_out = (!perm && shared_gate_weight_) ? sgate_ : nullptr;
    g.out = a1;
    g.max_rows = max_rows;
    g.append_shared = perm && experts == E + 1;
    g.token_major = perm && T >= gather_token_major_min_tokens_;  // (host-known T; the same bits either way)
    g.inv = perm ? inv_ : nullptr;
    return g;
  };
  // With router logits the routed group's gather is launched with the routing and the plan (one launch at
  // decode, launch_route_plan_gather); with caller ids, by run_group after the plan. With GEMM1 gathering its A
  // itself (gemm1_gather_enabled_, a host decision on T and the shapes), no routed gather runs at all.
  const int routed_experts = E + (merged ? 1 : 0), routed_max_rows = pairs + (merged ? T : 0);
  const GatherArgs routed_gather = gather_args(routed_, routed_experts, perm_, offsets_, routed_max_rows, a1_);
  // GEMM1 broadcasting `hidden` (t1_broadcast_enabled_): at T = 1 every routed row (and the merged shared
  // expert's) is the token's hidden state; the warp-streaming GEMM1 reads it as row 0 for all of them.
  // w4a4 with one GEMM1 activation scale for every routed expert (routed_uniform_gs13_): a token's quantized row is
  // the same for all its experts, so the gather quantizes the T rows once (into a1_) and GEMM1 gathers those
  // through the permutation (gemm1_gathers with quantized_once): k times less quantization and rows written.
  // The routed group's two configs, decided once here (host-known T and shapes) for these choices and its launches.
  Sm90GemmConfig routed_c1{}, routed_c2{};
  if (gemm_ == GemmPath::kSm90Wgmma) {
    routed_c1 = pick_sm90(routed_launch_shape(routed_.w13_shape), routed_max_rows, routed_experts, true);
    routed_c2 = pick_sm90(routed_launch_shape(routed_.w2_shape), routed_max_rows, routed_experts, false);
  }
  bool gemm1_gathers = false;
  const bool quantized_once = a4 && routed_uniform_gs13_;
  const DecodeRouting decode = decode_routing(T, f32_in, route.has_value(), routed_c1, routed_c2);
  const bool gemm1_broadcasts = decode.gemm1_broadcasts;
  if (gemm_ == GemmPath::kSm90Wgmma && (!a4 || quantized_once) && !calibrating_) {
    if (routed_c1.warp_stream)  // decode: w4a16 only (a w4a4 row quantized once would need a launch of its own)
      gemm1_gathers = ws_gather_enabled_ && !gemm1_broadcasts && !decode.gemm1_routes_tokens && !a4 && !f32_in;
    else
      gemm1_gathers = gemm1_gather_enabled_ && sm90_gather_available(routed_c1) &&
                      !chained(routed_c1, routed_c2, T, routed_.gated) && (quantized_once || !f32_in) &&
                      !(route && fused_gather_enabled_ && route_plan_gather_fuses(*route, pl, routed_gather));
  }
  // T = 1 with logits: GEMM1 routes the token itself (one_token_route) and no routing launch runs. GEMM2's offsets
  // are then the previous launch's (not readable before its wait): it reads the k ids GEMM1 wrote (its config's
  // read_ids kernel; guessed before its wait, checked after it, Sm90OneTokenRoute::read_ids), or
  // (NVFP4MOE_T1_GEMM2_READS_IDS=0) waits and seeks the offsets.
  const bool gemm1_routes = decode.gemm1_routes, gemm2_reads_ids = decode.gemm2_reads_ids;
  const bool gemm2_guesses_ids = decode.gemm2_guesses_ids;
  Sm90OneTokenRoute gemm1_route{}, gemm2_route{};
  // (T = 1, or T = 2 .. 4 with gemm1_routes_tokens)
  if (gemm1_routes || decode.gemm1_routes_tokens) {  // no routing launch: GEMM1 writes the ids, weights and plan
    gemm1_route.route = *route;
    gemm1_route.plan = pl;
    gemm1_route.write_outputs = true;
    gemm2_route = gemm1_route;
    gemm2_route.write_outputs = false;
    gemm2_route.read_ids = true;  // (GEMM1's CTA 0 wrote them; read where decode.gemm2_reads_ids)
  } else if (route) {
    if (gemm1_gathers || gemm1_broadcasts) {
      check_launch(launch_route_plan(*route, pl, stream), "route + plan");
    } else if (fused_gather_enabled_) {
      check_launch(launch_route_plan_gather(*route, pl, routed_gather, stream), "route + plan + gather");
    } else {
      check_launch(launch_route_plan(*route, pl, stream), "route + plan");
      check_launch(launch_gather(routed_gather, stream), "gather (routed)");
    }
  } else {
    check_launch(launch_plan(pl, stream), "plan");
  }

  // Returns where GEMM2 wrote its f32 rows (y, or chain_y for a chained launch).
  auto run_group = [&](const DeviceExperts& d, int experts, const int32_t* perm, const int32_t* offsets,
                       const int32_t* tiles, int max_rows, int64_t capacity, uint16_t* a1, uint16_t* act, float* y,
                       float* chain_y, int32_t* chain_counters, const char* what) -> float* {
    const bool routed = what[0] == 'r';
    if (routed && gemm1_gathers && quantized_once) {
      // The T rows of hidden quantized once with the routed experts' one scale (gs13[0]) into a1_[0, T), and for
      // a merged shared expert once more with its own (gs13[E]) into a1_[T, 2T); GEMM1 gathers them.
      GatherArgs once = gather_args(d, 1, nullptr, offsets, T, a1);
      once.gate_weight = nullptr;  // (the Qwen2 shared gate belongs to the separate shared expert's gather)
      once.gate_out = nullptr;
      check_launch(launch_gather(once, stream), "gather (routed, quantized once per token)");
      if (merged) {
        once.gs = d.gs13 + E;
        once.out = a1 + static_cast<size_t>(T) * H;
        check_launch(launch_gather(once, stream), "gather (merged shared expert, quantized once per token)");
      }
    }
    // A separate shared expert's rows are hidden's own rows, which its gather would only copy when nothing is done
    // to them on the way (bf16 in, w4a16, no calibration amax, no Qwen2 gate): its GEMM1 then reads `hidden`
    // (a TMA descriptor over its T rows; the same operand values, so the same bits) and no gather runs.
    const bool reads_hidden = !routed && shared_reads_hidden_ && !a4 && !f32_in && !calibrating_ &&
                              shared_gate_weight_ == nullptr;
    const uint16_t* a_rows = reads_hidden ? static_cast<const uint16_t*>(hidden.data) : a1;
    if (!(routed && (route || gemm1_gathers || gemm1_broadcasts)) && !reads_hidden)
      check_launch(launch_gather(gather_args(d, experts, perm, offsets, max_rows, a1), stream),
                   routed ? "gather (routed)" : "gather (shared)");

    if (gemm_ == GemmPath::kSm90Wgmma) {
      const Sm90PreparedShape shape13 = routed ? routed_launch_shape(d.w13_shape) : d.w13_shape;
      const Sm90PreparedShape shape2 = routed ? routed_launch_shape(d.w2_shape) : d.w2_shape;
      Sm90GemmArgs s1;
      s1.a = a_rows;
      s1.a_rows_capacity = reads_hidden ? T : capacity;
      s1.w = d.w13_sm90;
      s1.shape = shape13;
      s1.offsets = offsets;
      s1.alpha0 = d.gated ? d.alpha13_gate : d.alpha13_up;
      s1.alpha1 = d.alpha13_up;
      // Calibration wants the amax of the unquantized activation: GEMM1 then writes plain bf16 and
      // launch_act_amax quantizes in place after measuring (the same bits as the fused epilogue).
      s1.gs = (a4 && !calibrating_) ? d.gs2 : nullptr;
      s1.out = act;
      s1.epilogue = d.gated ? Sm90GemmEpilogue::kSwiGLU : Sm90GemmEpilogue::kRelu2;
      if (routed && gemm1_broadcasts) {  // T = 1: every row is hidden[0]
        s1.a = static_cast<const uint16_t*>(hidden.data);
        s1.a_rows_capacity = 1;
        s1.a_broadcast_row = true;
        if (gemm1_routes) s1.one_token_route = &gemm1_route;
        if (decode.gemm1_quantizes_rows) s1.a_broadcast_quant_gs = d.gs13;  // w4a4: quantized per routed expert
      }
      if (routed && decode.gemm1_routes_tokens) {  // T = 2 .. 4: the T rows of hidden, each piece its expert's tokens
        s1.a = static_cast<const uint16_t*>(hidden.data);
        s1.a_rows_capacity = T;
        s1.a_routed_token_rows = true;
        s1.one_token_route = &gemm1_route;
        if (decode.gemm1_quantizes_rows) s1.a_routed_token_quant_gs = d.gs13;  // w4a4: quantized per routed expert
      }
      if (routed && gemm1_gathers) {  // row r = src[perm[r] / k], the merged shared expert's r - offsets[E]
        // src: hidden itself (w4a16), or its rows quantized once (w4a4 with one GEMM1 activation scale)
        s1.a_gather_src = quantized_once ? a1 : static_cast<const uint16_t*>(hidden.data);
        s1.a_gather_src_rows = quantized_once && merged ? 2 * T : T;
        s1.a_gather_shared_row_base = quantized_once && merged ? T : 0;
        s1.a_gather_perm = perm;
        s1.a_gather_top_k = K;
        s1.a_gather_perm_experts = E;
      }
      const Sm90GemmConfig c1 = routed ? routed_c1 : pick_sm90(shape13, max_rows, experts, true);
      const Sm90GemmConfig c2 = routed ? routed_c2 : pick_sm90(shape2, max_rows, experts, false);
      Sm90GemmArgs s2;
      s2.a = act;
      s2.a_rows_capacity = capacity;
      s2.w = d.w2_sm90;
      s2.shape = shape2;
      s2.offsets = offsets;
      s2.alpha0 = d.alpha2;
      s2.out = y;
      s2.epilogue = Sm90GemmEpilogue::kF32;
      // GEMM2's offsets are the plan's (two or more launches back: GEMM1, and act_amax when calibrating, ran
      // since); only its operand rows come from the previous kernel. NVFP4MOE_EARLY_GEMM2=0: off, for A/B.
      s2.prologue_before_pdl_wait = early_gemm2_enabled_;
      if (routed && decode.gemm1_routes_tokens) {  // the offsets are GEMM1's: seek after the wait, or read the ids
        s2.prologue_before_pdl_wait = false;
        if (gemm2_reads_ids) {
          s2.one_token_route = &gemm2_route;
          s2.read_token_ids = true;
          s2.prologue_before_pdl_wait = gemm2_guesses_ids;
        }
      }
      if (routed && gemm1_routes) {  // the offsets are GEMM1's (the previous launch): seek only after the wait
        s2.prologue_before_pdl_wait = false;
        if (gemm2_reads_ids) {  // or read GEMM1's ids instead: guessed before the wait, checked after it
          s2.one_token_route = &gemm2_route;
          s2.prologue_before_pdl_wait = gemm2_guesses_ids;
        }
      }
      // The dynamic tile schedule (same bits; the SMs end within about a tile of each other).
      if (dynamic_tiles_enabled_) {
        s1.tile_counter = tile_counters_ + (routed ? 0 : 2);
        s2.tile_counter = tile_counters_ + (routed ? 1 : 3);
      }
      // The consumer stagger (same bits; the tile configs of 64 rows and more read it, the others ignore it).
      s1.consumer_stagger_ns = consumer_stagger_.gemm1;
      s2.consumer_stagger_ns = consumer_stagger_.gemm2;
      // The mixed last pass (same bits; the prefill tile configs with the SwiGLU and f32 epilogues take it).
      s1.mixed_last_pass = mixed_last_pass_;
      s2.mixed_last_pass = mixed_last_pass_;
      // Calibration measures GEMM1's output between the two GEMMs: never chained then.
      if (!calibrating_ && chained(c1, c2, T, d.gated)) {
        s2.out = chain_y;
        check_sm90(sm90_nvfp4_chained_gemms(s1, s2, c1, chain_counters, stream, device_sm_count()),
                   routed ? "sm90 chained gemm1 + gemm2 (routed)" : "sm90 chained gemm1 + gemm2 (shared)");
        return chain_y;
      }
      check_sm90(sm90_nvfp4_grouped_gemm(s1, c1, stream, device_sm_count()),
                 routed ? "sm90 gemm1 (routed)" : "sm90 gemm1 (shared)");
      if (calibrating_) {
        ActAmaxArgs am;
        am.act = act;
        am.cols = static_cast<int>(d.intermediate);
        am.experts = experts;
        am.offsets = offsets;
        am.amax = d.amax2;
        am.gs = a4 ? d.gs2 : nullptr;
        am.max_rows = max_rows;
        check_launch(launch_act_amax(am, stream), routed ? "act_amax (routed)" : "act_amax (shared)");
      }
      check_sm90(sm90_nvfp4_grouped_gemm(s2, c2, stream, device_sm_count()),
                 routed ? "sm90 gemm2 (routed)" : "sm90 gemm2 (shared)");
      return y;
    }

    const int max_m_tiles = static_cast<int>(gemm_max_m_tiles(max_rows, d.num_experts));
    GroupedGemmArgs g1;
    g1.a = a_rows;
    g1.w = d.w13;
    g1.w_scale = d.w13_scale;
    g1.experts = static_cast<int>(d.num_experts);
    g1.n = static_cast<int>(d.n1);
    g1.k = H;
    g1.offsets = offsets;
    g1.tile_offsets = tiles;
    g1.alpha0 = d.gated ? d.alpha13_gate : d.alpha13_up;
    g1.alpha1 = d.alpha13_up;
    g1.gs = a4 ? d.gs2 : nullptr;
    g1.amax = calibrating_ ? d.amax2 : nullptr;
    g1.out = act;
    g1.epilogue = d.gated ? GemmEpilogue::kSwiGLU : GemmEpilogue::kRelu2;
    const int n_tiles1 = d.gated ? static_cast<int>((d.intermediate + 31) / 32) : static_cast<int>((d.n1 + 63) / 64);
    g1.max_tiles = max_m_tiles * n_tiles1;
    check_launch(launch_grouped_gemm(g1, stream), routed ? "gemm1 (routed)" : "gemm1 (shared)");

    GroupedGemmArgs g2;
    g2.a = act;
    g2.w = d.w2;
    g2.w_scale = d.w2_scale;
    g2.experts = static_cast<int>(d.num_experts);
    g2.n = H;
    g2.k = static_cast<int>(d.intermediate);
    g2.offsets = offsets;
    g2.tile_offsets = tiles;
    g2.alpha0 = d.alpha2;
    g2.out = y;
    g2.epilogue = GemmEpilogue::kF32;
    g2.max_tiles = max_m_tiles * ((H + 63) / 64);
    check_launch(launch_grouped_gemm(g2, stream), routed ? "gemm2 (routed)" : "gemm2 (shared)");
    return y;
  };
  const int64_t max_t = options_.max_tokens;
  float* routed_y = y_;
  float* shared_y = sy_;
  routed_y = run_group(routed_, routed_experts, perm_, offsets_, tile_offsets_, routed_max_rows,
                       routed_rows_capacity(), a1_, act_, y_, chain_y_, chain_counters_,
                       merged ? "routed+shared" : "routed");
  if (!merged && shared_.num_experts)
    shared_y = run_group(shared_, 1, nullptr, shared_offsets_, shared_tile_offsets_, T, max_t, sa1_, sact_, sy_,
                         chain_sy_, shared_chain_counters_, "shared");

  // 6. combine
  CombineArgs c;
  c.y = routed_y;
  c.inv = inv_;
  c.topk_weights = topk_weights_;
  c.shared_y = shared_.num_experts ? (merged ? routed_y : shared_y) : nullptr;
  c.shared_row_base = merged ? offsets_ + E : nullptr;
  c.shared_gate = shared_gate_weight_ ? sgate_ : nullptr;
  c.tokens = T;
  c.hidden_size = H;
  c.top_k = K;
  c.out = out.data;
  c.out_bf16 = out.dtype == DType::BF16;
  check_launch(launch_combine(c, stream), "combine");
}

CudaMoeLayer::DecodeRouting CudaMoeLayer::decode_routing(int64_t T, bool f32_hidden, bool router_logits) const {
  if (gemm_ != GemmPath::kSm90Wgmma) return {};
  const int64_t experts = spec_.num_experts + (shared_in_routed_ ? 1 : 0);
  const int64_t max_rows = T * spec_.top_k + (shared_in_routed_ ? T : 0);
  return decode_routing(T, f32_hidden, router_logits,
                        pick_sm90(routed_launch_shape(routed_.w13_shape), max_rows, experts, true),
                        pick_sm90(routed_launch_shape(routed_.w2_shape), max_rows, experts, false));
}

CudaMoeLayer::DecodeRouting CudaMoeLayer::decode_routing(int64_t T, bool f32_hidden, bool router_logits,
                                                         const Sm90GemmConfig& c1, const Sm90GemmConfig& c2) const {
  DecodeRouting d;
  // T = 2 .. 4 (logits): GEMM1 routes the tokens itself and reads their rows of `hidden` (a_routed_token_rows;
  // w4a4: quantized per expert, a_routed_token_quant_gs) where its config has that kernel and the tokens fit it; no
  // routing launch and no gather.
  if (gemm_ == GemmPath::kSm90Wgmma && T >= 2 && T <= kSm90RoutedTokensMax && !f32_hidden && !calibrating_ &&
      router_logits && gemm1_routes_tokens_enabled_) {
    d.gemm1_routes_tokens = gemm1_token_rows_fit(c1, static_cast<int>(T));
    d.gemm1_quantizes_rows = d.gemm1_routes_tokens && options_.mode == Mode::W4A4;
    // GEMM2 then maps its pieces from GEMM1's T k ids (read_token_ids), guessed before its wait, as at T = 1
    // (every config with the kernel, the two-slice ws8_s4_w16_x2 included: its bitwise GPU test ran at 6ac16ea)
    d.gemm2_reads_ids = d.gemm1_routes_tokens && gemm2_reads_token_ids_ && sm90_token_rows_route_available(c2) &&
                        c2.blocks_per_warp == 2;
    d.gemm2_guesses_ids = d.gemm2_reads_ids && early_gemm2_enabled_ && gemm2_guesses_token_ids_;
    return d;
  }
  // w4a4: only GEMM1 routing the token quantizes the broadcast row per expert (with caller ids, or where its
  // kernel does not fit, the routing launch gathers the quantized rows: a w4a4 row is a function of the expert).
  const bool a4 = options_.mode == Mode::W4A4;
  if (gemm_ != GemmPath::kSm90Wgmma || T != 1 || (options_.mode != Mode::W4A16 && !a4) || f32_hidden ||
      calibrating_ || !t1_broadcast_enabled_ || (a4 && (!router_logits || !t1_quant_rows_fit(c1))))
    return d;
  const int E = static_cast<int>(spec_.num_experts), K = static_cast<int>(spec_.top_k);
  // (the row kept in shared memory: K up to sm90_broadcast_row_max_k, 50k+; past it the gather path)
  d.gemm1_broadcasts = c1.warp_stream && routed_.w13_shape.k <= sm90_broadcast_row_max_k(c1);
  const Sm90GemmEpilogue epi1 = routed_.gated ? Sm90GemmEpilogue::kSwiGLU : Sm90GemmEpilogue::kRelu2;
  d.gemm1_routes = d.gemm1_broadcasts && router_logits && t1_route_in_gemm_enabled_ &&
                   sm90_one_token_route_available(c1, epi1, true) && sm90_one_token_route_fits(c1, E, K);
  if (a4 && !d.gemm1_routes) return {};
  d.gemm1_quantizes_rows = a4;
  d.gemm2_reads_ids = d.gemm1_routes && t1_gemm2_reads_ids_ &&
                   sm90_one_token_route_available(c2, Sm90GemmEpilogue::kF32, false) &&
                   sm90_one_token_route_fits(c2, E, K);
  d.gemm2_guesses_ids = d.gemm2_reads_ids && early_gemm2_enabled_ && t1_gemm2_guesses_ids_;
  return d;
}

bool CudaMoeLayer::gemm1_token_rows_fit(const Sm90GemmConfig& c1, int T) const {
  const int E = static_cast<int>(spec_.num_experts), K = static_cast<int>(spec_.top_k);
  const int k = static_cast<int>(routed_.w13_shape.k);
  if (options_.mode == Mode::W4A16) return sm90_token_rows_route_fits(c1, T, E, K, k);
  // w4a4: not with a separate shared expert (nemotron-nano T = 4 measured +5.2 us against the gather path, H100,
  // bench/results/1c71133-w4a4-token-quant-ab-h100; its w4a16 token routing gained nothing there either)
  const bool separate_shared = shared_.num_experts > 0 && !shared_in_routed_;
  return options_.mode == Mode::W4A4 && gemm1_quantizes_token_rows_enabled_ &&
         (!separate_shared || gemm1_quantizes_token_rows_separate_shared_) &&
         sm90_token_rows_quant_fits(c1, T, E, K, k, routed_launch_shape(routed_.w13_shape).units, shared_in_routed_,
                                    device_sm_count());
}

bool CudaMoeLayer::t1_quant_rows_fit(const Sm90GemmConfig& c1) const {
  const int routed = static_cast<int>(spec_.top_k) + (shared_in_routed_ ? 1 : 0);
  return options_.mode == Mode::W4A4 && t1_w4a4_quant_rows_enabled_ && gemm_ == GemmPath::kSm90Wgmma &&
         c1.warp_stream && routed_.w13_shape.k <= sm90_broadcast_row_max_k(c1, true) &&
         sm90_broadcast_quant_rows_fit(c1, routed_launch_shape(routed_.w13_shape).units, routed, device_sm_count());
}

RouteArgs CudaMoeLayer::route_args(const float* logits, int T) const {
  RouteArgs r;
  r.kind = spec_.routing == Routing::SoftmaxTopK ? RouteKind::kSoftmax : RouteKind::kSigmoidGrouped;
  r.logits = logits;
  r.bias = spec_.has_router_bias ? router_bias_ : nullptr;
  r.tokens = T;
  r.experts = static_cast<int>(spec_.num_experts);
  r.top_k = static_cast<int>(spec_.top_k);
  r.renormalize = spec_.norm_topk_prob;
  r.n_group = static_cast<int>(spec_.n_group);
  r.topk_group = static_cast<int>(spec_.topk_group);
  r.scaling = spec_.routed_scaling_factor;
  r.warp_kept_groups = route_warp_kept_groups_;
  r.topk_ids = topk_ids_;
  r.topk_weights = topk_weights_;
  return r;
}

PlanArgs CudaMoeLayer::plan_args(int T) const {
  const bool merged = shared_in_routed_;
  PlanArgs pl;
  pl.topk_ids = topk_ids_;
  pl.tokens = T;
  pl.top_k = static_cast<int>(spec_.top_k);
  pl.experts = static_cast<int>(spec_.num_experts);
  pl.chunk_counts = chunk_counts_;
  pl.counts = counts_;
  pl.offsets = offsets_;
  pl.tile_offsets = tile_offsets_;
  pl.perm = perm_;
  pl.inv = inv_;
  pl.shared_offsets = (shared_.num_experts && !merged) ? shared_offsets_ : nullptr;
  pl.shared_tile_offsets = (shared_.num_experts && !merged) ? shared_tile_offsets_ : nullptr;
  pl.append_shared = merged;
  return pl;
}

int64_t CudaMoeLayer::routed_rows_capacity() const {
  const int64_t t = options_.max_tokens;
  return std::max<int64_t>(1, t * spec_.top_k + (shared_in_routed_ ? t : 0));
}

Sm90GemmConfig CudaMoeLayer::pick_sm90(const Sm90PreparedShape& launch_shape, int64_t max_rows, int64_t experts,
                                       bool gemm1) const {
  // Host-known numbers only (T, k, E, shapes): never the routing, so a captured graph keeps its configs.
  // NVFP4MOE_SM90_CONFIG (read at creation) may fix either GEMM's config for an A/B measurement.
  if (gemm1 ? sm90_override_.gemm1_set : sm90_override_.gemm2_set)
    return gemm1 ? sm90_override_.gemm1 : sm90_override_.gemm2;
  // GEMM1 of w4a4 quantizes its output in the epilogue (not while calibrating: then it writes plain bf16).
  const bool quantized = gemm1 && options_.mode == Mode::W4A4 && !calibrating_;
  const Sm90GemmLoad load{max_rows, experts, launch_shape.units, device_sm_count(), quantized, launch_shape.k_tiles,
                          gemm1};
  Sm90GemmConfig c = warp_stream_enabled_ ? sm90_pick_config(load) : sm90_pick_tile_config(load);
  // The same tile with the other consumers' MMA, where listed (c unchanged otherwise).
  if (sm90_override_.mma_sync >= 0) sm90_gemm_mma_twin(c, sm90_override_.mma_sync == 1, &c);
  return c;
}

bool CudaMoeLayer::chained(const Sm90GemmConfig& c1, const Sm90GemmConfig& c2, int64_t T, bool gated) const {
  // Gated (SwiGLU) groups only: measured faster there (qwen3-30b T = 1 / 2, qwen3-235b T = 1: -0.3..-1.4 us) and
  // slower on the one non-gated model measured (nemotron-nano T = 1, relu^2, routed and shared groups chained:
  // +1.9 us; bench/results/4df64cb-chained-ab/).
  return chain_enabled_ && gated && T <= kChainMaxTokens && c1 == c2 &&
         sm90_chained_available(c1);
}

std::vector<CudaMoeLayer::Sm90Launch> CudaMoeLayer::sm90_launches(int64_t T) const {
  std::vector<Sm90Launch> out;
  if (gemm_ != GemmPath::kSm90Wgmma || T <= 0) return out;
  const int64_t pairs = T * spec_.top_k, E = routed_.num_experts;
  const char* routed = shared_in_routed_ ? "routed+shared" : "routed";
  const int64_t rows = pairs + (shared_in_routed_ ? T : 0), experts = E + (shared_in_routed_ ? 1 : 0);
  out.push_back({std::string("gemm1 ") + routed,
                 pick_sm90(routed_launch_shape(routed_.w13_shape), rows, experts, true)});
  out.push_back({std::string("gemm2 ") + routed,
                 pick_sm90(routed_launch_shape(routed_.w2_shape), rows, experts, false)});
  if (shared_.num_experts && !shared_in_routed_) {
    out.push_back({"gemm1 shared", pick_sm90(shared_.w13_shape, T, 1, true)});
    out.push_back({"gemm2 shared", pick_sm90(shared_.w2_shape, T, 1, false)});
  }
  for (size_t i = 0; i + 1 < out.size(); i += 2)
    out[i].chained = chained(out[i].config, out[i + 1].config, T, (i == 0 ? routed_ : shared_).gated);
  return out;
}

Sm90PreparedShape CudaMoeLayer::routed_launch_shape(const Sm90PreparedShape& routed) const {
  if (!shared_in_routed_) return routed;
  return sm90_prepared_shape(routed.num_experts + 1, routed.n, routed.k, routed.gated);
}

}  // namespace nvfp4moe::cuda
