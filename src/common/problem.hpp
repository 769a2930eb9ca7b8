// Validated problem descriptors: what the host API hands to every implementation.
//
// Validation (src/api/validate_*.cpp) turns the public argument structs into these, so that
// implementations never look at layouts or optional-argument conventions again:
//  * every q/k/v-like tensor is described by BHSD-ordered strides whatever its layout;
//  * defaults (scale, count, d_v, kv block lengths) are resolved;
//  * optional tensors are a null pointer.
// Pointers are typed void here; the dtype says what they hold.
#pragma once

#include <cstdint>

#include "sparse_attention/sparse_attention.h"

#if defined(__CUDACC__)
#define SA_HD __host__ __device__ __forceinline__
#else
#define SA_HD inline
#endif

namespace sa {

// Element (b, h, s, d) of a 4-D attention tensor lives at
//   data + b*sb + h*sh + s*ss + d*sd   (in elements).
struct Bhsd {
  void* data = nullptr;
  int64_t sb = 0, sh = 0, ss = 0, sd = 1;
  SA_HD int64_t offset(int64_t b, int64_t h, int64_t s, int64_t d) const {
    return b * sb + h * sh + s * ss + d * sd;
  }
};

// A strided int32 metadata tensor of up to 4 dims (strides may be 0: broadcast).
struct IntView {
  const int32_t* data = nullptr;  // null: absent
  int64_t stride[4] = {0, 0, 0, 0};
  SA_HD int32_t at(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    return data[i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3]];
  }
};

// ---- BSA --------------------------------------------------------------------------------------
struct BsaDims {
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Skv = 0, D = 0, Dv = 0;
  int32_t block = 0;          // 64 or 128
  int64_t Nq = 0, Nkv = 0;    // ceil(S / block)
  int64_t Kmax = 0;           // last dim of q2k_index
  SA_HD int64_t group() const { return Hq / Hkv; }  // query heads per KV head
};

// The token mask inside listed blocks (SPEC 4), resolved by validation from options.mask,
// causal_offset and the windows: key s is visible to query i iff  lo <= s - i <= hi.
// lo and hi are clamped to [-Sq, Skv], which changes no answer (s - i lies in [1 - Sq, Skv - 1])
// and keeps them, s - i and the classification's differences inside int32 wherever Sq and Skv
// fit int32 (the GPU paths' limit).
struct TokenMask {
  bool on = false;  // false: every valid key of a listed block is visible (mask "none")
  int64_t lo = 0, hi = 0;

  SA_HD bool visible(int64_t i, int64_t s) const {
    return !on || (s - i >= lo && s - i <= hi);
  }
};

// How rows [r0, r1] x keys [k0, k1] (inclusive, non-empty) meet the band lo <= s - i <= hi: the
// differences s - i of the rectangle are exactly the integers [k0 - r1, k1 - r0].
enum class MaskClass : int { kInside = 0, kPartial = 1, kOutside = 2 };
template <class I>
SA_HD MaskClass classify_tile(I r0, I r1, I k0, I k1, I lo, I hi) {
  const I dmin = k0 - r1, dmax = k1 - r0;
  if (dmax < lo || dmin > hi) return MaskClass::kOutside;
  if (dmin >= lo && dmax <= hi) return MaskClass::kInside;
  return MaskClass::kPartial;
}

