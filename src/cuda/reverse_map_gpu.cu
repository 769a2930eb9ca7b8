// GPU builder of the BSA reverse map: bitmap scatter, popcount, one CUB scan, emit, and the tail's
// order. See cuda/reverse_map_gpu.hpp for the steps and guarantees, common/reverse_map.hpp for
// the map.
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/cuda_check.hpp"
#include "common/narrow.hpp"
#include "cuda/reverse_map_gpu.hpp"

namespace sa::portable {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;  // every kernel here: 8 warps per block, a warp per row
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr unsigned kFullMask = 0xffffffffu;

// What the scan carries for a row: (groups << 32) | len. Both totals stay below 2^31 (checked on
// the host from the shapes), so adding packed values never carries from the low half into the
// high half, and the exclusive scan yields the entry offset (low) and item offset (high) at once.
using Packed = unsigned long long;

__device__ __forceinline__ int32_t low_half(Packed p) {
  return static_cast<int32_t>(p & 0xffffffffu);
}
__device__ __forceinline__ int32_t high_half(Packed p) { return static_cast<int32_t>(p >> 32); }

// Byte offsets of the sub-buffers in the workspace, and the sizes they derive from.
struct Layout {
  int64_t num_rows = 0;          // B * Hkv * Nkv
  int32_t words_per_row = 0;     // ceil(G * Nq / 32)
  int32_t bucket = 0;            // > 0
  int64_t entries_capacity = 0;  // B * Hq * Nq * min(Kmax, Nkv)
  int64_t max_items = 0;
  size_t cub_bytes = 0;
  int32_t tail_items = 0;
  size_t row_offsets = 0, entries = 0, row_groups = 0, item_row = 0, item_begin = 0,
         item_end = 0, num_items = 0, item_order = 0, bitmap = 0, scan_in = 0, scan_out = 0,
         cub_temp = 0;
  size_t total = 0;
};

size_t align_up(size_t x) {
  return (x + kReverseMapAlignment - 1) / kReverseMapAlignment * kReverseMapAlignment;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

Layout make_layout(const BsaDims& d, int32_t bucket, int32_t tail_items, bool packed) {
  SA_CHECK_ARG(d.B >= 1 && d.Hq >= 1 && d.Hkv >= 1 && d.Nq >= 1 && d.Nkv >= 1 && d.Kmax >= 0,
               "reverse map: expected B, Hq, Hkv, Nq, Nkv >= 1 and Kmax >= 0, got B="
                   << d.B << ", Hq=" << d.Hq << ", Hkv=" << d.Hkv << ", Nq=" << d.Nq
                   << ", Nkv=" << d.Nkv << ", Kmax=" << d.Kmax);
  SA_CHECK_ARG(d.Hq % d.Hkv == 0,
               "reverse map: Hq = " << d.Hq << " is not a multiple of Hkv = " << d.Hkv);
  SA_CHECK_ARG(tail_items >= 0 && tail_items <= kMaxTailItems,
               "reverse map: tail_items = " << tail_items << ", expected [0, " << kMaxTailItems
                                             << "]");
  Layout L;
  L.tail_items = tail_items;
  // Sizes the kernels index with int32 (entries, offsets, rows, items) must fit.
  const int64_t longest = d.group() * d.Nq;  // the longest row possible; entry values < this
  narrow_i32(longest, "reverse map row length (Hq / Hkv * Nq)");
  L.num_rows = d.B * d.Hkv * d.Nkv;
  narrow_i32(L.num_rows + 1, "reverse map rows + 1 (B * Hkv * Nkv + 1)");
  L.words_per_row = static_cast<int32_t>(ceil_div(longest, 32));
  L.bucket = bucket > 0 ? bucket : static_cast<int32_t>(longest);
  // A forward row contributes at most min(Kmax, Nkv) distinct KV blocks.
  L.entries_capacity = d.B * d.Hq * d.Nq * std::min(d.Kmax, d.Nkv);
  narrow_i32(L.entries_capacity, "reverse map capacity (B * Hq * Nq * min(Kmax, Nkv))");
  // Rows that get groups: every row of a dense batch. In a packed batch only the rows inside
  // their sequence do (step 3): sum_b ceil(skv_b / block) per KV head, which is at most
  // (T_kv + B (block - 1)) / block when cu_seqlens_k meets the contract (sum_b skv_b <= T_kv).
  // The bound is what the main kernel's grid provisions; with offsets outside the contract the
  // items past it are dropped (step 5), so nothing is written out of bounds.
  const int64_t item_rows =
      packed ? std::min(L.num_rows, d.Hkv * ((d.Skv + d.B * (d.block - 1)) / d.block))
             : L.num_rows;
  // sum_r max(1, ceil(len_r / bucket)) <= rows + ceil(sum_r len_r / bucket) over the rows that
  // get groups, and no row has more than ceil(longest / bucket) groups.
  L.max_items = std::min(item_rows + ceil_div(L.entries_capacity, L.bucket),
                         item_rows * ceil_div(longest, L.bucket));
  narrow_i32(L.max_items, "reverse map work items");

  const int scan_items = static_cast<int>(L.num_rows + 1);
  SA_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, L.cub_bytes,
                                              static_cast<const Packed*>(nullptr),
                                              static_cast<Packed*>(nullptr), scan_items));

  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t start = at;
    at = align_up(at + std::max<size_t>(bytes, 1));
    return start;
  };
  const size_t i32 = sizeof(int32_t);
  L.row_offsets = take(static_cast<size_t>(L.num_rows + 1) * i32);
  L.entries = take(static_cast<size_t>(L.entries_capacity) * i32);
  L.row_groups = take(static_cast<size_t>(L.num_rows) * i32);
  L.item_row = take(static_cast<size_t>(L.max_items) * i32);
  L.item_begin = take(static_cast<size_t>(L.max_items) * i32);
  L.item_end = take(static_cast<size_t>(L.max_items) * i32);
  L.num_items = take(i32);
  L.item_order = take(static_cast<size_t>(tail_items) * i32);
  L.bitmap = take(static_cast<size_t>(L.num_rows) * L.words_per_row * sizeof(uint32_t));
  L.scan_in = take(static_cast<size_t>(scan_items) * sizeof(Packed));
  L.scan_out = take(static_cast<size_t>(scan_items) * sizeof(Packed));
  L.cub_temp = take(L.cub_bytes);
  L.total = at;
  return L;
}

