// Host API of the MoE layer's kernels (device code in the sm90_nvfp4_*.cuh / sm80_*.cuh headers, launchers in
// moe_kernels.cu). Every launcher returns cudaError_t (the launch's cudaGetLastError, or cudaErrorInvalidValue
// for a bad argument); the runner (cuda_layer.cpp) turns a failure into nvfp4moe::Error naming the launch.
// Nothing here synchronizes, allocates or reads device memory on the host: every count, offset and row range
// is read by the kernels from device memory, so the launches never depend on the routing (CUDA-graph safe).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace nvfp4moe::cuda {

// Tile height (token rows) of the grouped GEMM; the plan's per-expert tile offsets count tiles of this size.
inline constexpr int kGemmBlockM = 64;
// (token, slot) pairs per plan chunk: counts are per chunk, then scanned in a fixed order (deterministic).
inline constexpr int kPlanChunk = 256;
inline constexpr int kSmallPlanPairs = 512;  // T * k up to this: the one-block plan (one launch, not three)
inline constexpr int kMaxExperts = 1024;  // routing/plan keep one counter per expert in shared memory

inline int64_t plan_chunks(int64_t pairs) { return (pairs + kPlanChunk - 1) / kPlanChunk; }

// ---------------------------------------------------------------- routing
enum class RouteKind : int { kSoftmax = 0, kSigmoidGrouped = 1 };
struct RouteArgs {
  RouteKind kind = RouteKind::kSoftmax;
  const float* logits = nullptr;  // [T, E] f32
  const float* bias = nullptr;    // [E] or nullptr (sigmoid: e_score_correction_bias)
  int tokens = 0, experts = 0, top_k = 0;
  bool renormalize = true;
  int n_group = 1, topk_group = 1;
  float scaling = 1.0f;           // sigmoid: routed_scaling_factor
  // 1 < n_group <= 32: the kept groups by one warp (warp_kept_groups) in route_block and route_token instead of the
  // serial top-2 sums and then ranks (route_block) or argmax passes (route_token); the same groups. Opt-in (the
  // layer's NVFP4MOE_ROUTE_WARP_GROUPS=1) until its GPU tests and A/B have run.
  bool warp_kept_groups = false;
  int32_t* topk_ids = nullptr;    // [T, k] out
  float* topk_weights = nullptr;  // [T, k] out
};
cudaError_t launch_route(const RouteArgs& a, cudaStream_t stream);

// Caller-supplied ids/weights copied into the workspace; ids outside [0, E) (e.g. -1) become -1 (dropped).
cudaError_t launch_copy_topk(const int32_t* ids, const float* weights, int pairs, int experts, int32_t* ids_out,
                             float* weights_out, cudaStream_t stream);

// ---------------------------------------------------------------- plan
// Stable counting sort of the T*k (token, slot) pairs p = t*k + j into expert order. Outputs:
//   counts [E], offsets [E+1] (exclusive, int32), tile_offsets [E+1] (exclusive scan of ceil(count/kGemmBlockM)),
//   perm [offsets[E]] (row -> pair p, token order within an expert), inv [T*k] (pair -> row, -1 when masked),
//   shared_offsets [2] = {0, T}, shared_tile_offsets [2] = {0, ceil(T/kGemmBlockM)} (the shared expert's plan).
// chunk_counts: scratch [plan_chunks(T*k), E].
struct PlanArgs {
  const int32_t* topk_ids = nullptr;
  int tokens = 0, top_k = 0, experts = 0;
  int32_t* chunk_counts = nullptr;
  int32_t* counts = nullptr;
  int32_t* offsets = nullptr;
  int32_t* tile_offsets = nullptr;
  int32_t* perm = nullptr;
  int32_t* inv = nullptr;
  int32_t* shared_offsets = nullptr;       // may be nullptr (no shared expert)
  int32_t* shared_tile_offsets = nullptr;
  // The shared expert as expert E of the routed launch: offsets / tile_offsets get an entry E + 1 =
  // offsets[E] + T (its T rows follow the routed ones); both arrays then hold E + 2 entries.
  bool append_shared = false;
};
cudaError_t launch_plan(const PlanArgs& a, cudaStream_t stream);

