// Top-k over dense indexer scores (SPEC 5's selection), one CTA per query row: the second pass of
// the two-pass top-k (scores into a workspace, then this), shared by the CUDA paths. Host side;
// the kernel is in indexer_topk_rows.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/indexer_problem.hpp"

namespace sa::portable::indexer {

struct TopkRowsArgs {
  const float* scores = nullptr;  // [rows, ld] fp32: row r holds query row0 + r's scores
  int64_t ld = 0;                 // elements between rows (>= S_kv)
  int64_t rows = 0, row0 = 0;     // the query rows [row0, row0 + rows) of the problem
  IndexerDims dims;               // S_kv and the ranges' clamp
  IndexerMeta meta;               // k_start / k_end by problem row
  int32_t k = 0;
  int32_t* idx = nullptr;         // topk_idx [S_q, k], row stride idx_ss, last dim contiguous
  int64_t idx_ss = 0;
  int32_t* len = nullptr;         // topk_length [S_q] (stride len_s), or null
  int64_t len_s = 1;
  int32_t list_cap = 4096;        // kCandidates: candidate list entries (<= kTopkListCap)
};

// The row kernels (indexer_topk_rows.cu's header): the radix select over the whole row four
// times, with the row staged in shared memory where it fits, or not; the candidates kernel
// (two reads of the row).
enum class TopkRowsKernel { kCandidates, kRadixStaged, kRadix };

// The candidates kernel: list entries at most, and its shared memory (the first histogram or the
// list, then two bitmaps of S_kv bits), within kTopkRowsMaxCandidatesBytes (S_kv <= 2^18; longer
// rows run the unstaged radix kernel).
constexpr int kTopkListCap = 4096;
constexpr size_t kTopkRowsMaxCandidatesBytes = 32 * 1024 + 64 * 1024;
size_t topk_rows_candidates_bytes(int64_t skv);

// The staged kernel's shared memory: S_kv order keys (a row's range is inside [0, S_kv)), within
// kTopkRowsMaxStagedBytes. Measured on an H100 (docs/indexer_decisions.md): staged rows of 32 KB
// (S_kv 8192) +4-6% over the unstaged kernel, of 128 KB (S_kv 32768, one CTA per SM) -4.4%;
// the limit keeps the measured gain.
constexpr size_t kTopkRowsMaxStagedBytes = 32 * 1024;
size_t topk_rows_staged_bytes(int64_t skv);

// For each row t: the min(k, |range(t)|) keys of range(t) with the largest scores (order_key, ties
// to the smaller key, NaN last), in increasing key order, then -1; len[t] = that count. Keys
// outside range(t) are never read. Deterministic (a function of the scores alone), the same
// result from every kernel; a kernel whose shared memory S_kv exceeds runs as kRadix.
void topk_rows(const TopkRowsArgs& a, TopkRowsKernel kernel, cudaStream_t stream);

}  // namespace sa::portable::indexer