// Warp index in the grid and lane; every kernel here is launched with kThreads-thread blocks, so
// a warp is whole and "return" on a warp-uniform condition keeps the shuffles below legal.
__device__ __forceinline__ int64_t global_warp() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
}

// 2. Scatter: warp per forward row (b, h, m); lanes take its slots. Packed batches (kPacked):
// only rows m < ceil(sq / block) of sequence b are read, entries outside its KV blocks are
// skipped, and the mask is the sequence's (BsaMeta::seq, mask_of; cu_seqlens read here).
template <bool kPacked>
__global__ void __launch_bounds__(kThreads)
    scatter_kernel(BsaDims d, BsaMeta meta, uint32_t* __restrict__ bitmap, int32_t words_per_row) {
  const int64_t row = global_warp();
  const int lane = threadIdx.x % kWarp;
  if (row >= d.B * d.Hq * d.Nq) return;
  const int64_t m = row % d.Nq;
  const int64_t h = (row / d.Nq) % d.Hq;
  const int64_t b = row / (d.Nq * d.Hq);
  const int64_t group = d.group();
  const int64_t hk = h / group, hl = h % group;
  SeqSpan span;
  TokenMask seq_mask;
  int64_t nkv = d.Nkv;
  if constexpr (kPacked) {
    span = meta.seq(b, d);
    if (m * d.block >= span.sq) return;  // past the sequence's query blocks: never read
    seq_mask = meta.mask_of(span);
    nkv = (span.skv + d.block - 1) / d.block;
  }
  // Counts outside [0, Kmax] break the contract; clamp so that no slot past the row is read.
  const int64_t count = min(max(static_cast<int64_t>(meta.count(b, h, m)), int64_t{0}), d.Kmax);
  const int64_t e = hl * d.Nq + m;  // this forward row's bit in every reverse row it reaches
  const uint32_t bit = 1u << (e & 31);
  uint32_t* word = bitmap + (b * d.Hkv + hk) * d.Nkv * words_per_row + (e >> 5);
  for (int64_t slot = lane; slot < count; slot += kWarp) {
    const int32_t n = meta.q2k_index.at(b, h, m, slot);
    if constexpr (kPacked) {
      if (n >= 0 && n < nkv && !BsaMeta::pair_outside(m, n, d.block, span, seq_mask))
        atomicOr(word + static_cast<int64_t>(n) * words_per_row, bit);
    } else {
      if (n >= 0 && n < d.Nkv && !meta.pair_outside(m, n, d))
        atomicOr(word + static_cast<int64_t>(n) * words_per_row, bit);
    }
  }
}

