// The cuda backend's MoeLayer: one packed device copy of the weights, a workspace sized at creation for
// max_tokens, and a forward() that only enqueues kernels (no host sync, allocation or data-dependent host
// decision: capturable in a CUDA graph). Declared here (not only in the .cpp) so the GPU tests can read the
// plan, poison the workspace and pick the grouped GEMM.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/sm90_nvfp4_grouped_gemm.h"
#include "nvfp4moe/moe.h"

namespace nvfp4moe::cuda {

// Which grouped GEMM serves GEMM1 and GEMM2. Chosen once at creation; only that GEMM's weight layout is kept on
// the device. The mma.sync kernel stays as the A/B baseline and the fallback.
enum class GemmPath : int {
  kSm90Wgmma = 0,  // sm90_nvfp4_grouped_gemm (TMA + wgmma), weights in its prepared layout (the default)
  kMmaSync = 1,    // sm80_nvfp4_grouped_gemm_mma.cuh, weights in the checkpoint layout
};
const char* gemm_path_name(GemmPath p);  // "sm90_wgmma" / "mma_sync"
// The environment's choice: NVFP4MOE_GEMM unset or empty or "sm90_wgmma" (also "sm90", "wgmma") -> kSm90Wgmma;
// "mma_sync" (also "mma") -> kMmaSync; anything else -> ArgumentError naming the accepted values.
GemmPath gemm_path_from_env();

// A fixed sm90 tile config instead of sm90_pick_config's, for A/B measurements of the heuristic on one binary
// (every config is bit-identical, so only the speed changes). NVFP4MOE_SM90_CONFIG: empty / unset = the
// heuristic; "bt16_s9_wg4" = that config for GEMM1 and GEMM2; "gemm1=bt16_s14_wg3,gemm2=bt16_s9_wg4" = per GEMM
// (either may be left out); "mma=sync" / "mma=wgmma" (alone or as one more item) = the heuristic's tile with its
// consumers' MMA switched where the list has that twin (bt16), for the GEMMs not fixed by name. Anything else:
// ArgumentError naming the accepted names. Read at layer creation.
struct Sm90ConfigOverride {
  bool gemm1_set = false, gemm2_set = false;
  Sm90GemmConfig gemm1{}, gemm2{};
  int mma_sync = -1;  // -1: the heuristic's choice; 0: wgmma; 1: mma.sync consumers (where listed)
};
Sm90ConfigOverride parse_sm90_config_override(const std::string& value);
Sm90ConfigOverride sm90_config_override_from_env();

// The consumer stagger of the tile GEMMs (Sm90GemmArgs::consumer_stagger_ns), for A/B measurements:
// NVFP4MOE_CONSUMER_STAGGER_NS unset / empty = 0 for both GEMMs; "N" = N ns for GEMM1 and GEMM2;
// "N1,N2" = per GEMM. Each a decimal integer in [0, kSm90MaxConsumerStaggerNs]; anything else:
// ArgumentError naming the variable, the accepted form and the value. Read at layer creation.
struct ConsumerStagger {
  int gemm1 = 0, gemm2 = 0;
};
ConsumerStagger parse_consumer_stagger(const std::string& value);
ConsumerStagger consumer_stagger_from_env();

// From how many tokens on the routed gather is token-major (GatherArgs::token_major), for A/B measurements and
// tests: NVFP4MOE_GATHER_TOKEN_MAJOR_MIN_TOKENS unset / empty = kGatherTokenMajorMinTokens; "N" = from T >= N
// ("1": always, "2147483647": never), a decimal integer in [1, 2147483647]; anything else: ArgumentError naming the
// variable, the accepted form and the value. Read at layer creation. Either order gives the same bits.
int parse_gather_token_major_min_tokens(const std::string& value);
int gather_token_major_min_tokens_from_env();

// Device staging for the sm90 upload: checkpoint-layout bytes of a chunk of experts go here, then
// sm90_prepare_weights writes them into the final allocation. The chunk is as many experts as fit, at least one,
// so the staging is at most max(kSm90UploadStagingBytes, one expert's codes + scales of its largest tensor).
inline constexpr size_t kSm90UploadStagingBytes = size_t(64) << 20;

// One group of same-shaped experts (the routed ones, or the fused shared expert) on the device.
struct DeviceExperts {
  int64_t num_experts = 0, hidden = 0, intermediate = 0, n1 = 0;
  bool gated = true;
  // GemmPath::kMmaSync: the checkpoint layout, bytes unchanged (0.5625 B/param); null on the sm90 path.
  const uint8_t* w13 = nullptr;        // [E, N1, H/2]
  const uint8_t* w13_scale = nullptr;  // [E, N1, H/16]
  const uint8_t* w2 = nullptr;         // [E, H, I/2]
  const uint8_t* w2_scale = nullptr;   // [E, H, I/16]
  // GemmPath::kSm90Wgmma: the same bits in sm90_prepare_weights' layout (zero-padded to 128 rows / 64 k when the
  // dims are not multiples); null on the mma.sync path.
  const uint8_t* w13_sm90 = nullptr;   // [E][units][k_tiles][2][2304], gated = SwiGLU
  const uint8_t* w2_sm90 = nullptr;
  Sm90PreparedShape w13_shape, w2_shape;
  // Per-expert f32 factors the kernels read, [E] each (recomputed when calibration ends).
  float* alpha13_gate = nullptr;  // gate weight_scale_2 (* input_scale in w4a4)
  float* alpha13_up = nullptr;    // up weight_scale_2 (* input_scale in w4a4)
  float* alpha2 = nullptr;        // down weight_scale_2 (* input_scale in w4a4)
  float* gs13 = nullptr;          // 1 / input_scale of GEMM1 (w4a4)
  float* gs2 = nullptr;           // 1 / input_scale of GEMM2 (w4a4)
  float* amax13 = nullptr;        // calibration amax of GEMM1 / GEMM2 inputs
  float* amax2 = nullptr;
  // Host copies of the checkpoint's scalars.
  std::vector<float> gate_scale2, up_scale2, input_scale13, scale2, input_scale2;
};

struct LoadStats {
  size_t bytes = 0;       // packed bytes streamed host -> device
  double seconds = 0.0;   // upload wall time (allocation excluded)
  double gb_per_s = 0.0;
  size_t staging_bytes = 0;  // pinned staging buffer size (host memory beyond MoeWeights)
  size_t device_staging_bytes = 0;  // sm90 path: device scratch of the prepare step (freed after the upload)
};

// Device pointers of the plan of the last forward (valid after the stream has finished it).
struct PlanView {
  const int32_t* topk_ids = nullptr;     // [T, k]
  const float* topk_weights = nullptr;   // [T, k]
  const int32_t* counts = nullptr;       // [E]
  const int32_t* offsets = nullptr;      // [E + 1] ([E + 2] when shared_in_routed(): + the shared rows)
  const int32_t* perm = nullptr;         // [offsets[E]] row -> pair t*k + j
  const int32_t* inv = nullptr;          // [T*k] pair -> row, -1 masked
};

class CudaMoeLayer final : public MoeLayer {
 public:
  // The GEMM from gemm_path_from_env().
  CudaMoeLayer(MoeWeights weights, const MoeLayerOptions& options);
  CudaMoeLayer(MoeWeights weights, const MoeLayerOptions& options, GemmPath gemm);
  ~CudaMoeLayer() override;
  CudaMoeLayer(const CudaMoeLayer&) = delete;
  CudaMoeLayer& operator=(const CudaMoeLayer&) = delete;

