// `nvfp4moe run --ep N --tp M` on the CPU: every rank's shard loaded on its own (only its experts' bytes, only
// its rows/columns), the ranks run one after another in this process, their partial outputs summed
// (all-reduce) and, separately, their expert outputs combined per token in slot order (what the NCCL EP
// combine does), each compared with the unsharded layer (docs/parallel.md). The multi-process NCCL launch on
// GPUs is not built (issue 6: no multi-GPU machine to run it on).
#include <cstring>

#include "cli/cli_common.h"
#include "cpu/shard.h"
#include "nvfp4moe/error.h"
#include "nvfp4moe/parallel.h"

namespace nvfp4moe::cli {

ParallelRunResult run_parallel_on_cpu(const Checkpoint& checkpoint, int layer, Mode mode, int ep, int tp,
                                      const std::vector<uint16_t>& hidden_bf16, int64_t tokens,
                                      const std::vector<int32_t>& topk_ids, const std::vector<float>& topk_weights,
                                      const std::vector<float>& unsharded_out) {
  ParallelRunResult r;
  r.ep = ep;
  r.tp = tp;
  const double t0 = now_seconds();
  std::vector<MoeShard> shards;
  for (int rank = 0; rank < ep * tp; ++rank) {
    MoeShard s = checkpoint.load_shard(layer, ParallelConfig::of_rank(ep, tp, rank));
    // As MoeLayer::create: NaN input scales (a W4A16 checkpoint) are refused for w4a4, ignored by w4a16.
    for (auto* v : {&s.local.experts.w13_input_scale, &s.local.experts.w2_input_scale, &s.local.shared.w13_input_scale,
                    &s.local.shared.w2_input_scale})
      for (float& x : *v)
        if (x != x) {
          NVFP4MOE_CHECK(mode != Mode::W4A4, ArgumentError, "--mode w4a4: layer ", layer,
                         " has no activation input scales (a W4A16 checkpoint)");
          x = 1.0f;
        }
    const size_t b = s.local.packed_bytes();
    r.total_bytes += b;
    r.max_rank_bytes = std::max(r.max_rank_bytes, b);
    shards.push_back(std::move(s));
  }
  const size_t n = unsharded_out.size();
  std::vector<float> sum(n);
  r.out.assign(n, 0.0f);
  cpu::run_ranks(shards, mode, hidden_bf16.data(), tokens, topk_ids.data(), topk_weights.data(), sum.data(),
                 r.out.data());
  r.seconds = now_seconds() - t0;
  r.allreduce = compare(sum.data(), unsharded_out.data(), n);
  r.combined = compare(r.out.data(), unsharded_out.data(), n);
  r.allreduce_bitwise = std::memcmp(sum.data(), unsharded_out.data(), n * 4) == 0;
  r.combined_bitwise = std::memcmp(r.out.data(), unsharded_out.data(), n * 4) == 0;
  return r;
}

}  // namespace nvfp4moe::cli
