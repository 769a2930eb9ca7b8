// The Hopper (sm_90a) BSA forward kernel: TMA + wgmma + mbarrier pipeline, warp-specialized.
// Device code only; bsa_forward.cu builds the TMA descriptors and instantiates it.
//
// A persistent CTA walks work tiles t = blockIdx.x, blockIdx.x + gridDim.x, ...; a tile is one
// query block m of one (batch b, query head h), kBlock (= the block size, 64 or 128) query rows,
// attending the KV blocks of its row of q2k_index. The query block index m varies fastest, so the
// CTAs that run together share the K/V of one head in L2. One CTA per SM.
//
// Dynamic tiles (FwdTraits::kDynamicTiles: the masked and packed instantiations, whose rows differ
// in length; BsaFwdSm90Params::tile_counter not null): each CTA's tiles after its first come from
// a counter in the workspace, and the t-th tile handed out has query block m = N_q - 1 - t % N_q
// (still fastest), so that the longest rows of a causal list go first. In these kernels producer
// warp 0 takes the next tile after issuing this one's loads and hands it to itself and the
// consumers through shared memory (persistent_items.cuh; next_tile), from the counter or, without
// one, in the static order above.
//
// A stage of the K/V ring holds 128 keys: one KV block at block 128, two consecutive slots of the
// block list at block 64 (two TMA boxes per panel; when the count is odd, the last stage's second
// block repeats its first, and all its keys are masked).
//
// Roles (warpgroups):
//   kProducer  warpgroup 0, setmaxnreg down to kProducerRegs; its warp 0 reads the block list 32
//              slots at a time (one slot per lane, broadcast by shuffles) and issues the TMA loads:
//              Q once per tile, then K and V of each stage (the block index times kBlock is the row
//              coordinate of an ordinary tile load). Key-split mode: warp 0 issues Q and K and
//              hands each stage's V loads to warp 1 (VRing, producer_v_main).
//   kConsumer0, kConsumer1  warpgroups 1 and 2, setmaxnreg up to kConsumerRegs: S = Q K^T and
//              O += P V with wgmma, the online softmax, O in registers.
//              Block 128: each owns 64 of the tile's query rows and reads every stage; each writes
//              its rows.
//              Block 64 (key-split mode): both work on the tile's 64 rows, the tile's lead on
//              stages 0, 2, ..., the other on 1, 3, ..., each with its own softmax state (m, l,
//              O). At the end of the tile the other hands its state to the lead through shared
//              memory (s.xchg, with the mbarriers xchg_full / xchg_empty), and the lead merges the
//              two (O = O0 2^(m0 - m) + O1 2^(m1 - m), m the larger maximum) and writes the rows.
//              The lead alternates over the tiles that have blocks (consumer 0 leads the first):
//              the next tile's lead starts its stages while this one merges and writes. So
//              block 64 runs the block-128 mainloop (S of 64 x 128, one softmax and rescale per
//              128 keys, ping-pong) instead of a 64 x 64 one (bench/notes-archive, session 12:
//              +7-14%).
//
// Timeline of one tile (block 128; block list n0 n1 n2 ..., two consumers ping-ponging; each
// consumer overlaps the softmax of stage j with its own P V GEMM of stage j-1):
//
//   producer  |Q|K0|K1|V0|  K2  |  V1  | ... |Vn|       (each load waits for its stage to be free)
//   WG0       |S0|sm0|[S1 PV0]|sm1 |        |[S2 PV1]|sm2 |        | ... |PVn|epilogue|
//   WG1       |S0|sm0|        |[S1 PV0]|sm1 |        |[S2 PV1]|sm2 | ... |PVn|epilogue|
//   tensor    |  S0  |  WG0   |  WG1   |    |  WG0   |  WG1   |    |
//              [..] = the GEMMs one consumer issues back to back between its schedule barriers;
//              smj  = mask (partial block, or the token mask's band where it cuts the warp's
//                     rows), online softmax, P -> 16-bit, O *= alpha.
// Key-split mode: the same, with the lead on stages 0, 2, 4, ... and the other WG on 1, 3, 5, ...;
// the schedule token starts the tile with the lead and must end it with the other WG (the next
// lead): after an even number of [S PV] turns the lead passes it with an empty turn. A WG without
// a stage (one-stage tile) still waits for the tile's Q before it arrives on kQueryEmpty, so that
// it never arrives twice in one phase.
//
// Pipeline objects (shared memory):
//   q_full            mbarrier, TMA -> consumers: Q landed (one phase per tile that has blocks)
//   k_full/v_full[s]  mbarriers, TMA -> consumers: stage s holds the block's K / V (producer and
//                     consumers each read the block's number of valid keys from the metadata:
//                     no shared word handed over through the mbarrier)
//   k_empty/v_empty[s] mbarriers, one arrive per consumer warp that reads the stage (all 8, or
//                     the 4 of its warpgroup in key-split mode) -> producer: stage s is free
//   v_pad             mbarrier, TMA -> producer: V of a block whose padded keys lie inside the
//                     tensor landed; the producer zeroes those rows, then arrives on v_full[s]
//   NamedBarrier::kQueryEmpty      consumers arrive after their last S GEMM of a tile (and once at
//                                  the start); the producer syncs before loading the next Q
//   NamedBarrier::kScheduleWg0/1   ping-pong of the two consumers' GEMM issue (FA3-style)
//   NamedBarrier::kEpilogueWg0/1   a consumer's O staging tile is written / is free again
//   xchg_full / xchg_empty         key-split mode: consumer 1's state is in s.xchg / was read
//   tiles.full / tiles.empty       masked and packed kernels: producer warp 0 -> itself and the
//                                  consumers: the CTA's next tile is in tiles.next (one arrival)
//                                  / was read (kTileWalkers = 32 + 256 arrivals)
//
// Split-KV (FwdTraits::kSplit, a separate instantiation; the default kernels do not contain it):
// tile t = split * base_tiles + (query block, head, batch) walks only slots [lo, hi) of its row's
// block list, the split's share (count * split / num_splits ..). Its epilogue writes the split's
// normalised O (fp32, straight from the fragments) and its LSE to the workspace, and
// bsa_forward_combine.cu merges the splits into o and lse. Chosen automatically for bf16 when the
// query blocks cannot fill the GPU (bsa_forward.cu, forward_splits).
//
// Token masks (FwdTraits::kMasked, separate instantiations; SPEC 4, docs/bsa.md "Token masks"):
// producer and consumers walk the tile's block list filtered by the mask (VisibleCursor: a block
// none of whose valid keys any row of the tile sees is dropped), each from the metadata, and pair
// the filtered entries into stages; a tile with no visible block loads nothing and writes O = 0,
// LSE = -inf. Each warp applies the band to a stage's scores (mask_band) only where it cuts the
// warp's 16 rows or a block has padded keys.
//
// Packed (THD) batches (FwdTraits::kVarlen, separate instantiations on the masked walk; SPEC 4,
// docs/bsa.md "Packed batches"): tile (b, h, m) is query block m of sequence b, the grid sized
// B x H_q x N_q_max from shapes only. Each role reads the sequence from cu_seqlens on the device
// at the tile's start (TileSeq: clamped offsets, the sequence's band); a query block past the
// sequence's end loads and writes nothing. TMA describes q, k, v as (D, T, H, 1) and loads rows
// q0 + m * kBlock and k0 + key0: rows past a sequence's end belong to the next sequence (or are
// zero-filled past T) and are never stored (O and LSE rows < sq only) or attended (a block's
// valid keys stop at skv; their V rows are zeroed like padding). Without a mask the band is
// [-sq, skv], which every pair passes. The consumers keep the sequence in shared memory
// (SharedSeq), not in registers.
//
// Numerics: scores s = <q, k> in fp32; x = s * scale * log2(e) folded into one FFMA with the row
// maximum: p = 2^(s * scale_log2 - m). The running maximum m is taken over the raw scores (their
// minimum when the scale is negative). Padded keys (past block_len or S_kv) get the raw score that
// loses (+-inf), hence p = 0; their V rows are zero in shared memory (TMA zero-fills rows past
// S_kv, the producer zeroes rows past block_len), so a NaN there never reaches O. O is normalised
// once, in the epilogue. A tile whose row has no block writes O = 0 and LSE = -inf without
// touching Q, K or V.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: no driver call is made from here)

#include <cstdint>
#include <type_traits>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "common/problem.hpp"
#include "common/token_mask.cuh"
#include "sm90/hopper_primitives.cuh"
#include "sm90/persistent_items.cuh"  // ItemHandoff and its pieces (next_tile)
#include "sm90/tile_seq.cuh"  // TileSeq, SharedSeq, zero_tile_rows

