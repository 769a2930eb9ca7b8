// Device helpers of the Hopper DSA kernels (dsa_forward_kernel.cuh, dsa_backward_kernel.cuh):
// the 128-byte swizzle of a 64-column panel, the producer warpgroup's gather of kv rows (and of
// Q / dO rows) into 64-column panels, a wgmma batch over a K extent.
#pragma once

#include <cstdint>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "common/dsa_device.cuh"
#include "cuda/dsa_mma.hpp"  // cp.async wrappers
#include "sm90/hopper_primitives.cuh"

namespace sa::sm90 {

// Byte offset of 16-byte chunk `ch` (0..7) of row `r` inside a 128B-swizzled panel.
__device__ __forceinline__ uint32_t swz(int r, int ch) {
  return static_cast<uint32_t>(r * 128 + ((ch ^ (r & 7)) << 4));
}

// Rows of a warpgroup accumulator (a 64 x 8 kTiles wgmma fragment; thread's row slot r = 0, 1:
// row 16 warp + lane / 4 + 8 r; fragment index i of tile j, slot r: 4 j + 2 r, + 1 for the odd
// column) leave as bf16 in 16-byte stores: word(i) packs elements i and i + 1 of the fragment,
// row_dst(r) gives the slot's destination row (column 0 of this fragment; 16-byte aligned) or
// nullptr to skip it (a quad shares its row, so a skipped row never skips a shuffle). A quad's
// 4 x 4 words of four tiles are transposed (quad_transpose_4x4), so that lane q writes tile q's 8
// columns: one store where the fragment layout needs four 4-byte ones into 8 rows.
template <int kTiles, class Word, class RowDst>
__device__ __forceinline__ void store_fragment_rows_16b(int lane, Word&& word, RowDst&& row_dst) {
  static_assert(kTiles % 4 == 0, "whole groups of four 8-column tiles");
  const int q = lane % 4;
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    auto* const dst = row_dst(r);
    CUTE_UNROLL
    for (int g = 0; g < kTiles / 4; ++g) {
      uint32_t w[4];
      CUTE_UNROLL
      for (int k = 0; k < 4; ++k) w[k] = word(4 * (4 * g + k) + 2 * r);
      quad_transpose_4x4(w, q);
      if (dst != nullptr) {
        *reinterpret_cast<uint4*>(dst + 8 * (4 * g + q)) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  }
}

// The quad-16 reduction order (AccColumns::kQuad16, cuda/dsa_backward_aux.hpp) of a 64-column
// warpgroup accumulator tile (wgmma C layout: acc(8 m + 4 h + 2 r + e) at row 16 warp + g + 8 r,
// column 16 m + 8 h + 2 q + e; g = lane / 4, q = lane % 4): lane q's columns 16 m + {2q, 2q + 1,
// 2q + 8, 2q + 9} of a row sit at positions 16 m + 4q .. + 3 of the accumulator row. After one
// exchange with lane ^ 4 (the row's neighbour g ^ 1) this lane holds, for fragment row slot r,
// the lane pair's even row E = 16 warp + 8 r + (g & 6) and odd row E + 1, the 16-column groups
// m = 2k + o (o = g & 1, k = 0, 1): evn[k] of E, odd[k] of E + 1. A red.v4 of each at position
// 16 (2k + o) + 4q of its row then covers, across the warp, four rows' 128 contiguous bytes per
// instruction (one L2 request of four sectors each).
template <class Frag>
__device__ __forceinline__ void quad16_pair(const Frag& acc, int r, int lane, float4 (&evn)[2],
                                            float4 (&odd)[2]) {
  const int o = (lane >> 2) & 1;
  float4 a[4];
  CUTE_UNROLL
  for (int m = 0; m < 4; ++m)
    a[m] = make_float4(acc(8 * m + 2 * r), acc(8 * m + 2 * r + 1), acc(8 * m + 4 + 2 * r),
                       acc(8 * m + 5 + 2 * r));
  CUTE_UNROLL
  for (int k = 0; k < 2; ++k) {
    const float4 keep = o ? a[2 * k + 1] : a[2 * k];
    const float4 send = o ? a[2 * k] : a[2 * k + 1];
    float4 recv;
    recv.x = __shfl_xor_sync(0xffffffffu, send.x, 4);
    recv.y = __shfl_xor_sync(0xffffffffu, send.y, 4);
    recv.z = __shfl_xor_sync(0xffffffffu, send.z, 4);
    recv.w = __shfl_xor_sync(0xffffffffu, send.w, 4);
    evn[k] = o ? recv : keep;
    odd[k] = o ? keep : recv;
  }
}

// ---- the CTA both kernels run ------------------------------------------------------------------
// One query token x 64 heads, the token's active slots in chunks of 64 gathered kv rows (the key:
// D_qk columns; the value: their first 512), a producer warpgroup and two consumer warpgroups.
template <int kDqk_>
struct DsaCta {
  using Element = cutlass::bfloat16_t;
  static constexpr int kDqk = kDqk_;  // 512 or 576
  static constexpr bool kRope = kDqk == 576;
  static constexpr int kDv = 512;
  static constexpr int kHeads = 64;   // query rows (heads) per CTA
  static constexpr int kBlockN = 64;  // keys per chunk
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;
  static constexpr int kConsumerWarps = 8;
  static constexpr int kProducerThreads = 128;
  // Lanes of a consumer warp that arrive on a release ("empty") mbarrier. The consumers read the
  // producer's plain stores (bias; kidx in the backward) too: with every lane arriving, each
  // thread's own reads precede the producer's next stores through its own arrive, which is the
  // form compute-sanitizer's racecheck follows. A lane-0 arrive after a bar.sync or __syncwarp
  // orders the same reads, but racecheck does not follow the chain (bench/notes-archive,
  // session 13).
  static constexpr int kReleaseLanes = 32;
  static constexpr int kReleaseArrivals = kConsumerWarps * kReleaseLanes;  // per consumer release
  static constexpr int kPanelElems = 64 * 64;  // one 64-row x 64-column panel (8 KB)
  static constexpr int kNopeElems = 64 * 512;  // 8 panels
  static constexpr int kNopePanels = 8;
  using H64 = cute::Int<64>;
  using D512 = cute::Int<512>;
  using D64 = cute::Int<64>;
  // Two consumer warpgroups tile N of the products they share.
  using WgLayout = cute::Layout<cute::Shape<cute::_1, cute::_2, cute::_1>>;
  // The operand tiles in 64-column panels, 128-byte swizzle: 64 rows x 512 and 64 x 64
  // (K-major: Q, dO, the gathered kv rows, P, dS'), and the same bytes seen column-major, (512
  // columns, 64 rows) and (64, 64) (the MN-major views: V^T, K^T, P^T, dS'^T).
  using SmemLayoutRows512 = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<H64, D512>{}));
  using SmemLayoutRows64 = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<H64, D64>{}));
  using SmemLayoutCols512 = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_MN_SW128_Atom<Element>{}, cute::Shape<D512, H64>{},
      cute::Step<cute::_2, cute::_1>{}));
  using SmemLayoutCols64 = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_MN_SW128_Atom<Element>{}, cute::Shape<D64, H64>{}));
};

