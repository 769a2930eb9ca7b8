// The Hopper (sm_90a) DSA backward kernel (sparse MLA, SPEC 2): a producer warpgroup gathers the
// selected kv rows with cp.async, two consumer warpgroups run every product on wgmma. Device code
// only; dsa_backward.cu checks the problem, instantiates it and hands it to the shared driver as
// its policy's main kernel.
//
// The steps around it are the driver's (cuda/dsa_backward_driver.hpp: accumulator, dkv
// conversion, d_sink), and so is deterministic mode's setup: there each piece is rounded to
// fixed point and reduced with integer additions, which commute exactly (cuda/dsa_fixed_point.cuh;
// the driver's fixed-point mode: the scale, a second pass when it missed, the conversion).
//
// Work split: a work item is one (query token t, group of 64 heads) (as the Hopper forward and
// the portable backward; any H: the rows of the last group past H are padding, zero Q and dO
// with L2 = +inf, so that their P and dS' are 0 and add nothing to dKV), or with token groups
// (H 8, 16, 32; DsaBwdTraits::kTokenGroups) G = 64 / H consecutive tokens on the 64 rows,
// walking the sorted union of their keys with P scaled per row by its token's multiplicity of
// the key (cuda/dsa_token_groups.hpp: the union's builder and format), and the kernel is
// persistent: at most one CTA per SM walks items b,
// b + gridDim.x, ... (with topk_length, items of different lengths: the items after the first
// from a counter, persistent_items.cuh). The K stage, its barriers and the bias / kidx buffers
// run on across items; an item's first chunk is gathered while the previous item's last [5]
// still runs, and its Q and dO as soon as that [5] is done (qdo_empty), during the previous
// item's epilogue. The token's active slots are walked in chunks of 64 keys. Per chunk, with Q
// [64 x D_qk] and dO [64 x 512] resident in shared memory and the chunk's kv rows K [64 x D_qk]
// gathered (V = their first 512 columns, the same buffer):
//
//   [1] S  = Q K^T       [2] dP = dO V^T            64 x 64, warpgroup 0
//   [3] P  = 2^(S scale log2e - L2 + bias),  dS' = scale P (dP - delta)  -> bf16 sP, sDs
//                                                   (warpgroup 0)
//   [4] dQ += dS' K                                 64 x 256 nope columns per warpgroup (fp32
//                                                   registers, the whole item); the rope panel
//                                                   (D_qk 576) on warpgroup 0
//   [5] dKV pieces: dS'^T Q_p + P^T dO_p            64 keys x one 64-column panel p at a time
//                   (rope: dS'^T Q_rope),           -> red.global.add.v4.f32 into the fp32 dkv
//                   in the order nope 0-7, rope:    rows of the chunk's active keys (quad-16
//                   warpgroup 1 all but the last    column order), four rows' 128 bytes per
//                   kWg0Pieces, warpgroup 0 those   warp instruction (one shuffle exchange
//                                                   first) (deterministic: red.global.add.u64
//                                                   into int64 rows in natural order, 64 bytes
//                                                   of a row per quad pair and instruction;
//                                                   binned: the same shape of packed int32
//                                                   pairs into the plane of each row segment's
//                                                   bin, DsaBwdBinPlanTraits)
//
// This is cuDNN's split of the roles (not of the keys): warpgroup 1's reductions run beside
// warpgroup 0's products of the next chunk instead of in a window where both warpgroups reduce
// (bench/notes-archive, sessions 19-20). The K buffer has one stage (Q, dO and K take 213 KB of the
// 227): [1], [2] and [4] are the only products that read it, and each warpgroup releases it right
// after its [4]; the gather of the next chunk then overlaps [5] (the seed's "K-consuming MMAs
// first" order).
//
// Roles (warpgroups, 384 threads):
//   kProducer  warpgroup 0, setmaxnreg down: per item Q and dO (with chunk 0), and each chunk's
//              64 kv rows, with 16-byte cp.async (8 lanes per row); a chunk's indices are read
//              lane-parallel (lane i of warp w: slot 16 w + i) and broadcast with __shfl_sync when
//              the row is copied.
//              Inactive slots are never dereferenced: cp.async with src-size 0 zero-fills the
//              row, its bias is -inf and its kidx -1. bias and kidx are double-buffered (by the
//              global chunk index g % 2): the consumers read kidx in [5] after the K stage is
//              already refilled.
//   kConsumer0/1  warpgroups 1 and 2 (consumer warpgroups 0 and 1 below), setmaxnreg up.
//
// Per chunk (global index g over the CTA's items):
//   consumer 0: [1] in three batches, each after its panel group's kv_full (parity g % 2; an
//     item's first chunk waits for the last group, which holds Q and dO) | P | [2] | dS' |
//     bar kPdsFree (consumer 1's last wgmma of chunk c - 1 is done with sP, sDs) | store sP,
//     sDs, fence.proxy.async, arrive
//     kPdsReady | bar kWg0 | [4] and its first piece as two batches | wait for [4], arrive
//     kv_empty | reduce the piece | its second piece: batch, wait, reduce
//   consumer 1: bar kPdsReady | [4], pieces 0 and 1 on two accumulators as three batches | wait
//     for [4], arrive kv_empty | per piece k: wait for it, reduce it, issue piece k + 2 on its
//     accumulator; after the last piece's wgmma, arrive kPdsFree (and qdo_empty on the item's
//     last chunk)
// Nothing is in flight across a loop iteration (an accumulator in flight over the back edge made
// ptxas serialize the wgmma, C7514/C7515); the pieces are unrolled at compile time for the same
// reason. Per item, both consumers pass kItem after their halves of delta.
//
// Shared memory (bytes), operand tiles in 64-column panels of 128-byte rows with the 128-byte
// swizzle (chunk c of row r at c ^ (r % 8)): q_nope 65,536, q_rope 8,192, dout 65,536, k_nope
// 65,536, k_rope 8,192, P 8,192, dS' 8,192 = 229,376; bias, kidx 2 x 64 each (1,024), the delta
// halves 2 x 64 (512), mbarriers; 1024-aligned: 231,424, + 1,024 to align the dynamic base =
// 232,448 (sm_90's opt-in limit).
//
// Numerics and edge cases follow the portable kernel (src/sm80/dsa_backward_kernel.cuh):
// L2 = logaddexp(lse, sink) log2(e), +inf for rows that take no part (P = 0 exactly); delta =
// rowsum(out * dO) in fp32 from the stored tensors; the d_sink term of (t, h) is
// -exp(sink - L) delta when the token has an active slot and lse is finite, else 0.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/dsa_backward_params.cuh"
#include "cuda/dsa_binned_fixed.cuh"
#include "cuda/dsa_fixed_point.cuh"
#include "cuda/dsa_token_groups.hpp"
#include "sm90/dsa_common.cuh"
#include "sm90/hopper_primitives.cuh"
#include "sm90/persistent_items.cuh"