namespace sa::sm90 {

// Everything the kernel reads; TMA descriptors first (64-byte aligned).
struct BsaFwdSm90Params {
  // Packed batches (FwdTraits::kVarlen): q [T_q, Hq, D], k / v [T_kv, Hkv, D] as dims
  // (D, T, H, 1) (batch coordinate 0), o with sb = 0, lse [Hq, T_q] (lse_stride[0] = 0), Sq = T_q,
  // Skv = T_kv and Nq = N_q_max; each tile reads its sequence from meta.cu_seqlens_q/k (TileSeq).
  CUtensorMap tma_q;  // q [B, Hq, Sq, D]: dims (D, Sq, Hq, B), box (64, kBlock, 1, 1), SW128
  CUtensorMap tma_k;  // k [B, Hkv, Skv, D]: dims (D, Skv, Hkv, B), same box
  CUtensorMap tma_v;  // v [B, Hkv, Skv, D]: dims (D, Skv, Hkv, B), same box
  Bhsd o;             // [B, Hq, Sq, D] output, 16-byte stores of rows < Sq
  float* lse;         // [B, Hq, Sq]
  int64_t lse_stride[3];
  BsaMeta meta;
  int32_t Sq, Skv, Hq, Nq;
  int32_t group;      // query heads per KV head
  int32_t num_tiles;  // B * Hq * Nq, times num_splits in split-KV mode
  float scale_log2;   // scale * log2(e)
  float masked_score; // raw score of a padded key: -inf (scale > 0) or +inf (scale < 0)
  // Split-KV mode only (FwdTraits::kSplit): num_splits >= 2 slices of each row's block list.
  int32_t num_splits;
  int32_t base_tiles;  // B * Hq * Nq
  float* o_part;       // [num_splits, B, Hq, Sq, D] fp32: each split's normalised O
  float* lse_part;     // [num_splits, B, Hq, Sq] fp32: each split's LSE (-inf: no key)
  int32_t o_part_dim;  // D (the row length of o_part)
  // Token mask (FwdTraits::kMasked instantiations only): key s visible to query i iff
  // mask_lo <= s - i <= mask_hi (BsaMeta::mask, clamped to [-S_q, S_kv]: int32). Unused by packed
  // batches (each sequence's band is TileSeq's, from BsaMeta::mask_of).
  int32_t mask_lo, mask_hi;
  // Dynamic tiles (FwdTraits::kDynamicTiles instantiations only; null: static tiles): the counter
  // the CTAs take their tiles after the first from, zeroed by the host before the launch.
  uint32_t* tile_counter;
};

// Warpgroup roles.
enum class Role : int { kProducer = 0, kConsumer0 = 1, kConsumer1 = 2 };

// Named barriers (id 0 is __syncthreads).
enum class NamedBarrier : uint32_t {
  kQueryEmpty = 1,
  kScheduleWg0 = 2,
  kScheduleWg1 = 3,
  kEpilogueWg0 = 4,
  kEpilogueWg1 = 5,
};
__device__ __forceinline__ uint32_t id(NamedBarrier b) { return static_cast<uint32_t>(b); }
__device__ __forceinline__ NamedBarrier offset(NamedBarrier b, int i) {
  return static_cast<NamedBarrier>(static_cast<uint32_t>(b) + static_cast<uint32_t>(i));
}

// wgmma atoms of M = 64, N = N, K = 16 for the 16-bit type Element: SS (both operands K-major in
// shared memory) and RS (A in registers, B MN-major).
template <int N, class Element = cutlass::bfloat16_t>
struct GmmaAtoms;
template <>
struct GmmaAtoms<64, cutlass::bfloat16_t> {
  using SS = cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                           cute::SM90::GMMA::Major::K>;
  using RS = cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,
                                                           cute::SM90::GMMA::Major::MN>;
};
template <>
struct GmmaAtoms<128, cutlass::bfloat16_t> {
  using SS = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                            cute::SM90::GMMA::Major::K>;
  using RS = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,
                                                            cute::SM90::GMMA::Major::MN>;
};
template <>
struct GmmaAtoms<64, cutlass::half_t> {
  using SS = cute::SM90::GMMA::MMA_64x64x16_F32F16F16_SS<cute::SM90::GMMA::Major::K,
                                                         cute::SM90::GMMA::Major::K>;
  using RS = cute::SM90::GMMA::MMA_64x64x16_F32F16F16_RS<cute::SM90::GMMA::Major::K,
                                                         cute::SM90::GMMA::Major::MN>;
};
template <>
struct GmmaAtoms<128, cutlass::half_t> {
  using SS = cute::SM90::GMMA::MMA_64x128x16_F32F16F16_SS<cute::SM90::GMMA::Major::K,
                                                          cute::SM90::GMMA::Major::K>;
  using RS = cute::SM90::GMMA::MMA_64x128x16_F32F16F16_RS<cute::SM90::GMMA::Major::K,
                                                          cute::SM90::GMMA::Major::MN>;
};

template <int kBlock_, int kHeadDim_, class Element_ = cutlass::bfloat16_t, bool kSplit_ = false,
          bool kMasked_ = false, bool kVarlen_ = false>
struct FwdTraits {
  using Element = Element_;  // bf16 or fp16
  static constexpr bool kSplit = kSplit_;  // split-KV mode (partial O and LSE to the workspace)
  // A token mask (BsaFwdSm90Params::mask_lo / mask_hi): listed blocks entirely outside it are
  // filtered out of the tile's list, partial stages get the band. The default instantiations
  // contain no mask code.
  static constexpr bool kMasked = kMasked_;
  static_assert(!(kSplit && kMasked), "split-KV has no masked instantiation");
  // A packed (THD) batch: each tile's sequence from cu_seqlens (TileSeq). Packed tiles walk the
  // masked kernel's filtered list with their sequence's band (a call without a mask: the band
  // [-sq, skv], which every pair passes), so kVarlen implies kMasked: one instantiation per shape
  // serves packed calls with and without a mask.
  static constexpr bool kVarlen = kVarlen_;
  static_assert(!kVarlen || kMasked, "packed tiles walk the filtered (masked) list");
  // Tiles from a counter, m descending, where the host gives one (BsaFwdSm90Params::tile_counter),
  // handed to the consumers through shared memory: the masked and packed instantiations only
  // (rows of different lengths); the default and split-KV ones keep the static loop and contain
  // none of its code.
  static constexpr bool kDynamicTiles = kMasked || kVarlen;
  static constexpr int kBlock = kBlock_;        // query rows per tile = keys per KV block
  static constexpr int kHeadDim = kHeadDim_;    // D = D_v
  // Block 64 runs in key-split mode: a stage holds two KV blocks (128 keys, so that the S GEMM,
  // the softmax and the P V GEMM work on 128 keys at a time, as at block 128), and the two
  // consumer warpgroups share the tile's 64 query rows, each taking every other stage with its
  // own softmax state; the epilogue merges the two states (the warpgroup that does not lead the
  // tile hands its own over through shared memory). Block 128: each consumer owns 64 of the 128
  // rows and every stage.
  static constexpr bool kKeySplit = kBlock == 64;
  static constexpr int kBlocksPerStage = kKeySplit ? 2 : 1;
  static constexpr int kKeys = kBlock * kBlocksPerStage;  // keys per stage: 128
  static constexpr int kConsumerWgs = 2;
  static constexpr int kMmaWgs = kKeySplit ? 1 : 2;  // warpgroups one tiled MMA spans (rows)
  static constexpr int kConsumerThreads = 128 * kConsumerWgs;
  static constexpr int kConsumerWarps = 4 * kConsumerWgs;
  static constexpr int kThreads = 128 + kConsumerThreads;
  static constexpr int kStages = 2;             // K and V ring depth
  // One CTA per SM, two consumers ping-ponging on the tensor cores (FA3-style).
  static constexpr int kCtasPerSm = 1;
  // Key-split mode: two producer warps (Q and K; V from VRing) need more than 24 registers; the
  // key-split consumers fit 232 (ptxas, session 38).
  static constexpr int kProducerRegs = kKeySplit ? 40 : 24;
  static constexpr int kConsumerRegs = kKeySplit ? 232 : 240;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <=
                    setmaxnreg_pool(kThreads, kCtasPerSm),
                "register split exceeds the CTA's register pool");
  static constexpr int kPanels = kHeadDim / 64;  // 128-byte swizzle spans of a row
  static constexpr int kTileBytes = kBlock * kHeadDim * 2;  // Q, O staging, one KV block
  static constexpr int kStageBytes = kKeys * kHeadDim * 2;  // one K or V stage
  static constexpr int kRowBytes = kHeadDim * 2;
  // Key-split mode: the fp32 values the non-lead warpgroup hands over (O, then row max and sum),
  // one column per consumer thread: 64 + 4 words per thread at D 128.
  static constexpr int kXchgWords = kKeySplit ? (64 * kHeadDim / 128 + 4) * 128 : 1;

  using BlockT = cute::Int<kBlock>;
  using KeysT = cute::Int<kKeys>;
  using HeadT = cute::Int<kHeadDim>;
  using StagesT = cute::Int<kStages>;
  using WgLayout = cute::Layout<cute::Shape<cute::Int<kMmaWgs>, cute::_1, cute::_1>>;
  // S = Q K^T: M = query rows (64 per warpgroup), N = keys, K = D; both operands K-major.
  using TiledMmaQK =
      decltype(cute::make_tiled_mma(typename GmmaAtoms<kKeys, Element>::SS{}, WgLayout{}));
  // O += P V: M = query rows, N = D, K = keys; P from registers, V N-major (D contiguous).
  using TiledMmaPV =
      decltype(cute::make_tiled_mma(typename GmmaAtoms<kHeadDim, Element>::RS{}, WgLayout{}));

