// Launchers of the sm_90a NVFP4 grouped GEMM and the explicit list of instantiated configurations.
#include "cuda/sm90_nvfp4_grouped_gemm.h"

#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

#include "cuda/sm90_nvfp4_grouped_gemm.cuh"
#include "cuda/sm90_nvfp4_warp_stream_gemm.cuh"

namespace nvfp4moe::cuda {
namespace {

thread_local std::string g_last_error;

cudaError_t fail(const std::string& msg) {
  g_last_error = msg;
  return cudaErrorInvalidValue;
}

// The one explicit list: X(block_t, stages, consumer warpgroups, warpgroups per unit, mma.sync consumers).
// Every entry is instantiated for every epilogue and tested; the heuristic (sm90_pick_config) picks among them.
#define NVFP4MOE_SM90_GEMM_CONFIGS(X) \
  X(16, 14, 2, 1, 0)  /* decode, 2 consumer warpgroups (the first version's decode tile; kept for comparison) */ \
  X(16, 9, 4, 1, 0)   /* decode: 1..16 rows per expert; 4 consumer warpgroups = more dequant/wgmma chains per SM */ \
  X(16, 14, 3, 1, 0)  /* decode: 3 consumer warpgroups (entry cap 128 registers, consumers 160: no spills) */      \
  X(16, 14, 2, 2, 0)  /* decode with few units: one unit per tile, its two blocks on two warpgroups */             \
  X(16, 14, 2, 1, 1)  /* the decode tiles with mma.sync consumers (per warp, N = 8 for <= 8 rows) */              \
  X(16, 9, 4, 1, 1)                                                                                                \
  X(16, 14, 3, 1, 1)                                                                                               \
  X(16, 14, 2, 2, 1)                                                                                               \
  X(32, 12, 2, 1, 0)  /* 17..32 rows per expert (4 warpgroups spill at BT = 32) */                                 \
  X(32, 12, 3, 1, 0)  /* 17..32 rows per expert, 3 consumer warpgroups */                                         \
  X(64, 10, 2, 1, 0)  /* 33..64 rows per expert */                                                              \
  X(128, 8, 2, 1, 0)  /* prefill: > 64 rows per expert, where bt144 would not save weight passes */           \
  X(144, 8, 2, 1, 0)  /* prefill: T k / E near 128 or 256 (128 +- 11 rows in one pass, 256 +- 16 in two) */

// The configs with a gathered-A kernel (Sm90GemmArgs::a_gather_src; the SwiGLU and relu^2 epilogues): the prefill
// tiles, where the layer's w4a16 GEMM1 reads `hidden` through the plan's permutation instead of a gathered copy.
#define NVFP4MOE_SM90_GATHER_CONFIGS(X) \
  X(64, 10, 2, 1, 0)                    \
  X(128, 8, 2, 1, 0)                    \
  X(144, 8, 2, 1, 0)

// The warp-streaming decode configs (sm90_nvfp4_warp_stream_gemm.cuh): X(warps per CTA, k-tile slots per warp,
// warp slices per piece, k-loop unrolled by the slots), each for every epilogue; shared memory = warps x slots x
// slot bytes (one CTA per SM). ws8_s6_w16: one 32-row slice per piece, the most pieces (T = 1), rolled k-loop;
// ws8_s6_w16_u: the same unrolled, where the pieces share the schedulers (deepseek-v3 T = 1: -3.4%);
// ws8_s4_w16_x2 (unrolled): two slices per piece sharing one token tile (fewer instructions per weight byte)
// where the pieces fill the grid's warps (T >= 4 on the large models: -4..-10% in the layer,
// bench/results/5c66c7a-ws-unroll-ab/). Measured and removed (docs/gemm.md):
// 12 warps x 8 slots (891b1bc), 20 x 5 and warp pairs (7b9bd1c), 8 x 12 and 4 x 24 (5c66c7a: 4 x 24 2-3x slower).
// Experiment 12 (58fd2b7, 8 x 12 and 4 x 24 slots with the rolled loop): no faster where every warp streams
// alone, slower elsewhere (bench/results/58fd2b7-x12-ab/); removed.
// ws8_s6_w8 (45024a5: 8-warp CTAs of 104 KB, so that GEMM2's CTA would fit beside GEMM1's) lost 12-40% at
// T = 1: two CTAs of one launch share an SM while others idle (bench/results/45024a5-ab/); removed. Again as
// the "resident pair" (37f9d85 .. b3fce49: GEMM1 padded to one CTA an SM, GEMM2's CTAs launched beside it):
// the handoff shrank 2.7 -> 0.9 us but GEMM1 ran slower beside the waiting CTAs (qwen3-235b T = 1 +10%,
// bench/results/b3fce49-*); removed.
// ws8_s6_w16_b1: as ws8_s6_w16 with one 64-row block a warp (the piece's two blocks on warps 2j, 2j + 1; the
// fifth number: blocks per warp), taken for GEMM1 at T = 1 with long K (kWarpStreamB1MinKTiles; docs/gemm.md,
// "Experiment 21 and one block a warp"). ws8_s5_w24_b1: the same with 24 warps a CTA (12 pairs; 5 slots, so that
// its direct-row kernel's rings fit 227 KB), opt-in (NVFP4MOE_SM90_OPT_IN_WARP_STREAM_CONFIGS) until measured:
// deepseek-v3 T = 1's GEMM1 needs 2304 b1 warps, more than 16 x 132 (docs/gemm.md, "Where this plan stands after the
// fortieth session"); its 768 threads leave 80 registers a thread, which the routed broadcast-row b1 kernels fit.
#define NVFP4MOE_SM90_WARP_STREAM_CONFIGS(X) \
  X(16, 6, 1, 0, 2)                          \
  X(16, 6, 1, 1, 2)                          \
  X(16, 4, 2, 1, 2)                          \
  X(16, 6, 1, 0, 1)                          \
  X(24, 5, 1, 0, 1)

// The listed warp-streaming configs that only NVFP4MOE_SM90_CONFIG selects (sm90_opt_in_config).
#define NVFP4MOE_SM90_OPT_IN_WARP_STREAM_CONFIGS(X) X(24, 5, 1, 0, 1)

// The configs with Sm90GemmArgs::one_token_route kernels: those that T = 1 picks, X(warps, depth, spw, unrolled,
// bpw, gemm2): the broadcast-row GEMM1 kernels (SwiGLU, relu^2; routing) of all three, the direct-row f32 GEMM2
// kernel (read_ids) where gemm2 is 1 (the heuristic keeps GEMM2 on two blocks a warp).
#define NVFP4MOE_SM90_ONE_TOKEN_ROUTE_CONFIGS(X) \
  X(16, 6, 1, 0, 2, 1)                           \
  X(16, 6, 1, 1, 2, 1)                           \
  X(16, 6, 1, 0, 1, 0)                           \
  X(24, 5, 1, 0, 1, 0)

// The configs with Sm90GemmArgs::a_routed_token_rows kernels (the routed GEMM1 at T = 2 .. 4; SwiGLU and relu^2),
// X(warps, depth, spw, unrolled, bpw): those that T = 2 .. 4 picks for GEMM1 at the presets.
#define NVFP4MOE_SM90_TOKEN_ROWS_ROUTE_CONFIGS(X) \
  X(16, 6, 1, 0, 2)                               \
  X(16, 6, 1, 1, 2)                               \
  X(16, 4, 2, 1, 2)

// The configs with a mixed-last-pass kernel (Sm90GemmArgs::mixed_last_pass; SwiGLU and f32 epilogues): the two
// prefill tiles, opt-in (the layer's NVFP4MOE_SM90_MIXED_LAST_PASS) until measured.
#define NVFP4MOE_SM90_MIXED_CONFIGS(X) \
  X(128, 8, 2, 1, 0)                   \
  X(144, 8, 2, 1, 0)

// The configs with a chained kernel (GEMM1 -> GEMM2 in one launch, sm90_nvfp4_chained_gemms), each for the
// SwiGLU and relu^2 GEMM1: the decode tiles that the heuristic picks for both GEMMs of one layer (the half tile:
// qwen3-30b, nemotron-nano, gpt-oss-120b at T = 1; the 2-warpgroup tile: qwen3-235b at T = 1).
#define NVFP4MOE_SM90_CHAINED_CONFIGS(X) \
  X(16, 14, 2, 2, 0)                     \
  X(16, 14, 2, 1, 0)

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiledFn encode_fn() {
  static EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// The one-time host work of a kernel, once per device (up to 64 devices; others every launch): the shared-memory
// attribute, the register budget (setmaxnreg.inc waits for registers the CTA does not own: a hang, not an
// error), and how many CTAs fit on one SM (a chained launch needs its whole grid resident).
// smem_attr: the kernel's dynamic shared-memory limit (its fixed size, or more where the launch adds to it).
template <class Tr, class Kernel>
cudaError_t kernel_ready(Kernel kernel, int* ctas_per_sm, int smem_attr = Tr::kSmemBytes) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
  static std::atomic<int> fit[64];  // 0 = not checked yet, else CTAs per SM
  if (dev >= 0 && dev < 64) {
    const int f = fit[dev].load(std::memory_order_acquire);
    if (f > 0) {
      *ctas_per_sm = f;
      return cudaSuccess;
    }
  }
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_attr);
  cudaFuncAttributes fa{};
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, kernel);
  if (e == cudaSuccess && fa.numRegs * Tr::kThreads < Tr::kRegsNeeded) e = cudaErrorInvalidConfiguration;
  int n = 0;
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, Tr::kThreads, Tr::kSmemBytes);
  if (e == cudaSuccess && n < 1) e = cudaErrorInvalidConfiguration;
  if (e != cudaSuccess)
    return fail("sm90_nvfp4_grouped_gemm: kernel attributes / register budget check failed (" +
                std::string(cudaGetErrorString(e)) + ")");
  if (dev >= 0 && dev < 64) fit[dev].store(n, std::memory_order_release);
  *ctas_per_sm = n;
  return cudaSuccess;
}

// A distinct traits type for each of a config's other kernels (gathered A, broadcast row): kernel_ready's one-time
// check is per (traits, kernel type), and all kernels of a config have the same type.
template <class Tr, int kVariant = 1>
struct VariantTraits : Tr {};