// Warpgroup roles: warpgroup 0 produces, 1 and 2 consume.
enum class Role : int { kProducer = 0, kConsumer0 = 1, kConsumer1 = 2 };

// The role split of a kernel's threads: the producer warpgroup lowers its registers to
// T::kProducerRegs and runs producer(), a consumer raises them to T::kConsumerRegs and runs
// consumer(wg) with wg = 0 or 1.
template <class T, class Producer, class Consumer>
__device__ __forceinline__ void run_roles(Producer producer, Consumer consumer) {
  static_assert(T::kProducerThreads * T::kProducerRegs +
                        T::kConsumerThreads * T::kConsumerRegs <=
                    setmaxnreg_pool(T::kThreads, 1),
                "register split exceeds the CTA's register pool");
  const Role role = static_cast<Role>(__shfl_sync(0xffffffffu, threadIdx.x / 128, 0));
  if (role == Role::kProducer) {
    setmaxnreg_dec<T::kProducerRegs>();
    producer();
  } else {
    setmaxnreg_inc<T::kConsumerRegs>();
    consumer(static_cast<int>(role) - static_cast<int>(Role::kConsumer0));
  }
}

using portable::dsa::cp_async_16_zfill;
using portable::dsa::cp_async_commit;
using portable::dsa::cp_async_wait_all;

