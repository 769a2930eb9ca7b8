// The Hopper (sm_90a) DSA forward kernel (sparse MLA prefill, SPEC 2): its parameters, traits,
// shared storage, epilogue and the kernel function. The schedule (a cp.async gather of the
// selected kv rows by a producer warpgroup, two consumer warpgroups that each own every other
// 64-key block: S = Q K^T and O += P V by wgmma, their softmax under each other's P V) is the
// "seesaw" of dsa_forward_seesaw.cuh. Device code only; dsa_forward.cu checks the problem and
// instantiates it.
//
// Work split. A work item is one (query token t, group of 64 heads); H = 128 runs two items per
// token (one CTA of 128 heads would need 64 x 512 fp32 O accumulators per 64 heads twice over:
// more than the register file), H 32 one item whose rows >= H are padding (zero Q rows, never
// stored; H 16 runs the transposed kernel of dsa_forward_small_h.cuh, 1.14x this one padded).
// One persistent CTA per SM walks the items (persistent_items.cuh): without topk_length items b,
// b + gridDim.x, ...; with it (items of different lengths) the items after the first come from a
// counter in the workspace, and without that workspace one CTA per item.
// The token's active slots are walked in blocks of 64 keys; each gathered kv row is the key (D_qk
// columns) and, through its first 512 columns in the same buffer, the value.
//
// Roles (warpgroups, 384 threads): kProducer (warpgroup 0, setmaxnreg down to kProducerRegs)
// gathers Q once per item and the kv rows; kConsumer0/1 (warpgroups 1 and 2, setmaxnreg up to
// kConsumerRegs) compute. Inactive slots are never dereferenced: cp.async with src-size 0
// zero-fills the row, and the slot's bias is -inf.
//
// Shared memory (bytes), every operand tile in 64-column panels of 128-byte rows with the
// 128-byte swizzle (chunk c of row r at c ^ (r % 8)), the layout wgmma descriptors expect:
//   q_nope 64 x 512 (65,536), q_rope 64 x 64 (8,192, D_qk 576 only used), kv_nope 2 buffers x
//   64 x 512 (131,072), kv_rope 2 x 64 x 64 (16,384), P 64 x 64 (8,192), bias 2 x 64 fp32,
//   red_max / red_sum 2 x 64 fp32 each, mbarriers: 229,376 + 1,680, rounded to 231,424 by the
//   1024-byte alignment, + 1,024 slack to align the dynamic base = 232,448: exactly sm_90's 227 KB.
//
// Registers (ptxas 13.0, -v, all four instantiations): 168 per thread at launch (384 threads, 1
// CTA per SM), producer setmaxnreg 40, consumers 232; no stack frame, no spill.
//
// Numerics and edge cases follow the portable kernel (src/sm80/dsa_forward_kernel.cuh): the
// running max is over x (log2 units, scale folded in, so any sign of scale works; lazily updated,
// so P <= 2^8); a block with no active key gives P = 0 (max guarded: 2^(-inf - 0)); empty rows
// give out = 0, lse = +inf.
#pragma once

#include <cstdint>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "sm90/dsa_common.cuh"
#include "sm90/hopper_primitives.cuh"
#include "sm90/persistent_items.cuh"