  // Shared tiles, all the same physical layout: 64-column panels of 128-byte rows, 128B swizzle,
  // exactly where TMA boxes (64, kBlock) with CU_TENSOR_MAP_SWIZZLE_128B put them (a stage's
  // second KV block lands kBlock rows into each panel).
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<BlockT, HeadT>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<KeysT, HeadT, StagesT>{}));
  // V seen as the (D, keys) B operand of P V.
  using SmemLayoutVt = decltype(cute::tile_to_shape(
      cute::SM90::GMMA::Layout_MN_SW128_Atom<Element>{}, cute::Shape<HeadT, KeysT, StagesT>{},
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
};

// Key-split mode (block 64): each consumer warpgroup takes every other stage of the 2-stage ring,
// so its K and V rings are one deep; from one producer warp issuing K of stage j then V of stage
// j - 1, a warpgroup's next K (its slot free once its S GEMM retires, mid turn) would wait for the
// other stage's V (free at the end of the turn). So warp 0 issues Q and K and hands each stage's
// V loads to warp 1 through this ring of kVSlots slots, in stage order: slot i holds the stage's
// {key0[0], key0[1], info[0], info[1]} and {hk, TMA batch, last, 0} (last = 1: no more stages;
// the other words are then unused). full[i]: warp 0's lane 0 arrives after its stores (release);
// empty[i]: every lane of warp 1 arrives after its own loads (count 32: racecheck follows an
// mbarrier through the accessing thread's own arrival). Warp 1 walks no list (a second walk in
// the producer's registers spilled, session 38).
constexpr int kVSlots = 4;
template <class T, bool = T::kKeySplit>
struct VRing {
  uint32_t unused;
};
template <class T>
struct alignas(16) VRing<T, true> {
  int4 words[kVSlots][2];
  uint64_t full[kVSlots];
  uint64_t empty[kVSlots];
};

// Masked and packed kernels (kDynamicTiles): the hand-off of each CTA's next tile
// (persistent_items.cuh), read by producer warp 0 and the two consumer warpgroups (kTileWalkers;
// warp 1, which follows VRing, and the exited warps 2-3 do not take part).
template <class T, bool = T::kDynamicTiles>
struct TileHandoff {
  uint32_t unused;
};
template <class T>
struct TileHandoff<T, true> : ItemHandoff {};
template <class T>
constexpr uint32_t kTileWalkers = 32 + T::kConsumerThreads;

template <class T>
struct alignas(1024) SharedStorage {
  using Element = typename T::Element;
  Element q[T::kBlock * T::kHeadDim];
  Element k[T::kStages * T::kKeys * T::kHeadDim];
  Element v[T::kStages * T::kKeys * T::kHeadDim];
  Element o[128 * T::kHeadDim];  // epilogue staging, 64 rows per consumer warpgroup
  float xchg[T::kXchgWords];     // key-split mode: the non-lead warpgroup's softmax state
  uint64_t q_full;
  uint64_t k_full[T::kStages];
  uint64_t k_empty[T::kStages];
  uint64_t v_full[T::kStages];
  uint64_t v_empty[T::kStages];
  uint64_t v_pad;
  uint64_t xchg_full;   // key-split mode: the non-lead's 128 threads stored their state
  uint64_t xchg_empty;  // key-split mode: the lead's 128 threads loaded it
  // Packed batches: each consumer warp's copy of its tile's sequence {sq, skv, lo, hi, q0}
  // (SharedSeq, 8 words a warp, 16-byte vector accesses); one unused word otherwise (last, so that
  // no other member moves).
  alignas(16) int seq[T::kVarlen ? 8 * T::kConsumerWarps : 1];
  // Key-split mode: warp 0's hand-off of each stage's V loads to warp 1 (VRing; last, so that no
  // other member moves).
  VRing<T> vring;
  // Dynamic tiles: the next tile, from producer warp 0 to itself and the consumers (TileHandoff;
  // last, so that no other member moves).
  TileHandoff<T> tiles;
};

struct TileCoord {
  int m, h, b;
  int split;  // split-KV mode: which slice of the row's block list; else 0
};
template <class T>
__device__ __forceinline__ TileCoord tile_coord(const BsaFwdSm90Params& p, int tile) {
  TileCoord c;
  c.split = 0;
  if constexpr (T::kSplit) {
    c.split = tile / p.base_tiles;
    tile -= c.split * p.base_tiles;
  }
  c.m = tile % p.Nq;
  const int bh = tile / p.Nq;
  c.h = bh % p.Hq;
  c.b = bh / p.Hq;
  return c;
}

// ---- the CTA's walk over its tiles --------------------------------------------------------------
// Static order: tile blockIdx.x, then + gridDim.x each time (the default and split-KV kernels, and
// the masked and packed ones without a counter). Dynamic tiles: the t-th tile handed out (t =
// blockIdx.x first, then gridDim.x + the counter's next value) is tile descending_tile(t), the same
// (batch, head) with query block m = N_q - 1 - t % N_q, so that m still runs fastest, downwards.
// In the masked and packed kernels producer warp 0 hands every tile after the first to itself and
// the consumers through s.tiles (persistent_items.cuh), in either order; the consumers hold no
// counter, grid size or mode across their tile loop (each cost the block-64 kernels a spill).
__device__ __forceinline__ uint32_t descending_tile(const BsaFwdSm90Params& p, uint32_t t) {
  const uint32_t nq = static_cast<uint32_t>(p.Nq);
  const uint32_t m = t % nq;
  return t - m + (nq - 1 - m);  // < num_tiles, a multiple of N_q
}

template <class T>
__device__ __forceinline__ int first_tile(const BsaFwdSm90Params& p) {
  if constexpr (T::kDynamicTiles) {
    if (p.tile_counter != nullptr) return static_cast<int>(descending_tile(p, blockIdx.x));
  }
  return static_cast<int>(blockIdx.x);
}

// The tile after `tile` in this CTA's walk (num_tiles or more: the end); k counts the CTA's tiles
// before `tile` and is advanced here. kClaims: the producer's copy (warp 0), which publishes the
// next tile before reading it back. Every lane of the warp calls it; the result is warp-uniform.
template <class T, bool kClaims>
__device__ __forceinline__ int next_tile(const BsaFwdSm90Params& p, SharedStorage<T>& s, int tile,
                                         uint32_t& k) {
  if constexpr (T::kDynamicTiles) {
    if constexpr (kClaims) {
      const bool lane0 = threadIdx.x == 0;
      const uint32_t items = static_cast<uint32_t>(p.num_tiles);
      const uint32_t grid = grid_ctas();
      wait_item_slot(s.tiles, k);
      uint32_t next;
      if (p.tile_counter != nullptr) {
        next = counter_item(p.tile_counter, items, grid, lane0);
        if (next < items) next = descending_tile(p, next);
      } else {
        next = min(static_cast<uint32_t>(tile) + grid, items);
      }
      publish_item(s.tiles, k, next, lane0);
    }
    return static_cast<int>(handed_item(s.tiles, ++k));
  } else {
    return static_cast<int>(tile + gridDim.x);
  }
}

// The slots [lo, lo + n) of the row's block list that tile `tc` walks: all of them, or in split-KV
// mode the split's share (balanced: the splits' counts differ by at most one).
struct SlotRange {
  int lo, n;
};
template <class T>
__device__ __forceinline__ SlotRange tile_slots(const BsaFwdSm90Params& p, const TileCoord& tc) {
  const int count = p.meta.count(tc.b, tc.h, tc.m);
  if constexpr (T::kSplit) {
    if (count <= 0) return {0, 0};
    const int lo = static_cast<int>(static_cast<int64_t>(count) * tc.split / p.num_splits);
    const int hi = static_cast<int>(static_cast<int64_t>(count) * (tc.split + 1) / p.num_splits);
    return {lo, hi - lo};
  } else {
    return {0, count};
  }
}

// KV block of slot j of a tile and its valid keys: block_len (when given) clipped to the keys inside
// the tensor, S_kv - first key.
struct BlockKeys {
  int blk, valid, in_tensor;
};
template <int kBlock>
__device__ __forceinline__ BlockKeys block_keys(const BsaFwdSm90Params& p, const TileCoord& tc,
                                                int j) {
  BlockKeys k;
  k.blk = p.meta.q2k_index.at(tc.b, tc.h, tc.m, j);
  k.in_tensor = min(kBlock, p.Skv - k.blk * kBlock);
  k.valid = k.in_tensor;
  if (p.meta.kv_block_len.data != nullptr)
    k.valid = min(static_cast<int>(p.meta.kv_block_len.at(tc.b, k.blk)), k.in_tensor);
  return k;
}
// The same for the tile's sequence: packed batches count the keys inside the sequence, skv - first
// key (<= 0 for a block past its end; no kv_block_len). A dense batch's is the above (a separate
// overload rather than a default argument, which changed the dense kernels' register allocation).
template <int kBlock, class Seq>
__device__ __forceinline__ BlockKeys block_keys(const BsaFwdSm90Params& p, const TileCoord& tc,
                                                int j, const Seq& seq) {
  if constexpr (Seq::kPacked) {
    BlockKeys k;
    k.blk = p.meta.q2k_index.at(tc.b, tc.h, tc.m, j);
    k.in_tensor = min(kBlock, seq.skv(p) - k.blk * kBlock);
    k.valid = k.in_tensor;
    return k;
  } else {
    return block_keys<kBlock>(p, tc, j);
  }
}

// ---- token mask (FwdTraits::kMasked) ------------------------------------------------------------
// The filtered block list: a listed block takes part in tile tc iff some row of the tile (rows <
// S_q) sees some of its valid keys (classify_tile against the tile's rows and the block's valid
// keys is not kOutside). Producer and consumers walk the same filtered sequence in slot order,
// each deciding visibility from the metadata with this one function (no list handed over in
// shared memory), and pair it into stages the same way: stage i holds filtered entries kPer i ..
// kPer i + kPer - 1; when the filtered count is odd at block 64, the last stage's second block is
// missing (all its keys masked), as in the unmasked kernel.
template <int kBlock, class Seq>
__device__ __forceinline__ bool block_visible(const BsaFwdSm90Params& p, const TileCoord& tc,
                                              const Seq& seq, const BlockKeys& k) {
  const int r0 = tc.m * kBlock;
  const int r1 = min(r0 + kBlock, seq.sq(p)) - 1;
  const int k0 = k.blk * kBlock;
  // k0 >= 0: an entry outside the contract (a negative block) stays invisible to every walker
  // (a visible entry's last valid key is >= 0: VisibleCursor's end marker is -1).
  return k.valid > 0 && k0 >= 0 && r1 >= r0 &&
         classify_tile<int>(r0, r1, k0, k0 + k.valid - 1, seq.lo(p), seq.hi(p)) !=
             MaskClass::kOutside;
}

// A warp's cursor over the filtered list of a tile's slots [lo, lo + n): 32 slots at a time, lane
// i holding slot base + i as its last valid key (key0 + valid - 1: key0 = last & -kBlock, valid =
// (last & (kBlock - 1)) + 1, one register), `left` the lanes of the chunk not yet taken that are
// visible. Every lane of the warp calls every member (shuffles and ballots).
template <int kBlock>
struct VisibleCursor {
  int base;       // first slot of the chunk, relative to lo
  unsigned left;  // visible lanes not yet taken
  int last;       // this lane's slot: its last valid key

  template <class Seq>
  __device__ __forceinline__ void load(const BsaFwdSm90Params& p, const TileCoord& tc,
                                       const Seq& seq_in, const SlotRange& sr, int lane) {
    const auto& seq = seq_values(seq_in);
    bool vis = false;
    last = 0;
    if (base + lane < sr.n) {
      const BlockKeys bk = block_keys<kBlock>(p, tc, sr.lo + base + lane, seq);
      vis = block_visible<kBlock>(p, tc, seq, bk);
      last = bk.blk * kBlock + bk.valid - 1;
    }
    left = __ballot_sync(0xffffffffu, vis);
  }
  // Starts at the first chunk; returns the filtered count of the whole range (later chunks are
  // only counted, the first stays loaded).
  template <class Seq>
  __device__ __forceinline__ int start(const BsaFwdSm90Params& p, const TileCoord& tc,
                                       const Seq& seq, const SlotRange& sr, int lane) {
    base = 0;
    load(p, tc, seq, sr, lane);
    int n = __popc(left);
    if (sr.n > 32) {
#pragma unroll 1
      for (base = 32; base < sr.n; base += 32) {
        load(p, tc, seq, sr, lane);
        n += __popc(left);
      }
      base = 0;
      load(p, tc, seq, sr, lane);  // the first chunk again
    }
    return n;
  }
  // The next filtered entry's last valid key, or -1 past the end.
  template <class Seq>
  __device__ __forceinline__ int next(const BsaFwdSm90Params& p, const TileCoord& tc,
                                      const Seq& seq, const SlotRange& sr, int lane) {
#pragma unroll 1
    while (left == 0 && base + 32 < sr.n) {
      base += 32;
      load(p, tc, seq, sr, lane);
    }
    const int src = __ffs(left) - 1;  // -1 (no lane) past the end
    left &= left - 1;
    const int got = __shfl_sync(0xffffffffu, last, src & 31);
    return src < 0 ? -1 : got;
  }
};
template <int kBlock>
__device__ __forceinline__ int entry_key0(int last) { return last & -kBlock; }
template <int kBlock>
__device__ __forceinline__ int entry_valid(int last) {  // 0 for a missing entry (last = -1)
  return last < 0 ? 0 : (last & (kBlock - 1)) + 1;
}

// ---- producer (warp 0; key-split mode: V by warp 1, VRing) --------------------------------------
// One stage of the K/V ring as the producer fills it: kBlocksPerStage KV blocks.
template <class T>
struct KvSlot {
  int stage;
  uint32_t phase;
  int key0[T::kBlocksPerStage];  // first key (row) of each block; past S_kv for a missing block
  int info[T::kBlocksPerStage];  // valid keys, plus kPadFlag when keys past block_len lie inside
                                 // the tensor
};
constexpr int kPadFlag = 1 << 16;

template <class T>
__device__ __forceinline__ void producer_load_k(const BsaFwdSm90Params& p, SharedStorage<T>& s,
                                                const KvSlot<T>& slot, int hk, int b, int lane) {
  constexpr int kPanelElems = T::kKeys * 64;
  mbarrier_wait(&s.k_empty[slot.stage], slot.phase ^ 1);
  if (lane == 0) {
    mbarrier_arrive_expect_tx(&s.k_full[slot.stage], T::kStageBytes);
#pragma unroll
    for (int pnl = 0; pnl < T::kPanels; ++pnl)
#pragma unroll
      for (int h = 0; h < T::kBlocksPerStage; ++h)
        tma_load_4d(&p.tma_k,
                    s.k + slot.stage * T::kKeys * T::kHeadDim + pnl * kPanelElems +
                        h * T::kBlock * 64,
                    &s.k_full[slot.stage], pnl * 64, slot.key0[h], hk, b);
  }
}

template <class T>
__device__ __forceinline__ void producer_load_v(const BsaFwdSm90Params& p, SharedStorage<T>& s,
                                                const KvSlot<T>& slot, int hk, int b, int lane,
                                                uint32_t& pad_phase) {
  constexpr int kPanelElems = T::kKeys * 64;
  mbarrier_wait(&s.v_empty[slot.stage], slot.phase ^ 1);
  typename T::Element* v_stage = s.v + slot.stage * T::kKeys * T::kHeadDim;
  int pad = 0;
#pragma unroll
  for (int h = 0; h < T::kBlocksPerStage; ++h) pad |= slot.info[h] & kPadFlag;
  auto issue = [&](uint64_t* bar) {
    mbarrier_arrive_expect_tx(bar, T::kStageBytes);
#pragma unroll
    for (int pnl = 0; pnl < T::kPanels; ++pnl)
#pragma unroll
      for (int h = 0; h < T::kBlocksPerStage; ++h)
        tma_load_4d(&p.tma_v, v_stage + pnl * kPanelElems + h * T::kBlock * 64, bar, pnl * 64,
                    slot.key0[h], hk, b);
  };
  if (pad == 0) {
    if (lane == 0) issue(&s.v_full[slot.stage]);
    return;
  }
  // Keys [valid, in-tensor end) of a block are padding that TMA loads: land the stage, zero those
  // rows (whole 128-byte rows of every panel: the swizzle permutes within a row), then publish
  // the stage.
  if (lane == 0) issue(&s.v_pad);
  mbarrier_wait(&s.v_pad, pad_phase);
  pad_phase ^= 1;
#pragma unroll
  for (int h = 0; h < T::kBlocksPerStage; ++h) {
    if ((slot.info[h] & kPadFlag) == 0) continue;
    const int valid = slot.info[h] & (kPadFlag - 1);
    zero_tile_rows<T::kPanels>(v_stage, kPanelElems, h * T::kBlock + valid, T::kBlock - valid,
                               lane);
  }
  fence_proxy_async_shared();  // the zeros are read by wgmma (async proxy)
  __syncwarp();
  if (lane == 0) mbarrier_arrive(&s.v_full[slot.stage]);
}

// Key-split mode, warp 0: hands stage `slot`'s V loads to warp 1 (VRing). vc counts the stages
// handed over: slot vc % kVSlots, parity (vc / kVSlots) & 1. last = 1: no more stages.
template <class T>
__device__ __forceinline__ void vring_push(SharedStorage<T>& s, uint32_t& vc,
                                           const KvSlot<T>& slot, int hk, int tb, int last,
                                           int lane) {
  static_assert(T::kBlocksPerStage == 2, "key-split stages pair two blocks");
  const uint32_t i = vc % kVSlots;
  if (lane == 0) {
    mbarrier_wait(&s.vring.empty[i], ((vc / kVSlots) & 1) ^ 1);
    st_shared_v4(smem_u32(&s.vring.words[i][0]),
                 make_uint4(static_cast<uint32_t>(slot.key0[0]),
                            static_cast<uint32_t>(slot.key0[1]),
                            static_cast<uint32_t>(slot.info[0]),
                            static_cast<uint32_t>(slot.info[1])));
    st_shared_v4(smem_u32(&s.vring.words[i][1]),
                 make_uint4(static_cast<uint32_t>(hk), static_cast<uint32_t>(tb),
                            static_cast<uint32_t>(last), 0u));
    mbarrier_arrive(&s.vring.full[i]);  // release: the words are visible to its waiters
  }
  ++vc;
}

// Key-split mode, warp 1: the V loads of every stage warp 0 hands over, in stage order (the ring
// position advances as warp 0's does), until the last.
template <class T>
__device__ __forceinline__ void producer_v_main(const BsaFwdSm90Params& p, SharedStorage<T>& s) {
  const int lane = threadIdx.x % 32;
  if (lane == 0) prefetch_tensor_map(&p.tma_v);
  KvSlot<T> slot{};
  uint32_t pad_phase = 0;  // of v_pad
#pragma unroll 1
  for (uint32_t vc = 0;; ++vc) {
    const uint32_t i = vc % kVSlots;
    mbarrier_wait(&s.vring.full[i], (vc / kVSlots) & 1);
    const uint4 a = ld_shared_v4(smem_u32(&s.vring.words[i][0]));
    const uint4 b = ld_shared_v4(smem_u32(&s.vring.words[i][1]));
    mbarrier_arrive(&s.vring.empty[i]);  // every lane, after its own loads (count 32)
    if (b.z != 0) break;
    slot.key0[0] = static_cast<int>(a.x);
    slot.key0[1] = static_cast<int>(a.y);
    slot.info[0] = static_cast<int>(a.z);
    slot.info[1] = static_cast<int>(a.w);
    producer_load_v<T>(p, s, slot, static_cast<int>(b.x), static_cast<int>(b.y), lane, pad_phase);
    if (++slot.stage == T::kStages) {
      slot.stage = 0;
      slot.phase ^= 1;
    }
  }
}

// The Q, K and V loads of one tile under a token mask ([P1]-[P3] over the filtered list): the
// stages pair filtered entries (VisibleCursor); Q is loaded with the first stage, so that a tile
// with no visible block loads nothing, like a tile with no block (the consumers count the same
// filtered entries and write O = 0, LSE = -inf). Packed batches: the tile's sequence `seq` places
// Q rows and keys on the token axis (q0, k0); keys of a block past skv are never valid, and the
// V rows of the next sequence that its box loads are zeroed like padding (kPadFlag), so no value
// of another sequence reaches O.
template <class T, class Seq>
__device__ __forceinline__ void producer_tile_masked(const BsaFwdSm90Params& p, SharedStorage<T>& s,
                                                     const TileCoord& tc, const Seq& seq,
                                                     const SlotRange& sr, int hk, int lane,
                                                     KvSlot<T>& next, uint32_t& pad_phase,
                                                     uint32_t& vc) {
  constexpr int kBlock = T::kBlock;
  constexpr int kPer = T::kBlocksPerStage;
  VisibleCursor<kBlock> list;
  list.base = 0;
  list.load(p, tc, seq, sr, lane);
  // The ring slot of a stage from its blocks' last valid keys (the producer's registers are few:
  // a stage is kept as those, and the previous stage's ring position is derived from `next`).
  auto slot_of = [&](int last0, int last1, int stage, uint32_t phase) {
    KvSlot<T> slot;
    slot.stage = stage;
    slot.phase = phase;
#pragma unroll
    for (int h = 0; h < kPer; ++h) {
      const int last = h == 0 ? last0 : last1;
      // key0: the block's first key on the tensor's token axis (packed: + the sequence's k0).
      const int key0 = seq.k0() + entry_key0<kBlock>(last), valid = entry_valid<kBlock>(last);
      slot.key0[h] = key0;
      slot.info[h] = valid | (valid < min(kBlock, p.Skv - key0) ? kPadFlag : 0);
    }
    return slot;
  };
  int prev0 = -1, prev1 = -1;  // the previous stage's blocks (-1: none yet)
#pragma unroll 1
  while (true) {
    const int last0 = list.next(p, tc, seq, sr, lane);
    if (last0 < 0) break;
    int last1 = last0;
    if constexpr (kPer == 2) {
      // A missing second block repeats the first (see producer_main).
      last1 = list.next(p, tc, seq, sr, lane);
      if (last1 < 0) last1 = last0;
    }
    if (prev0 < 0) {
      // [P1] Q, once the consumers are done with the previous tile's Q.
      named_barrier_sync(id(NamedBarrier::kQueryEmpty), 32 + T::kConsumerThreads);
      if (lane == 0) {
        mbarrier_arrive_expect_tx(&s.q_full, T::kTileBytes);
#pragma unroll
        for (int pnl = 0; pnl < T::kPanels; ++pnl)
          tma_load_4d(&p.tma_q, s.q + pnl * kBlock * 64, &s.q_full, pnl * 64,
                      seq.q0() + tc.m * kBlock, tc.h, seq.tma_b(tc.b));
      }
    }
    // [P2] K of this stage, then V of the previous one (the ring position before `next`); key-split
    // mode: this stage's V to warp 1.
    const KvSlot<T> cur = slot_of(last0, last1, next.stage, next.phase);
    producer_load_k<T>(p, s, cur, hk, seq.tma_b(tc.b), lane);
    static_assert(T::kStages == 2, "the previous stage is the other one");
    if constexpr (T::kKeySplit) vring_push<T>(s, vc, cur, hk, seq.tma_b(tc.b), 0, lane);
    if (!T::kKeySplit && prev0 >= 0)
      producer_load_v<T>(p, s,
                         slot_of(prev0, prev1, next.stage ^ 1,
                                 next.phase ^ (next.stage == 0 ? 1u : 0u)),
                         hk, seq.tma_b(tc.b), lane, pad_phase);
    prev0 = last0;
    prev1 = last1;
    if (++next.stage == T::kStages) {
      next.stage = 0;
      next.phase ^= 1;
    }
  }
  // [P3] V of the last stage.
  if (!T::kKeySplit && prev0 >= 0)
    producer_load_v<T>(p, s,
                       slot_of(prev0, prev1, next.stage ^ 1,
                               next.phase ^ (next.stage == 0 ? 1u : 0u)),
                       hk, seq.tma_b(tc.b), lane, pad_phase);
}

template <class T>
__device__ __forceinline__ void producer_main(const BsaFwdSm90Params& p, SharedStorage<T>& s) {
  constexpr int kBlock = T::kBlock;
  constexpr int kPanelElems = kBlock * 64;
  constexpr int kPer = T::kBlocksPerStage;
  const int lane = threadIdx.x % 32;
  if (lane == 0) {
    prefetch_tensor_map(&p.tma_q);
    prefetch_tensor_map(&p.tma_k);
    prefetch_tensor_map(&p.tma_v);
  }
  KvSlot<T> next{};  // the ring position the next stage takes
  uint32_t pad_phase = 0;  // of v_pad
  [[maybe_unused]] uint32_t vc = 0;  // key-split mode: stages handed to warp 1 (vring_push)
  [[maybe_unused]] uint32_t walked = 0;  // masked and packed kernels: the tiles before this one
#pragma unroll 1
  for (int tile = first_tile<T>(p); tile < p.num_tiles;
       tile = next_tile<T, true>(p, s, tile, walked)) {
    const TileCoord tc = tile_coord<T>(p, tile);
    // Packed: the tile's sequence; a query block past its end loads nothing (nor does it read its
    // row of the metadata).
    const TileSeq<T::kVarlen> seq = TileSeq<T::kVarlen>::of(p, tc.b);
    if (seq.past_end(tc.m * kBlock)) continue;
    const SlotRange sr = tile_slots<T>(p, tc);
    const int count = sr.n;
    if (count <= 0) continue;  // the consumers write O = 0, LSE = -inf; nothing to load
    const int hk = tc.h / p.group;
    if constexpr (T::kMasked) {
      producer_tile_masked<T>(p, s, tc, seq, sr, hk, lane, next, pad_phase, vc);
      continue;
    }

    // [P1] Q, once the consumers are done with the previous tile's Q.
    named_barrier_sync(id(NamedBarrier::kQueryEmpty), 32 + T::kConsumerThreads);
    if (lane == 0) {
      mbarrier_arrive_expect_tx(&s.q_full, T::kTileBytes);
#pragma unroll
      for (int pnl = 0; pnl < T::kPanels; ++pnl)
        tma_load_4d(&p.tma_q, s.q + pnl * kPanelElems, &s.q_full, pnl * 64, tc.m * kBlock, tc.h,
                    tc.b);
    }

    // [P2] K of stage j, then V of stage j - 1: the order the consumers use them in (stage j's
    // S GEMM is issued together with stage j-1's P V GEMM; in key-split mode, stage j - 2's, by
    // the other warpgroup's turn in between). [P3] V of the last stage.
    KvSlot<T> prev{};
#pragma unroll 1
    for (int first = 0; first < count; first += 32) {
      // Lane i reads slot first + i: its KV block and valid keys.
      int blk = 0, info = 0;
      if (first + lane < count) {
        const BlockKeys bk = block_keys<kBlock>(p, tc, sr.lo + first + lane);
        blk = bk.blk;
        info = bk.valid | (bk.valid < bk.in_tensor ? kPadFlag : 0);
      }
      const int n = min(32, count - first);  // 32 is a multiple of kPer: no stage straddles
#pragma unroll 1
      for (int j = 0; j < n; j += kPer) {
        KvSlot<T> cur = next;
#pragma unroll
        for (int h = 0; h < kPer; ++h) {
          const int key0 = __shfl_sync(0xffffffffu, blk, j + h) * kBlock;
          const int inf = __shfl_sync(0xffffffffu, info, j + h);
          // A missing block (the second of a stage when the count is odd) repeats the first
          // one, padding included: the consumers mask all its keys, and its V rows are those of
          // a block this tile attends (no stale or foreign data meets a zero P).
          const bool here = j + h < n;
          cur.key0[h] = here ? key0 : cur.key0[0];
          cur.info[h] = here ? inf : cur.info[0];
        }
        producer_load_k<T>(p, s, cur, hk, tc.b, lane);
        if constexpr (T::kKeySplit) vring_push<T>(s, vc, cur, hk, tc.b, 0, lane);
        else if (first + j > 0) producer_load_v<T>(p, s, prev, hk, tc.b, lane, pad_phase);
        prev = cur;
        if (++next.stage == T::kStages) {
          next.stage = 0;
          next.phase ^= 1;
        }
      }
    }
    if constexpr (!T::kKeySplit) producer_load_v<T>(p, s, prev, hk, tc.b, lane, pad_phase);
  }
  if constexpr (T::kKeySplit) vring_push<T>(s, vc, next, 0, 0, 1, lane);  // no more stages
}

// ---- consumer helpers ---------------------------------------------------------------------------
// Split-KV mode: row `row0` of tile tc's split in the partial O ([split, b, h, row, D] fp32) and
// partial LSE ([split, b, h, row]) of the workspace.
__device__ __forceinline__ int64_t split_row_index(const BsaFwdSm90Params& p, const TileCoord& tc,
                                                   int row0) {
  return ((static_cast<int64_t>(tc.split) * (p.base_tiles / p.Nq) + tc.b * p.Hq + tc.h) * p.Sq +
          row0);
}
__device__ __forceinline__ float* split_o_rows(const BsaFwdSm90Params& p, const TileCoord& tc,
                                               int row0) {
  return p.o_part + split_row_index(p, tc, row0) * (p.o_part_dim);
}
__device__ __forceinline__ float* split_lse_rows(const BsaFwdSm90Params& p, const TileCoord& tc,
                                                 int row0) {
  return p.lse_part + split_row_index(p, tc, row0);
}

// Issues one warpgroup GEMM C (+)= A B over the whole K extent and commits it as one group; does
// not wait. kZeroInit: C = A B.
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_issue(TiledMma& mma, TA& a, const TB& b, TC& c) {
  using namespace cute;
  constexpr bool kRegA =
      !cute::is_base_of<cute::SM90::GMMA::DescriptorIterator, typename TiledMma::FrgTypeA>::value;
  if constexpr (kRegA) warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? SM90::GMMA::ScaleOut::Zero : SM90::GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = SM90::GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kRegA) warpgroup_fence_operand(a);
}


