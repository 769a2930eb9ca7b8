// CPU builder of the BSA backward's key-to-query reverse map; the definition the GPU builder
// must match (see common/reverse_map.hpp for the layout).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/error.hpp"
#include "common/narrow.hpp"
#include "common/reverse_map.hpp"

namespace sa {

ReverseMap build_reverse_map_cpu(const BsaDims& d, const BsaMeta& meta, int32_t bucket) {
  const int64_t group = d.group();
  ReverseMap map;
  map.num_rows = d.B * d.Hkv * d.Nkv;

  // 1. Scatter every (head in group, query block) pair into the row of each KV block it lists.
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(map.num_rows));
  for (int64_t b = 0; b < d.B; ++b) {
    // Packed batches: the sequence's own query blocks, KV blocks and mask (SPEC 4).
    const SeqSpan s = meta.seq(b, d);
    const TokenMask mask = meta.mask_of(s);
    const int64_t nq = meta.varlen() ? ceil_div_i64(s.sq, d.block) : d.Nq;
    const int64_t nkv = meta.varlen() ? ceil_div_i64(s.skv, d.block) : d.Nkv;
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t hk = h / group;
      const int64_t hl = h % group;
      for (int64_t m = 0; m < nq; ++m) {
        const int32_t count = meta.count(b, h, m);
        for (int32_t slot = 0; slot < count; ++slot) {
          const int32_t n = meta.q2k_index.at(b, h, m, slot);
          SA_CHECK(n >= 0 && n < nkv, SA_ERROR_INVALID_METADATA,
                   "sparsity.q2k_index[b=" << b << ", h=" << h << ", m=" << m << ", slot=" << slot
                                  << "] = " << n << ": expected a KV block in [0, " << nkv
                                  << ")");
          // the token mask hides the whole pair
          if (BsaMeta::pair_outside(m, n, d.block, s, mask)) continue;
          const int64_t r = (b * d.Hkv + hk) * d.Nkv + n;
          rows[static_cast<size_t>(r)].push_back(narrow_i32(hl * d.Nq + m, "reverse map entry"));
        }
      }
    }
  }

  // 2. Sort each row and concatenate.
  size_t longest = 0;
  map.row_offsets.push_back(0);
  for (std::vector<int32_t>& row : rows) {
    std::sort(row.begin(), row.end());
    longest = std::max(longest, row.size());
    map.entries.insert(map.entries.end(), row.begin(), row.end());
    map.row_offsets.push_back(
        narrow_i32(static_cast<int64_t>(map.entries.size()), "reverse map size"));
  }

  // 3. Split rows into groups of `bucket` entries; bucket <= 0: one group per row.
  map.bucket = bucket > 0 ? bucket
                          : std::max<int32_t>(1, narrow_i32(static_cast<int64_t>(longest),
                                                            "reverse map row length"));
  for (int64_t r = 0; r < map.num_rows; ++r) {
    const int32_t begin = map.row_offsets[static_cast<size_t>(r)];
    const int32_t end = map.row_offsets[static_cast<size_t>(r) + 1];
    const int64_t len = end - begin;
    const int64_t groups = std::max<int64_t>(1, (len + map.bucket - 1) / map.bucket);
    map.row_groups.push_back(static_cast<int32_t>(groups));
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t item_begin = begin + g * map.bucket;
      map.item_row.push_back(narrow_i32(r, "reverse map row"));
      map.item_begin.push_back(static_cast<int32_t>(item_begin));
      map.item_end.push_back(static_cast<int32_t>(std::min<int64_t>(end, item_begin + map.bucket)));
    }
  }
  return map;
}

}  // namespace sa
