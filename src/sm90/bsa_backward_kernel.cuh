// The Hopper (sm_90a) BSA backward main kernel: TMA + wgmma + mbarrier pipeline, warp-specialized.
// Device code only; bsa_backward.cu builds the TMA descriptors, runs the shared steps (preprocess,
// reverse map, dK/dV conversion: src/cuda/bsa_backward_aux.hpp, reverse_map_gpu.hpp),
// instantiates it and launches the dQ conversion beside it (bsa_dq_convert.hpp).
//
// A CTA owns one work item of the key-to-query reverse map, like the portable kernel: KV block n of
// (batch b, KV head hk), kBlockN (= the block size) keys loaded once by TMA, and the entries
// [begin, end) of its reverse row, each a (query head hl of the group, query block m). It walks
// those query blocks as tiles of kBlockM = 64 query rows (a 128-row block is two tiles), keeps dK
// and dV of its keys in fp32 wgmma accumulators for the whole walk, and adds each tile's dQ into
// the fp32 dQ workspace with bulk reductions from shared memory ([7]).
//
// Roles (warpgroups):
//   kProducer  warpgroup 0 (setmaxnreg down); lane 0 of warp 0 issues every load: K and V once,
//              then per tile Q and dO (TMA, box 64 x 64 per 64-column panel) into a kStages
//              ring. lse2 and delta do not travel through it: each consumer warpgroup copies the
//              next tile's 64 + 64 values (one 4-byte cp.async per thread, in the tile's
//              bookkeeping) into its own double buffer and waits for them after [7], before the
//              dQ staging (sync_async_copies), so that [3] reads them from shared memory one tile
//              later, ordered by named barriers only. The reverse-map entries come the same way
//              (4 bytes by the warpgroup's thread 0), one query block ahead.
//              Block 128 with dQ (kReducerWarp): warp 1 is the reducer (reducer_main): it issues
//              every dQ bulk reduction and waits for it, in a named-barrier hand-off with each
//              consumer warpgroup; warps 2 and 3 exit.
//              Tuning variant kTuneStatsWarp: warp 2 is the loader (loader_main): it walks the
//              tiles and brings each live tile's lse2 / delta (bulk copies), query head, first
//              row and mask bits into a ring (StatsRing) on mbarriers; the consumers' walk,
//              cp.async and stats barriers go away. kTuneFullBlocks: no padded-key selects.
//   kConsumer0 warpgroup 1 (and kConsumer1, warpgroup 2, when kBlockN = 128; setmaxnreg up): each
//              owns 64 keys of the block. All GEMMs are computed "transposed" (keys as M) so that
//              P^T and dS^T come out of the accumulators in the A-operand register layout:
//     [1] S^T  = K Q^T         SS  M = 64 keys, N = 64 rows, K = D
//     [2] dP^T = V dO^T        SS
//     [3] P^T  = 2^(S^T scale log2e - lse2[row]) -> bf16, forced to 0 for padded keys (select)
//     [4] dV  += P^T dO        RS  M = 64 keys, N = D, K = 64 rows (dO^T view of the dO tile);
//              issued before [2] is waited for
//         dS^T = P^T (dP^T - delta[row]) with P^T from its bf16 copy; 0 for padded keys (select,
//              so garbage/NaN in padded K/V rows never propagates)
//     [5] dK  += dS^T Q        RS
//     [6] dS^T -> s.ds (the warpgroup's 64 x 64 part), between two named barriers of the
//              consumers that share s.ds
//     [7] dQ   = dS K         SS  M = 64 rows, N = 64 columns (a panel) of D, K = keys.
//              Both block sizes: the fp32 panel goes to shared memory in fragment order
//              (common/dq_tile_layout.hpp: conflict-free 8-byte stores), and one thread adds it
//              to dq_accum with one 16 KB bulk reduction (cp.reduce.async.bulk.add.f32), waited
//              for (.read) only before the next tile rewrites the buffer; no per-element atomics.
//              That thread is the reducer warp's lane 0 at block 128 (the consumers bar.sync
//              before their staging stores and bar.arrive after them), thread 0 of the
//              warpgroup at block 64. Block 128 with D 128: warpgroup w takes
//              panel w over all 128 keys (both dS tiles in shared memory: barrier of all
//              consumers). Block 64: the one warpgroup takes every panel. Block 128 with D 64:
//              each warpgroup adds the partial of its own 64 keys (2x the reduction traffic).
//   Deterministic mode (no dQ accumulator, p.dq_accum null): [6]'s dS stores and [7] are
//   skipped (dQ comes from the portable query-major pass); rows have one owner, so dK and dV
//   are accumulated by one CTA in a fixed order and written by it (TMA stores, no workspace).
//   epilogue: single owner (row_groups == 1, empty rows included): dK * scale and dV -> bf16 ->
//             shared memory over the dead K / V tiles -> TMA stores to the caller's tensors
//             (keys < S_kv; padded keys are zeros); several owners: fp32 red.global.add of keys
//             < valid into dk/dv_accum.
//
// Timeline of one consumer (the two consumers, and with block 64 the two CTAs of an SM,
// interleave on the tensor cores):
//   producer |K V|Q0 dO0|Q1 dO1|Q2 dO2|  Q3 dO3 (block 128: 3 stages; waits for stage 0) ...
//   block 64  |S0 dP0|P|dV0 dS|dK0 st(dS)|dQ0..|st(dQ) red.add|S1 dP1|...        |epilogue|
//   block 128 |S0|dP0 P|dV0 dS|dK0 st(dS)|dQ0 S1|st(dQ) red.add|dP1 P|...        |epilogue|
// Block 128 issues [1] of the next tile behind [7] ("early S", kEarlyS): the tensor cores run it
// while both warpgroups store and reduce dQ, and the next tile's [3] starts with S^T ready.
//
// Pipeline objects (shared memory):
//   kv_full        mbarrier, TMA -> consumers: K and V landed (one phase per CTA)
//   q_full[s]      mbarrier, TMA -> consumers: stage s holds Q and dO of a tile
//   q_empty[s]     mbarrier, one arrive per consumer warp -> producer: stage s free
//   named barrier 1 (all consumers; 1 + wg per warpgroup for block 128 with D 64): s.ds is free
//                  (before [6]) / written (after [6]); the zeroing of padded K rows is done; in
//                  the single-owner epilogue, every consumer's GEMMs are done, so the dK / dV
//                  staging may overwrite s.k / s.v
//   named barrier 3 + wg (the 128 threads of warpgroup wg): the stats / entry cp.async visible
//                  (sync_async_copies; with the reducer warp, its kDqEmpty hand-off instead);
//                  block 64: the dQ staging is written; single-owner epilogue: dK / dV staged
//   ring.full[i] / ring.empty[i] (kTuneStatsWarp): loader -> consumers (1 arrival + 512 bytes) /
//                  consumers -> loader (every consumer thread), StatsRing
//   named barriers kDqEmptyBarrier0 + wg / kDqFullBarrier0 + wg (5 + wg / 7 + wg; 160 threads:
//                  warpgroup wg and the reducer warp; block 128 with dQ): the dQ staging hand-off,
//                  reducer bar.arrive empty -> wg bar.sync empty, stores, wg bar.arrive full ->
//                  reducer bar.sync full, bulk reduction (reducer_main)
//
// Token masks (SPEC 4; key s visible to query i iff mask_lo <= s - i <= mask_hi; T::kMask, the
// masked instantiations only, so the unmasked ones carry no mask code): the reverse map holds no
// (query block, KV block) pair the mask hides entirely (reverse_map_gpu, BsaMeta::pair_outside).
// Each 64-row tile is classified against the block's nominal keys [key0, min(key0 + kBlockN,
// S_kv)) (the same rectangle pair_outside judges, so every entry keeps at least one live tile):
// outside -> skipped like a tile wholly past S_q, by one predicate (tile_live) that the producer,
// the reducer warp and the consumers' walk (next_live) all evaluate, so no stage, barrier phase or
// bulk group is spent on it. A live tile is then classified once more per consumer warpgroup (its
// 64 keys; in the head, warpgroup-uniform): inside -> main's [2] + [3]; partial -> [3] also
// selects P^T = 0 where the band hides the pair (so dS^T = P^T (dP^T - delta) = 0 there too, and
// dV, dK, dQ get nothing from it); outside (block 128 only, e.g. rows 0-63 of a causal diagonal
// block against its keys 64-127) -> the warpgroup issues no [1], [2], [4], [5] for the tile and
// stores dS^T = 0 for the other warpgroup's [7] ("hidden part"). Rows that see no key have
// lse2 = +inf (preprocess): P = exp2(min(-inf, 0)) = 0, no NaN.
//
// Packed (THD) batches (T::kVarlen, bsa_backward_varlen.cu; kVarlen implies kMask): a work item
// is (sequence b, KV head, local KV block). Thread 0 stores the sequence's words (sq, skv, band,
// q0, k0, stats base row; CtaSeqWords) before the CTA's first barrier and every role reads them
// where it uses them (seq_sq / seq_skv / seq_lo / seq_hi / stat_row). Rows, keys and the band stay
// local; TMA coordinates add q0 / k0 with batch coordinate 0; lse2, delta and dq_accum rows of the
// sequence start at its stats base row (cuda/bsa_packed_rows.hpp). At the sequence's end: the
// producer warp zeroes the rows of a crossing Q / dO tile that belong to the next sequence
// (producer_main), K rows >= valid are zeroed and padded keys selected away as for dense padding,
// and the single-owner epilogue stores only the valid rows of a partial 64-key box.
//
// Memory safety: Q/dO rows >= S_q are zero (TMA fill) and have lse2 = +inf, delta = 0 (preprocess)
// so their P, dS are exactly 0 (a tile wholly past S_q is skipped, never loaded); K rows >= valid
// are zeroed in shared memory before any GEMM (they are the B operand of dQ); P and dS of padded
// keys are selected to 0.
//
// Fragment and shared-layout facts this file relies on (checked on the host against CuTe for all
// four instantiations, and by the GPU suite on the H200): the S^T / dV / dK / dQ accumulator
// element i of consumer thread ctid sits at row 64 wg + 16 warp + lane/4 + 8 ((i/2)%2), column
// 8 (i/4) + 2 (lane%4) + i%2; element i of the RS A fragment (P^T, dS^T) is element i of the S^T
// accumulator; SmemLayoutKV / Q / Qt / Ds are the TMA SWIZZLE_128B layout (byte row*128 +
// ((chunk ^ row%8) << 4) within 1024-byte aligned 64-column panels).
#pragma once

#include <cuda.h>  // CUtensorMap (a type only)

#include <cstdint>

#include "common/dq_tile_layout.hpp"
#include "common/device_math.cuh"
#include "common/fast_divisor.hpp"
#include "common/problem.hpp"
#include "common/work_item_slot.cuh"
#include "sm90/bsa_forward_kernel.cuh"  // GmmaAtoms, gemm_issue, convert_p
#include "sm90/hopper_primitives.cuh"
#include "sm90/tile_seq.cuh"
#include "cuda/bsa_packed_rows.hpp"  // packed_stat_row0