namespace sa::sm90::dsa_bwd {

using Params = portable::dsa_bwd::DsaBwdParams;

// Params::tune bits, for measuring the seed's techniques one at a time (bench/notes-archive; the
// host sets them from the internal Tuning::sm90_dsa_bwd_bits; 0 is the default kernel):
//   kTuneLateRelease  release the K stage after the chunk's dKV pieces instead of right after
//                     dQ (the order without the "K-consuming MMAs first" technique)
//   kTuneRowIndex     each row's index loaded by its own lanes inside the gather loop instead of
//                     lane-parallel before it (without the "lane-parallel index loads" technique)
// The reductions: the fp32 accumulator holds its columns in quad-16 order, so that a lane's
// four columns of two adjacent 8-column blocks are one 16-byte vector; one shuffle exchange
// between neighbouring rows makes each red.v4 warp instruction cover 128 contiguous bytes in each
// of four dkv rows (4 lines), with half the shuffles and reductions of the natural-order red.v2
// scatter that it replaced (a 2-stage butterfly, 2 rows x 128 bytes per instruction;
// bench/NOTES.md, session 32).
// Removed after measuring (bench/notes-archive; the bits had these meanings in the session 8-19
// logs): the S/dP split between the warpgroups (then bit 8: +0.3%); the dKV pieces
// software-pipelined over two accumulators on both warpgroups (then bit 64: +1.5% at D_qk 512, a
// 392-byte spill at 576, and a racecheck report); the v0 reduction loop, one address register
// rewritten per reduction (then bit 8: same speed); red.v4 from the fragment layout (then bit 32:
// ~0); red.v4 from the row layout, two rows per warp instruction (bit 32 in session 10: -7%); in
// session 18 a 1-stage butterfly (4 rows x 64 bytes, ~0), the transposes through 1 KB of shared
// memory per warp (-3% at 576, +1% at 512), the last piece held over the back edge (-1 to -2% at
// 512, 232 bytes of spill at 576), and [5]'s A operands from registers (RS wgmma after
// ldmatrix.trans, D_qk 512: -1.2%); in session 19 red.v4 from a column-permuted accumulator
// without shuffles (-12 to -15%), pieces 1-3 over two accumulators (-2 to -3%), and the rope
// piece on both warpgroups (-1 to -1.5%). In session 20, with the role split below: the split of
// sessions 8-19 by keys (each warpgroup S, dP and dS' of its 32 keys, half of dQ and half of the
// pieces: 2.8-4.0% slower at D_qk 576, 4.8-8.2% at 512), its staged dQ epilogue (then bit 4),
// session 9's per-fragment reductions (then bit 64: 11% slower), and a butterfly of 1 or 0
// stages (4 rows x 64 B: -3 to -5%; 8 rows x 32 B: -21 to -30%).
//   kTuneGroupsInOrder  token groups: every item walks its union from its first key (without
//                     the bit, item i starts at chunk i % n_chunks, see producer_item)
constexpr int32_t kTuneLateRelease = 1, kTuneRowIndex = 2, kTuneGroupsInOrder = 4;

// Named barriers (id 0 is __syncthreads): kPdsFree, kPdsReady and kItem over the 256 consumer
// threads, kWg0 over warpgroup 0.
enum class NamedBarrier : uint32_t { kPdsFree = 1, kPdsReady = 2, kItem = 3, kWg0 = 4 };
__device__ __forceinline__ uint32_t id(NamedBarrier b) { return static_cast<uint32_t>(b); }

// kWg0Pieces: how many of the chunk's last dKV pieces warpgroup 0 takes besides S, dP, dS' and
// its half of dQ (the rest are warpgroup 1's). D_qk 576: two (against none, +2.1-2.6% at topk
// 2048, and none loses 8% with topk_length: warpgroup 1's longer chain ends every item). D_qk
// 512: none (+0.6-3.1% over two at topk 2048, equal with topk_length). One piece measured
// slower than both at both sizes (bench/notes-archive, session 20).
//
// kTokenGroups_: the token-group mode (cuda/dsa_token_groups.hpp; H in {8, 16, 32}): an item is a
// group of G = 64 / H tokens, its 64 rows (token, head) addressed as one token of 64 heads (the
// driver scales the token strides by G), its keys the group's union, each key's probability
// multiplied by the multiplicity of the row's token (0: the token did not select it).
//
// kChunkTargets: the non-deterministic reductions' targets (kidx, the rows' dkv pointers, the
// row-active mask) read once per chunk instead of once per piece, and the dQ epilogue from two
// row pointers. D_qk 512 only: +1.5-2.0% there (H100, session 37), -1.1 to -1.5% at D_qk 576
// (session 35; docs/decisions/sm90_dsa_backward.md).
//
// kDeterministic_: deterministic mode (the driver's fixed-point mode): each piece is rounded to
// int64 at the call's scale and reduced into dkv_fix instead of dkv_acc. A compile-time choice,
// so that the other kernels' chunk loop holds only their own reductions. Not with token groups.
// The driver's binned plan takes DsaBwdBinPlanTraits below (kBinPlan).
template <int kDqk_, bool kTokenGroups_ = false, bool kDeterministic_ = false>
struct DsaBwdTraits : DsaCta<kDqk_> {
  static_assert(!(kTokenGroups_ && kDeterministic_), "token groups are not deterministic");
  static constexpr bool kTokenGroups = kTokenGroups_;
  static constexpr bool kDeterministic = kDeterministic_;
  static constexpr bool kBinPlan = false;
  static constexpr bool kBinned = false;
  static constexpr int kWg0Pieces = kDqk_ == 576 ? 2 : 0;
  static constexpr bool kChunkTargets = kDqk_ == 512;
  // The K stage lands in three panel groups of 3, 3 and the rest (2 nope + rope at D_qk 576, 2
  // at 512), each on its own kv_full barrier, so that [1] starts on the first group
  // (docs/decisions/sm90_dsa_backward.md, session 41).
  static constexpr int kKvGroupPanels[2] = {3, 3};
  using Base = DsaCta<kDqk_>;
  using Element = typename Base::Element;
  using H64 = typename Base::H64;
  using D512 = typename Base::D512;
  using D64 = typename Base::D64;
  using WgLayout = typename Base::WgLayout;
  // Register split of the CTA's pool, 384 threads x 168 at launch (the split must not exceed it:
  // a consumer's setmaxnreg.inc would wait forever); FA3's for two consumer warpgroups.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  using Major = cute::SM90::GMMA::Major;
  // [1], [2] (warpgroup 0): M = 64 heads, N = the chunk's 64 keys, K = dims; both operands
  // K-major.
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<Major::K, Major::K>{}));
  // [4] nope: M = 64 heads, N = 256 dims per warpgroup, K = 64 keys; A = dS' (K-major), B = the K
  // rows seen as (dims, keys) (MN-major).
  using TiledMmaDq = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<Major::K, Major::MN>{}, WgLayout{}));
  // [4] rope (warpgroup 0): N = 64, K = the chunk's 64 keys.
  using TiledMmaDqRope = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<Major::K, Major::MN>{}));
  // [5]: M = 64 keys, N = 64 dims, K = 64 heads; A = dS'^T or P^T, B = a Q or dO panel seen as
  // (dims, heads); both MN-major views of the K-major tiles.
  using TiledMmaKv = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<Major::MN, Major::MN>{}));
  // The tiles' layouts: DsaCta's SmemLayoutRows512 / Rows64 / Cols512 / Cols64.
};

// The two kernels of the driver's binned plan (deterministic, cuda/dsa_binned_fixed.cuh), both
// launched on every pass; each returns at once unless the call's slot counts pick its form
// (bin_serves(fix_ctl->count, head_groups, fix_bin_min)):
//   kBinned_ true:  the binned form, each piece's row segments rounded on the grid of their bin
//                   and reduced as packed int32 pairs into dkv_bins (where bin_serves);
//   kBinned_ false: the int64 form of DsaBwdTraits<kDqk_, false, true> (where it does not: a key
//                   with too many slots for int32 sums at kBinMinResolution bits), into dkv_fix.
// Separate instantiations, so that the int64 kernel of the int64 plan keeps its code unchanged.
template <int kDqk_, bool kBinned_>
struct DsaBwdBinPlanTraits : DsaBwdTraits<kDqk_, false, true> {
  static constexpr bool kBinPlan = true;
  static constexpr bool kBinned = kBinned_;
};

template <class T>
struct alignas(1024) SharedStorage {
  using Element = typename T::Element;
  Element q_nope[T::kNopeElems];
  Element q_rope[T::kPanelElems];
  Element dout[T::kNopeElems];
  Element k_nope[T::kNopeElems];
  Element k_rope[T::kPanelElems];
  Element p[T::kPanelElems];   // P [head][key], bf16
  Element ds[T::kPanelElems];  // dS' [head][key], bf16
  union {
    float bias[2][64];         // per chunk parity: 0 for an active slot, -inf otherwise
    uint32_t mult[2][64];      // token groups: per chunk parity, the entry's multiplicities
  };                           // (G 4-bit fields; 0 past the union)
  int32_t kidx[2][64];         // per chunk parity: the slot's kv row, -1 when inactive
  float dpart[2][64];          // per consumer warpgroup: its half of each row's delta
  uint64_t kv_full[3];         // producer (128 arrivals each) -> consumers: panel group i of the
                               // chunk's rows landed (kKvGroupPanels; group 0 with Q and dO)
  uint64_t kv_empty;           // consumers (kReleaseArrivals) -> producer: the K stage is free
  uint64_t qdo_empty;          // consumers (kReleaseArrivals) -> producer: Q and dO free (the
                               // item's last [5] is done), the next item's may land
  ItemHandoff items;           // dynamic items (with topk_length; persistent_items.cuh)
};

// Token groups: the rows of group `tok` that exist (64 but in the last group: S_q H - 64 tok).
template <class T>
__device__ __forceinline__ int group_rows(const Params& p, int64_t tok) {
  return static_cast<int>(min(int64_t{T::kHeads}, p.sq * p.H - int64_t{T::kHeads} * tok));
}

