// `nvfp4moe run DIR --layer L --mode w4a16|w4a4 ...`: one MoE layer through MoeLayer, on given or random
// input, with its accuracy against the unquantized fp32 layer over the same routing.
#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "cpu/reference.h"
#include "format/nvfp4.h"
#include "io/safetensors.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::cli {

namespace {

// ------------------------------------------------------------------ deterministic random numbers
// splitmix64 + Box-Muller: the same numbers on every platform and standard library (std::normal_distribution
// is implementation-defined), so `--seed S` names one input everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed ^ 0x6A09E667F3BCC909ull) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  float normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform(), u2 = uniform();  // u1 in (0, 1]
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 6.283185307179586 * u2;
    spare_ = static_cast<float>(r * std::sin(a));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(a));
  }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  float spare_ = 0;
};

TensorRef host_ref(void* data, DType dtype, std::vector<int64_t> shape) {
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;  // contiguous, on the CPU
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

const LayerSummary& find_moe_layer(const Checkpoint& checkpoint, int layer) {
  const auto& layers = checkpoint.layers();
  std::vector<int> moe = checkpoint.moe_layers();
  std::ostringstream moe_list;
  for (size_t i = 0; i < moe.size(); ++i) moe_list << (i ? ", " : "") << moe[i];
  for (const auto& l : layers) {
    if (l.layer != layer) continue;
    NVFP4MOE_CHECK(l.is_moe, ArgumentError, "--layer ", layer, " is a dense layer (not MoE) in ", checkpoint.path(),
                   "; its MoE layers are: ", moe.empty() ? std::string("none") : moe_list.str());
    return l;
  }
  int lo = 0, hi = -1;
  if (!layers.empty()) {
    lo = layers.front().layer;
    hi = layers.back().layer;
    for (const auto& l : layers) lo = std::min(lo, l.layer), hi = std::max(hi, l.layer);
  }
  throw ArgumentError(detail::cat("--layer ", layer, " is out of range: ", checkpoint.path(), " has ",
                                  layers.size(), " layers (", lo, "..", hi, "); its MoE layers are: ",
                                  moe.empty() ? std::string("none") : moe_list.str()));
}

// The routing and hidden inputs of one run, in host memory.
struct Inputs {
  int64_t tokens = 0;
  std::vector<uint16_t> hidden_bf16;  // [T, H] what the layer gets
  std::vector<float> hidden_f32;      // [T, H] what the fp32 reference gets (unquantized activations)
  std::vector<float> logits;          // [T, E] when routing comes from logits
  std::vector<int32_t> topk_ids;      // [T, k]
  std::vector<float> topk_weights;    // [T, k]
  bool have_logits = false;
  std::string desc;
};

template <typename T>
std::vector<T> copy_tensor(const io::TensorInfo& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.data, v.size() * sizeof(T));  // the file's offsets need not be aligned
  return v;
}