namespace sa::sm90 {

// Packed (THD) batches (BwdTraits::kVarlen): q, dout, k, v, dk, dv are [T, H, D] and their
// descriptors (D, T, H, 1); Sq = T_q, Skv = T_kv, Nq = N_q_max; lse2 / delta are [H_q, Sq_pad]
// and dq_accum [H_q, Sq_pad, D] with sequence b's rows from packed_stat_row0
// (cuda/bsa_packed_rows.hpp); dk / dv_accum [H_kv, Skv_pad = T_kv, D] by the global key; the band
// is each sequence's (meta, TileSeq), mask_lo / mask_hi are unused.
struct BsaBwdSm90Params {
  CUtensorMap tma_q;   // q [B, Hq, Sq, D]: dims (D, Sq, Hq, B), box (64, 64, 1, 1), SW128
  CUtensorMap tma_do;  // dout, like q
  CUtensorMap tma_k;   // k [B, Hkv, Skv, D]: box (64, kBlockN, 1, 1), SW128
  CUtensorMap tma_v;   // v, like k
  // dk, dv [B, Hkv, Skv, D] (written by single-owner rows): box (64, 64, 1, 1), SW128; one
  // warpgroup's 64 keys of a panel per TMA store.
  CUtensorMap tma_dk;
  CUtensorMap tma_dv;
  const float* lse2;   // [B, Hq, Sq_pad]: lse * log2(e); +inf past S_q / for empty rows
  const float* delta;  // [B, Hq, Sq_pad]: rowsum(dO * O); 0 past S_q
  float* dq_accum;     // [B, Hq, Sq_pad, D] fp32, zeroed
  // [B * Hkv] zeroed: each consumer warpgroup adds 1 to its KV head's counter once its last dQ
  // reduction has completed (release), for the conversion beside this kernel
  // (bsa_dq_convert.hpp); null without a dQ accumulator.
  uint32_t* dq_ready;
  float* dk_accum;     // [B, Hkv, Skv_pad, D] fp32, zeroed; null when every row has one owner
  float* dv_accum;
  // Reverse map (cuda/reverse_map_gpu.hpp).
  const int32_t* entries;
  const int32_t* row_groups;
  const int32_t* item_row;
  const int32_t* item_begin;
  const int32_t* item_end;
  const int32_t* num_items;
  const int32_t* item_order;  // the tail's launch order (map step 6), or null
  int32_t tail_items;
  BsaDims dims;
  BsaMeta meta;
  int32_t Sq, Skv, Sq_pad, Skv_pad, group, Hq, Hkv, Nq, Nkv;
  FastDivisor nq_div;  // entry / N_q = the entry's query head in the group
  float scale;       // softmax scale (dK factor; dQ is scaled by the conversion pass)
  float scale_log2;  // scale * log2(e)
  // The token mask's band (T::kMask instantiations only): key s visible to query i iff
  // mask_lo <= s - i <= mask_hi (meta.mask, clamped to [-S_q, S_kv] by validation).
  int32_t mask_lo, mask_hi;
  // dk, dv as tensors (packed batches: the single-owner epilogue's rows of a partial 64-key box,
  // BwdTraits::kVarlen; unused otherwise).
  Bhsd dk, dv;
};

namespace bwd {

// Consumer warpgroups of the block size's CTA (64 keys each): each signals its KV head's dq_ready
// counter once per work item.
constexpr int consumer_warpgroups(int block) { return block / 64; }

// dQ at block 128: with D 128 the two warpgroups split dQ's 64-column panels and share dS^T (one
// reduction per dQ element and tile, two barriers of both warpgroups per tile); with D 64 (one
// panel) each warpgroup reduces its own keys' partial. (Per-warpgroup partials at D 128 as well,
// one Q/dO stage fewer to fit their second staging buffer, measured 2.6-3% slower in sessions 9
// and 10: removed.)
// The dQ staging hand-off of a consumer warpgroup wg with the reducer warp (reducer_main): named
// barrier ids (0 is __syncthreads, 1-2 the dS barriers, 3-4 the warpgroups' own) and their count,
// the warpgroup's 128 threads + the reducer's 32.
constexpr uint32_t kDqEmptyBarrier0 = 5;  // + wg: reducer -> wg: its staging may be rewritten
constexpr uint32_t kDqFullBarrier0 = 7;   // + wg: wg -> reducer: its staging is written
constexpr uint32_t kDqHandoffThreads = 128 + 32;

// Variant bits of the main kernel (BwdTraits' kTune; 0: the default kernel). The internal tuning
// (common/tuning.hpp: sm90_bsa_bwd_stats, sm90_bsa_bwd_full) selects them per call, so that one
// binary can A/B them (docs/decisions/sm90_bsa_backward.md, "Session 37").
//   kTuneStatsWarp  warp 2 of the producer warpgroup (loader_main) walks the tiles and brings
//                   each live tile's lse2 / delta into a ring of kStatsSlots slots by two 256-byte
//                   bulk copies on mbarriers, with the tile's query head, first row and mask
//                   class; the consumers only wait on the slot's mbarrier and read shared memory
//                   (no walk, no cp.async, no stats barrier of their own).
//   kTuneFullBlocks every KV block of the call holds kBlockN valid keys (the host's promise: no
//                   kv_block_len and S_kv a multiple of the block): no padded-key selects, no K-row
//                   zeroing, no key checks in the epilogue.
constexpr int kTuneStatsWarp = 1;
constexpr int kTuneFullBlocks = 2;

template <int kBlockN_, int kHeadDim_, bool kMask_ = false, int kTune_ = 0, bool kVarlen_ = false>
struct BwdTraits {
  using Element = cutlass::bfloat16_t;
  static constexpr bool kMask = kMask_;       // the token mask's tile classification and band
  static constexpr bool kStatsWarp = (kTune_ & kTuneStatsWarp) != 0;
  static constexpr bool kFullBlocks = (kTune_ & kTuneFullBlocks) != 0;
  // A packed (THD) batch: the work item's sequence from cu_seqlens (the CTA's SeqWords). Packed
  // items walk the masked path with their sequence's band (no mask: [-sq, skv], which every pair
  // of the sequence passes), and never the full-block path: the valid keys of a block vary per
  // sequence, which the host cannot know.
  static constexpr bool kVarlen = kVarlen_;
  static_assert(!kVarlen || kMask, "packed items walk the masked path");
  static_assert(!kVarlen || !kFullBlocks, "packed blocks are not known to be full");
  // kStatsWarp: the ring's depth (the loader runs up to this many live tiles ahead).
  static constexpr int kStatsSlots = 4;
  static constexpr int kBlockN = kBlockN_;    // keys per CTA = the block size
  static constexpr int kBlockM = 64;          // query rows per tile
  static constexpr int kHeadDim = kHeadDim_;  // D = D_v
  static constexpr int kTilesPerEntry = kBlockN / kBlockM;
  static constexpr int kConsumerWgs = consumer_warpgroups(kBlockN);
  static constexpr int kConsumerThreads = 128 * kConsumerWgs;
  static constexpr int kConsumerWarps = 4 * kConsumerWgs;
  static constexpr int kThreads = 128 + kConsumerThreads;
  // Q / dO ring depth: 3 where shared memory allows (block 128: one CTA per SM,
  // ~182 KB at D 128); 1 for block 64 (two CTAs per SM: with the dQ staging buffer only one
  // stage fits).
  static constexpr int kStages = kBlockN == 128 ? 3 : 1;
  static constexpr int kCtasPerSm = kConsumerWgs == 1 ? 2 : 1;
  // With a dQ accumulator, the bulk reductions are issued and waited for by a reducer warp
  // (warp 1 of the producer warpgroup, reducer_main) instead of the warpgroup's thread 0.
  // Block 128 only; block 64 keeps thread 0.
  static constexpr bool kReducerWarp = kConsumerWgs == 2;
  // Register split (multiples of 8) of the CTA's pool (setmaxnreg_pool): the producer needs few;
  // the consumers hold dK, dV (D/2 fp32 each), S^T, dP^T (32 each) or a dQ chunk (32).
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumerWgs == 2 ? 240 : 232;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <=
                    setmaxnreg_pool(kThreads, kCtasPerSm),
                "register split exceeds the CTA's register pool");
  static constexpr int kPanels = kHeadDim / 64;
  static constexpr int kKvTileBytes = kBlockN * kHeadDim * 2;
  static constexpr int kQTileBytes = kBlockM * kHeadDim * 2;

  using BlockNT = cute::Int<kBlockN>;
  using BlockMT = cute::Int<kBlockM>;
  using HeadT = cute::Int<kHeadDim>;
  using StagesT = cute::Int<kStages>;
  using WgLayout = cute::Layout<cute::Shape<cute::Int<kConsumerWgs>, cute::_1, cute::_1>>;
  // [1], [2]: M = keys, N = query rows, K = D; both operands K-major.
  using TiledMmaSdP = decltype(cute::make_tiled_mma(typename GmmaAtoms<64>::SS{}, WgLayout{}));
  // [4], [5]: M = keys, N = D, K = query rows; A from registers, B (dO^T, Q^T) MN-major.
  using TiledMmaKV =
      decltype(cute::make_tiled_mma(typename GmmaAtoms<kHeadDim>::RS{}, WgLayout{}));
  // [7]: one warpgroup; M = query rows, N = 64 columns of D, K = keys; A (dS) and B (K^T)
  // MN-major. When the warpgroups divide the 64-column panels of D among themselves
  // (kDqSplitPanels: block 128 with D 128, and block 64), a warpgroup computes its panels over all
  // kBlockN keys (one reduction per dQ element and tile, but both warpgroups' dS must be in shared
  // memory: a barrier of all consumers); otherwise (block 128 with D 64: one panel, two
  // warpgroups) each computes all of dQ over its own 64 keys and both add their partials.
  using TiledMmaDq = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::MN,
                                                    cute::SM90::GMMA::Major::MN>{}));

  // Shared tiles: 64-column panels of 128-byte rows, 128B swizzle, where TMA puts them.
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<BlockNT, HeadT>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<BlockMT, HeadT, StagesT>{}));
  // The same Q / dO stages seen as (D, rows): the B operand of [4], [5].
  using SmemLayoutQt = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_MN_SW128_Atom<Element>{}, cute::Shape<HeadT, BlockMT, StagesT>{},
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
  // s.ds: dS^T of all consumers as (keys, rows), rows contiguous, 128-byte rows with the 128B
  // swizzle (a K-major SW128 tile), written by [6] with explicit shared stores.
  // One warpgroup's 64 x 64 part of s.ds seen as (rows, keys): the A operand of [7].
  static constexpr bool kDqSplitPanels = kPanels % kConsumerWgs == 0;
  static constexpr int kDqKeys = kDqSplitPanels ? kBlockN : 64;  // K extent of [7]
  static constexpr int kDqPanels = kDqSplitPanels ? kPanels / kConsumerWgs : kPanels;  // per WG
  static constexpr int kDsThreads = kDqSplitPanels ? kConsumerThreads : 128;  // share s.ds
  using DqKeysT = cute::Int<kDqKeys>;
  // fp32 dQ staging of the bulk reduction: kDqPanels panels of 64 x 64 per warpgroup.
  static constexpr int kDqStageFloats = kConsumerWgs * kDqPanels * kDqPanelFloats;
  // The (rows, keys) part of s.ds that [7] reads: all keys, or the warpgroup's 64 (A of [7]).
  using SmemLayoutDs = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_MN_SW128_Atom<Element>{}, cute::Shape<cute::_64, DqKeysT>{}));
  // One 64-column panel of those K rows seen as (D columns, keys): B of [7].
  using SmemLayoutKtPanel = SmemLayoutDs;
};

