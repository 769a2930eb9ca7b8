// GPU builder of the BSA backward's key-to-query reverse map (SPEC 1, "Backward"). The map itself
// is defined in common/reverse_map.hpp and by the CPU builder (src/reference/reverse_map.cpp);
// for metadata that meets the contract this builder produces exactly the same row_offsets,
// entries, row_groups and work items.
//
// Properties the backward relies on:
//  * no host synchronisation and nothing allocated: every step is a memset or a kernel on the
//    caller's stream, so the build can be captured in a CUDA graph and replayed with new metadata
//    VALUES (same shapes; fixed_count, when there is no q2k_count tensor, is a kernel argument
//    and is baked into a captured graph like the shapes);
//  * deterministic and sorted by construction (no sort, no order-dependent atomics in the output;
//    step 6's rank sort has a strict total order);
//  * every size is derived on the host from the shapes (and tail_items), never from metadata
//    values.
//
// Steps (all on `stream`):
//   1. memset   bitmap[num_rows][words_per_row] = 0; bit e = hl * Nq + m of row
//               r = (b * Hkv + hk) * Nkv + n is "query head hk*G+hl, block m lists KV block n".
//   2. scatter  a warp per forward row (b, h, m): atomicOr the row's bit into every listed block
//               that the token mask does not hide entirely from block m (BsaMeta::pair_outside).
//   3. count    a warp per reverse row: len = popcount, groups = max(1, ceil(len / bucket)),
//               stored packed as (groups << 32 | len).
//   4. scan     cub::DeviceScan::ExclusiveSum over num_rows + 1 packed values: entry offsets in
//               the low halves, work-item offsets in the high halves.
//   5. emit     a warp per reverse row: entries ascending (word by word, popc prefix sums across
//               the warp), row_offsets, row_groups, the row's work items, and the totals.
//   6. order    (tail_items > 0) one CTA: the last min(tail_items, num_items) work items ranked
//               by length, longest first (ties by index), into item_order. A kernel that takes
//               items in launch order runs its last waves longest first, so that its SMs run
//               out of work closer together (bench/notes-archive, session 29).
//
// Metadata is trusted to meet the contract (counts in [0, Kmax], entries of a row distinct and in
// [0, Nkv)); outside it nothing is read or written out of bounds: counts are clamped to
// [0, Kmax], out-of-range entries are skipped, and a repeated entry is stored once (so the map is
// that of the metadata with those fixes, which then differs from the CPU builder's).
//
// Packed batches (meta.varlen(), SPEC 4): rows r = (b * Hkv + hk) * Nkv + n with b the sequence
// and n its local KV block (Nkv = ceil(T_kv / block) bounds every sequence's blocks); step 2 reads
// only the query blocks inside each sequence, keeps entries inside its KV blocks and applies its
// mask; step 3 gives rows past their sequence's end 0 groups (no work item, row_groups 0).
// cu_seqlens is read on the device only. max_items counts only the rows inside the sequences,
// H_kv (T_kv + B (block - 1)) / block of them, so a kernel launched with max_items CTAs does not
// run a CTA per row of B x H_kv x N_kv (issue 38's packed batch: 8,416 CTAs for 8,192 items,
// where that count was 65,536). With offsets outside the contract (sum of lengths > T_kv) the
// items past max_items are dropped and *num_items is clamped to it.
//
// bucket <= 0 ("no split", one group per row): the CPU builder sets ReverseMap::bucket to the
// longest row, which depends on the metadata values; this builder uses G * Nq (the longest row
// possible) instead. Every row has one group either way, so row_groups and the work items are the
// same; only the bucket field differs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/problem.hpp"
#include "common/reverse_map.hpp"

namespace sa::portable {

// The map on the device. All pointers lie in the caller's workspace (each 256-byte aligned).
struct ReverseMapDevice {
  int32_t* row_offsets = nullptr;  // [num_rows + 1]: row r is entries[row_offsets[r] ..
                                   //                   row_offsets[r + 1])
  int32_t* entries = nullptr;      // [entries_capacity]; the first row_offsets[num_rows] are set
  int32_t* row_groups = nullptr;   // [num_rows]: max(1, ceil(len / bucket))
  int32_t* item_row = nullptr;     // [max_items]; the first *num_items are set
  int32_t* item_begin = nullptr;   // [max_items]: absolute index into entries
  int32_t* item_end = nullptr;     // [max_items]: exclusive; == item_begin for an empty row
  int32_t* num_items = nullptr;    // [1]: number of work items (a later kernel launched with
                                   //      max_items blocks exits early past it)
  // [tail_items] (step 6): with n = *num_items and t0 = max(0, n - tail_items), launch slot
  // t0 + i takes item item_order[i] (a permutation of [t0, n)); slots below t0 take their own.
  int32_t* item_order = nullptr;
  int32_t tail_items = 0;          // 0: no step 6, item_order null
  // [num_rows + 1]: entries (low 32 bits) and work items (high 32 bits) of the rows before r;
  // the items of rows [r0, r1) number high(row_scan[r1]) - high(row_scan[r0]).
  const unsigned long long* row_scan = nullptr;
  int64_t num_rows = 0;            // B * Hkv * Nkv
  int32_t bucket = 0;              // entries per group (> 0); G * Nq when asked for bucket <= 0
  int64_t max_items = 0;           // upper bound on *num_items, from the shapes (packed: from
                                   // the rows inside the sequences; *num_items <= max_items)
  int64_t entries_capacity = 0;    // upper bound on the number of entries, from the shapes
};

// Alignment the workspace must have and that every sub-buffer gets.
constexpr size_t kReverseMapAlignment = 256;

// Bytes of workspace build_reverse_map_gpu needs for these shapes, bucket and tail_items: the
// map's arrays, the bitmap, the scan buffers and CUB's temporary storage, each 256-byte aligned.
// Host only, no synchronisation; CUB's size query looks at the current device, so ask with the
// device the build will run on current. Throws sa::Error if a size does not fit the map's int32
// indices.
// `packed`: the map of a packed batch (BsaMeta::varlen()); its work items are bounded by the
// rows inside the sequences, not by every row.
size_t reverse_map_workspace_bytes(const BsaDims& dims, int32_t bucket, int32_t tail_items,
                                   bool packed);

// Most work items step 6 orders (one CTA).
constexpr int32_t kMaxTailItems = 1024;

// Builds the map on `stream` (see the steps above). `meta` points to device memory; its
// kv_block_len is not read. `workspace` must be 256-byte aligned and hold at least
// reverse_map_workspace_bytes(dims, bucket, tail_items) bytes; its contents need not be
// initialised. tail_items in [0, kMaxTailItems]. The returned struct (host values, device
// pointers) is valid once the stream reaches this point.
ReverseMapDevice build_reverse_map_gpu(const BsaDims& dims, const BsaMeta& meta, int32_t bucket,
                                       void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream, int32_t tail_items = 0);

// Copies a built map to the host (tests and debugging: it synchronises the stream).
ReverseMap download_reverse_map(const ReverseMapDevice& map, cudaStream_t stream);

}  // namespace sa::portable
