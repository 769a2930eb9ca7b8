#include "test_util.hpp"

#include <cuda_runtime_api.h>

namespace sa_test {

bool cuda_available() {
  static const bool available = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return available;
}

}  // namespace sa_test