// Accumulator fragments of a 64 x N wgmma tile (per thread, linear register index i):
//   row = 16 * warp_in_warpgroup + lane / 4 + 8 * ((i / 2) % 2)   -> "row slot" r = (i / 2) % 2
//   col = 8 * (i / 4) + 2 * (lane % 4) + i % 2
// The register order of one 16-column slice is also that of a wgmma A fragment (k16), so P
// converts to the A operand of P V element by element.
// The keys of a stage past each KV block's valid count get the losing score: block h of the stage
// holds columns [h kBlock, (h + 1) kBlock) (valid1 is unused with one block per stage).
template <int kBlock, class Frag>
__device__ __forceinline__ void mask_columns(Frag& s, int valid0, int valid1, float masked) {
  const int col0 = 2 * (threadIdx.x % 4);
  CUTE_UNROLL
  for (int i = 0; i < cute::size(s); ++i) {
    const int h = 8 * (i / 4) / kBlock;  // a compile-time constant per i
    if (8 * (i / 4) - h * kBlock + col0 + (i % 2) >= (h == 0 ? valid0 : valid1)) s(i) = masked;
  }
}
// Online softmax state of a thread's two rows (log2 domain: row_max is max of s * scale_log2).
struct RowStats {
  float row_max[2];
  float row_sum[2];  // this thread's share; quad-reduced in the epilogue
};