// ---- producer (warpgroup 0) ---------------------------------------------------------------------
// The gather pieces are the forward's (dsa_common.cuh). One work item (token tok, heads h0 ..
// h0 + 63): its chunks are the ring's chunks g0, g0 + 1, ... (the K stage and the bias / kidx
// double buffers run on across items). The item's Q and dO are gathered after its chunk 0's rows
// (so that those overlap the previous item's last [5], which still reads the old Q and dO), once
// the consumers release the tiles (qdo_empty, phase qdo_phase), in chunk 0's cp.async group.
template <class T>
__device__ __forceinline__ void producer_item(const Params& p, SharedStorage<T>& s, int64_t tok,
                                              int h0, int n_slots, uint32_t g0,
                                              uint32_t& qdo_phase) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;  // threads 0..127
  const int n_chunks = (n_slots + T::kBlockN - 1) / T::kBlockN;
  const DsaElement* kv = static_cast<const DsaElement*>(p.kv);
  const int32_t* idx_row = p.idx + tok * p.idx_ss;
  int rot = 0;  // token groups: the union chunk the walk starts at (below)
  if constexpr (T::kTokenGroups) {
    if ((p.tune & kTuneGroupsInOrder) == 0 && n_chunks > 0)
      rot = static_cast<int>(static_cast<uint32_t>(tok) % static_cast<uint32_t>(n_chunks));
  }
#pragma unroll 1
  for (int c = 0; c < n_chunks; ++c) {
    const uint32_t g = g0 + static_cast<uint32_t>(c);
    const int buf = g & 1;
    // [P1] Indices of this warp's 16 slots, read before waiting for the stage; the rows, their
    // bias and kv row (double-buffered: the consumers still reduce chunk g - 1's pieces).
    auto mark = [&](int row, bool active, int32_t jr) {
      s.bias[buf][row] = active ? 0.f : -INFINITY;
      s.kidx[buf][row] = active ? jr : -1;
    };
    // The chunk's rows in three panel groups (kKvGroupPanels), each its own cp.async group:
    // group 0 also holds the row metadata (mark), the last one, on the item's first chunk, its
    // Q and dO (issued after every row, so that the rows overlap the previous item's last [5],
    // which still reads the old Q and dO).
    auto gather_groups = [&](auto row_index, auto mark_row) {
      constexpr int kG1 = T::kKvGroupPanels[0], kG2 = kG1 + T::kKvGroupPanels[1];
      constexpr int kPanels = T::kNopePanels + (T::kRope ? 1 : 0);
      const uint32_t nope = smem_u32(s.k_nope), rope = smem_u32(s.k_rope);
      gather_chunk_panels<T::kRope, 0, kG1, true>(nope, rope, kv, p.kv_ss, p.skv, row_index,
                                                  warp, lane, mark_row);
      cp_async_commit();
      auto no_mark = [](int, bool, int32_t) {};
      gather_chunk_panels<T::kRope, kG1, kG2, false>(nope, rope, kv, p.kv_ss, p.skv, row_index,
                                                     warp, lane, no_mark);
      cp_async_commit();
      gather_chunk_panels<T::kRope, kG2, kPanels, false>(nope, rope, kv, p.kv_ss, p.skv,
                                                         row_index, warp, lane, no_mark);
      if (c == 0) {
        // [P0] Q and dO of the item's heads, in the last group (the item's first chunk waits
        // for all of it); with head padding (the last group of an H that is not a multiple of
        // 64) the rows past H are zero-filled, not read (token groups: the rows past S_q H, in
        // the last group).
        mbarrier_wait(&s.qdo_empty, qdo_phase ^ 1);
        qdo_phase ^= 1;
        const DsaElement* q_tok = static_cast<const DsaElement*>(p.q) + tok * p.q_ss;
        const DsaElement* do_tok = static_cast<const DsaElement*>(p.dout) + tok * p.do_ss;
        const int rows = T::kTokenGroups ? group_rows<T>(p, tok) : p.H - h0;
        if (rows >= T::kHeads) {
          gather_head_rows<T::kRope>(smem_u32(s.q_nope), smem_u32(s.q_rope), q_tok, p.q_sh, h0,
                                     warp, lane);
          gather_head_rows<false>(smem_u32(s.dout), 0u, do_tok, p.do_sh, h0, warp, lane);
        } else {
          gather_head_rows<T::kRope, true>(smem_u32(s.q_nope), smem_u32(s.q_rope), q_tok, p.q_sh,
                                           h0, warp, lane, rows);
          gather_head_rows<false, true>(smem_u32(s.dout), 0u, do_tok, p.do_sh, h0, warp, lane,
                                        rows);
        }
      }
      cp_async_commit();
    };
    if constexpr (T::kTokenGroups) {
      // The group's union (every entry active: the builder keeps active keys only), indices and
      // multiplicities read lane-parallel; the multiplicities stored by their lanes. The union
      // is in key order, so the item starts its walk at union chunk (item % n_chunks) and wraps
      // around: the CTAs, which run neighbouring items at the same time, then reduce into
      // different dkv rows instead of all into the lowest keys at once (a prediction against
      // same-line reduction contention; kTuneGroupsInOrder walks from the first chunk). Only
      // the order of the chunks changes: the consumers read each chunk's rows from kidx / mult.
      const int64_t at = (tok - p.tok_begin) * p.group_cap;
      const int cu = c + rot < n_chunks ? c + rot : c + rot - n_chunks;
      const int32_t j = chunk_slot_index(p.group_keys + at, 1, n_slots, cu, warp, lane);
      const int slot = cu * T::kBlockN + 16 * warp + lane % 16;
      const uint32_t m = lane < 16 && slot < n_slots ? p.group_mult[at + slot] : 0u;
      mbarrier_wait(&s.kv_empty, (g & 1) ^ 1);
      if (lane < 16) s.mult[buf][16 * warp + lane] = m;
      gather_groups(ShuffledRowIndex{j}, [&](int row, bool active, int32_t jr) {
        s.kidx[buf][row] = active ? jr : -1;
      });
    } else if ((p.tune & kTuneRowIndex) == 0) {
      const int32_t j = chunk_slot_index(idx_row, p.idx_si, n_slots, c, warp, lane);
      mbarrier_wait(&s.kv_empty, (g & 1) ^ 1);
      gather_groups(ShuffledRowIndex{j}, mark);
    } else {
      mbarrier_wait(&s.kv_empty, (g & 1) ^ 1);
      const auto row_index = [&](int r_in_warp) {
        const int slot = c * T::kBlockN + 16 * warp + r_in_warp;
        return slot < n_slots ? idx_row[slot * p.idx_si] : int32_t{-1};
      };
      gather_groups(row_index, mark);
    }
    // [P2] This thread's copies of each group have landed: visible to wgmma (async proxy),
    // published by the group's arrive (128 arrivals complete a phase). The last group holds Q
    // and dO on an item's first chunk.
    ::sa::cp_async_wait<2>();
    fence_proxy_async_shared();
    mbarrier_arrive(&s.kv_full[0]);
    ::sa::cp_async_wait<1>();
    fence_proxy_async_shared();
    mbarrier_arrive(&s.kv_full[1]);
    cp_async_wait_all();
    fence_proxy_async_shared();
    mbarrier_arrive(&s.kv_full[2]);
  }
}

// The CTA's walk over its work items (persistent_items.cuh: blockIdx.x, blockIdx.x + gridDim.x,
// ..., or from p.item_counter with topk_length; kClaims: the producer's copy): item i is token
// tok_begin + i / head_groups with heads from (i % head_groups) 64; f(tok, h0, n_slots, g0) runs
// for each, g0 being the ring's index of the item's first chunk (the chunks of the earlier items).
template <class T, bool kClaims, class F>
__device__ __forceinline__ void for_each_item(const Params& p, SharedStorage<T>& s, F f) {
  uint32_t g0 = 0;
  // Item indices fit in 31 bits (the host checks S_q * H / 64 < 2^31).
  for_each_cta_item<kClaims>(s.items, p.item_counter, static_cast<uint32_t>(p.items),
                             [&](uint32_t i) {
                               const uint32_t groups = static_cast<uint32_t>(p.head_groups);
                               const int64_t tok = p.tok_begin + i / groups;
                               const int h0 = static_cast<int>(i % groups) * T::kHeads;
                               const int n_slots =
                                   T::kTokenGroups
                                       ? p.group_len[i]
                                       : dsa_active_slots(p.len, p.len_s, p.topk, tok);
                               f(tok, h0, n_slots, g0);
                               g0 += static_cast<uint32_t>((n_slots + T::kBlockN - 1) /
                                                           T::kBlockN);
                             });
}

template <class T>
__device__ __forceinline__ void producer_main(const Params& p, SharedStorage<T>& s) {
  uint32_t qdo_phase = 0;
  for_each_item<T, true>(p, s, [&](int64_t tok, int h0, int n_slots, uint32_t g0) {
    producer_item<T>(p, s, tok, h0, n_slots, g0, qdo_phase);
  });
}

// ---- consumers (warpgroups 1, 2) ----------------------------------------------------------------
// Accumulator fragments of a 64 x N wgmma tile (per thread, register index i):
//   row = 16 * warp_in_warpgroup + lane / 4 + 8 * ((i / 2) % 2)
//   col = 8 * (i / 4) + 2 * (lane % 4) + i % 2          (within the warpgroup's N)

