// Preprocess and conversion kernels of the BSA backward for packed batches (see
// bsa_backward_aux_packed.hpp and cuda/bsa_packed_rows.hpp for the buffer layout). Memory-bound:
// 16-byte accesses, a thread per 8 elements; a row's sequence by a binary search of cu_seqlens
// (B + 1 int32, cached), so that nothing depends on offsets on the host.
#include "cuda/bsa_backward_aux_packed.hpp"

#include "common/cuda_check.hpp"
#include "common/dq_tile_layout.hpp"
#include "cuda/bsa_aux_pack8.cuh"
#include "cuda/bsa_packed_rows.hpp"

namespace sa::portable {
namespace {

constexpr int kThreads = kAuxThreads;

struct PackedPreprocessArgs {
  Bhsd o, dout;  // [T_q, H_q, D] (sb = 0)
  const float* lse;
  int64_t lse_stride[3];  // [0, head, token]
  float* lse2;
  float* delta;
  float* dq_zero;      // [Hq * Sq_pad, D] fp32 to zero, or null
  uint32_t* u32_zero;  // [u32_count] to zero, or null
  int64_t rows;        // Hq * Sq_pad
  int32_t Sq_pad, D, Dq, u32_count;
  bool bf16;
  BsaMeta meta;
  BsaDims dims;
};

// Buffer row x of head h belongs to the sequence whose region holds it (packed_seq_of_stat_row);
// a row of the region past the sequence's end is padding: lse2 = +inf, delta = 0 (P = dS = 0), as
// for a dense row >= S_q. The dQ accumulator row is zeroed either way.
__global__ void __launch_bounds__(kThreads)
    bwd_preprocess_packed_kernel(const PackedPreprocessArgs a) {
  const int64_t gtid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t row = gtid / kRowThreads;
  const int sub = threadIdx.x % kRowThreads;
  if (gtid < a.u32_count) a.u32_zero[gtid] = 0u;
  if (row >= a.rows) return;  // the row's threads leave together
  const int64_t x = row % a.Sq_pad;
  const int64_t h = row / a.Sq_pad;
  const int32_t seq = packed_seq_of_stat_row(a.meta.cu_seqlens_q, a.meta.cu_stride_q,
                                             static_cast<int32_t>(a.dims.B), a.dims.Sq,
                                             a.dims.block, x);
  const SeqSpan sp = a.meta.seq(seq, a.dims);
  const int64_t local = x - packed_stat_row0(seq, sp.q0, a.dims.block);
  if (local < 0 || local >= sp.sq) {
    padding_row_stats(a.lse2 + row, a.delta + row, sub);
    zero_dq_row(a.dq_zero, row, a.Dq, sub);
    return;
  }
  const int64_t t = sp.q0 + local;  // the global token
  const float l = sub == 0 ? a.lse[h * a.lse_stride[1] + t * a.lse_stride[2]] : 0.f;
  const uint8_t* o = static_cast<const uint8_t*>(a.o.data) + 2 * a.o.offset(0, h, t, 0);
  const uint8_t* d = static_cast<const uint8_t*>(a.dout.data) + 2 * a.dout.offset(0, h, t, 0);
  preprocess_row(o, d, a.D, a.bf16, sub, l, a.lse2 + row, a.delta + row,
                 [&] { zero_dq_row(a.dq_zero, row, a.Dq, sub); });
}

struct PackedConvertDqArgs {
  Bhsd dq;            // [T_q, H_q, D] (sb = 0)
  const float* acc;   // [H_q, Sq_pad, D]
  int64_t chunks;     // H_q * T_q * D / 8
  int32_t Sq_pad, D;
  float scale;
  bool bf16;
  bool tiled;  // acc in the fragment-tile order (common/dq_tile_layout.hpp) from each sequence's base
  BsaMeta meta;
  BsaDims dims;
};

// A thread per 8 elements of (head h, token t); t's sequence by a binary search of
// cu_seqlens_q. A token no sequence holds (only with offsets outside the contract) gets zeros.
__global__ void __launch_bounds__(kThreads)
    bwd_convert_dq_packed_kernel(const PackedConvertDqArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= a.chunks) return;
  const int per_row = a.D / 8;
  const int c = static_cast<int>(i % per_row);
  const int64_t row = i / per_row;  // h * T_q + t
  const int64_t t = row % a.dims.Sq;
  const int64_t h = row / a.dims.Sq;
  const int32_t seq = packed_seq_of_token(a.meta.cu_seqlens_q, a.meta.cu_stride_q,
                                          static_cast<int32_t>(a.dims.B), a.dims.Sq, t);
  const SeqSpan sp = a.meta.seq(seq, a.dims);
  const int64_t local = t - sp.q0;
  void* dst = static_cast<uint8_t*>(a.dq.data) + 2 * a.dq.offset(0, h, t, 8 * c);
  if (local < 0 || local >= sp.sq) {
    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    store8(dst, a.bf16, z, z, 1.f);
    return;
  }
  const int64_t base = h * a.Sq_pad + packed_stat_row0(seq, sp.q0, a.dims.block);
  const int64_t at = a.tiled ? dq_tiled_index_at(base, static_cast<int>(local), a.D, 8 * c)
                             : (base + local) * a.D + 8 * c;
  const float4* src = reinterpret_cast<const float4*>(a.acc + at);
  store8(dst, a.bf16, src[0], src[1], a.scale);
}

struct PackedConvertDkvArgs {
  Bhsd dk, dv;               // [T_kv, H_kv, D] (sb = 0)
  const float* dk_acc;       // [H_kv, T_kv, D]
  const float* dv_acc;
  const int32_t* row_groups;
  int32_t Hkv, Nkv, Skv_pad, D, block;
  float scale;
  bool bf16;
  BsaMeta meta;
  BsaDims dims;
};

// A CTA per reverse row (b, hk, n); rows with one group (written by the main kernel) or none
// (past their sequence's end) leave at once. The row's keys are its sequence's: k0 + n block +
// j for j < min(block, skv - n block).
__global__ void __launch_bounds__(kThreads)
    bwd_convert_dkv_packed_kernel(const PackedConvertDkvArgs a) {
  const int64_t r = blockIdx.x;
  if (a.row_groups[r] <= 1) return;
  const int n = static_cast<int>(r % a.Nkv);
  const int hk = static_cast<int>((r / a.Nkv) % a.Hkv);
  const int64_t b = r / (static_cast<int64_t>(a.Nkv) * a.Hkv);
  const SeqSpan sp = a.meta.seq(b, a.dims);
  const int64_t key0 = sp.k0 + static_cast<int64_t>(n) * a.block;  // global
  const int keys = static_cast<int>(min(static_cast<int64_t>(a.block),
                                        sp.skv - static_cast<int64_t>(n) * a.block));
  const int per_row = a.D / 8;
  for (int i = threadIdx.x; i < keys * per_row; i += kThreads) {
    const int64_t j = key0 + i / per_row;
    const int c = i % per_row;
    convert_kv_chunk(a.dk_acc, a.dv_acc, (static_cast<int64_t>(hk) * a.Skv_pad + j) * a.D + 8 * c,
                     static_cast<uint8_t*>(a.dk.data) + 2 * a.dk.offset(0, hk, j, 8 * c),
                     static_cast<uint8_t*>(a.dv.data) + 2 * a.dv.offset(0, hk, j, 8 * c), a.bf16,
                     a.scale);
  }
}

}  // namespace

