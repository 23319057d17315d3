// Expert/tensor-parallel sharding (include/nvfp4moe/parallel.h, docs/parallel.md): the expert map, the TP
// split of I, slicing MoeWeights into a rank's shard, and the CPU layer of one rank.
#include "nvfp4moe/parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>

#include "api/cpu_forward_scratch.h"
#include "api/parallel_internal.h"
#include "api/weights_internal.h"
#include "cpu/reference.h"
#include "cpu/shard.h"
#include "format/nvfp4.h"
#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe {

void ParallelConfig::validate() const {
  NVFP4MOE_CHECK(ep_size >= 1, ArgumentError, "ParallelConfig.ep_size: expected >= 1, got ", ep_size);
  NVFP4MOE_CHECK(tp_size >= 1, ArgumentError, "ParallelConfig.tp_size: expected >= 1, got ", tp_size);
  NVFP4MOE_CHECK(ep_rank >= 0 && ep_rank < ep_size, ArgumentError, "ParallelConfig.ep_rank: expected 0..",
                 ep_size - 1, " (ep_size ", ep_size, "), got ", ep_rank);
  NVFP4MOE_CHECK(tp_rank >= 0 && tp_rank < tp_size, ArgumentError, "ParallelConfig.tp_rank: expected 0..",
                 tp_size - 1, " (tp_size ", tp_size, "), got ", tp_rank);
  // world_size() and rank() are int products: a world past INT_MAX would overflow them (UB) in describe()
  // and every rank loop.
  NVFP4MOE_CHECK(static_cast<int64_t>(ep_size) * tp_size <= std::numeric_limits<int>::max(), ArgumentError,
                 "ParallelConfig.ep_size * tp_size: expected <= ", std::numeric_limits<int>::max(), ", got ", ep_size,
                 " * ", tp_size, " = ", static_cast<int64_t>(ep_size) * tp_size);
}

std::string ParallelConfig::describe() const {
  std::ostringstream os;
  os << "rank " << rank() << "/" << world_size() << " (ep " << ep_rank << "/" << ep_size << ", tp " << tp_rank << "/"
     << tp_size << ")";
  return os.str();
}

int64_t ExpertMap::begin(int r) const {
  // A public struct: ep_size 0 would divide by zero, a rank outside [0, ep_size] gives a range outside [0, E].
  NVFP4MOE_CHECK(ep_size >= 1 && num_experts >= 0 && r >= 0 && r <= ep_size, ArgumentError, "ExpertMap::begin(", r,
                 "): expected ep_size >= 1, num_experts >= 0 and a rank in 0..ep_size, got ep_size ", ep_size,
                 ", num_experts ", num_experts);
  const int64_t base = num_experts / ep_size, rem = num_experts % ep_size;
  return r * base + std::min<int64_t>(r, rem);
}

int ExpertMap::owner(int64_t e) const {
  NVFP4MOE_CHECK(e >= 0 && e < num_experts, ArgumentError, "ExpertMap::owner: expert ", e, " outside [0, ",
                 num_experts, ")");
  int r = 0;
  while (end(r) <= e) ++r;
  return r;
}

namespace {

// [b, e) of slice r of n into parts equal slices, each a multiple of granule.
void split_dim(int64_t n, int parts, int r, int64_t granule, const char* what, int64_t* b, int64_t* e) {
  NVFP4MOE_CHECK(n % parts == 0 && (n / parts) % granule == 0, ArgumentError, "ParallelConfig.tp_size = ", parts,
                 ": cannot split ", what, " = ", n, " into ", parts, " equal slices on ", granule,
                 "-element boundaries (", granule == 16 ? "the NVFP4 scale block" : "the GEMM k-tile",
                 "); expected ", what, " % (", parts, " * ", granule, ") == 0, got ", what, " % ", parts * granule,
                 " = ", n % (parts * granule));
  *b = r * (n / parts);
  *e = *b + n / parts;
}

}  // namespace

ShardPlan plan_shard(const MoeSpec& spec, const ParallelConfig& pc, int64_t granule) {
  pc.validate();
  NVFP4MOE_CHECK(granule >= 16 && granule % 16 == 0, ArgumentError,
                 "plan_shard: granule must be a positive multiple of 16, got ", granule);
  NVFP4MOE_CHECK(pc.ep_size <= spec.num_experts, ArgumentError, "ParallelConfig.ep_size = ", pc.ep_size,
                 ": expected <= num_experts = ", spec.num_experts, " (every EP rank owns at least one expert)");
  ShardPlan p;
  p.parallel = pc;
  p.map.num_experts = spec.num_experts;
  p.map.ep_size = pc.ep_size;
  p.expert_begin = p.map.begin(pc.ep_rank);
  p.expert_end = p.map.end(pc.ep_rank);
  split_dim(spec.intermediate, pc.tp_size, pc.tp_rank, granule, "intermediate (I)", &p.inter_begin, &p.inter_end);
  if (spec.shared_intermediate > 0) {
    int64_t b = 0, e = 0;
    split_dim(spec.shared_intermediate, pc.tp_size, pc.tp_rank, granule, "shared_intermediate", &b, &e);
    if (pc.ep_rank == 0) {
      p.has_shared = true;
      p.shared_begin = b;
      p.shared_end = e;
    }
  }
  return p;
}