  const MoeSpec& spec() const override { return spec_; }
  const MoeLayerOptions& options() const override { return options_; }
  void forward(const TensorRef& hidden, const RoutingArgs& routing, const TensorRef& out,
               void* stream = nullptr) override;
  size_t weight_bytes() const override { return weight_bytes_; }
  size_t workspace_bytes() const override { return workspace_bytes_; }
  void begin_calibration() override;
  void end_calibration() override;

  const LoadStats& load_stats() const { return load_stats_; }
  GemmPath gemm_path() const { return gemm_; }
  const char* gemm_name() const { return gemm_path_name(gemm_); }  // for logs: which GEMM produced a number
  PlanView plan_view() const;
  void* workspace() const { return workspace_; }  // [workspace_bytes()] (tests poison it)
  const DeviceExperts& routed() const { return routed_; }
  const DeviceExperts& shared() const { return shared_; }
  // True when the shared expert runs as expert E of the routed launches (sm90 path, same shape, not gated):
  // its weights, factors and calibration amax follow the routed ones, its rows are offsets[E]..offsets[E+1].
  bool shared_in_routed() const { return shared_in_routed_; }
  int gather_token_major_min_tokens() const { return gather_token_major_min_tokens_; }
  // The sm90 GEMM launches forward() makes at T tokens and the tile config of each, chosen exactly as forward()
  // chooses them (host numbers only; NVFP4MOE_SM90_CONFIG included). Empty on the mma.sync path and for T <= 0.
  struct Sm90Launch {
    std::string name;  // "gemm1 routed+shared", "gemm2 routed", "gemm1 shared", ...
    Sm90GemmConfig config;
    bool chained = false;  // this GEMM1 and the next GEMM2 run as one launch (sm90_nvfp4_chained_gemms)
  };
  std::vector<Sm90Launch> sm90_launches(int64_t T) const;
  // How forward() runs the routed group at decode (T tokens, w4a16 / w4a4, bf16 or f32 hidden, router logits or
  // caller ids), chosen exactly as forward() chooses: GEMM1 reads `hidden` as a broadcast row (T = 1), GEMM1
  // routes the token itself (Sm90GemmArgs::one_token_route, no routing launch), GEMM2 reads GEMM1's ids (guessing
  // them before its PDL wait).
  struct DecodeRouting {
    bool gemm1_broadcasts = false, gemm1_routes = false, gemm2_reads_ids = false;
    bool gemm2_guesses_ids = false;  // reads them before its PDL wait as a guess, checked after it
    // w4a4: the routing GEMM1 quantizes the broadcast row (T = 1, Sm90GemmArgs::a_broadcast_quant_gs) or the token
    // rows (T = 2 .. 4 with gemm1_routes_tokens, a_routed_token_quant_gs) per routed expert
    bool gemm1_quantizes_rows = false;
    // T = 2 .. kSm90RoutedTokensMax: GEMM1 routes the tokens and reads their rows of `hidden`
    // (Sm90GemmArgs::a_routed_token_rows; in w4a4 with gemm1_quantizes_rows, quantized per expert:
    // a_routed_token_quant_gs); GEMM2 then reads (guesses) GEMM1's T k ids where gemm2_reads_ids
    // (gemm2_guesses_ids), else seeks the offsets GEMM1 wrote after its wait
    bool gemm1_routes_tokens = false;
  };
  DecodeRouting decode_routing(int64_t T, bool f32_hidden, bool router_logits) const;

