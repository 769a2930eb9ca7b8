// TMA descriptors of BHSD-strided bf16 attention tensors, shared by the Hopper kernels' host
// sides (bsa_forward.cu, bsa_backward.cu).
#include "sm90/tma_descriptor.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "common/error.hpp"
#include "cuda/launch_checks.hpp"

namespace sa::sm90 {
namespace {

constexpr int64_t kMaxTmaStrideBytes = int64_t{1} << 40;

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                             cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<EncodeTiledFn>(nullptr);
    }
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

}  // namespace

// "" when a [B, H, S, D] bf16 tensor can be described by a TMA descriptor: 16-byte aligned base,
// contiguous last dim, every stride of a dimension longer than 1 a positive multiple of 16 bytes
// below 2^40 (strides of length-1 dimensions are never used and get a legal stand-in).
std::string check_tma_tensor(const char* name, const Bhsd& t, int64_t B, int64_t H, int64_t S) {
  const std::string why = portable::check_tensor_addressing(name, t, B, H, S);
  if (!why.empty()) return why;
  const int64_t sizes[3] = {S, H, B};
  const int64_t strides[3] = {t.ss, t.sh, t.sb};
  for (int i = 0; i < 3; ++i) {
    if (sizes[i] > 1 && (strides[i] <= 0 || strides[i] * 2 >= kMaxTmaStrideBytes)) {
      std::ostringstream os;
      os << name << ": strides (" << t.sb << ", " << t.sh << ", " << t.ss
         << ") not positive with byte strides below 2^40 (needed by TMA)";
      return os.str();
    }
  }
  return "";
}

// Dims (D, S, H, B) of a BHSD-strided tensor; box (64, box_rows, 1, 1) with 128-byte swizzle, so
// that a box lands in (or is stored from) one 64-column panel of the kernel's shared tiles. Rows
// past S read as 0 and are not written by stores.
CUtensorMap make_tensor_map(const char* op, const char* name, const Bhsd& t, int64_t B, int64_t H,
                            int64_t S, int64_t D, int box_rows, sa_dtype dtype) {
  SA_CHECK(dtype == SA_DTYPE_BF16 || dtype == SA_DTYPE_FP16, SA_ERROR_INTERNAL,
           op << ": TMA descriptor of " << name << " for a dtype that is not 16-bit");
  const EncodeTiledFn encode = encode_tiled();
  SA_CHECK(encode != nullptr, SA_ERROR_CUDA,
           op << ": cuTensorMapEncodeTiled is not available from the CUDA driver");
  const int64_t elem = 2;
  const int64_t packed[3] = {D * elem, D * elem * S, D * elem * S * H};  // stand-ins
  const int64_t sizes[3] = {S, H, B};
  const int64_t strides[3] = {t.ss, t.sh, t.sb};
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(S),
                        static_cast<cuuint64_t>(H), static_cast<cuuint64_t>(B)};
  cuuint64_t stride_bytes[3];
  for (int i = 0; i < 3; ++i) {
    int64_t bytes = strides[i] * elem;
    if (sizes[i] == 1 && (bytes <= 0 || bytes % 16 != 0 || bytes >= kMaxTmaStrideBytes))
      bytes = std::min(packed[i], kMaxTmaStrideBytes - 16);
    stride_bytes[i] = static_cast<cuuint64_t>(bytes);
  }
  const cuuint32_t box[4] = {64u, static_cast<cuuint32_t>(box_rows), 1u, 1u};
  const cuuint32_t elem_strides[4] = {1u, 1u, 1u, 1u};
  CUtensorMap map;
  const CUresult res =
      encode(&map,
             dtype == SA_DTYPE_FP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                    : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
             4, t.data, dims, stride_bytes, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  SA_CHECK(res == CUDA_SUCCESS, SA_ERROR_CUDA,
           op << ": cuTensorMapEncodeTiled failed for " << name << " (CUresult "
                  << static_cast<int>(res) << ")");
  return map;
}

}  // namespace sa::sm90