// Reads and checks the --input file against the layer's spec: every name, dtype and shape, before any weight
// is loaded, each mismatch with its own message.
Inputs read_input_file(const std::string& path, const MoeSpec& spec) {
  auto file = io::SafetensorsFile::open(path);
  const std::set<std::string> known = {"hidden", "router_logits", "topk_ids", "topk_weights"};
  for (const auto& t : file->tensors())
    NVFP4MOE_CHECK(known.count(t.name), ArgumentError, "--input ", path, ": unexpected tensor '", t.name,
                   "' (expected 'hidden' with 'router_logits', or 'hidden' with 'topk_ids' and 'topk_weights')");

  const io::TensorInfo* hidden = file->find("hidden");
  NVFP4MOE_CHECK(hidden, ArgumentError, "--input ", path, ": tensor 'hidden' [T, ", spec.hidden,
                 "] (BF16 or F32) is missing");
  NVFP4MOE_CHECK(hidden->dtype == DType::BF16 || hidden->dtype == DType::F32, ArgumentError, "--input ", path,
                 ": tensor 'hidden' must be BF16 or F32, got ", dtype_name(hidden->dtype));
  NVFP4MOE_CHECK(hidden->shape.size() == 2, ArgumentError, "--input ", path, ": tensor 'hidden' must have shape [T, ",
                 spec.hidden, "], got ", shape_str(hidden->shape));
  NVFP4MOE_CHECK(hidden->shape[1] == spec.hidden, ArgumentError, "--input ", path,
                 ": tensor 'hidden' must have shape [T, H=", spec.hidden, "] for layer ", spec.layer, ", got ",
                 shape_str(hidden->shape));
  Inputs in;
  in.tokens = hidden->shape[0];
  const int64_t T = in.tokens, E = spec.num_experts, k = spec.top_k;

  if (hidden->dtype == DType::BF16) {
    in.hidden_bf16 = copy_tensor<uint16_t>(*hidden);
    in.hidden_f32.resize(in.hidden_bf16.size());
    for (size_t i = 0; i < in.hidden_bf16.size(); ++i) in.hidden_f32[i] = fmt::bf16_to_float(in.hidden_bf16[i]);
  } else {
    in.hidden_f32 = copy_tensor<float>(*hidden);
    in.hidden_bf16.resize(in.hidden_f32.size());
    for (size_t i = 0; i < in.hidden_f32.size(); ++i) in.hidden_bf16[i] = fmt::bf16_from_float(in.hidden_f32[i]);
  }

  const io::TensorInfo* logits = file->find("router_logits");
  const io::TensorInfo* ids = file->find("topk_ids");
  const io::TensorInfo* weights = file->find("topk_weights");
  NVFP4MOE_CHECK(!(logits && (ids || weights)), ArgumentError, "--input ", path,
                 ": give either 'router_logits' or 'topk_ids' + 'topk_weights', not both");
  if (logits) {
    NVFP4MOE_CHECK(logits->dtype == DType::F32, ArgumentError, "--input ", path,
                   ": tensor 'router_logits' must be F32, got ", dtype_name(logits->dtype));
    NVFP4MOE_CHECK(logits->shape == (std::vector<int64_t>{T, E}), ArgumentError, "--input ", path,
                   ": tensor 'router_logits' must have shape [T=", T, ", E=", E, "], got ", shape_str(logits->shape));
    in.logits = copy_tensor<float>(*logits);
    for (size_t i = 0; i < in.logits.size(); ++i)
      NVFP4MOE_CHECK(std::isfinite(in.logits[i]), ArgumentError, "--input ", path, ": router_logits[", i / E, ", ",
                     i % E, "] is not finite (", in.logits[i], "); expected finite logits");
    in.have_logits = true;
    in.desc = detail::cat("hidden ", dtype_name(hidden->dtype), " and router_logits from ", path);
    return in;
  }
  NVFP4MOE_CHECK(ids || weights, ArgumentError, "--input ", path,
                 ": routing is missing: add 'router_logits' F32 [T, E] or 'topk_ids' I32 [T, k] + 'topk_weights' F32 [T, k]");
  NVFP4MOE_CHECK(ids, ArgumentError, "--input ", path, ": 'topk_weights' is given without 'topk_ids' I32 [T, k=", k, "]");
  NVFP4MOE_CHECK(weights, ArgumentError, "--input ", path, ": 'topk_ids' is given without 'topk_weights' F32 [T, k=", k,
                 "]");
  NVFP4MOE_CHECK(ids->dtype == DType::I32, ArgumentError, "--input ", path, ": tensor 'topk_ids' must be I32, got ",
                 dtype_name(ids->dtype));
  NVFP4MOE_CHECK(weights->dtype == DType::F32, ArgumentError, "--input ", path,
                 ": tensor 'topk_weights' must be F32, got ", dtype_name(weights->dtype));
  NVFP4MOE_CHECK(ids->shape == (std::vector<int64_t>{T, k}), ArgumentError, "--input ", path,
                 ": tensor 'topk_ids' must have shape [T=", T, ", k=", k, "], got ", shape_str(ids->shape));
  NVFP4MOE_CHECK(weights->shape == (std::vector<int64_t>{T, k}), ArgumentError, "--input ", path,
                 ": tensor 'topk_weights' must have shape [T=", T, ", k=", k, "], got ", shape_str(weights->shape));
  in.topk_ids = copy_tensor<int32_t>(*ids);
  in.topk_weights = copy_tensor<float>(*weights);
  for (size_t i = 0; i < in.topk_ids.size(); ++i) {
    const int32_t id = in.topk_ids[i];
    NVFP4MOE_CHECK(id >= -1 && id < E, ArgumentError, "--input ", path, ": topk_ids[", i / k, ", ", i % k, "] = ", id,
                   " is not an expert id (expected -1 for an unused slot or 0..", E - 1, ")");
    NVFP4MOE_CHECK(std::isfinite(in.topk_weights[i]), ArgumentError, "--input ", path, ": topk_weights[", i / k,
                   ", ", i % k, "] is not finite (", in.topk_weights[i], ")");
  }
  in.desc = detail::cat("hidden ", dtype_name(hidden->dtype), " and topk_ids/topk_weights from ", path);
  return in;
}

