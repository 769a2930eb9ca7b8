// CUDA runtime error checks in the library's one error convention (sa::Error, SA_ERROR_CUDA).
#pragma once

#include <cuda_runtime_api.h>

#include "common/error.hpp"

#define SA_CUDA_CHECK(expr)                                                                \
  do {                                                                                     \
    cudaError_t sa_cuda_err_ = (expr);                                                     \
    SA_CHECK(sa_cuda_err_ == cudaSuccess, SA_ERROR_CUDA,                                   \
             #expr << " failed: " << cudaGetErrorName(sa_cuda_err_) << ": "                \
                   << cudaGetErrorString(sa_cuda_err_));                                   \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, without synchronising.
#define SA_CUDA_CHECK_LAUNCH() SA_CUDA_CHECK(cudaGetLastError())