MoeSpec local_spec(const MoeSpec& spec, const ShardPlan& plan) {
  MoeSpec s = spec;
  s.num_experts = plan.local_experts();
  s.intermediate = plan.local_intermediate();
  s.shared_intermediate = plan.local_shared_intermediate();
  s.shared_expert_gated = plan.has_shared && spec.shared_expert_gated;
  s.routing = Routing::SoftmaxTopK;  // not routable: ids come localized from the full layer's routing
  s.n_group = 1;
  s.topk_group = 1;
  s.has_router_bias = false;
  return s;
}


namespace parallel_detail {

void slice_expert(const StackedExperts& src, int64_t e_src, StackedExperts& dst, int64_t e_dst, int64_t i0,
                  int64_t i1) {
  const int64_t H = src.hidden, I = src.intermediate, Il = i1 - i0;
  const size_t se = static_cast<size_t>(e_src), de = static_cast<size_t>(e_dst);
  const uint8_t* w13 = src.w13.data() + se * src.w13_bytes_per_expert();
  const uint8_t* w13s = src.w13_scale.data() + se * src.w13_scale_bytes_per_expert();
  uint8_t* d13 = dst.w13.data() + de * dst.w13_bytes_per_expert();
  uint8_t* d13s = dst.w13_scale.data() + de * dst.w13_scale_bytes_per_expert();
  const size_t row = static_cast<size_t>(H / 2), srow = static_cast<size_t>(H / 16);
  const int halves = src.gated ? 2 : 1;
  for (int h = 0; h < halves; ++h) {  // gate rows i0..i1-1 (then up rows I+i0..), contiguous per half
    std::memcpy(d13 + h * Il * row, w13 + (h * I + i0) * row, Il * row);
    std::memcpy(d13s + h * Il * srow, w13s + (h * I + i0) * srow, Il * srow);
  }
  const uint8_t* w2 = src.w2.data() + se * src.w2_bytes_per_expert();
  const uint8_t* w2s = src.w2_scale.data() + se * src.w2_scale_bytes_per_expert();
  uint8_t* d2 = dst.w2.data() + de * dst.w2_bytes_per_expert();
  uint8_t* d2s = dst.w2_scale.data() + de * dst.w2_scale_bytes_per_expert();
  for (int64_t n = 0; n < H; ++n) {  // columns i0..i1-1 of every row of w2
    std::memcpy(d2 + n * (Il / 2), w2 + n * (I / 2) + i0 / 2, static_cast<size_t>(Il / 2));
    std::memcpy(d2s + n * (Il / 16), w2s + n * (I / 16) + i0 / 16, static_cast<size_t>(Il / 16));
  }
  if (src.gated) dst.w13_gate_scale2[de] = src.w13_gate_scale2[se];
  dst.w13_up_scale2[de] = src.w13_up_scale2[se];
  dst.w13_input_scale[de] = src.w13_input_scale[se];
  dst.w2_scale2[de] = src.w2_scale2[se];
  dst.w2_input_scale[de] = src.w2_input_scale[se];
}

}  // namespace parallel_detail

MoeShard slice_weights(const MoeWeights& full, const ParallelConfig& pc, int64_t granule) {
  // MoeWeights::validate() but NaN input scales let through: none (a W4A16 checkpoint), which MoeLayer::create
  // handles per mode.
  weights_detail::validate_moe_weights(full, weights_detail::NanInputScales::Allowed);
  MoeShard s;
  s.spec = full.spec;
  s.plan = plan_shard(full.spec, pc, granule);
  s.local.spec = local_spec(full.spec, s.plan);
  const MoeSpec& ls = s.local.spec;
  s.local.experts.allocate(ls.num_experts, ls.hidden, ls.intermediate, ls.gated());
  for (int64_t e = 0; e < ls.num_experts; ++e)
    parallel_detail::slice_expert(full.experts, s.plan.expert_begin + e, s.local.experts, e, s.plan.inter_begin,
                                  s.plan.inter_end);
  if (s.plan.has_shared) {
    s.local.shared.allocate(1, ls.hidden, ls.shared_intermediate, ls.gated());
    parallel_detail::slice_expert(full.shared, 0, s.local.shared, 0, s.plan.shared_begin, s.plan.shared_end);
    if (ls.shared_expert_gated) s.local.shared_gate_weight = full.shared_gate_weight;
  }
  s.router_weight = full.router_weight;
  s.router_bias = full.router_bias;
  return s;
}