// Routing then plan. At decode (T <= kFusedRoutePlanTokens, T * k <= kSmallPlanPairs, the route scratch of T
// warps in shared memory) both in one block of one launch: a warp per token routes, then the block plans (the
// same bits as launch_route + launch_plan, one launch instead of two); otherwise those two.
inline constexpr int kFusedRoutePlanTokens = 32;
// The whole block routes (kernels::route_block) only up to this T: its rank loop costs each of T * round_up(E, 32)
// threads E comparisons, while the warp routing's latency does not grow with T. Measured on the layer
// (bench/results/f03bbca-decode/5-switch-ab/, same call, NVFP4MOE_BLOCK_ROUTE=0 against the default):
// qwen3-30b T = 1 / 2 -3.9 / -3.4 us, T = 4 +0.9, T = 8 +4.6; deepseek-v3 T = 1 / 2 -4.5 / -0.8. Since then the
// block's ranks run in two stages (52e59d6: 8 + k E / 128 compare steps a thread instead of E / 4) and its softmax
// statistics beside them (e781b2b); with those, re-measured (docs/gemm.md, "The block routing up to T = 5"): T = 3 /
// 4 -2.6..-4.4 us at qwen3-30b, qwen3-235b, deepseek-v3; T = 5 -2.85 (qwen3-30b) / -0.85 (qwen3-235b); T = 6
// -2.2 / +0.65 and T = 8 +0.35 / -0.7: not taken. Those presets route top-8; with fewer slots the warp routing's
// argmax passes are short and T = 3..5 measured slower with the block (gpt-oss-120b, top-4: +1.15..2.0 us) or
// even (nemotron-nano, top-6: -0.4..+0.85): past kBlockRouteAnyTopKTokens the block routes top-k >= 8 only.
inline constexpr int kBlockRouteMaxTokens = 5;
inline constexpr int kBlockRouteAnyTopKTokens = 2;
inline constexpr int kBlockRouteMinTopK = 8;
// The T up to which the block routes top-k >= kBlockRouteMinTopK: kBlockRouteMaxTokens, or
// NVFP4MOE_BLOCK_ROUTE_MAX_TOKENS (a decimal integer in [0, kFusedRoutePlanTokens], for A/B measurements; read once;
// another value throws ArgumentError naming it, at the CUDA layer's creation, which reads it first). The same ids
// and weights either way.
int block_route_max_tokens();
// That setting's value parsed ("" = kBlockRouteMaxTokens); anything else than parse_env_decimal accepts in the
// range: ArgumentError naming the variable, the range and the value.
int parse_block_route_max_tokens(const std::string& value);
cudaError_t launch_route_plan(const RouteArgs& r, const PlanArgs& a, cudaStream_t stream);

