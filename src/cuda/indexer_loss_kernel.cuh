// The indexer loss and its gradients (SPEC 5) that every CUDA path shares, one CTA per token t,
// after an arch's target kernel (sm80/ or sm90/indexer_target_kernel.cuh) has written log A_g for
// the token's slots (sparse: the active slots; dense: the keys of its range, for the tokens of
// one slice):
//
//   [a] K_t. Sparse: the slots i of row t in the loss (IndexerMeta::slot_in_loss), compacted in
//       slot order into shared memory with their keys and log A = logaddexp over the head groups
//       of log A_g (group order); deterministic mode: zero partial dk rows for the active slots
//       (SPEC 2's rule) outside K_t, which the fixed-order reduction also reads. Dense: the
//       range, key = begin + position, log A read from the workspace when needed (no list: the
//       range may hold any number of keys).
//   [b] log Z_A = logsumexp of log A over K_t; an empty K_t or log Z_A = -inf (no target mass) is
//       an empty row: loss 0, dq_I and dw rows 0, zero partial rows (deterministic mode).
//   [c] pass 1: the k_I rows of K_t in chunks of 64 (cp.async, double-buffered; rows past |K_t|
//       zero-filled), a = scale_I k_I q_I^T on mma.sync (keys x heads: warp w owns keys
//       [16 w, +16) of the chunk, all H_I heads), I = sum_j w_j relu(a_j) (each thread its
//       columns, then the quad). Sparse: I -> shared memory. Dense (streaming): per thread an
//       online logsumexp of I and, with p = exp(log A - log Z_A), the sums of p (log p - I) and
//       of p over its keys.
//   [d] log Z_I and the row's loss coeff sum p (log p - log r) (p = 0 terms: 0); sparse also
//       dI = coeff (r - p) in place of I. Every sum over the row is per thread in a fixed order,
//       then a fixed tree: the same bits on every run.
//   [e] pass 2 (gradients): the same chunks and a again (dense: I and dI recomputed from them
//       and log A); G = dI [a > 0];
//         dw_j   += sum_i dI_i relu(a_ij)                  per thread, then lanes and warps
//         dk_I[s_i] += sum_j (scale_I w_j G_ij) q_I[t, j]  keys x heads times heads x D_I: A
//                  from the accumulator of a (bf16, the FA2 register reuse), q_I by
//                  ldmatrix.trans; fp32 reductions into the dk accumulator, or (deterministic,
//                  sparse) plain stores into the slot's partial row
//         dq_I[t, j] += sum_i G_ij k_I[s_i]                heads x keys (G through shared
//                  memory, ldmatrix.trans) times keys x D_I (the gathered rows, .trans); each
//                  warp a tile of heads x columns of dq_I, accumulated over all chunks
//   [f] dq_I = scale_I w_j (the accumulator) in bf16; dw.
//
// Per chunk of 64 keys and warp: a 8 k16 steps x (1 + H_I/16 ldmatrix.x4, H_I/8 MMAs); dk
// H_I/16 x 8 x (1 ldmatrix.x4.trans, 2 MMAs); dq 4 x (1 + n/2 ldmatrix, n MMAs) for n = the
// warp's n8 tiles of dq_I.
//
// Registers per thread (H_I 64): dq accumulator 64 fp32 (16 heads x 128 columns per warp), dk
// accumulator 32 (16 keys x 64 columns: two halves), a 32, the bf16 A fragments of dk 16, dw
// partials 16.
//
// Shared memory (bytes): q_I row H_I x 256; k_I 2 stages x 64 x 256 = 32,768; G 64 x (2 H_I + 16)
// (rows padded: conflict-free ldmatrix.trans); w H_I fp32; scratch; then, sparse mode, per slot
// of the row (topk rounded up to 128) its position data: key, slot, log A, I / dI (16 bytes).
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "common/device_math.cuh"
#include "common/indexer_problem.hpp"
#include "cuda/dsa_mma.hpp"