// The loader warp's ring (T::kStatsWarp, loader_main): slot i holds a live tile's lse2 (rows 0-63)
// then delta (rows 0-63), and info[i] = {first query row, query head, 1, mask bits} (bits 2w,
// 2w + 1: consumer warpgroup w's MaskClass of its 64 x 64 part of the tile), or {0, 0, 0, 0}
// after the last live tile. full[i]: the loader's lane 0 arrives (expect_tx 512) after its info
// store, the two bulk copies complete it; empty[i]: every consumer thread arrives after its last
// read of the slot (the s13 rule: racecheck follows an mbarrier only through the accessing
// thread's own arrival).
template <class T, bool = T::kStatsWarp>
struct StatsRing {
  uint32_t unused;
};
template <class T>
struct alignas(16) StatsRing<T, true> {
  float v[T::kStatsSlots][2 * T::kBlockM];
  uint4 info[T::kStatsSlots];
  uint64_t full[T::kStatsSlots];
  uint64_t empty[T::kStatsSlots];
};

// The CTA's sequence (T::kVarlen): its words (CtaSeqWords: sq, skv, band, q0, k0, stat_row0),
// written by thread 0 before the CTA's first barrier, and q_pad, the producer's landing barrier
// of a query tile that crosses the sequence's end (producer_main).
template <class T, bool = T::kVarlen>
struct SeqWords {
  uint32_t unused;
};
template <class T>
struct alignas(16) SeqWords<T, true> {
  CtaSeqWords words;
  uint64_t q_pad;
};

template <class T>
struct alignas(1024) SharedStorage {
  using Element = typename T::Element;
  Element k[T::kBlockN * T::kHeadDim];
  Element v[T::kBlockN * T::kHeadDim];
  Element q[T::kStages * T::kBlockM * T::kHeadDim];
  Element dout[T::kStages * T::kBlockM * T::kHeadDim];
  Element ds[T::kBlockN * T::kBlockM];  // 64 x 64 per consumer warpgroup
  float dq[T::kDqStageFloats];  // 16-byte aligned: follows whole 1024-byte-multiple tiles
  // Per consumer warpgroup, double-buffered: lse2 (rows 0-63), then delta (rows 0-63) of a tile.
  float stats[T::kConsumerWgs][2][2 * T::kBlockM];
  // Per consumer warpgroup, double-buffered like stats: the reverse-map entry of the query block
  // after the next tile's (cp.async by the warpgroup's thread 0).
  int32_t entry_ahead[T::kConsumerWgs][2];
  uint64_t kv_full;
  uint64_t q_full[T::kStages];
  uint64_t q_empty[T::kStages];
  // T::kStatsWarp only (last, so that the default kernel's offsets stay as they were).
  StatsRing<T> ring;
  // T::kVarlen only (after the ring, for the same reason).
  SeqWords<T> seq;
};

// The work item of this CTA.
// b is the batch entry (packed: the sequence), key0 the block's first key in its sequence and kg
// on the tensors' token axis (dense: key0; packed: k0 + key0), valid its keys (>= 1: the reverse
// map has no item for a block past its sequence's end).
struct Item {
  int row, begin, num_tiles, b, hk, key0, valid, kg;
};

// The item's sequence: dense, the call's values from the params (the expressions the dense
// kernels always used); packed (T::kVarlen), the CTA's words in shared memory, read at each use.
template <class T>
__device__ __forceinline__ int seq_sq(const BsaBwdSm90Params& p, const SharedStorage<T>& s) {
  if constexpr (T::kVarlen) return cta_seq_word(s.seq.words, kSeqSq);
  else return p.Sq;
}
template <class T>
__device__ __forceinline__ int seq_skv(const BsaBwdSm90Params& p, const SharedStorage<T>& s) {
  if constexpr (T::kVarlen) return cta_seq_word(s.seq.words, kSeqSkv);
  else return p.Skv;
}
template <class T>
__device__ __forceinline__ int seq_lo(const BsaBwdSm90Params& p, const SharedStorage<T>& s) {
  if constexpr (T::kVarlen) return cta_seq_word(s.seq.words, kSeqLo);
  else return p.mask_lo;
}
template <class T>
__device__ __forceinline__ int seq_hi(const BsaBwdSm90Params& p, const SharedStorage<T>& s) {
  if constexpr (T::kVarlen) return cta_seq_word(s.seq.words, kSeqHi);
  else return p.mask_hi;
}
// Row of the stats (lse2, delta) and of the dQ accumulator that holds query row row0 of head h
// of the item's sequence: (b H_q + h) Sq_pad + row0 dense, h Sq_pad + stat_row0 + row0 packed.
template <class T>
__device__ __forceinline__ int64_t stat_row(const BsaBwdSm90Params& p, const SharedStorage<T>& s,
                                            const Item& it, int h, int row0) {
  if constexpr (T::kVarlen)
    return static_cast<int64_t>(h) * p.Sq_pad + cta_seq_word(s.seq.words, kSeqStatRow0) + row0;
  else return (static_cast<int64_t>(it.b) * p.Hq + h) * p.Sq_pad + row0;
}
// The TMA boxes' batch coordinate (packed: the tensors are one batch entry of T tokens).
template <class T>
__device__ __forceinline__ int tma_batch(const Item& it) {
  return T::kVarlen ? 0 : it.b;
}

// Query head and first query row of tile t of the item, from the tile's entry e = hl * Nq + m.
template <class T>
__device__ __forceinline__ void entry_rows(const BsaBwdSm90Params& p, const Item& it, int e, int t,
                                           int& h, int& row0) {
  const int hl = p.nq_div.div(e);
  h = it.hk * p.group + hl;
  row0 = (e - hl * p.Nq) * T::kBlockN + (t % T::kTilesPerEntry) * T::kBlockM;
}
template <class T>
__device__ __forceinline__ void tile_rows(const BsaBwdSm90Params& p, const Item& it, int t,
                                          int& h, int& row0) {
  entry_rows<T>(p, it, p.entries[it.begin + t / T::kTilesPerEntry], t, h, row0);
}

// The token mask's class of the tile at first query row row0 (< S_q) against the item's KV block,
// judged on the block's nominal keys [key0, min(key0 + kBlockN, S_kv)), as the reverse map's
// BsaMeta::pair_outside judges the whole block (padded keys < S_kv are selected away at [3]).
// int32 throughout: rows < Sq_pad, keys < Skv_pad and the band in [-S_q, S_kv].
template <class T>
__device__ __forceinline__ MaskClass tile_mask_class(const BsaBwdSm90Params& p,
                                                     const SharedStorage<T>& s, const Item& it,
                                                     int row0) {
  const int r1 = min(row0 + T::kBlockM, seq_sq<T>(p, s)) - 1;
  const int k1 = min(it.key0 + T::kBlockN, seq_skv<T>(p, s)) - 1;
  return classify_tile<int>(row0, r1, it.key0, k1, seq_lo<T>(p, s), seq_hi<T>(p, s));
}

// Does the tile at first query row row0 add anything? Not when it lies wholly past S_q (only the
// second half of a 128-row block can) or, with a token mask, when the mask hides it from the
// whole KV block. The one test of the producer, the reducer warp and the consumers' walk: a tile
// it rejects takes no Q / dO stage, no dQ hand-off and no GEMM.
template <class T>
__device__ __forceinline__ bool tile_live(const BsaBwdSm90Params& p, const SharedStorage<T>& s,
                                          const Item& it, int row0) {
  if (row0 >= seq_sq<T>(p, s)) return false;
  if constexpr (T::kMask) return tile_mask_class<T>(p, s, it, row0) != MaskClass::kOutside;
  return true;
}