// ---------------------------------------------------------------- quantize + gather (GEMM1 operand rows)
// Row r of out (r < offsets[E], read on the device) = hidden[token(r)] where token(r) = perm[r] / k
// (perm == nullptr: the identity over T tokens, the shared expert; append_shared: both in one launch).
// w4a4 (gs != nullptr): NVFP4-quantized with gs[expert(r)] and written as the exact bf16 operand e2m1 * sf
// (the 1/gs factor is applied by the GEMM's alpha). amax (calibration, may be nullptr): atomicMax of |x| per
// expert on the float bits (order-free).
// gate_weight/gate_out (shared expert of Qwen2-MoE style, may be nullptr): gate_out[t] = sigmoid(x . gate_w).
struct GatherArgs {
  const void* hidden = nullptr;      // [T, H] BF16 or F32 (rounded to bf16 first)
  bool hidden_f32 = false;
  int tokens = 0, hidden_size = 0, top_k = 1, experts = 1;
  const int32_t* perm = nullptr;     // [rows] or nullptr
  const int32_t* topk_ids = nullptr; // [T*k] (expert of pair p); unused when perm == nullptr (expert 0)
  const int32_t* offsets = nullptr;  // [E+1]: rows = offsets[E]
  const float* gs = nullptr;         // [E] 1/input_scale, or nullptr (w4a16)
  float* amax = nullptr;             // [E] or nullptr
  const uint16_t* gate_weight = nullptr;  // [H] bf16 bits
  float* gate_out = nullptr;         // [T]
  uint16_t* out = nullptr;           // [rows, H] bf16 bits
  int max_rows = 0;                  // upper bound of rows (T*k (+ T) or T): sizes the fixed grid
  // With perm: T more rows after the routed ones, rows offsets[E] + t = hidden[t] with the factors of expert
  // index E (gs[E], amax[E]): the shared expert as expert E of the routed launch.
  bool append_shared = false;
  // With perm: a warp per (token, 512 columns) loads the chunk once and writes it to the token's rows inv[t*k + j]
  // (and offsets[E] + t with append_shared), instead of a warp per (row, 512 columns) loading its token's chunk
  // (k loads of each chunk, from HBM once hidden outgrows the L2). The same rows and bits; needs inv, no gate_out.
  bool token_major = false;
  const int32_t* inv = nullptr;      // [T*k] pair -> row, -1 when masked (the plan's); token_major only
};
// The layer's routed gather is token-major from this many tokens on (CudaMoeLayer,
// NVFP4MOE_GATHER_TOKEN_MAJOR_MIN_TOKENS): from 1024, where hidden stops staying in the L2 between a token's k
// rows. Measured (bench/results/7888a8a-gather-ss-h100/): deepseek-v3 w4a4 T = 4096 / 16384 -1.6% / -1.4%, T = 1024
// -0.4%; w4a16 within the noise (its rows are bf16: the 1.9 GB written dominates the gather, not the re-reads).
inline constexpr int kGatherTokenMajorMinTokens = 1024;
cudaError_t launch_gather(const GatherArgs& a, cudaStream_t stream);

// Routing, plan and the routed gather (g: perm, ids and offsets of the plan a). At decode (launch_route_plan's
// one-block conditions, no shared gate in g, its rows at a warp per 512 columns in <= 16 blocks of the routing's
// threads) one launch, each block routing and planning redundantly in shared memory and gathering its share of
// the rows; otherwise launch_route_plan then launch_gather. The same ids, weights, plan and rows either way; the
// gather is launched in both cases.
cudaError_t launch_route_plan_gather(const RouteArgs& r, const PlanArgs& a, const GatherArgs& g, cudaStream_t stream);
// Whether launch_route_plan_gather(r, a, g) takes the one-launch form (host-known arguments only).
bool route_plan_gather_fuses(const RouteArgs& r, const PlanArgs& a, const GatherArgs& g);

// ---------------------------------------------------------------- grouped GEMM (tensor cores)
// out rows [offsets[e], offsets[e+1]) = epilogue(A rows x W[e]^T) for every expert e, with W[e] the checkpoint's
// packed e2m1 codes [N, K/2] and e4m3 block scales [N, K/16] dequantized exactly to bf16 in the kernel.
// The same call shape as the sm90 wgmma GEMM (sm90_nvfp4_grouped_gemm.h), so either can serve a step.
enum class GemmEpilogue : int {
  kF32 = 0,     // out f32 [rows, N] = alpha0[e] * acc                                     (GEMM2)
  kSwiGLU = 1,  // out bf16 [rows, I] = op(bf16(silu(alpha0[e]*gate) * alpha1[e]*up)), N = 2I (GEMM1, gated)
  kRelu2 = 2,   // out bf16 [rows, N] = op(bf16(max(alpha0[e]*acc, 0)^2))                  (GEMM1, non-gated)
};
struct GroupedGemmArgs {
  const uint16_t* a = nullptr;        // bf16 bits [rows, K], rows in expert order
  const uint8_t* w = nullptr;         // [E, N, K/2] e2m1 codes (element 2i in the low nibble)
  const uint8_t* w_scale = nullptr;   // [E, N, K/16] e4m3
  int experts = 0, n = 0, k = 0;      // N: weight rows (2I when gated), K: reduction
  const int32_t* offsets = nullptr;       // [E+1] device
  const int32_t* tile_offsets = nullptr;  // [E+1] device, exclusive scan of ceil(rows_e / kGemmBlockM)
  const float* alpha0 = nullptr;      // [E]
  const float* alpha1 = nullptr;      // [E] (kSwiGLU: up)
  const float* gs = nullptr;          // [E] or nullptr: (kSwiGLU/kRelu2) NVFP4-quantize the output with gs[e]
  float* amax = nullptr;              // [E] or nullptr: calibration amax of the (bf16) activation output
  void* out = nullptr;
  GemmEpilogue epilogue = GemmEpilogue::kF32;
  int max_tiles = 0;                  // upper bound of tile_offsets[E] * n_tiles: sizes the fixed grid
};
cudaError_t launch_grouped_gemm(const GroupedGemmArgs& a, cudaStream_t stream);
// Upper bound of the M tiles of a grouped GEMM over `rows` rows split over `experts` ranges.
inline int64_t gemm_max_m_tiles(int64_t rows, int64_t experts) {
  return (rows + kGemmBlockM - 1) / kGemmBlockM + (rows < experts ? rows : experts);
}

