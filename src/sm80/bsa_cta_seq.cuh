// The sequence a BSA CTA works on (packed batches, SPEC 4), shared by the portable BSA kernels.
//
// Every kernel indexes keys, query rows and the token mask in the sequence's local coordinates
// and adds the sequence's first token (q0, k0) only where it addresses a tensor. A dense batch
// is the special case of one sequence per batch entry with q0 = k0 = 0, sq = S_q, skv = S_kv and
// the call's band, so the two share one code path and a dense call reads the same values as
// before packed batches existed.
//
// Invariants (BsaMeta::seq, mask_of): 0 <= q0, q0 + sq <= T_q and likewise for keys, whatever the
// device holds in cu_seqlens (values are clamped, never trusted for addressing); the band
// [mask_lo, mask_hi] is clamped to [-sq, skv]. All fit int32: T_q, T_kv are (validation and the
// portable paths' limits). Nothing here depends on cu_seqlens on the host: grids are sized from
// shapes and a CTA past its sequence's end does nothing (the caller's early exit).
#pragma once

#include <cstdint>

#include "common/problem.hpp"

namespace sa::portable {

struct CtaSeq {
  int32_t q0, sq;            // query tokens [q0, q0 + sq) of the tensors' token axis
  int32_t k0, skv;           // keys [k0, k0 + skv)
  int32_t mask_lo, mask_hi;  // the sequence's band (meaningful when the call has a mask)
};
static_assert(sizeof(CtaSeq) == 6 * sizeof(int32_t), "six int32 in shared memory");

__device__ __forceinline__ CtaSeq cta_seq(const BsaMeta& meta, const BsaDims& dims, int b) {
  const SeqSpan s = meta.seq(b, dims);
  const TokenMask m = meta.mask_of(s);
  CtaSeq c;
  c.q0 = static_cast<int32_t>(s.q0);
  c.sq = static_cast<int32_t>(s.sq);
  c.k0 = static_cast<int32_t>(s.k0);
  c.skv = static_cast<int32_t>(s.skv);
  c.mask_lo = static_cast<int32_t>(m.lo);
  c.mask_hi = static_cast<int32_t>(m.hi);
  return c;
}

// Valid keys of the sequence's local KV block n: kv_block_len (dense batches) or the block cut
// at the sequence's end (packed batches, where 0 past the end), never past skv.
__device__ __forceinline__ int cta_block_len(const BsaMeta& meta, const BsaDims& dims, int b,
                                             int n, const CtaSeq& c) {
  SeqSpan s;
  s.q0 = c.q0;
  s.sq = c.sq;
  s.k0 = c.k0;
  s.skv = c.skv;
  return min(meta.block_len(b, n, dims, s), c.skv - n * dims.block);
}

}  // namespace sa::portable