// 3. Count: warp per reverse row; scan_in[r] = (groups << 32) | len, scan_in[num_rows] = 0.
// Packed batches (kPacked): a row whose KV block starts at or past its sequence's end (Nkv bounds
// every sequence's blocks) gets no group, hence no work item (its keys are not its sequence's).
template <bool kPacked>
__global__ void __launch_bounds__(kThreads)
    count_kernel(const uint32_t* __restrict__ bitmap, int64_t num_rows, int32_t words_per_row,
                 int32_t bucket, Packed* __restrict__ scan_in, BsaDims d, BsaMeta meta) {
  if (blockIdx.x == 0 && threadIdx.x == 0) scan_in[num_rows] = 0;  // exclusive scan -> totals
  const int64_t r = global_warp();
  const int lane = threadIdx.x % kWarp;
  if (r >= num_rows) return;
  const uint32_t* bits = bitmap + r * words_per_row;
  unsigned len = 0;
  for (int32_t w = lane; w < words_per_row; w += kWarp) len += __popc(bits[w]);
  len = __reduce_add_sync(kFullMask, len);
  if (lane == 0) {
    const unsigned ubucket = static_cast<unsigned>(bucket);
    unsigned groups = len == 0 ? 1u : len / ubucket + (len % ubucket != 0 ? 1u : 0u);
    if constexpr (kPacked) {
      const int64_t n = r % d.Nkv, b = r / (d.Nkv * d.Hkv);
      if (n * d.block >= meta.seq(b, d).skv) groups = 0u;  // len is 0 there too
    }
    scan_in[r] = (static_cast<Packed>(groups) << 32) | len;
  }
}

// 5. Emit: warp per reverse row. scan[r] and scan[r + 1] bound the row's entries and items.
__global__ void __launch_bounds__(kThreads)
    emit_kernel(const uint32_t* __restrict__ bitmap, int32_t words_per_row,
                const Packed* __restrict__ scan, ReverseMapDevice map) {
  const int64_t r = global_warp();
  const int lane = threadIdx.x % kWarp;
  if (r >= map.num_rows) return;
  const Packed here = scan[r], next = scan[r + 1];
  const int32_t begin = low_half(here), end = low_half(next);
  const int32_t first_item = high_half(here);
  const int32_t groups = high_half(next) - first_item;
  if (lane == 0) {
    map.row_offsets[r] = begin;
    map.row_groups[r] = groups;
    if (r == map.num_rows - 1) {
      map.row_offsets[r + 1] = end;
      *map.num_items = static_cast<int32_t>(min(static_cast<int64_t>(high_half(next)),
                                                map.max_items));
    }
  }

  // Entries, ascending: 32 words at a time, lane i takes word w0 + i; an exclusive prefix sum of
  // the words' popcounts across the warp gives each lane where its word's entries start. Both
  // loop conditions are warp-uniform (pos from a shuffle), so every lane reaches every shuffle.
  const uint32_t* bits = bitmap + r * words_per_row;
  int32_t pos = begin;
  for (int32_t w0 = 0; w0 < words_per_row && pos < end; w0 += kWarp) {
    const int32_t w = w0 + lane;
    uint32_t word = w < words_per_row ? bits[w] : 0u;
    const int32_t n = __popc(word);
    int32_t inclusive = n;
#pragma unroll
    for (int step = 1; step < kWarp; step *= 2) {
      const int32_t other = __shfl_up_sync(kFullMask, inclusive, step);
      if (lane >= step) inclusive += other;
    }
    int32_t out = pos + inclusive - n;
    while (word != 0u) {
      map.entries[out++] = w * 32 + (__ffs(word) - 1);  // lowest set bit first: ascending
      word &= word - 1u;
    }
    pos += __shfl_sync(kFullMask, inclusive, kWarp - 1);
  }

  // Work items: group g covers entries [begin + g * bucket, min(end, begin + (g + 1) * bucket));
  // an empty row has the single group [begin, begin).
  // Items at or past max_items (packed offsets outside the contract only) are dropped.
  for (int32_t g = lane; g < groups && first_item + g < map.max_items; g += kWarp) {
    const int64_t item_begin = begin + static_cast<int64_t>(g) * map.bucket;
    const int64_t item_end = min(static_cast<int64_t>(end), item_begin + map.bucket);
    map.item_row[first_item + g] = static_cast<int32_t>(r);
    map.item_begin[first_item + g] = static_cast<int32_t>(item_begin);
    map.item_end[first_item + g] = static_cast<int32_t>(item_end);
  }
}

