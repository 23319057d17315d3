// main() of every GPU suite: without a CUDA device the suite is skipped visibly (exit 77 -> CTest "Skipped").
#include <cstdio>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