// ---- the producer warpgroup's gather (128 threads) ----------------------------------------------
// Thread mapping of the copies below (Q and dO rows; the backward's kv rows): warp w owns rows
// [16 w, 16 w + 16), 4 rows per pass (8 lanes per row, lane % 8 = the 16-byte chunk within each
// 128-byte panel row). The forward's kv gather has its own layout (seesaw_row_sources).
using DsaElement = cutlass::bfloat16_t;

// Row `row` of the destination: 8 nope panels at `nope` (+ the rope panel at `rope` when kRope)
// from `src` (512 or 576 columns), 16 bytes per lane; bytes 0 zero-fills and reads nothing. (The
// backward's chunks come through here; with an opaque lane pointer (opaque_ptr) it ran 1% slower
// at H64 D512, bench/notes-archive session 16, so it stays as it was.)
// kPanelRows: the rows of each destination panel (64, or the small-H forward's H).
template <bool kRope, int kPanelRows = 64>
__device__ __forceinline__ void gather_row(uint32_t nope, uint32_t rope, int row,
                                           const DsaElement* src, int bytes, int lane) {
  const int sub = lane % 8;
#pragma unroll
  for (int pnl = 0; pnl < 8; ++pnl)
    cp_async_16_zfill(nope + pnl * kPanelRows * 64 * 2 + swz(row, sub), src + pnl * 64 + sub * 8,
                      bytes);
  if constexpr (kRope) cp_async_16_zfill(rope + swz(row, sub), src + 512 + sub * 8, bytes);
}

// kTileRows (64, or the small-H forward's 16 / 32) rows of one token's heads [h0, h0 +
// kTileRows) (Q or dO), into panels of kTileRows rows at nope / rope. kPartial: only the first
// `rows` heads exist (H < 64, head padding); the others are zero-filled, not read.
template <bool kRope, bool kPartial = false, int kTileRows = 64>
__device__ __forceinline__ void gather_head_rows(uint32_t nope, uint32_t rope,
                                                 const DsaElement* tok_rows, int64_t head_stride,
                                                 int h0, int warp, int lane, int rows = 64) {
  constexpr int kRowsPerWarp = kTileRows / 4;
  static_assert(kRowsPerWarp % 4 == 0, "4 rows per pass");
#pragma unroll 1
  for (int pass = 0; pass < kRowsPerWarp / 4; ++pass) {
    const int row = kRowsPerWarp * warp + 4 * pass + lane / 8;
    if constexpr (kPartial) {
      const bool valid = row < rows;
      gather_row<kRope, kTileRows>(nope, rope, row,
                                   valid ? tok_rows + (h0 + row) * head_stride : tok_rows,
                                   valid ? 16 : 0, lane);
    } else {
      gather_row<kRope, kTileRows>(nope, rope, row, tok_rows + (h0 + row) * head_stride, 16,
                                   lane);
    }
  }
}

// The kv row index of this lane's slot of chunk c (lanes 0..15 of warp w: slot 64 c + 16 w +
// lane), -1 past the active prefix and for lanes 16..31. Read lane-parallel before the producer
// waits for the stage; gather_chunk broadcasts each with __shfl_sync.
__device__ __forceinline__ int32_t chunk_slot_index(const int32_t* idx_row, int64_t idx_si,
                                                    int n_slots, int c, int warp, int lane) {
  const int slot = c * 64 + 16 * warp + (lane % 16);
  return lane < 16 && slot < n_slots ? idx_row[slot * idx_si] : -1;
}