// Scores in s become probabilities 2^(s * scale_log2 - m_new); returns alpha[r] =
// 2^(m_old - m_new), the factor for what O holds (0 on a row's first keys, 1 when unchanged).
template <class Frag>
__device__ __forceinline__ void online_softmax(Frag& s, RowStats& st, float scale_log2,
                                               float (&alpha)[2]) {
  constexpr int kN = cute::size(Frag{});
  // Row extremes of the raw scores, 4 independent chains per row.
  float e[2][4];
  if (scale_log2 > 0.f) {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r)
      CUTE_UNROLL
      for (int c = 0; c < 4; ++c) e[r][c] = -INFINITY;
    CUTE_UNROLL
    for (int i = 0; i < kN; ++i) {
      float& x = e[(i / 2) % 2][(i % 2) + 2 * ((i / 4) % 2)];
      x = fmaxf(x, s(i));
    }
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r)
      e[r][0] = quad_max(fmaxf(fmaxf(e[r][0], e[r][1]), fmaxf(e[r][2], e[r][3])));
  } else {
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r)
      CUTE_UNROLL
      for (int c = 0; c < 4; ++c) e[r][c] = INFINITY;
    CUTE_UNROLL
    for (int i = 0; i < kN; ++i) {
      float& x = e[(i / 2) % 2][(i % 2) + 2 * ((i / 4) % 2)];
      x = fminf(x, s(i));
    }
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r)
      e[r][0] = quad_min(fminf(fminf(e[r][0], e[r][1]), fminf(e[r][2], e[r][3])));
  }
  float neg_m[2];
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(st.row_max[r], e[r][0] * scale_log2);
    // A row that has seen no key yet keeps max -inf: subtract 0 so that masked scores give
    // 2^-inf = 0 rather than NaN.
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    alpha[r] = exp2_approx(st.row_max[r] - m_use);
    st.row_max[r] = m_new;
    neg_m[r] = -m_use;
  }
  float sum[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
  CUTE_UNROLL
  for (int i = 0; i < kN; ++i) {
    const int r = (i / 2) % 2;
    const float pr = exp2_approx(fmaf(s(i), scale_log2, neg_m[r]));
    s(i) = pr;
    sum[r][i % 2] += pr;
  }
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) st.row_sum[r] = st.row_sum[r] * alpha[r] + (sum[r][0] + sum[r][1]);
}