namespace sa::portable::indexer {

struct LossParams {
  const __nv_bfloat16* q_I;  // [S_q, H_I, 128]: (t, j, d) at t * qi_ss + j * qi_sh + d
  const __nv_bfloat16* k_I;  // [S_kv, 128]: row s at s * ki_ss
  const float* w;            // [S_q, H_I]: (t, j) at t * w_ss + j * w_sh
  int64_t qi_ss, qi_sh, ki_ss, w_ss, w_sh;
  IndexerDims dims;
  IndexerMeta meta;  // ranges, topk_idx, topk_length (slot_in_loss)
  float scale_I, coeff;
  // log A_g of (group g, token t, position i) at g * la_gs + (t - la_tok0) * la_ts + i: the
  // target kernel's (sparse: [groups, S_q, topk], position = slot; dense: [groups, slice, S_kv],
  // position = key - range_begin(t)).
  const float* log_a;
  int64_t la_gs, la_ts, la_tok0;
  int32_t head_groups;
  int32_t topk;  // sparse mode: slots per row
  // Outputs.
  float* loss_rows;       // [S_q] workspace: the row losses (coeff included)
  float* loss_per_token;  // [S_q] at t * lpt_s; may be null
  int64_t lpt_s;
  int32_t grads;  // nonzero: dq_I, dw and dk
  __nv_bfloat16* dq_I;  // [S_q, H_I, 128]: (t, j, d) at t * dq_ss + j * dq_sh + d
  int64_t dq_ss, dq_sh;
  float* dw;  // [S_q, H_I]: (t, j) at t * dw_ss + j * dw_sh
  int64_t dw_ss, dw_sh;
  float* dk_acc;   // [S_kv, 128] fp32 accumulator (reductions); null in deterministic mode
  float* dk_part;  // deterministic (sparse): [(t - tok_begin) * topk + slot, 128]; else null
  int64_t tok_begin;  // the token of CTA 0
  int64_t tok_end;    // one past the launch's last token (set by the Hopper pair kernel's launch)
};

template <int kHeads_>
struct LossConfig {
  static constexpr int kHeads = kHeads_;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kChunk = 64;  // keys per chunk (16 per warp)
  static constexpr int kRowBytes = 256;
  static constexpr int kNt = kHeads / 8;      // n8 tiles of a (heads)
  static constexpr int kKSteps = kHeads / 16;  // k16 steps of dk (heads)
  static constexpr int kHt = kHeads / 16;     // dq: head tiles
  static constexpr int kParts = kWarps / kHt;  // dq: column parts
  static constexpr int kDqNt = 16 / kParts;   // dq: n8 tiles per warp
  static constexpr int kGPitch = 2 * kHeads + 16;  // bytes per G row

  static constexpr int kQOff = 0;
  static constexpr int kKOff = kQOff + kHeads * kRowBytes;
  static constexpr int kKStageBytes = kChunk * kRowBytes;
  static constexpr int kGOff = kKOff + 2 * kKStageBytes;
  static constexpr int kWOff = kGOff + kChunk * kGPitch;
  static constexpr int kRedOff = kWOff + kHeads * 4;          // kThreads fp32
  static constexpr int kDwOff = kRedOff + kThreads * 4;       // kWarps x kHeads fp32
  static constexpr int kCountOff = kDwOff + kWarps * kHeads * 4;  // kWarps int32
  static constexpr int kListOff = kCountOff + 16 * 4;
  // Sparse mode, per slot: key (int32), slot (int32), log A (fp32), I then dI (fp32); dense
  // mode (topk 0): none.
  static int smem_bytes(int topk) {
    const int slots = (topk + kThreads - 1) / kThreads * kThreads;
    return kListOff + 16 * slots;
  }