void launch_bwd_preprocess_packed(const BsaBwdProblem& p, int64_t Sq_pad, float* lse2,
                                  float* delta, float* dq_zero, uint32_t* u32_zero,
                                  int64_t u32_count, cudaStream_t stream) {
  PackedPreprocessArgs a{};
  a.o = p.o;
  a.dout = p.dout;
  a.lse = p.lse;
  for (int i = 0; i < 3; ++i) a.lse_stride[i] = p.lse_stride[i];
  a.lse2 = lse2;
  a.delta = delta;
  a.dq_zero = dq_zero;
  a.u32_zero = u32_zero;
  a.u32_count = static_cast<int32_t>(u32_zero != nullptr ? u32_count : 0);
  a.rows = p.dims.Hq * Sq_pad;
  a.Sq_pad = static_cast<int32_t>(Sq_pad);
  a.D = static_cast<int32_t>(p.dims.Dv);
  a.Dq = static_cast<int32_t>(p.dims.D);
  a.bf16 = p.dtype == SA_DTYPE_BF16;
  a.meta = p.meta;
  a.dims = p.dims;
  SA_CHECK(a.u32_count <= a.rows * kRowThreads, SA_ERROR_INTERNAL,
           "bsa backward preprocess: " << a.u32_count << " counters to zero, more than threads");
  bwd_preprocess_packed_kernel<<<aux_blocks_for(a.rows * kRowThreads), kThreads, 0, stream>>>(a);
  SA_CUDA_CHECK_LAUNCH();
}

void launch_bwd_convert_dq_packed(const BsaBwdProblem& p, int64_t Sq_pad, const float* dq_accum,
                                  bool tiled, cudaStream_t stream) {
  PackedConvertDqArgs a{};
  a.dq = p.dq;
  a.acc = dq_accum;
  a.chunks = p.dims.Hq * p.dims.Sq * (p.dims.D / 8);
  a.Sq_pad = static_cast<int32_t>(Sq_pad);
  a.D = static_cast<int32_t>(p.dims.D);
  a.scale = p.scale;
  a.bf16 = p.dtype == SA_DTYPE_BF16;
  a.tiled = tiled;
  a.meta = p.meta;
  a.dims = p.dims;
  bwd_convert_dq_packed_kernel<<<aux_blocks_for(a.chunks), kThreads, 0, stream>>>(a);
  SA_CUDA_CHECK_LAUNCH();
}

void launch_bwd_convert_dkv_packed(const BsaBwdProblem& p, int64_t Skv_pad, const float* dk_accum,
                                   const float* dv_accum, const int32_t* row_groups,
                                   cudaStream_t stream) {
  PackedConvertDkvArgs a{};
  a.dk = p.dk;
  a.dv = p.dv;
  a.dk_acc = dk_accum;
  a.dv_acc = dv_accum;
  a.row_groups = row_groups;
  a.Hkv = static_cast<int32_t>(p.dims.Hkv);
  a.Nkv = static_cast<int32_t>(p.dims.Nkv);
  a.Skv_pad = static_cast<int32_t>(Skv_pad);
  a.D = static_cast<int32_t>(p.dims.D);
  a.block = p.dims.block;
  a.scale = p.scale;
  a.bf16 = p.dtype == SA_DTYPE_BF16;
  a.meta = p.meta;
  a.dims = p.dims;
  const int64_t rows = p.dims.B * p.dims.Hkv * p.dims.Nkv;
  SA_CHECK(rows <= 0x7fffffff, SA_ERROR_UNSUPPORTED,
           "bsa backward: " << rows << " reverse rows is too many");
  bwd_convert_dkv_packed_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(a);
  SA_CUDA_CHECK_LAUNCH();
}

}  // namespace sa::portable