template <class FragS, class FragP>
__device__ __forceinline__ void convert_p(const FragS& s, FragP& p) {
  using Element = typename FragP::value_type;
  auto p32 = cute::recast<uint32_t>(p);
  CUTE_UNROLL
  for (int j = 0; j < cute::size(p32); ++j) p32(j) = pack_x2<Element>(s(2 * j), s(2 * j + 1));
}

// Element i (a constant once unrolled) of a 16-bit register fragment that convert_p packed, as
// fp32. bf16: from its 32-bit word by a shift or a mask (the exact widening), so that ptxas keeps
// the packed words and splits no 16-bit halves out of them (PRMT); fp16: the conversion.
template <class FragP>
__device__ __forceinline__ float packed_elem_f32(const FragP& p, int i) {
  using Element = typename FragP::value_type;
  if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
    const uint32_t w = cute::recast<const uint32_t>(p)(i / 2);
    return __uint_as_float(i % 2 == 0 ? w << 16 : w & 0xffff0000u);
  } else {
    return static_cast<float>(p(i));
  }
}

template <class FragO>
__device__ __forceinline__ void scale_rows(FragO& o, const float (&f)[2]) {
  CUTE_UNROLL
  for (int i = 0; i < cute::size(o); ++i) o(i) *= f[(i / 2) % 2];
}

// ---- consumers ----------------------------------------------------------------------------------
template <class T>
__device__ __forceinline__ void consumer_main(const BsaFwdSm90Params& p, SharedStorage<T>& s,
                                              int wg) {
  using namespace cute;
  using Element = typename T::Element;
  using BlockT = typename T::BlockT;
  using KeysT = typename T::KeysT;
  using HeadT = typename T::HeadT;
  constexpr int kBlock = T::kBlock;
  constexpr int kHeadDim = T::kHeadDim;
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks of an O row
  constexpr bool kKeySplit = T::kKeySplit;
  constexpr int kPer = T::kBlocksPerStage;
  constexpr int kStep = kKeySplit ? 2 : 1;  // stages between two of this warpgroup's

  const int ctid = threadIdx.x - 128;  // 0 .. kConsumerThreads - 1
  const int wtid = ctid % 128;         // within the warpgroup
  const int lane = threadIdx.x % 32;
  const int warp_in_wg = wtid / 32;

  typename T::TiledMmaQK mma_qk;
  typename T::TiledMmaPV mma_pv;
  // Key-split mode: each warpgroup's MMAs span the tile's 64 rows; else rows 64 wg + (0..63).
  auto thr_qk = mma_qk.get_thread_slice(kKeySplit ? wtid : ctid);
  auto thr_pv = mma_pv.get_thread_slice(kKeySplit ? wtid : ctid);
  Tensor sQ = make_tensor(make_smem_ptr(s.q), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(s.k), typename T::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(s.v), typename T::SmemLayoutVt{});
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // descriptors (MMA, 1, D/16)
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // descriptors (MMA, 1, D/16, stages)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // descriptors (MMA, 1, kKeys/16, stages)
  Tensor tSrS = partition_fragment_C(mma_qk, Shape<BlockT, KeysT>{});  // fp32 ((2,2,kKeys/8),1,1)
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<BlockT, HeadT>{});  // fp32 ((2,2,D/8),1,1)
  Tensor tOrP = make_tensor<Element>(partition_shape_A(mma_pv, Shape<BlockT, KeysT>{}));
  static_assert(decltype(size(tOrP))::value == decltype(size(tSrS))::value);
  constexpr int kOWords = decltype(size(tOrO))::value;

  const float scale_log2 = p.scale_log2;
  const float masked = p.masked_score;
  const NamedBarrier my_schedule = offset(NamedBarrier::kScheduleWg0, wg);
  const NamedBarrier other_schedule = offset(NamedBarrier::kScheduleWg0, 1 - wg);
  const NamedBarrier my_epilogue = offset(NamedBarrier::kEpilogueWg0, wg);
  // Consumer warps release a stage with one arrive each (after their wgmma wait).
  const bool releaser = lane == 0;

  // The producer may load the first Q; consumer 0 may issue first.
  named_barrier_arrive(id(NamedBarrier::kQueryEmpty), 32 + T::kConsumerThreads);
  if (wg == 0) named_barrier_arrive(id(NamedBarrier::kScheduleWg0), 256);

  int stage = 0;
  uint32_t phase = 0;     // the ring cursor ("full" barriers): this warpgroup's next stage
  uint32_t pos_base = 0;  // key-split mode: ring position of the tile's first stage
  uint32_t q_phase = 0;   // of q_full
  uint32_t xchg_phase = 0;  // key-split mode: of xchg_full (the lead) / xchg_empty (the other)
  // Key-split mode: the tile's lead warpgroup takes its stage 0, merges and writes the tile; the
  // lead alternates over the tiles that have blocks, so that the next tile's lead (this tile's
  // other warpgroup) starts its stages while this tile's lead merges and writes.
  int lead_wg = 0;
  uint8_t* s_o = reinterpret_cast<uint8_t*>(s.o) + wg * 64 * T::kRowBytes;

  [[maybe_unused]] uint32_t walked = 0;  // masked and packed kernels: the tiles before this one