  static_assert(kHeads == 16 || kHeads == 32 || kHeads == 64, "H_I 16, 32 or 64");
  static_assert(kWarps * 16 == kChunk, "a warp owns 16 keys of a chunk");
  static_assert(kGPitch % 128 == 16 || kGPitch % 128 == 48 || kGPitch % 128 == 80,
                "G rows: odd multiples of 16 bytes modulo 128 (conflict-free .trans)");
};

// This thread's index among the kT threads of its token: the CTA's (kTokens 1), or one of
// kTokens groups of kT consecutive threads (the Hopper pair kernel, a warpgroup per token).
template <int kT, int kTokens>
__device__ __forceinline__ int token_thread() {
  if constexpr (kTokens == 1)
    return static_cast<int>(threadIdx.x);
  else
    return static_cast<int>(threadIdx.x % kT);
}

// The barrier of the row functions below: the CTA's (every kernel but the Hopper pipelined one,
// whose producer warpgroup takes no part: sm90/indexer_loss_pipe_kernel.cuh's ConsumerBarrier).
struct CtaBarrier {
  __device__ __forceinline__ static void sync() { __syncthreads(); }
};

// Sum (op = +) or max over the kThreads threads of a token (token_thread) of one value per
// thread, in a fixed order: every thread of the token gets the result. red: kThreads fp32 of
// shared memory per token (the token's own), free on entry and on return. Every thread that
// Bar synchronizes calls it (CtaBarrier: every thread of the CTA).
template <int kThreads, bool kMax, int kTokens = 1, class Bar = CtaBarrier>
__device__ __forceinline__ float block_reduce(float v, float* red) {
  const int i = token_thread<kThreads, kTokens>();
  red[i] = v;
  Bar::sync();
#pragma unroll
  for (int off = kThreads / 2; off > 0; off /= 2) {
    if (i < off) red[i] = kMax ? fmaxf(red[i], red[i + off]) : red[i] + red[i + off];
    Bar::sync();
  }
  const float r = red[0];
  Bar::sync();
  return r;
}

// a = scale_I <k_I[row], q_I[t, j]> for this warp's 16 rows of the chunk in `stage` and all H_I
// heads: acc[nt][.] holds rows g, g + 8 (c[0..1], c[2..3]) x heads 8 nt + 2 t4 (+1).
template <class Cfg>
__device__ __forceinline__ void warp_logits(uint32_t k_stage, uint32_t q_base, float scale,
                                            float (&acc)[Cfg::kNt][4]) {
  using Ops = dsa::Mma16<__nv_bfloat16>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, x = lane & 7;
  const uint32_t a_lane = k_stage + (16 * warp + (lane & 15)) * Cfg::kRowBytes;
  const int a_hi = lane >> 4;
  const uint32_t b_lane = q_base + ((lane & 7) + 8 * (lane >> 4)) * Cfg::kRowBytes;
  const int b_hi = (lane >> 3) & 1;
#pragma unroll
  for (int nt = 0; nt < Cfg::kNt; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    uint32_t af[4];
    dsa::ldmatrix_x4(a_lane + (((2 * kk + a_hi) ^ x) << 4), af);
#pragma unroll
    for (int np = 0; np < Cfg::kNt / 2; ++np) {
      uint32_t bf[4];
      dsa::ldmatrix_x4(b_lane + np * 16 * Cfg::kRowBytes + (((2 * kk + b_hi) ^ x) << 4), bf);
      Ops::mma(acc[2 * np], af, bf[0], bf[1]);
      Ops::mma(acc[2 * np + 1], af, bf[2], bf[3]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < Cfg::kNt; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[nt][c] *= scale;
}

// log A from its head groups' parts src[g * gs], g < groups, added in log space in group order
// (src: the workspace, or a copy of it in shared memory, sm90/indexer_loss_kernel.cuh).
__device__ __forceinline__ float log_a_combine(const float* src, int64_t gs, int groups) {
  float la = -INFINITY;
  for (int hg = 0; hg < groups; ++hg) {
    const float v = src[hg * gs];
    const float m = fmaxf(la, v);
    la = m == -INFINITY ? -INFINITY : m + log1pf(expf(fminf(la, v) - m));
  }
  return la;
}

// log A of (token, position) from the workspace.
__device__ __forceinline__ float log_a_at(const LossParams& p, int64_t tok, int64_t pos) {
  return log_a_combine(p.log_a + (tok - p.la_tok0) * p.la_ts + pos, p.la_gs, p.head_groups);
}

// I of this thread's two rows (g, g + 8) from the scaled logits a(nt, c) (n8 tile nt of heads,
// c: rows g (0, 1), g + 8 (2, 3) x heads 8 nt + 2 t4 (+1), the mma.sync C layout, which is also
// the wgmma m64nN one: sm90/indexer_loss_kernel.cuh): each thread's columns, then the quad (every
// lane of the quad gets the sum).
template <int kNt, class Acc>
__device__ __forceinline__ void quad_row_scores(Acc a, const float* s_w, float (&row)[2]) {
  const int t4 = threadIdx.x & 3;
  row[0] = row[1] = 0.f;
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    const float2 wv = *reinterpret_cast<const float2*>(s_w + 8 * nt + 2 * t4);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      row[i] = fmaf(fmaxf(a(nt, 2 * i), 0.f), wv.x, row[i]);
      row[i] = fmaf(fmaxf(a(nt, 2 * i + 1), 0.f), wv.y, row[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row[i] += __shfl_xor_sync(0xffffffffu, row[i], 1);
    row[i] += __shfl_xor_sync(0xffffffffu, row[i], 2);
  }
}

template <class Cfg>
__device__ __forceinline__ void row_scores(const float (&acc)[Cfg::kNt][4], const float* s_w,
                                           float (&row)[2]) {
  quad_row_scores<Cfg::kNt>([&](int nt, int c) { return acc[nt][c]; }, s_w, row);
}

// ---- The row math both loss kernels share (this one and sm90/indexer_loss_kernel.cuh). -------
// Every sum over a row is per thread in a fixed order, then block_reduce: the same bits on every
// run. kT: the threads of one token, kTokens: tokens per CTA (token_thread: 1 here, 2 in the
// Hopper pair kernel); where a function holds a barrier, every thread of the CTA calls it.

// [a] sparse: the slots i of row tok in K_t (IndexerMeta::slot_in_loss), compacted in slot order
// into s_key, s_slot (nullptr: not kept) and s_la (log A); returns |K_t|. on_outside(i) runs for
// each active slot (SPEC 2's rule) outside K_t (deterministic mode: its zero partial row).
// s_count: kT / 32 int32; every thread of the CTA (kT of them) calls it.
template <int kT, class OnOutside>
__device__ __forceinline__ int compact_slots(const LossParams& p, int64_t tok, int32_t* s_key,
                                             int32_t* s_slot, float* s_la, int* s_count,
                                             OnOutside on_outside) {
  constexpr int kWarps = kT / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t lt = (1u << lane) - 1u;
  const IndexerDims& d = p.dims;
  int n = 0;
  // A slot's key, -1 past topk or topk_length; loaded one round ahead, so that the next round's
  // loads are in flight during this round's ballot, barriers and log A loads.
  const int64_t len = p.meta.topk_length.data != nullptr ? p.meta.topk_length.at(tok) : p.topk;
  auto slot_key = [&](int i) { return i < p.topk && i < len ? p.meta.topk_idx.at(tok, i) : -1; };
  int32_t key_next = slot_key(tid);
  for (int base = 0; base < p.topk; base += kT) {
    const int i = base + tid;
    const int32_t key = key_next;
    key_next = slot_key(i + kT);
    // slot_in_loss(tok, i, d) on the loaded key.
    const bool active = key >= 0 && key < d.Skv;
    const bool in = active && p.meta.key_in_loss(tok, key, d);
    const uint32_t mask = __ballot_sync(0xffffffffu, in);
    if (lane == 0) s_count[warp] = __popc(mask);
    __syncthreads();
    int pos = n + __popc(mask & lt);
    int total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) pos += s_count[w];
      total += s_count[w];
    }
    if (in) {
      s_key[pos] = key;
      if (s_slot != nullptr) s_slot[pos] = i;
      s_la[pos] = log_a_at(p, tok, i);
    }
    if (active && !in) on_outside(i);
    n += total;
    __syncthreads();  // s_count is rewritten by the next round
  }
  return n;
}

// [b] log Z_A = logsumexp over positions [0, n) of la_of(i) (sparse: the list; dense: the
// workspace), -inf when no position has target mass.
template <int kT, int kTokens = 1, class LaOf>
__device__ __forceinline__ float row_log_z_a(int n, LaOf la_of, float* red) {
  const int tid = token_thread<kT, kTokens>();
  float m_loc = -INFINITY;
  for (int i = tid; i < n; i += kT) m_loc = fmaxf(m_loc, la_of(i));
  const float m_a = block_reduce<kT, true, kTokens>(m_loc, red);
  float z_loc = 0.f;
  if (m_a != -INFINITY)
    for (int i = tid; i < n; i += kT) z_loc += expf(la_of(i) - m_a);
  const float z_a = block_reduce<kT, false, kTokens>(z_loc, red);
  return m_a == -INFINITY ? -INFINITY : m_a + logf(z_a);
}

// An empty row (empty K_t or no target mass): loss 0; with gradients, dq_I and dw rows 0.
template <int kT, int kHeads, int kTokens = 1>
__device__ __forceinline__ void write_empty_row(const LossParams& p, int64_t tok) {
  const int tid = token_thread<kT, kTokens>();
  if (tid == 0) {
    p.loss_rows[tok] = 0.f;
    if (p.loss_per_token != nullptr) p.loss_per_token[tok * p.lpt_s] = 0.f;
  }
  if (!p.grads) return;
  for (int e = tid; e < kHeads * 64; e += kT) {
    const int j = e / 64, c = 2 * (e % 64);
    *reinterpret_cast<uint32_t*>(p.dq_I + tok * p.dq_ss + j * p.dq_sh + c) = 0u;
  }
  for (int j = tid; j < kHeads; j += kT) p.dw[tok * p.dw_ss + j * p.dw_sh] = 0.f;
}

// The row's loss (coeff included) to loss_rows and loss_per_token.
template <int kT, int kTokens = 1>
__device__ __forceinline__ void write_row_loss(const LossParams& p, int64_t tok, float loss) {
  if (token_thread<kT, kTokens>() == 0) {
    p.loss_rows[tok] = loss;
    if (p.loss_per_token != nullptr) p.loss_per_token[tok * p.lpt_s] = loss;
  }
}

// [d] sparse: log Z_I from I of the list (s_val), the row's loss coeff sum p (log p - log r)
// (p = 0 terms: 0), and dI = coeff (r - p) in place of I. kTokens, Bar: as block_reduce's (the
// Hopper pipelined sparse kernel: its consumer warpgroup, the second of two 128-thread groups).
template <int kT, int kTokens = 1, class Bar = CtaBarrier>
__device__ __forceinline__ float sparse_row_loss(int n, const float* s_la, float* s_val,
                                                 float log_za, float coeff, float* red) {
  const int tid = token_thread<kT, kTokens>();
  float m_loc = -INFINITY;
  for (int i = tid; i < n; i += kT) m_loc = fmaxf(m_loc, s_val[i]);
  const float m_i = block_reduce<kT, true, kTokens, Bar>(m_loc, red);
  float z_loc = 0.f;
  for (int i = tid; i < n; i += kT) z_loc += expf(s_val[i] - m_i);
  const float log_zi = m_i + logf(block_reduce<kT, false, kTokens, Bar>(z_loc, red));
  float term = 0.f;
  for (int i = tid; i < n; i += kT) {
    const float lp = s_la[i] - log_za, lr = s_val[i] - log_zi;
    const float pr = expf(lp);
    if (pr > 0.f) term += pr * (lp - lr);
    s_val[i] = coeff * (expf(lr) - pr);
  }
  return coeff * block_reduce<kT, false, kTokens, Bar>(term, red);
}

// Dense pass 1, one thread's keys: an online logsumexp of I, and with p = exp(lp), lp = log A -
// log Z_A, the sums of p (log p - I) and of p (p = 0 terms: 0).
struct DenseRowSums {
  float m = -INFINITY, z = 0.f;  // running max of I and sum exp(I - m)
  float pl = 0.f, ps = 0.f;      // sum p (log p - I), sum p
  __device__ __forceinline__ void add(float i_val, float lp) {
    if (i_val > m) {
      z = z * expf(m - i_val) + 1.f;  // m = -inf: 0 * 0 + 1
      m = i_val;
    } else if (i_val != -INFINITY) {
      z += expf(i_val - m);
    }
    const float pr = expf(lp);
    if (pr > 0.f) {
      pl = fmaf(pr, lp - i_val, pl);
      ps += pr;
    }
  }
};

// [d] dense: log Z_I (to *log_zi) and the row's loss, coeff (sum p (log p - I) + log Z_I sum p).
template <int kT, int kTokens = 1>
__device__ __forceinline__ float dense_row_loss(const DenseRowSums& s, float coeff, float* red,
                                                float* log_zi) {
  const float m_i = block_reduce<kT, true, kTokens>(s.m, red);
  const float z =
      block_reduce<kT, false, kTokens>(s.m == -INFINITY ? 0.f : s.z * expf(s.m - m_i), red);
  *log_zi = m_i + logf(z);
  const float pl = block_reduce<kT, false, kTokens>(s.pl, red);
  const float ps = block_reduce<kT, false, kTokens>(s.ps, red);
  return coeff * fmaf(*log_zi, ps, pl);
}

// Dense pass 1 with log Z_A not yet known (the Hopper pipelined kernel, which has no [b]):
// DenseRowSums's online logsumexp of I, and one of log A with the sum of (log A - I) on the same
// reference: ma = the running max of log A, za = sum exp(log A - ma), s1 = sum exp(log A - ma)
// (log A - I). Then sum_s p = 1 and sum_s p (log p - I) = s1 / za - log Z_A (keys with log A =
// -inf: p = 0, not folded).
struct DenseOnlineSums {
  float m = -INFINITY, z = 0.f;               // running max of I and sum exp(I - m)
  float ma = -INFINITY, za = 0.f, s1 = 0.f;  // the same of log A, and sum exp(la - ma)(la - I)
  __device__ __forceinline__ void add(float i_val, float la) {
    if (i_val > m) {
      z = z * expf(m - i_val) + 1.f;  // m = -inf: 0 * 0 + 1
      m = i_val;
    } else if (i_val != -INFINITY) {
      z += expf(i_val - m);
    }
    if (la > ma) {
      const float f = expf(ma - la);  // ma = -inf: 0
      za = fmaf(za, f, 1.f);
      s1 = fmaf(s1, f, la - i_val);
      ma = la;
    } else if (la != -INFINITY) {
      const float e = expf(la - ma);
      za += e;
      s1 = fmaf(e, la - i_val, s1);
    }
  }
};

// [b] and [d] dense from DenseOnlineSums: log Z_I (to *log_zi), log Z_A (to *log_za; -inf: no
// target mass, an empty row) and the row's loss coeff (s1 / za - log Z_A + log Z_I). The five
// reductions run unconditionally (Bar may span two tokens).
template <int kT, int kTokens = 1, class Bar = CtaBarrier>
__device__ __forceinline__ float dense_online_row_loss(const DenseOnlineSums& s, float coeff,
                                                       float* red, float* log_zi, float* log_za) {
  const float m_i = block_reduce<kT, true, kTokens, Bar>(s.m, red);
  const float z =
      block_reduce<kT, false, kTokens, Bar>(s.m == -INFINITY ? 0.f : s.z * expf(s.m - m_i), red);
  *log_zi = m_i + logf(z);
  const float m_a = block_reduce<kT, true, kTokens, Bar>(s.ma, red);
  const float f = s.ma == -INFINITY ? 0.f : expf(s.ma - m_a);
  const float za = block_reduce<kT, false, kTokens, Bar>(s.za * f, red);
  const float s1 = block_reduce<kT, false, kTokens, Bar>(s.s1 * f, red);
  if (m_a == -INFINITY) {
    *log_za = -INFINITY;
    return 0.f;
  }
  *log_za = m_a + logf(za);
  return coeff * (s1 / za - *log_za + *log_zi);
}

// Dense pass 2: dI = coeff (r - p) of a key from its I and log A.
__device__ __forceinline__ float dense_di(float coeff, float i_val, float log_zi, float la,
                                          float log_za) {
  return coeff * (expf(i_val - log_zi) - expf(la - log_za));
}

// [f] dw_j = the sum over the token's threads of their dw partials dw_acc[nt][e] (head 8 nt +
// 2 t4 + e): the 8 rows of a warp by shuffles, then the warps in order through s_dw (kT / 32 x
// kHeads fp32); `store` false: nothing written (the barrier still taken).
template <int kT, int kHeads, int kTokens = 1, class Bar = CtaBarrier>
__device__ __forceinline__ void store_dw(const float (&dw_acc)[kHeads / 8][2], float* s_dw,
                                         const LossParams& p, int64_t tok, bool store = true) {
  const int tid = token_thread<kT, kTokens>(), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int nt = 0; nt < kHeads / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = dw_acc[nt][e];
#pragma unroll
      for (int off = 4; off < 32; off *= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (g == 0) s_dw[warp * kHeads + 8 * nt + 2 * t4 + e] = v;
    }
  Bar::sync();
  if (!store) return;
  for (int j = tid; j < kHeads; j += kT) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kT / 32; ++w) v += s_dw[w * kHeads + j];
    p.dw[tok * p.dw_ss + j * p.dw_sh] = v;
  }
}

template <class Cfg, bool kDense>
__global__ void __launch_bounds__(Cfg::kThreads, 2) loss_kernel(const LossParams p) {
  using Ops = dsa::Mma16<__nv_bfloat16>;
  constexpr int kT = Cfg::kThreads;
  constexpr int kChunk = Cfg::kChunk;
  constexpr int kHeads = Cfg::kHeads;
  const float kInf = INFINITY;

  uint8_t* smem = dsa::dynamic_smem();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3, x = lane & 7;
  const int64_t tok = p.tok_begin + blockIdx.x;
  const IndexerDims& d = p.dims;
  const int slots = (p.topk + kT - 1) / kT * kT;
  int32_t* s_key = reinterpret_cast<int32_t*>(smem + Cfg::kListOff);
  int32_t* s_slot = s_key + slots;
  float* s_la = reinterpret_cast<float*>(s_slot + slots);
  float* s_val = s_la + slots;
  float* s_w = reinterpret_cast<float*>(smem + Cfg::kWOff);
  float* s_red = reinterpret_cast<float*>(smem + Cfg::kRedOff);
  float* s_dw = reinterpret_cast<float*>(smem + Cfg::kDwOff);
  int* s_count = reinterpret_cast<int*>(smem + Cfg::kCountOff);
  const uint32_t sq = dsa::smem_u32(smem + Cfg::kQOff);
  const uint32_t sk = dsa::smem_u32(smem + Cfg::kKOff);
  const uint32_t sg = dsa::smem_u32(smem + Cfg::kGOff);
  const bool det = !kDense && p.dk_part != nullptr;
  float* part_rows = det ? p.dk_part + (tok - p.tok_begin) * p.topk * int64_t{128} : nullptr;

  // A zero partial dk row (deterministic mode) for slot i, by one thread.
  auto zero_part_row = [&](int i) {
    float4* row = reinterpret_cast<float4*>(part_rows + int64_t{i} * 128);
#pragma unroll 4
    for (int c = 0; c < 32; ++c) row[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  };

  // [a] K_t: sparse in slot order; dense the range.
  int n = 0;
  int64_t begin = 0;
  if (kDense) {
    begin = p.meta.range_begin(tok, d);
    n = static_cast<int>(p.meta.range_size(tok, d));
  } else {
    n = compact_slots<kT>(p, tok, s_key, s_slot, s_la, s_count, [&](int i) {
      if (det && p.grads) zero_part_row(i);
    });
  }

  // [b] log Z_A: log A of position i, sparse from the list, dense from the workspace.
  auto la_of = [&](int i) { return kDense ? log_a_at(p, tok, i) : s_la[i]; };
  const float log_za = row_log_z_a<kT>(n, la_of, s_red);
  if (n == 0 || log_za == -kInf) {
    write_empty_row<kT, kHeads>(p, tok);
    if (det && p.grads)
      for (int i = tid; i < n; i += kT) zero_part_row(s_slot[i]);
    return;
  }

  // [c] Prologue: q_I and w of the token, chunk 0 of the gathered k_I rows.
  const int cp_chunk = tid & 15;
  {
    const __nv_bfloat16* q_tok = p.q_I + tok * p.qi_ss;
    for (int r = tid >> 4; r < kHeads; r += kT / 16)
      dsa::cp_async_16_zfill(sq + r * Cfg::kRowBytes + ((cp_chunk ^ (r & 7)) << 4),
                             q_tok + r * p.qi_sh + cp_chunk * 8, 16);
    for (int j = tid; j < kHeads; j += kT) s_w[j] = p.w[tok * p.w_ss + j * p.w_sh];
  }
  const int n_chunks = (n + kChunk - 1) / kChunk;
  // The key of position i of K_t.
  auto key_of = [&](int i) { return kDense ? begin + i : int64_t{s_key[i]}; };
  auto gather = [&](int chunk, int stage) {
#pragma unroll
    for (int i = 0; i < kChunk / (kT / 16); ++i) {
      const int r = (tid >> 4) + i * (kT / 16);
      const int pos = chunk * kChunk + r;
      const bool valid = pos < n;
      const __nv_bfloat16* src = valid ? p.k_I + key_of(pos) * p.ki_ss + cp_chunk * 8 : p.k_I;
      dsa::cp_async_16_zfill(sk + stage * Cfg::kKStageBytes + r * Cfg::kRowBytes +
                                 ((cp_chunk ^ (r & 7)) << 4),
                             src, valid ? 16 : 0);
    }
  };
  gather(0, 0);
  dsa::cp_async_commit();

  // Pass 1: I of every position of K_t (dense: folded into running sums, one lane per quad).
  DenseRowSums sums;  // dense
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int stage = chunk & 1;
    dsa::cp_async_wait_all();
    __syncthreads();
    if (chunk + 1 < n_chunks) {
      gather(chunk + 1, stage ^ 1);
      dsa::cp_async_commit();
    }
    float acc[Cfg::kNt][4];
    warp_logits<Cfg>(sk + stage * Cfg::kKStageBytes, sq, p.scale_I, acc);
    float row[2];
    row_scores<Cfg>(acc, s_w, row);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int pos = chunk * kChunk + 16 * warp + g + 8 * i;
      if (t4 != 0 || pos >= n) continue;
      if (!kDense) {
        s_val[pos] = row[i];
        continue;
      }
      sums.add(row[i], log_a_at(p, tok, pos) - log_za);
    }
  }
  __syncthreads();