// 6. Order: one CTA of kMaxTailItems threads; thread i ranks tail item t0 + i by (length
// descending, index ascending) among the tail's, a rank sort in shared memory.
__global__ void __launch_bounds__(kMaxTailItems) order_kernel(ReverseMapDevice map) {
  __shared__ int32_t len[kMaxTailItems];
  const int32_t n = *map.num_items;
  const int32_t count = min(n, map.tail_items);
  const int32_t t0 = n - count;
  const int32_t i = static_cast<int32_t>(threadIdx.x);
  if (i < count) len[i] = map.item_end[t0 + i] - map.item_begin[t0 + i];
  __syncthreads();
  if (i >= count) return;
  const int32_t mine = len[i];
  int32_t rank = 0;
  for (int32_t j = 0; j < count; ++j) {
    const int32_t other = len[j];
    rank += other > mine || (other == mine && j < i) ? 1 : 0;
  }
  map.item_order[rank] = t0 + i;
}

unsigned grid_for_warps(int64_t warps) {
  const int64_t blocks = ceil_div(warps, kWarpsPerBlock);
  SA_CHECK(blocks <= 0x7fffffff, SA_ERROR_UNSUPPORTED, "reverse map: grid of " << blocks
                                                           << " blocks is too large");
  return static_cast<unsigned>(blocks);
}

template <typename T>
T* at_offset(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

}  // namespace

size_t reverse_map_workspace_bytes(const BsaDims& dims, int32_t bucket, int32_t tail_items,
                                   bool packed) {
  return make_layout(dims, bucket, tail_items, packed).total;
}

