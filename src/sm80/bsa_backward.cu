// Portable BSA backward, host side: problem checks, the kernel policy (CTA slots, the launches)
// and the instantiations of bsa_backward_kernel.cuh and bsa_backward_dq_kernel.cuh. The steps
// around them are the driver's (cuda/bsa_backward_driver.hpp).
#include "sm80/bsa_backward.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>

#include "common/cuda_check.hpp"
#include "common/cuda_device.hpp"
#include "common/host_numeric.hpp"
#include "cuda/bsa_backward_driver.hpp"
#include "cuda/bsa_backward_plan.hpp"
#include "cuda/launch_checks.hpp"
#include "cuda/reverse_map_gpu.hpp"
#include "sm80/bsa_backward_dq_kernel.cuh"
#include "sm80/bsa_backward_kernel.cuh"

namespace sa::portable {
namespace {

// ---- the instantiations ------------------------------------------------------------------------
// Main kernel: block (= keys per CTA) 64 or 128 x D 64 or 128 x dense or packed batches, bf16:
// 8 kernels (dispatch_main). Deterministic dQ kernel: D 64 or 128 x dense or packed, bf16: 4
// kernels (dispatch_dq). The packed axis is compile-time so that the dense kernels compile to the
// code they had before packed batches (docs/decisions/portable.md). The kernels are generic in
// the element type: fp16 is 6 more instantiations (branches in both dispatchers, SA_DTYPE_FP16
// accepted in bsa_backward_unsupported), left out to keep the instantiation count down.
using Bf16 = __nv_bfloat16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Opts a kernel in to its dynamic shared memory (more than 48 KB) and asks for the largest
// shared-memory carveout (two block-64, D-128 CTAs need all 228 KB of an sm90 SM). The attributes
// belong to the current device and context, so they are set on every call: host-side attribute
// writes, no synchronisation, legal during stream capture.
template <class Kernel>
void set_smem_attributes(Kernel* kernel, int bytes) {
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  SA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     static_cast<int>(cudaSharedmemCarveoutMaxShared)));
}

template <int kBlock, int kHeadDim, class Element, bool kPacked>
void launch_main(const BsaBwdParams& params, int64_t max_items, cudaStream_t stream) {
  using Traits = BwdKernelTraits<kBlock, kHeadDim, Element, kPacked>;
  auto* kernel = &bsa_backward_kernel<Traits>;
  set_smem_attributes(kernel, Traits::kSmemBytes);
  kernel<<<static_cast<unsigned>(max_items), Traits::kNThreads, Traits::kSmemBytes, stream>>>(
      params);
  SA_CUDA_CHECK_LAUNCH();
}

// Packed batches: N_q_max * block / 64 row tiles per sequence (shapes only; tiles past a
// sequence's end exit).
template <int kHeadDim, class Element, bool kPacked>
void launch_dq(const BsaBwdParams& params, const BsaDims& d, cudaStream_t stream) {
  using Traits = BwdDqKernelTraits<kHeadDim, Element, kPacked>;
  auto* kernel = &bsa_backward_dq_kernel<Traits>;
  set_smem_attributes(kernel, Traits::kSmemBytes);
  const int64_t rows = kPacked ? d.Nq * d.block : d.Sq;
  const dim3 grid(static_cast<unsigned>(ceil_div(rows, Traits::kBlockM)),
                  static_cast<unsigned>(d.Hq), static_cast<unsigned>(d.B));
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(params);
  SA_CUDA_CHECK_LAUNCH();
}

template <bool kPacked>
void dispatch_main(const BsaBwdParams& params, int64_t max_items, cudaStream_t stream) {
  const int block = params.block;
  const int64_t D = params.dims.D;
  if (block == 128 && D == 128)
    return launch_main<128, 128, Bf16, kPacked>(params, max_items, stream);
  if (block == 128 && D == 64)
    return launch_main<128, 64, Bf16, kPacked>(params, max_items, stream);
  if (block == 64 && D == 128)
    return launch_main<64, 128, Bf16, kPacked>(params, max_items, stream);
  if (block == 64 && D == 64) return launch_main<64, 64, Bf16, kPacked>(params, max_items, stream);
  SA_FAIL(SA_ERROR_INTERNAL, "bsa backward: no kernel for block " << block << ", D " << D);
}

