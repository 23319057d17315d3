// `nvfp4moe calibrate IN_NVFP4 OUT --calibration FILE`: re-measures the input scales of an NVFP4 (ModelOpt)
// checkpoint from sample activations and writes a copy with them (model/quantize.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/cli_common.h"
#include "model/quantize.h"

namespace nvfp4moe::cli {

Command add_calibrate_command(CLI::App& parent) {
  struct Opts {
    std::string in, out;
    model::CalibrationSource c;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* app = parent.add_subcommand(
      "calibrate", "Re-measure an NVFP4 checkpoint's input scales from sample activations; write a new checkpoint");
  app->add_option("in", o->in, "NVFP4 (ModelOpt) checkpoint directory")->required();
  app->add_option("out", o->out, "Output directory (must not exist)")->required();
  app->add_option("--calibration", o->c.file, "safetensors file with layer.L.hidden [N, H] per MoE layer");
  app->add_option("--random-calibration", o->c.random_tokens,
                  "N random N(0,1) tokens per layer instead, 1..65536 (smoke test)")
      ->check(CLI::Range(int64_t{1}, model::kMaxRandomCalibrationTokens));
  app->add_option("--seed", o->c.seed, "Seed of --random-calibration (default 1)")->check(seed_check());
  return {app, [o] {
            const model::CalibrateResult r = model::calibrate_checkpoint(o->in, o->out, o->c);
            std::printf("calibrated %zu input scales of %zu MoE layer(s) in %s: %s\n", r.input_scales_written,
                        r.moe_layers.size(), format_seconds(r.seconds).c_str(), o->out.c_str());
          }};
}

}  // namespace nvfp4moe::cli