void validate_shard(const MoeShard& s) {
  s.spec.validate();
  const ShardPlan want = plan_shard(s.spec, s.plan.parallel, 16);
  NVFP4MOE_CHECK(want.expert_begin == s.plan.expert_begin && want.expert_end == s.plan.expert_end &&
                     want.inter_begin == s.plan.inter_begin && want.inter_end == s.plan.inter_end &&
                     want.has_shared == s.plan.has_shared && want.shared_begin == s.plan.shared_begin &&
                     want.shared_end == s.plan.shared_end && want.map.num_experts == s.plan.map.num_experts &&
                     want.map.ep_size == s.plan.map.ep_size,
                 ArgumentError, "MoeShard.plan: does not match plan_shard(spec, ", s.plan.parallel.describe(), ")");
  // The local weights against the local spec: MoeWeights::validate() minus the routing checks (a shard may
  // own fewer experts than top_k).
  const MoeSpec& probe_spec = s.local.spec;
  const MoeSpec want_local = local_spec(s.spec, s.plan);
  NVFP4MOE_CHECK(probe_spec.num_experts == want_local.num_experts && probe_spec.intermediate == want_local.intermediate &&
                     probe_spec.shared_intermediate == want_local.shared_intermediate &&
                     probe_spec.hidden == want_local.hidden && probe_spec.top_k == want_local.top_k &&
                     // moe_forward reads these from local.spec: a gated shared expert with no gate weight
                     // (checked below against want_local) would be read out of bounds.
                     probe_spec.activation == want_local.activation &&
                     probe_spec.shared_expert_gated == want_local.shared_expert_gated,
                 ArgumentError, "MoeShard.local.spec: expected local_spec(spec, plan) (E ", want_local.num_experts, ", I ",
                 want_local.intermediate, ", shared I ", want_local.shared_intermediate, ", H ", want_local.hidden,
                 ", k ", want_local.top_k, ", ", activation_name(want_local.activation), ", shared_expert_gated ",
                 want_local.shared_expert_gated, "), got E ", probe_spec.num_experts, ", I ", probe_spec.intermediate,
                 ", shared I ", probe_spec.shared_intermediate, ", H ", probe_spec.hidden, ", k ", probe_spec.top_k,
                 ", ", activation_name(probe_spec.activation), ", shared_expert_gated ",
                 probe_spec.shared_expert_gated);
  using weights_detail::NanInputScales;
  weights_detail::check_stacked_experts(s.local.experts, "MoeShard.local.experts", want_local.num_experts,
                                        want_local.hidden, want_local.intermediate, want_local.gated(),
                                        NanInputScales::Allowed);
  if (want_local.shared_intermediate > 0)
    weights_detail::check_stacked_experts(s.local.shared, "MoeShard.local.shared", 1, want_local.hidden,
                                          want_local.shared_intermediate, want_local.gated(), NanInputScales::Allowed);
  else
    NVFP4MOE_CHECK(s.local.shared.num_experts == 0, ArgumentError, "MoeShard.local.shared: the rank holds no shared "
                   "expert slice but shared.num_experts = ", s.local.shared.num_experts);
  NVFP4MOE_CHECK(s.local.shared_gate_weight.size() == (want_local.shared_expert_gated ? static_cast<size_t>(want_local.hidden) : 0u),
                 ArgumentError, "MoeShard.local.shared_gate_weight: expected ",
                 want_local.shared_expert_gated ? want_local.hidden : 0, " values, got ", s.local.shared_gate_weight.size());
  const size_t E = static_cast<size_t>(s.spec.num_experts), H = static_cast<size_t>(s.spec.hidden);
  NVFP4MOE_CHECK(s.router_weight.empty() || s.router_weight.size() == E * H, ArgumentError,
                 "MoeShard.router_weight: expected [E, H] = ", E * H, " values, got ", s.router_weight.size());
  NVFP4MOE_CHECK(s.router_bias.size() == (s.spec.has_router_bias ? E : 0u), ArgumentError,
                 "MoeShard.router_bias: expected ", s.spec.has_router_bias ? E : 0u, " values, got ",
                 s.router_bias.size());
}