template <int BT, int STAGES, int WGS, int WPU, bool SYNC, sm90::Epilogue EPI, bool GATHER = false>
cudaError_t launch(const CUtensorMap& map, const sm90::GemmParams& p, int grid, cudaStream_t stream) {
  using Tr = sm90::KernelTraits<BT, WGS, STAGES, EPI, WPU, SYNC>;
  using ReadyTr = std::conditional_t<GATHER, VariantTraits<Tr>, Tr>;
  auto kernel = sm90::sm90_nvfp4_grouped_gemm_kernel<BT, WGS, STAGES, EPI, WPU, SYNC, GATHER>;
  int fit = 0;
  if (const cudaError_t e = kernel_ready<ReadyTr>(kernel, &fit); e != cudaSuccess) return e;
  return launch_pdl(kernel, dim3(grid), dim3(Tr::kThreads), Tr::kSmemBytes, stream, map, p);
}

template <int BT, int STAGES, int WGS, sm90::Epilogue EPI>
cudaError_t launch_mixed(const CUtensorMap& map, const CUtensorMap& tail_map, const sm90::GemmParams& p, int grid,
                         cudaStream_t stream) {
  using Tr = sm90::KernelTraits<BT, WGS, STAGES, EPI, 1, false>;
  auto kernel = sm90::sm90_nvfp4_mixed_pass_gemm_kernel<BT, WGS, STAGES, EPI>;
  int fit = 0;
  if (const cudaError_t e = kernel_ready<VariantTraits<Tr, 2>>(kernel, &fit); e != cudaSuccess) return e;
  return launch_pdl(kernel, dim3(grid), dim3(Tr::kThreads), Tr::kSmemBytes, stream, map, tail_map, p);
}

template <int BT, int STAGES, int WGS, int WPU, bool SYNC, sm90::Epilogue EPI1>
cudaError_t launch_chained(const CUtensorMap& map1, const CUtensorMap& map2, const sm90::GemmParams& p1,
                           const sm90::GemmParams& p2, int32_t* counters, int grid, int device_sms,
                           cudaStream_t stream) {
  using Tr = sm90::KernelTraits<BT, WGS, STAGES, EPI1, WPU, SYNC>;
  auto kernel = sm90::sm90_nvfp4_chained_gemm_kernel<BT, WGS, STAGES, EPI1, WPU, SYNC>;
  int fit = 0;
  if (const cudaError_t e = kernel_ready<Tr>(kernel, &fit); e != cudaSuccess) return e;
  if (grid > fit * device_sms)
    return fail("sm90_nvfp4_chained_gemms: num_sms " + std::to_string(grid) + " exceeds the CTAs that fit at once (" +
                std::to_string(fit) + " per SM x " + std::to_string(device_sms) + " SMs): a GEMM2 tile would wait for "
                "a GEMM1 tile that never starts");
  sm90::ChainSync chain;
  chain.done = counters;
  chain.passed = counters + p1.num_experts;
  chain.per_token_tile = (p1.units + Tr::kUnitsPerTile - 1) / Tr::kUnitsPerTile * Tr::kStoringWarpgroups;
  return launch_pdl(kernel, dim3(grid), dim3(Tr::kThreads), Tr::kSmemBytes, stream, map1, map2, p1, p2, chain);
}

// Whether NVFP4MOE_SM90_ONE_TOKEN_ROUTE_CONFIGS has a routed kernel for this config and rows (broadcast: GEMM1).
constexpr bool one_token_route_instantiated(int warps, int depth, int spw, bool unrolled, int bpw, bool broadcast) {
#define NVFP4MOE_X(w, d, s, u, b, gemm2) \
  if (warps == w && depth == d && spw == s && unrolled == (u != 0) && bpw == b && (broadcast || gemm2 != 0)) return true;
  NVFP4MOE_SM90_ONE_TOKEN_ROUTE_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
  return false;
}

// Whether NVFP4MOE_SM90_TOKEN_ROWS_ROUTE_CONFIGS has this config.
constexpr bool token_rows_route_instantiated(int warps, int depth, int spw, bool unrolled, int bpw) {
#define NVFP4MOE_X(w, d, s, u, b) \
  if (warps == w && depth == d && spw == s && unrolled == (u != 0) && bpw == b) return true;
  NVFP4MOE_SM90_TOKEN_ROWS_ROUTE_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
  return false;
}

template <int WARPS, int DEPTH, int SPW, bool UNROLLED, int BPW, sm90::Epilogue EPI,
          sm90::WsRows ROWS = sm90::WsRows::kDirect, bool ROUTED = false>
cudaError_t launch_warp_stream(const Sm90GemmArgs& args, const sm90::GemmParams& p, int grid, cudaStream_t stream) {
  // The broadcast-row kernels keep the row in shared memory (WarpStreamTraits::kResidentRow): k_tiles x 128 bytes
  // more than their fixed part, sized here (the quantizing ones: the raw row and kWsMaxQuantRows quantized ones).
  constexpr bool kQuantRows = ROWS == sm90::WsRows::kBroadcastQuantized;
  constexpr bool kTokenQuant = ROWS == sm90::WsRows::kRoutedTokensQuantized;
  constexpr bool kTokenRows = ROWS == sm90::WsRows::kRoutedTokens || kTokenQuant;
  constexpr bool kResidentRow = ROWS == sm90::WsRows::kBroadcast || kQuantRows || kTokenRows;
  using Tr = sm90::WarpStreamTraits<WARPS, DEPTH, SPW, UNROLLED, EPI, BPW, kResidentRow>;
  using ReadyTr = std::conditional_t<ROWS == sm90::WsRows::kDirect && !ROUTED, Tr,
                                     VariantTraits<Tr, static_cast<int>(ROWS) + (ROUTED ? 8 : 0)>>;
  auto kernel = sm90::sm90_nvfp4_warp_stream_gemm_kernel<WARPS, DEPTH, SPW, UNROLLED, EPI, ROWS, BPW, ROUTED>;
  int rows = kQuantRows ? 1 + sm90::kWsMaxQuantRows : 1;
  if constexpr (kTokenRows) rows = std::max(1, args.one_token_route->route.tokens);  // (the T token rows)
  if constexpr (kTokenQuant) rows *= sm90::kWsTokenQuantRowsPerToken;  // (quantized in place + a second expert's)
  const int smem = Tr::kSmemBytes + Tr::resident_row_bytes(p.k_tiles) * rows;
  // (checked: sm90_broadcast_row_max_k)
  int fit = 0;
  if (const cudaError_t e = kernel_ready<ReadyTr>(kernel, &fit, kResidentRow ? sm90::kMaxSmemPerBlock : Tr::kSmemBytes);
      e != cudaSuccess)
    return e;
  Sm90OneTokenRoute rt{};  // (read by the routed kernels only; checked by check_one_token_route)
  if constexpr (ROUTED) rt = *args.one_token_route;
  return launch_pdl(kernel, dim3(grid), dim3(Tr::kThreads), smem, stream, args.a, args.shape.k, p,
                    args.prologue_before_pdl_wait, rt,
                    kQuantRows    ? args.a_broadcast_quant_gs
                    : kTokenQuant ? args.a_routed_token_quant_gs
                                  : nullptr);
}

// The refusal of a variant kernel (gathered A, broadcast row) for the f32 epilogue: it exists for GEMM1 only.
cudaError_t refuse_f32_variant(const char* arg, const char* kernels) {
  return fail(std::string("sm90_nvfp4_grouped_gemm: ") + arg + ": the " + kernels +
              " kernels have the activation epilogues (SwiGLU, relu^2) only; got f32");
}

// A routed GEMM1 kernel of rows ROWS for the launch's activation epilogue (SwiGLU or relu^2; the f32 one refused,
// naming the argument `arg` and the `kernels`).
template <int WARPS, int DEPTH, int SPW, bool UNROLLED, int BPW, sm90::WsRows ROWS>
cudaError_t launch_routed_activation(const Sm90GemmArgs& args, const sm90::GemmParams& p, int grid,
                                     cudaStream_t stream, const char* arg, const char* kernels) {
  if (args.epilogue == Sm90GemmEpilogue::kSwiGLU)
    return launch_warp_stream<WARPS, DEPTH, SPW, UNROLLED, BPW, sm90::Epilogue::kSwiGLU, ROWS, true>(args, p, grid,
                                                                                                   stream);
  if (args.epilogue == Sm90GemmEpilogue::kRelu2)
    return launch_warp_stream<WARPS, DEPTH, SPW, UNROLLED, BPW, sm90::Epilogue::kRelu2, ROWS, true>(args, p, grid,
                                                                                                  stream);
  return refuse_f32_variant(arg, kernels);
}

