// `nvfp4moe bench`: the whole layer (routing .. combine) on the cuda backend, timed as the benchmark protocol
// (../shared/docs/benchmarks.md) asks: per token count T, ONE CUDA graph holding forward() of L >= 8 distinct
// layers (each its own random weights, hidden input and router logits, so nothing a replay reads is still in
// L2 from the previous one), warm-up, then >= 50 replays each between two CUDA events; median / L (and
// p10 / p90) per layer, with the bytes the layer must read and the FLOPs it must do (bench.h).
#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/bench.h"
#include "cli/cli_common.h"
#include "cpu/reference.h"
#include "format/nvfp4.h"
#include "nvfp4moe/error.h"

#ifdef NVFP4MOE_WITH_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "cuda/cuda_layer.h"
#endif

namespace nvfp4moe::cli {

Command add_bench_command(CLI::App& parent);

namespace {

using nlohmann::json;
using bench::RoutingKind;

// Layer l's router-logits seed (uniform + 0 and skewed + 1 as before balanced existed, so earlier runs repeat).
uint64_t logits_seed(uint64_t seed, int l, RoutingKind rk) {
  return seed * 104729ull + static_cast<uint64_t>(l) * 31 + static_cast<uint64_t>(rk);
}
// A routing's share of the time budget (per mode): the near-uniform case is the protocol's main one.
double budget_share(RoutingKind r) { return r == RoutingKind::Uniform ? 1.0 : 0.5; }

// ------------------------------------------------------------------ options and their checks
constexpr int kMaxBenchLayers = 256;  // --layers

struct BenchOpts {
  std::string preset;
  int64_t hidden = 0, intermediate = 0, experts = 0, top_k = 0, shared_intermediate = 0;
  std::string activation = "swiglu", routing_fn = "softmax";
  int64_t n_group = 1, topk_group = 1;
  double scaling = 1.0;  // double: a value past the float range is refused, not turned into inf
  std::string tokens = "1,4,16,64,256,1024,4096,16384";
  std::string modes = "w4a16";
  std::string routings = "uniform";
  int layers = 8;
  int iters = 50;
  int warmup = 3;
  double time_budget = 0;  // seconds, 0 = none
  std::string json_path;
  std::string git_sha;
  uint64_t seed = 1;
  int device = 0;
  std::string out_dtype = "bf16";
  bool shared_max_input_scale = false;  // MoeLayerOptions::shared_max_input_scale (FlashInfer's one scale per GEMM)
  bool dry_run = false;
  bool profile_eager = false;  // the first point's eager forward inside cudaProfilerStart / Stop
};

struct BenchPlan {
  std::string preset_name;  // "custom" for explicit dims
  MoeSpec spec;
  std::vector<int64_t> tokens;  // ascending, distinct
  std::vector<Mode> modes;
  std::vector<RoutingKind> routings;
  int out_bytes = 2;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else if (c != ' ') {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

BenchPlan make_plan(const BenchOpts& o, bool dims_given) {
  BenchPlan p;
  if (!o.preset.empty()) {
    NVFP4MOE_CHECK(!dims_given, ArgumentError,
                   "--preset ", o.preset, " and explicit dims (--hidden/--intermediate/--experts/--top-k/...) "
                   "exclude each other; give one of the two");
    std::string names;
    for (const auto& pr : bench::presets()) {
      names += (names.empty() ? "" : ", ") + std::string(pr.name);
      if (o.preset == pr.name) {
        p.preset_name = pr.name;
        p.spec = pr.spec;
      }
    }
    NVFP4MOE_CHECK(!p.preset_name.empty(), ArgumentError, "--preset: unknown preset '", o.preset,
                   "' (expected one of: ", names, ")");
  } else {
    NVFP4MOE_CHECK(o.hidden > 0 && o.intermediate > 0 && o.experts > 0 && o.top_k > 0, ArgumentError,
                   "give --preset NAME or all of --hidden, --intermediate, --experts, --top-k (got hidden=", o.hidden,
                   " intermediate=", o.intermediate, " experts=", o.experts, " top-k=", o.top_k, ")");
    p.preset_name = "custom";
    MoeSpec s = bench::softmax_spec(o.hidden, o.intermediate, o.experts, o.top_k);
    s.activation = o.activation == "relu2" ? Activation::Relu2 : Activation::SwiGLU;
    if (o.routing_fn == "sigmoid-grouped") {
      s.routing = Routing::SigmoidGroupedTopK;
      s.n_group = o.n_group;
      s.topk_group = o.topk_group;
      s.routed_scaling_factor = scaling_from_flag(o.scaling);
      s.has_router_bias = true;
    }
    s.shared_intermediate = o.shared_intermediate;
    s.validate();
    p.spec = s;
  }
  NVFP4MOE_CHECK(p.spec.hidden % 16 == 0 && p.spec.intermediate % 16 == 0, ArgumentError,
                 "dims: the cuda backend needs hidden and intermediate % 16 == 0, got ", p.spec.hidden, ", ",
                 p.spec.intermediate);

  for (const std::string& t : split_list(o.tokens)) {
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    NVFP4MOE_CHECK(!t.empty() && end && *end == '\0' && v >= 1 && v <= (1 << 20), ArgumentError,
                   "--tokens: expected a comma-separated list of integers in [1, 1048576], got '", t, "' in '",
                   o.tokens, "'");
    p.tokens.push_back(v);
  }
  std::sort(p.tokens.begin(), p.tokens.end());
  p.tokens.erase(std::unique(p.tokens.begin(), p.tokens.end()), p.tokens.end());
  NVFP4MOE_CHECK(p.tokens.back() * p.spec.top_k < (int64_t(1) << 30), ArgumentError,
                 "--tokens: the largest T times top_k must be < 2^30, got ", p.tokens.back(), " x ", p.spec.top_k);

  for (const std::string& m : split_list(o.modes)) {
    Mode mode;
    NVFP4MOE_CHECK(mode_from_name(m, &mode), ArgumentError, "--mode: expected w4a16 and/or w4a4 (comma-separated), got '",
                   m, "' in '", o.modes, "'");
    if (std::find(p.modes.begin(), p.modes.end(), mode) == p.modes.end()) p.modes.push_back(mode);
  }
  for (const std::string& r : split_list(o.routings)) {
    NVFP4MOE_CHECK(r == "uniform" || r == "skewed" || r == "balanced", ArgumentError,
                   "--routing: expected uniform, skewed and/or balanced (comma-separated), got '", r, "' in '",
                   o.routings, "'");
    const RoutingKind k = r == "uniform" ? RoutingKind::Uniform
                          : r == "skewed" ? RoutingKind::Skewed
                                          : RoutingKind::Balanced;
    if (std::find(p.routings.begin(), p.routings.end(), k) == p.routings.end()) p.routings.push_back(k);
  }
  // --profile-eager profiles one eager forward of layer 0, which the stack's size does not change: there fewer
  // layers may be asked for (a profile of a shape whose 8 layers do not fit the card), and the timings that still
  // follow are marked as outside the protocol (doc "layers_below_protocol", a note on stderr).
  const int min_layers = o.profile_eager ? 1 : 8;
  NVFP4MOE_CHECK(o.layers >= min_layers, ArgumentError, "--layers: the protocol needs >= 8 distinct layers per "
                 "replay (so the L2 cannot hold what a replay reads; with --profile-eager >= 1), got ", o.layers);
  // Each layer holds its own host router logits [max T, E] (and device weights): a bound, not an unchecked count.
  NVFP4MOE_CHECK(o.layers <= kMaxBenchLayers, ArgumentError, "--layers: expected ", min_layers, "..", kMaxBenchLayers,
                 " distinct layers per replay, got ", o.layers);
  NVFP4MOE_CHECK(o.iters >= 1, ArgumentError, "--iters: expected >= 1 timed replays (the protocol: >= 50), got ", o.iters);
  NVFP4MOE_CHECK(o.iters <= 100000, ArgumentError, "--iters: expected at most 100000 timed replays, got ", o.iters);
  NVFP4MOE_CHECK(o.warmup >= 1 && o.warmup <= 10000, ArgumentError, "--warmup: expected 1..10000, got ", o.warmup);
  NVFP4MOE_CHECK(o.time_budget >= 0, ArgumentError, "--time-budget: expected seconds >= 0 (0 = none), got ",
                 o.time_budget);
  p.out_bytes = o.out_dtype == "f32" ? 4 : 2;

  if (!o.json_path.empty()) {
    struct stat st{};
    if (stat(o.json_path.c_str(), &st) == 0)
      NVFP4MOE_CHECK(!S_ISDIR(st.st_mode), ArgumentError, "--json ", o.json_path, " is a directory; give a file name");
    const size_t slash = o.json_path.find_last_of('/');
    const std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : o.json_path.substr(0, slash));
    NVFP4MOE_CHECK(stat(parent.c_str(), &st) == 0 && S_ISDIR(st.st_mode), ArgumentError, "--json ", o.json_path,
                   ": directory '", parent, "' does not exist");
  }
  return p;
}

json dims_json(const MoeSpec& s) {
  return {{"hidden", s.hidden},
          {"intermediate", s.intermediate},
          {"experts", s.num_experts},
          {"top_k", s.top_k},
          {"activation", activation_name(s.activation)},
          {"routing_fn", routing_name(s.routing)},
          {"n_group", s.n_group},
          {"topk_group", s.topk_group},
          {"shared_intermediate", s.shared_intermediate}};
}

// ------------------------------------------------------------------ host-side inputs of one layer
struct HostLayerInputs {
  std::vector<float> router_bias;  // the layer's e_score_correction_bias (empty without one)
  std::vector<float> logits;       // [maxT, E] of the current routing kind
};

// Mean accounting over the L layers for the first T tokens of each layer's logits (routed on the host with
// cpu::route exactly as the layer routes them).
struct PointAccounting {
  double bytes = 0, flops = 0, experts_mean = 0, code_bytes = 0, scale_bytes = 0, shared_bytes = 0, act_bytes = 0;
  int64_t experts_min = 0, experts_max = 0;
  bool includes_shared = false;
};

PointAccounting account_point(const MoeSpec& spec, const std::vector<HostLayerInputs>& layers, int64_t T,
                              int out_bytes) {
  PointAccounting pa;
  pa.experts_min = spec.num_experts;
  std::vector<bench::Accounting> per(layers.size());
  const int64_t n_layers = static_cast<int64_t>(layers.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t li = 0; li < n_layers; ++li) {  // cpu::route of one layer at T = 16384 is ~0.1 s: thread it
    const HostLayerInputs& l = layers[static_cast<size_t>(li)];
    std::vector<int32_t> ids(static_cast<size_t>(T * spec.top_k));
    std::vector<float> wts(ids.size());
    cpu::route(spec, l.logits.data(), l.router_bias.empty() ? nullptr : l.router_bias.data(), T, ids.data(), wts.data());
    per[static_cast<size_t>(li)] = bench::account(spec, T, ids.data(), out_bytes);
  }
  for (const bench::Accounting& a : per) {
    pa.bytes += static_cast<double>(a.bytes);
    pa.flops += a.flops;
    pa.code_bytes += static_cast<double>(a.weight_code_bytes);
    pa.scale_bytes += static_cast<double>(a.weight_scale_bytes);
    pa.shared_bytes += static_cast<double>(a.shared_bytes);
    pa.act_bytes += static_cast<double>(a.activation_bytes);
    pa.experts_mean += static_cast<double>(a.experts_touched);
    pa.experts_min = std::min(pa.experts_min, a.experts_touched);
    pa.experts_max = std::max(pa.experts_max, a.experts_touched);
    pa.includes_shared = a.includes_shared;
  }
  const double n = static_cast<double>(std::max<size_t>(layers.size(), 1));
  pa.bytes /= n;
  pa.flops /= n;
  pa.code_bytes /= n;
  pa.scale_bytes /= n;
  pa.shared_bytes /= n;
  pa.act_bytes /= n;
  pa.experts_mean /= n;
  return pa;
}

json row_json(const BenchPlan& p, Mode mode, RoutingKind r, int64_t T, int layers, const PointAccounting& a) {
  json row = {{"preset", p.preset_name},
              {"dims", dims_json(p.spec)},
              {"mode", mode_name(mode)},
              {"routing", bench::routing_kind_name(r)},
              {"tokens", T},
              {"layers", layers},
              {"bytes", a.bytes},
              {"bytes_breakdown",
               {{"weight_codes", a.code_bytes},
                {"block_scales", a.scale_bytes},
                {"of_which_shared_expert", a.shared_bytes},
                {"activations", a.act_bytes}}},
              {"flops", a.flops},
              {"shared_expert_included", a.includes_shared},
              {"experts_touched", a.experts_mean},
              {"experts_touched_min", a.experts_min},
              {"experts_touched_max", a.experts_max}};
  return row;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// Rewrites the whole document after every point (tmp + rename), so a run cut short keeps what it measured.
void write_json(const std::string& path, const json& doc) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    NVFP4MOE_CHECK(f.good(), Error, "--json ", path, ": cannot open ", tmp, " for writing");
    f << doc.dump(1) << "\n";
    NVFP4MOE_CHECK(f.good(), Error, "--json ", path, ": write to ", tmp, " failed");
  }
  NVFP4MOE_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, Error, "--json ", path, ": rename from ", tmp, " failed");
}

json protocol_json() {
  return {{"timing", "one CUDA graph per (mode, routing, T) holding forward() of L distinct layers; CUDA events "
                     "around each replay; warm-up replays first; median, p10, p90 over the timed replays, / L"},
          {"l2", "stack of L distinct layers per replay (own weights, hidden input, router logits and output); "
                 "time / L"},
          {"inputs", "hidden bf16 uniform [-sqrt3, sqrt3) (never zero); router logits N(0,1) (uniform) or N(0,1) "
                     "+ 4 on experts 0..3 (skewed), or +10 + N(0,1)/4 on token t's experts (t k + j) mod E and N(0,1) - 10 "
                     "elsewhere (balanced: every expert T k / E rows); routing runs inside the graph (router_logits "
                     "form)"},
          {"bytes", "mean over the L layers of: e2m1 codes + e4m3 block scales of every routed expert hit at least "
                    "once (distinct experts from cpu::route on the same logits) + the shared expert when present + "
                    "hidden in (bf16) + router logits in (f32) + out (bf16 or f32)"},
          {"flops", "2 * pairs * 3 * H * I (swiglu) or 2 * pairs * 2 * H * I (relu2), pairs = T * k, + the shared "
                    "expert 2 * T * (3|2) * H * Is when present"}};
}

double elapsed_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

#ifdef NVFP4MOE_WITH_CUDA
// ------------------------------------------------------------------ the device part
void ck(cudaError_t e, const char* what) {
  NVFP4MOE_CHECK(e == cudaSuccess, Error, "bench: CUDA ", what, " failed: ", cudaGetErrorName(e), " (",
                 cudaGetErrorString(e), ")");
}

class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes) { ck(cudaMalloc(&p_, std::max<size_t>(bytes, 1)), "cudaMalloc (bench buffers)"); }
  DevBuf(DevBuf&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p_) cudaFree(p_);
  }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

