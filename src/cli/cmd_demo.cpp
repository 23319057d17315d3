// `nvfp4moe demo`: the whole path in a few seconds on any machine. Generates a small Qwen3-30B-like checkpoint
// in a temporary folder, loads its MoE layer, runs it in both numerics modes on the best backend available, and
// reports the accuracy against the unquantized fp32 layer and the time. The folder is removed afterwards.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "model/synthetic.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::cli {

namespace {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on scope exit, errors included.
class TempDir {
 public:
  TempDir() {
    std::string base = std::filesystem::temp_directory_path().string() + "/nvfp4moe-demo-XXXXXX";
    std::vector<char> buf(base.begin(), base.end());
    buf.push_back('\0');
    NVFP4MOE_CHECK(mkdtemp(buf.data()) != nullptr, Error, "demo: cannot create a temporary directory ", base);
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace

Command add_demo_command(CLI::App& parent) {
  struct Opts {
    int64_t tokens = 32;
    std::string backend = "auto";
    uint64_t seed = 1;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* app = parent.add_subcommand(
      "demo", "Generate a small checkpoint in a temporary folder, run its MoE layer in both modes, report accuracy and time");
  app->add_option("--tokens", o->tokens, "Tokens of random input (default 32)")->check(CLI::Range(1, 4096));
  app->add_option("--backend", o->backend, "auto (cuda when a device is present, else cpu), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app->add_option("--seed", o->seed, "Seed of weights and input (default 1)")->check(seed_check());

  return {app, [o] {
            Backend backend = Backend::Cpu;
            if (o->backend == "auto") backend = cuda_backend_available() ? Backend::Cuda : Backend::Cpu;
            else backend_from_name(o->backend, &backend);

            // Qwen3-30B-A3B's family and routing (softmax top-8, renormalized, SwiGLU) at a quarter of its width
            // and with 16 of its 128 experts, so the CPU reference finishes in about a second.
            model::SyntheticOptions s;
            s.preset = "qwen3-30b";
            s.hidden = 1024;
            s.intermediate = 384;
            s.experts = 16;
            s.layers = 1;
            s.seed = o->seed;
            s.calibration_tokens = 32;  // input scales from more tokens: fewer clipped activations in w4a4

            std::string tmp_path;
            {
            TempDir tmp;
            tmp_path = tmp.path();
            const std::string dir = tmp.path() + "/checkpoint";
            std::printf("nvfp4moe demo\n");
            std::printf("1. generate: a synthetic NVFP4 checkpoint (ModelOpt layout) shaped like Qwen3-30B-A3B, reduced\n");
            std::fflush(stdout);
            const model::SyntheticResult g = model::generate_synthetic_checkpoint(dir, s);
            std::printf("   %s\n   %zu tensors, %s, in %s, at %s\n", g.model.describe().c_str(), g.tensors,
                        format_bytes(g.bytes).c_str(), format_seconds(g.seconds).c_str(), g.dir.c_str());

            auto checkpoint = Checkpoint::open(dir);
            const std::vector<int> moe = checkpoint->moe_layers();
            NVFP4MOE_CHECK(!moe.empty(), Error, "demo: the generated checkpoint has no MoE layer");
            const int layer = moe.front();
            std::printf("2. load: %s\n", checkpoint->spec(layer).describe().c_str());
            std::printf("3. run: T=%lld tokens on the %s backend%s, against the unquantized fp32 layer (same routing)\n",
                        static_cast<long long>(o->tokens), backend_name(backend),
                        o->backend == "auto" && backend == Backend::Cpu ? " (no CUDA device available)" : "");
            std::fflush(stdout);
            for (Mode mode : {Mode::W4A16, Mode::W4A4}) {
              LayerRunRequest req;
              req.layer = layer;
              req.mode = mode;
              req.backend = backend;
              req.tokens = o->tokens;
              req.seed = o->seed;
              const LayerRunResult r = run_layer(*checkpoint, req);
              if (mode == Mode::W4A16)
                std::printf("   input: %s\n   weights: %s packed, loaded in %s\n", r.input_desc.c_str(),
                            format_bytes(r.weight_bytes).c_str(), format_seconds(r.load_seconds).c_str());
              std::printf("   %-6s forward %9s   %s\n", mode_name(mode), format_seconds(r.forward_seconds).c_str(),
                          describe(*r.accuracy).c_str());
              std::fflush(stdout);
            }
            }
            std::printf("4. cleanup: removed %s\n", tmp_path.c_str());
          }};
}

}  // namespace nvfp4moe::cli