// ROWS: the broadcast-row and gathered-A kernels (Sm90GemmArgs::a_broadcast_row, a_gather_src; activation
// epilogues only) besides the direct one; the quantized broadcast rows (a_broadcast_quant_gs) routed only.
template <int WARPS, int DEPTH, int SPW, bool UNROLLED, int BPW, sm90::WsRows ROWS>
cudaError_t launch_warp_stream_epi(const Sm90GemmArgs& args, const sm90::GemmParams& p, int grid,
                                   cudaStream_t stream) {
  constexpr bool kBroadcast = ROWS == sm90::WsRows::kBroadcast || ROWS == sm90::WsRows::kBroadcastQuantized;
  if constexpr (ROWS == sm90::WsRows::kDirectTokenIds) {  // (check_one_token_route ran: the last line of refusals)
    if constexpr (!token_rows_route_instantiated(WARPS, DEPTH, SPW, UNROLLED, BPW) || BPW != 2) {
      return fail("sm90_nvfp4_grouped_gemm: read_token_ids: no such kernel for this config");
    } else {
      if (args.one_token_route == nullptr || !args.one_token_route->read_ids ||
          args.epilogue != Sm90GemmEpilogue::kF32)
        return fail("sm90_nvfp4_grouped_gemm: read_token_ids: only with a read_ids one_token_route and the f32 "
                    "epilogue");
      return launch_warp_stream<WARPS, DEPTH, SPW, UNROLLED, BPW, sm90::Epilogue::kF32, ROWS, true>(args, p, grid,
                                                                                                  stream);
    }
  } else if constexpr (ROWS == sm90::WsRows::kRoutedTokens ||
                       ROWS == sm90::WsRows::kRoutedTokensQuantized) {  // (check_one_token_route ran: the last line)
    if constexpr (!token_rows_route_instantiated(WARPS, DEPTH, SPW, UNROLLED, BPW)) {
      return fail("sm90_nvfp4_grouped_gemm: a_routed_token_rows: no such kernel for this config");
    } else {
      if (args.one_token_route == nullptr || args.one_token_route->read_ids)
        return fail("sm90_nvfp4_grouped_gemm: a_routed_token_rows: only with a routing one_token_route");
      return launch_routed_activation<WARPS, DEPTH, SPW, UNROLLED, BPW, ROWS>(args, p, grid, stream,
                                                                             "a_routed_token_rows", "routed token-row");
    }
  } else if (args.one_token_route != nullptr) {  // (check_one_token_route ran: these refusals are the last line)
    if constexpr (ROWS == sm90::WsRows::kGathered ||
                  !one_token_route_instantiated(WARPS, DEPTH, SPW, UNROLLED, BPW, kBroadcast)) {
      return fail("sm90_nvfp4_grouped_gemm: one_token_route: no routed kernel for this config");
    } else if constexpr (kBroadcast) {
      return launch_routed_activation<WARPS, DEPTH, SPW, UNROLLED, BPW, ROWS>(args, p, grid, stream, "a_broadcast_row",
                                                                             "broadcast-row");
    } else {
      if (args.epilogue == Sm90GemmEpilogue::kF32)
        return launch_warp_stream<WARPS, DEPTH, SPW, UNROLLED, BPW, sm90::Epilogue::kF32, ROWS, true>(args, p, grid,
                                                                                                    stream);
      return fail("sm90_nvfp4_grouped_gemm: one_token_route: with direct rows only the f32 epilogue (GEMM2, read_ids)");
    }
  }
  if constexpr (ROWS == sm90::WsRows::kBroadcastQuantized || ROWS == sm90::WsRows::kRoutedTokens ||
                ROWS == sm90::WsRows::kDirectTokenIds || ROWS == sm90::WsRows::kRoutedTokensQuantized) {
    return fail("sm90_nvfp4_grouped_gemm: a_broadcast_quant_gs: only with a routing one_token_route");
  } else {
    switch (args.epilogue) {
      case Sm90GemmEpilogue::kF32:
        if constexpr (ROWS == sm90::WsRows::kBroadcast) return refuse_f32_variant("a_broadcast_row", "broadcast-row");
        else if constexpr (ROWS == sm90::WsRows::kGathered) return refuse_f32_variant("a_gather_src", "gathered-A");
        else return launch_warp_stream<WARPS, DEPTH, SPW, UNROLLED, BPW, sm90::Epilogue::kF32>(args, p, grid, stream);
      case Sm90GemmEpilogue::kSwiGLU:
        return launch_warp_stream<WARPS, DEPTH, SPW, UNROLLED, BPW, sm90::Epilogue::kSwiGLU, ROWS>(args, p, grid,
                                                                                                   stream);
      case Sm90GemmEpilogue::kRelu2:
        return launch_warp_stream<WARPS, DEPTH, SPW, UNROLLED, BPW, sm90::Epilogue::kRelu2, ROWS>(args, p, grid,
                                                                                                  stream);
    }
    return fail("sm90_nvfp4_grouped_gemm: unknown epilogue");
  }
}

// GATHER: the gathered-A kernels (Sm90GemmArgs::a_gather_src; activation epilogues only, no descriptor).
template <int BT, int STAGES, int WGS, int WPU, bool SYNC, bool GATHER>
cudaError_t launch_epi(Sm90GemmEpilogue epi, const CUtensorMap& map, const sm90::GemmParams& p, int grid,
                       cudaStream_t stream) {
  switch (epi) {
    case Sm90GemmEpilogue::kF32:
      if constexpr (GATHER) return refuse_f32_variant("a_gather_src", "gathered-A");
      else return launch<BT, STAGES, WGS, WPU, SYNC, sm90::Epilogue::kF32>(map, p, grid, stream);
    case Sm90GemmEpilogue::kSwiGLU:
      return launch<BT, STAGES, WGS, WPU, SYNC, sm90::Epilogue::kSwiGLU, GATHER>(map, p, grid, stream);
    case Sm90GemmEpilogue::kRelu2:
      return launch<BT, STAGES, WGS, WPU, SYNC, sm90::Epilogue::kRelu2, GATHER>(map, p, grid, stream);
  }
  return fail("sm90_nvfp4_grouped_gemm: unknown epilogue");
}

// Whether config is the warp-streaming entry X(warps, depth, spw, unrolled, bpw) of
// NVFP4MOE_SM90_WARP_STREAM_CONFIGS (the launch's dispatch, sm90_broadcast_row_max_k and sm90_opt_in_config match on it).
bool is_warp_stream_config(const Sm90GemmConfig& c, int warps, int depth, int spw, bool unrolled, int bpw) {
  return c.warp_stream && c.block_t == sm90::kWsTokens && c.stages == depth && 4 * c.consumer_warpgroups == warps &&
         c.slices_per_warp == spw && c.ws_unrolled == unrolled && c.blocks_per_warp == bpw;
}

}  // namespace

const char* sm90_gemm_last_error_message() { return g_last_error.c_str(); }

Sm90PreparedShape sm90_prepared_shape(int num_experts, int n, int k, bool gated) {
  Sm90PreparedShape s;
  s.num_experts = num_experts;
  s.n = n;
  s.k = k;
  s.gated = gated;
  s.units = gated ? (n / 2 + 63) / 64 : (n + 127) / 128;
  s.k_tiles = (k + sm90::kBlockK - 1) / sm90::kBlockK;
  s.bytes = static_cast<size_t>(num_experts) * s.units * s.k_tiles * sm90::kUnitBytes;
  return s;
}

cudaError_t sm90_prepare_weights(const uint8_t* packed, const uint8_t* scales, const Sm90PreparedShape& s,
                                 uint8_t* out, cudaStream_t stream) {
  if (packed == nullptr || scales == nullptr || out == nullptr)
    return fail("sm90_prepare_weights: null pointer (packed, scales or out)");
  if (s.num_experts <= 0 || s.n <= 0 || s.k <= 0 || s.k % 16 != 0 || s.n % (s.gated ? 32 : 16) != 0)
    return fail("sm90_prepare_weights: need E > 0, K % 16 == 0 and N % 16 == 0 (gated: N/2 % 16 == 0); got E=" +
                std::to_string(s.num_experts) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k));
  const int64_t total = static_cast<int64_t>(s.num_experts) * s.units * s.k_tiles * 256;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 1 << 20);
  sm90::sm90_prepare_weights_kernel<<<static_cast<int>(blocks), threads, 0, stream>>>(
      packed, scales, out, s.num_experts, s.n, s.k, s.units, s.k_tiles, s.gated ? 1 : 0);
  return cudaGetLastError();
}

const std::vector<Sm90GemmConfig>& sm90_gemm_configs() {
  static const std::vector<Sm90GemmConfig> list = {
#define NVFP4MOE_X(bt, st, wgs, wpu, sync) Sm90GemmConfig{bt, st, wgs, wpu, sync != 0},
      NVFP4MOE_SM90_GEMM_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
#define NVFP4MOE_X(warps, depth, spw, unrolled, bpw) \
  Sm90GemmConfig{sm90::kWsTokens, depth, warps / 4, 1, false, true, spw, unrolled != 0, bpw},
      NVFP4MOE_SM90_WARP_STREAM_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
  };
  return list;
}

std::string to_string(const Sm90GemmConfig& c) {
  if (c.warp_stream)
    // (one slice: rolled unless "_u"; several: unrolled unless "_r")
    return "ws" + std::to_string(c.block_t) + "_s" + std::to_string(c.stages) + "_w" +
           std::to_string(4 * c.consumer_warpgroups) +
           (c.slices_per_warp > 1 ? "_x" + std::to_string(c.slices_per_warp) + (c.ws_unrolled ? "" : "_r")
                                  : (c.ws_unrolled ? "_u" : "")) +
           (c.blocks_per_warp == 1 ? "_b1" : "");
  return "bt" + std::to_string(c.block_t) + "_s" + std::to_string(c.stages) + "_wg" +
         std::to_string(c.consumer_warpgroups) + (c.warpgroups_per_unit == 2 ? "_half" : "") +
         (c.mma_sync ? "_sync" : "");
}

bool sm90_gemm_config_by_name(const std::string& name, Sm90GemmConfig* out) {
  for (const auto& c : sm90_gemm_configs())
    if (to_string(c) == name) {
      if (out) *out = c;
      return true;
    }
  return false;
}

bool sm90_opt_in_config(const Sm90GemmConfig& c) {
#define NVFP4MOE_X(warps, depth, spw, unrolled, bpw) \
  if (is_warp_stream_config(c, warps, depth, spw, unrolled != 0, bpw)) return true;
  NVFP4MOE_SM90_OPT_IN_WARP_STREAM_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
  return false;
}

bool sm90_gemm_mma_twin(const Sm90GemmConfig& c, bool mma_sync, Sm90GemmConfig* out) {
  if (c.warp_stream) return false;  // its own kernels (mma.sync only)
  Sm90GemmConfig twin = c;
  twin.mma_sync = mma_sync;
  return sm90_gemm_config_by_name(to_string(twin), out);
}