// Deterministic mode's scale of this call (the control words, the heads of a work item); pass 0
// takes s0 without reading max_x, which its CTAs are raising (dsa_fixed_point.cuh).
__device__ __forceinline__ portable::dsa_bwd::FixScale fix_shift(const Params& p) {
  return portable::dsa_bwd::fix_scale(*p.fix_ctl, p.scale, p.fix_rows, p.head_groups,
                                      p.fix_pass == 0);
}

// Deterministic mode's per-thread state (cuda/dsa_fixed_point.cuh): 2^s as two factors, and
// the bits of the largest |x| among the finite values this thread reduced.
struct FixState {
  portable::dsa_bwd::FixFactors mul{0.f, 0.f};
  uint32_t xmax = 0;
};

// The binned plan (DsaBwdBinPlanTraits): whether this call takes the binned form, from the
// slot counts alone (the same in both passes, the zeroing and the conversion).
__device__ __forceinline__ bool bin_form(const Params& p) {
  return portable::dsa_bwd::bin_serves(p.fix_ctl->count, p.head_groups, p.fix_bin_min);
}
// The binned form's B = 2^e of this pass; pass 0 takes it without reading max_x, which its CTAs
// are raising (as fix_shift).
__device__ __forceinline__ portable::dsa_bwd::BinBound bin_pass_bound(const Params& p) {
  return portable::dsa_bwd::bin_bound(*p.fix_ctl, p.scale, p.fix_rows, p.fix_pass == 0);
}

// The binned form's per-thread state (cuda/dsa_binned_fixed.cuh): the call's resolution LW and
// bound exponent eB, and the bits of the largest maximum among the finite segments it reduced
// into kv rows.
struct BinState {
  int lw = 0;
  int eb = 0;
  uint32_t xmax = 0;
};
template <class T>
using FixStateOf = std::conditional_t<T::kBinned, BinState, FixState>;

