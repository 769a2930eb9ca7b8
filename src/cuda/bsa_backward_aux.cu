// Preprocess and conversion kernels of the portable BSA backward (see bsa_backward_aux.hpp).
// Memory-bound helpers: 16-byte accesses, a thread per 8 elements, dtype a runtime argument.
#include "cuda/bsa_backward_aux.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/cuda_check.hpp"
#include "common/dq_tile_layout.hpp"
#include "cuda/bsa_aux_pack8.cuh"
#include "cuda/bsa_backward_aux_packed.hpp"

namespace sa::portable {
namespace {

constexpr int kThreads = kAuxThreads;

struct PreprocessArgs {
  Bhsd o, dout;
  const float* lse;
  int64_t lse_stride[3];
  float* lse2;
  float* delta;
  float* dq_zero;     // [rows, Dq] fp32 to zero, or null
  uint32_t* u32_zero;  // [u32_count] to zero, or null
  int64_t rows;  // B * Hq * Sq_pad
  int32_t Hq, Sq, Sq_pad, D, Dq, u32_count;
  bool bf16;
};

// kRowThreads threads per query row, each taking every kRowThreads-th 8-element chunk. The same
// threads zero the row of the dQ accumulator (one DRAM pass instead of a memset and this one).
__global__ void __launch_bounds__(kThreads) bwd_preprocess_kernel(const PreprocessArgs a) {
  const int64_t gtid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t row = gtid / kRowThreads;
  const int sub = threadIdx.x % kRowThreads;
  if (gtid < a.u32_count) a.u32_zero[gtid] = 0u;
  if (row >= a.rows) return;  // the row's threads leave together
  const int s = static_cast<int>(row % a.Sq_pad);
  const int64_t bh = row / a.Sq_pad;
  const int h = static_cast<int>(bh % a.Hq);
  const int64_t b = bh / a.Hq;
  if (s >= a.Sq) {
    padding_row_stats(a.lse2 + row, a.delta + row, sub);
    zero_dq_row(a.dq_zero, row, a.Dq, sub);
    return;
  }
  const float l =
      sub == 0 ? a.lse[b * a.lse_stride[0] + h * a.lse_stride[1] + s * a.lse_stride[2]] : 0.f;
  const uint8_t* o = static_cast<const uint8_t*>(a.o.data) + 2 * a.o.offset(b, h, s, 0);
  const uint8_t* d = static_cast<const uint8_t*>(a.dout.data) + 2 * a.dout.offset(b, h, s, 0);
  preprocess_row(o, d, a.D, a.bf16, sub, l, a.lse2 + row, a.delta + row,
                 [&] { zero_dq_row(a.dq_zero, row, a.Dq, sub); });
}

struct ConvertDqArgs {
  Bhsd dq;
  const float* acc;
  int64_t chunks;  // B * Hq * Sq * D / 8
  int32_t Hq, Sq, Sq_pad, D;
  float scale;
  bool bf16;
  bool tiled;  // acc in the fragment-tile order of common/dq_tile_layout.hpp
};

__global__ void __launch_bounds__(kThreads) bwd_convert_dq_kernel(const ConvertDqArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= a.chunks) return;
  const int per_row = a.D / 8;
  const int c = static_cast<int>(i % per_row);
  const int64_t row = i / per_row;  // (b * Hq + h) * Sq + s
  const int s = static_cast<int>(row % a.Sq);
  const int64_t bh = row / a.Sq;
  const int h = static_cast<int>(bh % a.Hq);
  const int64_t b = bh / a.Hq;
  const int64_t at = a.tiled ? dq_tiled_index(bh, a.Sq_pad, s, a.D, 8 * c)
                            : (bh * a.Sq_pad + s) * a.D + 8 * c;
  const float4* src = reinterpret_cast<const float4*>(a.acc + at);
  void* dst = static_cast<uint8_t*>(a.dq.data) + 2 * a.dq.offset(b, h, s, 8 * c);
  store8(dst, a.bf16, src[0], src[1], a.scale);
}

struct ConvertDkvArgs {
  Bhsd dk, dv;
  const float* dk_acc;
  const float* dv_acc;
  const int32_t* row_groups;
  int32_t Hkv, Nkv, Skv, Skv_pad, D, block;
  float scale;
  bool bf16;
};

// A CTA per reverse row; rows with a single group leave at once.
__global__ void __launch_bounds__(kThreads) bwd_convert_dkv_kernel(const ConvertDkvArgs a) {
  const int64_t r = blockIdx.x;
  if (a.row_groups[r] <= 1) return;
  const int n = static_cast<int>(r % a.Nkv);
  const int hk = static_cast<int>((r / a.Nkv) % a.Hkv);
  const int64_t b = r / (static_cast<int64_t>(a.Nkv) * a.Hkv);
  const int key0 = n * a.block;
  const int keys = min(a.block, a.Skv - key0);
  const int per_row = a.D / 8;
  for (int i = threadIdx.x; i < keys * per_row; i += kThreads) {
    const int j = key0 + i / per_row;
    const int c = i % per_row;
    convert_kv_chunk(a.dk_acc, a.dv_acc, ((b * a.Hkv + hk) * a.Skv_pad + j) * a.D + 8 * c,
                     static_cast<uint8_t*>(a.dk.data) + 2 * a.dk.offset(b, hk, j, 8 * c),
                     static_cast<uint8_t*>(a.dv.data) + 2 * a.dv.offset(b, hk, j, 8 * c), a.bf16,
                     a.scale);
  }
}

}  // namespace