namespace sa::sm90::dsa_fwd {

// Kernel arguments: typed pointers and element strides, resolved and checked on the host.
struct DsaFwdSm90Params {
  const void* q;       // [S_q, H, D_qk] bf16: (t, h, d) at t * q_ss + h * q_sh + d
  const void* kv;      // [S_kv, D_qk] bf16: row j at j * kv_ss
  void* out;           // [S_q, H, 512] bf16: (t, h, d) at t * o_ss + h * o_sh + d
  float* lse;          // [S_q, H]: (t, h) at t * lse_ss + h * lse_sh
  const int32_t* idx;  // [S_q, topk]: (t, i) at t * idx_ss + i * idx_si
  const int32_t* len;  // [S_q] at t * len_s; may be null
  const float* sink;   // [H] at h * sink_s; may be null
  int64_t q_ss, q_sh, kv_ss, o_ss, o_sh, lse_ss, lse_sh, idx_ss, idx_si, len_s, sink_s;
  int64_t skv;          // S_kv
  int32_t topk;         // slots per row
  int32_t head_groups;  // H / 64 (1 with head padding)
  float scale_log2;     // scale * log2(e)
  int32_t heads;        // H
  int64_t items;        // S_q * head_groups: the work items (token, head group)
  // With topk_length: zeroed before the launch; a CTA's items after its first
  // (blockIdx.x) are gridDim.x + atomicAdd(item_counter, 1). Null: items b, b + gridDim.x, ...
  uint32_t* item_counter;
};

// Named barriers (id 0 is __syncthreads), all over the 256 consumer threads.
enum class NamedBarrier : uint32_t {
  kSumReady = 3,
  // Warpgroup w's P tile of the iteration is published (256 threads).
  kP0 = 6,
  kP1 = 7,
};
__device__ __forceinline__ uint32_t id(NamedBarrier b) { return static_cast<uint32_t>(b); }

// The running maximum of a row (log2 units) moves only when a chunk exceeds it by more than
// kLazyRescaleLog2 = 8 (FlashAttention-4's rule: P then stays <= 2^8 = 256, and the result is
// exact after the final normalisation, which uses the same maximum), and a warp skips the rescale
// of its O accumulators when none of its rows moved (measured +3-4%, bench/notes-archive,
// session 10).
constexpr float kLazyRescaleLog2 = 8.f;

// kPadHeads_: H < 64 (8 and 32; 16 with Tuning::sm90_dsa_fwd_pad_h16): one 64-row item per token
// whose rows >= H are padding (zero Q rows, never stored). Until session 17 these ran an older
// "lockstep" schedule (both warpgroups on every block); on the seesaw they run 25-31% faster
// (bench/notes-archive session 17).
template <int kDqk_, bool kPadHeads_ = false>
struct DsaFwdTraits : DsaCta<kDqk_> {
  static constexpr bool kPadHeads = kPadHeads_;
  using Base = DsaCta<kDqk_>;
  using Element = typename Base::Element;
  using H64 = typename Base::H64;
  using D512 = typename Base::D512;
  using D64 = typename Base::D64;
  using WgLayout = typename Base::WgLayout;
  static constexpr int kStages = 2;  // kv buffers (block parity)
  // The consumers hold P in fp32 and bf16 besides O.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  using AtomPV = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                                cute::SM90::GMMA::Major::MN>;
  // P V with P from shared memory (SS; the warpgroups split N = 512: 256 columns each).
  using TiledMmaPV = decltype(cute::make_tiled_mma(AtomPV{}, WgLayout{}));
  // S of a warpgroup's own 64-key block (one warpgroup, N = 64), and P V with P from registers
  // (RS; the same split of N as TiledMmaPV).
  using TiledMmaQK64 = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                    cute::SM90::GMMA::Major::K>{}));
  using TiledMmaPVrs = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,
                                                     cute::SM90::GMMA::Major::MN>{},
      WgLayout{}));

  using SmemLayoutQNope = typename Base::SmemLayoutRows512;
  using SmemLayoutQRope = typename Base::SmemLayoutRows64;
  using SmemLayoutP = typename Base::SmemLayoutRows64;  // 64 heads x 64 keys
  // One buffer's V: the nope part of its K rows, seen as the (D_v, keys) B operand of P V (a
  // per-buffer base pointer: descriptors indexed by a runtime buffer stay live and spill).
  using SmemLayoutVt1 = typename Base::SmemLayoutCols512;
};

