// GPU tests of BSA packed batches (skip without a GPU). The CUDA kernels do not take packed
// batches yet (docs/planned.md): these check that every CUDA path refuses a packed call by
// name, under AUTO and forced, before anything runs or any output is touched (SPEC 3: no silent
// wrong answer). When the portable kernels land (gated), GpuBsaVarlen* grows their comparisons
// against the fp64 reference.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "sparse_attention/sparse_attention.h"
#include "sparse_attention/sparse_attention.hpp"
#include "test_util.hpp"

namespace {

namespace sa_cpp = sparse_attention;

// Device memory owned by a test.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(p); }
};

sa_tensor cuda_view(void* p, sa_dtype dtype, std::vector<int64_t> shape) {
  return sa_tensor_contiguous(p, dtype, static_cast<int32_t>(shape.size()), shape.data(),
                              SA_DEVICE_CUDA, 0);
}

TEST(GpuBsaVarlen, EveryCudaPathRefusesPackedBatchesByName) {
  SA_SKIP_WITHOUT_GPU();
  const int64_t T = 130, H = 2, D = 64, B = 2, Nq = 2, K = 2;
  DeviceBuffer q(T * H * D * 2), k(T * H * D * 2), v(T * H * D * 2), o(T * H * D * 2),
      lse(H * T * 4), idx(B * H * Nq * K * 4), cu(3 * 4);
  const int32_t offsets[3] = {0, 70, 130};
  ASSERT_EQ(cudaMemcpy(cu.p, offsets, sizeof(offsets), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(o.p, 0xff, T * H * D * 2), cudaSuccess);  // NaN in bf16
  for (sa_impl impl : {SA_IMPL_AUTO, SA_IMPL_PORTABLE, SA_IMPL_SM90}) {
    SCOPED_TRACE(sa_impl_name(impl));
    sa_cpp::BsaForwardArgs a;
    a.q = cuda_view(q.p, SA_DTYPE_BF16, {T, H, D});
    a.k = cuda_view(k.p, SA_DTYPE_BF16, {T, H, D});
    a.v = cuda_view(v.p, SA_DTYPE_BF16, {T, H, D});
    a.o = cuda_view(o.p, SA_DTYPE_BF16, {T, H, D});
    a.lse = cuda_view(lse.p, SA_DTYPE_FP32, {H, T});
    a.sparsity.q2k_index = cuda_view(idx.p, SA_DTYPE_INT32, {B, H, Nq, K});
    a.options.block_size = 64;
    a.options.cu_seqlens_q = cuda_view(cu.p, SA_DTYPE_INT32, {B + 1});
    a.options.cu_seqlens_k = cuda_view(cu.p, SA_DTYPE_INT32, {B + 1});
    a.options.impl = impl;
    const sa_cpp::Status st = sa_cpp::bsa_forward(a);
    EXPECT_EQ(st.code(), SA_ERROR_UNSUPPORTED) << st.to_string();
    EXPECT_NE(st.message().find("packed batches (options.cu_seqlens_q/k)"), std::string::npos)
        << st.message();
  }
  std::vector<uint16_t> host(static_cast<size_t>(T * H * D));
  ASSERT_EQ(cudaMemcpy(host.data(), o.p, host.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint16_t x : host) ASSERT_EQ(x, 0xffff) << "an output was touched";
}

}  // namespace