// ---------------------------------------------------------------- calibration amax of the GEMM2 operand
// For a GEMM1 without an amax epilogue (the sm90 wgmma GEMM). Rows r < offsets[E] (read on the device) of act
// [rows, cols] bf16 bits; the expert of row r is the e with offsets[e] <= r < offsets[e+1] (binary search, so
// empty experts are fine): amax[e] = max(amax[e], max_c |act[r][c]|) by atomicMax on the float bits
// (non-negative floats order like their bits: exact and order-free, hence deterministic).
// gs != nullptr (w4a4): then the row is NVFP4-quantized IN PLACE with gs[e] into the exact bf16 operand e2m1*sf,
// i.e. what GEMM1's fused epilogue writes outside calibration; the runner launches GEMM1 without quantization
// while calibrating so that the amax is the one of the unquantized activation (what the CPU reference records).
// Only launched between begin_calibration and end_calibration.
struct ActAmaxArgs {
  uint16_t* act = nullptr;           // [rows, cols] bf16 bits
  int cols = 0;                      // % 16 == 0
  int experts = 0;
  const int32_t* offsets = nullptr;  // [E+1] device
  float* amax = nullptr;             // [E] device
  const float* gs = nullptr;         // [E] device or nullptr (no quantization)
  int max_rows = 0;                  // upper bound of rows (T*k or T): sizes the fixed grid
};
cudaError_t launch_act_amax(const ActAmaxArgs& a, cudaStream_t stream);

// ---------------------------------------------------------------- combine
// out[t] = sum_{j < k} w[t,j] * y[inv[t*k+j]] (in slot order, masked slots skipped)
//          + (shared_y ? (shared_gate ? shared_gate[t] : 1) * shared_y[base + t] : 0), f32 or bf16.
struct CombineArgs {
  const float* y = nullptr;            // [rows, H]
  const int32_t* inv = nullptr;        // [T*k]
  const float* topk_weights = nullptr; // [T*k]
  const float* shared_y = nullptr;     // [T, H] or nullptr (rows from *shared_row_base on)
  const int32_t* shared_row_base = nullptr;  // device int or nullptr (0): the shared expert as expert E of the
                                             // routed launch has its rows at offsets[E]
  const float* shared_gate = nullptr;  // [T] or nullptr
  int tokens = 0, hidden_size = 0, top_k = 0;
  void* out = nullptr;
  bool out_bf16 = false;
};
// inv, topk_weights, shared_gate and shared_row_base must have been complete before the previous kernel of the
// stream passed its own PDL wait (written two or more launches back: the layer's plan and gathers, with the GEMMs
// since; launch_pdl.cuh): the kernel reads them before its PDL wait; y after it.
cudaError_t launch_combine(const CombineArgs& a, cudaStream_t stream);

// An on/off switch of the forward's launches (A/B measurements), read once by its caller: unset, empty or
// anything but "0" on, "0" off.
bool env_switch(const char* name);
// An opt-in switch (measured slower or not yet measured): on only when set to "1".
bool env_opt_in(const char* name);
// The environment settings' integers: decimal digits only (no sign, space or base prefix), within [lo, hi].
bool parse_env_decimal(const std::string& t, long long lo, long long hi, long long* out);

// Device SM count (cached per device), used to size the persistent grids.
int device_sm_count();

}  // namespace nvfp4moe::cuda
