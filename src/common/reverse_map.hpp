// The BSA backward's key-to-query reverse map (SPEC 1, "Backward").
//
// Row r = (b * Hkv + hk) * Nkv + n lists every (query head, query block) pair whose forward row
// selects KV block n, where the query head h belongs to KV head hk (h / (Hq / Hkv) == hk), except
// pairs that the token mask hides entirely (BsaMeta::pair_outside: they add no gradient). An
// entry is encoded as  e = hl * Nq + m  with hl = h % (Hq / Hkv) the head's place in its group;
// entries of a row are sorted ascending (by head in the group, then by query block), so the order
// is deterministic.
//
// Each row is split into groups of at most `bucket` consecutive entries. Every row has at least
// one group: an empty row (a KV block nobody attends) has one group with no entries, whose owner
// writes dK = dV = 0. A row with a single group has a single owner (dK/dV stay on chip); several
// groups share the row through the fp32 workspace.
//
// Work items enumerate the groups of every row, row by row, group by group.
//
// The CPU builder (src/reference/reverse_map.cpp) defines the map; the GPU builder must produce
// the same one.
#pragma once

#include <cstdint>
#include <vector>

#include "common/problem.hpp"

namespace sa {

struct ReverseMap {
  int64_t num_rows = 0;              // B * Hkv * Nkv
  int32_t bucket = 0;                // entries per group (> 0)
  std::vector<int32_t> row_offsets;  // [num_rows + 1]: row r is entries[row_offsets[r] ..
                                     //                   row_offsets[r + 1])
  std::vector<int32_t> entries;      // hl * Nq + m, ascending within a row
  std::vector<int32_t> row_groups;   // [num_rows]: max(1, ceil(len / bucket))
  // Work items, in row order then group order:
  std::vector<int32_t> item_row;     // row of the item
  std::vector<int32_t> item_begin;   // absolute index into entries
  std::vector<int32_t> item_end;     // exclusive; item_begin == item_end for an empty row
};

// bucket <= 0 means "no split": one group per row.
ReverseMap build_reverse_map_cpu(const BsaDims& dims, const BsaMeta& meta, int32_t bucket);

}  // namespace sa
