// Shared pieces of the `nvfp4moe` command: the subcommand table, load progress, accuracy metrics, timing and
// the one-layer runner that both `run` and `demo` use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/moe.h"
#include "nvfp4moe/spec.h"

namespace CLI {
class App;
class Validator;
}

namespace nvfp4moe::cli {

// One subcommand: its CLI11 node and what to do when it was selected (options are bound at registration).
struct Command {
  CLI::App* app = nullptr;
  std::function<void()> run;
};

Command add_gen_command(CLI::App& parent);
Command add_inspect_command(CLI::App& parent);
Command add_run_command(CLI::App& parent);
Command add_demo_command(CLI::App& parent);

// ------------------------------------------------------------------ bounds of the size flags
// Every product the commands form from these (T x H, T x E, E x H x I, ep x tp ...) stays far from int64 overflow,
// and a value past a bound is refused naming the flag (CLI11 alone saturates an out-of-range integer silently).
constexpr int64_t kMaxTokens = 65536;  // run --tokens (quantize/calibrate --random-calibration: quantize.h)
constexpr int64_t kMaxDim = 65536;     // bench/gen --hidden, --intermediate, --shared-intermediate
constexpr int64_t kMaxExperts = 4096;  // bench/gen --experts
constexpr int kMaxLayers = 1024;       // gen --layers
constexpr int kMaxRanks = 4096;        // run --ep, --tp (each)

// --seed: an integer in [0, 2^64 - 1]; CLI11 alone wraps "-1" to 2^64 - 1 and saturates a larger value.
CLI::Validator seed_check();
// --shard-mb MB -> bytes: refuses a non-finite or non-positive value (ArgumentError naming the flag); a value past
// 2^64 bytes means no limit (SIZE_MAX), one under a byte means one byte (every tensor in its own shard).
size_t shard_bytes_from_mb(double mb);
// --scaling (gen, bench) -> routed_scaling_factor: refuses a value that is not finite, not > 0 or past the float
// range (read as a double so that 1e39 is refused, not cast to inf), naming the flag.
float scaling_from_flag(double scaling);

// ------------------------------------------------------------------ small helpers (cli_common.cpp)
double now_seconds();                      // monotonic clock
std::string format_bytes(size_t bytes);    // "12.3 MiB"
std::string format_seconds(double s);      // "1.23 s" / "45.6 ms"

// A ProgressFn that draws "label: 42% (1.2 GiB / 2.9 GiB)" on stderr (in place on a terminal, every 10%
// otherwise) and ends its line when destroyed or finish()ed. The loader only calls it after one second.
class LoadProgress {
 public:
  explicit LoadProgress(std::string label);
  ~LoadProgress();
  ProgressFn fn();
  void finish();

 private:
  std::string label_;
  bool tty_ = false;
  bool drawn_ = false;
  int last_decile_ = -1;
};

// Accuracy of `got` against the fp32 reference `ref` (n values).
struct Accuracy {
  double cosine = 0;     // <got, ref> / (|got| |ref|); 1 when both are zero
  double rel_l2 = 0;     // |got - ref| / |ref|
  double max_abs = 0;    // max |got - ref|
  double rms_ratio = 0;  // rms(got) / rms(ref): catches a scale error a cosine cannot see
};
Accuracy compare(const float* got, const float* ref, size_t n);
std::string describe(const Accuracy& a);

// ------------------------------------------------------------------ one layer, end to end (cmd_run.cpp)
enum class RoutingSource { Auto, RouterWeight, RandomLogits };

struct LayerRunRequest {
  int layer = 0;
  Mode mode = Mode::W4A16;
  Backend backend = Backend::Cpu;
  std::string input_path;        // empty: random input
  std::string output_path;       // empty: no output file
  int64_t tokens = 16;           // random input only
  uint64_t seed = 1;             // random input only
  RoutingSource routing_source = RoutingSource::Auto;
  bool reference = true;         // compare against the unquantized fp32 layer
  bool quiet_load = false;       // no "loaded ..." line (demo prints its own)
  int ep = 1, tp = 1;            // > 1: also run the ep x tp ranks' shards on the cpu and compare (run_parallel.cpp)
};

// `run --ep/--tp`: every rank's shard loaded on its own (Checkpoint::load_shard) and run one after another on
// the CPU; their sum (all-reduce) and their fixed-order combine against the unsharded layer's out.
struct ParallelRunResult {
  int ep = 1, tp = 1;
  size_t max_rank_bytes = 0, total_bytes = 0;  // packed weight bytes per rank (max) and over all ranks
  double seconds = 0;
  Accuracy allreduce, combined;                // vs the unsharded out
  bool allreduce_bitwise = false, combined_bitwise = false;
  std::vector<float> out;                      // [T, H] the fixed-order combine
};
ParallelRunResult run_parallel_on_cpu(const Checkpoint& checkpoint, int layer, Mode mode, int ep, int tp,
                                      const std::vector<uint16_t>& hidden_bf16, int64_t tokens,
                                      const std::vector<int32_t>& topk_ids, const std::vector<float>& topk_weights,
                                      const std::vector<float>& unsharded_out);

struct LayerRunResult {
  MoeSpec spec;
  int64_t tokens = 0;
  double load_seconds = 0;
  double forward_seconds = 0;
  size_t weight_bytes = 0;
  std::string input_desc;        // "random hidden (seed 1), router logits = hidden . router^T"
  std::optional<Accuracy> accuracy;
  std::vector<float> out;        // [T, H]
  std::optional<ParallelRunResult> parallel;  // request.ep * request.tp > 1
};

// Validates the request and the input file against the checkpoint's layer, loads the layer, runs it once
// on the requested backend, and (when asked) writes `out` atomically. Throws nvfp4moe::Error on any problem;
// no output file exists unless the whole run succeeded.
LayerRunResult run_layer(const Checkpoint& checkpoint, const LayerRunRequest& request);

// Copies host buffers to a CUDA device and back for the cuda backend (cuda_buffers.cpp). Throws a clear
// Error when the binary was built without CUDA or no device is present.
void forward_on_cuda(MoeLayer& layer, const std::vector<uint16_t>& hidden_bf16, int64_t tokens, int64_t hidden,
                     const std::vector<int32_t>& topk_ids, const std::vector<float>& topk_weights, int64_t top_k,
                     std::vector<float>& out, double* seconds);

}  // namespace nvfp4moe::cli