// Refuses an output path that cannot be written before the (possibly long) load starts.
void check_output_path(const std::string& path) {
  struct stat st{};
  if (stat(path.c_str(), &st) == 0)
    NVFP4MOE_CHECK(!S_ISDIR(st.st_mode), ArgumentError, "--output ", path, " is a directory; give a file name");
  const size_t slash = path.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  NVFP4MOE_CHECK(stat(parent.c_str(), &st) == 0 && S_ISDIR(st.st_mode), ArgumentError, "--output ", path,
                 ": directory '", parent, "' does not exist");
}

void check_backend(Backend backend) {
  if (backend != Backend::Cuda || cuda_backend_available()) return;
#ifdef NVFP4MOE_WITH_CUDA
  throw ArgumentError("--backend cuda: no usable CUDA device is present (use --backend cpu)");
#else
  throw ArgumentError(
      "--backend cuda: this nvfp4moe was built without the CUDA backend (rebuild where nvcc is present with "
      "-DNVFP4MOE_CUDA=ON, or use --backend cpu)");
#endif
}

}  // namespace

LayerRunResult run_layer(const Checkpoint& checkpoint, const LayerRunRequest& req) {
  // Everything cheap is checked before anything is loaded.
  find_moe_layer(checkpoint, req.layer);
  const MoeSpec spec = checkpoint.spec(req.layer);
  // Each size alone first: ep x tp is formed only once both are known to be small.
  NVFP4MOE_CHECK(req.ep >= 1 && req.ep <= kMaxRanks, ArgumentError, "--ep: expected 1..", kMaxRanks, ", got ", req.ep);
  NVFP4MOE_CHECK(req.tp >= 1 && req.tp <= kMaxRanks, ArgumentError, "--tp: expected 1..", kMaxRanks, ", got ", req.tp);
  const bool sharded = req.ep > 1 || req.tp > 1;
  if (sharded) {
    NVFP4MOE_CHECK(req.backend == Backend::Cpu, ArgumentError, "--ep ", req.ep, " --tp ", req.tp,
                   " with --backend cuda: the multi-GPU run (one process per GPU over NCCL) is not built yet "
                   "(issue 6: blocked, no multi-GPU machine to run it on); use --backend cpu, which runs every "
                   "rank's shard on the CPU and compares");
    const int64_t ranks = int64_t{req.ep} * req.tp;
    for (int64_t r = 0; r < ranks; ++r) plan_shard(spec, ParallelConfig::of_rank(req.ep, req.tp, static_cast<int>(r)));
  }
  check_backend(req.backend);
  // An unquantized checkpoint has no activation input scales: refused here, before the load and the reference.
  NVFP4MOE_CHECK(req.mode != Mode::W4A4 || checkpoint.format() != CheckpointFormat::Bf16, ArgumentError,
                 "--mode w4a4: layer ", req.layer, " of ", checkpoint.path(), " is unquantized (bf16, quantized to "
                 "NVFP4 at load) and has no activation input scales; expected --mode w4a16, or w4a4 on a checkpoint "
                 "with input scales: `nvfp4moe quantize IN OUT --calibration FILE` (or `nvfp4moe calibrate` on its "
                 "output), got w4a4");
  if (!req.output_path.empty()) check_output_path(req.output_path);

  Inputs in;
  if (!req.input_path.empty()) {
    in = read_input_file(req.input_path, spec);
  } else {
    NVFP4MOE_CHECK(req.tokens >= 1 && req.tokens <= kMaxTokens, ArgumentError, "--tokens: expected 1..", kMaxTokens,
                   ", got ", req.tokens);
    in.tokens = req.tokens;
  }
  const int64_t T = in.tokens, H = spec.hidden, E = spec.num_experts, k = spec.top_k;

  LayerRunResult res;
  res.spec = spec;
  res.tokens = T;

  double t0 = now_seconds();
  MoeWeights weights;
  {
    LoadProgress progress(detail::cat("loading layer ", req.layer));
    weights = checkpoint.load_layer(req.layer, progress.fn());
  }
  res.load_seconds = now_seconds() - t0;

  if (req.input_path.empty()) {
    // Random hidden states, N(0, 1) rounded to bf16, deterministic from the seed.
    Rng rng(req.seed);
    in.hidden_bf16.resize(static_cast<size_t>(T * H));
    in.hidden_f32.resize(in.hidden_bf16.size());
    for (size_t i = 0; i < in.hidden_bf16.size(); ++i) {
      in.hidden_bf16[i] = fmt::bf16_from_float(rng.normal());
      in.hidden_f32[i] = fmt::bf16_to_float(in.hidden_bf16[i]);
    }
    in.logits.resize(static_cast<size_t>(T * E));
    const bool have_router = !weights.router_weight.empty();
    RoutingSource src = req.routing_source;
    if (src == RoutingSource::Auto) src = have_router ? RoutingSource::RouterWeight : RoutingSource::RandomLogits;
    NVFP4MOE_CHECK(src != RoutingSource::RouterWeight || have_router, ArgumentError, "--routing-from router: layer ",
                   req.layer, " of ", checkpoint.path(), " has no router weight (mlp.gate.weight); use --routing-from logits");
    if (src == RoutingSource::RouterWeight) {
      cpu::router_logits(weights, in.hidden_bf16.data(), T, in.logits.data());
      in.desc = detail::cat("random hidden N(0,1) bf16 (seed ", req.seed, "), router logits = hidden . router^T");
    } else {
      for (float& v : in.logits) v = rng.normal();
      in.desc = detail::cat("random hidden N(0,1) bf16 and random router logits N(0,1) (seed ", req.seed, ")");
    }
    in.have_logits = true;
  }

  // Route once on the host; both the layer and the fp32 reference then see the very same experts and weights.
  if (in.have_logits) {
    in.topk_ids.resize(static_cast<size_t>(T * k));
    in.topk_weights.resize(static_cast<size_t>(T * k));
    cpu::route(spec, in.logits.data(), weights.router_bias.empty() ? nullptr : weights.router_bias.data(), T,
               in.topk_ids.data(), in.topk_weights.data());
  }
  res.input_desc = in.desc;

  std::vector<float> ref;
  if (req.reference) {
    ref.resize(static_cast<size_t>(T * H));
    cpu::moe_forward_fp32(weights, in.hidden_f32.data(), T, in.topk_ids.data(), in.topk_weights.data(), ref.data());
  }

  MoeLayerOptions options;
  options.backend = req.backend;
  options.mode = req.mode;
  options.max_tokens = std::max<int64_t>(T, 1);
  auto layer = MoeLayer::create(std::move(weights), options);
  res.weight_bytes = layer->weight_bytes();

  res.out.assign(static_cast<size_t>(T * H), 0.0f);
  if (req.backend == Backend::Cuda) {
    forward_on_cuda(*layer, in.hidden_bf16, T, H, in.topk_ids, in.topk_weights, k, res.out, &res.forward_seconds);
  } else {
    const TensorRef hidden = host_ref(in.hidden_bf16.data(), DType::BF16, {T, H});
    const TensorRef ids = host_ref(in.topk_ids.data(), DType::I32, {T, k});
    const TensorRef wts = host_ref(in.topk_weights.data(), DType::F32, {T, k});
    const TensorRef out = host_ref(res.out.data(), DType::F32, {T, H});
    RoutingArgs routing;
    routing.topk_ids = &ids;
    routing.topk_weights = &wts;
    t0 = now_seconds();
    layer->forward(hidden, routing, out);
    res.forward_seconds = now_seconds() - t0;
  }

  if (req.reference) res.accuracy = compare(res.out.data(), ref.data(), res.out.size());
  if (sharded)
    res.parallel = run_parallel_on_cpu(checkpoint, req.layer, req.mode, req.ep, req.tp, in.hidden_bf16, T, in.topk_ids,
                                       in.topk_weights, res.out);

  if (!req.output_path.empty()) {
    io::TensorToWrite t;
    t.name = "out";
    t.dtype = DType::F32;
    t.shape = {T, H};
    const float* src = res.parallel ? res.parallel->out.data() : res.out.data();  // --ep/--tp: the ranks' combine
    t.fill = [src](uint8_t* dst, size_t nbytes) { std::memcpy(dst, src, nbytes); };
    io::write_safetensors(req.output_path, {t},
                          {{"producer", "nvfp4moe run"},
                           {"checkpoint", checkpoint.path()},
                           {"layer", std::to_string(req.layer)},
                           {"mode", mode_name(req.mode)},
                           {"backend", backend_name(req.backend)},
                           {"ep", std::to_string(req.ep)},
                           {"tp", std::to_string(req.tp)}});
  }
  return res;
}