 private:
  void upload(MoeWeights& w);
  void upload_factors(DeviceExperts& d);
  void update_routed_uniform_gs13();
  void layout_workspace(bool allocate);
  void warm_up_sm90();
  // The routing's and the plan's arguments of a forward of T tokens (the workspace's outputs; logits: the router's).
  RouteArgs route_args(const float* logits, int T) const;
  PlanArgs plan_args(int T) const;
  // decode_routing with the routed group's two configs already picked (forward() has them).
  DecodeRouting decode_routing(int64_t T, bool f32_hidden, bool router_logits, const Sm90GemmConfig& c1,
                               const Sm90GemmConfig& c2) const;
  // w4a4 at T = 1: whether the routing GEMM1 (config c1) can quantize the broadcast row per routed expert (enabled,
  // its rows in shared memory, each CTA's pieces within two experts on this device's SMs).
  bool t1_quant_rows_fit(const Sm90GemmConfig& c1) const;
  // T = 2 .. 4: whether GEMM1 (config c1) can route T tokens and read their rows in this layer's mode (w4a16: the
  // raw rows, sm90_token_rows_route_fits; w4a4: quantized per expert where enabled and the layer has no separate
  // shared expert or NVFP4MOE_GEMM1_QUANTIZES_TOKEN_ROWS=1, sm90_token_rows_quant_fits).
  bool gemm1_token_rows_fit(const Sm90GemmConfig& c1, int T) const;
  // Rows the routed launches' operand buffers hold (the TMA descriptors' bound): max_tokens * k, plus
  // max_tokens when the shared expert is expert E.
  int64_t routed_rows_capacity() const;
  // The prepared shape the routed launches see: E experts, or E + 1 with the shared expert.
  Sm90PreparedShape routed_launch_shape(const Sm90PreparedShape& routed) const;
  // The tile config of one sm90 launch: the override if set for that GEMM, else sm90_pick_config.
  Sm90GemmConfig pick_sm90(const Sm90PreparedShape& launch_shape, int64_t max_rows, int64_t experts,
                           bool gemm1) const;
  // Whether a group's GEMM1 and GEMM2 (configs c1, c2; gated: SwiGLU) run as one chained launch at T tokens.
  bool chained(const Sm90GemmConfig& c1, const Sm90GemmConfig& c2, int64_t T, bool gated) const;

