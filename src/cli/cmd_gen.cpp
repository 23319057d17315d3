// `nvfp4moe gen`: writes a synthetic NVFP4 checkpoint in exact ModelOpt layout (model/synthetic.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "cli/cli_common.h"
#include "model/synthetic.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::cli {

namespace {

// CLI11 binds plain values; these copy the ones given on the command line into the optional fields, so
// everything not given keeps the preset's value.
template <typename T>
void set_if(const CLI::Option* opt, const T& value, std::optional<T>& field) {
  if (opt->count() > 0) field = value;
}

void refuse_non_empty(const std::string& dir, bool force) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  NVFP4MOE_CHECK(fs::is_directory(dir, ec), ArgumentError, "--out ", dir, " exists and is not a directory");
  NVFP4MOE_CHECK(force || fs::is_empty(dir, ec), ArgumentError, "--out ", dir,
                 " exists and is not empty (use --force to replace it)");
}

}  // namespace

Command add_gen_command(CLI::App& parent) {
  struct Opts {
    model::SyntheticOptions s;
    std::string out, routing, activation, style;
    int64_t hidden = 0, intermediate = 0, experts = 0, top_k = 0, shared = 0, n_group = 0, topk_group = 0;
    double scaling = 1.0;  // double: a value past the float range is refused, not turned into inf
    double shard_mb = 0;
    bool force = false, no_norm = false;
    CLI::Option *o_hidden, *o_inter, *o_experts, *o_topk, *o_shared, *o_ngroup, *o_topkgroup, *o_scaling,
        *o_routing, *o_activation, *o_style, *o_shard, *o_no_norm;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* app = parent.add_subcommand(
      "gen", "Write a synthetic NVFP4 MoE checkpoint (ModelOpt layout: config.json, hf_quant_config.json, "
             "sharded safetensors) from random weights quantized like the exporter");
  const auto presets = model::synthetic_presets();
  app->add_option("--preset", o->s.preset, "Model shape and family")->check(CLI::IsMember(presets));
  o->o_hidden = app->add_option("--hidden", o->hidden, "H (multiple of 16, <= 65536)")
                    ->check(CLI::Range(int64_t{1}, kMaxDim));
  o->o_inter = app->add_option("--intermediate", o->intermediate, "I per expert (multiple of 16, <= 65536)")
                   ->check(CLI::Range(int64_t{1}, kMaxDim));
  o->o_experts = app->add_option("--experts", o->experts, "E routed experts, 1..4096 (overrides a preset's count)")
                     ->check(CLI::Range(int64_t{1}, kMaxExperts));
  o->o_topk = app->add_option("--top-k", o->top_k, "Experts per token");
  o->o_routing = app->add_option("--routing", o->routing, "softmax (Qwen/Mixtral) or deepseek (sigmoid + bias, grouped)")
                     ->check(CLI::IsMember({"softmax", "deepseek"}));
  o->o_activation =
      app->add_option("--activation", o->activation, "swiglu (gated) or relu2 (non-gated, Nemotron-H)")
          ->check(CLI::IsMember({"swiglu", "relu2"}));
  o->o_shared = app->add_option("--shared-intermediate", o->shared, "Width of the shared expert (0 = none, <= 65536)")
                    ->check(CLI::Range(int64_t{0}, kMaxDim));
  o->o_ngroup = app->add_option("--n-group", o->n_group, "DeepSeek routing: expert groups");
  o->o_topkgroup = app->add_option("--topk-group", o->topk_group, "DeepSeek routing: groups kept per token");
  o->o_scaling = app->add_option("--scaling", o->scaling, "DeepSeek routing: routed_scaling_factor");
  o->o_no_norm = app->add_flag("--no-norm-topk", o->no_norm, "Do not renormalize the top-k weights");
  o->o_style = app->add_option("--style", o->style,
                               "config.json family: deepseek_v3, qwen3_moe, qwen2_moe, mixtral, gpt_oss, nemotron_h");
  app->add_option("--layers", o->s.layers, "Decoder layers (num_hidden_layers), 1..1024 (default 1)")
      ->check(CLI::Range(1, kMaxLayers));
  app->add_option("--dense-layers", o->s.first_dense_layers, "The first D layers are dense (default 0)")
      ->check(CLI::Range(0, kMaxLayers - 1));
  app->add_option("--seed", o->s.seed, "Seed of the random weights (default 1)")->check(seed_check());
  app->add_option("--out", o->out, "Output directory")->required();
  o->o_shard = app->add_option("--shard-mb", o->shard_mb, "Maximum shard size in MB, > 0 (default 4096)");
  app->add_option("--calibration-tokens", o->s.calibration_tokens,
                  "Random tokens per expert for the input_scale calibration, 1..64 (default 8)")
      ->check(CLI::Range(1, model::kMaxCalibrationTokens));
  app->add_flag("--force", o->force, "Replace an existing non-empty --out directory");

  return {app, [o] {
            model::SyntheticOptions s = o->s;
            NVFP4MOE_CHECK(!s.preset.empty() || (o->o_hidden->count() && o->o_inter->count() &&
                                                 o->o_experts->count() && o->o_topk->count()),
                           ArgumentError,
                           "gen needs --preset NAME or all of --hidden, --intermediate, --experts and --top-k");
            set_if(o->o_hidden, o->hidden, s.hidden);
            set_if(o->o_inter, o->intermediate, s.intermediate);
            set_if(o->o_experts, o->experts, s.experts);
            set_if(o->o_topk, o->top_k, s.top_k);
            set_if(o->o_shared, o->shared, s.shared_intermediate);
            set_if(o->o_ngroup, o->n_group, s.n_group);
            set_if(o->o_topkgroup, o->topk_group, s.topk_group);
            if (o->o_scaling->count()) s.routed_scaling_factor = scaling_from_flag(o->scaling);
            if (o->o_no_norm->count()) s.norm_topk_prob = false;
            if (o->o_routing->count())
              s.routing = o->routing == "deepseek" ? Routing::SigmoidGroupedTopK : Routing::SoftmaxTopK;
            if (o->o_activation->count())
              s.activation = o->activation == "relu2" ? Activation::Relu2 : Activation::SwiGLU;
            if (o->o_style->count()) {
              model::ModelStyle style;
              NVFP4MOE_CHECK(model::style_from_name(o->style, &style), ArgumentError,
                             "--style must be one of deepseek_v3, qwen3_moe, qwen2_moe, mixtral, gpt_oss, "
                             "nemotron_h, got '", o->style, "'");
              s.style = style;
            }
            if (o->o_shard->count()) s.max_shard_bytes = shard_bytes_from_mb(o->shard_mb);
            s.overwrite = o->force;

            // Resolve first: a bad combination is refused before the directory is touched.
            const model::SyntheticModel m = model::resolve_synthetic(s);
            refuse_non_empty(o->out, o->force);
            std::printf("generating %s into %s (%s of tensors)\n", m.describe().c_str(), o->out.c_str(),
                        format_bytes(m.checkpoint_bytes()).c_str());
            std::fflush(stdout);
            model::SyntheticResult r;
            {
              LoadProgress progress("writing");
              r = model::generate_synthetic_checkpoint(o->out, s, progress.fn());
            }
            std::printf("wrote %zu tensors, %s, in %s: %s\n", r.tensors, format_bytes(r.bytes).c_str(),
                        format_seconds(r.seconds).c_str(), r.dir.c_str());
          }};
}

}  // namespace nvfp4moe::cli
