// The dQ conversion beside the Hopper BSA backward's main kernel (see bsa_dq_convert.hpp).
#include "sm90/bsa_dq_convert.hpp"

#include <cuda_runtime.h>

#include <type_traits>

#include "common/cuda_check.hpp"
#include "common/dq_tile_layout.hpp"
#include "common/narrow.hpp"
#include "cuda/bsa_packed_rows.hpp"
#include "sm90/hopper_primitives.cuh"

namespace sa::sm90 {
namespace {

constexpr int kThreads = 256;
// 4 x 256 threads per free SM (60 registers at D 128). Fewer CTAs leave more of the conversion
// after the main kernel (session 26, call 7: 1 per SM -16%, 2 per SM -6% at 12.5% density).
constexpr int kCtasPerSm = 4;

struct Params {
  Bhsd dq;
  const float* acc;
  uint32_t* ready;   // [B * H_kv] heads' signals
  uint32_t* ticket;  // ready[B * H_kv]
  const unsigned long long* row_scan;
  int32_t Hq, Hkv, group, Sq, Sq_pad, Nkv, tiles, chunks, signals_per_item;
  int32_t max_items;  // the map's bound: items at or past it were dropped and never signal
  float scale;
};
// Packed batches: tiles = N_q_max block / 64 per (sequence b, head h); the sequences' offsets.
struct PackedParams : Params {
  BsaMeta meta;
  BsaDims dims;
};
template <bool kPacked>
using ParamsOf = std::conditional_t<kPacked, PackedParams, Params>;

// Packed batches, thread 0: from ticket c on, the first chunk that holds rows of its sequence
// (64 t < sq; tiles past the sequence's end are skipped before any wait, each ticket still taken
// once), and that sequence's sq, q0 and base row in the accumulator (h Sq_pad + stat_row0) into
// seq[0..3]; c >= chunks when none is left.
__device__ __forceinline__ uint32_t first_live_chunk(const PackedParams& a, uint32_t c,
                                                     int64_t* seq) {
  while (c < static_cast<uint32_t>(a.chunks)) {
    const int bh = static_cast<int>(c) / a.tiles;
    const int b = bh / a.Hq, h = bh % a.Hq;
    const SeqSpan sp = a.meta.seq(b, a.dims);
    if (static_cast<int64_t>(static_cast<int>(c) % a.tiles) * kDqTileRows < sp.sq) {
      seq[0] = sp.sq;
      seq[1] = sp.q0;
      seq[2] = static_cast<int64_t>(h) * a.Sq_pad + portable::packed_stat_row0(b, sp.q0, a.dims.block);
      break;
    }
    c = atomicAdd(a.ticket, 1u);
  }
  return c;
}

// Work items of KV head `key` = b * H_kv + hk (rows [key * N_kv, (key + 1) * N_kv) of the map)
// that run: those below max_items (the others exist only for packed offsets outside the
// contract, which the map drops).
__device__ __forceinline__ uint32_t head_items(const Params& a, int key) {
  const unsigned long long lo = __ldcg(a.row_scan + static_cast<int64_t>(key) * a.Nkv);
  const unsigned long long hi = __ldcg(a.row_scan + static_cast<int64_t>(key + 1) * a.Nkv);
  const uint32_t cap = static_cast<uint32_t>(a.max_items);
  return min(static_cast<uint32_t>(hi >> 32), cap) - min(static_cast<uint32_t>(lo >> 32), cap);
}

// Thread 0: until every consumer warpgroup of every work item of KV head `key` has signalled
// (relaxed polls, then one acquire that orders the CTA's reads after the signals' releases; the
// CTA barrier that follows extends it to the other threads). A count that is not reached within
// 10 s is a bug: trap rather than hang.
__device__ __forceinline__ void wait_for_head(const Params& a, int key) {
  const uint32_t target = head_items(a, key) * static_cast<uint32_t>(a.signals_per_item);
  const uint64_t start = globaltimer_ns();
  while (ld_relaxed_gpu_u32(a.ready + key) < target) {
    __nanosleep(200);
    if (globaltimer_ns() - start > 10'000'000'000ull) __trap();
  }
  (void)ld_acquire_gpu_u32(a.ready + key);
}

// One 64-row tile: rows s0 + r < rows of head h, accumulator run from row row_base
// (dq_tiled_index_at), dq rows q0 + s of batch entry b (dense: b, 0; packed: 0, the sequence's
// first token).
template <int kD>
__device__ __forceinline__ void convert_tile(const Params& a, int64_t row_base, int s0, int rows,
                                             int b, int h, int q0) {
  constexpr int kUnitsPerRow = kD / 8;  // 16-byte output units (8 elements) per row
  constexpr int kUnits = kDqTileRows * kUnitsPerRow / kThreads;
  float4 v[kUnits][2];
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    const int u = threadIdx.x + k * kThreads;
    const int s = s0 + u / kUnitsPerRow;
    const float4* src = reinterpret_cast<const float4*>(
        a.acc + dq_tiled_index_at(row_base, s, kD, 8 * (u % kUnitsPerRow)));
    // Evict-first loads and stores: the 201 MB streamed here pass through L2 while the main
    // kernel's last items run, and must not push out their lines (session 26, call 8: with
    // default-policy loads the main kernel's end came ~30 us later and the call at 12.5%
    // density gained nothing).
    if (s < rows) {
      v[k][0] = __ldcs(src);
      v[k][1] = __ldcs(src + 1);
    }
  }
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    const int u = threadIdx.x + k * kThreads;
    const int s = s0 + u / kUnitsPerRow;
    if (s < rows) {
      const float4 x = v[k][0], y = v[k][1];
      const float sc = a.scale;
      __stcs(reinterpret_cast<uint4*>(static_cast<uint8_t*>(a.dq.data) +
                                      2 * a.dq.offset(b, h, q0 + s, 8 * (u % kUnitsPerRow))),
             make_uint4(pack_bf16x2(x.x * sc, x.y * sc), pack_bf16x2(x.z * sc, x.w * sc),
                        pack_bf16x2(y.x * sc, y.y * sc), pack_bf16x2(y.z * sc, y.w * sc)));
    }
  }
}

// Packed batches (kPacked): chunk c is tile c % tiles of (sequence b, head h) = c / tiles, its
// rows the sequence's local rows s < sq: source dq_tiled_index_at from the sequence's base row,
// destination dq [T_q, H_q, D] row q0 + s.
template <int kD, bool kPacked>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    dq_convert_beside_kernel(const ParamsOf<kPacked> a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ int s_chunk;
  [[maybe_unused]] __shared__ int64_t s_seq[3];  // kPacked: sq, q0, base row of the chunk
  // Thread 0 takes the next tile's ticket while the CTA converts the current one, so the
  // atomic's round trip is off the CTA's path; it waits for a head only when the head changes.
  uint32_t next = threadIdx.x == 0 ? atomicAdd(a.ticket, 1u) : 0u;
  int waited_key = -1;
  for (;;) {
    if (threadIdx.x == 0) {
      if constexpr (kPacked) next = first_live_chunk(a, next, s_seq);
      const uint32_t c = next;
      if (c < static_cast<uint32_t>(a.chunks)) {
        const int bh = static_cast<int>(c) / a.tiles;
        const int key = bh / a.Hq * a.Hkv + bh % a.Hq / a.group;
        if (key != waited_key) {
          wait_for_head(a, key);
          waited_key = key;
        }
        next = atomicAdd(a.ticket, 1u);
      }
      s_chunk = static_cast<int>(min(c, static_cast<uint32_t>(a.chunks)));
    }
    __syncthreads();
    const int c = s_chunk;
    if (c >= a.chunks) break;
    const int bh = c / a.tiles;
    const int s0 = (c % a.tiles) * kDqTileRows;
    const int b = bh / a.Hq, h = bh % a.Hq;
    if constexpr (kPacked)
      convert_tile<kD>(a, s_seq[2], s0, static_cast<int>(s_seq[0]), 0, h,
                       static_cast<int>(s_seq[1]));
    else
      convert_tile<kD>(a, static_cast<int64_t>(bh) * a.Sq_pad, s0, a.Sq, b, h, 0);
    __syncthreads();  // every thread has read s_chunk (and s_seq) before thread 0 writes the next
  }
  griddepcontrol_wait();
#endif
}

}  // namespace