SA_HD int64_t clamp_to(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// One sequence of a call: its query tokens [q0, q0 + sq) and keys [k0, k0 + skv) along the
// tensors' S axis. A dense batch has one span per batch entry, {0, Sq, 0, Skv}; a packed (THD)
// batch takes them from cu_seqlens.
struct SeqSpan {
  int64_t q0 = 0, sq = 0, k0 = 0, skv = 0;
};

struct BsaMeta {
  IntView q2k_index;     // [B, Hq, Nq, Kmax]
  IntView q2k_count;     // [B, Hq, Nq], or absent: fixed_count for every row
  int32_t fixed_count = 0;
  IntView kv_block_len;  // [B, Nkv] (stride[0] == 0 when given as [Nkv]), or absent: full blocks,
                         // the last one cut at Skv
  TokenMask mask;        // the token mask (off: mask "none"); packed batches: see mask_of
  // Packed (THD) batches, SPEC 4: null for a dense batch. Dims then read B = sequences,
  // Sq = T_q and Skv = T_kv (total tokens), Nq = N_q_max (the metadata's third dim) and
  // Nkv = ceil(T_kv / block), a bound on every sequence's KV blocks; attention tensors have
  // sb = 0 and index tokens globally, lse is [Hq, T_q].
  const int32_t* cu_seqlens_q = nullptr;  // [B + 1]
  const int32_t* cu_seqlens_k = nullptr;  // [B + 1]
  int64_t cu_stride_q = 1, cu_stride_k = 1;
  // Packed batches with the default causal offset: the offset is each sequence's
  // skv - sq, and mask.lo / mask.hi hold the band relative to it (clamped to +-(T_q + T_kv)).
  bool mask_offset_per_seq = false;

  SA_HD bool varlen() const { return cu_seqlens_q != nullptr; }
  // Sequence b. Packed: offsets clamped into [0, T] and lengths to >= 0, so that no cu_seqlens
  // value at all can move an access out of bounds (values outside the contract give unspecified
  // results; the reference and options.validate report them).
  SA_HD SeqSpan seq(int64_t b, const BsaDims& d) const {
    SeqSpan s;
    if (!cu_seqlens_q) {
      s.sq = d.Sq;
      s.skv = d.Skv;
      return s;
    }
    s.q0 = clamp_to(cu_seqlens_q[b * cu_stride_q], 0, d.Sq);
    s.sq = clamp_to(cu_seqlens_q[(b + 1) * cu_stride_q], s.q0, d.Sq) - s.q0;
    s.k0 = clamp_to(cu_seqlens_k[b * cu_stride_k], 0, d.Skv);
    s.skv = clamp_to(cu_seqlens_k[(b + 1) * cu_stride_k], s.k0, d.Skv) - s.k0;
    return s;
  }
  // The token mask of a sequence, in its local coordinates (query i, key s from its start),
  // clamped to [-sq, skv] like a dense call's.
  SA_HD TokenMask mask_of(const SeqSpan& s) const {
    if (!cu_seqlens_q || !mask.on) return mask;
    const int64_t c = mask_offset_per_seq ? s.skv - s.sq : 0;
    TokenMask m;
    m.on = true;
    m.lo = clamp_to(mask.lo + c, -s.sq, s.skv);
    m.hi = clamp_to(mask.hi + c, -s.sq, s.skv);
    return m;
  }
  // Number of entries of row (b, h, m) that are read.
  SA_HD int32_t count(int64_t b, int64_t h, int64_t m) const {
    return q2k_count.data ? q2k_count.at(b, h, m) : fixed_count;
  }
  // Is the pair (query block m, KV block n) entirely hidden by the mask? Judged on the block's
  // nominal keys (not block_len), so an answer of true holds for any valid length.
  // Packed batches: of sequence `s` with its mask `sm` (mask_of(s)); a block past the
  // sequence's end counts as hidden (it holds no query or no key).
  SA_HD bool pair_outside(int64_t m, int64_t n, const BsaDims& d) const {
    SeqSpan s;
    s.sq = d.Sq;
    s.skv = d.Skv;
    return pair_outside(m, n, d.block, s, mask);
  }
  SA_HD static bool pair_outside(int64_t m, int64_t n, int32_t block, const SeqSpan& s,
                                 const TokenMask& sm) {
    if (!sm.on) return false;
    const int64_t r0 = m * block, r1 = (m + 1) * block < s.sq ? (m + 1) * block : s.sq;
    const int64_t k0 = n * block, k1 = (n + 1) * block < s.skv ? (n + 1) * block : s.skv;
    if (r1 <= r0 || k1 <= k0) return true;
    return classify_tile<int64_t>(r0, r1 - 1, k0, k1 - 1, sm.lo, sm.hi) == MaskClass::kOutside;
  }
  // Valid keys in KV block n of batch b (dense batches).
  SA_HD int32_t block_len(int64_t b, int64_t n, const BsaDims& d) const {
    if (kv_block_len.data) return kv_block_len.at(b, n);
    int64_t rest = d.Skv - n * d.block;
    return static_cast<int32_t>(rest < d.block ? rest : d.block);
  }
  // Valid keys in KV block n of sequence s (packed batches have no kv_block_len: the
  // sequence's length cuts its last block). 0 past the sequence's end.
  SA_HD int32_t block_len(int64_t b, int64_t n, const BsaDims& d, const SeqSpan& s) const {
    if (!cu_seqlens_q) return block_len(b, n, d);
    int64_t rest = s.skv - n * d.block;
    return static_cast<int32_t>(rest < 0 ? 0 : (rest < d.block ? rest : d.block));
  }

};

// The fields every problem shares: shapes, element type, device, the resolved scale, the
// caller's options and the validated metadata. make_problem (src/api/validate_*.cpp) fills them.
template <class Dims, class Options, class Meta>
struct ProblemHeader {
  Dims dims;
  sa_dtype dtype = SA_DTYPE_BF16;   // of the attention tensors
  sa_device_type device = SA_DEVICE_CPU;
  int32_t device_index = 0;
  float scale = 0.f;                // resolved
  Options options{};
  Meta meta;
};

struct BsaFwdProblem : ProblemHeader<BsaDims, sa_bsa_options, BsaMeta> {
  Bhsd q, k, v, o;
  float* lse = nullptr;             // [B, Hq, Sq]
  int64_t lse_stride[3] = {0, 0, 0};
};

struct BsaBwdProblem : ProblemHeader<BsaDims, sa_bsa_options, BsaMeta> {
  Bhsd q, k, v, o, dout, dq, dk, dv;
  const float* lse = nullptr;       // [B, Hq, Sq]
  int64_t lse_stride[3] = {0, 0, 0};
};

// ---- DSA --------------------------------------------------------------------------------------
struct DsaDims {
  int64_t Sq = 0, Skv = 0, H = 0, Dqk = 0, Dv = 0, topk = 0;
};

// A 3-D [S, H, D] or 2-D [S, D] tensor with strides in elements (sh unused for 2-D).
struct Shd {
  void* data = nullptr;
  int64_t ss = 0, sh = 0, sd = 1;
  SA_HD int64_t offset(int64_t s, int64_t h, int64_t d) const { return s * ss + h * sh + d * sd; }
};

struct DsaMeta {
  IntView topk_idx;     // [Sq, topk]
  IntView topk_length;  // [Sq], or absent
  const float* sink = nullptr;  // [H] (contiguous after validation: stride sink_stride)
  int64_t sink_stride = 1;
  // Is slot i of row t active (SPEC 2)? Never dereferences kv.
  SA_HD bool active(int64_t t, int64_t i, const DsaDims& d) const {
    if (topk_length.data) {
      int64_t len = topk_length.at(t);
      if (i >= len) return false;
    }
    int32_t j = topk_idx.at(t, i);
    return j >= 0 && j < d.Skv;
  }
};

struct DsaFwdProblem : ProblemHeader<DsaDims, sa_dsa_options, DsaMeta> {
  Shd q, kv, out;                   // kv: 2-D
  float* lse = nullptr;             // [Sq, H]
  int64_t lse_stride[2] = {0, 0};
};

struct DsaBwdProblem : ProblemHeader<DsaDims, sa_dsa_options, DsaMeta> {
  Shd q, kv, out, dout, dq, dkv;    // kv, dkv: 2-D
  const float* lse = nullptr;       // [Sq, H]
  int64_t lse_stride[2] = {0, 0};
  float* d_sink = nullptr;          // [H], or absent
  int64_t d_sink_stride = 1;
};

}  // namespace sa