  // [d] log Z_I, the row's loss (sparse: and dI).
  float log_zi = 0.f;
  const float row_loss = kDense ? dense_row_loss<kT>(sums, p.coeff, s_red, &log_zi)
                                : sparse_row_loss<kT>(n, s_la, s_val, log_za, p.coeff, s_red);
  write_row_loss<kT>(p, tok, row_loss);
  if (!p.grads) return;

  // [e] Pass 2: gradients.
  gather(0, 0);
  dsa::cp_async_commit();
  const int ht = warp % Cfg::kHt, cpart = warp / Cfg::kHt;
  float dq[Cfg::kDqNt][4];
#pragma unroll
  for (int nt = 0; nt < Cfg::kDqNt; ++nt) dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.f;
  float dw_acc[Cfg::kNt][2];
#pragma unroll
  for (int nt = 0; nt < Cfg::kNt; ++nt) dw_acc[nt][0] = dw_acc[nt][1] = 0.f;
  uint32_t* s_g_words = reinterpret_cast<uint32_t*>(smem + Cfg::kGOff);

  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const int stage = chunk & 1;
    const uint32_t k_stage = sk + stage * Cfg::kKStageBytes;
    dsa::cp_async_wait_all();
    __syncthreads();  // the chunk landed; the previous chunk's G and stage are free
    if (chunk + 1 < n_chunks) {
      gather(chunk + 1, stage ^ 1);
      dsa::cp_async_commit();
    }
    float acc[Cfg::kNt][4];
    warp_logits<Cfg>(k_stage, sq, p.scale_I, acc);
    // dI of the two rows (sparse: from [d]; dense: from I and log A again).
    float di[2];
    int pos[2];
    float row[2];
    if (kDense) row_scores<Cfg>(acc, s_w, row);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      pos[i] = chunk * kChunk + 16 * warp + g + 8 * i;
      di[i] = 0.f;
      if (pos[i] < n) {
        di[i] = kDense ? dense_di(p.coeff, row[i], log_zi, log_a_at(p, tok, pos[i]), log_za)
                       : s_val[pos[i]];
      }
    }
    // G, dw, the A fragments of dk (scale_I w_j G in bf16), G -> shared memory.
    uint32_t afr[Cfg::kKSteps][4];
