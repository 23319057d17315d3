// `nvfp4moe quantize IN OUT`: a bf16/fp16/fp32 HF MoE checkpoint -> an NVFP4 ModelOpt-layout checkpoint,
// quantized on the CPU exactly as nvfp4-format.md section 3 (model/quantize.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/cli_common.h"
#include "model/quantize.h"

namespace nvfp4moe::cli {

Command add_quantize_command(CLI::App& parent) {
  struct Opts {
    std::string in, out;
    model::QuantizeOptions q;
    double shard_mb = 4000;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* app = parent.add_subcommand(
      "quantize", "Quantize a bf16/fp16/fp32 MoE checkpoint's experts to NVFP4 (CPU) and write a ModelOpt checkpoint");
  app->add_option("in", o->in, "Unquantized checkpoint directory (config.json, *.safetensors)")->required();
  app->add_option("out", o->out, "Output directory (must not exist)")->required();
  app->add_option("--calibration", o->q.calibration.file,
                  "safetensors file with sample hidden states layer.L.hidden [N, H] per MoE layer (input scales)");
  app->add_option("--random-calibration", o->q.calibration.random_tokens,
                  "Calibrate input scales on N random N(0,1) tokens per layer instead (smoke test)");
  app->add_option("--seed", o->q.calibration.seed, "Seed of --random-calibration (default 1)");
  app->add_option("--shard-mb", o->shard_mb, "Shard size in MB (default 4000)");
  return {app, [o] {
            o->q.max_shard_bytes = static_cast<size_t>(o->shard_mb * 1e6);
            const model::QuantizeResult r = model::quantize_checkpoint(o->in, o->out, o->q);
            std::string layers;
            for (int l : r.moe_layers) layers += (layers.empty() ? "" : ",") + std::to_string(l);
            std::printf("quantized %zu expert projections in MoE layers %s, copied %zu tensors unchanged, in %s "
                        "(CPU): %s\n",
                        r.quantized_projections, layers.c_str(), r.copied_tensors, format_seconds(r.seconds).c_str(),
                        o->out.c_str());
          }};
}

}  // namespace nvfp4moe::cli