void launch_dq_convert_beside(const BsaBwdProblem& p, const DqConvertBeside& c,
                              cudaStream_t stream) {
  const BsaDims& d = p.dims;
  Params a{};
  a.dq = p.dq;
  a.acc = c.dq_accum;
  a.ready = c.ready;
  a.ticket = c.ready + d.B * d.Hkv;
  a.row_scan = c.row_scan;
  a.Hq = narrow_i32(d.Hq, "H_q");
  a.Hkv = narrow_i32(d.Hkv, "H_kv");
  a.group = narrow_i32(d.group(), "H_q / H_kv");
  a.Sq = narrow_i32(d.Sq, "S_q");
  a.Sq_pad = narrow_i32(c.Sq_pad, "S_q padded");
  a.Nkv = narrow_i32(d.Nkv, "N_kv");
  // Packed: N_q_max blocks per (sequence, head); the block is a multiple of 64.
  const bool packed = p.meta.varlen();
  a.tiles = narrow_i32(packed ? d.Nq * d.block / kDqTileRows
                              : (d.Sq + kDqTileRows - 1) / kDqTileRows,
                       "dQ tiles per head");
  const int64_t grid = static_cast<int64_t>(c.sm_count) * kCtasPerSm;
  SA_CHECK(grid > 0, SA_ERROR_INTERNAL, "sm90 dQ conversion: no SM count");
  // The ticket runs up to chunks + grid - 1.
  a.chunks = narrow_i32(d.B * d.Hq * a.tiles, "dQ tiles");
  narrow_i32(d.B * d.Hq * a.tiles + grid, "dQ tiles and converter CTAs");
  a.signals_per_item = c.signals_per_item;
  a.max_items = narrow_i32(c.max_items, "work items");
  a.scale = p.scale;

  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  SA_CHECK(d.D == 64 || d.D == 128, SA_ERROR_INTERNAL, "sm90 dQ conversion: D " << d.D);
  if (packed) {
    PackedParams pa{};
    static_cast<Params&>(pa) = a;
    pa.meta = p.meta;
    pa.dims = d;
    SA_CUDA_CHECK(cudaLaunchKernelEx(&cfg,
                                     d.D == 128 ? dq_convert_beside_kernel<128, true>
                                                : dq_convert_beside_kernel<64, true>,
                                     pa));
  } else {
    SA_CUDA_CHECK(cudaLaunchKernelEx(&cfg,
                                     d.D == 128 ? dq_convert_beside_kernel<128, false>
                                                : dq_convert_beside_kernel<64, false>,
                                     a));
  }
}

}  // namespace sa::sm90