#pragma unroll 1
  for (int tile = first_tile<T>(p); tile < p.num_tiles;
       tile = next_tile<T, false>(p, s, tile, walked)) {
    const TileCoord tc = tile_coord<T>(p, tile);
    // Packed: the tile's sequence, its values in this warp's words in shared memory (SharedSeq;
    // dense batches read the params). A query block past the sequence's end reads no metadata
    // and runs as a tile without blocks that has no row to write ([C0]; a `continue` here instead
    // cost the block-64 D-128 consumer a 76-byte spill).
    const TileSeq<T::kVarlen> tseq = TileSeq<T::kVarlen>::of(p, tc.b);
    const bool past_end = tseq.past_end(tc.m * kBlock);
    const auto seq = [&] {
      if constexpr (T::kVarlen) {
        const SharedSeq words{smem_u32(s.seq) - 32 * 4};
        __syncwarp();  // the warp's lanes are done with the previous tile's words
        if (lane == 0) words.store(tseq);
        __syncwarp();
        return words;
      } else {
        return tseq;
      }
    }();
    const SlotRange sr = past_end ? SlotRange{0, 0} : tile_slots<T>(p, tc);
    // Under a token mask: the filtered list (this warp's cursor over it, VisibleCursor).
    VisibleCursor<kBlock> list;
    int count = sr.n;
    if constexpr (T::kMasked) count = list.start(p, tc, seq, sr, lane);
    // Key-split mode: both warpgroups work on the tile's 64 rows and the tile's lead writes them.
    const int row0 = tc.m * kBlock + (kKeySplit ? 0 : wg * 64);  // first query row written
    const int tile_lead = lead_wg;
    if (count > 0) lead_wg ^= 1;
    const bool writer = !kKeySplit || wg == tile_lead;
    Element* o_head =
        static_cast<Element*>(p.o.data) + tc.b * p.o.sb + tc.h * p.o.sh;  // row 0, d 0
    float* lse_head = p.lse + tc.b * p.lse_stride[0] + tc.h * p.lse_stride[1];
    // Packed: row 0 of the sequence (sb = lse_stride[0] = 0), added where rows are written.
    auto to_sequence_rows = [&] {
      if constexpr (T::kVarlen) {
        const int64_t q0 = seq.q0();
        o_head += q0 * p.o.ss;
        lse_head += q0 * p.lse_stride[2];
      }
    };

    if (count <= 0) {
      if (!writer) continue;
      if constexpr (T::kSplit) {
        // [C0'] No block in this split: its partial O = 0, LSE = -inf (the combine weighs it 0).
        float* o_rows = split_o_rows(p, tc, row0);
        float* lse_rows = split_lse_rows(p, tc, row0);
        for (int idx = wtid; idx < 64 * (kHeadDim / 4); idx += 128) {
          const int r = idx / (kHeadDim / 4), c = idx % (kHeadDim / 4);
          if (row0 + r < p.Sq)
            *reinterpret_cast<float4*>(o_rows + static_cast<int64_t>(r) * kHeadDim + 4 * c) =
                make_float4(0.f, 0.f, 0.f, 0.f);
        }
        if (wtid < 64 && row0 + wtid < p.Sq) lse_rows[wtid] = -INFINITY;
      } else {
        // [C0] No block: O = 0, LSE = -inf for the rows < S_q.
        if (past_end) continue;
        to_sequence_rows();
        const auto& rows = seq_values(seq);  // rows < rows.sq(p) are written
#pragma unroll
        for (int it = 0; it < 64 * kChunks / 128; ++it) {
          const int idx = it * 128 + wtid;
          const int r = idx / kChunks, c = idx % kChunks;
          if (row0 + r < rows.sq(p))
            *reinterpret_cast<uint4*>(o_head + (row0 + r) * p.o.ss + c * 8) =
                make_uint4(0u, 0u, 0u, 0u);
        }
        if (wtid < 64 && row0 + wtid < rows.sq(p))
          lse_head[(row0 + wtid) * p.lse_stride[2]] = -INFINITY;
      }
      continue;
    }

    // This warpgroup's stages of the tile: i = first, first + kStep, ... < n_stages (a stage
    // holds the KV blocks of slots kPer i .. kPer i + kPer - 1).
    const int n_stages = (count + kPer - 1) / kPer;
    const int first = kKeySplit ? (writer ? 0 : 1) : 0;
    const int n_mine = kKeySplit ? (n_stages - first + 1) / 2 : n_stages;
    if constexpr (kKeySplit) {
      // The ring cursor at this warpgroup's first stage of the tile (with two stages, its every
      // other stage is always the same one, one phase later).
      static_assert(T::kStages == 2, "key-split mode: a warpgroup's stages are 2 apart");
      stage = static_cast<int>((pos_base + first) % 2);
      phase = ((pos_base + first) / 2) & 1u;
      pos_base += static_cast<uint32_t>(n_stages);
    }
    auto advance = [&] {
      if constexpr (kKeySplit) {
        phase ^= 1u;
      } else if (++stage == T::kStages) {
        stage = 0;
        phase ^= 1u;
      }
    };
    // Valid keys of stage i's blocks (a missing second block has none). Under a token mask, the
    // stage's next filtered entries instead, as their last valid keys (entry_key0 / entry_valid;
    // -1: missing): called once per stage of this warpgroup, in order; in key-split mode it then
    // passes over the other warpgroup's stage i + 1.
    auto stage_valid = [&](int i, int& v0, int& v1) {
      if constexpr (T::kMasked) {
        v0 = list.next(p, tc, seq, sr, lane);
        v1 = v0;
        if constexpr (kPer == 2) {
          v1 = list.next(p, tc, seq, sr, lane);
          list.next(p, tc, seq, sr, lane);
          list.next(p, tc, seq, sr, lane);
        }
      } else {
        v0 = block_keys<kBlock>(p, tc, sr.lo + kPer * i).valid;
        v1 = kBlock;
        if constexpr (kPer == 2)
          v1 = 2 * i + 1 < count ? block_keys<kBlock>(p, tc, sr.lo + 2 * i + 1).valid : 0;
      }
    };
    if constexpr (T::kMasked && kKeySplit) {
      if (first == 1) {  // stage 0 is the lead's
        list.next(p, tc, seq, sr, lane);
        list.next(p, tc, seq, sr, lane);
      }
    }
    // [C1b] / [C2b] The keys of a stage past each block's valid count get the losing score; under
    // a token mask, a stage that the band cuts for this warp's 16 rows (or with padded keys) gets
    // the band and the valid counts per element (mask_band), one that lies inside it nothing.
    auto mask_stage = [&](int v0, int v1) {
      if constexpr (T::kMasked) {
        const auto& seq_v = seq_values(seq);
        const int rb = row0 + 16 * warp_in_wg;  // this warp's first row
        const int re = min(rb + 15, seq_v.sq(p) - 1);
        // A full block (last valid key = key0 + kBlock - 1) inside the band for these rows.
        auto inside = [&](int last) {
          return last >= 0 && (last & (kBlock - 1)) == kBlock - 1 &&
                 classify_tile<int>(rb, re, last - (kBlock - 1), last, seq_v.lo(p), seq_v.hi(p)) ==
                     MaskClass::kInside;
        };
        bool all_inside = re >= rb && inside(v0);
        if constexpr (kPer == 2) all_inside = all_inside && inside(v1);
        if (!all_inside) {
          // Block h of the stage is columns [h kBlock, (h + 1) kBlock): fragment words
          // [h kBlock / 2, (h + 1) kBlock / 2), an mma-ordered [1][kBlock / 8][4] array.
          using BlockFrag = float[1][kBlock / 8][4];
          mask_band(*reinterpret_cast<BlockFrag*>(&tSrS(0)), entry_key0<kBlock>(v0) - rb,
                    seq_v.lo(p), seq_v.hi(p), entry_valid<kBlock>(v0), masked);
          if constexpr (kPer == 2)
            mask_band(*reinterpret_cast<BlockFrag*>(&tSrS(kBlock / 2)),
                      entry_key0<kBlock>(v1) - rb, seq_v.lo(p), seq_v.hi(p),
                      entry_valid<kBlock>(v1), masked);
        }
      } else {
        if (v0 < kBlock || v1 < kBlock) mask_columns<kBlock>(tSrS, v0, v1, masked);
      }
    };

    RowStats st;
    st.row_max[0] = st.row_max[1] = -INFINITY;
    st.row_sum[0] = st.row_sum[1] = 0.f;
    float alpha[2];

    if (n_mine == 0) {
      // Key-split mode, the non-lead warpgroup of a one-stage tile: no keys (an empty state,
      // weighed 0). It still waits for the tile's Q before releasing it: an arrive for this tile
      // must not land in the previous tile's kQueryEmpty phase (a warpgroup that waits on nothing
      // would run ahead through several such tiles).
      mbarrier_wait(&s.q_full, q_phase);
      q_phase ^= 1;
      named_barrier_arrive(id(NamedBarrier::kQueryEmpty), 32 + T::kConsumerThreads);
      clear(tOrO);
    } else {
      // [C1] First stage: S = Q K^T, softmax, P.
      mbarrier_wait(&s.q_full, q_phase);
      q_phase ^= 1;
      int valid0, valid1;
      stage_valid(first, valid0, valid1);  // used after the S GEMM: latency hidden
      mbarrier_wait(&s.k_full[stage], phase);
      gemm_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      if (releaser) mbarrier_arrive(&s.k_empty[stage]);
      if (n_mine == 1)
        named_barrier_arrive(id(NamedBarrier::kQueryEmpty), 32 + T::kConsumerThreads);
      mask_stage(valid0, valid1);
      online_softmax(tSrS, st, scale_log2, alpha);
      convert_p(tSrS, tOrP);
      clear(tOrO);
      int v_stage = stage;
      uint32_t v_phase = phase;
      advance();

      // [C2] Stage j >= 1 of this warpgroup: S_j = Q K_j^T and O += P_{j-1} V_{j-1} issued
      // together; the softmax of S_j runs while the P V GEMM does.
#pragma unroll 1
      for (int j = 1; j < n_mine; ++j) {
        stage_valid(first + j * kStep, valid0, valid1);
        mbarrier_wait(&s.k_full[stage], phase);
        named_barrier_sync(id(my_schedule), 256);
        gemm_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, stage), tSrS);
        mbarrier_wait(&s.v_full[v_stage], v_phase);
        gemm_issue<false>(mma_pv, tOrP, tOrV(_, _, _, v_stage), tOrO);
        named_barrier_arrive(id(other_schedule), 256);
        warpgroup_wait<1>();  // S_j is ready
        warpgroup_fence_operand(tSrS);
        if (releaser) mbarrier_arrive(&s.k_empty[stage]);
        if (j == n_mine - 1)
          named_barrier_arrive(id(NamedBarrier::kQueryEmpty), 32 + T::kConsumerThreads);
        mask_stage(valid0, valid1);
        online_softmax(tSrS, st, scale_log2, alpha);
        warpgroup_wait<0>();  // P_{j-1} V_{j-1} is done: V stage and P registers are free
        warpgroup_fence_operand(tOrO);
        warpgroup_fence_operand(tOrP);
        if (releaser) mbarrier_arrive(&s.v_empty[v_stage]);
        convert_p(tSrS, tOrP);
        scale_rows(tOrO, alpha);
        v_stage = stage;
        v_phase = phase;
        advance();
      }

      // [C3] Last P V.
      mbarrier_wait(&s.v_full[v_stage], v_phase);
      gemm_issue<false>(mma_pv, tOrP, tOrV(_, _, _, v_stage), tOrO);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      if (releaser) mbarrier_arrive(&s.v_empty[v_stage]);
    }

    if constexpr (kKeySplit) {
      // The schedule token goes to the next tile's lead (this tile's other warpgroup). It starts
      // the tile with the lead, and the tile's [C2] turns alternate from the lead: n_stages - 2
      // of them (none for one stage). An odd count leaves it with the other warpgroup; after an
      // even count the lead passes it with an empty turn.
      if (writer && (n_stages % 2 == 0 || n_stages == 1)) {
        named_barrier_sync(id(my_schedule), 256);
        named_barrier_arrive(id(other_schedule), 256);
      }
      // [C4a] Merge: the other warpgroup hands its O, row maxima and sums (one word column per
      // thread: the two warpgroups' fragments have the same layout) to the lead, which weighs the
      // two states by 2^(m_w - m) with m the larger maximum (an empty row keeps m = -inf: both
      // weights 0). Every thread arrives on the mbarrier after its own accesses (xchg_full after
      // its stores, xchg_empty after its loads), so the other warpgroup goes on to lead the next
      // tile without waiting for the merge. Word k of this thread at x + 512 k.
      const uint32_t x = smem_u32(s.xchg) + 4 * wtid;
      if (!writer) {
        mbarrier_wait(&s.xchg_empty, xchg_phase ^ 1);  // the previous tile's state was read
        CUTE_UNROLL
        for (int i = 0; i < kOWords; ++i) st_shared_u32(x + 512 * i, __float_as_uint(tOrO(i)));
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
          st_shared_u32(x + 512 * (kOWords + r), __float_as_uint(st.row_max[r]));
          st_shared_u32(x + 512 * (kOWords + 2 + r), __float_as_uint(st.row_sum[r]));
        }
        mbarrier_arrive(&s.xchg_full);
        xchg_phase ^= 1;
        continue;
      }
      mbarrier_wait(&s.xchg_full, xchg_phase);
      {
        float f0[2], f1[2];
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
          const float m1 = ld_shared_f32(x + 512 * (kOWords + r));
          const float l1 = ld_shared_f32(x + 512 * (kOWords + 2 + r));
          const float m = fmaxf(st.row_max[r], m1);
          const float m_use = m == -INFINITY ? 0.f : m;
          f0[r] = exp2_approx(st.row_max[r] - m_use);
          f1[r] = exp2_approx(m1 - m_use);
          st.row_max[r] = m;
          st.row_sum[r] = st.row_sum[r] * f0[r] + l1 * f1[r];
        }
        CUTE_UNROLL
        for (int i = 0; i < kOWords; ++i) {
          const int r = (i / 2) % 2;
          tOrO(i) = tOrO(i) * f0[r] + ld_shared_f32(x + 512 * i) * f1[r];
        }
      }
      mbarrier_arrive(&s.xchg_empty);
      xchg_phase ^= 1;
    }

    // [C4] Epilogue: O / rowsum -> 16-bit -> staging smem (16-byte chunks XOR-swizzled by row) ->
    // 16-byte stores of the rows < S_q; LSE = (m + log2(rowsum)) * ln 2.
    float inv[2], lse[2];
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float sum = quad_sum(st.row_sum[r]);
      const bool any = sum > 0.f;
      inv[r] = any ? 1.f / sum : 0.f;
      lse[r] = any ? (st.row_max[r] + __log2f(sum)) * 0.69314718055994531f : -INFINITY;
    }
    const int frag_row = 16 * warp_in_wg + lane / 4;
    if constexpr (T::kSplit) {
      // [C4'] The split's normalised O in fp32 straight from the fragments (8-byte pairs) and its
      // LSE, rows < S_q; no staging.
      float* o_rows = split_o_rows(p, tc, row0);
      float* lse_rows = split_lse_rows(p, tc, row0);
      CUTE_UNROLL
      for (int i = 0; i < size(tOrO); i += 2) {
        const int r = (i / 2) % 2;
        const int row = frag_row + 8 * r;
        if (row0 + row < p.Sq)
          *reinterpret_cast<float2*>(o_rows + static_cast<int64_t>(row) * kHeadDim + 8 * (i / 4) +
                                     2 * (lane % 4)) =
              make_float2(tOrO(i) * inv[r], tOrO(i + 1) * inv[r]);
      }
      if (lane % 4 == 0) {
        CUTE_UNROLL
        for (int r = 0; r < 2; ++r) {
          const int row = frag_row + 8 * r;
          if (row0 + row < p.Sq) lse_rows[row] = lse[r];
        }
      }
      continue;
    }
    named_barrier_sync(id(my_epilogue), 128);  // the previous tile's copy-out has read s_o
    to_sequence_rows();
    const auto& rows = seq_values(seq);  // rows < rows.sq(p) are written
    CUTE_UNROLL
    for (int i = 0; i < size(tOrO); i += 2) {
      const int r = (i / 2) % 2;
      const int row = frag_row + 8 * r;
      const int chunk = i / 4;  // 8 columns per chunk
      const uint32_t packed = pack_x2<Element>(tOrO(i) * inv[r], tOrO(i + 1) * inv[r]);
      *reinterpret_cast<uint32_t*>(s_o + row * T::kRowBytes + ((chunk ^ (row & 7)) << 4) +
                                   4 * (lane % 4)) = packed;
    }
    if (lane % 4 == 0) {
      CUTE_UNROLL
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + frag_row + 8 * r;
        if (row < rows.sq(p)) lse_head[row * p.lse_stride[2]] = lse[r];
      }
    }
    named_barrier_sync(id(my_epilogue), 128);
    // Masked and packed: the copy-out's thread index made opaque here, so that its per-thread row
    // addresses are formed in the epilogue instead of being hoisted out of the tile loop (held
    // through the mainloop, the block-64 D-128 consumer spilled them: packed since session 37,
    // masked under nvcc 13.0 before session 47, both with the tile hand-off's state).
    int out_tid = wtid;
    if constexpr (T::kMasked) asm volatile("" : "+r"(out_tid));