// ---- producer (lane 0 of warp 0; packed batches: warp 0) --------------------------------------
// Packed (T::kVarlen): a query tile that crosses the sequence's end (row0 + 64 > sq) brings the
// next sequence's Q and dO rows (or TMA's zero fill past T_q). They must not reach the GEMMs:
// lse2 = +inf and delta = 0 of those rows make P = dS = 0 only for finite values, and a NaN there
// would enter [4] dV += P^T dO and [5] dK += dS^T Q as 0 x NaN. The whole warp walks the tiles:
// lane 0 lands such a tile on q_pad, the 32 lanes zero its rows [sq - row0, 64) of Q and dO,
// fence, and lane 0 then completes the stage's q_full with a plain arrive (the forward's v_pad).
template <class T>
__device__ __forceinline__ void producer_main(const BsaBwdSm90Params& p, SharedStorage<T>& s,
                                              const Item& it) {
  const int lane = threadIdx.x % 32;
  if constexpr (T::kVarlen) {
    if (it.num_tiles == 0) return;
  } else {
    if (threadIdx.x != 0 || it.num_tiles == 0) return;
  }
  const bool leader = !T::kVarlen || lane == 0;
  constexpr int kKvPanel = T::kBlockN * 64;
  constexpr int kQPanel = T::kBlockM * 64;
  const int tb = tma_batch<T>(it);
  if (leader) {
    prefetch_tensor_map(&p.tma_q);
    prefetch_tensor_map(&p.tma_do);
    // [P0] K and V of the block, once.
    mbarrier_arrive_expect_tx(&s.kv_full, 2 * T::kKvTileBytes);
#pragma unroll
    for (int pnl = 0; pnl < T::kPanels; ++pnl) {
      tma_load_4d(&p.tma_k, s.k + pnl * kKvPanel, &s.kv_full, pnl * 64, it.kg, it.hk, tb);
      tma_load_4d(&p.tma_v, s.v + pnl * kKvPanel, &s.kv_full, pnl * 64, it.kg, it.hk, tb);
    }
  }
  // [P1] Q and dO of each tile, once its stage is free. phase: bit 0 the ring's; packed, bit 1
  // q_pad's (one register: the producer warpgroup has 24).
  int stage = 0;
  uint32_t phase = 0;
#pragma unroll 1
  for (int t = 0; t < it.num_tiles; ++t) {
    int h, row0;
    tile_rows<T>(p, it, t, h, row0);
    if (!tile_live<T>(p, s, it, row0)) continue;  // past S_q or masked out (the consumers skip it too)
    if constexpr (T::kVarlen) {
      // Lane 0 alone waits for the stage: the other lanes touch it only after q_pad's phase, which
      // completes after lane 0's loads, so no lane can take a later phase of q_empty for this one.
      if (leader) mbarrier_wait(&s.q_empty[stage], (phase & 1) ^ 1);
      typename T::Element* q_dst = s.q + stage * T::kBlockM * T::kHeadDim;
      typename T::Element* do_dst = s.dout + stage * T::kBlockM * T::kHeadDim;
      const int rows = cta_seq_word(s.seq.words, kSeqSq) - row0;  // >= 1: the tile is live
      const int qrow = cta_seq_word(s.seq.words, kSeqQ0) + row0;
      const bool crossing = rows < T::kBlockM;
      uint64_t* bar = crossing ? &s.seq.q_pad : &s.q_full[stage];
      if (leader) {
        mbarrier_arrive_expect_tx(bar, 2 * T::kQTileBytes);
#pragma unroll
        for (int pnl = 0; pnl < T::kPanels; ++pnl) {
          tma_load_4d(&p.tma_q, q_dst + pnl * kQPanel, bar, pnl * 64, qrow, h, 0);
          tma_load_4d(&p.tma_do, do_dst + pnl * kQPanel, bar, pnl * 64, qrow, h, 0);
        }
      }
      if (crossing) {
        mbarrier_wait(&s.seq.q_pad, (phase >> 1) & 1);
        phase ^= 2;
        zero_tile_rows<T::kPanels>(smem_u32(q_dst), kQPanel, rows, T::kBlockM - rows, lane);
        zero_tile_rows<T::kPanels>(smem_u32(do_dst), kQPanel, rows, T::kBlockM - rows, lane);
        fence_proxy_async_shared();  // the zeros are read by wgmma (async proxy)
        __syncwarp();
        if (leader) mbarrier_arrive(&s.q_full[stage]);
      }
    } else {
      mbarrier_wait(&s.q_empty[stage], phase ^ 1);
      mbarrier_arrive_expect_tx(&s.q_full[stage], 2 * T::kQTileBytes);
      typename T::Element* q_dst = s.q + stage * T::kBlockM * T::kHeadDim;
      typename T::Element* do_dst = s.dout + stage * T::kBlockM * T::kHeadDim;
#pragma unroll
      for (int pnl = 0; pnl < T::kPanels; ++pnl) {
        tma_load_4d(&p.tma_q, q_dst + pnl * kQPanel, &s.q_full[stage], pnl * 64, row0, h, it.b);
        tma_load_4d(&p.tma_do, do_dst + pnl * kQPanel, &s.q_full[stage], pnl * 64, row0, h, it.b);
      }
    }
    if (++stage == T::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
}

// ---- reducer (warp 1 of the producer warpgroup; T::kReducerWarp, with a dQ accumulator) --------
// Per live tile (tile_live: tiles wholly past S_q or masked out are skipped by the consumers and
// the producer, by the same test), for each consumer warpgroup w, in this order:
//   1. lane 0 waits (cp.async.bulk.wait_group.read) until w's reduction of the previous tile has
//      read the staging (tile 0: none pending, the staging's initial "free"), then the warp
//      bar.arrives on kDqEmptyBarrier0 + w (160: this warp's 32 + w's 128 threads, which bar.sync
//      on it after [7], before their staging stores).
//   2. (after step 1 for every w) the warp bar.syncs on kDqFullBarrier0 + w (160; w's 128 threads
//      bar.arrive on it after their stores and fence.proxy.async), then lane 0 issues w's
//      kDqPanels 16 KB bulk reductions into dq_accum and commits them as one bulk group.
// Each barrier alternates between the same two parties, one side arriving, the other syncing, and
// neither can reach it again before it has completed (an arrive for tile t + 1 follows the other
// barrier's completion for tile t), so no barrier ever has more than its 160 arrivals pending.
// At the time of step 1 no group of this tile is committed, so w's previous group has
// kWgs - 1 - w groups after it. This warp's bulk groups are its own (no TMA load on its
// scoreboard, unlike the producer thread's of session 25). After the walk: lane 0 waits for every
// reduction's writes, then releases the KV head's dq_ready counter once for all kWgs consumer
// warpgroups (the conversion beside this kernel counts consumer_warpgroups(block) per item).
template <class T>
__device__ __forceinline__ void reducer_main(const BsaBwdSm90Params& p, SharedStorage<T>& s,
                                             const Item& it) {
  constexpr int kWgs = T::kConsumerWgs;
  static_assert(kWgs <= 2, "bulk_wait_read below counts at most one later group");
  const bool leader = threadIdx.x % 32 == 0;
#pragma unroll 1
  for (int t = 0; t < it.num_tiles; ++t) {
    int h, row0;
    tile_rows<T>(p, it, t, h, row0);
    if (!tile_live<T>(p, s, it, row0)) continue;  // past S_q or masked out (the consumers skip it too)
    float* tile = p.dq_accum + stat_row<T>(p, s, it, h, row0) * T::kHeadDim;
#pragma unroll
    for (int w = 0; w < kWgs; ++w) {
      if (leader) {
        if (w == kWgs - 1) bulk_wait_read<0>();
        else bulk_wait_read<1>();
      }
      __syncwarp();
      named_barrier_arrive(kDqEmptyBarrier0 + w, kDqHandoffThreads);
    }
#pragma unroll
    for (int w = 0; w < kWgs; ++w) {
      named_barrier_sync(kDqFullBarrier0 + w, kDqHandoffThreads);
      if (leader) {
#pragma unroll
        for (int j = 0; j < T::kDqPanels; ++j) {
          const int c = T::kDqSplitPanels ? w * T::kDqPanels + j : j;  // panel of D
          bulk_reduce_add_f32(tile + c * kDqPanelFloats,
                              s.dq + (w * T::kDqPanels + j) * kDqPanelFloats,
                              kDqPanelFloats * 4);
        }
        bulk_commit_group();
      }
    }
  }
  if (leader) {
    bulk_wait_all();
    if (p.dq_ready != nullptr) {
      fence_proxy_async_global();
      red_release_gpu_add_u32(p.dq_ready + it.b * p.Hkv + it.hk, static_cast<uint32_t>(kWgs));
    }
  }
}

// ---- loader (lane 0 of warp 2 of the producer warpgroup; T::kStatsWarp) -------------------------
// Walks the item's tiles like the producer and the reducer (tile_live: the same live tiles, in
// the same order) and, per live tile, in ring slot i (StatsRing; kStatsSlots deep):
//   1. waits until every consumer thread has released the slot's previous use (empty[i]; a fresh
//      barrier passes at once);
//   2. stores the tile's info {row0, h, 1, mask bits} (st.shared), then arrives on full[i] with
//      512 transaction bytes expected (release: the info is visible to whoever sees the phase);
//   3. copies the tile's 64 lse2 and 64 delta (256 bytes each, 16-byte aligned: row0 and Sq_pad
//      are multiples of 64, a packed sequence's stat_row0 of 4) into the slot by two bulk copies
//      that complete full[i].
// After the last live tile: one more slot with info {0, 0, 0, 0} (no bytes): the consumers' walk
// ends there. Every phase armed here is waited for by the consumers before they exit.
template <class T>
__device__ __forceinline__ void loader_main(const BsaBwdSm90Params& p, SharedStorage<T>& s,
                                            const Item& it) {
  if (threadIdx.x % 32 != 0 || it.num_tiles == 0) return;
  constexpr uint32_t kRowBytes = T::kBlockM * 4;
  int slot = 0;
  uint32_t phase = 0;
  [[maybe_unused]] const int64_t bh0 = static_cast<int64_t>(it.b) * p.Hq;  // dense
#pragma unroll 1
  for (int t = 0; t < it.num_tiles; ++t) {
    int h, row0;
    tile_rows<T>(p, it, t, h, row0);
    if (!tile_live<T>(p, s, it, row0)) continue;  // past S_q or masked out (the consumers skip it too)
    uint32_t band = 0;
    if constexpr (T::kMask) {
      // Consumer warpgroup w's MaskClass of its part in bits 2w, 2w + 1 (the consumers' wg_class:
      // keys wholly past S_kv count as outside).
      const int r1 = min(row0 + T::kBlockM, seq_sq<T>(p, s)) - 1;
#pragma unroll
      for (int w = 0; w < T::kConsumerWgs; ++w) {
        const int k0 = it.key0 + w * 64;
        const int k1 = min(k0 + 64, seq_skv<T>(p, s)) - 1;
        const MaskClass c =
            !T::kFullBlocks && k0 > k1
                ? MaskClass::kOutside
                : classify_tile<int>(row0, r1, k0, k1, seq_lo<T>(p, s), seq_hi<T>(p, s));
        band |= static_cast<uint32_t>(c) << (2 * w);
      }
    }
    mbarrier_wait(&s.ring.empty[slot], phase ^ 1);
    st_shared_v4(smem_u32(&s.ring.info[slot]),
                 make_uint4(static_cast<uint32_t>(row0), static_cast<uint32_t>(h), 1u, band));
    mbarrier_arrive_expect_tx(&s.ring.full[slot], 2 * kRowBytes);
    const int64_t off =
        T::kVarlen ? stat_row<T>(p, s, it, h, row0) : (bh0 + h) * p.Sq_pad + row0;
    bulk_copy_g2s(&s.ring.v[slot][0], p.lse2 + off, kRowBytes, &s.ring.full[slot]);
    bulk_copy_g2s(&s.ring.v[slot][T::kBlockM], p.delta + off, kRowBytes, &s.ring.full[slot]);
    if (++slot == T::kStatsSlots) {
      slot = 0;
      phase ^= 1;
    }
  }
  mbarrier_wait(&s.ring.empty[slot], phase ^ 1);
  st_shared_v4(smem_u32(&s.ring.info[slot]), make_uint4(0u, 0u, 0u, 0u));
  mbarrier_arrive(&s.ring.full[slot]);
}

// The consumers' stats buffers: their own double buffer, or (T::kStatsWarp) the loader's ring.
template <class T>
__device__ __forceinline__ StatsRing<T, true>& ring_of(SharedStorage<T>& s) {
  return s.ring;
}
template <class T>
__device__ __forceinline__ uint32_t stats_base(SharedStorage<T>& s, int wg) {
  if constexpr (T::kStatsWarp) return smem_u32(&s.ring.v[0][0]);
  else return smem_u32(&s.stats[wg][0][0]);
}

// ---- consumers ----------------------------------------------------------------------------------
template <class T>
__device__ __forceinline__ void consumer_main(const BsaBwdSm90Params& p, SharedStorage<T>& s,
                                              const Item& it, int wg) {
  using namespace cute;
  using Element = typename T::Element;
  constexpr int kBlockN = T::kBlockN;
  constexpr int kHeadDim = T::kHeadDim;
  const int ctid = threadIdx.x - 128;
  const int wtid = ctid % 128;
  const int lane = threadIdx.x % 32;
  const int warp_in_wg = wtid / 32;
  // Named barrier of the consumers that share dS (all of them, or the warpgroup).
  const uint32_t ds_barrier = T::kDqSplitPanels ? 1u : 1u + static_cast<uint32_t>(wg);
  const int dq_key0 = T::kDqSplitPanels ? 0 : wg * 64;  // first key of [7]

  typename T::TiledMmaSdP mma_sdp;
  typename T::TiledMmaKV mma_kv;
  typename T::TiledMmaDq mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(ctid);
  auto thr_kv = mma_kv.get_thread_slice(ctid);
  auto thr_dq = mma_dq.get_thread_slice(wtid);

  Tensor sK = make_tensor(make_smem_ptr(s.k), typename T::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(s.v), typename T::SmemLayoutKV{});
  Tensor sQ = make_tensor(make_smem_ptr(s.q), typename T::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(s.dout), typename T::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(s.q), typename T::SmemLayoutQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(s.dout), typename T::SmemLayoutQt{});
  Tensor sDs = make_tensor(make_smem_ptr(s.ds + dq_key0 * 64), typename T::SmemLayoutDs{});

  Tensor tSrK = thr_sdp.partition_fragment_A(sK);     // descriptors (MMA, 1, D/16)
  Tensor tSrV = thr_sdp.partition_fragment_A(sV);
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);     // (MMA, 1, D/16, stages)
  Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);
  Tensor tKVrQt = thr_kv.partition_fragment_B(sQt);   // (MMA, 1, 64/16, stages)
  Tensor tKVrdOt = thr_kv.partition_fragment_B(sdOt);
  Tensor tQrDs = thr_dq.partition_fragment_A(sDs);    // (MMA, 1, kDqKeys/16)

  Tensor tSrS = partition_fragment_C(mma_sdp, Shape<typename T::BlockNT, typename T::BlockMT>{});
  Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<typename T::BlockNT, typename T::BlockMT>{});
  Tensor tKVrP =
      make_tensor<Element>(partition_shape_A(mma_kv, Shape<typename T::BlockNT, typename T::BlockMT>{}));
  Tensor tKVrdS =
      make_tensor<Element>(partition_shape_A(mma_kv, Shape<typename T::BlockNT, typename T::BlockMT>{}));
  Tensor tdVrdV = partition_fragment_C(mma_kv, Shape<typename T::BlockNT, typename T::HeadT>{});
  Tensor tdKrdK = partition_fragment_C(mma_kv, Shape<typename T::BlockNT, typename T::HeadT>{});
  Tensor tQrdQ = partition_fragment_C(mma_dq, Shape<_64, _64>{});
  static_assert(decltype(size(tKVrP))::value == decltype(size(tSrS))::value);
  clear(tdVrdV);
  clear(tdKrdK);

  // Accumulator fragment of a 64 x N tile: row 16 warp + lane/4 + 8 ((i/2)%2), column
  // 8 (i/4) + 2 (lane%4) + i%2 (see bsa_forward_kernel.cuh).
  const int frag_row = 16 * warp_in_wg + lane / 4;
  const int frag_col = 2 * (lane % 4);

  if (wtid == 32) {
    prefetch_tensor_map(&p.tma_dk);
    prefetch_tensor_map(&p.tma_dv);
  }
  if (it.num_tiles > 0) {
    mbarrier_wait(&s.kv_full, 0);
    if (!T::kFullBlocks && it.valid < kBlockN) {
      // Zero this warpgroup's K rows >= valid (whole 128-byte rows of every panel); [7] of the
      // warpgroups that share dS reads them after the barrier.
#pragma unroll
      for (int pnl = 0; pnl < T::kPanels; ++pnl) {
        for (int c = wtid; c < 64 * 8; c += 128) {
          const int r = wg * 64 + c / 8;
          if (r >= it.valid)
            reinterpret_cast<uint4*>(s.k + pnl * kBlockN * 64 + r * 64)[c % 8] =
                make_uint4(0u, 0u, 0u, 0u);
        }
      }
      fence_proxy_async_shared();
      named_barrier_sync(ds_barrier, T::kDsThreads);
    }
  }
  // Keys (rows of S^T) of this thread: frag key k_r = wg*64 + frag_row + 8 r is padded when
  // k_r >= valid.
  const int key_lim = it.valid - (wg * 64 + frag_row);
  // The token mask (T::kMask): this warpgroup's nominal keys [band_k0, band_k1] (none when the
  // block ends before them: every P^T is then 0 by key_lim alone).
  [[maybe_unused]] const int band_k0 = it.key0 + wg * 64;
  [[maybe_unused]] const int band_k1 = min(band_k0 + 64, seq_skv<T>(p, s)) - 1;
  [[maybe_unused]] const bool band_keys_ok = T::kFullBlocks || band_k0 <= band_k1;
  // The token mask's class of a live tile (first query row rr) for this warpgroup's 64 keys
  // (T::kMask; warpgroup-uniform). Keys wholly past S_kv (band_keys_ok false: the last block's
  // second half) are padded, so every P^T of the part is 0: hidden as well. T::kStatsWarp: the
  // loader judged it the same way (StatsRing::info's mask bits, class_of_bits).
  [[maybe_unused]] const auto wg_class = [&](int rr) {
    if (!band_keys_ok) return MaskClass::kOutside;
    return classify_tile<int>(rr, min(rr + T::kBlockM, seq_sq<T>(p, s)) - 1, band_k0, band_k1,
                              seq_lo<T>(p, s), seq_hi<T>(p, s));
  };
  [[maybe_unused]] const auto class_of_bits = [&](uint32_t bits) {
    return static_cast<MaskClass>((bits >> (2 * wg)) & 3u);
  };
  const float scale_log2 = p.scale_log2;
  // Deterministic mode leaves dQ to the query-major pass (no accumulator): [6] and [7] skipped.
  const bool with_dq = p.dq_accum != nullptr;

  // The tile walk keeps the entries of the current and the next query block in registers,
  // e_cur = entry(t / kTilesPerEntry) and e_nxt = entry(t / kTilesPerEntry + 1) (0 past the row).
  // The one after them comes a tile ahead through shared memory (s.entry_ahead, with the stats'
  // cp.async group and barriers): no tile waits on a global load of the reverse map. (A register
  // load does not do it: the warp-uniform result goes to a uniform register right after the
  // load, which waits for it.)
  constexpr int kTpe = T::kTilesPerEntry;
  static_assert(kTpe == 1 || kTpe == 2, "next_live skips only a 128-row block's second half");
  const int n_entries = it.num_tiles / kTpe;
  const auto load_entry = [&](int i) { return i < n_entries ? p.entries[it.begin + i] : 0; };
  // The first live tile after tc (tile_live) and its entry; num_tiles when none. Without a mask
  // only the second half of a 128-row block can be dead (past S_q, when the block is the last
  // one). With a mask either half can be, but never both halves of an entry (the reverse map
  // judges the same rectangle, and two halves' rectangles cover the block's), so the walk stays
  // within e_cur and e_nxt; other entries (a map outside that contract) are read from global
  // memory, so that the walk still agrees with the producer's and the reducer's.
  // With a mask it also returns the tile's query head and first row (hh, rr; untouched without:
  // the caller computes them).
  const auto next_live = [&](int tc, int e_cur, int e_nxt, int& e, int& hh, int& rr) {
    if constexpr (!T::kMask) {
      int tn = tc + 1;
      e = tn % kTpe == 0 ? e_nxt : e_cur;
      if (kTpe == 2 && tn % 2 == 1) {
        int hx, rx;
        entry_rows<T>(p, it, e, tn, hx, rx);
        if (rx >= p.Sq) {
          ++tn;
          e = e_nxt;
        }
      }
      return min(tn, it.num_tiles);
    } else {
      // tc = -1: the walk's start (e_cur = entry 0, e_nxt = entry 1).
      const int cur = tc < 0 ? 0 : tc / kTpe;
      int tn = tc + 1;
#pragma unroll 1
      for (; tn < it.num_tiles; ++tn) {
        const int blk = tn / kTpe;
        e = blk == cur ? e_cur : (blk == cur + 1 ? e_nxt : load_entry(blk));
        entry_rows<T>(p, it, e, tn, hh, rr);
        if (tile_live<T>(p, s, it, rr)) break;
      }
      return tn;
    }
  };
  // This thread's value of the stats of the tile at (query head hh, first row rr): lse2
  // (wtid < 64) or delta of row wtid % 64.
  const float* stat_src = wtid < 64 ? p.lse2 : p.delta;
  const auto stat_ptr = [&](int hh, int rr) {
    return stat_src + (stat_row<T>(p, s, it, hh, rr) + wtid % 64);
  };
  // Shared addresses (explicit ld/st.shared: a generic pointer into s.stats compiles to generic
  // loads). stats_addr + 512 buf: this tile's buffer; + 4 r: lse2 of row r; + 256 + 4 r: delta.
  // T::kStatsWarp: the loader's ring instead (slot buf, the same layout: lse2 then delta).
  const uint32_t stats_addr = stats_base<T>(s, wg);
  constexpr uint32_t kStatsBufBytes = 2 * T::kBlockM * 4;
  int buf = 0;  // buffer of this tile's values
  int t = 0, h = 0, row0 = 0;  // without a mask, tile 0 is never wholly past S_q
  // T::kStatsWarp: the walk is the loader's; t counts the live tiles walked (t + 1 < num_tiles
  // while another one follows), stats_phase is the ring slot's phase and band_bits the tile's
  // mask bits (StatsRing::info).
  [[maybe_unused]] uint32_t stats_phase = 0;
  [[maybe_unused]] uint32_t band_bits = 0;
  int e_cur = T::kStatsWarp ? 0 : load_entry(0), e_nxt = T::kStatsWarp ? 0 : load_entry(1);
  if constexpr (T::kStatsWarp) {
    if (it.num_tiles > 0) {
      mbarrier_wait(&ring_of(s).full[0], 0);
      const uint4 inf = ld_shared_v4(smem_u32(&ring_of(s).info[0]));
      if (inf.z == 0) t = it.num_tiles;  // no live tile (only outside the map's contract)
      row0 = static_cast<int>(inf.x);
      h = static_cast<int>(inf.y);
      band_bits = inf.w;
    }
  } else if constexpr (T::kMask) {
    // The first live tile (the token mask may hide the first half of block 0's rows). It lies in
    // entry 0 or 1 (see next_live); entry 1 then becomes the current one.
    int e0 = e_cur, h0 = 0, r0 = 0;
    t = next_live(-1, e_cur, e_nxt, e0, h0, r0);
    if (t / kTpe != 0) {
      e_cur = e0;
      e_nxt = load_entry(t / kTpe + 1);
    }
  }
  if (!T::kStatsWarp && t < it.num_tiles) {
    entry_rows<T>(p, it, e_cur, t, h, row0);
    st_shared_u32(stats_addr + 4 * wtid, __float_as_uint(*stat_ptr(h, row0)));
    named_barrier_sync(3 + wg, 128);
  }
  // Block 128 skips the GEMMs of a warpgroup whose part of a live tile the mask hides (the tile
  // stays live for the other warpgroup). Block 64 has no such part: tile_live skipped the tile.
  constexpr bool kSkipHidden = T::kMask && T::kConsumerWgs == 2;
  MaskClass cls = MaskClass::kInside;  // this warpgroup's class of tile t (T::kMask)
  if constexpr (T::kMask) {
    if (t < it.num_tiles) cls = T::kStatsWarp ? class_of_bits(band_bits) : wg_class(row0);
  }

  int stage = 0;
  uint32_t phase = 0;
  // Early S (kEarlyS): [1] of tile t + 1 is issued right after the last [7] of tile t, so the
  // tensor pipe runs it while the warpgroups store and reduce dQ; it is waited for (wait<0>) at
  // the end of the iteration, so no wgmma is in flight across the loop's back edge. At the top
  // of an iteration S^T of the tile is complete in tSrS. Needs a second Q / dO stage: with one
  // (block 64) tile t + 1's Q loads only after [4] and [5] of tile t.
  constexpr bool kEarlyS = T::kStages > 1;
  // The warpgroup's asynchronous copies: the next tile's stats and entry (cp.async, issued by
  // this tile's bookkeeping, run_head) have landed and are visible to the warpgroup, and
  // (thread 0) the previous tile's bulk dQ reduction is complete, so its staging buffer may be
  // rewritten. In SASS both waits are the same counter (DEPBAR.LE SB0, 0: full completion, even
  // for `wait_group.read`), so the wait is placed as late as possible: right before the staging
  // stores (after [7]), not before the dS barriers, where it exposed the bulk engine's ~16 B/clk
  // per SM (session 18) behind both warpgroups every tile. (What still waits at the barrier
  // here is warp skew, not the bulk engine: session 25, call 8.)
  const auto sync_async_copies = [&]() {
    if (wtid == 0) bulk_wait_read_all();
    if constexpr (!T::kStatsWarp) cp_async_wait<0>();
    named_barrier_sync(3 + wg, 128);
  };
  // The same with the reducer warp (T::kReducerWarp, with dQ): the warpgroup's 128 threads
  // bar.sync kDqEmptyBarrier0 + wg (160) with the reducer warp, whose bar.arrive on it comes once
  // its wait_group.read has seen this warpgroup's previous reduction read the staging
  // (reducer_main); the barrier also makes the cp.async just waited for visible to the
  // warpgroup. Thread 0 no longer waits on the bulk engine (its DEPBAR counted its cp.async too).
  const auto acquire_dq_staging = [&]() {
    if constexpr (!T::kStatsWarp) cp_async_wait<0>();
    named_barrier_sync(kDqEmptyBarrier0 + wg, kDqHandoffThreads);
  };
  const auto issue_s = [&](int stg, uint32_t ph) {
    mbarrier_wait(&s.q_full[stg], ph);
    gemm_issue<true>(mma_sdp, tSrK, tSrQ(_, _, _, stg), tSrS);
  };
  if (kEarlyS && t < it.num_tiles) {
    if (kSkipHidden && cls == MaskClass::kOutside) {
      // No [1] for a hidden part; the stage's wait stays (see issue_next_s_and_wait).
      mbarrier_wait(&s.q_full[0], 0);
      clear(tSrS);
    } else {
      issue_s(0, 0);
      warpgroup_wait<0>();
    }
    warpgroup_fence_operand(tSrS);
  }