json gpu_json(int device) {
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int sm_khz = 0, mem_khz = 0, rt = 0, drv = 0;
  cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, device);
  cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device);
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  return {{"name", prop.name},
          {"device", device},
          {"sm_count", prop.multiProcessorCount},
          {"cc", std::to_string(prop.major) + "." + std::to_string(prop.minor)},
          {"max_sm_clock_mhz", sm_khz / 1000.0},
          {"max_mem_clock_mhz", mem_khz / 1000.0},
          {"memory_bus_width_bits", prop.memoryBusWidth},
          {"l2_bytes", prop.l2CacheSize},
          {"total_memory_bytes", prop.totalGlobalMem},
          {"cuda_runtime", rt},
          {"cuda_driver", drv},
          {"note", "current SM clocks: see nvidia-smi in the run script's output"}};
}

double percentile(std::vector<double> v, double q) {  // linear interpolation between closest ranks
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

struct DeviceLayer {
  std::unique_ptr<MoeLayer> layer;
  DevBuf hidden, logits, out;
};

void run_on_device(const BenchOpts& o, const BenchPlan& p, json& doc) {
  NVFP4MOE_CHECK(cuda_backend_available(), Error,
                 "bench: no usable CUDA device is present (the bench times the cuda backend; use --dry-run for the "
                 "host-side accounting only)");
  ck(cudaSetDevice(o.device), "cudaSetDevice");
  doc["gpu"] = gpu_json(o.device);
  // Which grouped GEMM produced the numbers (NVFP4MOE_GEMM selects it; refused if unknown, before any work).
  const char* gemm = cuda::gemm_path_name(cuda::gemm_path_from_env());
  doc["gemm"] = gemm;
  std::printf("bench: grouped GEMM %s\n", gemm);
  // A fixed sm90 tile config (A/B of the heuristic), refused here if malformed, recorded with the numbers.
  const char* forced = std::getenv("NVFP4MOE_SM90_CONFIG");
  cuda::sm90_config_override_from_env();  // refused here, before any work, if malformed
  doc["sm90_config_override"] = forced ? forced : "";
  if (forced && forced[0]) std::printf("bench: sm90 tile config fixed by NVFP4MOE_SM90_CONFIG=%s\n", forced);
  // The prefill tiles' consumer stagger (A/B), likewise refused here if malformed and recorded with the numbers.
  const cuda::ConsumerStagger stagger = cuda::consumer_stagger_from_env();
  doc["consumer_stagger_ns"] = {{"gemm1", stagger.gemm1}, {"gemm2", stagger.gemm2}};
  if (stagger.gemm1 != 0 || stagger.gemm2 != 0)
    std::printf("bench: consumer stagger %d ns (GEMM1), %d ns (GEMM2) from NVFP4MOE_CONSUMER_STAGGER_NS\n",
                stagger.gemm1, stagger.gemm2);
  // The opt-in switches still being measured, recorded with the numbers (each layer reads them at creation).
  const bool mixed_last_pass = cuda::env_opt_in("NVFP4MOE_SM90_MIXED_LAST_PASS");
  const bool route_warp_groups = cuda::env_opt_in("NVFP4MOE_ROUTE_WARP_GROUPS");
  doc["mixed_last_pass"] = mixed_last_pass;
  doc["route_warp_kept_groups"] = route_warp_groups;
  if (mixed_last_pass) std::printf("bench: the mixed last prefill pass on (NVFP4MOE_SM90_MIXED_LAST_PASS=1)\n");
  if (route_warp_groups) std::printf("bench: the group selection by one warp on (NVFP4MOE_ROUTE_WARP_GROUPS=1)\n");
  const auto t_start = std::chrono::steady_clock::now();
  const MoeSpec& spec = p.spec;
  const int64_t H = spec.hidden, E = spec.num_experts, maxT = p.tokens.back();

  // Budget shares: uniform 1, skewed / balanced 0.5 per mode; a combination's deadline is cumulative, so time one does
  // not use carries over to the next.
  std::vector<double> deadlines;
  {
    double total = 0;
    for (size_t m = 0; m < p.modes.size(); ++m)
      for (RoutingKind r : p.routings) total += budget_share(r);
    double cum = 0;
    for (size_t m = 0; m < p.modes.size(); ++m)
      for (RoutingKind r : p.routings) {
        cum += budget_share(r);
        deadlines.push_back(o.time_budget > 0 ? o.time_budget * cum / total : 1e30);
      }
  }

  cudaStream_t stream = nullptr;
  ck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(o.iters) + 2, nullptr);
  for (auto& e : ev) ck(cudaEventCreate(&e), "cudaEventCreate");

  size_t combo = 0;
  for (Mode mode : p.modes) {
    const size_t combo_begin = combo;
    try {
      // ---- L distinct layers, each built, uploaded, its host copy freed before the next is built.
      std::vector<DeviceLayer> layers;
      std::vector<HostLayerInputs> host(static_cast<size_t>(o.layers));
      const auto t_build = std::chrono::steady_clock::now();
      int target = o.layers;
      for (int l = 0; l < target; ++l) {
        MoeWeights w = bench::random_bench_weights(spec, o.seed * 1000003ull + static_cast<uint64_t>(l));
        host[static_cast<size_t>(l)].router_bias = w.router_bias;
        MoeLayerOptions opt;
        opt.backend = Backend::Cuda;
        opt.mode = mode;
        opt.max_tokens = maxT;
        opt.device = o.device;
        opt.shared_max_input_scale = o.shared_max_input_scale;
        DeviceLayer d;
        try {
          d.layer = MoeLayer::create(std::move(w), opt);
          d.hidden = DevBuf(static_cast<size_t>(maxT * H) * 2);
          d.logits = DevBuf(static_cast<size_t>(maxT * E) * 4);
          d.out = DevBuf(static_cast<size_t>(maxT * H) * static_cast<size_t>(p.out_bytes));
        } catch (const ArgumentError&) {
          throw;  // a bad option or environment setting (e.g. NVFP4MOE_*): not a question of device memory
        } catch (const Error& e) {
          cudaGetLastError();
          NVFP4MOE_CHECK(l > 0, Error, "bench: one layer of ", p.preset_name, " with max_tokens ", maxT,
                         " does not fit on the device: ", e.what());
          doc["layers_reduced"].push_back({{"mode", mode_name(mode)}, {"requested", o.layers}, {"used", l},
                                           {"reason", std::string("allocation failed: ") + e.what()}});
          target = l;
          break;
        }
        const std::vector<uint16_t> hid = bench::random_hidden(maxT, H, o.seed * 7919ull + static_cast<uint64_t>(l));
        ck(cudaMemcpy(d.hidden.get(), hid.data(), hid.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy (hidden)");
        if (l == 0) {  // does the stack fit? (weights + workspace + buffers of this layer, times L, plus headroom)
          size_t free_b = 0, total_b = 0;
          ck(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
          const size_t per = d.layer->weight_bytes() + d.layer->workspace_bytes() +
                             static_cast<size_t>(maxT * H * (2 + p.out_bytes) + maxT * E * 4) + (size_t(8) << 20);
          const size_t reserve = std::max<size_t>(size_t(2) << 30, total_b / 50);
          const size_t more = free_b > reserve ? (free_b - reserve) / per : 0;
          const int fit = static_cast<int>(std::min<size_t>(static_cast<size_t>(o.layers), 1 + more));
          doc["memory"].push_back({{"mode", mode_name(mode)}, {"per_layer_device_bytes", per},
                                   {"weight_bytes", d.layer->weight_bytes()},
                                   {"workspace_bytes", d.layer->workspace_bytes()}, {"free_after_first", free_b},
                                   {"total", total_b}, {"max_tokens", maxT}});
          if (fit < o.layers) {
            doc["layers_reduced"].push_back({{"mode", mode_name(mode)}, {"requested", o.layers}, {"used", fit},
                                             {"reason", "device memory: per layer " + format_bytes(per) + ", free " +
                                                            format_bytes(free_b)}});
            std::printf("bench: %s %s: %d layers fit in device memory (asked %d)\n", p.preset_name.c_str(),
                        mode_name(mode), fit, o.layers);
            target = fit;
          }
        }
        layers.push_back(std::move(d));
      }
      host.resize(layers.size());
      const int L = static_cast<int>(layers.size());
      std::printf("bench: %s %s: %d layers built and uploaded in %.1f s (%s of weights each)\n", p.preset_name.c_str(),
                  mode_name(mode), L, elapsed_since(t_build), format_bytes(layers[0].layer->weight_bytes()).c_str());
      std::fflush(stdout);

      for (RoutingKind rk : p.routings) {
        const double deadline = deadlines[combo++];
        for (int l = 0; l < L; ++l) {
          host[static_cast<size_t>(l)].logits =
              bench::random_logits(maxT, E, rk, logits_seed(o.seed, l, rk), p.spec.top_k);
          ck(cudaMemcpy(layers[static_cast<size_t>(l)].logits.get(), host[static_cast<size_t>(l)].logits.data(),
                        host[static_cast<size_t>(l)].logits.size() * 4, cudaMemcpyHostToDevice),
             "cudaMemcpy (logits)");
        }
        double last_replay_s = 0;
        int64_t last_T = 0;
        bool dropping = false;
        for (int64_t T : p.tokens) {
          const double now = elapsed_since(t_start);
          const int replays = o.warmup + o.iters;
          const double predicted = last_T ? last_replay_s * static_cast<double>(T) / static_cast<double>(last_T) * replays : 0;
          auto drop = [&](const std::string& why, double est) {
            doc["dropped"].push_back({{"preset", p.preset_name}, {"mode", mode_name(mode)},
                                      {"routing", bench::routing_kind_name(rk)}, {"tokens", T}, {"reason", why},
                                      {"estimated_s", est}, {"budget_s", o.time_budget}});
            std::printf("bench: %s %s %s T=%lld dropped (%s)\n", p.preset_name.c_str(), mode_name(mode),
                        bench::routing_kind_name(rk), static_cast<long long>(T), why.c_str());
            write_json(o.json_path, doc);
          };
          if (dropping) {
            drop("a smaller T already exceeded the time budget", predicted);
            continue;
          }
          if (last_T && now + 0.5 * predicted > deadline) {  // even at half the linear estimate it cannot fit
            dropping = true;
            drop("time budget (predicted from the previous T)", predicted);
            continue;
          }
          const PointAccounting acc = account_point(spec, host, T, p.out_bytes);

          // ---- capture ONE graph: forward() of every layer, each on its own buffers.
          std::vector<TensorRef> hid(static_cast<size_t>(L)), lg(static_cast<size_t>(L)), out(static_cast<size_t>(L));
          std::vector<RoutingArgs> ra(static_cast<size_t>(L));
          for (int l = 0; l < L; ++l) {
            const size_t i = static_cast<size_t>(l);
            hid[i] = TensorRef{layers[i].hidden.get(), DType::BF16, {T, H}, {}, DeviceType::CUDA, o.device};
            lg[i] = TensorRef{layers[i].logits.get(), DType::F32, {T, E}, {}, DeviceType::CUDA, o.device};
            out[i] = TensorRef{layers[i].out.get(), p.out_bytes == 2 ? DType::BF16 : DType::F32, {T, H}, {},
                               DeviceType::CUDA, o.device};
            ra[i].router_logits = &lg[i];
          }
          // Every layer eagerly once at this T: module loading stays out of the capture, and each layer's
          // workspace holds this T's plan and rows, which a measurement build that leaves a launch out of the
          // graph (bench/experiments: x16*) relies on (until the twentieth session only layer 0 ran here).
          // --profile-eager: the first point's eager forward of layer 0 alone is the profiler's range (ncu / nsys
          // with profiling from start off), without the layers' creation-time warm-up launches.
          // (combo counts the (mode, routing) combinations begun: 1 is the first.)
          const bool profiled = o.profile_eager && combo == 1 && T == p.tokens.front();
          for (int l = 0; l < L; ++l) {
            const size_t i = static_cast<size_t>(l);
            if (profiled && l == 0) ck(cudaProfilerStart(), "cudaProfilerStart");
            layers[i].layer->forward(hid[i], ra[i], out[i], stream);
            if (profiled && l == 0) {
              ck(cudaStreamSynchronize(stream), "forward (eager, before capture)");
              ck(cudaProfilerStop(), "cudaProfilerStop");
            }
          }
          ck(cudaStreamSynchronize(stream), "forward (eager, before capture)");
          cudaGraph_t graph = nullptr;
          cudaGraphExec_t exec = nullptr;
          ck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
          try {
            for (int l = 0; l < L; ++l)
              layers[static_cast<size_t>(l)].layer->forward(hid[static_cast<size_t>(l)], ra[static_cast<size_t>(l)],
                                                            out[static_cast<size_t>(l)], stream);
          } catch (...) {
            cudaStreamEndCapture(stream, &graph);
            if (graph) cudaGraphDestroy(graph);
            throw;
          }
          ck(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
          ck(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");

          // ---- first warm-up replay, timed: is there budget for the rest?
          ck(cudaEventRecord(ev[0], stream), "cudaEventRecord");
          ck(cudaGraphLaunch(exec, stream), "cudaGraphLaunch (warm-up)");
          ck(cudaEventRecord(ev[1], stream), "cudaEventRecord");
          ck(cudaEventSynchronize(ev[1]), "graph replay (warm-up)");
          float first_ms = 0;
          ck(cudaEventElapsedTime(&first_ms, ev[0], ev[1]), "cudaEventElapsedTime");
          last_replay_s = first_ms * 1e-3;
          last_T = T;
          const double rest = last_replay_s * (replays - 1);
          if (o.time_budget > 0 && elapsed_since(t_start) + rest > deadline) {
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
            dropping = true;
            drop("time budget (one replay of the " + std::to_string(L) + " layers took " +
                     std::to_string(first_ms) + " ms)", rest);
            continue;
          }
          for (int w = 1; w < o.warmup; ++w) ck(cudaGraphLaunch(exec, stream), "cudaGraphLaunch (warm-up)");
          for (int i = 0; i < o.iters; ++i) {
            ck(cudaEventRecord(ev[2 * static_cast<size_t>(i)], stream), "cudaEventRecord");
            ck(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
            ck(cudaEventRecord(ev[2 * static_cast<size_t>(i) + 1], stream), "cudaEventRecord");
          }
          ck(cudaStreamSynchronize(stream), "graph replays");
          std::vector<double> us(static_cast<size_t>(o.iters));
          for (int i = 0; i < o.iters; ++i) {
            float ms = 0;
            ck(cudaEventElapsedTime(&ms, ev[2 * static_cast<size_t>(i)], ev[2 * static_cast<size_t>(i) + 1]),
               "cudaEventElapsedTime");
            us[static_cast<size_t>(i)] = ms * 1e3 / L;
          }
          cudaGraphExecDestroy(exec);
          cudaGraphDestroy(graph);

          // ---- the output of layer 0 must be finite (a broken kernel must not produce a fast number).
          size_t nonfinite = 0;
          {
            const size_t n = static_cast<size_t>(T * H);
            if (p.out_bytes == 2) {
              std::vector<uint16_t> o0(n);
              ck(cudaMemcpy(o0.data(), layers[0].out.get(), n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy (out)");
              for (uint16_t v : o0) nonfinite += (v & 0x7F80) == 0x7F80;
            } else {
              std::vector<float> o0(n);
              ck(cudaMemcpy(o0.data(), layers[0].out.get(), n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy (out)");
              for (float v : o0) nonfinite += !std::isfinite(v);
            }
          }

          json row = row_json(p, mode, rk, T, L, acc);
          // Which tile config each sm90 GEMM launch of this point ran (the layer's own choice for this T).
          if (const auto* cl = dynamic_cast<const cuda::CudaMoeLayer*>(layers[0].layer.get())) {
            json cfgs = json::object();
            // "... chained": that GEMM1 and the next GEMM2 ran as one launch (sm90_nvfp4_chained_gemms).
            for (const auto& launch : cl->sm90_launches(T))
              cfgs[launch.name] = cuda::to_string(launch.config) + (launch.chained ? " chained" : "");
            row["sm90_configs"] = cfgs;
          }
          const double med = percentile(us, 0.5);
          row["us_per_layer"] = med;
          row["p10"] = percentile(us, 0.1);
          row["p90"] = percentile(us, 0.9);
          row["iters"] = o.iters;
          row["warmup"] = o.warmup;
          row["TBps"] = acc.bytes / (med * 1e-6) / 1e12;
          row["TFLOPs"] = acc.flops / (med * 1e-6) / 1e12;
          row["out_nonfinite"] = nonfinite;
          doc["rows"].push_back(row);
          write_json(o.json_path, doc);
          std::printf("%-14s %-5s %-7s T=%-6lld L=%d %10.1f us/layer (p10 %.1f, p90 %.1f)  %8.1f MB  %6.3f TB/s  "
                      "%7.1f TFLOP/s  experts %.1f%s\n",
                      p.preset_name.c_str(), mode_name(mode), bench::routing_kind_name(rk), static_cast<long long>(T), L,
                      med, row["p10"].get<double>(), row["p90"].get<double>(), acc.bytes / 1e6,
                      row["TBps"].get<double>(), row["TFLOPs"].get<double>(), acc.experts_mean,
                      nonfinite ? "  NONFINITE OUTPUT" : "");
          std::fflush(stdout);
        }
      }
      layers.clear();  // frees this mode's device memory before the next mode builds its layers
      ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    } catch (const Error& e) {  // recorded; the next mode still runs (a sticky CUDA error fails it too, visibly)
      cudaGetLastError();
      cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(stream, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone) {
        cudaGraph_t g = nullptr;
        cudaStreamEndCapture(stream, &g);
        if (g) cudaGraphDestroy(g);
      }
      std::fprintf(stderr, "bench: %s %s failed: %s\n", p.preset_name.c_str(), mode_name(mode), e.what());
      doc["errors"].push_back({{"preset", p.preset_name}, {"mode", mode_name(mode)}, {"error", e.what()}});
      write_json(o.json_path, doc);
      combo = combo_begin + p.routings.size();
    }
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaStreamDestroy(stream);
  doc["seconds"] = elapsed_since(t_start);
}
#endif  // NVFP4MOE_WITH_CUDA

// --dry-run: the host side only (routing, accounting), no weights, no device: timing fields are null.
void dry_run(const BenchOpts& o, const BenchPlan& p, json& doc) {
  const MoeSpec& spec = p.spec;
  const int64_t maxT = p.tokens.back();
  for (Mode mode : p.modes) {
    for (RoutingKind rk : p.routings) {
      std::vector<HostLayerInputs> host(static_cast<size_t>(o.layers));
      for (int l = 0; l < o.layers; ++l) {
        auto& h = host[static_cast<size_t>(l)];
        if (spec.has_router_bias)
          h.router_bias = bench::random_router_bias(spec.num_experts, o.seed * 1000003ull + static_cast<uint64_t>(l));
        h.logits = bench::random_logits(maxT, spec.num_experts, rk, logits_seed(o.seed, l, rk), spec.top_k);
      }
      for (int64_t T : p.tokens) {
        const PointAccounting acc = account_point(spec, host, T, p.out_bytes);
        json row = row_json(p, mode, rk, T, o.layers, acc);
        row["us_per_layer"] = nullptr;
        row["p10"] = nullptr;
        row["p90"] = nullptr;
        row["TBps"] = nullptr;
        row["TFLOPs"] = nullptr;
        row["dry_run"] = true;
        doc["rows"].push_back(row);
        std::printf("%-14s %-5s %-7s T=%-6lld (dry run)  %10.1f MB  %9.3f GFLOP  experts %.1f [%lld, %lld]\n",
                    p.preset_name.c_str(), mode_name(mode), bench::routing_kind_name(rk), static_cast<long long>(T),
                    acc.bytes / 1e6, acc.flops / 1e9, acc.experts_mean, static_cast<long long>(acc.experts_min),
                    static_cast<long long>(acc.experts_max));
      }
    }
  }
  write_json(o.json_path, doc);
}

}  // namespace

Command add_bench_command(CLI::App& parent) {
  auto o = std::make_shared<BenchOpts>();
  CLI::App* app = parent.add_subcommand(
      "bench", "Time the whole MoE layer on the cuda backend (CUDA-graph replay of L distinct layers; "
               "benchmarks.md protocol) and write JSON rows");
  app->add_option("--preset", o->preset, "Shape: deepseek-v3, qwen3-235b, qwen3-30b, gpt-oss-120b, nemotron-nano");
  std::vector<CLI::Option*> dims;
  dims.push_back(app->add_option("--hidden", o->hidden, "H (instead of --preset), 1..65536")
                     ->check(CLI::Range(int64_t{1}, kMaxDim)));
  dims.push_back(app->add_option("--intermediate", o->intermediate, "I per routed expert, 1..65536")
                     ->check(CLI::Range(int64_t{1}, kMaxDim)));
  dims.push_back(app->add_option("--experts", o->experts, "E, 1..4096")->check(CLI::Range(int64_t{1}, kMaxExperts)));
  dims.push_back(app->add_option("--top-k", o->top_k, "k"));
  dims.push_back(app->add_option("--shared-intermediate", o->shared_intermediate, "Shared expert width (0 = none)")
                     ->check(CLI::Range(int64_t{0}, kMaxDim)));
  dims.push_back(app->add_option("--activation", o->activation, "swiglu (default) or relu2")
                     ->check(CLI::IsMember({"swiglu", "relu2"})));
  dims.push_back(app->add_option("--routing-fn", o->routing_fn, "softmax (default) or sigmoid-grouped (with bias)")
                     ->check(CLI::IsMember({"softmax", "sigmoid-grouped"})));
  dims.push_back(app->add_option("--n-group", o->n_group, "sigmoid-grouped: groups"));
  dims.push_back(app->add_option("--topk-group", o->topk_group, "sigmoid-grouped: groups kept"));
  dims.push_back(app->add_option("--scaling", o->scaling, "sigmoid-grouped: routed scaling factor"));
  app->add_option("--tokens", o->tokens, "Token counts T, comma-separated (default 1,4,16,64,256,1024,4096,16384)");
  app->add_option("--mode", o->modes, "w4a16 and/or w4a4, comma-separated (default w4a16)");
  app->add_option("--routing", o->routings,
                  "uniform, skewed and/or balanced (every expert T*k/E rows), comma-separated (default uniform)");
  app->add_option("--layers", o->layers,
                  "Distinct layers per graph replay (8..256; default 8; 1..256 with --profile-eager)");
  app->add_option("--iters", o->iters, "Timed replays per point (default 50; the protocol needs >= 50; <= 100000)");
  app->add_option("--warmup", o->warmup, "Warm-up replays per point (default 3; <= 10000)");
  app->add_option("--time-budget", o->time_budget,
                  "Seconds for this invocation (0 = none): points predicted to overrun are dropped and recorded");
  app->add_option("--json", o->json_path, "Write the results (rewritten after every point) to this file");
  app->add_option("--git-sha", o->git_sha, "Recorded in the JSON (default: env NVFP4MOE_GIT_SHA)");
  app->add_option("--seed", o->seed, "Seed of weights and inputs (default 1)")->check(seed_check());
  app->add_option("--device", o->device, "CUDA device ordinal (default 0)");
  app->add_option("--out-dtype", o->out_dtype, "Layer output dtype: bf16 (default) or f32")
      ->check(CLI::IsMember({"bf16", "f32"}));
  app->add_flag("--profile-eager", o->profile_eager,
                "Wrap the first point's eager forward (before the graph capture) in cudaProfilerStart/Stop, for "
                "ncu --profile-from-start off or nsys --capture-range=cudaProfilerApi");
  app->add_flag("--shared-max-input-scale", o->shared_max_input_scale,
                "One activation scale per GEMM, the max over the experts (MoeLayerOptions::shared_max_input_scale, "
                "FlashInfer's convention; w4a4)");
  app->add_flag("--dry-run", o->dry_run, "Host side only: routing and bytes/FLOPs accounting, no device, no timing");

  return {app, [o, app, dims] {
            bool dims_given = false;
            for (const CLI::Option* d : dims) dims_given = dims_given || d->count() > 0;
            const BenchPlan plan = make_plan(*o, dims_given);
            std::string sha = o->git_sha;
            if (sha.empty()) {
              const char* env = std::getenv("NVFP4MOE_GIT_SHA");
              sha = env ? env : "unknown";
            }
            json doc = {{"tool", "nvfp4moe bench"},
                        {"git_sha", sha},
                        {"time_utc", utc_now()},
                        {"preset", plan.preset_name},
                        {"dims", dims_json(plan.spec)},
                        {"spec", plan.spec.describe()},
                        {"tokens", plan.tokens},
                        {"layers_requested", o->layers},
                        {"iters", o->iters},
                        {"warmup", o->warmup},
                        {"time_budget_s", o->time_budget},
                        {"out_dtype", o->out_dtype},
                        {"shared_max_input_scale", o->shared_max_input_scale},
                        {"seed", o->seed},
                        {"protocol", protocol_json()},
                        {"rows", json::array()},
                        {"dropped", json::array()},
                        {"layers_reduced", json::array()},
                        {"memory", json::array()},
                        {"errors", json::array()}};
            (void)app;
            if (o->layers < 8) doc["layers_below_protocol"] = true;  // (only with --profile-eager: make_plan)
            if (o->dry_run) {
              doc["dry_run"] = true;
              dry_run(*o, plan, doc);
              return;
            }
            if (o->layers < 8)
              std::fprintf(stderr, "bench: --layers %d with --profile-eager: the timings below are not the "
                           "protocol's (fewer than 8 layers: the L2 can hold what a replay reads)\n", o->layers);
#ifdef NVFP4MOE_WITH_CUDA
            run_on_device(*o, plan, doc);
            write_json(o->json_path, doc);
#else
            throw Error(
                "bench: this nvfp4moe was built without the CUDA backend; the bench times the cuda backend only "
                "(rebuild where nvcc is present with -DNVFP4MOE_CUDA=ON, or use --dry-run for the host-side "
                "accounting)");
#endif
          }};
}

}  // namespace nvfp4moe::cli
