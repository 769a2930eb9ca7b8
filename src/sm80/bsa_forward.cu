// Portable BSA forward, host side: problem checks, launch configuration and the instantiations
// of the kernel in bsa_forward_kernel.cuh.
#include "sm80/bsa_forward.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/host_numeric.hpp"
#include "sm80/bsa_forward_kernel.cuh"
#include "cuda/launch_checks.hpp"

namespace sa::portable {
namespace {

template <int kBlockM, int kHeadDim, class Element>
void launch(const BsaFwdParams& params, cudaStream_t stream) {
  using Traits = FwdKernelTraits<kBlockM, kHeadDim, Element>;
  constexpr int kSmem = Traits::kSmemBytes;
  auto* kernel = &bsa_forward_kernel<Traits>;
  // Opt in to more than 48 KB of dynamic shared memory, once per device.
  static std::atomic<uint64_t> opted_in{0};
  int device = 0;
  SA_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit == 0 || (opted_in.load(std::memory_order_acquire) & bit) == 0) {
    SA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    opted_in.fetch_or(bit, std::memory_order_release);
  }
  const dim3 grid(static_cast<unsigned>(params.dims.Nq),
                  static_cast<unsigned>(params.dims.Hq), static_cast<unsigned>(params.dims.B));
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(params);
  SA_CUDA_CHECK_LAUNCH();
}

// The instantiations: query rows per CTA (= the block size, 64 or 128) x head dim (64, 128) x
// element type (bf16, fp16): 8 kernels.
template <int kBlockM, int kHeadDim>
void launch_dtype(const BsaFwdParams& params, sa_dtype dtype, cudaStream_t stream) {
  if (dtype == SA_DTYPE_BF16)
    launch<kBlockM, kHeadDim, __nv_bfloat16>(params, stream);
  else
    launch<kBlockM, kHeadDim, __half>(params, stream);
}

template <int kBlockM>
void launch_head_dim(const BsaFwdParams& params, sa_dtype dtype, cudaStream_t stream) {
  if (params.dims.D == 64)
    launch_dtype<kBlockM, 64>(params, dtype, stream);
  else
    launch_dtype<kBlockM, 128>(params, dtype, stream);
}

}  // namespace

std::string bsa_forward_unsupported(const BsaFwdProblem& p) {
  const BsaDims& d = p.dims;
  std::ostringstream os;
  if (p.dtype != SA_DTYPE_BF16 && p.dtype != SA_DTYPE_FP16) {
    os << "dtype " << dtype_name(p.dtype) << " (portable forward supports bf16 and fp16)";
    return os.str();
  }
  if (d.D != d.Dv || (d.D != 64 && d.D != 128)) {
    os << "D = " << d.D << ", D_v = " << d.Dv
       << " (portable forward supports D == D_v in {64, 128})";
    return os.str();
  }
  if (d.block != 64 && d.block != 128) {
    os << "block size " << d.block << " (portable forward supports 64 and 128)";
    return os.str();
  }
  constexpr int64_t kMaxGridYZ = 65535;
  constexpr int64_t kMaxSeq = std::numeric_limits<int32_t>::max() - 256;
  if (d.B > kMaxGridYZ || d.Hq > kMaxGridYZ) {
    os << "B = " << d.B << ", H_q = " << d.Hq << " (portable forward supports at most "
       << kMaxGridYZ << " each)";
    return os.str();
  }
  if (d.Sq > kMaxSeq || d.Skv > kMaxSeq) {
    os << "S_q = " << d.Sq << ", S_kv = " << d.Skv << " (portable forward supports at most "
       << kMaxSeq << ")";
    return os.str();
  }
  for (std::string why : {check_tensor_addressing("q", p.q, d.B, d.Hq, d.Sq),
                          check_tensor_addressing("k", p.k, d.B, d.Hkv, d.Skv),
                          check_tensor_addressing("v", p.v, d.B, d.Hkv, d.Skv),
                          check_tensor_addressing("o", p.o, d.B, d.Hq, d.Sq)}) {
    if (!why.empty()) return why;
  }
  if (p.lse == nullptr) return "lse is missing";
  return "";
}

void bsa_forward(const BsaFwdProblem& p, cudaStream_t stream) {
  const std::string why = bsa_forward_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "portable bsa_forward: " << why);
  const BsaDims& d = p.dims;

  BsaFwdParams params{};
  params.q = p.q;
  params.k = p.k;
  params.v = p.v;
  params.o = p.o;
  params.lse = p.lse;
  for (int i = 0; i < 3; ++i) params.lse_stride[i] = p.lse_stride[i];
  params.dims = d;
  params.meta = p.meta;
  params.block = d.block;
  params.group = static_cast<int32_t>(d.group());
  params.scale_log2 = scale_times_log2e(p.scale);
  params.masked_score = mask_value(params.scale_log2);
  // The band itself is the CTA's sequence's (CtaSeq): it fits int32, being clamped to the
  // sequence's [-sq, skv], and S (T for packed batches) fits (checked above).
  params.mask_on = p.meta.mask.on ? 1 : 0;

  // One CTA per query block (kBlockM = block): its K/V tiles are loaded once for all its rows.
  // Packed batches: N_q_max query blocks per sequence (the metadata's shape, never the values of
  // cu_seqlens, so that a captured graph replays with new offsets).
  if (d.block == 128)
    launch_head_dim<128>(params, p.dtype, stream);
  else
    launch_head_dim<64>(params, p.dtype, stream);
}

}  // namespace sa::portable
