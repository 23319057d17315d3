// `nvfp4moe quantize IN OUT`: a bf16/fp16/fp32 HF MoE checkpoint -> an NVFP4 ModelOpt-layout checkpoint,
// quantized exactly as nvfp4-format.md section 3 on the CPU or the GPU (--device; bitwise the same), streamed layer
// by layer (model/quantize.h). Prints the time and throughput of each layer's quantization.
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
    std::string device = "cpu";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* app = parent.add_subcommand(
      "quantize", "Quantize a bf16/fp16/fp32 MoE checkpoint's experts to NVFP4 (CPU or GPU) and write a ModelOpt checkpoint");
  app->add_option("in", o->in, "Unquantized checkpoint directory (config.json, *.safetensors)")->required();
  app->add_option("out", o->out, "Output directory (must not exist)")->required();
  app->add_option("--calibration", o->q.calibration.file,
                  "safetensors file with sample hidden states layer.L.hidden [N, H] per MoE layer (input scales)");
  app->add_option("--random-calibration", o->q.calibration.random_tokens,
                  "Calibrate input scales on N random N(0,1) tokens per layer instead, 1..65536 (smoke test)")
      ->check(CLI::Range(int64_t{1}, model::kMaxRandomCalibrationTokens));
  app->add_option("--seed", o->q.calibration.seed, "Seed of --random-calibration (default 1)")->check(seed_check());
  app->add_option("--shard-mb", o->shard_mb, "Shard size in MB, > 0 (default 4000)");
  app->add_option("--device", o->device, "Quantize the experts on: cpu (default) or cuda (GPU 0; the same bits)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  return {app, [o] {
            o->q.max_shard_bytes = shard_bytes_from_mb(o->shard_mb);
            o->q.cuda = o->device == "cuda";
            o->q.on_layer = [](const model::LayerTiming& t) {
              std::printf("layer %d: quantized %.3f GB of expert weights in %.3f s (%.2f GB/s), calibrated in %.3f s\n",
                          t.layer, t.source_bytes / 1e9, t.quantize_seconds,
                          t.quantize_seconds > 0 ? t.source_bytes / 1e9 / t.quantize_seconds : 0.0,
                          t.calibrate_seconds);
              std::fflush(stdout);
            };
            const model::QuantizeResult r = model::quantize_checkpoint(o->in, o->out, o->q);
            std::string layers;
            for (int l : r.moe_layers) layers += (layers.empty() ? "" : ",") + std::to_string(l);
            std::printf("quantized %zu expert projections in MoE layers %s, copied %zu tensors unchanged, in %s "
                        "(%s; quantizing %.3f GB took %.3f s, %.2f GB/s): %s\n",
                        r.quantized_projections, layers.c_str(), r.copied_tensors, format_seconds(r.seconds).c_str(),
                        r.device == "cuda" ? "GPU" : "CPU", r.source_bytes / 1e9, r.quantize_seconds,
                        r.quantize_seconds > 0 ? r.source_bytes / 1e9 / r.quantize_seconds : 0.0, o->out.c_str());
          }};
}

}  // namespace nvfp4moe::cli