template <class T>
struct alignas(1024) SharedStorage {
  using Element = typename T::Element;
  Element q_nope[T::kNopeElems];
  Element q_rope[T::kPanelElems];
  Element kv_nope[T::kStages * T::kNopeElems];
  Element kv_rope[T::kStages * T::kPanelElems];
  Element p[T::kPanelElems];
  float bias[T::kStages][64];  // 0 for an active slot, -inf otherwise
  float red_max[2][64];        // per consumer warpgroup, per row
  float red_sum[2][64];
  // Per buffer (block parity) and half (0: columns 0-255, 1: 256-575), the producer's
  // cp.async completions (128) / the releasing warpgroup's (kReleaseArrivals / 2; half 1 of
  // buffer 0 also warpgroup 0's 128 sP0 writers, see the kernel); the buffer's bias (128).
  uint64_t half_full[2][2];
  uint64_t half_empty[2][2];
  uint64_t bias_full[2];
  // Warpgroup w's row maxima of the iteration are in red_max[w] (its 128 threads
  // arrive, each after its own store or its last load of red_max[1 - w]).
  uint64_t max_full[2];
  // Persistent CTAs: every consumer thread is done with the item's Q (after its last
  // S; items without iterations have no Q); the producer waits before gathering the next item's.
  uint64_t q_empty;
  // With an item counter: the dynamic items' hand-off (persistent_items.cuh).
  ItemHandoff items;
};

// lse (natural log) and the factor that normalises a row of O, from its maximum m (log2 units,
// scale folded) and its sum l = sum 2^(x - m): a row without an active slot (l = 0) gets lse =
// +inf and factor 0 (out = 0); out = O / l / (1 + e^(sink - lse)), so a sink of -inf adds
// nothing and one of +inf or a huge value gives an infinite denominator, factor 0. Never NaN.
struct RowNorm {
  float lse, factor;
};
__device__ __forceinline__ RowNorm row_norm(float m, float l, float sink) {
  constexpr float kLn2 = 0.693147180559945309f;
  RowNorm n{INFINITY, 0.f};
  if (l > 0.f) {
    n.lse = (m + log2f(l)) * kLn2;
    n.factor = 1.f / (l * (1.f + expf(sink - n.lse)));
  }
  return n;
}

// ---- consumers (warpgroups 1, 2) ----------------------------------------------------------------
// The epilogue: row sums of both warpgroups' shares (l_run: this thread's part of its rows' sums
// of the warpgroup's P), lse, sink, normalisation, stores of this warpgroup's 256 columns of O.
// Both warpgroups hold the same running maximum m_run.
template <class T, class FragO>
__device__ __forceinline__ void consumer_epilogue(const DsaFwdSm90Params& p, SharedStorage<T>& s,
                                                  int64_t tok, int h0, int wg, int lane,
                                                  int frag_row, const float (&m_run)[2],
                                                  const float (&l_run)[2], const FragO& tOrO) {
  using Element = typename T::Element;
  float l_half[2];
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    l_half[r] = quad_sum(l_run[r]);
    if (lane % 4 == 0) s.red_sum[wg][frag_row + 8 * r] = l_half[r];
  }
  named_barrier_sync(id(NamedBarrier::kSumReady), T::kConsumerThreads);
  float factor[2];
  Element* out = static_cast<Element*>(p.out);
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int row = frag_row + 8 * r;
    // Both warpgroups add the halves in the same order: the same l, lse and factor.
    const float l = s.red_sum[0][row] + s.red_sum[1][row];
    const int h = h0 + row;
    const bool real = !T::kPadHeads || h < p.heads;  // a padding row is neither read nor stored
    const float sink = p.sink != nullptr && real && l > 0.f ? p.sink[h * p.sink_s] : -INFINITY;
    const RowNorm n = row_norm(m_run[r], l, sink);
    factor[r] = n.factor;
    if (wg == 0 && lane % 4 == 0 && real) p.lse[tok * p.lse_ss + h * p.lse_sh] = n.lse;
  }
  // 16-byte stores (out's rows are 16-byte aligned: tensor_checks); a padding row is not stored.
  store_fragment_rows_16b<decltype(cute::size(tOrO))::value / 4>(
      lane,
      [&](int i) {
        const float f = factor[(i / 2) % 2];
        return pack_bf16x2(tOrO(i) * f, tOrO(i + 1) * f);
      },
      [&](int r) -> Element* {
        const int h = h0 + frag_row + 8 * r;
        if (T::kPadHeads && h >= p.heads) return nullptr;
        return out + tok * p.o_ss + static_cast<int64_t>(h) * p.o_sh + 256 * wg;
      });
}

}  // namespace sa::sm90::dsa_fwd