  GemmPath gemm_ = GemmPath::kSm90Wgmma;
  Sm90ConfigOverride sm90_override_;

  MoeSpec spec_;
  MoeLayerOptions options_;
  DeviceExperts routed_, shared_;
  bool shared_in_routed_ = false;
  uint8_t* weights_ = nullptr;  // one allocation: experts, router bias, shared gate, per-expert factors
  size_t weight_bytes_ = 0;
  const float* router_bias_ = nullptr;
  const uint16_t* shared_gate_weight_ = nullptr;
  float* calib_ = nullptr;  // calibration amax, its own allocation (not part of the forward workspace)
  bool calibrating_ = false;
  LoadStats load_stats_;

  // Workspace (one allocation, max_tokens rows).
  uint8_t* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int32_t* topk_ids_ = nullptr;
  float* topk_weights_ = nullptr;
  int32_t* chunk_counts_ = nullptr;
  int32_t* counts_ = nullptr;
  int32_t* offsets_ = nullptr;       // [E + 2]: entry E + 1 when the shared expert is expert E
  int32_t* tile_offsets_ = nullptr;  // [E + 2]
  int32_t* perm_ = nullptr;
  int32_t* inv_ = nullptr;
  int32_t* shared_offsets_ = nullptr;
  int32_t* shared_tile_offsets_ = nullptr;
  uint16_t* a1_ = nullptr;     // [T*k, H] bf16 GEMM1 operand rows (expert order)
  uint16_t* act_ = nullptr;    // [T*k, I] bf16 GEMM2 operand rows
  float* y_ = nullptr;         // [T*k, H] f32 GEMM2 output (aliases a1_: dead once GEMM1 is done)
  uint16_t* sa1_ = nullptr;    // shared expert: [T, H], [T, Is], [T, H] (y aliases a1)
  uint16_t* sact_ = nullptr;
  float* sy_ = nullptr;
  float* sgate_ = nullptr;     // [T] sigmoid(x . shared_gate_weight)