namespace {

// The warp-streaming configs the heuristic takes at decode, found once (sm90_pick_config runs in every forward,
// where no strings are built): one slice per piece (ws8_s6_w16, rolled; ws8_s6_w16_u) and two (ws8_s4_w16_x2).
const Sm90GemmConfig* find_warp_stream_config(int slices_per_warp, bool unrolled, int blocks_per_warp = 2) {
  for (const auto& c : sm90_gemm_configs())
    if (c.warp_stream && c.slices_per_warp == slices_per_warp && c.ws_unrolled == unrolled &&
        c.blocks_per_warp == blocks_per_warp && !sm90_opt_in_config(c))
      return &c;
  return nullptr;
}
const Sm90GemmConfig* warp_stream_config(int slices_per_warp, bool unrolled) {
  static const Sm90GemmConfig* const one = find_warp_stream_config(1, false);
  static const Sm90GemmConfig* const one_unrolled = find_warp_stream_config(1, true);
  static const Sm90GemmConfig* const two = find_warp_stream_config(2, true);
  return slices_per_warp == 2 ? two : unrolled ? one_unrolled : one;
}
// Upper bound of the experts with rows (min(E, rows)) and the mean rows of those: host numbers only.
int64_t active_experts(const Sm90GemmLoad& load) {
  return std::min<int64_t>(std::max<int64_t>(load.experts, 1), load.max_rows);
}
double rows_per_active_expert(const Sm90GemmLoad& load) {
  return static_cast<double>(load.max_rows) / static_cast<double>(std::max<int64_t>(active_experts(load), 1));
}
// Layer A/B, same binary, NVFP4MOE_WARP_STREAM=0 vs on (bench/results/5c91ef5-ws-ab/): faster at every T <= 16
// of all five presets (<= 1 row per active expert: -2..-12%), mixed at T = 64: gpt-oss-120b (2.0 rows) -0.2%,
// deepseek-v3 (2.24) +1.9%, nemotron-nano (3) -2.5%, qwen3-30b and qwen3-235b (4) +2.2 / +3.2%.
constexpr double kWarpStreamMaxRowsPerExpert = 2.0;
// Two slices per piece (bench/results/5c66c7a-ws-unroll-ab/, both GEMMs forced): -4..-10% where its pieces
// (active experts x units x 2) fill half of the 16-warp grid or more (deepseek-v3 T = 4 / 16 / 64: 2048+ GEMM1
// pieces; qwen3-235b T = 4 / 16 / 64: 1536+, and at T = 64, 4 rows per expert, 9% faster than the tile kernel
// the heuristic took there), +13..18% where they fill a third or less (qwen3-30b T = 4: 768 / 1024;
// nemotron-nano T = 4: 720 / 1008), +10..44% at T = 1.
constexpr double kWarpStreamX2MaxRowsPerExpert = 4.0;
constexpr int64_t kWarpStreamX2MinPiecesPerSm = 8;
// One slice, the k-loop unrolled (5c66c7a-ws-unroll-ab, both GEMMs): deepseek-v3 T = 1 -3.4% (1152 / 2016
// pieces: 2-4 warps per scheduler), qwen3-235b T = 1 +0.2% (768 / 1024), but +3..6% where every warp streams
// alone (qwen3-30b, nemotron-nano T = 1: <= 512 pieces; gpt-oss-120b: 720 / 368), where the rolled loop's
// smaller code wins. Taken from 8 pieces per SM up.
constexpr int64_t kWarpStreamUnrolledMinPiecesPerSm = 8;
// One block a warp (ws8_s6_w16_b1) for GEMM1 where the rolled one-slice config runs (then each warp pair streams
// one piece at most: fewer than 8 pieces an SM, 16 warps a CTA) and K is long. Per GEMM in the layer, same call
// (bench/results/37f9d85-resident-pair-b1-per-gemm-ab-h100): GEMM1 at qwen3-235b (64 k-tiles) −1.1..1.4 us,
// gpt-oss-120b (45) −1.2, nemotron-nano (42) −1.0, qwen3-30b (32) +0.1; GEMM2 mixed (nemotron-nano −2.3,
// gpt-oss-120b +0.2, qwen3 0): not taken there.
constexpr int kWarpStreamB1MinKTiles = 40;
static_assert(2 * kWarpStreamUnrolledMinPiecesPerSm <= 16, "below the unrolled bound, a warp pair has one piece");
// bt144 over bt128 at prefill when it saves at least this share of the expected weight passes per expert
// (sm90_expected_tile_passes; the measured points in sm90_pick_tile_config).
constexpr double kPrefillTileMinPassSaving = 0.15;
// The next token tile up (bt16 -> bt32, bt32 -> bt64) when it saves at least this share of the expected passes.
constexpr double kSmallTileMinPassSaving = 0.25;

}  // namespace

Sm90GemmConfig sm90_pick_config(const Sm90GemmLoad& load) {
  // Decode: the warp-streaming kernel (32-row pieces spread evenly over every warp of the grid; its token tile
  // of 8 rows reads each weight once up to 8 rows of an expert) where the experts hold few rows, with the units
  // and SMs known (as the tile rule's cost model needs them). Measured in the layer against the tile rule
  // (bench/results/891b1bc-ws-ab/, 5c91ef5-ws-ab/, 5c66c7a-ws-unroll-ab/, docs/gemm.md): two slices per piece
  // where those pieces are many, one slice otherwise.
  if (load.units > 0 && load.num_sms > 0 && load.max_rows > 0) {
    const double rows = rows_per_active_expert(load);
    const int64_t slices = active_experts(load) * load.units * 4;  // one-slice pieces (upper bound)
    if (rows <= kWarpStreamX2MaxRowsPerExpert && slices / 2 >= kWarpStreamX2MinPiecesPerSm * load.num_sms &&
        warp_stream_config(2, true) != nullptr)
      return *warp_stream_config(2, true);
    const bool unrolled = slices >= kWarpStreamUnrolledMinPiecesPerSm * load.num_sms;
    static const Sm90GemmConfig* const b1 = find_warp_stream_config(1, false, 1);
    if (rows <= kWarpStreamMaxRowsPerExpert && !unrolled && load.activation &&
        load.k_tiles >= kWarpStreamB1MinKTiles && b1 != nullptr)
      return *b1;
    if (rows <= kWarpStreamMaxRowsPerExpert && warp_stream_config(1, unrolled) != nullptr)
      return *warp_stream_config(1, unrolled);
  }
  return sm90_pick_tile_config(load);
}

double sm90_expected_tile_passes(double mean_rows, int block_t) {
  if (mean_rows <= 0.0 || block_t <= 0) return 0.0;
  // E[ceil(r / B)] = sum over j >= 0 of P(r > j B) for r >= 1, with r ~ Normal(m, sqrt(m)) (the Poisson limit of
  // a near-uniformly routed expert's Binomial(T k, 1 / E) count; continuity-corrected).
  // Terms with j B more than 10 sd below m are 1, above m + 10 sd are 0: only the band between is summed (the
  // heuristic runs in every forward; at m = 10^6 rows the band is ~160 terms of bt128, not ~8000).
  const double B = static_cast<double>(block_t), sd = std::sqrt(mean_rows);
  const double j_lo = std::max(1.0, std::floor((mean_rows - 10.0 * sd) / B));
  double passes = j_lo;  // the pass for r >= 1, plus j = 1 .. j_lo - 1, each certain
  for (double j = j_lo; j * B < mean_rows + 10.0 * sd; j += 1.0)
    passes += 0.5 * std::erfc((j * B + 0.5 - mean_rows) / (sd * std::sqrt(2.0)));
  return passes;
}