// One work item, as producer_item (its chunks are the ring's g0, g0 + 1, ...).
template <class T>
__device__ __forceinline__ void consumer_item(const Params& p, SharedStorage<T>& s, int64_t tok,
                                              int h0, int n_slots, uint32_t g0, int wg,
                                              FixStateOf<T>& fix) {
  using namespace cute;
  using Element = typename T::Element;
  const int ctid = threadIdx.x - 128;  // 0..255
  const int wtid = ctid % 128;
  const int lane = threadIdx.x % 32;
  const int warp_in_wg = wtid / 32;
  const int frag_row = 16 * warp_in_wg + lane / 4;  // + 8 r
  const int n_chunks = (n_slots + T::kBlockN - 1) / T::kBlockN;

  typename T::TiledMmaDq mma_dq;
  typename T::TiledMmaDqRope mma_dqr;
  typename T::TiledMmaKv mma_kv;
  auto thr_dq = mma_dq.get_thread_slice(ctid);
  auto thr_dqr = mma_dqr.get_thread_slice(wtid);
  auto thr_kv = mma_kv.get_thread_slice(wtid);

  Tensor sQr = make_tensor(make_smem_ptr(s.q_rope), typename T::SmemLayoutRows64{});
  Tensor sdO = make_tensor(make_smem_ptr(s.dout), typename T::SmemLayoutRows512{});
  Tensor sKn = make_tensor(make_smem_ptr(s.k_nope), typename T::SmemLayoutRows512{});
  Tensor sKr = make_tensor(make_smem_ptr(s.k_rope), typename T::SmemLayoutRows64{});
  Tensor sKnT = make_tensor(make_smem_ptr(s.k_nope), typename T::SmemLayoutCols512{});
  Tensor sKrT = make_tensor(make_smem_ptr(s.k_rope), typename T::SmemLayoutCols64{});
  Tensor sDs = make_tensor(make_smem_ptr(s.ds), typename T::SmemLayoutRows64{});
  Tensor sDsT = make_tensor(make_smem_ptr(s.ds), typename T::SmemLayoutCols64{});
  Tensor sPT = make_tensor(make_smem_ptr(s.p), typename T::SmemLayoutCols64{});

  // [4]
  Tensor tQrDs = thr_dq.partition_fragment_A(sDs);    // (MMA, 1, 4)
  Tensor tQrKt = thr_dq.partition_fragment_B(sKnT);   // (MMA, 1, 4): this warpgroup's 256 dims
  Tensor tQrdQ = partition_fragment_C(mma_dq, Shape<typename T::H64, typename T::D512>{});
  static_assert(decltype(size(tQrdQ))::value == 128, "dQ fragment: 64 x 256 per warpgroup");
  Tensor tRrDs = thr_dqr.partition_fragment_A(sDs);   // (MMA, 1, 4)
  Tensor tRrKt = thr_dqr.partition_fragment_B(sKrT);  // (MMA, 1, 4)
  Tensor tRrdQ = partition_fragment_C(mma_dqr, Shape<typename T::H64, typename T::D64>{});
  // [5]
  Tensor tKrDsT = thr_kv.partition_fragment_A(sDsT);  // (MMA, 1, 4)
  Tensor tKrPT = thr_kv.partition_fragment_A(sPT);    // (MMA, 1, 4)
  Tensor tKrAcc = partition_fragment_C(mma_kv, Shape<typename T::D64, typename T::D64>{});
  static_assert(decltype(size(tKrAcc))::value == 32, "dKV piece: 64 x 64 per warpgroup");

  // L2 (log2 units) and delta = rowsum(O * dO) of this thread's rows frag_row + 8 r. delta is
  // split by columns: warpgroup w sums columns [256 w, 256 w + 256) (lane q of a quad: 64 of
  // them) of O from global against dO from its shared tile (landed with chunk 0); row 0's O is
  // loaded before the wait for chunk 0 (8 x 16 bytes per thread, in flight while Q, dO and the
  // rows land), row 1's is prefetched into L2 then. The halves meet in s.dpart across a barrier
  // both warpgroups pass. (Session 13: with O and dO both from global, in 8 dependent rounds per
  // item, this took ~11% of the consumers' time at topk 512.) An item without chunks needs no
  // delta (its d_sink term is 0).
  // Head padding: rows frag_row + 8 r >= rows are heads past H (zero Q and dO): L2 = +inf makes
  // their P and dS' exactly 0, and nothing of theirs is read or stored. Token groups: row R is
  // (token 64 tok / H + R / H, head R % H), the rows past S_q H are the padding, and a row's
  // multiplicity of an entry is 4-bit field R / H (at mult_shift[r]) of its word.
  const int rows = T::kTokenGroups ? group_rows<T>(p, tok) : min(T::kHeads, p.H - h0);
  const int h_log2 = 31 - __clz(p.H);  // token groups: H is a power of two
  constexpr uint32_t kMultMask = portable::dsa_bwd::kGroupFieldMax;
  int mult_shift[2] = {0, 0};
  if constexpr (T::kTokenGroups) {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r)
      mult_shift[r] = ((frag_row + 8 * r) >> h_log2) * portable::dsa_bwd::kGroupFieldBits;
  }
  float l2[2], delta[2] = {0.f, 0.f};
  const float kInf = INFINITY;
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int h = h0 + frag_row + 8 * r;
    l2[r] = kInf;
    if (frag_row + 8 * r < rows) {
      const float lse = p.lse[tok * p.lse_ss + h * p.lse_sh];
      // The row's head: h, or (frag_row + 8 r) % H with token groups.
      const int head = T::kTokenGroups ? ((frag_row + 8 * r) & (p.H - 1)) : h;
      const float sink = p.sink != nullptr ? p.sink[head * p.sink_s] : -kInf;
      l2[r] = portable::dsa_bwd::row_log2_normalizer(lse, sink);
    }
  }
  if (n_chunks > 0) {
    // This thread's 64 columns (8 chunks of 8) in panel 4 wg + lane % 4 of the dO tile. Entry j
    // of its list is chunk j ^ x, x = the rows' swizzle ((frag_row + 8 r) % 8 = lane / 4): in the
    // swizzled shared row that chunk sits at byte 16 j, so the shared loads take immediate
    // offsets (16 computed addresses were hoisted out of the item loop and spilled).
    const int col0 = 256 * wg + 64 * (lane % 4);
    const int x = lane / 4;
    const Element* o_row0 =
        static_cast<const Element*>(p.out) + tok * p.o_ss + (h0 + frag_row) * p.o_sh + col0;
    const int64_t o_row_step = 8 * p.o_sh;  // row frag_row + 8
    // Row 0's chunks into registers now; row 1's (one 128-byte line) only into L2: its registers
    // are taken in the second pass of the loop below, not unrolled so that its loads cannot
    // overlap row 0's (both rows' loads in flight at once spilled).
    uint4 o_part[8];
    const bool o_real0 = frag_row < rows, o_real1 = frag_row + 8 < rows;
    CUTE_UNROLL
    for (int j = 0; j < 8; ++j)
      o_part[j] = o_real0 ? *reinterpret_cast<const uint4*>(o_row0 + 8 * (j ^ x))
                          : make_uint4(0u, 0u, 0u, 0u);
    if (o_real1) prefetch_l2(o_row0 + o_row_step);
    mbarrier_wait(&s.kv_full[2], g0 & 1);  // chunk 0's rows, Q and dO have landed
    const uint32_t do_panel = smem_u32(s.dout) + (4 * wg + lane % 4) * T::kPanelElems * 2;
#pragma unroll 1
    for (int r = 0; r < 2; ++r) {
      if (r == 1) {
        CUTE_UNROLL
        for (int j = 0; j < 8; ++j)
          o_part[j] = o_real1 ? *reinterpret_cast<const uint4*>(o_row0 + o_row_step + 8 * (j ^ x))
                              : make_uint4(0u, 0u, 0u, 0u);
      }
      const uint32_t do_row = do_panel + (frag_row + 8 * r) * 128;  // swz(row, j ^ x) = 16 j
      float acc = 0.f;
      CUTE_UNROLL
      for (int j = 0; j < 8; ++j) {
        const uint4 b = ld_shared_v4(do_row + 16 * j);
        const uint4 a = o_part[j];
        const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
        CUTE_UNROLL
        for (int e = 0; e < 4; ++e) {
          const float2 af = unpack_bf16x2(aw[e]), bf = unpack_bf16x2(bw[e]);
          acc = fmaf(af.x, bf.x, acc);
          acc = fmaf(af.y, bf.y, acc);
        }
      }
      acc = quad_sum(acc);
      if (lane % 4 == 0)
        st_shared_u32(smem_u32(&s.dpart[wg][frag_row + 8 * r]), __float_as_uint(acc));
    }
    // Both warpgroups pass kItem; only warpgroup 0 reads the halves (its dS' needs delta), before
    // its first kPdsReady of the item. Warpgroup 1 writes its half of the next item's only after
    // this item's chunks, each behind a kPdsReady of warpgroup 0.
    named_barrier_sync(id(NamedBarrier::kItem), T::kConsumerThreads);
    if (wg == 0) {
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r)
        delta[r] = ld_shared_f32(smem_u32(&s.dpart[0][frag_row + 8 * r])) +
                   ld_shared_f32(smem_u32(&s.dpart[1][frag_row + 8 * r]));
    }
  }

  const float scale_log2 = p.scale_log2;
  const float scale = p.scale;
  const bool releaser = lane < T::kReleaseLanes;
  bool saw_active = false;
  clear(tQrdQ);
  clear(tRrdQ);
  // Shared addresses (explicit ld/st.shared: generic pointers into these tiles compiled to
  // generic accesses).
  const uint32_t p_addr = smem_u32(s.p);
  const uint32_t ds_addr = smem_u32(s.ds);
  const int dqk = T::kDqk;

  // [5] one piece: dKV[keys, panel] = dS'^T Q_panel (+ P^T dO_panel for a nope panel), reduced
  // into the dkv rows of the chunk's active keys: fp32, or (deterministic mode) int64 fixed
  // point. issue_piece starts its GEMMs as one batch; reduce_piece reads the finished
  // accumulator (the caller waits in between).
  auto issue_piece = [&](int panel, auto rope_tag, auto& acc) {
    constexpr bool rope = decltype(rope_tag)::value;
    Tensor sQT = make_tensor(make_smem_ptr(rope ? s.q_rope : s.q_nope + panel * T::kPanelElems),
                             typename T::SmemLayoutCols64{});
    Tensor sdOT =
        make_tensor(make_smem_ptr(s.dout + (rope ? 0 : panel) * T::kPanelElems),
                    typename T::SmemLayoutCols64{});
    Tensor tKrQ = thr_kv.partition_fragment_B(sQT);  // (MMA, 1, 4)
    Tensor tKrdO = thr_kv.partition_fragment_B(sdOT);
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    gemm_ss(mma_kv, tKrDsT, tKrQ, acc, true);
    if constexpr (!rope) gemm_ss(mma_kv, tKrPT, tKrdO, acc, false);
    warpgroup_commit_batch();
  };
  // T::kChunkTargets: the reductions' targets in a chunk (non-deterministic mode), read once per
  // chunk rather than per piece: for this lane's rows r = 0, 1 (a pair E, O = rows 16 warp_in_wg
  // + 8 r + (g & 6) + {0, 1}), rows E's and O's dkv rows at column 16 o + 4 q of panel 0
  // (reduce_piece says why); a piece adds its panel's 64 columns. Bit 2 r of active: row E has a
  // kv row (kidx >= 0), bit 2 r + 1: row O. Otherwise (D_qk 576) each piece reads them itself.
  struct RedTargets {
    float* e[2];
    float* o[2];
    uint32_t active;
  };
  struct NoTargets {};
  using Targets = std::conditional_t<T::kChunkTargets, RedTargets, NoTargets>;
  auto red_targets = [&](int buf) {
    Targets t;
    if constexpr (T::kChunkTargets) {
      const int o = (lane >> 2) & 1;
      float* const base = p.dkv_acc + 16 * o + 4 * (lane % 4);
      t.active = 0;
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int row_e = 16 * warp_in_wg + 8 * r + ((lane >> 2) & 6);
        const int32_t je = static_cast<int32_t>(ld_shared_u32(smem_u32(&s.kidx[buf][row_e])));
        const int32_t jo =
            static_cast<int32_t>(ld_shared_u32(smem_u32(&s.kidx[buf][row_e + 1])));
        t.e[r] = offset_rows<T::kDqk * 4>(base, je);  // j = -1: never dereferenced
        t.o[r] = offset_rows<T::kDqk * 4>(base, jo);
        t.active |= (je >= 0 ? 1u : 0u) << (2 * r);
        t.active |= (jo >= 0 ? 2u : 0u) << (2 * r);
      }
    }
    return t;
  };
  auto reduce_piece = [&](int buf, int panel, auto& acc, const Targets& t) {
    warpgroup_fence_operand(acc);
    if constexpr (T::kBinned) {
      // Binned fixed point (cuda/dsa_binned_fixed.cuh) into the planes of packed int32 pairs.
      // Quads 2k and 2k + 1 hold rows E and O (frag_row + 8 r of each); for each 8-column block
      // b, lane q holds columns 8b + 2q, 8b + 2q + 1 of its quad's row: word 4b + q of the row's
      // 32 words in this panel. A row's segment (its 64 values in the piece) lies in one quad,
      // so its maximum takes two quad shuffles; its bin (bin_of) sets the grid its values are
      // rounded on (bin_round), two to a word (bin_pack). One exchange with lane ^ 4 per two
      // blocks (the even quad sends row E's block 2m + 1, the odd one row O's block 2m) lets
      // each pair of quads add 64 contiguous bytes of one row per instruction: row E's words
      // 8m .. 8m + 7 (even quad: its block 2m; odd quad: E's block 2m + 1), then row O's. The
      // quads exchange their rows' planes too. A segment of a slot without a kv row (kidx < 0)
      // or with a non-finite value adds into the spare row S_kv (of the plane its bits give),
      // never read, so that no reduction is predicated; it stays out of max_x, and a non-finite
      // one marks its kv row. Each segment's bin and words are functions of its values only.
      namespace pd = portable::dsa_bwd;
      const bool odd = ((lane >> 2) & 1) != 0;
      const int pair_row = 16 * warp_in_wg + ((lane >> 2) & 6);
      const int word0 = 32 * panel + 4 * (odd ? 1 : 0) + lane % 4;
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int32_t je =
            static_cast<int32_t>(ld_shared_u32(smem_u32(&s.kidx[buf][pair_row + 8 * r])));
        const int32_t jo =
            static_cast<int32_t>(ld_shared_u32(smem_u32(&s.kidx[buf][pair_row + 1 + 8 * r])));
        const int32_t j_own = odd ? jo : je;
        // The largest |x| bits of this quad's row segment, from two maxima of the raw bits: the
        // unsigned one is the largest magnitude among the negative values (sign bit set) if any,
        // the signed one (from 0) the largest among the others; NaN of either sign stays NaN.
        uint32_t neg = 0;
        int32_t pos = 0;
        CUTE_UNROLL
        for (int k = 0; k < 8; ++k) {
          const uint32_t u0 = __float_as_uint(acc(4 * k + 2 * r));
          const uint32_t u1 = __float_as_uint(acc(4 * k + 2 * r + 1));
          neg = max(neg, max(u0, u1));
          pos = max(pos, max(static_cast<int32_t>(u0), static_cast<int32_t>(u1)));
        }
        uint32_t seg = max(neg & 0x7fffffffu, static_cast<uint32_t>(pos));
        seg = max(seg, __shfl_xor_sync(0xffffffffu, seg, 1));
        seg = max(seg, __shfl_xor_sync(0xffffffffu, seg, 2));
        const bool finite = seg < 0x7f800000u;
        const int bin = pd::bin_of(seg, fix.eb);
        fix.xmax = max(fix.xmax, j_own >= 0 && finite ? seg : 0u);
        if (j_own >= 0 && !finite && lane % 4 == 0) atomicOr(p.dkv_bad + j_own, 1u);
        // The plane of this quad's row, or -1 for the spare row; then both rows' targets.
        const int own = finite && j_own >= 0 ? bin : -1;
        const int other = __shfl_xor_sync(0xffffffffu, own, 4);
        const int be = odd ? other : own, bo = odd ? own : other;
        const int32_t spare = static_cast<int32_t>(p.skv);  // (S_kv < 2^31, the host checks)
        uint64_t* const row_e =
            p.dkv_bins + pd::bin_word(max(be, 0), be >= 0 ? je : spare, word0, p.skv, T::kDqk);
        uint64_t* const row_o =
            p.dkv_bins + pd::bin_word(max(bo, 0), bo >= 0 ? jo : spare, word0, p.skv, T::kDqk);
        const pd::BinGrid g = pd::bin_grid(pd::bin_shift(bin, fix.lw, fix.eb));
        CUTE_UNROLL
        for (int m = 0; m < 4; ++m) {  // blocks 2m (w0) and 2m + 1 (w1) of this quad's row
          const uint64_t w0 = pd::bin_pack(pd::bin_round(acc(8 * m + 2 * r), g),
                                           pd::bin_round(acc(8 * m + 2 * r + 1), g));
          const uint64_t w1 = pd::bin_pack(pd::bin_round(acc(8 * m + 4 + 2 * r), g),
                                           pd::bin_round(acc(8 * m + 5 + 2 * r), g));
          const uint64_t recv = __shfl_xor_sync(0xffffffffu, odd ? w0 : w1, 4);
          red_add_u64(row_e + 8 * m, odd ? recv : w0);
          red_add_u64(row_o + 8 * m, odd ? w1 : recv);
        }
      }
    } else if constexpr (T::kDeterministic) {
      // Fixed-point reductions (cuda/dsa_fixed_point.cuh) into the int64 rows, natural column
      // order, each warp instruction four 64-byte pieces of rows (eight int64 of one row per pair
      // of quads: +16% over 32-byte pieces, decisions/sm90_dsa_backward.md, session 48). Quads
      // 2k and 2k + 1 hold rows E and O (frag_row + 8 r of each); for each
      // 8-column block, lane q holds columns 2q, 2q + 1 (v0, v1) of its quad's row. One exchange
      // with lane ^ 4 (E's v1 for O's v0) lets the pair add row E's eight columns (even quad: its
      // v0 at 2q; odd quad: E's v1 at 2q + 1), then row O's (even: O's v0 at 2q; odd: its v1 at
      // 2q + 1). A slot without a kv row (kidx < 0) adds into the spare row S_kv, never read, so
      // that no reduction is predicated; its values are left out of the maximum and the flags.
      const bool odd = ((lane >> 2) & 1) != 0;
      const int pair_row = 16 * warp_in_wg + ((lane >> 2) & 6);
      int64_t* const base = p.dkv_fix + 64 * panel + 2 * (lane % 4) + (odd ? 1 : 0);
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int32_t je =
            static_cast<int32_t>(ld_shared_u32(smem_u32(&s.kidx[buf][pair_row + 8 * r])));
        const int32_t jo =
            static_cast<int32_t>(ld_shared_u32(smem_u32(&s.kidx[buf][pair_row + 1 + 8 * r])));
        int64_t* const row_e = base + static_cast<int64_t>(je >= 0 ? je : p.skv) * dqk;
        int64_t* const row_o = base + static_cast<int64_t>(jo >= 0 ? jo : p.skv) * dqk;
        uint32_t me = 0, mo = 0;  // the largest |x| bits this lane adds to rows E and O
        CUTE_UNROLL
        for (int k = 0; k < 8; ++k) {  // columns 8 k .. 8 k + 7 of the piece
          const float v0 = acc(4 * k + 2 * r), v1 = acc(4 * k + 2 * r + 1);
          const float recv = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
          const float xe = odd ? recv : v0, xo = odd ? v1 : recv;
          me = max(me, __float_as_uint(xe) & 0x7fffffffu);
          mo = max(mo, __float_as_uint(xo) & 0x7fffffffu);
          red_add_s64(row_e + 8 * k, __float2ll_rn(xe * fix.mul.a * fix.mul.b));
          red_add_s64(row_o + 8 * k, __float2ll_rn(xo * fix.mul.a * fix.mul.b));
        }
        // A NaN or infinity marks its row (written as NaN); this lane's other values of that row
        // in the piece stay out of the maximum too (the row's output is NaN whatever they are).
        if (je >= 0) {
          if (me < 0x7f800000u)
            fix.xmax = max(fix.xmax, me);
          else
            atomicOr(p.dkv_bad + je, 1u);
        }
        if (jo >= 0) {
          if (mo < 0x7f800000u)
            fix.xmax = max(fix.xmax, mo);
          else
            atomicOr(p.dkv_bad + jo, 1u);
        }
      }
    } else {
      // The accumulator rows are in quad-16 column order (quad16_pair, dsa_common.cuh: one
      // exchange with lane ^ 4, then each red.v4 warp instruction covers four rows' 128
      // contiguous bytes: groups 2k (even lanes) and 2k + 1 (odd lanes) of rows E or O of the
      // four lane pairs).
      const int g = lane >> 2;
      const int o = g & 1;
      // (D_qk 576 only)
      [[maybe_unused]] float* const piece_base = p.dkv_acc + 64 * panel + 16 * o + 4 * (lane % 4);
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        // k = 0, 1: groups 2k + o of rows E (evn[k]) and O (odd[k]) (dsa_common.cuh).
        float4 evn[2], odd[2];
        quad16_pair(acc, r, lane, evn, odd);
        // Both rows active (every row of a full chunk; with kChunkTargets every row of the
        // chunk): four reductions without a test (ptxas compiles a predicated reduction to a
        // branch region). Otherwise an inactive row (j = -1, its address never used) is skipped.
        if constexpr (T::kChunkTargets) {
          float* const de = t.e[r] + 64 * panel;
          float* const dd = t.o[r] + 64 * panel;
          if (t.active == 0xfu) {
            red_add_f32x4(de, evn[0]);
            red_add_f32x4(de + 32, evn[1]);
            red_add_f32x4(dd, odd[0]);
            red_add_f32x4(dd + 32, odd[1]);
          } else {
            if ((t.active >> (2 * r)) & 1u) {
              red_add_f32x4(de, evn[0]);
              red_add_f32x4(de + 32, evn[1]);
            }
            if ((t.active >> (2 * r)) & 2u) {
              red_add_f32x4(dd, odd[0]);
              red_add_f32x4(dd + 32, odd[1]);
            }
          }
        } else {
          const int row_e = 16 * warp_in_wg + 8 * r + (g & 6);
          const int32_t je = static_cast<int32_t>(ld_shared_u32(smem_u32(&s.kidx[buf][row_e])));
          const int32_t jo =
              static_cast<int32_t>(ld_shared_u32(smem_u32(&s.kidx[buf][row_e + 1])));
          if (min(je, jo) >= 0) {
            float* const de = offset_rows<T::kDqk * 4>(piece_base, je);
            float* const dd = offset_rows<T::kDqk * 4>(piece_base, jo);
            red_add_f32x4(de, evn[0]);
            red_add_f32x4(de + 32, evn[1]);
            red_add_f32x4(dd, odd[0]);
            red_add_f32x4(dd + 32, odd[1]);
          } else {
            if (je >= 0) {
              float* const de = offset_rows<T::kDqk * 4>(piece_base, je);
              red_add_f32x4(de, evn[0]);
              red_add_f32x4(de + 32, evn[1]);
            }
            if (jo >= 0) {
              float* const dd = offset_rows<T::kDqk * 4>(piece_base, jo);
              red_add_f32x4(dd, odd[0]);
              red_add_f32x4(dd + 32, odd[1]);
            }
          }
        }
      }
    }
  };
  // The chunk's pieces in the order nope 0-7 (+ rope): warpgroup 1 takes the first
  // wg1_pieces, warpgroup 0 the rest (compile-time: with a runtime split ptxas serialized the
  // wgmma, C7514).
  constexpr int kPieces = T::kNopePanels + (T::kRope ? 1 : 0);
  constexpr int wg0_pieces = T::kWg0Pieces;
  constexpr int wg1_pieces = kPieces - wg0_pieces;
  static_assert(wg0_pieces >= 0 && wg0_pieces <= 2, "warpgroup 0 takes at most two pieces");
  static_assert(wg1_pieces >= 2, "warpgroup 1 issues pieces 0 and 1 with its dQ");
  const bool late_release = (p.tune & kTuneLateRelease) != 0;
  auto issue_any_piece = [&](int k, auto& acc) {
    if (T::kRope && k == T::kNopePanels)
      issue_piece(T::kNopePanels, cute::true_type{}, acc);
    else
      issue_piece(k, cute::false_type{}, acc);
  };
  if (wg == 0) {
    // ---- warpgroup 0: S, P, dP, dS' over the chunk's 64 keys, then its half of dQ ----
    typename T::TiledMmaSdP mma_sdp;
    auto thr_sdp = mma_sdp.get_thread_slice(wtid);
    Tensor tSrQr = thr_sdp.partition_fragment_A(sQr);
    Tensor tSrdO = thr_sdp.partition_fragment_A(sdO);
    Tensor tSrKn = thr_sdp.partition_fragment_B(sKn);  // all 64 keys
    Tensor tSrKr = thr_sdp.partition_fragment_B(sKr);
#pragma unroll 1
    for (int c = 0; c < n_chunks; ++c) {
      const uint32_t g = g0 + static_cast<uint32_t>(c);
      const int buf = g & 1;
      // [1] S over the chunk's panel groups as they land (kKvGroupPanels): each group's k-blocks
      // (4 per 64-column panel) are one batch, issued once its phase completes.
      constexpr int kB1 = 4 * T::kKvGroupPanels[0];
      constexpr int kB2 = kB1 + 4 * T::kKvGroupPanels[1];
      constexpr int kBn = 4 * T::kNopePanels;
      static_assert(kB2 < kBn, "the last group holds nope panels");
      Tensor tSrS = partition_fragment_C(mma_sdp, Shape<typename T::H64, typename T::H64>{});
      static_assert(decltype(size(tSrS))::value == 32, "S fragment: 64 x 64");
      warpgroup_fence_operand(tSrS);
      // Each batch's operands from fresh pointers: their descriptors are built after the
      // group's wait, not hoisted out of the loop and kept live (they spilled).
      auto batch = [&](auto b0, auto b1, bool zero_init) {
        Tensor tQ = thr_sdp.partition_fragment_A(
            make_tensor(make_smem_ptr(fresh_ptr(s.q_nope)), typename T::SmemLayoutRows512{}));
        Tensor tK = thr_sdp.partition_fragment_B(
            make_tensor(make_smem_ptr(fresh_ptr(s.k_nope)), typename T::SmemLayoutRows512{}));
        warpgroup_arrive();
        gemm_ss_kblocks<decltype(b0)::value, decltype(b1)::value>(mma_sdp, tQ, tK, tSrS,
                                                                  zero_init);
      };
      mbarrier_wait(&s.kv_full[c == 0 ? 2 : 0], g & 1);  // an item's first chunk: Q, dO too
      batch(cute::Int<0>{}, cute::Int<kB1>{}, true);
      warpgroup_commit_batch();
      mbarrier_wait(&s.kv_full[1], g & 1);
      batch(cute::Int<kB1>{}, cute::Int<kB2>{}, false);
      warpgroup_commit_batch();
      mbarrier_wait(&s.kv_full[2], g & 1);
      batch(cute::Int<kB2>{}, cute::Int<kBn>{}, false);
      if constexpr (T::kRope) gemm_ss(mma_sdp, tSrQr, tSrKr, tSrS, false);
      warpgroup_commit_batch();
      if constexpr (!T::kTokenGroups) {  // (token groups: the builder's present words)
        saw_active |=
            __any_sync(0xffffffffu, s.bias[buf][lane] == 0.f || s.bias[buf][32 + lane] == 0.f);
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      // P in bf16 pairs (kept for dS' and stored once the tiles are free). Token groups: P =
      // the multiplicity of the row's token times the slot-wise probability (0 when the token
      // did not select the key).
      const uint32_t bias = smem_u32(s.bias[buf]) + 4 * (2 * (lane % 4));  // + 4 key
      uint32_t p_pk[16];
      CUTE_UNROLL
      for (int i = 0; i < 32; i += 2) {
        const int r = (i / 2) % 2;
        float pv[2];
        CUTE_UNROLL
        for (int e = 0; e < 2; ++e) {
          if constexpr (T::kTokenGroups) {
            const uint32_t w = ld_shared_u32(bias + 4 * (8 * (i / 4) + e));
            const float m = static_cast<float>((w >> mult_shift[r]) & kMultMask);
            pv[e] = m * exp2_prob(fmaf(tSrS(i + e), scale_log2, -l2[r]));
          } else {
            const float off = ld_shared_f32(bias + 4 * (8 * (i / 4) + e)) - l2[r];
            pv[e] = exp2_prob(fmaf(tSrS(i + e), scale_log2, off));
          }
        }
        p_pk[i / 2] = pack_bf16x2(pv[0], pv[1]);
      }
      Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<typename T::H64, typename T::H64>{});
      warpgroup_fence_operand(tSrdP);
      warpgroup_arrive();
      gemm_ss(mma_sdp, tSrdO, tSrKn, tSrdP, true);
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrdP);
      uint32_t ds_pk[16];
      CUTE_UNROLL
      for (int i = 0; i < 32; i += 2) {
        const int r = (i / 2) % 2;
        const float2 pv = unpack_bf16x2(p_pk[i / 2]);
        ds_pk[i / 2] = pack_bf16x2(scale * pv.x * (tSrdP(i) - delta[r]),
                                   scale * pv.y * (tSrdP(i + 1) - delta[r]));
      }
      // Warpgroup 1 is done with the previous chunk's sP, sDs (its arrive after its last
      // piece's wgmma; one extra arrive before the first chunk, consumer_main).
      named_barrier_sync(id(NamedBarrier::kPdsFree), T::kConsumerThreads);
      CUTE_UNROLL
      for (int i = 0; i < 32; i += 2) {
        const uint32_t at = swz(frag_row + 8 * ((i / 2) % 2), i / 4) + 4 * (lane % 4);
        st_shared_u32(p_addr + at, p_pk[i / 2]);
        st_shared_u32(ds_addr + at, ds_pk[i / 2]);
      }
      fence_proxy_async_shared();
      named_barrier_arrive(id(NamedBarrier::kPdsReady), T::kConsumerThreads);
      // Every warp's rows of sDs are written before this warpgroup's [4] reads them all.
      named_barrier_sync(id(NamedBarrier::kWg0), 128);
      // [4] for dims 0-255 and the whole rope panel (all 64 keys), then this warpgroup's
      // pieces (the last wg0_pieces of the order nope 0-7, rope), one accumulator.
      warpgroup_fence_operand(tQrdQ);
      if constexpr (T::kRope) warpgroup_fence_operand(tRrdQ);
      warpgroup_arrive();
      gemm_ss(mma_dq, tQrDs, tQrKt, tQrdQ, false);
      if constexpr (T::kRope) gemm_ss(mma_dqr, tRrDs, tRrKt, tRrdQ, false);
      warpgroup_commit_batch();
      if constexpr (wg0_pieces > 0) {
        issue_any_piece(wg1_pieces, tKrAcc);
        warpgroup_wait<1>();
      } else {
        warpgroup_wait<0>();
      }
      warpgroup_fence_operand(tQrdQ);
      if constexpr (T::kRope) warpgroup_fence_operand(tRrdQ);
      if (releaser && !late_release) mbarrier_arrive(&s.kv_empty);
      if constexpr (wg0_pieces > 0) {  // (no loop: a wgmma in flight over a back edge, C7514)
        const Targets t = red_targets(buf);
        warpgroup_wait<0>();
        reduce_piece(buf, wg1_pieces, tKrAcc, t);
        if constexpr (wg0_pieces > 1) {
          issue_any_piece(wg1_pieces + 1, tKrAcc);
          warpgroup_wait<0>();
          reduce_piece(buf, wg1_pieces + 1, tKrAcc, t);
        }
      }
      if (releaser && late_release) mbarrier_arrive(&s.kv_empty);
      // This warpgroup's last read of the item's Q and dO.
      if (releaser && c == n_chunks - 1) mbarrier_arrive(&s.qdo_empty);
    }
  } else {
    // ---- warpgroup 1: its half of dQ, then its pieces over two accumulators ----
    Tensor acc1 = partition_fragment_C(mma_kv, Shape<typename T::D64, typename T::D64>{});
    auto& acc0 = tKrAcc;
#pragma unroll 1
    for (int c = 0; c < n_chunks; ++c) {
      const uint32_t g = g0 + static_cast<uint32_t>(c);
      const int buf = g & 1;
      const bool last_chunk = c == n_chunks - 1;
      // The last wgmma that reads sP, sDs, Q and dO is done: release them.
      auto release_tiles = [&] {
        named_barrier_arrive(id(NamedBarrier::kPdsFree), T::kConsumerThreads);
        if (releaser && last_chunk) mbarrier_arrive(&s.qdo_empty);
      };
      named_barrier_sync(id(NamedBarrier::kPdsReady), T::kConsumerThreads);
      // Returns at once (warpgroup 0 waited for every group before kPdsReady); it makes the
      // order of the producer's K rows and kidx before this warpgroup's reads explicit
      // (racecheck). The last group's phase completes after every group of the chunk has landed.
      mbarrier_wait(&s.kv_full[2], g & 1);
      warpgroup_fence_operand(tQrdQ);
      warpgroup_arrive();
      gemm_ss(mma_dq, tQrDs, tQrKt, tQrdQ, false);
      warpgroup_commit_batch();
      issue_piece(0, cute::false_type{}, acc0);
      issue_piece(1, cute::false_type{}, acc1);
      const Targets t = red_targets(buf);  // (its loads under the wgmma)
      warpgroup_wait<2>();  // [4]: the K stage is free
      warpgroup_fence_operand(tQrdQ);
      if (releaser && !late_release) mbarrier_arrive(&s.kv_empty);
      // Pieces 0 .. wg1_pieces - 1, k on accumulator k % 2, k and k + 1 in flight. Fully
      // unrolled: two accumulators in flight over a loop's back edge make ptxas serialize
      // every wgmma (C7514).
      auto step = [&](int k, auto& acc) {
        if (k + 1 < wg1_pieces) {
          warpgroup_wait<1>();
        } else {
          warpgroup_wait<0>();  // the last wgmma of this warpgroup that reads the tiles
          release_tiles();
        }
        reduce_piece(buf, k, acc, t);
        if (k + 2 < wg1_pieces) issue_any_piece(k + 2, acc);
      };
      CUTE_UNROLL
      for (int k = 0; k < kPieces; ++k) {
        if (k < wg1_pieces) {
          if (k % 2 == 0)
            step(k, acc0);
          else
            step(k, acc1);
        }
      }
      if (releaser && late_release) mbarrier_arrive(&s.kv_empty);
    }
  }

  // Epilogue: dQ (scale is in dS') -> dq, bf16 pairs stored from the fragments (warpgroup w:
  // nope columns [256 w, 256 w + 256); warpgroup 0 also the rope panel); the d_sink terms.
  // put_pair(r, col, ...): row frag_row + 8 r, columns col, col + 1. T::kChunkTargets: from
  // this thread's two row pointers at its first column dq_col0, a pair's offset compile-time
  // (with one address computed per pair, the item's 64 to 80 stores reloaded spilled operands
  // one by one); otherwise (D_qk 576) one address per pair.
  Element* dq = static_cast<Element*>(p.dq) + tok * p.dq_ss + h0 * p.dq_sh;
  const int dq_col0 = 256 * wg + 2 * (lane % 4);
  Element* dq_row[2];
  bool dq_real[2];
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    dq_row[r] = dq + (frag_row + 8 * r) * p.dq_sh + 256 * wg + 2 * (lane % 4);  // + dq_col0
    dq_real[r] = frag_row + 8 * r < rows;
  }
  auto put_pair = [&](int r, int col, float x, float y) {
    if constexpr (T::kChunkTargets) {
      if (dq_real[r])
        *reinterpret_cast<uint32_t*>(dq_row[r] + (col - dq_col0)) = pack_bf16x2(x, y);
    } else {
      const int row = frag_row + 8 * r;
      if (row < rows) *reinterpret_cast<uint32_t*>(dq + row * p.dq_sh + col) = pack_bf16x2(x, y);
    }
  };
  CUTE_UNROLL
  for (int i = 0; i < size(tQrdQ); i += 2)
    put_pair((i / 2) % 2, 256 * wg + 8 * (i / 4) + 2 * (lane % 4), tQrdQ(i), tQrdQ(i + 1));
  if constexpr (T::kRope) {
    if (wg == 0) {
      CUTE_UNROLL
      for (int i = 0; i < size(tRrdQ); i += 2)
        put_pair((i / 2) % 2, 512 + 8 * (i / 4) + 2 * (lane % 4), tRrdQ(i), tRrdQ(i + 1));
    }
  }
  if (p.sink_terms != nullptr && wg == 0 && lane % 4 == 0) {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      if (frag_row + 8 * r >= rows) continue;
      const int h = h0 + frag_row + 8 * r;
      // The row's token and head, and whether the token has an active slot (token groups: row
      // R = frag_row + 8 r is token 64 tok / H + R / H, head R % H).
      int64_t t = tok;
      int head = h;
      bool saw = saw_active;
      if constexpr (T::kTokenGroups) {
        t = (int64_t{T::kHeads} * tok + h) >> h_log2;
        head = h & (p.H - 1);
        saw = ((p.group_present[tok - p.tok_begin] >> mult_shift[r]) & kMultMask) != 0u;
      }
      float term = 0.f;
      if (saw && p.sink != nullptr) {
        const float lse = p.lse[tok * p.lse_ss + h * p.lse_sh];
        if (lse < kInf)
          term = -portable::dsa_bwd::sink_share(lse, p.sink[head * p.sink_s]) * delta[r];
      }
      p.sink_terms[head * p.sq + t] = term;
    }
  }
}

