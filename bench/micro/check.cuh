// The microbenchmarks' shared host pieces: one error check (print the CUDA error and exit), the
// timing of a launch by events, and the mean of the per-CTA cycle counts a kernel writes.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

// Milliseconds of the launches `launch` makes, timed by events around them.
template <class Launch>
float time_ms(Launch launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  launch();
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  CK(cudaGetLastError());
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms;
}

// The mean of n per-CTA cycle counts in device memory.
inline double mean_cycles(const unsigned long long* cycles, int n) {
  std::vector<unsigned long long> cyc(n);
  CK(cudaMemcpy(cyc.data(), cycles, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
  double mean = 0;
  for (auto x : cyc) mean += double(x) / n;
  return mean;
}