Sm90GemmConfig sm90_pick_tile_config(const Sm90GemmLoad& load) {
  const double experts = static_cast<double>(std::max<int64_t>(load.experts, 1));
  const double rows_per_expert = static_cast<double>(std::max<int64_t>(load.max_rows, 0)) / experts;
  // The smallest token tile that holds the expected rows of one expert: weight bytes are read once per token
  // tile, so a tile that fits the expert's rows reads each weight once; larger tiles only waste MMA columns.
  // At 16 rows the 4-warpgroup tile is faster (bench/results/567a3ab-*: 2.69 vs 2.52 TB/s at 1 row/expert on
  // all 256 experts), except when only a few experts are active (T * k << E, rows_per_expert < 0.5): then the
  // CTA tiles of the 2-warpgroup config (twice as many) are what fills the 132 SMs (85 vs 123 us at T = 1).
  const std::vector<Sm90GemmConfig>& list = sm90_gemm_configs();
  // Otherwise the most consumer warpgroups the tile has (bt16: wg4; bt32: wg3, 2.64 vs 2.49 / 2.37 TB/s at 16
  // rows/expert in bench/results/9b5c8c4-*).
  const bool few = rows_per_expert < 0.5;
  // The whole-unit wgmma config of token tile block_t that this rule starts from (nullptr: none listed).
  auto tile_of = [&](int block_t) -> const Sm90GemmConfig* {
    const Sm90GemmConfig* t = nullptr;
    for (const auto& c : list) {
      if (c.block_t != block_t || c.warpgroups_per_unit != 1 || c.mma_sync || c.warp_stream) continue;
      if (t == nullptr || (few ? c.consumer_warpgroups == 2 : c.consumer_warpgroups > t->consumer_warpgroups)) t = &c;
    }
    return t;
  };
  // The smallest listed token tile above `above` rows (0: none).
  auto next_tile = [&](double above) {
    int bt = 0;
    for (const auto& c : list)
      if (!c.warp_stream && c.block_t >= above && (bt == 0 || c.block_t < bt)) bt = c.block_t;
    return bt;
  };
  int bt = next_tile(rows_per_expert);
  if (bt == 0)  // more rows per expert than any tile: the largest (prefill) tile
    for (const auto& c : list)
      if (!c.warp_stream) bt = std::max(bt, c.block_t);
  // An expert's expected token tiles (weight passes) with tile block_t: under near-uniform routing its count is
  // m +- sqrt(m) (sm90_expected_tile_passes); one expert (the shared expert's own launch) has exactly max_rows.
  auto passes = [&](int block_t) {
    return load.experts <= 1 ? std::ceil(rows_per_expert / block_t) : sm90_expected_tile_passes(rows_per_expert, block_t);
  };
  // Whether the larger tile saves at least `share` of the passes of the smaller one.
  auto saves = [&](int small, int large, double share) {
    const double p = passes(small), q = passes(large);
    return p - q > 0.0 && p - q >= share * p;
  };
  // The token tile one size up (bt16 -> bt32, bt32 -> bt64) where the mean rows sit on the tile's size: at m = 16
  // or 32 ~45% of the experts took a second tile, i.e. a second pass over their weights, for the same columns.
  // Measured (forced configs, same call, bench/results/fc6bb15-tile-size-ab/): qwen3-30b T = 256 (16 rows) bt32
  // -14.6%, T = 512 (32 rows) bt64 -6%; not from bt64 to the prefill tile (T = 1024, 64 rows: bt144 +5%, its
  // N = 128 for 65..128 rows computes a third more columns). Rule: up when it saves >= 25% of the passes.
  if (bt < 64) {
    const int up = next_tile(bt + 1);
    if (up != 0 && up <= 64 && tile_of(up) != nullptr && saves(bt, up, kSmallTileMinPassSaving)) bt = up;
  }
  // Prefill, bt128 or bt144: every token tile is a whole pass over its expert's weights whatever its rows, so the
  // tile that saves passes wins where the counts scatter around a multiple of 128 (T k / E = 128: 1.5 expected
  // passes with bt128, 1.08 with bt144), and the smaller N where it saves none (192 rows: 2 either way, bt144 only
  // computes more columns). Measured at fc6bb15 (bench/results/fc6bb15-prefill-tile-ab/): bt144 -5.3% at
  // deepseek-v3 T = 4096 (128 rows), -6.3 / -5.5% at qwen3-235b / qwen3-30b T = 4096 (256), but +2.6% at
  // nemotron-nano T = 4096 (192) and +1.1% at qwen3-30b T = 16384 (1024: 8.5 -> 7.7 passes, tensor-bound there).
  // Rule: bt144 when it saves at least 15% of the expected passes, and never for a quantizing GEMM1 (w4a4): its
  // fused NVFP4 epilogue runs while the tensor pipe idles and costs ~100 us of qwen3-30b T = 4096's GEMM1 at bt128
  // (523 vs 423 us w4a16, ncu: bench/results/ae50bba-prefill-kernel-profile/), more at BT = 144 (36 groups a
  // thread). Measured bt144 for it, layer, same call (bench/results/4a757a3-w4a4-bt144-ab/): qwen3-30b T = 4096
  // +9.2% (965.7 -> 1054.2 us), qwen3-235b +1.8%, deepseek-v3 -2.6% (with its 36 groups in batches of 8 + 4; in
  // batches of 4, protocol run 8d09971: qwen3-30b +20%).
  if (bt >= 128 && tile_of(128) != nullptr && tile_of(144) != nullptr)
    bt = !load.quantized_output && saves(128, 144, kPrefillTileMinPassSaving) ? 144 : 128;
  const Sm90GemmConfig* best = tile_of(bt);
  if (load.units <= 0 || load.num_sms <= 0 || load.max_rows <= 0) return *best;
  // With the units and the SMs known: the config of this token tile with the least estimated time, waves of
  // CTA tiles x the time of one tile. A tile is W weight units, one per consumer warpgroup; the dequant chain
  // saturates the SM's issue slots, so a tile takes ~W / rate(W) (rate: the SM's throughput relative to W = 2,
  // measured at full occupancy: bt16 wg4 / wg2 = 2.69 / 2.52 TB/s at 1 row/expert, bench/results/567a3ab-*;
  // wg3 / wg4 = 2.99 / 2.91 at 8 rows/expert, docs/gemm.md).
  // The tile count is an upper bound from host numbers: active experts <= min(E, max_rows), token tiles per
  // active expert from the mean rows. This is what keeps a 2-warpgroup tile below one wave (deepseek-v3 T = 1
  // routed: 128 CTA tiles, 85 vs 123 us with wg4) and avoids a second, nearly empty wave (the same with the
  // shared expert as expert E: 144 tiles = 2 waves with wg2, 99 = 1 with wg3).
  const int64_t active = active_experts(load);
  const double rows_per_active = rows_per_active_expert(load);
  // A half-unit tile (warpgroups_per_unit = 2) holds W = consumer_warpgroups / 2 units on the same warpgroups,
  // at kHalfUnitRate of the whole-unit tile's throughput per unit (one accumulator chain per warpgroup, the
  // same per-k-tile overheads for half the work), measured at 2bb7842 (bench/results/2bb7842-ab/): 0.55 at
  // qwen3-30b T = 1 (one wave either way: 96 half tiles 19.0 us vs 48 wg2 tiles 20.9 us for GEMM1, 10.9 vs 12.4
  // for GEMM2), 0.6 with every deepseek-v3 expert busy (rpe1: 2099 vs 1271 us). So it wins only where it
  // halves the waves' time (few units: qwen3-30b and nemotron-nano at T = 1), never with units to spare.
  constexpr double kHalfUnitRate = 0.55;
  auto cost = [&](const Sm90GemmConfig& c) {
    const int64_t t_tiles = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(rows_per_active / c.block_t)));
    const int64_t units_per_tile = c.units_per_tile();
    const int64_t n_tiles = (load.units + units_per_tile - 1) / units_per_tile;
    const int64_t tiles = active * n_tiles * t_tiles;
    const int64_t waves = (tiles + load.num_sms - 1) / load.num_sms;
    double rate = c.consumer_warpgroups == 2 ? 1.0 : c.consumer_warpgroups == 3 ? 1.096 : 1.067;
    if (c.warpgroups_per_unit == 2) rate *= kHalfUnitRate;
    return static_cast<double>(waves) * static_cast<double>(units_per_tile) / rate;
  };
  for (const auto& c : list) {
    if (c.block_t != bt || c.mma_sync || c.warp_stream) continue;
    const double d = cost(c) - cost(*best);
    // Ties: whole units first, then the most consumer warpgroups.
    const bool tie_better = c.warpgroups_per_unit < best->warpgroups_per_unit ||
                            (c.warpgroups_per_unit == best->warpgroups_per_unit &&
                             c.consumer_warpgroups > best->consumer_warpgroups);
    if (d < -1e-9 || (d <= 1e-9 && tie_better)) best = &c;
  }
  // The consumers' MMA. The mma.sync twin of a whole-unit bt16 tile with 3 or 4 consumer warpgroups, where an
  // expert tile holds at most 4 rows (one n-tile of 8): measured faster in the whole layer (bench/results/
  // 194b639-ab/, same binary, alternating, 2 repeats): deepseek-v3 T = 1 / 4 / 16 / 64 -2 / -4 / -6 / -4%,
  // qwen3-235b T = 4 / 64 -3 / -5%, qwen3-30b T = 4..64 -1..2%, nemotron-nano T = 64 -3%. Not elsewhere: the
  // half-unit tiles lost 3-6% (qwen3-30b, nemotron-nano T = 1), the one-wave wg2 tile 1% (qwen3-235b T = 1),
  // and with two n-tiles (16 rows) the GEMM alone lost 15-25% (rpe16 in the same call's microbenchmark).
  Sm90GemmConfig picked = *best;
  if (best->block_t == 16 && best->warpgroups_per_unit == 1 && best->consumer_warpgroups >= 3 &&
      rows_per_active <= 4.0)
    sm90_gemm_mma_twin(*best, true, &picked);  // unchanged if the list had no such twin
  return picked;
}

