// The `nvfp4moe` command: gen, inspect, run, demo, bench, quantize, calibrate. Every failure ends in ONE line on stderr,
// "nvfp4moe: error: ...", with exit code 1 (runtime errors) or 2 (command-line errors).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::cli {
Command add_bench_command(CLI::App& parent);  // cmd_bench.cpp
}

namespace {

// Messages may carry newlines from deeper layers; the contract is one line.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

int fail(int code, const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "nvfp4moe: error: %s\n", one_line(message).c_str());
  return code;
}

}  // namespace

namespace nvfp4moe::cli {
Command add_quantize_command(CLI::App& parent);   // cmd_quantize.cpp
Command add_calibrate_command(CLI::App& parent);  // cmd_calibrate.cpp
}  // namespace nvfp4moe::cli

int main(int argc, char** argv) {
  CLI::App app{"nvfp4moe: run the MoE layers of NVFP4 (ModelOpt) checkpoints exactly, on CPU or CUDA"};
  app.set_version_flag("--version", "nvfp4moe 0.1.0");
  app.require_subcommand(1);
  app.fallthrough(false);

  std::vector<nvfp4moe::cli::Command> commands;
  commands.push_back(nvfp4moe::cli::add_gen_command(app));
  commands.push_back(nvfp4moe::cli::add_inspect_command(app));
  commands.push_back(nvfp4moe::cli::add_run_command(app));
  commands.push_back(nvfp4moe::cli::add_demo_command(app));
  commands.push_back(nvfp4moe::cli::add_bench_command(app));
  commands.push_back(nvfp4moe::cli::add_quantize_command(app));
  commands.push_back(nvfp4moe::cli::add_calibrate_command(app));

  // CLI11 reports an unknown first word as "A subcommand is required"; name it instead.
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const auto& c : commands) known = known || c.app->get_name() == argv[1];
    if (!known)
      return fail(2, std::string("unknown command '") + argv[1] +
                         "' (expected one of: gen, inspect, run, demo, bench, quantize, calibrate; see nvfp4moe --help)");
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string where;
    for (const auto* sub : app.get_subcommands()) where = std::string(" nvfp4moe ") + sub->get_name();
    if (where.empty()) where = " nvfp4moe";
    return fail(2, std::string(e.what()) + " (see" + where + " --help)");
  }

  try {
    for (const auto& c : commands) {
      if (c.app->parsed()) {
        c.run();
        std::fflush(stdout);
        return 0;
      }
    }
    return fail(2, "no subcommand given (see nvfp4moe --help)");
  } catch (const nvfp4moe::Error& e) {
    return fail(1, e.what());
  } catch (const std::bad_alloc&) {
    return fail(1, "out of memory");
  } catch (const std::exception& e) {
    return fail(1, e.what());
  }
}
