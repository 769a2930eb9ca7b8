// GPU tests are registered in every build and skip themselves where there is no CUDA device (CI).
#include <cuda_runtime_api.h>

#include "test_util.hpp"

TEST(Gpu, DeviceIsUsable) {
  SA_SKIP_WITHOUT_GPU();
  int dev = -1;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, dev), cudaSuccess);
  EXPECT_GE(prop.major, 8) << "the portable path needs sm80 or newer";
}

#if SA_HAVE_SM90
#include "sm90/toolchain_probe.hpp"

TEST(Gpu, Sm90ObjectsRunOnHopper) {
  SA_SKIP_WITHOUT_GPU();
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  if (prop.major != 9) GTEST_SKIP() << "not an sm_90 device";
  EXPECT_EQ(sa::sm90::toolchain_probe(), 42);
}
#endif