namespace {

// The checks every launch makes on one GEMM's arguments ("" = fine); `who` names the entry point.
std::string check_args(const Sm90GemmArgs& args, const std::string& who) {
  const Sm90PreparedShape& s = args.shape;
  const bool gathered = args.a_gather_src != nullptr;
  if ((args.a == nullptr && !gathered) || args.w == nullptr || args.offsets == nullptr || args.alpha0 == nullptr ||
      args.out == nullptr || (args.epilogue == Sm90GemmEpilogue::kSwiGLU && args.alpha1 == nullptr))
    return who + ": null pointer among a (unless a_gather_src), w, offsets, alpha0, alpha1 (SwiGLU), out";
  if (s.k % 16 != 0 || s.n % 16 != 0 || s.units <= 0 || s.k_tiles <= 0)
    return who + ": shape needs K % 16 == 0, N % 16 == 0; got N=" + std::to_string(s.n) + " K=" + std::to_string(s.k);
  if ((args.epilogue == Sm90GemmEpilogue::kSwiGLU) != s.gated)
    return who + ": the SwiGLU epilogue needs gated prepared weights and the others not";
  if (!gathered && (args.a_rows_capacity <= 0 || args.a_rows_capacity > (int64_t(1) << 31) - 1))
    return who + ": a_rows_capacity must be in [1, 2^31); got " + std::to_string(args.a_rows_capacity);
  if ((reinterpret_cast<uintptr_t>(args.a) & 15) != 0 || (reinterpret_cast<uintptr_t>(args.w) & 15) != 0)
    return who + ": a and w must be 16-byte aligned";
  if (gathered) {
    if ((reinterpret_cast<uintptr_t>(args.a_gather_src) & 15) != 0)
      return who + ": a_gather_src must be 16-byte aligned";
    if (args.a_gather_src_rows <= 0 || args.a_gather_src_rows > (int64_t(1) << 31) - 1)
      return who + ": a_gather_src_rows must be in [1, 2^31); got " + std::to_string(args.a_gather_src_rows);
    if (args.a_gather_perm != nullptr && args.a_gather_top_k < 1)
      return who + ": a_gather_top_k must be >= 1; got " + std::to_string(args.a_gather_top_k);
    if (args.a_gather_shared_row_base < 0 || args.a_gather_shared_row_base > args.a_gather_src_rows)
      return who + ": a_gather_shared_row_base must be in [0, a_gather_src_rows = " +
             std::to_string(args.a_gather_src_rows) + "]; got " + std::to_string(args.a_gather_shared_row_base);
    if (args.a_gather_perm_experts < -1 || args.a_gather_perm_experts > s.num_experts)
      return who + ": a_gather_perm_experts must be in [-1, " + std::to_string(s.num_experts) + "]; got " +
             std::to_string(args.a_gather_perm_experts);
  }
  return "";
}

// Sm90GemmArgs::one_token_route against the launch (its kernel's own limits, threads and scratch, are checked
// where it is launched).
std::string check_one_token_route(const Sm90GemmArgs& args, const Sm90GemmConfig& config, const std::string& who) {
  const Sm90OneTokenRoute& r = *args.one_token_route;
  const std::string w = who + ": one_token_route";
  const bool broadcast = args.a_broadcast_row || args.a_routed_token_rows;
  if (args.a_routed_token_rows) {  // GEMM1 at T = 2 .. 4 routing its tokens
    if (args.a_broadcast_row || args.a_broadcast_quant_gs != nullptr || args.a_gather_src != nullptr)
      return w + ": a_routed_token_rows with a_broadcast_row, a_broadcast_quant_gs or a_gather_src (the token rows "
                 "are `a`'s)";
    if (args.epilogue == Sm90GemmEpilogue::kF32)
      return w + ": a_routed_token_rows with the f32 epilogue (GEMM1 only: SwiGLU or relu^2)";
    if (r.read_ids) return w + ": a_routed_token_rows with read_ids (the launch routes its tokens)";
    if (args.prologue_before_pdl_wait)
      return w + ": a_routed_token_rows with prologue_before_pdl_wait (the logits come from the previous kernel: "
                 "the routing follows the wait)";
    const int T = r.route.tokens, E = r.route.experts, K = r.route.top_k;
    if (T != 0 && !sm90_token_rows_route_fits(config, T, E, K, args.shape.k))
      return w + ": a_routed_token_rows: route.tokens = " + std::to_string(T) + ", experts = " + std::to_string(E) +
             ", top_k = " + std::to_string(K) + ", shape.k = " + std::to_string(args.shape.k) + " do not fit config " +
             to_string(config) + " (sm90_token_rows_route_fits: 2 <= tokens <= " +
             std::to_string(kSm90RoutedTokensMax) + ", tokens x top_k <= 32, a thread a (token, expert), the "
             "scratch in the ring slots, the rows beside the rings: shape.k <= " +
             std::to_string(sm90_resident_rows_max_k(config, std::max(1, T))) + ")";
    if (args.a_rows_capacity < T)
      return w + ": a_routed_token_rows: a_rows_capacity must hold the route.tokens = " + std::to_string(T) +
             " rows; got " + std::to_string(args.a_rows_capacity);
    const int quant_rows = sm90::kWsTokenQuantRowsPerToken * T;
    if (args.a_routed_token_quant_gs != nullptr && T != 0 &&
        args.shape.k > sm90_resident_rows_max_k(config, quant_rows))
      return w + ": a_routed_token_quant_gs: shape.k = " + std::to_string(args.shape.k) + " exceeds " +
             std::to_string(sm90_resident_rows_max_k(config, quant_rows)) + ", the longest K whose " +
             std::to_string(quant_rows) + " token rows (quantized in place, and a token's second expert's) config " +
             to_string(config) + " keeps beside its weight rings";
  } else if (args.read_token_ids) {  // GEMM2 after it
    if (!r.read_ids || args.epilogue != Sm90GemmEpilogue::kF32 || args.a_broadcast_row ||
        args.a_broadcast_quant_gs != nullptr || args.a_gather_src != nullptr)
      return w + ": read_token_ids: only with read_ids, the f32 epilogue and direct rows (GEMM2 after a GEMM1 with "
                 "a_routed_token_rows)";
    if (!sm90_token_rows_route_available(config))
      return w + ": read_token_ids: config " + to_string(config) + " has no such kernel "
                 "(sm90_token_rows_route_available)";
    const int T = r.route.tokens, K = r.route.top_k;
    if (T != 0 && (T < 2 || T > kSm90RoutedTokensMax || T * K > 32 || K < 1))
      return w + ": read_token_ids: route.tokens = " + std::to_string(T) + ", top_k = " + std::to_string(K) +
             ": expected 2 <= tokens <= " + std::to_string(kSm90RoutedTokensMax) + " and tokens x top_k <= 32";
  } else if (!sm90_one_token_route_available(config, args.epilogue, broadcast))
    return w + ": config " + to_string(config) + " has no routed kernel for the " +
           (broadcast ? "broadcast-row activation epilogue" : "direct-row f32 epilogue") +
           " (sm90_one_token_route_available)";
  if (args.a_gather_src != nullptr) return w + ": not with a_gather_src";
  if (r.read_ids == broadcast)
    return w + (broadcast ? ": read_ids with a_broadcast_row (GEMM1 routes the token; GEMM2 reads its ids)"
                          : ": routing in a direct-row launch (only GEMM1 with a_broadcast_row routes; GEMM2 reads "
                            "its ids: read_ids)");
  if (args.prologue_before_pdl_wait && !r.read_ids)  // (with read_ids: the ids guessed before the wait, checked after)
    return w + ": prologue_before_pdl_wait with the routing in the launch (the logits come from the previous "
               "kernel: the routing follows the wait)";
  if (r.read_ids && r.write_outputs) return w + ": write_outputs with read_ids (nothing is routed)";
  if (r.route.tokens != 0 && r.route.tokens != 1 && !args.a_routed_token_rows && !args.read_token_ids)
    return w + ": route.tokens must be 1 (or 0: nothing routed; 2 .. " + std::to_string(kSm90RoutedTokensMax) +
           " with a_routed_token_rows); got " + std::to_string(r.route.tokens);
  const int E = r.route.experts, K = r.route.top_k;
  if (!args.a_routed_token_rows && !args.read_token_ids && !sm90_one_token_route_fits(config, E, K))
    return w + ": route.experts = " + std::to_string(E) + ", route.top_k = " + std::to_string(K) + " do not fit " +
           to_string(config) + " (sm90_one_token_route_fits: 1 <= top_k <= min(32, experts), a thread an expert, "
           "the routing's scratch in the ring slots)";
  if (!r.read_ids && r.route.logits == nullptr) return w + ": route.logits is null";
  if (r.plan.experts != E || r.plan.top_k != K || r.plan.tokens != r.route.tokens)
    return w + ": plan.experts / top_k / tokens must be route's (" + std::to_string(E) + ", " + std::to_string(K) +
           ", " + std::to_string(r.route.tokens) + "); got " + std::to_string(r.plan.experts) + ", " +
           std::to_string(r.plan.top_k) + ", " + std::to_string(r.plan.tokens);
  const int launch_experts = E + (r.plan.append_shared ? 1 : 0);
  if (args.shape.num_experts != launch_experts)
    return w + ": shape.num_experts must be route.experts" + (r.plan.append_shared ? " + 1 (append_shared)" : "") +
           " = " + std::to_string(launch_experts) + "; got " + std::to_string(args.shape.num_experts);
  if ((r.read_ids || r.write_outputs) && r.route.topk_ids == nullptr) return w + ": route.topk_ids is null";
  if (r.write_outputs && (r.route.topk_weights == nullptr || r.plan.counts == nullptr || r.plan.offsets == nullptr ||
                          r.plan.tile_offsets == nullptr || r.plan.perm == nullptr || r.plan.inv == nullptr))
    return w + ": write_outputs with a null among route.topk_weights, plan.counts / offsets / tile_offsets / perm / "
               "inv";
  return "";
}

// The TMA descriptor of A ([a_rows_capacity, K] bf16, boxes of 64 k x block_t rows, 128-byte swizzle).
std::string make_a_map(const Sm90GemmArgs& args, int block_t, CUtensorMap* map, const std::string& who) {
  EncodeTiledFn encode = encode_fn();
  if (encode == nullptr) return who + ": cuTensorMapEncodeTiled not available";
  const Sm90PreparedShape& s = args.shape;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(s.k), static_cast<cuuint64_t>(args.a_rows_capacity)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(s.k) * 2};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(sm90::kBlockK), static_cast<cuuint32_t>(block_t)};
  const cuuint32_t estr[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(args.a), dims, strides,
                            box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return who + ": cuTensorMapEncodeTiled failed: " + std::to_string(r);
  return "";
}

sm90::GemmParams make_params(const Sm90GemmArgs& args) {
  const Sm90PreparedShape& s = args.shape;
  sm90::GemmParams p;
  p.w = args.w;
  p.offsets = args.offsets;
  p.alpha0 = args.alpha0;
  p.alpha1 = args.alpha1;
  p.gs = args.epilogue == Sm90GemmEpilogue::kF32 ? nullptr : args.gs;
  p.out = args.out;
  p.num_experts = s.num_experts;
  p.units = s.units;
  p.k_tiles = s.k_tiles;
  p.n_out = s.gated ? s.n / 2 : s.n;
  p.tile_counter = args.tile_counter;  // read by the plain tile kernel only (its DYNAMIC_OK walks)
  p.consumer_stagger_ns = args.consumer_stagger_ns;  // read by the plain tile kernel only
  if (args.a_gather_src != nullptr) {  // read by the plain tile kernel only (the others refuse it)
    p.gather_src = args.a_gather_src;
    p.gather_perm = args.a_gather_perm;
    p.gather_src_rows = static_cast<int>(args.a_gather_src_rows);
    p.gather_k = s.k;
    p.gather_top_k = args.a_gather_top_k;
    p.gather_perm_experts = args.a_gather_perm_experts < 0 ? s.num_experts : args.a_gather_perm_experts;
    p.gather_shared_base = static_cast<int>(args.a_gather_shared_row_base);
  }
  return p;
}

cudaError_t device_sm_count(int* sms) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
  return e;
}

// Whether the quantizing kernels' contiguous piece ranges (kBroadcastQuantized, kRoutedTokensQuantized: CTA b runs
// pieces [b P / C, (b + 1) P / C) of P = routed experts x pieces an expert) each span at most kWsMaxQuantRows
// experts: a range of L pieces spans at most 1 + ceil((L - 1) / pieces an expert), L <= ceil(P / C).
bool contiguous_ranges_within_two_experts(const Sm90GemmConfig& config, int units, int routed_experts, int num_sms) {
  if (units < 1 || routed_experts < 0 || num_sms < 1) return false;
  const int64_t per_expert = static_cast<int64_t>(units) * (4 / config.slices_per_warp);
  // The kernel's range arithmetic is 32-bit (ws_contiguous_piece_range): pieces x CTAs <= UINT32_MAX, checked by
  // division (the product of three ints can overflow int64).
  const int64_t max_pieces = static_cast<int64_t>(UINT32_MAX) / num_sms;
  if (per_expert > max_pieces || routed_experts > max_pieces / per_expert) return false;
  const int64_t longest = (routed_experts * per_expert + num_sms - 1) / num_sms;
  return longest <= 1 || 1 + (longest - 1 + per_expert - 1) / per_expert <= sm90::kWsMaxQuantRows;
}

}  // namespace

int sm90_broadcast_row_max_k(const Sm90GemmConfig& config, bool quantized_rows) {
  return sm90_resident_rows_max_k(config, quantized_rows ? 1 + sm90::kWsMaxQuantRows : 1);
}

int sm90_resident_rows_max_k(const Sm90GemmConfig& config, int rows) {
  if (!config.warp_stream || rows < 1) return 0;
#define NVFP4MOE_X(warps, depth, spw, unrolled, bpw)                                                                \
  if (is_warp_stream_config(config, warps, depth, spw, unrolled != 0, bpw)) {                                      \
    using Tr = sm90::WarpStreamTraits<warps, depth, spw, unrolled != 0, sm90::Epilogue::kSwiGLU, bpw, true>;     \
    return (sm90::kMaxSmemPerBlock - Tr::kSmemBytes) / (rows * Tr::resident_row_bytes(1)) * sm90::kBlockK;      \
  }
  NVFP4MOE_SM90_WARP_STREAM_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
  return 0;
}

bool sm90_one_token_route_available(const Sm90GemmConfig& config, Sm90GemmEpilogue epilogue, bool broadcast_row) {
  if (!config.warp_stream || broadcast_row != (epilogue != Sm90GemmEpilogue::kF32)) return false;
#define NVFP4MOE_X(warps, depth, spw, unrolled, bpw)                                             \
  if (is_warp_stream_config(config, warps, depth, spw, unrolled != 0, bpw))                     \
    return one_token_route_instantiated(warps, depth, spw, unrolled != 0, bpw, broadcast_row);
  NVFP4MOE_SM90_WARP_STREAM_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
  return false;
}

bool sm90_broadcast_quant_rows_fit(const Sm90GemmConfig& config, int units, int routed_experts, int num_sms) {
  if (!sm90_one_token_route_available(config, Sm90GemmEpilogue::kSwiGLU, true) || units < 1 || routed_experts < 0 ||
      num_sms < 1)
    return false;
  return contiguous_ranges_within_two_experts(config, units, routed_experts, num_sms);
}

