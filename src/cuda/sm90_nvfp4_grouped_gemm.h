// Host API of the sm_90a NVFP4 grouped GEMM (device code: sm90_nvfp4_grouped_gemm.cuh). Launchers return
// cudaError_t (cudaErrorInvalidValue for bad arguments, with the reason in sm90_gemm_last_error_message());
// the runner turns them into nvfp4moe::Error at its boundary. Nothing here synchronizes, allocates, or reads
// device memory on the host: the launch never depends on the routing (offsets stay on the device).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/moe_kernels.h"

namespace nvfp4moe::cuda {

enum class Sm90GemmEpilogue : int {
  kF32 = 0,     // out f32 [rows, N] = alpha0[e] * acc (GEMM2, w2)
  kSwiGLU = 1,  // out bf16 [rows, N/2] = bf16(silu(alpha0[e] * gate) * (alpha1[e] * up)); w13 rows [gate; up]
  kRelu2 = 2,   // out bf16 [rows, N] = bf16(max(alpha0[e] * acc, 0)^2)  (non-gated GEMM1, up_proj only)
};

// Prepared-weight geometry. Layout (the contract; details in sm90_nvfp4_grouped_gemm.cuh):
//   uint8 [E][units][k_tiles][2][2304]; k_tiles = ceil(K / 64); units = ceil(I / 64) for gated (N = 2I,
//   unit u = gate rows [64u, 64u+64) + up rows [64u, 64u+64)), ceil(N / 128) otherwise (unit u = rows
//   [128u, 128u+128)). Each 2304-byte block = 64 rows x 64 k: 2048 bytes of codes in the wgmma register-A
//   fragment order, then 256 bytes of e4m3 block scales. Lossless: the checkpoint's code and scale bits,
//   reordered, zero-padded past N and K. Size = E * units * k_tiles * 4608 bytes (= the checkpoint's
//   E * N * (K/2 + K/16) when N (gated: N/2) and K are multiples of 128 (64) and 64; padding otherwise).
struct Sm90PreparedShape {
  int num_experts = 0, n = 0, k = 0;
  bool gated = false;
  int units = 0, k_tiles = 0;
  size_t bytes = 0;
};
Sm90PreparedShape sm90_prepared_shape(int num_experts, int n, int k, bool gated);

// Re-lays out packed [E][N][K/2] codes + [E][N][K/16] e4m3 scales (checkpoint layout, device pointers) into
// out (device, shape.bytes). gated: N = 2I with gate rows [0, I) and up rows [I, 2I). N % 16 == 0 (gated:
// I % 16 == 0), K % 16 == 0.
cudaError_t sm90_prepare_weights(const uint8_t* packed, const uint8_t* scales, const Sm90PreparedShape& shape,
                                 uint8_t* out, cudaStream_t stream);

// One tile configuration (the explicit list is sm90_gemm_configs()).
struct Sm90GemmConfig {
  int block_t;   // token rows per tile = wgmma N
  int stages;    // shared-memory pipeline depth
  int consumer_warpgroups;  // consumer warpgroups per CTA
  // 1: each warpgroup owns a weight unit (128 rows; consumer_warpgroups units per CTA tile); 2: a unit's two
  // 64-row blocks on two warpgroups (consumer_warpgroups / 2 units per tile), for launches with few units.
  int warpgroups_per_unit = 1;
  // The consumers' MMA: false = wgmma (warpgroup-wide, asynchronous), true = mma.sync m16n8k16 per warp on the
  // same registers (BT = 16 only; the same bits: sm90_nvfp4_grouped_gemm.cuh, KernelTraits).
  bool mma_sync = false;
  // The warp-streaming decode kernel (sm90_nvfp4_warp_stream_gemm.cuh) instead of the tile kernel: every warp
  // streams its own 32 weight rows over all of K for up to block_t = 8 token rows (cp.async ring of `stages`
  // k-tiles per warp, mma.sync), consumer_warpgroups * 4 warps per CTA, pieces spread evenly over the grid.
  // The same bits as the tile configs.
  bool warp_stream = false;
  // Warp streaming only: warp slices per piece (2, "_x2": two adjacent 32-row slices of a unit per warp, one
  // token tile for both), and the k-loop unrolled by the ring depth (one slice: "_u"; the x2 config is
  // unrolled, its name says nothing).
  int slices_per_warp = 1;
  bool ws_unrolled = false;
  // Warp streaming only: 64-row blocks a warp streams (2: both blocks of its slices; 1, "_b1": one, the piece's
  // two blocks on a warp pair whose second warp hands its accumulators to the first for the epilogue).
  int blocks_per_warp = 2;
  int units_per_tile() const { return consumer_warpgroups / warpgroups_per_unit; }
  bool operator==(const Sm90GemmConfig&) const = default;
};
const std::vector<Sm90GemmConfig>& sm90_gemm_configs();
std::string to_string(const Sm90GemmConfig& c);  // "bt16_s9_wg4", "bt16_s14_wg2_half" (2 warpgroups per unit),
                                                  // "bt16_s9_wg4_sync" (mma.sync consumers), "ws8_s6_w16"
                                                  // (warp streaming: 8 token rows, 6 k-tile slots, 16 warps)
// The listed config of that name (to_string's form), or false.
bool sm90_gemm_config_by_name(const std::string& name, Sm90GemmConfig* out);
// Whether config is listed for A/B measurements only (not yet measured: ws8_s5_w24_b1): sm90_pick_config never
// takes it, and a layer warms it up at creation only where NVFP4MOE_SM90_CONFIG names it (an unmeasured kernel then
// never stands in the default path's creation).
bool sm90_opt_in_config(const Sm90GemmConfig& config);
// The listed config with c's tile and the given consumers' MMA (mma.sync or wgmma), or false (no such twin).
bool sm90_gemm_mma_twin(const Sm90GemmConfig& c, bool mma_sync, Sm90GemmConfig* out);
// The load of one launch as the host knows it before the routing exists (never from the routing: the choice
// must not depend on data, and a captured graph keeps it).
struct Sm90GemmLoad {
  int64_t max_rows = 0;  // upper bound of the rows of this launch (T * top_k routed, T for the shared expert)
  int64_t experts = 1;   // E of the launch (1 for the shared expert)
  int units = 0;         // weight units of N (Sm90PreparedShape::units); 0 = unknown (list rule only)
  int num_sms = 0;       // SMs the persistent grid spans; 0 = unknown (list rule only)
  bool quantized_output = false;  // GEMM1 with the fused NVFP4 activation quantization (w4a4, gs != nullptr)
  int k_tiles = 0;                // K / 64 rounded up (Sm90PreparedShape::k_tiles); 0 = unknown
  bool activation = false;        // GEMM1 (the SwiGLU / relu^2 epilogue)
};
// Heuristic: the smallest token tile that holds max_rows / E rows; at that tile, with units and SMs known, the
// consumer-warpgroup count with the least estimated time (waves of CTA tiles x tile time: a 2-warpgroup tile
// when that stays within one wave, no second nearly empty wave); without them the most warpgroups (2 when
// fewer rows than experts). Then the consumers' MMA: the mma.sync twin of a bt16 tile with 3 or 4 consumer
// warpgroups where an expert tile holds at most 4 rows (measured faster there in the whole layer), else wgmma.
// Before all of that, with units and SMs known (decode, measured in the layer: docs/gemm.md): the
// warp-streaming config with two slices per piece, ws8_s4_w16_x2, at <= 4 rows per active expert when its
// pieces (active experts x units x 2) number >= 8 per SM; else at <= 2 rows per active expert ws8_s6_w16, its
// k-loop unrolled (ws8_s6_w16_u) when its pieces (x 4) number >= 8 per SM.
Sm90GemmConfig sm90_pick_config(const Sm90GemmLoad& load);
// The tile kernels' rule alone (what sm90_pick_config returns where it does not take the warp-streaming kernel).
// At prefill it takes bt144 over bt128 where that saves >= 15% of the expected weight passes per expert (not for
// a quantizing GEMM1: its epilogue at BT = 144 measured slower). A launch of one expert (the shared expert) has
// exactly max_rows rows, so the tail rules count its passes exactly.
Sm90GemmConfig sm90_pick_tile_config(const Sm90GemmLoad& load);
// The expected token tiles (weight passes) of an expert with Poisson(mean_rows) rows (normal approximation):
// E[ceil(r / block_t)] over r >= 1.
double sm90_expected_tile_passes(double mean_rows, int block_t);

// The routing of one token inside a warp-streaming GEMM launch (Sm90GemmArgs::one_token_route).
struct Sm90OneTokenRoute {
  // tokens 1 (or 0: nothing routed), or 2 .. kSm90RoutedTokensMax with Sm90GemmArgs::a_routed_token_rows (GEMM1)
  // or read_token_ids (GEMM2);
  // topk_ids / topk_weights written by CTA 0 with write_outputs
  RouteArgs route;
  PlanArgs plan;     // the plan's outputs (CTA 0 with write_outputs); experts, top_k and append_shared as route's
  // Routing (GEMM1, read_ids false): with write_outputs CTA 0 writes the routing's and the plan's outputs (without
  // it the launch routes for itself only).
  bool write_outputs = false;
  // GEMM2 after such a GEMM1: after its PDL wait every warp reads the k ids that launch wrote (route.topk_ids)
  // instead of seeking its pieces in the offsets; nothing is routed or written. With prologue_before_pdl_wait the
  // ids are read before the wait as a guess (GEMM1 writes them early; a GEMM2 CTA becomes resident only as GEMM1's
  // CTAs exit): each warp issues its first piece's weights before the wait and checks the ids after it, running
  // its pieces again from the first with the checked ids where any differs (the same result either way).
  bool read_ids = false;
  // Optional (tests): every warp whose guess was wrong adds 1 here (device int32; nullptr: not counted).
  int32_t* misspeculations = nullptr;
};

struct Sm90GemmArgs {
  const uint16_t* a = nullptr;     // bf16 bits [a_rows_capacity, K] row-major, rows in expert order
  int64_t a_rows_capacity = 0;     // rows allocated in a (>= offsets[E]); bounds the TMA reads
  const uint8_t* w = nullptr;      // prepared weights (sm90_prepare_weights)
  Sm90PreparedShape shape;         // geometry of w (E, N, K, gated)
  const int32_t* offsets = nullptr;  // [E + 1] device, non-decreasing, offsets[0] = 0, offsets[E] <= capacity
  const float* alpha0 = nullptr;   // [E] device: alpha (kF32, kRelu2) or gate alpha (kSwiGLU)
  const float* alpha1 = nullptr;   // [E] device: up alpha (kSwiGLU)
  const float* gs = nullptr;       // [E] device or nullptr: NVFP4-quantize the bf16 output (operand values)
  void* out = nullptr;             // f32 [capacity, N] (kF32) / bf16 [capacity, N or N/2]
  Sm90GemmEpilogue epilogue = Sm90GemmEpilogue::kF32;
  // The caller's promise that the offsets (and w, alpha0/1, gs) were complete before the previous launch of the
  // stream began, i.e. only `a` comes from the previous kernel (GEMM2 after GEMM1: the offsets are the plan's,
  // two or more launches back). The warp-streaming configs may then read them, seek their first piece and
  // start its weights before their PDL wait (the rolled k-loop); the other configs ignore it.
  bool prologue_before_pdl_wait = false;
  // Dynamic tile schedule of the tile configs: a device int32, zero before the first launch that uses it; each CTA
  // takes its first tile by its index and every further one from this counter (atomicAdd) as it finishes
  // issuing the previous one's loads, so the SMs finish within about one tile of each other however unequal the
  // tiles are (an expert's last token tile is partial; static round-robin gave some SMs 8-17% more cycles than
  // others at prefill). The launch's last claim resets it to zero, so consecutive launches and graph replays
  // need no memset; launches that may run at the same time need their own counters. Same bits as the static
  // schedule (a tile's result does not depend on the CTA that computes it). nullptr: static round-robin.
  // Ignored by the warp-streaming configs and by chained launches.
  int32_t* tile_counter = nullptr;
  // Consumer stagger of the tile configs of 64 rows and more (two consumer warpgroups of one unit each:
  // bt64_s10_wg2, bt128_s8_wg2, bt144_s8_wg2): the second warpgroup of every CTA starts about this
  // many nanoseconds after the first (one __nanosleep; PTX guarantees only a sleep in [0, 2 t]), so that the two
  // no longer reach their epilogues together (each epilogue then overlaps the other's k-loop; the stage ring caps
  // the lead). 0: together. In [0, kSm90MaxConsumerStaggerNs]; the same bits for every value. Ignored by the
  // other configs and by chained launches.
  int consumer_stagger_ns = 0;
  // The mixed last pass (the configs of sm90_mixed_last_pass_configs(), SwiGLU and f32 epilogues, plain launches
  // with `a`; ignored by every other launch): an expert whose last token tile has at most 32 rows runs its last two
  // token tiles as one tile a unit, the narrow tile's rows beside the full one's in the same stages, so that the
  // narrow pass's dequantization no longer runs alone (src/cuda/sm90_mixed_last_pass.h; docs/gemm.md). The same
  // bits as without.
  bool mixed_last_pass = false;
  // Gathered A (the configs of sm90_gather_configs() and the warp-streaming ones, with an activation epilogue,
  // plain launches): GEMM row r (expert order) reads row src(r) of a_gather_src [a_gather_src_rows, K] bf16
  // instead of row r of `a` (then unused, may be null):
  //   src(r) = a_gather_perm[r] / a_gather_top_k  for r < offsets[a_gather_perm_experts] (-1: num_experts),
  //            r - offsets[a_gather_perm_experts] + a_gather_shared_row_base
  //                                                 for the rows after (a shared expert's rows, one per token,
  //                                                 appended as the last expert),
  //            r                                    without a_gather_perm.
  // A source row outside [0, a_gather_src_rows), or a negative a_gather_perm entry, reads as zeros. The same bits
  // as `a` holding those rows. The layer's w4a16 GEMM1 then reads `hidden` through the plan's permutation and no
  // gather kernel runs: at prefill the producer's four warps copy each k-tile's rows with cp.async; at decode
  // (warp-streaming) each warp copies its own pieces' rows, looking up a piece's permutation entries during the
  // piece before (these kernels wait for the previous kernel first: prologue_before_pdl_wait is ignored).
  const uint16_t* a_gather_src = nullptr;
  int64_t a_gather_src_rows = 0;
  const int32_t* a_gather_perm = nullptr;
  int a_gather_top_k = 1;
  int a_gather_perm_experts = -1;
  int64_t a_gather_shared_row_base = 0;
  // Every GEMM row reads row 0 of `a` (the warp-streaming configs with an activation epilogue, plain launches;
  // a_rows_capacity >= 1): at T = 1 each routed row of GEMM1, and the merged shared expert's, is the token's hidden
  // state, so the layer passes `hidden` itself and no gather runs. The same bits as `a` holding copies of row 0.
  // The row is kept in the CTA's shared memory for the whole launch: shape.k <= sm90_broadcast_row_max_k(config).
  bool a_broadcast_row = false;
  // The T = 1 routing in the launch itself (nullptr: the offsets are the plan's, read from `offsets`). GEMM1
  // (a_broadcast_row; waits for the previous kernel first, prologue_before_pdl_wait must be false): every CTA
  // routes the token from its logits with the block routing (route_block: the same ids and weights, bit for bit,
  // as the routing launch), and with write_outputs CTA 0 writes the routing's ids and weights and the whole plan
  // (PlanArgs: counts, offsets, tile offsets, perm, inv, the shared expert's), exactly what the routing launch
  // writes, for the launches after it. GEMM2 (read_ids, f32 epilogue): after its wait every warp reads those k
  // ids, or with prologue_before_pdl_wait guesses them before it (Sm90OneTokenRoute::read_ids). Either way
  // each warp maps the launch's pieces to the experts from the k ids in registers (expert order: the one-token
  // plan's offsets, each chosen expert one row, the merged shared expert last): no routing launch, no seek in
  // the offsets. Only sm90_one_token_route_available configs; T = 1 (route.tokens == 1; 0: a launch that routes
  // nothing and runs no piece, the layer's warm-up).
  const Sm90OneTokenRoute* one_token_route = nullptr;
  // w4a4 at T = 1 (with a_broadcast_row and a routing one_token_route; nullptr: the raw row): [E (+ 1 with
  // plan.append_shared)] device activation global scales; each routed expert's row is the broadcast row
  // NVFP4-quantized with its own scale (the merged shared expert's at index E), as the layer's gather quantizes it
  // (16 columns a block, the exact bf16 operands e2m1 x e4m3), so no gather launch runs. Each CTA runs a contiguous
  // range of the pieces and quantizes the rows of its (at most two) experts into shared memory once: shape.k <=
  // sm90_broadcast_row_max_k(config, true) and sm90_broadcast_quant_rows_fit. The same bits as `a` holding the
  // gathered quantized rows.
  const float* a_broadcast_quant_gs = nullptr;
  // GEMM1 at 2 <= T <= kSm90RoutedTokensMax (w4a16) with a routing one_token_route of route.tokens = T: `a` holds
  // the T token rows ([T, K] bf16, a_rows_capacity >= T: the layer's `hidden` itself). Every CTA routes the T
  // tokens (route_block, as at T = 1: the same ids and weights as the routing launch), CTA 0 with write_outputs
  // also writes the ids, weights and the whole plan (plan_few_tokens_block: what plan_small_block writes), and
  // keeps the T rows in shared memory; a piece's token rows are the tokens routed to its expert, in token order
  // (the plan's rows of that expert), the merged shared expert's all T. So neither the routing launch nor the
  // gather runs. The same bits as `a` holding the gathered rows. Only sm90_token_rows_route_available configs,
  // where sm90_token_rows_route_fits.
  bool a_routed_token_rows = false;
  // w4a4 at 2 <= T <= kSm90RoutedTokensMax (with a_routed_token_rows; nullptr: the raw rows): [E (+ 1 with
  // plan.append_shared)] device activation global scales; the rows of the tokens routed to an expert are
  // NVFP4-quantized with its own scale (the merged shared expert's at index E, all T tokens), as the layer's gather
  // quantizes them, so neither the routing launch nor the gather runs. Each CTA runs a contiguous range of the
  // pieces and quantizes its (at most two) experts' token rows in shared memory (2 T rows):
  // sm90_token_rows_quant_fits. The same bits as `a` holding the gathered quantized rows.
  const float* a_routed_token_quant_gs = nullptr;
  // GEMM2 after such a GEMM1 (f32 epilogue, direct rows, with a one_token_route of read_ids and route.tokens = T, or
  // 0: nothing routed): its pieces from the T k ids that GEMM1 wrote, mapped in registers as at T = 1 (read after
  // the PDL wait, or with prologue_before_pdl_wait guessed before it and checked after it, a wrong guess rerunning
  // the warp's pieces), instead of seeking the offsets. Only sm90_token_rows_route_available configs.
  bool read_token_ids = false;
};
// The most tokens a GEMM1 with Sm90GemmArgs::a_routed_token_rows routes (and T x top_k <= 32: a lane a pair).
inline constexpr int kSm90RoutedTokensMax = 4;
// Whether config has the GEMM1 kernels with Sm90GemmArgs::a_routed_token_rows (the warp-streaming configs that
// T = 2 .. 4 picks: ws8_s6_w16, ws8_s6_w16_u, ws8_s4_w16_x2; SwiGLU and relu^2).
bool sm90_token_rows_route_available(const Sm90GemmConfig& config);
// Whether that kernel routes `tokens` tokens over `experts` experts, top_k each, with rows of k columns: 2 <=
// tokens <= kSm90RoutedTokensMax, tokens x top_k <= 32, a thread per (token, expert) (experts rounded up to
// warps) in its CTA, the routing's and the plan's scratch within its ring slots, and the T rows beside the rings
// (k <= sm90_resident_rows_max_k(config, tokens)).
bool sm90_token_rows_route_fits(const Sm90GemmConfig& config, int tokens, int experts, int top_k, int k);
// Whether the w4a4 kernel of that GEMM1 (Sm90GemmArgs::a_routed_token_quant_gs) fits: sm90_token_rows_route_fits,
// 2 T token rows beside the rings (quantized in place, and a second copy of a token routed to both of a CTA's
// experts: k <= sm90_resident_rows_max_k(config, 2 tokens)), and on
// num_sms CTAs each CTA's contiguous piece range within two experts for the most experts the tokens can reach
// (min(tokens x top_k, experts), + 1 with a merged shared expert: append_shared) of `units` weight units each.
bool sm90_token_rows_quant_fits(const Sm90GemmConfig& config, int tokens, int experts, int top_k, int k, int units,
                                bool append_shared, int num_sms);
// The longest K of which a warp-streaming config keeps `rows` resident rows in shared memory beside its rings
// (sm90_broadcast_row_max_k is rows 1, or 3 with quantized_rows); 0 for a tile config.
int sm90_resident_rows_max_k(const Sm90GemmConfig& config, int rows);
// Whether config has the kernel with Sm90GemmArgs::one_token_route for this epilogue and rows: the activation
// epilogues with a broadcast row (GEMM1 at T = 1, routing) and the f32 epilogue with direct rows (GEMM2, read_ids),
// for the warp-streaming configs that T = 1 picks (ws8_s6_w16, ws8_s6_w16_u, and ws8_s6_w16_b1 for GEMM1).
bool sm90_one_token_route_available(const Sm90GemmConfig& config, Sm90GemmEpilogue epilogue, bool broadcast_row);
// Whether that kernel can route `experts` experts, top_k of them: a thread per expert (rounded up to warps) in
// its CTA, and the routing's scratch within its ring slots (512 experts and more do not fit ws8's 16 warps).
bool sm90_one_token_route_fits(const Sm90GemmConfig& config, int experts, int top_k);
// The longest row (K) a config's broadcast-row kernel keeps in shared memory beside its weight rings (0: a tile
// config, which has none). 50k+ for every warp-streaming config; a longer K needs the rows in `a`. quantized_rows:
// the kernel of Sm90GemmArgs::a_broadcast_quant_gs, which keeps the raw row and two quantized ones (20k+).
int sm90_broadcast_row_max_k(const Sm90GemmConfig& config, bool quantized_rows = false);
// Whether a routed GEMM1 with Sm90GemmArgs::a_broadcast_quant_gs on num_sms CTAs finds each CTA's pieces within two
// experts: up to routed_experts (top_k, + 1 with a merged shared expert) experts of `units` weight units
// (Sm90PreparedShape::units) each, the pieces split into num_sms contiguous ranges. Also false where config has
// no such kernel (the routed broadcast-row configs: sm90_one_token_route_available).
bool sm90_broadcast_quant_rows_fit(const Sm90GemmConfig& config, int units, int routed_experts, int num_sms);
inline constexpr int kSm90MaxConsumerStaggerNs = 1000000;  // 1 ms: PTX nanosleep's longest sleep

// Launches the persistent grouped GEMM with config (one of sm90_gemm_configs()). Rows of out past offsets[E]
// are not written. num_sms <= 0: the device's multiprocessor count.
cudaError_t sm90_nvfp4_grouped_gemm(const Sm90GemmArgs& args, const Sm90GemmConfig& config, cudaStream_t stream,
                                    int num_sms = 0);

// GEMM1 and GEMM2 of one expert group in ONE persistent launch (a chain): gemm1 with an activation epilogue
// (kSwiGLU / kRelu2), gemm2 kF32 on the same experts and offsets, reading gemm1's output (gemm2.a ==
// gemm1.out, gemm2's K = gemm1's output columns). Each CTA runs its GEMM1 tiles, then its GEMM2 tiles; a GEMM2
// tile's weights stream in at once and its activation loads wait until every GEMM1 tile of its expert has been
// stored (per-expert counters in device memory, release / acquire). Same bits as the two launches.
// chain_counters: int32 [sm90_chain_counter_count(E)] in device memory, zero before the first launch (e.g.
// cudaMemset once at allocation); every launch that completes leaves them zero, so nothing resets them per
// forward (graph-safe). One buffer per chain that may be in flight.
// The grid (num_sms) must fit on the device at once (one CTA per SM; a GEMM2 tile waits for GEMM1 tiles of
// other CTAs): the launcher refuses a grid larger than the occupancy allows; under MPS limits on the SMs a
// client sees, pass its SM count. The launcher checks the grid against an otherwise idle device only: kernels
// of other streams that hold SMs until something after this launch happens (a persistent communication kernel,
// a second chained launch) can keep some of its CTAs from ever starting while the started ones wait for their
// tiles, a deadlock. Run a chain where it has the SMs of its grid to itself (the layer launches every kernel of
// a forward on one stream); two chains must not overlap.
// Only the configs of sm90_chained_configs() have a chained kernel (decode tiles, where the second launch's
// fixed costs matter).
const std::vector<Sm90GemmConfig>& sm90_chained_configs();
bool sm90_chained_available(const Sm90GemmConfig& config);
inline size_t sm90_chain_counter_count(int num_experts) { return 2 * static_cast<size_t>(num_experts > 0 ? num_experts : 0); }
cudaError_t sm90_nvfp4_chained_gemms(const Sm90GemmArgs& gemm1, const Sm90GemmArgs& gemm2,
                                     const Sm90GemmConfig& config, int32_t* chain_counters, cudaStream_t stream,
                                     int num_sms = 0);

// The tile configs with a gathered-A kernel (Sm90GemmArgs::a_gather_src; SwiGLU and relu^2 epilogues): the
// prefill tiles, for GEMM1 of the layer's w4a16 prefill. sm90_gather_available: those and every warp-streaming
// config (decode).
const std::vector<Sm90GemmConfig>& sm90_gather_configs();
bool sm90_gather_available(const Sm90GemmConfig& config);

// The tile configs with a mixed-last-pass kernel (Sm90GemmArgs::mixed_last_pass; SwiGLU and f32 epilogues): the
// prefill tiles. sm90_mixed_last_pass_available: whether a launch of config with that epilogue takes it.
const std::vector<Sm90GemmConfig>& sm90_mixed_last_pass_configs();
bool sm90_mixed_last_pass_available(const Sm90GemmConfig& config, Sm90GemmEpilogue epilogue);

const char* sm90_gemm_last_error_message();

}  // namespace nvfp4moe::cuda