// The index of row r_in_warp of this warp's 16 rows, broadcast from the lane that loaded it
// (chunk_slot_index): the seed's lane-parallel index load.
struct ShuffledRowIndex {
  int32_t j;  // this lane's index from chunk_slot_index
  __device__ __forceinline__ int32_t operator()(int r_in_warp) const {
    return __shfl_sync(0xffffffffu, j, r_in_warp);
  }
};

// Panels [kP0, kP1) (0-7 the nope panels, 8 the rope panel when kRope) of a chunk's 64 kv rows,
// row r_in_warp of warp w at index row_index(r_in_warp): active rows (0 <= index < skv) from
// their kv row, inactive ones zero-filled without a read. The backward gathers a chunk in panel
// groups, each its own cp.async group, so that its first GEMM starts on the first group
// (dsa_backward_kernel.cuh, kv_full). kMark: mark(row, active, index) once per row (on lane % 8
// == 0) for the chunk's per-row metadata.
template <bool kRope, int kP0, int kP1, bool kMark, class RowIndex, class Mark>
__device__ __forceinline__ void gather_chunk_panels(uint32_t nope, uint32_t rope,
                                                    const DsaElement* kv, int64_t kv_ss,
                                                    int64_t skv, RowIndex row_index, int warp,
                                                    int lane, Mark mark) {
  static_assert(0 <= kP0 && kP0 < kP1 && kP1 <= (kRope ? 9 : 8), "panels 0-7, rope 8");
  const int sub = lane % 8;
#pragma unroll 1
  for (int pass = 0; pass < 4; ++pass) {
    const int r_in_warp = 4 * pass + lane / 8;
    const int32_t jr = row_index(r_in_warp);
    const int row = 16 * warp + r_in_warp;
    const bool active = jr >= 0 && jr < skv;
    const DsaElement* src = kv + (active ? jr * kv_ss : int64_t{0});
    const int bytes = active ? 16 : 0;
    if constexpr (kP0 == 0 && kP1 == (kRope ? 9 : 8)) {
      // Every panel: gather_row's code (the small-H forward's gather, as measured).
      gather_row<kRope>(nope, rope, row, src, bytes, lane);
    } else {
#pragma unroll
      for (int pnl = kP0; pnl < kP1; ++pnl) {
        if (pnl < 8)
          cp_async_16_zfill(nope + pnl * 64 * 64 * 2 + swz(row, sub), src + pnl * 64 + sub * 8,
                            bytes);
        else
          cp_async_16_zfill(rope + swz(row, sub), src + 512 + sub * 8, bytes);
      }
    }
    if constexpr (kMark) {
      if (lane % 8 == 0) mark(row, active, jr);
    }
  }
}

// All columns of a chunk's 64 kv rows (the small-H forward's gather), mark() once per row.
template <bool kRope, class RowIndex, class Mark>
__device__ __forceinline__ void gather_chunk(uint32_t nope, uint32_t rope, const DsaElement* kv,
                                             int64_t kv_ss, int64_t skv, RowIndex row_index,
                                             int warp, int lane, Mark mark) {
  gather_chunk_panels<kRope, 0, kRope ? 9 : 8, true>(nope, rope, kv, kv_ss, skv, row_index, warp,
                                                     lane, mark);
}

// Appends C (+)= A B over the K extent of a and b to the current wgmma batch (no arrive/commit).
template <class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_ss(TiledMma& mma, const TA& a, const TB& b, TC& c,
                                        bool zero_init) {
  using namespace cute;
  mma.accumulate_ = zero_init ? SM90::GMMA::ScaleOut::Zero : SM90::GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = SM90::GMMA::ScaleOut::One;
  }
}

// The same over k-blocks [kB0, kB1) of a and b only.
template <int kB0, int kB1, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_ss_kblocks(TiledMma& mma, const TA& a, const TB& b, TC& c,
                                                bool zero_init) {
  using namespace cute;
  static_assert(0 <= kB0 && kB0 < kB1, "a non-empty k-block range");
  mma.accumulate_ = zero_init ? SM90::GMMA::ScaleOut::Zero : SM90::GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int kb = kB0; kb < kB1; ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = SM90::GMMA::ScaleOut::One;
  }
}


}  // namespace sa::sm90