void launch_bwd_preprocess(const BsaBwdProblem& p, int64_t Sq_pad, float* lse2, float* delta,
                           float* dq_zero, uint32_t* u32_zero, int64_t u32_count,
                           cudaStream_t stream) {
  if (p.meta.varlen())
    return launch_bwd_preprocess_packed(p, Sq_pad, lse2, delta, dq_zero, u32_zero, u32_count,
                                        stream);
  PreprocessArgs a{};
  a.dq_zero = dq_zero;
  a.u32_zero = u32_zero;
  a.u32_count = static_cast<int32_t>(u32_zero != nullptr ? u32_count : 0);
  a.Dq = static_cast<int32_t>(p.dims.D);
  a.o = p.o;
  a.dout = p.dout;
  a.lse = p.lse;
  for (int i = 0; i < 3; ++i) a.lse_stride[i] = p.lse_stride[i];
  a.lse2 = lse2;
  a.delta = delta;
  a.rows = p.dims.B * p.dims.Hq * Sq_pad;
  a.Hq = static_cast<int32_t>(p.dims.Hq);
  a.Sq = static_cast<int32_t>(p.dims.Sq);
  a.Sq_pad = static_cast<int32_t>(Sq_pad);
  a.D = static_cast<int32_t>(p.dims.Dv);
  a.bf16 = p.dtype == SA_DTYPE_BF16;
  SA_CHECK(a.u32_count <= a.rows * kRowThreads, SA_ERROR_INTERNAL,
           "bsa backward preprocess: " << a.u32_count << " counters to zero, more than threads");
  bwd_preprocess_kernel<<<aux_blocks_for(a.rows * kRowThreads), kThreads, 0, stream>>>(a);
  SA_CUDA_CHECK_LAUNCH();
}

void launch_bwd_convert_dq(const BsaBwdProblem& p, int64_t Sq_pad, const float* dq_accum,
                           bool tiled, cudaStream_t stream) {
  if (p.meta.varlen()) return launch_bwd_convert_dq_packed(p, Sq_pad, dq_accum, tiled, stream);
  ConvertDqArgs a{};
  a.dq = p.dq;
  a.acc = dq_accum;
  a.chunks = p.dims.B * p.dims.Hq * p.dims.Sq * (p.dims.D / 8);
  a.Hq = static_cast<int32_t>(p.dims.Hq);
  a.Sq = static_cast<int32_t>(p.dims.Sq);
  a.Sq_pad = static_cast<int32_t>(Sq_pad);
  a.D = static_cast<int32_t>(p.dims.D);
  a.scale = p.scale;
  a.bf16 = p.dtype == SA_DTYPE_BF16;
  a.tiled = tiled;
  bwd_convert_dq_kernel<<<aux_blocks_for(a.chunks), kThreads, 0, stream>>>(a);
  SA_CUDA_CHECK_LAUNCH();
}

void launch_bwd_convert_dkv(const BsaBwdProblem& p, int64_t Skv_pad, const float* dk_accum,
                            const float* dv_accum, const int32_t* row_groups,
                            cudaStream_t stream) {
  if (p.meta.varlen())
    return launch_bwd_convert_dkv_packed(p, Skv_pad, dk_accum, dv_accum, row_groups, stream);
  ConvertDkvArgs a{};
  a.dk = p.dk;
  a.dv = p.dv;
  a.dk_acc = dk_accum;
  a.dv_acc = dv_accum;
  a.row_groups = row_groups;
  a.Hkv = static_cast<int32_t>(p.dims.Hkv);
  a.Nkv = static_cast<int32_t>(p.dims.Nkv);
  a.Skv = static_cast<int32_t>(p.dims.Skv);
  a.Skv_pad = static_cast<int32_t>(Skv_pad);
  a.D = static_cast<int32_t>(p.dims.D);
  a.block = p.dims.block;
  a.scale = p.scale;
  a.bf16 = p.dtype == SA_DTYPE_BF16;
  const int64_t rows = p.dims.B * p.dims.Hkv * p.dims.Nkv;
  SA_CHECK(rows <= 0x7fffffff, SA_ERROR_UNSUPPORTED,
           "bsa backward: " << rows << " reverse rows is too many");
  bwd_convert_dkv_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(a);
  SA_CUDA_CHECK_LAUNCH();
}

}  // namespace sa::portable