bool sm90_token_rows_route_available(const Sm90GemmConfig& config) {
  if (!config.warp_stream) return false;
#define NVFP4MOE_X(warps, depth, spw, unrolled, bpw)                   \
  if (is_warp_stream_config(config, warps, depth, spw, unrolled != 0, bpw)) \
    return token_rows_route_instantiated(warps, depth, spw, unrolled != 0, bpw);
  NVFP4MOE_SM90_WARP_STREAM_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
  return false;
}

bool sm90_token_rows_route_fits(const Sm90GemmConfig& config, int tokens, int experts, int top_k, int k) {
  if (!sm90_token_rows_route_available(config) || tokens < 2 || tokens > kSm90RoutedTokensMax || experts < 1 ||
      experts > kMaxExperts || top_k < 1 || top_k > experts || tokens * top_k > 32 || k < 1 ||
      k > sm90_resident_rows_max_k(config, tokens))
    return false;
#define NVFP4MOE_X(warps, depth, spw, unrolled, bpw)                                                          \
  if (is_warp_stream_config(config, warps, depth, spw, unrolled != 0, bpw)) {                                  \
    using TrRow = sm90::WarpStreamTraits<warps, depth, spw, unrolled != 0, sm90::Epilogue::kSwiGLU, bpw, true>; \
    return tokens * kernels::block_route_stride(experts) <= TrRow::kThreads &&                                \
           sm90::token_rows_route_scratch_bytes(tokens, experts, top_k) <= TrRow::kHandoffOffset;             \
  }
  NVFP4MOE_SM90_WARP_STREAM_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
  return false;
}

bool sm90_token_rows_quant_fits(const Sm90GemmConfig& config, int tokens, int experts, int top_k, int k, int units,
                                bool append_shared, int num_sms) {
  if (!sm90_token_rows_route_fits(config, tokens, experts, top_k, k) ||
      k > sm90_resident_rows_max_k(config, sm90::kWsTokenQuantRowsPerToken * tokens) || units < 1 || num_sms < 1)
    return false;
  // (fewer experts, e.g. tokens sharing them, make fewer pieces: the most the tokens reach is the worst case)
  const int routed = std::min(tokens * top_k, experts) + (append_shared ? 1 : 0);
  return contiguous_ranges_within_two_experts(config, units, routed, num_sms);
}

bool sm90_one_token_route_fits(const Sm90GemmConfig& config, int experts, int top_k) {
  if (!config.warp_stream || experts < 1 || experts > kMaxExperts || top_k < 1 || top_k > 32 || top_k > experts)
    return false;
#define NVFP4MOE_X(warps, depth, spw, unrolled, bpw)                                                            \
  if (is_warp_stream_config(config, warps, depth, spw, unrolled != 0, bpw)) {                                    \
    using Tr = sm90::WarpStreamTraits<warps, depth, spw, unrolled != 0, sm90::Epilogue::kF32, bpw, false>;     \
    using TrRow = sm90::WarpStreamTraits<warps, depth, spw, unrolled != 0, sm90::Epilogue::kF32, bpw, true>;   \
    return kernels::block_route_stride(experts) <= Tr::kThreads &&                                             \
           sm90::one_token_route_scratch_bytes(experts, top_k) <= std::min(Tr::kHandoffOffset, TrRow::kHandoffOffset); \
  }
  NVFP4MOE_SM90_WARP_STREAM_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
  return false;
}

namespace {
cudaError_t grouped_gemm_impl(const Sm90GemmArgs& args, const Sm90GemmConfig& config, cudaStream_t stream,
                              int num_sms) {
  const std::string who = "sm90_nvfp4_grouped_gemm";
  if (std::string m = check_args(args, who); !m.empty()) return fail(m);
  if (args.tile_counter != nullptr && (reinterpret_cast<uintptr_t>(args.tile_counter) & 3) != 0)
    return fail(who + ": tile_counter must be a 4-byte aligned device int32 (zero before the first launch)");
  if (args.consumer_stagger_ns < 0 || args.consumer_stagger_ns > kSm90MaxConsumerStaggerNs)
    return fail(who + ": consumer_stagger_ns must be in [0, " + std::to_string(kSm90MaxConsumerStaggerNs) +
                "], got " + std::to_string(args.consumer_stagger_ns));
  if (args.a_broadcast_row && (!config.warp_stream || args.a_gather_src != nullptr))
    return fail(who + ": a_broadcast_row: only the warp-streaming configs read a broadcast row (config " +
                to_string(config) + (args.a_gather_src != nullptr ? ", and not with a_gather_src)" : ")"));
  if (args.a_broadcast_row && args.shape.k > sm90_broadcast_row_max_k(config))
    return fail(who + ": a_broadcast_row: shape.k = " + std::to_string(args.shape.k) + " exceeds " +
                std::to_string(sm90_broadcast_row_max_k(config)) + ", the longest row config " + to_string(config) +
                " keeps in shared memory beside its weight rings");
  if (args.a_routed_token_rows && args.read_token_ids)
    return fail(who + ": a_routed_token_rows (GEMM1) and read_token_ids (GEMM2) together");
  if (args.a_routed_token_quant_gs != nullptr && !args.a_routed_token_rows)
    return fail(who + ": a_routed_token_quant_gs: only with a_routed_token_rows (GEMM1 at T = 2 .. " +
                std::to_string(kSm90RoutedTokensMax) + " routing its tokens); got a_routed_token_rows = false");
  if (args.read_token_ids && (args.one_token_route == nullptr || !sm90_token_rows_route_available(config)))
    return fail(who + ": read_token_ids: only with a read_ids one_token_route and a config with its kernels "
                      "(sm90_token_rows_route_available; config " + to_string(config) + ", one_token_route " +
                (args.one_token_route == nullptr ? "null)" : "set)"));
  if (args.a_routed_token_rows && (args.one_token_route == nullptr || !sm90_token_rows_route_available(config)))
    return fail(who + ": a_routed_token_rows: only with a routing one_token_route and a config with its kernels "
                      "(sm90_token_rows_route_available; config " + to_string(config) + ", one_token_route " +
                (args.one_token_route == nullptr ? "null)" : "set)"));
  if (args.one_token_route != nullptr) {
    if (std::string m = check_one_token_route(args, config, who); !m.empty()) return fail(m);
  }
  const sm90::GemmParams p = make_params(args);
  if (num_sms <= 0)
    if (const cudaError_t e = device_sm_count(&num_sms); e != cudaSuccess) return e;
  if (args.a_broadcast_quant_gs != nullptr) {
    if (!args.a_broadcast_row || args.one_token_route == nullptr || args.one_token_route->read_ids)
      return fail(who + ": a_broadcast_quant_gs: only with a_broadcast_row and a routing one_token_route (GEMM1 at "
                        "T = 1); got a_broadcast_row = " + (args.a_broadcast_row ? "true" : "false") +
                  ", one_token_route " + (args.one_token_route == nullptr ? "null" : "with read_ids"));
    if (args.shape.k > sm90_broadcast_row_max_k(config, true))
      return fail(who + ": a_broadcast_quant_gs: shape.k = " + std::to_string(args.shape.k) + " exceeds " +
                  std::to_string(sm90_broadcast_row_max_k(config, true)) + ", the longest row whose raw and two "
                  "quantized copies config " + to_string(config) + " keeps beside its weight rings");
    const int routed = args.one_token_route->route.top_k + (args.one_token_route->plan.append_shared ? 1 : 0);
    if (!sm90_broadcast_quant_rows_fit(config, args.shape.units, routed, num_sms))
      return fail(who + ": a_broadcast_quant_gs: " + std::to_string(routed) + " routed experts of " +
                  std::to_string(args.shape.units) + " units on " + std::to_string(num_sms) + " CTAs of config " +
                  to_string(config) + " put more than two experts' pieces on a CTA (sm90_broadcast_quant_rows_fit)");
  }
  if (args.a_routed_token_quant_gs != nullptr && args.one_token_route->route.tokens != 0) {
    const Sm90OneTokenRoute& r = *args.one_token_route;
    const int routed = std::min(r.route.tokens * r.route.top_k, r.route.experts) + (r.plan.append_shared ? 1 : 0);
    if (!contiguous_ranges_within_two_experts(config, args.shape.units, routed, num_sms))
      return fail(who + ": a_routed_token_quant_gs: up to " + std::to_string(routed) + " routed experts of " +
                  std::to_string(args.shape.units) + " units on " + std::to_string(num_sms) + " CTAs of config " +
                  to_string(config) + " put more than two experts' pieces on a CTA (sm90_token_rows_quant_fits)");
  }
  if (config.warp_stream) {  // no TMA: every warp copies its own rows; its pieces are spread statically
#define NVFP4MOE_X(warps, depth, spw, unrolled, bpw)                                                  \
    if (is_warp_stream_config(config, warps, depth, spw, unrolled != 0, bpw))                           \
      return args.a_routed_token_rows && args.a_routed_token_quant_gs != nullptr                        \
                 ? launch_warp_stream_epi<warps, depth, spw, unrolled != 0, bpw,                        \
                                          sm90::WsRows::kRoutedTokensQuantized>(args, p, num_sms, stream) \
             : args.a_routed_token_rows                                                                 \
                 ? launch_warp_stream_epi<warps, depth, spw, unrolled != 0, bpw,                        \
                                          sm90::WsRows::kRoutedTokens>(args, p, num_sms, stream)        \
             : args.read_token_ids                                                                      \
                 ? launch_warp_stream_epi<warps, depth, spw, unrolled != 0, bpw,                        \
                                          sm90::WsRows::kDirectTokenIds>(args, p, num_sms, stream)      \
             : args.a_broadcast_quant_gs != nullptr                                                     \
                 ? launch_warp_stream_epi<warps, depth, spw, unrolled != 0, bpw,                        \
                                          sm90::WsRows::kBroadcastQuantized>(args, p, num_sms, stream)  \
             : args.a_broadcast_row                                                                     \
                 ? launch_warp_stream_epi<warps, depth, spw, unrolled != 0, bpw, sm90::WsRows::kBroadcast>( \
                       args, p, num_sms, stream)                                                        \
             : args.a_gather_src != nullptr                                                             \
                 ? launch_warp_stream_epi<warps, depth, spw, unrolled != 0, bpw, sm90::WsRows::kGathered>(  \
                       args, p, num_sms, stream)                                                        \
                 : launch_warp_stream_epi<warps, depth, spw, unrolled != 0, bpw, sm90::WsRows::kDirect>(    \
                       args, p, num_sms, stream);
    NVFP4MOE_SM90_WARP_STREAM_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
    return fail(who + ": config " + to_string(config) + " is not in the instantiated list");
  }
#define NVFP4MOE_SM90_TILE_CONFIG_IS(bt, st, wgs, wpu, sync)                                        \
  (config.block_t == bt && config.stages == st && config.consumer_warpgroups == wgs && \
   config.warpgroups_per_unit == wpu && config.mma_sync == (sync != 0))
  if (args.a_gather_src != nullptr) {  // the producer warps copy A: no descriptor
    const CUtensorMap unused{};
#define NVFP4MOE_X(bt, st, wgs, wpu, sync)                                                              \
    if (NVFP4MOE_SM90_TILE_CONFIG_IS(bt, st, wgs, wpu, sync))                                           \
      return launch_epi<bt, st, wgs, wpu, sync != 0, true>(args.epilogue, unused, p, num_sms, stream);
    NVFP4MOE_SM90_GATHER_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
    return fail(who + ": a_gather_src: config " + to_string(config) +
                " has no gathered-A kernel (sm90_gather_configs())");
  }
  CUtensorMap map;
  if (std::string m = make_a_map(args, config.block_t, &map, who); !m.empty()) return fail(m);
  if (args.mixed_last_pass && sm90_mixed_last_pass_available(config, args.epilogue)) {
    CUtensorMap tail_map;  // the same A in boxes of the narrow token tile's rows
    if (std::string m = make_a_map(args, sm90::kMixedTailRows, &tail_map, who); !m.empty()) return fail(m);
    const bool swiglu = args.epilogue == Sm90GemmEpilogue::kSwiGLU;
#define NVFP4MOE_X(bt, st, wgs, wpu, sync)                                                                   \
    if (NVFP4MOE_SM90_TILE_CONFIG_IS(bt, st, wgs, wpu, sync))                                                \
      return swiglu ? launch_mixed<bt, st, wgs, sm90::Epilogue::kSwiGLU>(map, tail_map, p, num_sms, stream) \
                    : launch_mixed<bt, st, wgs, sm90::Epilogue::kF32>(map, tail_map, p, num_sms, stream);
    NVFP4MOE_SM90_MIXED_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
  }
#define NVFP4MOE_X(bt, st, wgs, wpu, sync)                                                              \
  if (NVFP4MOE_SM90_TILE_CONFIG_IS(bt, st, wgs, wpu, sync))                                             \
    return launch_epi<bt, st, wgs, wpu, sync != 0, false>(args.epilogue, map, p, num_sms, stream);
  NVFP4MOE_SM90_GEMM_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
#undef NVFP4MOE_SM90_TILE_CONFIG_IS
  return fail(who + ": config " + to_string(config) + " is not in the instantiated list");
}


// Every call's message is its own: a launch that fails in the CUDA runtime (a kernel attribute, the launch itself,
// the device query) reports that error and the config, not the reason of an earlier refused call (1c1aa36's device
// run printed a chained launch's refusal under an SS kernel's failed launch).
cudaError_t with_own_message(const std::string& who, const Sm90GemmConfig& config, cudaError_t e) {
  if (e != cudaSuccess && g_last_error.empty())
    g_last_error = who + ": config " + to_string(config) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                   ")";
  return e;
}
}  // namespace