template <class T>
__device__ __forceinline__ void consumer_main(const Params& p, SharedStorage<T>& s, int wg) {
  // Warpgroup 1 arrives on kPdsFree once per chunk after its last piece's wgmma, warpgroup 0
  // syncs on it before each chunk's P / dS' stores; one arrive before the first chunk and one
  // sync after the last keep the counts equal.
  if (wg == 1) named_barrier_arrive(id(NamedBarrier::kPdsFree), T::kConsumerThreads);
  FixStateOf<T> fix;
  if constexpr (T::kBinned) {
    fix.lw = portable::dsa_bwd::bin_resolution(p.fix_ctl->count, p.head_groups);
    fix.eb = bin_pass_bound(p).e;
  } else if constexpr (T::kDeterministic) {
    fix.mul = portable::dsa_bwd::fix_factors(fix_shift(p).s);
  }
  for_each_item<T, false>(p, s, [&](int64_t tok, int h0, int n_slots, uint32_t g0) {
    consumer_item<T>(p, s, tok, h0, n_slots, g0, wg, fix);
  });
  if (wg == 0) named_barrier_sync(id(NamedBarrier::kPdsFree), T::kConsumerThreads);
  if constexpr (T::kDeterministic) {
    // The first pass's largest |x| (the second pass recomputes the same values; binned: the
    // largest segment maximum, the same number).
    const uint32_t m = __reduce_max_sync(0xffffffffu, fix.xmax);
    if (p.fix_pass == 0 && threadIdx.x % 32 == 0 && m != 0) atomicMax(&p.fix_ctl->max_x, m);
  }
}