#pragma unroll
    for (int nt = 0; nt < Cfg::kNt; ++nt) {
      const float2 wv = *reinterpret_cast<const float2*>(s_w + 8 * nt + 2 * t4);
      float gv[4], coef[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float a = acc[nt][c];
        const float dI = di[c >> 1];
        dw_acc[nt][c & 1] = fmaf(dI, fmaxf(a, 0.f), dw_acc[nt][c & 1]);
        gv[c] = a > 0.f ? dI : 0.f;
        coef[c] = gv[c] * ((c & 1) ? wv.y : wv.x) * p.scale_I;
      }
      // C of n8 tile nt -> half of the A fragment of k16 step nt / 2.
      afr[nt >> 1][2 * (nt & 1)] = pack2<__nv_bfloat16>(coef[0], coef[1]);
      afr[nt >> 1][2 * (nt & 1) + 1] = pack2<__nv_bfloat16>(coef[2], coef[3]);
#pragma unroll
      for (int i = 0; i < 2; ++i)
        s_g_words[((16 * warp + g + 8 * i) * Cfg::kGPitch + (8 * nt + 2 * t4) * 2) >> 2] =
            pack2<__nv_bfloat16>(gv[2 * i], gv[2 * i + 1]);
    }
    // dk rows of this warp's 16 keys: (keys x heads) x (heads x 128), in two halves of 64
    // columns (32 accumulator registers live instead of 64).
    const uint32_t v_lane = sq + ((lane & 7) + 8 * ((lane >> 3) & 1)) * Cfg::kRowBytes;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float dk[8][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) dk[nt][0] = dk[nt][1] = dk[nt][2] = dk[nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < Cfg::kKSteps; ++kk) {
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          const int ch = 8 * half + 2 * np + (lane >> 4);  // 16-byte chunk of the q_I row
          uint32_t bf[4];
          dsa::ldmatrix_x4_trans(v_lane + kk * 16 * Cfg::kRowBytes + ((ch ^ x) << 4), bf);
          Ops::mma(dk[2 * np], afr[kk], bf[0], bf[1]);
          Ops::mma(dk[2 * np + 1], afr[kk], bf[2], bf[3]);
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (pos[i] >= n) continue;
        float* dst = det ? part_rows + int64_t{s_slot[pos[i]]} * 128
                         : p.dk_acc + key_of(pos[i]) * 128;
        dst += 64 * half + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          if (det) {
            *reinterpret_cast<float2*>(dst + 8 * nt) = make_float2(dk[nt][2 * i], dk[nt][2 * i + 1]);
          } else {
            red_add_f32x2(dst + 8 * nt, dk[nt][2 * i], dk[nt][2 * i + 1]);
          }
        }
      }
    }
    __syncthreads();  // G of every warp is in shared memory
    // dq_I tile of this warp: heads [16 ht, +16) x n8 tiles [cpart kDqNt, +kDqNt), over the
    // chunk's 64 keys.
    {
      const uint32_t g_lane = sg + ((lane & 7) + 8 * (lane >> 4)) * Cfg::kGPitch +
                              (16 * ht + 8 * ((lane >> 3) & 1)) * 2;
      const uint32_t k_lane = k_stage + ((lane & 7) + 8 * ((lane >> 3) & 1)) * Cfg::kRowBytes;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t af[4];
        dsa::ldmatrix_x4_trans(g_lane + kk * 16 * Cfg::kGPitch, af);
#pragma unroll
        for (int np = 0; np < Cfg::kDqNt / 2; ++np) {
          const int ch = cpart * Cfg::kDqNt + 2 * np + (lane >> 4);  // 16-byte chunk of k_I
          uint32_t bf[4];
          dsa::ldmatrix_x4_trans(k_lane + kk * 16 * Cfg::kRowBytes + ((ch ^ x) << 4), bf);
          Ops::mma(dq[2 * np], af, bf[0], bf[1]);
          Ops::mma(dq[2 * np + 1], af, bf[2], bf[3]);
        }
      }
    }
  }

  // [f] dq_I = scale_I w_j acc; dw.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int j = 16 * ht + g + 8 * i;
    const float f = p.scale_I * s_w[j];
    __nv_bfloat16* row = p.dq_I + tok * p.dq_ss + j * p.dq_sh + 8 * cpart * Cfg::kDqNt + 2 * t4;
#pragma unroll
    for (int nt = 0; nt < Cfg::kDqNt; ++nt)
      *reinterpret_cast<uint32_t*>(row + 8 * nt) =
          pack2<__nv_bfloat16>(dq[nt][2 * i] * f, dq[nt][2 * i + 1] * f);
  }
  store_dw<kT, kHeads>(dw_acc, s_dw, p, tok);
}

}  // namespace sa::portable::indexer