template <bool kPacked>
void dispatch_dq(const BsaBwdParams& params, cudaStream_t stream) {
  if (params.dims.D == 128) return launch_dq<128, Bf16, kPacked>(params, params.dims, stream);
  if (params.dims.D == 64) return launch_dq<64, Bf16, kPacked>(params, params.dims, stream);
  SA_FAIL(SA_ERROR_INTERNAL, "bsa backward: no dQ kernel for D " << params.dims.D);
}

// Dynamic shared memory of the main kernel for (block, D).
// (Packed instantiations: the book holds the sequence too, 24 bytes more where there is a book.)
template <bool kPacked>
int main_kernel_smem_of(int block, int64_t D) {
  if (block == 128)
    return D == 128 ? BwdKernelTraits<128, 128, Bf16, kPacked>::kSmemBytes
                    : BwdKernelTraits<128, 64, Bf16, kPacked>::kSmemBytes;
  return D == 128 ? BwdKernelTraits<64, 128, Bf16, kPacked>::kSmemBytes
                  : BwdKernelTraits<64, 64, Bf16, kPacked>::kSmemBytes;
}
int main_kernel_smem(int block, int64_t D, bool packed) {
  return packed ? main_kernel_smem_of<true>(block, D) : main_kernel_smem_of<false>(block, D);
}

// ---- the policy (cuda/bsa_backward_driver.hpp) --------------------------------------------------
int device_attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  SA_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

// Main-kernel CTAs resident on the whole GPU: as many as fit an SM's shared memory, at most 1 per
// SM at block 128 (8 warps, 255 registers) and 2 at block 64.
int64_t cta_slots(const BsaBwdProblem& p) {
  const BsaDims& d = p.dims;
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount, p.device_index);
  const int smem_per_sm =
      device_attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor, p.device_index);
  const int reserved =
      device_attribute(cudaDevAttrReservedSharedMemoryPerBlock, p.device_index);
  const int per_cta = main_kernel_smem(d.block, d.D, p.meta.varlen()) + reserved;
  const int fit = std::max(1, smem_per_sm / per_cta);
  return static_cast<int64_t>(sms) * std::min(fit, d.block == 128 ? 1 : 2);
}

// The parameters both kernels read: the problem's tensors and the fields shared with the Hopper
// backward (bsa_backward_plan.hpp; the main kernel adds the reverse map).
BsaBwdParams problem_params(const BsaBwdProblem& p, const BsaBwdPlan& plan,
                            const BsaBwdBuffers& buf) {
  BsaBwdParams params{};
  params.q = p.q;
  params.k = p.k;
  params.v = p.v;
  params.dout = p.dout;
  params.dq = p.dq;
  params.dk = p.dk;
  params.dv = p.dv;
  params.block = p.dims.block;
  fill_bsa_bwd_common_params(params, p, plan, buf);
  // The band fits int32: validation clamps it to [-S_q, S_kv], and S fits (checked).
  params.mask_on = p.meta.mask.on ? 1 : 0;
  params.mask_lo = static_cast<int32_t>(p.meta.mask.lo);
  params.mask_hi = static_cast<int32_t>(p.meta.mask.hi);
  return params;
}

// Step 3 (bsa_bwd::MainKernelLaunch); dq is left to step 4.
bool launch_main_kernel(const BsaBwdProblem& p, const BsaBwdPlan& plan, const BsaBwdBuffers& buf,
                        const ReverseMapDevice& map, cudaStream_t stream) {
  BsaBwdParams params = problem_params(p, plan, buf);
  fill_bsa_bwd_map_params(params, map);
  // The kernel takes item = launch slot (it re-derives the item from blockIdx.x to save
  // registers): no tail order (reverse map step 6) here.
  SA_CHECK(map.item_order == nullptr, SA_ERROR_INTERNAL,
           "portable bsa_backward: the reverse map has a tail order");
  if (p.meta.varlen())
    dispatch_main<true>(params, map.max_items, stream);
  else
    dispatch_main<false>(params, map.max_items, stream);
  return false;
}