ReverseMapDevice build_reverse_map_gpu(const BsaDims& d, const BsaMeta& meta, int32_t bucket,
                                       void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream, int32_t tail_items) {
  Layout L = make_layout(d, bucket, tail_items, meta.varlen());
  SA_CHECK_ARG(workspace != nullptr, "reverse map: workspace is null");
  SA_CHECK_ARG(reinterpret_cast<uintptr_t>(workspace) % kReverseMapAlignment == 0,
               "reverse map: workspace must be " << kReverseMapAlignment << "-byte aligned");
  SA_CHECK_ARG(workspace_bytes >= L.total, "reverse map: workspace of " << workspace_bytes
                                               << " bytes, expected at least " << L.total);
  SA_CHECK_ARG(meta.q2k_index.data != nullptr, "reverse map: q2k_index is null");

  ReverseMapDevice map;
  map.row_offsets = at_offset<int32_t>(workspace, L.row_offsets);
  map.entries = at_offset<int32_t>(workspace, L.entries);
  map.row_groups = at_offset<int32_t>(workspace, L.row_groups);
  map.item_row = at_offset<int32_t>(workspace, L.item_row);
  map.item_begin = at_offset<int32_t>(workspace, L.item_begin);
  map.item_end = at_offset<int32_t>(workspace, L.item_end);
  map.num_items = at_offset<int32_t>(workspace, L.num_items);
  if (L.tail_items > 0) map.item_order = at_offset<int32_t>(workspace, L.item_order);
  map.tail_items = L.tail_items;
  map.num_rows = L.num_rows;
  map.bucket = L.bucket;
  map.max_items = L.max_items;
  map.entries_capacity = L.entries_capacity;
  uint32_t* bitmap = at_offset<uint32_t>(workspace, L.bitmap);
  Packed* scan_in = at_offset<Packed>(workspace, L.scan_in);
  Packed* scan_out = at_offset<Packed>(workspace, L.scan_out);
  map.row_scan = scan_out;

  // 1. Clear the bitmap.
  SA_CUDA_CHECK(cudaMemsetAsync(bitmap, 0,
                                static_cast<size_t>(L.num_rows) * L.words_per_row *
                                    sizeof(uint32_t),
                                stream));
  // 2. Scatter the forward entries.
  const bool packed = meta.varlen();
  if (d.Kmax > 0) {
    if (packed)
      scatter_kernel<true><<<grid_for_warps(d.B * d.Hq * d.Nq), kThreads, 0, stream>>>(
          d, meta, bitmap, L.words_per_row);
    else
      scatter_kernel<false><<<grid_for_warps(d.B * d.Hq * d.Nq), kThreads, 0, stream>>>(
          d, meta, bitmap, L.words_per_row);
    SA_CUDA_CHECK_LAUNCH();
  }
  // 3. Row lengths and groups.
  if (packed)
    count_kernel<true><<<grid_for_warps(L.num_rows), kThreads, 0, stream>>>(
        bitmap, L.num_rows, L.words_per_row, L.bucket, scan_in, d, meta);
  else
    count_kernel<false><<<grid_for_warps(L.num_rows), kThreads, 0, stream>>>(
        bitmap, L.num_rows, L.words_per_row, L.bucket, scan_in, d, meta);
  SA_CUDA_CHECK_LAUNCH();
  // 4. Offsets of entries and items.
  SA_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(at_offset<void>(workspace, L.cub_temp), L.cub_bytes,
                                              static_cast<const Packed*>(scan_in), scan_out,
                                              static_cast<int>(L.num_rows + 1), stream));
  // 5. Entries, row offsets, groups, work items, totals.
  emit_kernel<<<grid_for_warps(L.num_rows), kThreads, 0, stream>>>(bitmap, L.words_per_row,
                                                                    scan_out, map);
  SA_CUDA_CHECK_LAUNCH();
  // 6. The tail's launch order.
  if (L.tail_items > 0) {
    order_kernel<<<1, kMaxTailItems, 0, stream>>>(map);
    SA_CUDA_CHECK_LAUNCH();
  }
  return map;
}

ReverseMap download_reverse_map(const ReverseMapDevice& map, cudaStream_t stream) {
  ReverseMap out;
  out.num_rows = map.num_rows;
  out.bucket = map.bucket;
  const size_t rows = static_cast<size_t>(map.num_rows);
  int32_t items = 0;
  out.row_offsets.resize(rows + 1);
  out.row_groups.resize(rows);
  SA_CUDA_CHECK(cudaMemcpyAsync(&items, map.num_items, sizeof(int32_t), cudaMemcpyDeviceToHost,
                                stream));
  SA_CUDA_CHECK(cudaMemcpyAsync(out.row_offsets.data(), map.row_offsets,
                                (rows + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  SA_CUDA_CHECK(cudaMemcpyAsync(out.row_groups.data(), map.row_groups, rows * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, stream));
  SA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int32_t entries = out.row_offsets[rows];
  SA_CHECK(items >= 0 && items <= map.max_items && entries >= 0 &&
               entries <= map.entries_capacity,
           SA_ERROR_INTERNAL, "reverse map: " << items << " items (at most " << map.max_items
                                              << "), " << entries << " entries (at most "
                                              << map.entries_capacity << ")");
  out.entries.resize(static_cast<size_t>(entries));
  out.item_row.resize(static_cast<size_t>(items));
  out.item_begin.resize(static_cast<size_t>(items));
  out.item_end.resize(static_cast<size_t>(items));
  const auto copy = [stream](std::vector<int32_t>& dst, const int32_t* src) {
    if (dst.empty()) return;
    SA_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, dst.size() * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream));
  };
  copy(out.entries, map.entries);
  copy(out.item_row, map.item_row);
  copy(out.item_begin, map.item_begin);
  copy(out.item_end, map.item_end);
  SA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

}  // namespace sa::portable
