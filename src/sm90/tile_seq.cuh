// Packed (THD) batches in the Hopper BSA kernels: a work unit's sequence read on the device, and
// the zeroing of rows of a landed TMA tile. Shared by the forward (bsa_forward_kernel.cuh,
// FwdTraits::kVarlen: one sequence per tile, read by each role) and the backward
// (bsa_backward_kernel.cuh, BwdTraits::kVarlen: one sequence per CTA, read once into shared
// memory). Device code only.
//
// The params type P of TileSeq::of and its accessors is the kernel's (BsaFwdSm90Params,
// BsaBwdSm90Params): both hold meta (cu_seqlens, mask), Sq = T_q, Skv = T_kv and the dense band
// mask_lo / mask_hi.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/problem.hpp"
#include "sm90/hopper_primitives.cuh"

namespace sa::sm90 {

// ---- the sequence of a tile or work item ------------------------------------------------------
// Its query rows, keys and band are the sequence's, in the sequence's local coordinates; q0() /
// k0() place them on the tensors' token axis (TMA rows, output rows) and tma_b() is the TMA
// boxes' batch coordinate.
// Dense batches (TileSeq<false>): one sequence per batch entry, the call's own values, read from
// the params where they are used, so that the dense instantiations compile as before.
// Packed (TileSeq<true>): BsaMeta::seq of cu_seqlens, read on the device (offsets clamped into
// [0, T], so that no value moves an access out of bounds; no host read, so a captured graph
// replays with new offsets), and the sequence's band BsaMeta::mask_of (clamped to [-sq, skv]:
// int32), or without a mask [-sq, skv], which every pair of the sequence passes. Query blocks
// past the sequence's end (the grids have N_q_max per sequence) do nothing.
template <bool kVarlen>
struct TileSeq {
  static constexpr bool kPacked = false;
  template <class P>
  __device__ __forceinline__ static TileSeq of(const P&, int) { return {}; }
  __device__ __forceinline__ int q0() const { return 0; }
  __device__ __forceinline__ int k0() const { return 0; }
  template <class P>
  __device__ __forceinline__ int sq(const P& p) const { return p.Sq; }
  template <class P>
  __device__ __forceinline__ int skv(const P& p) const { return p.Skv; }
  template <class P>
  __device__ __forceinline__ int lo(const P& p) const { return p.mask_lo; }
  template <class P>
  __device__ __forceinline__ int hi(const P& p) const { return p.mask_hi; }
  __device__ __forceinline__ int tma_b(int b) const { return b; }
  // Does the query block starting at local row row0 lie past the sequence's end?
  __device__ __forceinline__ bool past_end(int) const { return false; }
};
template <>
struct TileSeq<true> {
  static constexpr bool kPacked = true;
  int q0_, sq_, k0_, skv_, lo_, hi_;
  template <class P>
  __device__ __forceinline__ static TileSeq of(const P& p, int b) {
    BsaDims d;
    d.Sq = p.Sq;
    d.Skv = p.Skv;
    const SeqSpan s = p.meta.seq(b, d);
    TileSeq t;
    t.q0_ = static_cast<int>(s.q0);
    t.sq_ = static_cast<int>(s.sq);
    t.k0_ = static_cast<int>(s.k0);
    t.skv_ = static_cast<int>(s.skv);
    if (p.meta.mask.on) {
      const TokenMask m = p.meta.mask_of(s);
      t.lo_ = static_cast<int>(m.lo);
      t.hi_ = static_cast<int>(m.hi);
    } else {
      t.lo_ = -t.sq_;
      t.hi_ = t.skv_;
    }
    return t;
  }
  __device__ __forceinline__ int q0() const { return q0_; }
  __device__ __forceinline__ int k0() const { return k0_; }
  template <class P>
  __device__ __forceinline__ int sq(const P&) const { return sq_; }
  template <class P>
  __device__ __forceinline__ int skv(const P&) const { return skv_; }
  template <class P>
  __device__ __forceinline__ int lo(const P&) const { return lo_; }
  template <class P>
  __device__ __forceinline__ int hi(const P&) const { return hi_; }
  __device__ __forceinline__ int tma_b(int) const { return 0; }
  __device__ __forceinline__ bool past_end(int row0) const { return row0 >= sq_; }
};

// A consumer warp's view of its tile's sequence (packed batches, forward): the words {sq, skv,
// lo, hi, q0} that its lane 0 stored in shared memory at the tile's start (8 words a warp),
// loaded where used (values(): one 16-byte load), so that no register holds them, nor O and LSE
// row pointers derived from q0, through the mainloop. The warp's address is formed inside each
// access from %tid.x and the uniform base: every form of it that the compiler could see (per
// warp, + 4 i per word) was hoisted out of the tile loop and held in a register, and the
// block-64 D-128 consumer spilled. Only the warp's own lanes read its words (__syncwarp orders).
struct SharedSeq {
  static constexpr bool kPacked = true;
  uint32_t base;  // shared address of the words minus 32 * 4 (consumer warps are 4..11)
  __device__ __forceinline__ TileSeq<true> values() const {
    TileSeq<true> t;
    asm volatile(
        "{\n"
        ".reg .u32 a;\n"
        "mov.u32 a, %%tid.x;\n"
        "shr.u32 a, a, 5;\n"
        "mad.lo.u32 a, a, 32, %4;\n"
        "ld.shared.v4.b32 {%0, %1, %2, %3}, [a];\n"
        "}\n"
        : "=r"(t.sq_), "=r"(t.skv_), "=r"(t.lo_), "=r"(t.hi_)
        : "r"(base));
    t.q0_ = t.k0_ = 0;  // not loaded (q0())
    return t;
  }
  __device__ __forceinline__ int q0() const {
    int v;
    asm volatile(
        "{\n"
        ".reg .u32 a;\n"
        "mov.u32 a, %%tid.x;\n"
        "shr.u32 a, a, 5;\n"
        "mad.lo.u32 a, a, 32, %1;\n"
        "ld.shared.b32 %0, [a+16];\n"
        "}\n"
        : "=r"(v)
        : "r"(base));
    return v;
  }
  __device__ __forceinline__ void store(const TileSeq<true>& t) const {
    asm volatile(
        "{\n"
        ".reg .u32 a;\n"
        "mov.u32 a, %%tid.x;\n"
        "shr.u32 a, a, 5;\n"
        "mad.lo.u32 a, a, 32, %0;\n"
        "st.shared.v4.b32 [a], {%1, %2, %3, %4};\n"
        "st.shared.b32 [a+16], %5;\n"
        "}\n" ::"r"(base),
        "r"(t.sq_), "r"(t.skv_), "r"(t.lo_), "r"(t.hi_), "r"(t.q0_)
        : "memory");
  }
};
// The sequence's values where a walker uses several: a register TileSeq as it is, a consumer's
// SharedSeq loaded once.
template <class Seq>
__device__ __forceinline__ const Seq& seq_values(const Seq& s) { return s; }
__device__ __forceinline__ TileSeq<true> seq_values(const SharedSeq& s) { return s.values(); }

// The sequence of a whole CTA (packed batches, backward: a work item belongs to one sequence),
// in shared memory: word kSeq* of a fixed address, written once by thread 0 before the CTA's
// first barrier and read at each use (ld.shared), so that no role keeps them in registers.
enum SeqWord : int { kSeqSq, kSeqSkv, kSeqLo, kSeqHi, kSeqQ0, kSeqK0, kSeqStatRow0, kSeqWords = 8 };
struct alignas(16) CtaSeqWords {
  int32_t w[kSeqWords];
};
__device__ __forceinline__ int cta_seq_word(const CtaSeqWords& s, SeqWord i) {
  return static_cast<int>(ld_shared_u32(smem_u32(&s.w[i])));
}
// Thread 0: store the sequence and its first row in the packed stats / dQ buffers.
__device__ __forceinline__ void cta_seq_store(CtaSeqWords& s, const TileSeq<true>& t,
                                              int stat_row0) {
  st_shared_v4(smem_u32(&s.w[0]), make_uint4(static_cast<uint32_t>(t.sq_),
                                             static_cast<uint32_t>(t.skv_),
                                             static_cast<uint32_t>(t.lo_),
                                             static_cast<uint32_t>(t.hi_)));
  st_shared_v4(smem_u32(&s.w[4]), make_uint4(static_cast<uint32_t>(t.q0_),
                                             static_cast<uint32_t>(t.k0_),
                                             static_cast<uint32_t>(stat_row0), 0u));
}

// ---- rows of a landed tile ----------------------------------------------------------------------
// Zero rows [row0, row0 + rows) of every 64-column panel of a 128-byte-row tile in shared memory
// (whole rows: the 128B swizzle permutes 16-byte chunks within a row), one warp, lane `lane`
// taking every 32nd chunk. The tile is a pointer to its 2-byte elements, or (Tile = uint32_t) its
// shared address: 32-bit st.shared, for a caller with few registers (the backward's producer
// warp, 24). The caller fences (fence_proxy_async_shared) before an async-proxy reader (wgmma,
// TMA store) and orders the warp (__syncwarp) before publishing.
template <int kPanels, class Tile>
__device__ __forceinline__ void zero_tile_rows(Tile tile, int panel_elems, int row0, int rows,
                                               int lane) {
  const int chunks = rows * 8;  // 16-byte chunks per panel
#pragma unroll
  for (int pnl = 0; pnl < kPanels; ++pnl) {
    if constexpr (std::is_same_v<Tile, uint32_t>) {
      const uint32_t dst = tile + 2 * (pnl * panel_elems + row0 * 64);
#pragma unroll 1
      for (int c = lane; c < chunks; c += 32) st_shared_v4(dst + 16 * c, make_uint4(0u, 0u, 0u, 0u));
    } else {
      uint4* dst = reinterpret_cast<uint4*>(tile + pnl * panel_elems + row0 * 64);
      for (int c = lane; c < chunks; c += 32) dst[c] = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

}  // namespace sa::sm90
