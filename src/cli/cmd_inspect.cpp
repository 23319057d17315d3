// `nvfp4moe inspect DIR`: the checkpoint's layers, experts, shapes, bytes and scale statistics.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/cli_common.h"

namespace nvfp4moe::cli {

Command add_inspect_command(CLI::App& parent) {
  auto dir = std::make_shared<std::string>();
  CLI::App* app = parent.add_subcommand("inspect", "Print a checkpoint's MoE layers, shapes, bytes and scale statistics");
  app->add_option("dir", *dir, "Checkpoint directory (config.json, hf_quant_config.json, *.safetensors)")->required();
  return {app, [dir] {
            auto checkpoint = Checkpoint::open(*dir);
            const std::string report = checkpoint->inspect();
            std::fwrite(report.data(), 1, report.size(), stdout);
            if (!report.empty() && report.back() != '\n') std::fputc('\n', stdout);
          }};
}

}  // namespace nvfp4moe::cli