  // GEMM1 -> GEMM2 in one launch (sm90_nvfp4_chained_gemms) at T <= kChainMaxTokens, for gated (SwiGLU) groups
  // whose two GEMMs pick the same config with a chained kernel. GEMM2 then writes while other CTAs still run GEMM1,
  // so its f32 output cannot alias GEMM1's operand rows (y_ does): chain_y_ / chain_sy_ hold it.
  // chain_counters_: the per-expert counters, their own allocation (zeroed once; every launch leaves them
  // zero; not in the workspace, which callers may overwrite between forwards). NVFP4MOE_CHAINED_GEMMS=0: off.
  static constexpr int64_t kChainMaxTokens = 64;
  bool chain_enabled_ = true;
  // NVFP4MOE_WARP_STREAM=0 (read at creation): the tile rule (sm90_pick_tile_config) at decode as well, for A/B.
  bool warp_stream_enabled_ = true;
  // GEMM2 launched with prologue_before_pdl_wait (its seek and first weights during GEMM1's tail where the
  // config allows it). NVFP4MOE_EARLY_GEMM2=0 (read at creation): off, for A/B.
  bool early_gemm2_enabled_ = true;
  // The tile kernels' dynamic schedule (Sm90GemmArgs::tile_counter): one counter per GEMM launch of forward()
  // (routed GEMM1, GEMM2, shared GEMM1, GEMM2), in the counters' allocation. NVFP4MOE_DYNAMIC_TILES=0 (read at
  // creation): the static round-robin, for A/B.
  bool dynamic_tiles_enabled_ = true;
  // A separate shared expert's GEMM1 reads `hidden` itself where its gather would only copy it (w4a16, bf16 in,
  // not calibrating, no Qwen2 gate): one launch less a forward. NVFP4MOE_SHARED_HIDDEN=0 (read at creation): the
  // gather copies, for A/B and the bitwise test.
  bool shared_reads_hidden_ = true;
  // The routed gather is token-major at T >= this (gather_token_major_min_tokens_from_env, read at creation).
  int gather_token_major_min_tokens_ = kGatherTokenMajorMinTokens;
  // NVFP4MOE_GEMM1_GATHER=1 (read at creation; off by default until measured on the H200): w4a16 prefill without
  // the routed gather kernel, where GEMM1's config has a gathered-A kernel (sm90_gather_configs()) and is not
  // chained: GEMM1 reads `hidden` through the plan's permutation (Sm90GemmArgs::a_gather_src). Bf16 hidden only
  // (f32 is rounded by the gather), not w4a4 (quantized by it), not while calibrating (amax measured by it).
  bool gemm1_gather_enabled_ = false;
  // At T = 1 (w4a16, bf16 hidden, not calibrating) the routed GEMM1, a warp-streaming config, reads `hidden` as the
  // one row of all its rows (Sm90GemmArgs::a_broadcast_row) and the routing kernel skips its gather step: on the
  // H200 -1.5 us at qwen3-30b, -3.8 at deepseek-v3 (bench/results/55a99fa-ab). NVFP4MOE_T1_BROADCAST=0 (read at
  // creation): the gather copies the row, for A/B and the bitwise test.
  bool t1_broadcast_enabled_ = true;
  // At T = 1 with router logits and the broadcast-row GEMM1 (above), GEMM1 routes the token itself
  // (Sm90GemmArgs::one_token_route: every CTA runs the block routing, CTA 0 writes the ids, weights and plan) and
  // no routing launch runs. GEMM2 then waits for GEMM1 first (the offsets are GEMM1's now) and reads the k ids
  // GEMM1 wrote (read_ids) where its config has that kernel. H100, against the routing launch: -1.2..-2.9 us a
  // layer (bench/results/d2edde0-t1-gemm2-reads-ids-ab-h100). NVFP4MOE_T1_ROUTE_IN_GEMM=0 (read at creation): the
  // routing launch, for A/B and the bitwise test; NVFP4MOE_T1_GEMM2_READS_IDS=0: GEMM2 seeks the offsets
  // (0.15..0.5 us slower).
  bool t1_route_in_gemm_enabled_ = true;
  bool t1_gemm2_reads_ids_ = true;
  // The block routing's group selection by one warp (RouteArgs::warp_kept_groups): NVFP4MOE_ROUTE_WARP_GROUPS=1
  // (read at creation). Opt-in until its GPU tests and A/B have run (the same ids and weights either way).
  bool route_warp_kept_groups_ = false;
  bool mixed_last_pass_ = false;  // NVFP4MOE_SM90_MIXED_LAST_PASS=1 (Sm90GemmArgs::mixed_last_pass)
  // GEMM2 reading GEMM1's ids guesses them before its PDL wait (prologue_before_pdl_wait with read_ids: its first
  // piece's weights during GEMM1's tail; checked after the wait, the same bits either way).
  // NVFP4MOE_T1_GEMM2_GUESSES_IDS=0 (read at creation): reads them after the wait, for A/B and the bitwise test.
  bool t1_gemm2_guesses_ids_ = true;
  bool t1_w4a4_quant_rows_enabled_ = true;  // NVFP4MOE_T1_W4A4_QUANT_ROWS=0: w4a4 T = 1 gathers (routing launch)
  bool gemm1_routes_tokens_enabled_ = true;  // NVFP4MOE_GEMM1_ROUTES_TOKENS=0: T = 2 .. 4 route in their own launch
  // w4a4 at T = 2 .. 4: GEMM1 routes the tokens and quantizes their rows per expert (Sm90GemmArgs::
  // a_routed_token_quant_gs; not with a separate shared expert: gemm1_token_rows_fit). H100, against the routing
  // launch with the quantizing gather: −3.3..6.3 us a layer (bench/results/1c71133-w4a4-token-quant-ab-h100).
  // NVFP4MOE_GEMM1_QUANTIZES_TOKEN_ROWS=0 (read at creation): that gather path, for A/B and the bitwise test; "1":
  // also with a separate shared expert (gemm1_quantizes_token_rows_separate_shared_: A/B, tests).
  bool gemm1_quantizes_token_rows_enabled_ = true;
  bool gemm1_quantizes_token_rows_separate_shared_ = false;
  // After such a GEMM1, GEMM2 maps its pieces from GEMM1's T k ids (Sm90GemmArgs::read_token_ids), guessed before
  // its PDL wait (H100, against seeking the offsets after the wait: −1.1..4.3 us a layer in w4a16,
  // bench/results/1c71133-w4a4-token-quant-ab-h100); NVFP4MOE_GEMM2_READS_TOKEN_IDS=0 (read at creation): it
  // seeks; NVFP4MOE_GEMM2_GUESSES_TOKEN_IDS=0: reads the ids after the wait (A/B, bitwise tests).
  bool gemm2_reads_token_ids_ = true;
  bool gemm2_guesses_token_ids_ = true;
  // NVFP4MOE_WS_GATHER=1 (read at creation; measured slower on the H200, +1..9%, bench/results/1316906-ws-gather-ab,
  // so off): at decode (a warp-streaming GEMM1, T > 1; w4a16, bf16 hidden, not calibrating) GEMM1 reads `hidden`
  // through the plan's permutation (Sm90GemmArgs::a_gather_src) and no gather step runs (the fused routing kernel
  // skips it, the separate gather kernel is not launched).
  bool ws_gather_enabled_ = false;
  // At decode the routing, the plan and the routed gather are one launch where launch_route_plan_gather's
  // one-launch form applies (route_plan_gather_fuses); NVFP4MOE_FUSED_GATHER=0 (read at creation): the route +
  // plan launch and the gather kernel, for A/B and the bitwise test. Both GEMM paths.
  bool fused_gather_enabled_ = true;
  // Every routed expert has the same GEMM1 activation scale gs13 (update_routed_uniform_gs13: at creation and
  // after a calibration): in w4a4 with NVFP4MOE_GEMM1_GATHER=1 the gather then quantizes each token's row once
  // (and once more with a merged shared expert's own scale) and GEMM1 gathers it for all of the token's experts
  // (the same bits).
  bool routed_uniform_gs13_ = false;
  // NVFP4MOE_CONSUMER_STAGGER_NS (read at creation): the second consumer warpgroup's start delay in the
  // tile GEMMs of 64 rows and more (same bits; for A/B, default 0).
  ConsumerStagger consumer_stagger_;
  int32_t* chain_counters_ = nullptr;         // routed group [2 * (E + 1)], the shared expert's [2], 4 tile counters
  int32_t* shared_chain_counters_ = nullptr;
  int32_t* tile_counters_ = nullptr;          // [4]: routed GEMM1, routed GEMM2, shared GEMM1, shared GEMM2
  float* chain_y_ = nullptr;    // [min(max_tokens, kChainMaxTokens) * (k + 1 if merged), H]
  float* chain_sy_ = nullptr;   // [min(max_tokens, kChainMaxTokens), H] (separate shared expert)
};

}  // namespace nvfp4moe::cuda
