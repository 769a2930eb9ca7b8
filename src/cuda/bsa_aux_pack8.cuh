// 16-byte loads and stores of 8 consecutive 16-bit elements (bf16 or fp16, a runtime choice), for
// the memory-bound BSA backward passes (bsa_backward_aux.cu, bsa_backward_aux_packed.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace sa::portable {
namespace {

// 8 consecutive 16-bit elements -> float.
__device__ __forceinline__ void load8(const void* src, bool bf16, float (&out)[8]) {
  const uint4 raw = *static_cast<const uint4*>(src);
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned short lo = static_cast<unsigned short>(w[i] & 0xffffu);
    const unsigned short hi = static_cast<unsigned short>(w[i] >> 16);
    if (bf16) {
      out[2 * i] = __bfloat162float(__ushort_as_bfloat16(lo));
      out[2 * i + 1] = __bfloat162float(__ushort_as_bfloat16(hi));
    } else {
      out[2 * i] = __half2float(__ushort_as_half(lo));
      out[2 * i + 1] = __half2float(__ushort_as_half(hi));
    }
  }
}

// scale * 8 floats -> 8 consecutive 16-bit elements.
__device__ __forceinline__ void store8(void* dst, bool bf16, const float4& a, const float4& b,
                                       float scale) {
  const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    unsigned short lo, hi;
    if (bf16) {
      lo = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i] * scale));
      hi = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i + 1] * scale));
    } else {
      lo = __half_as_ushort(__float2half_rn(f[2 * i] * scale));
      hi = __half_as_ushort(__float2half_rn(f[2 * i + 1] * scale));
    }
    w[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  *static_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace
}  // namespace sa::portable