Command add_run_command(CLI::App& parent) {
  struct Opts {
    std::string dir, mode, backend = "cpu", routing_from = "auto";
    LayerRunRequest req;
    bool no_reference = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* app = parent.add_subcommand("run", "Run one MoE layer of a checkpoint and report its accuracy against fp32");
  app->add_option("dir", o->dir, "Checkpoint directory")->required();
  app->add_option("--layer", o->req.layer, "Decoder layer index (must be a MoE layer)")->required();
  app->add_option("--mode", o->mode, "Numerics: w4a16 (bf16 activations) or w4a4 (NVFP4 activations)")
      ->required()
      ->check(CLI::IsMember({"w4a16", "w4a4"}));
  auto* input = app->add_option("--input", o->req.input_path,
                                "safetensors with 'hidden' [T,H] BF16|F32 and 'router_logits' [T,E] F32 or "
                                "'topk_ids' [T,k] I32 + 'topk_weights' [T,k] F32");
  app->add_option("--output", o->req.output_path, "Write 'out' [T,H] F32 to this safetensors file (atomically)");
  app->add_option("--tokens", o->req.tokens, "Tokens of random input, 1..65536 (default 16)")
      ->check(CLI::Range(int64_t{1}, kMaxTokens))
      ->excludes(input);
  app->add_option("--seed", o->req.seed, "Seed of the random input (default 1)")->check(seed_check())->excludes(input);
  app->add_option("--backend", o->backend, "cpu or cuda (default cpu)")->check(CLI::IsMember({"cpu", "cuda"}));
  app->add_option("--routing-from", o->routing_from,
                  "Random input routing: router (logits = hidden . router^T) or logits (random); default: router "
                  "when the layer has one")
      ->check(CLI::IsMember({"auto", "router", "logits"}))
      ->excludes(input);
  app->add_flag("--no-reference", o->no_reference, "Skip the fp32 reference (no accuracy report)");
  app->add_option("--ep", o->req.ep,
                  "Expert-parallel ranks (cpu backend: each rank's shard loaded on its own and run in this "
                  "process, sum compared with the unsharded layer; --output then holds the ranks' combine). "
                  "The multi-GPU NCCL launch is not built yet (docs/parallel.md)")
      ->check(CLI::Range(1, kMaxRanks));
  app->add_option("--tp", o->req.tp, "Tensor-parallel ranks (split of the intermediate dimension; as --ep)")
      ->check(CLI::Range(1, kMaxRanks));

  return {app, [o] {
            LayerRunRequest req = o->req;
            mode_from_name(o->mode, &req.mode);
            backend_from_name(o->backend, &req.backend);
            req.routing_source = o->routing_from == "router"   ? RoutingSource::RouterWeight
                                 : o->routing_from == "logits" ? RoutingSource::RandomLogits
                                                               : RoutingSource::Auto;
            req.reference = !o->no_reference;
            auto checkpoint = Checkpoint::open(o->dir);
            LayerRunResult r = run_layer(*checkpoint, req);
            std::printf("checkpoint: %s\n", checkpoint->path().c_str());
            std::printf("%s\n", r.spec.describe().c_str());
            std::printf("loaded: %s of packed weights in %s\n", format_bytes(r.weight_bytes).c_str(),
                        format_seconds(r.load_seconds).c_str());
            std::printf("input: T=%lld tokens, %s\n", static_cast<long long>(r.tokens), r.input_desc.c_str());
            std::printf("forward: backend %s, mode %s: %s\n", backend_name(req.backend), mode_name(req.mode),
                        format_seconds(r.forward_seconds).c_str());
            if (r.accuracy)
              std::printf("accuracy vs unquantized fp32 layer (same routing): %s\n", describe(*r.accuracy).c_str());
            if (r.parallel) {
              const ParallelRunResult& p = *r.parallel;
              std::printf("parallel: ep %d x tp %d = %d ranks on the cpu, one after another; each loaded only its "
                          "shard (max %s per rank, %s in all) in %s\n",
                          p.ep, p.tp, p.ep * p.tp, format_bytes(p.max_rank_bytes).c_str(),
                          format_bytes(p.total_bytes).c_str(), format_seconds(p.seconds).c_str());
              std::printf("  sum of rank outputs (all-reduce) vs unsharded: %s%s\n",
                          p.allreduce_bitwise ? "bitwise equal" : describe(p.allreduce).c_str(),
                          p.allreduce_bitwise ? "" : " (fp32 reassociation)");
              std::printf("  fixed-order combine (EP dispatch/combine) vs unsharded: %s%s\n",
                          p.combined_bitwise ? "bitwise equal" : describe(p.combined).c_str(),
                          p.combined_bitwise ? "" : (p.tp > 1 ? " (TP splits GEMM2's K sum)" : " (UNEXPECTED for tp 1)"));
            }
            if (!req.output_path.empty())
              std::printf("wrote: %s (out F32[%lld, %lld])\n", req.output_path.c_str(), static_cast<long long>(r.tokens),
                          static_cast<long long>(r.spec.hidden));
          }};
}

}  // namespace nvfp4moe::cli
