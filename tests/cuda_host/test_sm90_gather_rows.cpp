// The index arithmetic of GEMM1's gathered A (src/cuda/sm90_gather_rows.h), host side: the producer threads'
// copies cover every (row, 16-byte chunk) of a stage's A tile exactly once and put each where the TMA's 128-byte
// swizzle does (the layout the consumers' wgmma descriptors and ldmatrix offsets read), for every prefill tile
// size; and the source rows are the gather kernel's (sm90_nvfp4_gather_quant.cuh) on random and adversarial
// permutations, with and without appended shared-expert rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "cuda/sm90_gather_rows.h"

namespace nvfp4moe::cuda::sm90 {
namespace {

// The TMA's 128-byte swizzle, written from its definition: within each 1024-byte atom of 8 rows of 128 bytes, the
// 16-byte unit index (address bits 4..6) is XORed with the row index within the atom (address bits 7..9).
uint32_t tma_swizzle_128b(uint32_t linear_offset) {
  return linear_offset ^ (((linear_offset >> 7) & 7u) << 4);
}

TEST(GatherRows, CopiesCoverTheTileOnceWhereTheTmaPutsThem) {
  for (const int bt : {16, 32, 64, 128, 144}) {
    SCOPED_TRACE("BT=" + std::to_string(bt));
    const int passes = gather_passes(bt);
    ASSERT_GE(passes * kGatherRowsPerPass, bt);
    ASSERT_LT((passes - 1) * kGatherRowsPerPass, bt);
    std::set<uint32_t> written;
    for (int tid = 0; tid < kGatherCopyThreads; ++tid)
      for (int i = 0; i < passes; ++i) {
        const int row = gather_copy_row(tid, i), chunk = tid % 8;
        ASSERT_LT(row, passes * kGatherRowsPerPass);
        // The kernel adds kGatherPassBytes per pass to the thread's pass-0 offset.
        const uint32_t kernel_offset = gather_copy_offset(tid) + kGatherPassBytes * static_cast<uint32_t>(i);
        const uint32_t tma_offset = tma_swizzle_128b(static_cast<uint32_t>(row * 128 + chunk * 16));
        ASSERT_EQ(kernel_offset, tma_offset) << "tid " << tid << " pass " << i;
        ASSERT_EQ(kernel_offset, swizzled_chunk_offset(row, chunk));
        if (row < bt) EXPECT_TRUE(written.insert(kernel_offset).second) << "chunk written twice: " << kernel_offset;
      }
    EXPECT_EQ(written.size(), static_cast<size_t>(bt) * 8) << "every chunk of the BT rows once";
    for (uint32_t off : written) EXPECT_LT(off, static_cast<uint32_t>(bt) * 128);
  }
}

// The gather kernel's row mapping (gather_kernel: with perm, rows below offsets[E] read hidden[perm[r] / top_k],
// the appended shared rows hidden[r - offsets[E]]; without, row r), rows past the source as zeros.
int gather_kernel_source(int r, const std::vector<int32_t>* perm, int routed, int top_k, int tokens) {
  long long src = r;
  if (perm != nullptr) {
    if (r < routed) {
      const int v = (*perm)[static_cast<size_t>(r)];
      if (v < 0) return -1;
      src = v / top_k;
    } else {
      src = r - routed;
    }
  }
  return src < tokens ? static_cast<int>(src) : -1;
}

TEST(GatherRows, SourceRowsAreTheGatherKernels) {
  std::mt19937 rng(17);
  for (const int top_k : {1, 2, 6, 8}) {
    for (const int tokens : {1, 7, 300}) {
      const int routed = tokens * top_k;
      std::vector<int32_t> perm(static_cast<size_t>(routed));
      for (int r = 0; r < routed; ++r) perm[static_cast<size_t>(r)] = r;
      std::shuffle(perm.begin(), perm.end(), rng);
      // adversarial entries: negative, one past the pairs, the last pair, 0
      if (routed >= 4) {
        perm[0] = -1;
        perm[1] = routed;
        perm[2] = routed - 1;
        perm[3] = 0;
      }
      const int rows = routed + tokens + 3;  // the shared expert's T rows, and 3 past the source
      for (int r = 0; r < rows; ++r) {
        const int pv = r < routed ? perm[static_cast<size_t>(r)] : 0;
        EXPECT_EQ(gather_source_row(r, true, routed, pv, top_k, tokens),
                  gather_kernel_source(r, &perm, routed, top_k, tokens))
            << "top_k " << top_k << " tokens " << tokens << " row " << r;
        EXPECT_EQ(gather_source_row(r, false, 0, 0, top_k, tokens), gather_kernel_source(r, nullptr, 0, top_k, tokens))
            << "identity, row " << r;
      }
    }
  }
  // perm_rows = offsets[E] may be 0 (no routed rows): every row is a shared row.
  EXPECT_EQ(gather_source_row(0, true, 0, 12345, 8, 4), 0);
  EXPECT_EQ(gather_source_row(3, true, 0, -7, 8, 4), 3);
  EXPECT_EQ(gather_source_row(4, true, 0, 0, 8, 4), -1);
  // The shared rows from a second half of the source (shared_base = T: w4a4 rows quantized once per scale).
  const int T = 5, k = 2, routed = T * k;
  for (int r = routed; r < routed + T + 2; ++r)
    EXPECT_EQ(gather_source_row(r, true, routed, 0, k, 2 * T, T), r - routed < T ? T + (r - routed) : -1) << r;
  EXPECT_EQ(gather_source_row(3, true, routed, 7, k, 2 * T, T), 3) << "routed rows keep perm / k";
}

}  // namespace
}  // namespace nvfp4moe::cuda::sm90