MoeShard Checkpoint::load_shard(int layer, const ParallelConfig& parallel, const ProgressFn& progress) const {
  // Generic fallback (formats without a shard-aware loader): the whole layer, then the slice.
  return slice_weights(load_layer(layer, progress), parallel);
}

namespace {

// One rank of a sharded layer on the CPU: forward() writes the rank's partial output (sum over ranks = the
// layer). Routing over all E experts with the replicated router bias.
class ShardedCpuMoeLayer final : public MoeLayer {
 public:
  ShardedCpuMoeLayer(MoeShard s, const MoeLayerOptions& options) : s_(std::move(s)), options_(options) {}

  const MoeSpec& spec() const override { return s_.spec; }
  const MoeLayerOptions& options() const override { return options_; }
  size_t weight_bytes() const override { return s_.local.packed_bytes(); }
  size_t workspace_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return scratch_.bytes();
  }

  void forward(const TensorRef& hidden, const RoutingArgs& routing, const TensorRef& out, void*) override {
    validate_forward_args(s_.spec, options_, hidden, routing, out, DeviceType::CPU);
    if (hidden.dim(0) == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    scratch_.run(s_.spec, s_.router_bias, hidden, routing, out,
                 [&](const uint16_t* x, int64_t T, const int32_t* ids, const float* ws, float* y) {
                   cpu::shard_forward(s_, options_.mode, x, T, ids, ws, y);
                 });
  }

  void begin_calibration() override { refuse_calibration(); }
  void end_calibration() override { refuse_calibration(); }

 private:
  static void refuse_calibration() {
    throw ArgumentError(
        "calibration: not supported on a sharded layer (MoeLayerOptions.parallel is not 1x1): the input scales "
        "need a max over every rank's activations (an all-reduce, planned with NCCL); calibrate the unsharded "
        "layer (`nvfp4moe calibrate`) and shard the calibrated checkpoint");
  }
  MoeShard s_;
  MoeLayerOptions options_;
  mutable std::mutex mu_;
  cpu_layer_detail::CpuForwardScratch scratch_;
};

}  // namespace

namespace parallel_detail {

void check_sharded_options(const MoeLayerOptions& options) {
  options.parallel.validate();
  NVFP4MOE_CHECK(options.backend == Backend::Cpu, ArgumentError, "MoeLayerOptions.parallel: ",
                 options.parallel.describe(), " on the ", backend_name(options.backend),
                 " backend: expected backend cpu (the sharded CUDA layer over NCCL is not built yet: issue 6, "
                 "docs/parallel.md)");
  NVFP4MOE_CHECK(!options.shared_max_input_scale, ArgumentError,
                 "MoeLayerOptions.shared_max_input_scale: not supported with MoeLayerOptions.parallel = ",
                 options.parallel.describe(), " (the max over every rank's experts needs an all-reduce)");
  NVFP4MOE_CHECK(options.max_tokens >= 0, ArgumentError, "MoeLayerOptions.max_tokens: expected >= 0, got ",
                 options.max_tokens);
}

std::unique_ptr<MoeLayer> create_sharded(MoeShard shard, const MoeLayerOptions& options) {
  check_sharded_options(options);
  const ParallelConfig& a = options.parallel;
  const ParallelConfig& b = shard.plan.parallel;
  NVFP4MOE_CHECK(a.ep_size == b.ep_size && a.ep_rank == b.ep_rank && a.tp_size == b.tp_size && a.tp_rank == b.tp_rank,
                 ArgumentError, "MoeLayerOptions.parallel: ", a.describe(), " but the shard is ", b.describe());
  // NaN input scales: the checkpoint has none (W4A16); as MoeLayer::create for the unsharded layer.
  for (auto* v : {&shard.local.experts.w13_input_scale, &shard.local.experts.w2_input_scale,
                  &shard.local.shared.w13_input_scale, &shard.local.shared.w2_input_scale})
    for (float& x : *v)
      if (std::isnan(x)) {
        NVFP4MOE_CHECK(options.mode != Mode::W4A4, ArgumentError, "MoeLayerOptions.mode: layer ", shard.spec.layer,
                       " has no activation input scales (a W4A16 checkpoint); expected w4a16, or input scales "
                       "from `nvfp4moe calibrate`, got w4a4");
        x = 1.0f;
      }
  validate_shard(shard);
  return std::make_unique<ShardedCpuMoeLayer>(std::move(shard), options);
}

}  // namespace parallel_detail

std::unique_ptr<MoeLayer> create_moe_layer_shard(MoeShard shard, const MoeLayerOptions& options) {
  return parallel_detail::create_sharded(std::move(shard), options);
}

}  // namespace nvfp4moe
