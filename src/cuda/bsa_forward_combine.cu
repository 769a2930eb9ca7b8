// Split-KV forward, the combine pass (bsa_forward_combine.hpp).
#include "cuda/bsa_forward_combine.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/cuda_check.hpp"
#include "common/error.hpp"

namespace sa::portable {
namespace {

constexpr int kWarpsPerCta = 8;
constexpr int kMaxSplits = 32;  // bsa_forward (sm90) asks for at most 16

template <class Element>
__device__ __forceinline__ Element to_element(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 to_element<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half to_element<__half>(float x) {
  return __float2half_rn(x);
}

template <class Element, int kD>
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    combine_kernel(const __grid_constant__ BsaCombineArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  const int64_t rows = static_cast<int64_t>(a.B) * a.Hq * a.Sq;
  if (row >= rows) return;
  const int64_t i = row % a.Sq;
  const int64_t bh = row / a.Sq;
  const int64_t h = bh % a.Hq, b = bh / a.Hq;

  // Lane s (< splits) holds split s's LSE; the row maximum and the weights' sum by shuffles.
  const float l = lane < a.splits ? a.lse_part[static_cast<int64_t>(lane) * rows + row] : -INFINITY;
  float m = l;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const float w = m == -INFINITY ? 0.f : expf(l - m);
  float sum = w;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;

  constexpr int kPerLane = kD / 32;  // columns lane + 32 c
  float acc[kPerLane];
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) acc[c] = 0.f;
  for (int s = 0; s < a.splits; ++s) {
    const float ws = __shfl_sync(0xffffffffu, w, s) * inv;
    if (ws == 0.f) continue;  // warp-uniform: an empty split (its o_s is 0 anyway)
    const float* src = a.o_part + (static_cast<int64_t>(s) * rows + row) * kD;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) acc[c] = fmaf(ws, src[lane + 32 * c], acc[c]);
  }
  Element* dst = static_cast<Element*>(a.o.data) + a.o.offset(b, h, i, 0);
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) dst[lane + 32 * c] = to_element<Element>(acc[c]);
  if (lane == 0)
    a.lse[b * a.lse_stride[0] + h * a.lse_stride[1] + i * a.lse_stride[2]] =
        sum > 0.f ? m + logf(sum) : -INFINITY;
}

template <class Element>
void launch(const BsaCombineArgs& a, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(a.B) * a.Hq * a.Sq;
  const unsigned grid = static_cast<unsigned>((rows + kWarpsPerCta - 1) / kWarpsPerCta);
  if (a.D == 128)
    combine_kernel<Element, 128><<<grid, kWarpsPerCta * 32, 0, stream>>>(a);
  else
    combine_kernel<Element, 64><<<grid, kWarpsPerCta * 32, 0, stream>>>(a);
  SA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void bsa_forward_combine(const BsaCombineArgs& a, cudaStream_t stream) {
  SA_CHECK(a.splits >= 1 && a.splits <= kMaxSplits, SA_ERROR_INTERNAL,
           "bsa_forward_combine: " << a.splits << " splits (supports 1 to " << kMaxSplits << ")");
  SA_CHECK(a.D == 64 || a.D == 128, SA_ERROR_INTERNAL,
           "bsa_forward_combine: D = " << a.D << " (supports 64, 128)");
  if (static_cast<int64_t>(a.B) * a.Hq * a.Sq == 0) return;
  if (a.dtype == SA_DTYPE_FP16)
    launch<__half>(a, stream);
  else
    launch<__nv_bfloat16>(a, stream);
}

}  // namespace sa::portable