#include "sm90/dsa_forward_seesaw.cuh"  // producer_seesaw, consumer_seesaw

namespace sa::sm90::dsa_fwd {

// ---- kernel -------------------------------------------------------------------------------------
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    dsa_forward_sm90_kernel(const __grid_constant__ DsaFwdSm90Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  SharedStorage<T>& s = aligned_shared_storage<SharedStorage<T>>(smem_raw);

  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      for (int h = 0; h < 2; ++h) {
        mbarrier_init(&s.half_full[b][h], T::kProducerThreads);
        // Buffer 0's half 1 holds the rope tile that warpgroup 0 overwrites with sP0: its threads
        // release their stores too.
        mbarrier_init(&s.half_empty[b][h], T::kReleaseArrivals / 2 +
                                               (b == 0 && h == 1 ? T::kConsumerThreads / 2 : 0));
      }
      mbarrier_init(&s.bias_full[b], T::kProducerThreads);
      mbarrier_init(&s.max_full[b], T::kConsumerThreads / 2);
    }
    mbarrier_init(&s.q_empty, T::kConsumerThreads);
    item_handoff_init(s.items, T::kThreads);
    fence_mbarrier_init();
  }
  __syncthreads();

  // Persistent when the host launches fewer CTAs than items (equal items: no topk_length): CTA b
  // takes items b, b + gridDim.x, ... The barriers' parities run on across the items (it0: the
  // CTA's iterations before the item; kq: its items with iterations before it, which alone gather
  // Q and release it, so that the consumers cannot complete two q_empty phases before the
  // producer waited for the first).
  // With an item counter (topk_length: items of different lengths) the items after the first
  // come from it instead (p.item_counter; persistent_items.cuh).
  auto for_each_item = [&](auto is_producer, auto f) {
    uint32_t it0 = 0, kq = 0;
    // Item indices fit in 31 bits (the host checks S_q * H / 64 < 2^31).
    for_each_cta_item<decltype(is_producer)::value>(
        s.items, p.item_counter, static_cast<uint32_t>(p.items), [&](uint32_t i) {
          const int32_t t = static_cast<int32_t>(i / static_cast<uint32_t>(p.head_groups));
          const int n = dsa_active_slots(p.len, p.len_s, p.topk, t);
          f(static_cast<int64_t>(t),
            static_cast<int>(i % static_cast<uint32_t>(p.head_groups)) * T::kHeads, n, it0, kq);
          const uint32_t n_iter = seesaw_iterations<T>(n);
          it0 += n_iter;
          kq += n_iter > 0 ? 1 : 0;
        });
  };
  run_roles<T>(
      [&] {
        for_each_item(cute::true_type{}, [&](int64_t t, int h, int n, uint32_t it0, uint32_t kq) {
          producer_seesaw<T>(p, s, t, h, n, it0, kq);
        });
      },
      [&](int wg) {
        for_each_item(cute::false_type{}, [&](int64_t t, int h, int n, uint32_t it0, uint32_t kq) {
          consumer_seesaw<T>(p, s, t, h, n, wg, it0);
          (void)kq;
        });
      });
#endif
}

}  // namespace sa::sm90::dsa_fwd