// No tail order: the kernel takes item = launch slot.
constexpr bsa_bwd::KernelPolicy kPolicy = {
    "portable bsa_backward", /*dq_tiled=*/false, &cta_slots, /*tail_items=*/nullptr,
    &launch_main_kernel, &bsa_bwd::query_major_dq};

}  // namespace

// The query-major dQ kernel of deterministic mode (cuda/bsa_backward_driver.hpp), for every
// policy: its tiles and parameters are the portable main kernel's, and so are its limits.
void bsa_bwd::query_major_dq(const BsaBwdProblem& p, const BsaBwdPlan& plan,
                             const BsaBwdBuffers& buf, cudaStream_t stream) {
  if (p.meta.varlen())
    dispatch_dq<true>(problem_params(p, plan, buf), stream);
  else
    dispatch_dq<false>(problem_params(p, plan, buf), stream);
}

std::string bsa_bwd::query_major_dq_unsupported(const BsaBwdProblem& p) {
  return bsa_backward_unsupported(p);
}

std::string bsa_backward_unsupported(const BsaBwdProblem& p) {
  const BsaDims& d = p.dims;
  std::ostringstream os;
  if (p.dtype != SA_DTYPE_BF16) {
    os << "dtype " << dtype_name(p.dtype) << " (portable backward supports bf16)";
    return os.str();
  }
  if (d.D != d.Dv || (d.D != 64 && d.D != 128)) {
    os << "D = " << d.D << ", D_v = " << d.Dv
       << " (portable backward supports D == D_v in {64, 128})";
    return os.str();
  }
  if (d.block != 64 && d.block != 128) {
    os << "block size " << d.block << " (portable backward supports 64 and 128)";
    return os.str();
  }
  constexpr int64_t kMaxGridYZ = 65535;
  constexpr int64_t kMaxSeq = std::numeric_limits<int32_t>::max() - 256;
  if (d.B > kMaxGridYZ || d.Hq > kMaxGridYZ) {
    os << "B = " << d.B << ", H_q = " << d.Hq << " (portable backward supports at most "
       << kMaxGridYZ << " each)";
    return os.str();
  }
  if (d.Sq > kMaxSeq || d.Skv > kMaxSeq) {
    os << "S_q = " << d.Sq << ", S_kv = " << d.Skv << " (portable backward supports at most "
       << kMaxSeq << ")";
    return os.str();
  }
  for (std::string why : {check_tensor_addressing("q", p.q, d.B, d.Hq, d.Sq),
                          check_tensor_addressing("k", p.k, d.B, d.Hkv, d.Skv),
                          check_tensor_addressing("v", p.v, d.B, d.Hkv, d.Skv),
                          check_tensor_addressing("o", p.o, d.B, d.Hq, d.Sq),
                          check_tensor_addressing("dout", p.dout, d.B, d.Hq, d.Sq),
                          check_tensor_addressing("dq", p.dq, d.B, d.Hq, d.Sq),
                          check_tensor_addressing("dk", p.dk, d.B, d.Hkv, d.Skv),
                          check_tensor_addressing("dv", p.dv, d.B, d.Hkv, d.Skv)}) {
    if (!why.empty()) return why;
  }
  if (p.lse == nullptr) return "lse is missing";
  // The main kernel's shared memory must fit the device (e.g. block 128, D 128 needs ~161 KB:
  // sm80, sm90 and newer; not the ~100 KB of sm86/sm89).
  const std::string smem =
      smem_unsupported(p.device_index, main_kernel_smem(d.block, d.D, p.meta.varlen()));
  if (!smem.empty()) {
    os << "block " << d.block << ", D = " << d.D << ": " << smem;
    return os.str();
  }
  return "";
}

size_t bsa_backward_workspace_bytes(const BsaBwdProblem& p) {
  return bsa_bwd::workspace_bytes(p, kPolicy);
}

void bsa_backward(const BsaBwdProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream) {
  const std::string why = bsa_backward_unsupported(p);
  SA_CHECK(why.empty(), SA_ERROR_UNSUPPORTED, "portable bsa_backward: " << why);
  bsa_bwd::run(p, workspace, workspace_bytes, stream, kPolicy);
}

}  // namespace sa::portable
