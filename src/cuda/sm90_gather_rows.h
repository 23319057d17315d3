// The index arithmetic of GEMM1's gathered A (produce_tiles_gathered in sm90_nvfp4_grouped_gemm.cuh): which rows a
// producer thread copies into a stage and where they land, and which source row a GEMM row reads. Host and device:
// tests/cuda_host/test_sm90_gather_rows.cpp checks it without a GPU against the TMA's 128-byte swizzle (what the
// consumers' wgmma descriptors and ldmatrix offsets expect) and against the gather kernel's row mapping
// (sm90_nvfp4_gather_quant.cuh: row r = hidden[perm[r] / top_k], the appended shared rows hidden[r - routed]).
#pragma once

#include <cstdint>

#include "format/nvfp4.h"  // NVFP4_HD

namespace nvfp4moe::cuda::sm90 {

// The four producer warps copy a stage's A tile: thread t takes the 16-byte chunk t % 8 (8 bf16 of the k-tile's
// 64) of rows t / 8 + 16 i, i < gather_passes(BT): 16 rows a pass.
inline constexpr int kGatherCopyThreads = 128;
inline constexpr int kGatherRowsPerPass = kGatherCopyThreads / 8;
constexpr int gather_passes(int block_t) { return (block_t + kGatherRowsPerPass - 1) / kGatherRowsPerPass; }

NVFP4_HD int gather_copy_row(int tid, int pass) { return tid / 8 + kGatherRowsPerPass * pass; }

// Byte offset of a (row, 16-byte chunk) in a stage's A tile of 128-byte rows with the 128-byte swizzle, as the TMA
// writes it into a 1024-byte aligned stage: chunk c of row r at c ^ (r % 8).
NVFP4_HD uint32_t swizzled_chunk_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Where thread tid's copy of pass 0 lands; pass i lands kGatherPassBytes * i further on (rows 16 apart keep their
// row % 8, so the swizzle does not change between a thread's passes).
inline constexpr uint32_t kGatherPassBytes = kGatherRowsPerPass * 128;
NVFP4_HD uint32_t gather_copy_offset(int tid) { return swizzled_chunk_offset(tid / 8, tid % 8); }

// The source row of GEMM row r, or -1 (the copy zero-fills): with a permutation, rows r < perm_rows read
// perm_value / top_k (perm_value = perm[r]; negative: -1) and the rows after r - perm_rows + shared_base (a shared
// expert's rows, one per token, from the source's row shared_base on); without one, row r. Outside [0, src_rows):
// -1.
NVFP4_HD int gather_source_row(int r, bool has_perm, int perm_rows, int perm_value, int top_k, int src_rows,
                               int shared_base = 0) {
  int src = r;
  if (has_perm) src = r < perm_rows ? (perm_value < 0 ? -1 : perm_value / top_k) : r - perm_rows + shared_base;
  return src >= 0 && src < src_rows ? src : -1;
}

}  // namespace nvfp4moe::cuda::sm90