// ---- kernel -------------------------------------------------------------------------------------
// Persistent: at most one CTA per SM walks its work items (for_each_item), so that an item's first
// gather and its Q / dO overlap the previous item's last chunk and epilogue.
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    dsa_backward_sm90_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  SharedStorage<T>& s = aligned_shared_storage<SharedStorage<T>>(smem_raw);
  // Deterministic mode's second pass runs only when the first one's scale missed its window.
  // The binned plan's kernels run only for their form, and the binned form's second pass only
  // when the first one's bound missed (bin_bound).
  if constexpr (T::kBinned) {
    if (!bin_form(p) || (p.fix_pass != 0 && !bin_pass_bound(p).retry)) return;
  } else if constexpr (T::kBinPlan) {
    if (bin_form(p) || (p.fix_pass != 0 && !fix_shift(p).retry)) return;
  } else if constexpr (T::kDeterministic) {
    if (p.fix_pass != 0 && !fix_shift(p).retry) return;
  }

  if (threadIdx.x == 0) {
    for (int i = 0; i < 3; ++i) mbarrier_init(&s.kv_full[i], T::kProducerThreads);
    mbarrier_init(&s.kv_empty, T::kReleaseArrivals);
    mbarrier_init(&s.qdo_empty, T::kReleaseArrivals);
    item_handoff_init(s.items, T::kThreads);
    fence_mbarrier_init();
  }
  __syncthreads();

  run_roles<T>([&] { producer_main<T>(p, s); }, [&](int wg) { consumer_main<T>(p, s, wg); });
#endif
}

}  // namespace sa::sm90::dsa_bwd
