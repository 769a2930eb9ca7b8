// Token groups of the DSA backward (issue 33): for H in {8, 16, 32} a main kernel of 64 query rows
// per work item can take G = 64 / H consecutive tokens instead of one token padded to 64 heads.
// Rows r = (token t0 + g, head h), r = g H + h, are 64 contiguous rows of q, dout, out, dq and lse
// (token-major), and the item walks the sorted union of its tokens' active keys (SPEC 2's rule)
// instead of one token's slots: each union key's dkv row is reduced once for the G tokens.
//
// The union, per group b (built on the device by build_token_groups, one CTA per group):
//   keys[b * cap + e]   the e-th entry's kv row, ascending in e (a key split over several
//                       entries, see below, sits in consecutive entries)
//   mult[b * cap + e]   the entry's multiplicities: field g (bits [4 g, 4 g + 4)) is how many
//                       active slots of token t0 + g hold the key (0: none)
//   len[b]              the group's entries (0 for a group without active slots)
//   present[b]          the OR of the group's mult words: field g is nonzero when token t0 + g
//                       has an active slot
// A key whose multiplicity for some token exceeds a field's maximum M = 15 (a row that repeats
// one key 16 times or more) takes ceil(c / M) entries, entry k carrying min(M, max(0, c_g - k M))
// for each token: the entries add up to the multiplicities. (Fixed 4-bit fields keep the
// kernel's extraction a shift and a constant mask.)
// A row of token g then sees the key's probability multiplied by its field (SPEC 2: repeated
// indices count once each), and field 0 makes the key's P and dS exactly 0 for that token.
//
// cap bounds the entries of any group: at most the group's active slots (every entry carries a
// slot of some token) and at most the distinct keys plus the splits, S_kv + ceil(G topk / M).
// The driver builds the unions of a slice of groups at a time (kGroupUnionBytesCap), b counting
// from the slice's first group.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/problem.hpp"
#include "cuda/dsa_backward_aux.hpp"  // SlotKeyArgs

namespace sa::portable::dsa_bwd {

// The rows of one work item of the kernels that take token groups.
constexpr int kGroupRows = 64;

// G for H, or 0 when H takes no token groups (H must divide 64 with G <= 8, and be below 64).
constexpr int group_tokens(int64_t H) {
  return (H == 8 || H == 16 || H == 32) ? static_cast<int>(kGroupRows / H) : 0;
}

// Bits of one token's multiplicity field, and the largest multiplicity a field holds.
constexpr int kGroupFieldBits = 4;
constexpr uint32_t kGroupFieldMax = (1u << kGroupFieldBits) - 1u;

// Entries per group (see the top of this file); G = group_tokens(H) > 0.
int64_t group_capacity(int64_t skv, int64_t topk, int G);

// Bytes of the unions of one slice of groups: at most this much (at least one group). 38 MB at
// S 4096, H 16, topk 2048 (one slice); S_q = S_kv = 128 K takes 5 slices.
constexpr int64_t kGroupUnionBytesCap = int64_t{512} << 20;

// Whether p can run with token groups: H in {8, 16, 32}, not deterministic, G topk < 2^31 - 64,
// and q, dout, out, dq and lse token-major with their heads contiguous in rows (token stride = H
// x head stride), so that a group's 64 rows are those of one "token" of 64 heads.
bool token_groups_eligible(const DsaBwdProblem& p);

struct TokenGroupArgs {
  SlotKeyArgs rows;    // the tokens' index rows (and lengths), as the deterministic pass reads them
  int64_t sq;
  int G;               // tokens per group: 2, 4 or 8
  int64_t cap;         // entries per group (group_capacity)
  int64_t first;       // the slice: groups [first, first + groups), tokens from G first
  int64_t groups;
  int32_t* keys;       // [groups, cap]: row b - first
  uint32_t* mult;      // [groups, cap]
  int32_t* entries;    // [groups]
  uint32_t* present;   // [groups]
};

// Builds the slice's unions on `stream` (device current); writes entries and present for every
// group of the slice and keys / mult for e < entries only.
void build_token_groups(const TokenGroupArgs& a, cudaStream_t stream);

// Dynamic shared memory of build_token_groups' CTA (for the tests' and the planner's record).
size_t token_group_smem_bytes();

}  // namespace sa::portable::dsa_bwd
