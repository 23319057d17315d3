// Internal pieces of the sharding (src/api/parallel.cpp) that the loader and MoeLayer::create share.
#pragma once

#include <cstdint>
#include <memory>

#include "nvfp4moe/moe.h"
#include "nvfp4moe/parallel.h"

namespace nvfp4moe::parallel_detail {

// Copies the TP slice [i0, i1) of expert e_src of src into expert e_dst of dst (allocated for the slice):
// gate rows i0..i1-1 and up rows I+i0..I+i1-1 of w13 and their scales, columns i0..i1-1 of w2 and its
// scales, the expert's per-tensor scales.
void slice_expert(const StackedExperts& src, int64_t e_src, StackedExperts& dst, int64_t e_dst, int64_t i0,
                  int64_t i1);

// The option checks of a sharded layer (backend cpu, no shared_max_input_scale ...).
void check_sharded_options(const MoeLayerOptions& options);
std::unique_ptr<MoeLayer> create_sharded(MoeShard shard, const MoeLayerOptions& options);

}  // namespace nvfp4moe::parallel_detail