#pragma unroll 1
  while (t < it.num_tiles) {
    // The tile's bookkeeping ("head"): the next live tile, its entry and stats. It is a chain of
    // dependent integer steps and address arithmetic (~450 cycles in session 24's timeline) that
    // the tensor pipe idles through at the top of the tile, where S^T is complete and [2] not
    // yet issued. Block 128 (early S) runs it right after [4] is issued, beside [4] and the rest
    // of dP (session 24: +1% at D 128, +3.8% at D 64, +2.6% at 12.5%; after [7], after [2], or
    // split between [4] and [5] measured worse). Block 64 keeps it at the top (-2% after [4]).
    int e_next = 0, h_next = 0, row0_next = 0, t_next = 0, ahead = 0;
    bool new_block = false;
    MaskClass cls_next = MaskClass::kInside;  // T::kMask
    uint32_t ahead_addr = 0;
    // T::kStatsWarp: the next slot of the loader's ring, its phase and the next tile's mask bits.
    [[maybe_unused]] const int buf_next = buf + 1 == T::kStatsSlots ? 0 : buf + 1;
    [[maybe_unused]] const uint32_t stats_phase_next =
        buf + 1 == T::kStatsSlots ? stats_phase ^ 1 : stats_phase;
    [[maybe_unused]] uint32_t band_next = 0;
    const auto run_head = [&]() {
      if constexpr (T::kStatsWarp) {
        // The next live tile's info (the slot's data is complete too: the phase counts the bulk
        // copies' bytes); info {0, 0, 0, 0}: none.
        mbarrier_wait(&ring_of(s).full[buf_next], stats_phase_next);
        const uint4 inf = ld_shared_v4(smem_u32(&ring_of(s).info[buf_next]));
        t_next = inf.z != 0 ? t + 1 : it.num_tiles;
        row0_next = static_cast<int>(inf.x);
        h_next = static_cast<int>(inf.y);
        band_next = inf.w;
        if constexpr (T::kMask) cls_next = class_of_bits(band_next);
        return;
      }
      t_next = next_live(t, e_cur, e_nxt, e_next, h_next, row0_next);
      // When the next tile starts a new query block, the entry of the block after it -> the
      // other entry_ahead slot (free for the reason the other stats buffer is).
      new_block = t_next / kTpe != t / kTpe;
      ahead = t_next / kTpe + 1;
      ahead_addr = smem_u32(&s.entry_ahead[wg][buf ^ 1]);
      if (new_block && ahead < n_entries && wtid == 0)
        cp_async_4(ahead_addr, p.entries + it.begin + ahead);
      // The next tile's stats -> the other buffer (free: every thread of this warpgroup
      // finished [3] of the previous tile before the warpgroup barrier it passed after that
      // tile's [7]: sync_async_copies, or with the reducer warp the kDqEmptyBarrier0 + wg
      // hand-off), by cp.async: waited for and made visible by this tile's such barrier.
      if (t_next < it.num_tiles) {
        if constexpr (!T::kMask) entry_rows<T>(p, it, e_next, t_next, h_next, row0_next);
        cp_async_4(stats_addr + kStatsBufBytes * (buf ^ 1) + 4 * wtid,
                   stat_ptr(h_next, row0_next));
        if constexpr (T::kMask) cls_next = wg_class(row0_next);
      }
      cp_async_commit();
    };
    // (T::kStatsWarp without early S: at the end of the tile instead, the only use of t_next.)
    if constexpr (!kEarlyS && !T::kStatsWarp) run_head();
    // The stage of tile t_next.
    const int stage_next = stage + 1 == T::kStages ? 0 : stage + 1;
    const uint32_t phase_next = stage + 1 == T::kStages ? phase ^ 1 : phase;
    // kEarlyS: [1] of tile t_next issued behind the tile's last GEMM, then the wait for all
    // but it. Past the last tile, tSrS is cleared instead (after the wait: a non-wgmma write to
    // an accumulator while wgmmas run serializes them, C7515): every path must redefine it, or
    // S^T's old value stays alive around the back edge and P and dS cannot reuse its registers
    // (+16 registers, and spills at block 128, D 128). kSkipHidden: no [1] for a next tile whose
    // part the mask hides from this warpgroup (tSrS cleared as past the last tile), but the
    // stage's q_full wait stays, so that the warpgroup's q_empty arrivals for that tile (at [7])
    // always fall in the stage's phase of that tile, however far the other warpgroup lags.
    const auto issue_next_s_and_wait = [&]() {
      if (t_next < it.num_tiles && !(kSkipHidden && cls_next == MaskClass::kOutside)) {
        issue_s(stage_next, phase_next);
        warpgroup_wait<1>();
      } else {
        if constexpr (kSkipHidden) {
          if (t_next < it.num_tiles) mbarrier_wait(&s.q_full[stage_next], phase_next);
        }
        warpgroup_wait<0>();
        clear(tSrS);
      }
    };
    // lse2 / delta of this thread's columns 8 j + frag_col + {0, 1} (query rows of the tile):
    // 8-byte shared loads from this warpgroup's stats buffer. Block 128 with D 128 (early S) loads
    // lse2 before [2] is issued, so that the loads' latency passes under the issue instead of
    // stalling [3]'s first FFMA (session 25, call 9: 3.6% of the stall samples sat there;
    // +1.2-1.4% at 50%; D 64 measured -0.7 to -1.5% and keeps the loads in [3]).
    constexpr bool kLse2Early = kEarlyS && kHeadDim == 128;
    constexpr int kColPairs = decltype(size(tSrS))::value / 4;
    if constexpr (T::kMask) {
      // [1] (block 64), [2], [3] of a tile that the token mask does not hide from this warpgroup.
      // kBand: the mask cuts the warpgroup's 64 x 64 part, so [3] also forces P^T = 0 where the
      // band hides the pair. One straight-line block per variant: ptxas interleaves [3] with the
      // issue of [2] only when no branch separates them (main's first masked kernel chose the
      // band between [2] and [3], issued [2] back to back and started [3] behind it, on every
      // tile: docs/decisions/sm90_bsa_backward.md, "Where the masked backward's time went").
      const auto front = [&](auto band_tag) {
        constexpr bool kBand = decltype(band_tag)::value;
        float2 l2v[kColPairs];
        if constexpr (kLse2Early) {
          // The address of lse2_cols below (hoisting lse2_cols itself changed block 64's SASS).
          const uint32_t lse2_early = stats_addr + kStatsBufBytes * buf + 4 * frag_col;
          CUTE_UNROLL
          for (int j = 0; j < kColPairs; ++j) l2v[j] = ld_shared_f32x2(lse2_early + 32 * j);
        }
        // [1], [2]
        if constexpr (!kEarlyS) issue_s(stage, phase);
        gemm_issue<true>(mma_sdp, tSrV, tSrdO(_, _, _, stage), tSrdP);
        // [3]
        const uint32_t lse2_cols = stats_addr + kStatsBufBytes * buf + 4 * frag_col;
        if constexpr (!kEarlyS) {
          warpgroup_wait<1>();
          warpgroup_fence_operand(tSrS);
        }
        // Element i = 4 j + u of this thread is key wg*64 + frag_row + 8 (u / 2) (valid below
        // key_lim) and query row 8 j + frag_col + u % 2 of the tile. kBand: also 0 where the band
        // hides the pair. With d_r = key - row for the thread's key row r = u / 2 and row
        // 8 j + frag_col, and c = 8 j + u % 2 in [0, 63], the pair's s - i is d_r - c, so
        // lo <= s - i <= hi is band_lo[r] >= c && band_hi[r] >= -c with band_lo[r] = d_r - lo,
        // band_hi[r] = hi - d_r: two compares with immediates per element, which replace
        // key_lim's (band_lo[r] = -1 < c for a padded key). d_r = base + off_r with the
        // warpgroup-uniform base = key0 + 64 wg - row0 and off_r = frag_row + 8 r - frag_col in
        // [-6, 63]; base - lo and hi - base are clamped to [-256, 256] once (int64, uniform), which
        // changes no compare (|off_r| + 63 < 256), so the per-thread part stays int32.
        int band_lo[2] = {0, 0}, band_hi[2] = {0, 0};
        if constexpr (kBand) {
          const int64_t base = static_cast<int64_t>(it.key0 + wg * 64) - row0;
          const int blo = static_cast<int>(clamp_to(base - seq_lo<T>(p, s), -256, 256));
          const int bhi = static_cast<int>(clamp_to(seq_hi<T>(p, s) - base, -256, 256));
          CUTE_UNROLL
          for (int r = 0; r < 2; ++r) {
            const int off_r = frag_row + 8 * r - frag_col;
            band_lo[r] = T::kFullBlocks || 8 * r < key_lim ? blo + off_r : -1;
            band_hi[r] = bhi - off_r;
          }
        }
        CUTE_UNROLL
        for (int j = 0; j < kColPairs; ++j) {
          const float2 l2 = kLse2Early ? l2v[j] : ld_shared_f32x2(lse2_cols + 32 * j);
          CUTE_UNROLL
          for (int u = 0; u < 4; ++u) {
            const int i = 4 * j + u;
            const float x = exp2_prob(fmaf(tSrS(i), scale_log2, -(u % 2 == 0 ? l2.x : l2.y)));
            bool keep;
            if constexpr (kBand) {
              const int c = 8 * j + u % 2;  // a constant once unrolled
              keep = band_lo[u / 2] >= c && band_hi[u / 2] >= -c;
            } else {
              keep = T::kFullBlocks || 8 * (u / 2) < key_lim;
            }
            tSrS(i) = keep ? x : 0.f;
          }
        }
      };
      // [4], the head (block 128), dS^T, [5]: after the variants' join (with [4] and [5] inside
      // each variant, ptxas serialized the wgmmas: C7512).
      const auto back = [&]() {
        const uint32_t delta_cols =
            stats_addr + kStatsBufBytes * buf + 4 * frag_col + 4 * T::kBlockM;
        convert_p(tSrS, tKVrP);
        // [4] issued before dP^T is waited for: the fp32 S^T dies here, so S^T and dP^T are never
        // live together with dK and dV (that spilled at 232 registers).
        gemm_issue<false>(mma_kv, tKVrP, tKVrdOt(_, _, _, stage), tdVrdV);
        if constexpr (kEarlyS) run_head();
        warpgroup_wait<1>();  // dP^T is ready; [4] may still run
        warpgroup_fence_operand(tSrdP);
        CUTE_UNROLL
        for (int j = 0; j < kColPairs; ++j) {
          const float2 dl = ld_shared_f32x2(delta_cols + 32 * j);
          CUTE_UNROLL
          for (int u = 0; u < 4; ++u) {
            const int i = 4 * j + u;
            // P from its 16-bit copy (the A operand of [4], only read here).
            const float ds =
                packed_elem_f32(tKVrP, i) * (tSrdP(i) - (u % 2 == 0 ? dl.x : dl.y));
            tSrdP(i) = T::kFullBlocks || 8 * (u / 2) < key_lim ? ds : 0.f;
          }
        }
        // T::kStatsWarp: this thread's last read of the slot (its info is in registers since the
        // previous tile's head): the loader may refill it.
        if constexpr (T::kStatsWarp) mbarrier_arrive(&ring_of(s).empty[buf]);
        convert_p(tSrdP, tKVrdS);
        // [5]
        gemm_issue<false>(mma_kv, tKVrdS, tKVrQt(_, _, _, stage), tdKrdK);
      };
      // The warpgroup's class of the tile (warpgroup-uniform, judged in the previous tile's head).
      // Hidden (kSkipHidden: block 128, e.g. rows 0-63 of a causal diagonal block against its
      // keys 64-127): no [1] was issued for it (issue_next_s_and_wait), and [2]-[5] are skipped:
      // its P^T and dS^T are exactly 0, so dV and dK get nothing; dS^T = 0 still goes to s.ds,
      // whose other half the other warpgroup's keys fill, for the dQ of both warpgroups ([7]).
      // P^T and dS^T are zeroed (not left undefined) so that the fences at [7] do not keep the
      // previous tile's values alive around the loop's back edge.
      if (kSkipHidden && cls == MaskClass::kOutside) {
        if constexpr (kEarlyS) run_head();
        if constexpr (T::kStatsWarp) mbarrier_arrive(&ring_of(s).empty[buf]);  // no read of it
        clear(tKVrP);
        clear(tKVrdS);
      } else {
        if (cls != MaskClass::kInside) front(cute::true_type{});
        else front(cute::false_type{});
        back();
      }
    } else {
      // Main's code, as it was before the masked variants (the unmasked kernels' SASS is
      // byte-identical to main's: docs/decisions/sm90_bsa_backward.md).
      float2 l2v[kColPairs];
      if constexpr (kLse2Early) {
        // The address of lse2_cols below (hoisting lse2_cols itself changed block 64's SASS).
        const uint32_t lse2_early = stats_addr + kStatsBufBytes * buf + 4 * frag_col;
        CUTE_UNROLL
        for (int j = 0; j < kColPairs; ++j) l2v[j] = ld_shared_f32x2(lse2_early + 32 * j);
      }
      // [1], [2]
      if constexpr (!kEarlyS) issue_s(stage, phase);
      gemm_issue<true>(mma_sdp, tSrV, tSrdO(_, _, _, stage), tSrdP);
      // [3]
      const uint32_t lse2_cols = stats_addr + kStatsBufBytes * buf + 4 * frag_col;
      const uint32_t delta_cols = lse2_cols + 4 * T::kBlockM;
      if constexpr (!kEarlyS) {
        warpgroup_wait<1>();
        warpgroup_fence_operand(tSrS);
      }
      // Element i = 4 j + u of this thread is key wg*64 + frag_row + 8 (u / 2) (valid below
      // key_lim) and query row 8 j + frag_col + u % 2 of the tile.
      CUTE_UNROLL
      for (int j = 0; j < kColPairs; ++j) {
        const float2 l2 = kLse2Early ? l2v[j] : ld_shared_f32x2(lse2_cols + 32 * j);
        CUTE_UNROLL
        for (int u = 0; u < 4; ++u) {
          const int i = 4 * j + u;
          const float x = exp2_prob(fmaf(tSrS(i), scale_log2, -(u % 2 == 0 ? l2.x : l2.y)));
          tSrS(i) = T::kFullBlocks || 8 * (u / 2) < key_lim ? x : 0.f;
        }
      }
      convert_p(tSrS, tKVrP);
      // [4] issued before dP^T is waited for: the fp32 S^T dies here, so S^T and dP^T are never
      // live together with dK and dV (that spilled at 232 registers).
      gemm_issue<false>(mma_kv, tKVrP, tKVrdOt(_, _, _, stage), tdVrdV);
      if constexpr (kEarlyS) run_head();
      warpgroup_wait<1>();  // dP^T is ready; [4] may still run
      warpgroup_fence_operand(tSrdP);
      CUTE_UNROLL
      for (int j = 0; j < kColPairs; ++j) {
        const float2 dl = ld_shared_f32x2(delta_cols + 32 * j);
        CUTE_UNROLL
        for (int u = 0; u < 4; ++u) {
          const int i = 4 * j + u;
          // P from its 16-bit copy (the A operand of [4], only read here).
          const float ds =
              packed_elem_f32(tKVrP, i) * (tSrdP(i) - (u % 2 == 0 ? dl.x : dl.y));
          tSrdP(i) = T::kFullBlocks || 8 * (u / 2) < key_lim ? ds : 0.f;
        }
      }
      // T::kStatsWarp: this thread's last read of the slot (its info is in registers since the
      // previous tile's head): the loader may refill it.
      if constexpr (T::kStatsWarp) mbarrier_arrive(&ring_of(s).empty[buf]);
      convert_p(tSrdP, tKVrdS);
      // [5]
      gemm_issue<false>(mma_kv, tKVrdS, tKVrQt(_, _, _, stage), tdKrdK);
    }
    // [6] The previous tile's dQ GEMMs of every warp are done with the dS tile.
    named_barrier_sync(ds_barrier, T::kDsThreads);
    if (with_dq) {
      // dS^T (key, row) -> byte key * 128 + ((row / 8) ^ (key % 8)) * 16 + (row % 8) * 2 of the
      // K-major 128B-swizzled tile (see SmemLayoutDs); a thread's pair of rows is one 4-byte store,
      // and a warp's 32 stores of one j hit 32 different banks.
      const auto ds32 = recast<uint32_t>(tKVrdS);
      const uint32_t ds_base =
          smem_u32(s.ds) + (wg * 64 + frag_row) * 128 + 4 * (lane % 4);
      CUTE_UNROLL
      for (int j = 0; j < size(ds32); ++j)
        st_shared_u32(ds_base + 8 * 128 * (j % 2) + (((j / 2) ^ (frag_row % 8)) << 4), ds32(j));
    }
    fence_proxy_async_shared();
    named_barrier_sync(ds_barrier, T::kDsThreads);
    if (with_dq) {
      // [7]
      CUTE_UNROLL
      for (int j = 0; j < T::kDqPanels; ++j) {
        const int c = T::kDqSplitPanels ? wg * T::kDqPanels + j : j;  // panel of D
        Tensor sKt = make_tensor(make_smem_ptr(s.k + c * kBlockN * 64 + dq_key0 * 64),
                                 typename T::SmemLayoutKtPanel{});
        Tensor tQrKt = thr_dq.partition_fragment_B(sKt);
        gemm_issue<true>(mma_dq, tQrDs, tQrKt, tQrdQ);
        if (j == 0) {
          // [4], [5] are complete: the Q / dO stage is free, and so are the registers of P^T and
          // dS^T (which ptxas places in S^T's: [1] of the next tile may now write them).
          warpgroup_wait<1>();
          warpgroup_fence_operand(tKVrP);
          warpgroup_fence_operand(tKVrdS);
          warpgroup_fence_operand(tdVrdV);
          warpgroup_fence_operand(tdKrdK);
          if (lane == 0) mbarrier_arrive(&s.q_empty[stage]);
        }
        if (kEarlyS && j == T::kDqPanels - 1) {
          issue_next_s_and_wait();  // [7] is done; [1] of the next tile may still run
        } else {
          warpgroup_wait<0>();
        }
        warpgroup_fence_operand(tQrdQ);
        if (j == 0) {
          if constexpr (T::kReducerWarp) acquire_dq_staging();
          else sync_async_copies();
        }
        // Pair i / 2 of this thread -> floats 2 (128 (i / 2) + wtid) of the panel's staging.
        const uint32_t dst = smem_u32(s.dq + (wg * T::kDqPanels + j) * kDqPanelFloats) + 8 * wtid;
        CUTE_UNROLL
        for (int i = 0; i < size(tQrdQ); i += 2)
          st_shared_f32x2(dst + 1024 * (i / 2), tQrdQ(i), tQrdQ(i + 1));
      }
      // The staging is written: one thread adds each panel to the tile's run of dq_accum
      // (64 * D floats from row0; panel c at c * 4096). With the reducer warp: the 128 threads
      // bar.arrive kDqFullBarrier0 + wg (160, non-blocking) after their proxy fence; the
      // reducer's bar.sync on it returns and its lane 0 issues the reduction (reducer_main).
      fence_proxy_async_shared();
      if constexpr (T::kReducerWarp) {
        named_barrier_arrive(kDqFullBarrier0 + wg, kDqHandoffThreads);
      } else {
        named_barrier_sync(3 + wg, 128);
        if (wtid == 0) {
          float* tile = p.dq_accum + stat_row<T>(p, s, it, h, row0) * kHeadDim;
          CUTE_UNROLL
          for (int j = 0; j < T::kDqPanels; ++j) {
            const int c = T::kDqSplitPanels ? wg * T::kDqPanels + j : j;
            bulk_reduce_add_f32(tile + c * kDqPanelFloats,
                                s.dq + (wg * T::kDqPanels + j) * kDqPanelFloats,
                                kDqPanelFloats * 4);
          }
          bulk_commit_group();
        }
      }
    } else {
      // Deterministic mode: dQ comes from the query-major pass; [4], [5] finish the tile.
      warpgroup_wait<0>();
      warpgroup_fence_operand(tKVrP);
      warpgroup_fence_operand(tKVrdS);
      warpgroup_fence_operand(tdVrdV);
      warpgroup_fence_operand(tdKrdK);
      if (lane == 0) mbarrier_arrive(&s.q_empty[stage]);
      if constexpr (kEarlyS) issue_next_s_and_wait();
    }
    if (!T::kStatsWarp && !with_dq) sync_async_copies();  // the ring needs no barrier
    if constexpr (kEarlyS) {
      // Unconditional: ptxas's wgmma analysis does not correlate branches, and an accumulator
      // that may be in flight at the back edge serializes every wgmma of the loop (C7515).
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
    }
    if constexpr (!kEarlyS && T::kStatsWarp) run_head();
    stage = stage_next;
    phase = phase_next;
    if (!T::kStatsWarp && new_block) {
      // With a mask the walk may pass over a dead entry only outside the map's contract
      // (next_live); e_next is the new block's entry either way.
      e_cur = T::kMask ? e_next : e_nxt;
      e_nxt = ahead < n_entries ? static_cast<int>(ld_shared_u32(ahead_addr)) : 0;
    }
    if constexpr (T::kStatsWarp) {
      buf = buf_next;
      stats_phase = stats_phase_next;
      band_bits = band_next;
    } else {
      buf ^= 1;
    }
    t = t_next;
    h = h_next;
    row0 = row0_next;
    if constexpr (T::kMask) cls = cls_next;
  }

  // [8] Epilogue, single owner (row_groups == 1, empty rows included): dK * scale and dV -> bf16
  // -> the warpgroup's 64 rows of s.k / s.v (dead once the GEMMs of every consumer that reads
  // them are done: ds_barrier), in the TMA layout, then TMA stores (keys >= S_kv are not written;
  // padded keys < S_kv are zeros) by thread 32 of the warpgroup, whose bulk group is its own:
  // the dq_ready signal below does not wait for them. The stores replace 4-byte global stores of
  // the fragments, ~8k cycles per item at the end of the CTA (session 28's item trace).
  const bool one_owner = p.row_groups[it.row] == 1;
  if (one_owner) {
    named_barrier_sync(ds_barrier, T::kDsThreads);
    // Element (key, column c) of a tile -> byte (c / 64) kBlockN 128 + key 128 +
    // (((c % 64) / 8) ^ (key % 8)) 16 + (c % 8) 2; this thread's keys are = lane / 4 (mod 8), and a
    // warp's 32 stores of one i hit 32 different banks.
    const uint32_t rows_off = (wg * 64 + frag_row) * 128 + 4 * (lane % 4);
    const uint32_t k_base = smem_u32(s.k) + rows_off;
    const uint32_t v_base = smem_u32(s.v) + rows_off;
    const float scale = p.scale;
    CUTE_UNROLL
    for (int i = 0; i < size(tdKrdK); i += 2) {
      const int chunk = i / 4;  // 8-column chunk of D
      const uint32_t off = (chunk / 8) * kBlockN * 128 + ((i / 2) % 2) * 8 * 128 +
                           (((chunk % 8) ^ (lane / 4)) << 4);
      st_shared_u32(k_base + off, pack_bf16x2(tdKrdK(i) * scale, tdKrdK(i + 1) * scale));
      st_shared_u32(v_base + off, pack_bf16x2(tdVrdV(i), tdVrdV(i + 1)));
    }
    fence_proxy_async_shared();
    named_barrier_sync(3 + wg, 128);
    // Packed (T::kVarlen): a 64-key box past the block's valid keys holds the next sequence's keys
    // (single owner: written by their own CTA in any order), so only a full box is a TMA store;
    // a partial one is copied out row by row (valid keys only), an empty one not at all.
    // Dense: keys >= valid (< S_kv) are the call's own padding, stored as zeros.
    [[maybe_unused]] const int box_rows = min(max(it.valid - wg * 64, 0), 64);
    if (T::kVarlen && box_rows < 64) {
      if constexpr (T::kVarlen) {
        // Row r, 16-byte chunk c of panel pnl of the staged box: byte pnl kBlockN 128 +
        // (64 wg + r) 128 + ((c ^ r % 8) << 4) (the layout above; 64 wg is a multiple of 8).
        for (int i = wtid; i < box_rows * 8 * T::kPanels; i += 128) {
          const int pnl = i / (box_rows * 8), r = i % (box_rows * 8) / 8, c = i % 8;
          const uint32_t off = pnl * kBlockN * 128 + (wg * 64 + r) * 128 + ((c ^ (r % 8)) << 4);
          const int64_t key = it.kg + wg * 64 + r;
          const int col = pnl * 64 + 8 * c;
          *reinterpret_cast<uint4*>(static_cast<Element*>(p.dk.data) +
                                    p.dk.offset(0, it.hk, key, col)) =
              ld_shared_v4(smem_u32(s.k) + off);
          *reinterpret_cast<uint4*>(static_cast<Element*>(p.dv.data) +
                                    p.dv.offset(0, it.hk, key, col)) =
              ld_shared_v4(smem_u32(s.v) + off);
        }
      }
    } else if (wtid == 32) {
      const int tb = tma_batch<T>(it);
      CUTE_UNROLL
      for (int pnl = 0; pnl < T::kPanels; ++pnl) {
        const int tile = pnl * kBlockN * 64 + wg * 64 * 64;
        tma_store_4d(&p.tma_dk, s.k + tile, pnl * 64, it.kg + wg * 64, it.hk, tb);
        tma_store_4d(&p.tma_dv, s.v + tile, pnl * 64, it.kg + wg * 64, it.hk, tb);
      }
      bulk_commit_group();
    }
  }

  // The item's last bulk reduction has run (shared memory stays valid until then); then the
  // head's counter, which the conversion launched beside this kernel waits for. Before several
  // owners' reductions: the release's MEMBAR.GPU would wait for them. (With the reducer warp and
  // dQ, the reducer does both, once for all consumer warpgroups; without dQ there is nothing to
  // wait for and dq_ready is null.)
  if (!T::kReducerWarp && wtid == 0) {
    bulk_wait_all();
    if (p.dq_ready != nullptr) {
      fence_proxy_async_global();
      red_release_gpu_add_u32(p.dq_ready + it.b * p.Hkv + it.hk, 1u);
    }
  }

  if (one_owner) {
    if (wtid == 32) bulk_wait_read_all();  // shared memory stays valid until the stores read it
  } else {
    // [8] Epilogue, several owners: fp32 reductions of keys < valid into dk/dv_accum.
    const int key_base = wg * 64 + frag_row;  // + 8 r
    // Packed: [H_kv, T_kv] by the global key.
    const int64_t row_base =
        T::kVarlen ? static_cast<int64_t>(it.hk) * p.Skv_pad + it.kg
                   : (static_cast<int64_t>(it.b) * p.Hkv + it.hk) * p.Skv_pad + it.key0;
    CUTE_UNROLL
    for (int i = 0; i < size(tdKrdK); i += 2) {
      const int key = key_base + 8 * ((i / 2) % 2);
      if (T::kFullBlocks || key < it.valid) {
        const int64_t off = (row_base + key) * kHeadDim + 8 * (i / 4) + frag_col;
        red_add_f32x2(p.dk_accum + off, tdKrdK(i), tdKrdK(i + 1));
        red_add_f32x2(p.dv_accum + off, tdVrdV(i), tdVrdV(i + 1));
      }
    }
  }
}

}  // namespace bwd