cudaError_t sm90_nvfp4_grouped_gemm(const Sm90GemmArgs& args, const Sm90GemmConfig& config, cudaStream_t stream,
                                    int num_sms) {
  g_last_error.clear();
  return with_own_message("sm90_nvfp4_grouped_gemm", config, grouped_gemm_impl(args, config, stream, num_sms));
}

#define NVFP4MOE_X(bt, st, wgs, wpu, sync) Sm90GemmConfig{bt, st, wgs, wpu, sync != 0},
const std::vector<Sm90GemmConfig>& sm90_chained_configs() {
  static const std::vector<Sm90GemmConfig> list = {NVFP4MOE_SM90_CHAINED_CONFIGS(NVFP4MOE_X)};
  return list;
}

const std::vector<Sm90GemmConfig>& sm90_gather_configs() {
  static const std::vector<Sm90GemmConfig> list = {NVFP4MOE_SM90_GATHER_CONFIGS(NVFP4MOE_X)};
  return list;
}
#undef NVFP4MOE_X

namespace {
bool listed(const std::vector<Sm90GemmConfig>& list, const Sm90GemmConfig& c) {
  return std::find(list.begin(), list.end(), c) != list.end();
}
}  // namespace

const std::vector<Sm90GemmConfig>& sm90_mixed_last_pass_configs() {
#define NVFP4MOE_X(bt, st, wgs, wpu, sync) Sm90GemmConfig{bt, st, wgs, wpu, sync != 0},
  static const std::vector<Sm90GemmConfig> list = {NVFP4MOE_SM90_MIXED_CONFIGS(NVFP4MOE_X)};
#undef NVFP4MOE_X
  return list;
}
bool sm90_mixed_last_pass_available(const Sm90GemmConfig& c, Sm90GemmEpilogue epilogue) {
  return epilogue != Sm90GemmEpilogue::kRelu2 && listed(sm90_mixed_last_pass_configs(), c);
}
bool sm90_chained_available(const Sm90GemmConfig& c) { return listed(sm90_chained_configs(), c); }
bool sm90_gather_available(const Sm90GemmConfig& c) { return c.warp_stream || listed(sm90_gather_configs(), c); }

namespace {
cudaError_t chained_gemms_impl(const Sm90GemmArgs& gemm1, const Sm90GemmArgs& gemm2, const Sm90GemmConfig& config,
                               int32_t* chain_counters, cudaStream_t stream, int num_sms) {
  const std::string who = "sm90_nvfp4_chained_gemms";
  if (std::string m = check_args(gemm1, who + " (gemm1)"); !m.empty()) return fail(m);
  if (std::string m = check_args(gemm2, who + " (gemm2)"); !m.empty()) return fail(m);
  if (gemm1.epilogue == Sm90GemmEpilogue::kF32 || gemm2.epilogue != Sm90GemmEpilogue::kF32)
    return fail(who + ": gemm1 needs an activation epilogue (SwiGLU or relu^2) and gemm2 the f32 one");
  if (gemm1.offsets != gemm2.offsets || gemm1.shape.num_experts != gemm2.shape.num_experts)
    return fail(who + ": gemm1 and gemm2 must share the offsets and the expert count (got E = " +
                std::to_string(gemm1.shape.num_experts) + " and " + std::to_string(gemm2.shape.num_experts) + ")");
  const int n_out1 = gemm1.shape.gated ? gemm1.shape.n / 2 : gemm1.shape.n;
  if (gemm2.a != gemm1.out || gemm2.shape.k != n_out1)
    return fail(who + ": gemm2 must read gemm1's output (gemm2.a == gemm1.out, gemm2 K = " + std::to_string(n_out1) +
                "; got K = " + std::to_string(gemm2.shape.k) + ")");
  if (gemm1.a_gather_src != nullptr || gemm2.a_gather_src != nullptr || gemm1.a_broadcast_row ||
      gemm2.a_broadcast_row || gemm1.a_broadcast_quant_gs != nullptr || gemm2.a_broadcast_quant_gs != nullptr ||
      gemm1.a_routed_token_rows || gemm2.a_routed_token_rows || gemm1.read_token_ids || gemm2.read_token_ids ||
      gemm1.a_routed_token_quant_gs != nullptr || gemm2.a_routed_token_quant_gs != nullptr)
    return fail(who + ": a_gather_src / a_broadcast_row / a_broadcast_quant_gs / a_routed_token_rows / "
                      "a_routed_token_quant_gs / read_token_ids: a chained launch reads A through its TMA descriptors "
                      "only");
  if (chain_counters == nullptr || (reinterpret_cast<uintptr_t>(chain_counters) & 3) != 0)
    return fail(who + ": chain_counters must be a 4-byte aligned device buffer of sm90_chain_counter_count(E) int32");
  CUtensorMap map1, map2;
  if (std::string m = make_a_map(gemm1, config.block_t, &map1, who); !m.empty()) return fail(m);
  if (std::string m = make_a_map(gemm2, config.block_t, &map2, who); !m.empty()) return fail(m);
  // A chain's tiles follow the static order (its GEMM2 tiles wait for GEMM1 tiles of other CTAs): the chained
  // kernel's walks are compiled without the dynamic schedule, so a counter in the arguments is never read (nor
  // a consumer stagger: the chained kernel starts its consumers together).
  const sm90::GemmParams p1 = make_params(gemm1), p2 = make_params(gemm2);
  int device_sms = 0;
  if (const cudaError_t e = device_sm_count(&device_sms); e != cudaSuccess) return e;
  if (num_sms <= 0) num_sms = device_sms;
  const bool relu2 = gemm1.epilogue == Sm90GemmEpilogue::kRelu2;
#define NVFP4MOE_X(bt, st, wgs, wpu, sync)                                                                          \
  if (config.block_t == bt && config.stages == st && config.consumer_warpgroups == wgs &&                         \
      config.warpgroups_per_unit == wpu && config.mma_sync == (sync != 0))                                         \
    return relu2 ? launch_chained<bt, st, wgs, wpu, sync != 0, sm90::Epilogue::kRelu2>(                            \
                       map1, map2, p1, p2, chain_counters, num_sms, device_sms, stream)                           \
                 : launch_chained<bt, st, wgs, wpu, sync != 0, sm90::Epilogue::kSwiGLU>(                           \
                       map1, map2, p1, p2, chain_counters, num_sms, device_sms, stream);
  NVFP4MOE_SM90_CHAINED_CONFIGS(NVFP4MOE_X)
#undef NVFP4MOE_X
  return fail(who + ": config " + to_string(config) + " has no chained kernel (sm90_chained_configs())");
}
}  // namespace

cudaError_t sm90_nvfp4_chained_gemms(const Sm90GemmArgs& gemm1, const Sm90GemmArgs& gemm2,
                                     const Sm90GemmConfig& config, int32_t* chain_counters, cudaStream_t stream,
                                     int num_sms) {
  g_last_error.clear();
  return with_own_message("sm90_nvfp4_chained_gemms", config,
                          chained_gemms_impl(gemm1, gemm2, config, chain_counters, stream, num_sms));
}

}  // namespace nvfp4moe::cuda
