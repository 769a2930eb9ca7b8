// Tile shapes and shared-memory layout of the portable (sm80+) attention kernels.
//
// A CTA owns kBlockM query rows and walks key/value tiles of kBlockN = 64 keys. Its 4 warps split
// the rows: warp w owns rows [w * kWarpRows, (w + 1) * kWarpRows), i.e. kMTiles m16 tiles. With
// kBlockM = 128 a warp holds 32 rows (the FlashAttention-2 shape: every K/V fragment it loads
// from shared memory feeds two MMAs).
//
// Shared memory holds tiles of rows of kHeadDim 16-bit elements, row-major, in 16-byte chunks
// that are XOR-swizzled by the row: chunk c of row r is stored at chunk c ^ (r % 8). Eight
// consecutive rows at the same logical chunk then hit eight different bank groups, so cp.async
// stores (8 lanes per 128 bytes of a row), ldmatrix and ldmatrix.trans (8 rows per matrix) are all
// free of bank conflicts.
#pragma once

#include <cstdint>

namespace sa::portable {

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of `kRowBytes`-byte rows.
template <int kRowBytes>
__host__ __device__ __forceinline__ uint32_t swizzled_offset(int row, int chunk) {
  static_assert(kRowBytes % 128 == 0, "rows must span whole 128-byte bank lines");
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

template <int kBlockM_, int kHeadDim_, class Element_>
struct FwdKernelTraits {
  using Element = Element_;
  static constexpr int kBlockM = kBlockM_;    // query rows per CTA
  static constexpr int kBlockN = 64;          // keys per K/V tile
  static constexpr int kHeadDim = kHeadDim_;  // D == D_v
  static constexpr int kNWarps = 4;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kWarpRows = kBlockM / kNWarps;
  static constexpr int kMTiles = kWarpRows / 16;     // m16 tiles per warp
  // Keys per online-softmax step. 32-row warps with D = 128 hold 128 fp32 O accumulators; 64
  // fp32 scores on top of them leave too few registers (ptxas spilled), so they take each 64-key
  // tile as two 32-key steps.
  static constexpr int kSubN = (kMTiles == 2 && kHeadDim == 128) ? 32 : kBlockN;
  static constexpr int kSTiles = kSubN / 8;          // n8 tiles of S = Q K^T per m16 tile
  static constexpr int kOTiles = kHeadDim / 8;       // n8 tiles of O per m16 tile
  static constexpr int kQkSteps = kHeadDim / 16;     // k16 steps of Q K^T
  static constexpr int kPvSteps = kSubN / 16;        // k16 steps of P V
  static constexpr int kStages = 2;                  // K/V tiles in flight

  // Global <-> shared copies: 16-byte chunks, consecutive threads along a row.
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kRowChunks = kRowBytes / 16;
  static constexpr int kCopyRowsPerPass = kNThreads / kRowChunks;

  // Shared memory: Q tile (reused to stage O), kStages K tiles, kStages V tiles, then the block
  // list chunk (kListChunk first keys, then their key counts, int32), the per-warp counts of its
  // compaction (kNWarps int32), the number staged and the next slot to stage (int32 each), then
  // the CTA's sequence (CtaSeq, six int32).
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kKvTileBytes = kBlockN * kRowBytes;
  static constexpr int kListChunk = kNThreads;
  static constexpr int kListOffset = kQBytes + 2 * kStages * kKvTileBytes;
  static constexpr int kSeqOffset = kListOffset + 2 * kListChunk * 4 + (kNWarps + 2) * 4;
  static constexpr int kSmemBytes = kSeqOffset + 6 * 4;

  static_assert(sizeof(Element) == 2, "16-bit elements");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kBlockM == 64 || kBlockM == 128, "64 or 128 query rows");
  static_assert(kWarpRows % 16 == 0, "whole m16 tiles per warp");
  static_assert(kCopyRowsPerPass % 8 == 0, "a thread's copy rows share one swizzle phase");
  static_assert(kBlockN % kCopyRowsPerPass == 0 && kBlockM % kCopyRowsPerPass == 0,
                "whole copy passes per tile");
};

}  // namespace sa::portable