#pragma unroll
    for (int it = 0; it < 64 * kChunks / 128; ++it) {
      const int idx = it * 128 + out_tid;
      const int r = idx / kChunks, c = idx % kChunks;
      if (row0 + r < rows.sq(p)) {
        const uint4 chunk =
            *reinterpret_cast<const uint4*>(s_o + r * T::kRowBytes + ((c ^ (r & 7)) << 4));
        *reinterpret_cast<uint4*>(o_head + (row0 + r) * p.o.ss + c * 8) = chunk;
      }
    }
  }
}

// ---- kernel -------------------------------------------------------------------------------------
template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kCtasPerSm)
    bsa_forward_sm90_kernel(const __grid_constant__ BsaFwdSm90Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  SharedStorage<T>& s = aligned_shared_storage<SharedStorage<T>>(smem_raw);

  if (threadIdx.x == 0) {
    mbarrier_init(&s.q_full, 1);
    mbarrier_init(&s.v_pad, 1);
    mbarrier_init(&s.xchg_full, 128);
    mbarrier_init(&s.xchg_empty, 128);
#pragma unroll
    for (int i = 0; i < T::kStages; ++i) {
      mbarrier_init(&s.k_full[i], 1);
      mbarrier_init(&s.v_full[i], 1);
      // Key-split mode: a stage is read by one consumer warpgroup.
      mbarrier_init(&s.k_empty[i], T::kKeySplit ? 4 : T::kConsumerWarps);
      mbarrier_init(&s.v_empty[i], T::kKeySplit ? 4 : T::kConsumerWarps);
    }
    if constexpr (T::kKeySplit) {
#pragma unroll
      for (int i = 0; i < kVSlots; ++i) {
        mbarrier_init(&s.vring.full[i], 1);
        mbarrier_init(&s.vring.empty[i], 32);
      }
    }
    if constexpr (T::kDynamicTiles) item_handoff_init(s.tiles, kTileWalkers<T>);
    fence_mbarrier_init();
  }
  __syncthreads();

  const Role role = static_cast<Role>(__shfl_sync(0xffffffffu, threadIdx.x / 128, 0));
  if (role == Role::kProducer) {
    setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x < 32) {
      producer_main<T>(p, s);
    } else if constexpr (T::kKeySplit) {
      if (threadIdx.x < 64) producer_v_main<T>(p, s);
    }
  } else {
    setmaxnreg_inc<T::kConsumerRegs>();
    consumer_main<T>(p, s, static_cast<int>(role) - static_cast<int>(Role::kConsumer0));
  }
#endif
}

}  // namespace sa::sm90