// ---- kernel -------------------------------------------------------------------------------------
template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kCtasPerSm)
    bsa_backward_sm90_kernel(const __grid_constant__ BsaBwdSm90Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // The dQ conversion (launched next, programmatic serialization) may take the SMs this grid
  // leaves once every CTA of it has started.
  griddepcontrol_launch_dependents();
  const int num_items = *p.num_items;
  // The grid is the shapes' upper bound on work items; the last waves run longest first.
  if (static_cast<int>(blockIdx.x) >= num_items) return;
  const int item = work_item_of_slot(blockIdx.x, num_items, p.item_order, p.tail_items);
  extern __shared__ uint8_t smem_raw[];
  bwd::SharedStorage<T>& s = aligned_shared_storage<bwd::SharedStorage<T>>(smem_raw);

  if (threadIdx.x == 0) {
    mbarrier_init(&s.kv_full, 1);
#pragma unroll
    for (int i = 0; i < T::kStages; ++i) {
      mbarrier_init(&s.q_full[i], 1);
      mbarrier_init(&s.q_empty[i], T::kConsumerWarps);
    }
    if constexpr (T::kStatsWarp) {
#pragma unroll
      for (int i = 0; i < T::kStatsSlots; ++i) {
        mbarrier_init(&s.ring.full[i], 1);
        mbarrier_init(&s.ring.empty[i], T::kConsumerThreads);  // every consumer thread
      }
    }
    if constexpr (T::kVarlen) {
      // The item's sequence, once for the CTA (the barrier below publishes it).
      mbarrier_init(&s.seq.q_pad, 1);
      const int b = p.item_row[item] / (p.Nkv * p.Hkv);
      const TileSeq<true> ts = TileSeq<true>::of(p, b);
      cta_seq_store(s.seq.words, ts,
                    static_cast<int>(portable::packed_stat_row0(b, ts.q0(), T::kBlockN)));
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  bwd::Item it;
  it.row = p.item_row[item];
  it.begin = p.item_begin[item];
  it.num_tiles = (p.item_end[item] - it.begin) * T::kTilesPerEntry;
  const int n = it.row % p.Nkv;
  it.hk = (it.row / p.Nkv) % p.Hkv;
  it.b = it.row / (p.Nkv * p.Hkv);
  it.key0 = n * T::kBlockN;
  if constexpr (T::kVarlen) {
    // BsaMeta::block_len of the sequence (packed batches have no kv_block_len).
    it.valid = min(T::kBlockN, cta_seq_word(s.seq.words, kSeqSkv) - it.key0);
    it.kg = cta_seq_word(s.seq.words, kSeqK0) + it.key0;
  } else {
    it.valid = min(p.meta.block_len(it.b, n, p.dims), p.Skv - it.key0);
    it.kg = it.key0;
  }

  const Role role = static_cast<Role>(__shfl_sync(0xffffffffu, threadIdx.x / 128, 0));
  if (role == Role::kProducer) {
    setmaxnreg_dec<T::kProducerRegs>();
    const int warp = threadIdx.x / 32;
    if (warp == 0) bwd::producer_main<T>(p, s, it);
    if constexpr (T::kReducerWarp) {
      if (warp == 1 && p.dq_accum != nullptr) bwd::reducer_main<T>(p, s, it);
    }
    if constexpr (T::kStatsWarp) {
      if (warp == 2) bwd::loader_main<T>(p, s, it);
    }
  } else {
    setmaxnreg_inc<T::kConsumerRegs>();
    bwd::consumer_main<T>(p, s, it, static_cast<int>(role) - static_cast<int>(Role::kConsumer0));
  }
#endif
}

}  // namespace sa::sm90
