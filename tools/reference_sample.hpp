// GPU results against the library's fp64 CPU reference, on exact sub-problems of the same inputs.
//
// The fp64 reference of a GPU-sized problem would take minutes, so it runs (through the public
// API, on CPU views of the host copies, options.impl = reference) on sub-problems whose outputs
// are exactly some of the full problem's outputs:
//
//   BSA rows  one (b, h, query block m): that block's q rows, k/v of its KV head, its block list
//             -> o, lse (forward) and dq (backward) of those rows.
//   BSA keys  one (b, KV head hk, KV block n): k/v of block n alone; each query block of the
//             group's heads keeps one entry (block 0 of the sub-problem) if it lists n, else
//             count 0; q, o, lse, dout of the group -> dk, dv of block n.
//   DSA rows  one token t: q[t], topk_idx[t] (and topk_length[t]) with the whole kv
//             -> out, lse (forward) and dq (backward) of token t.
//   DSA keys  one key j: kv[j] alone; slots that hold j (and are active) -> 0, others -1
//             -> dkv[j].
//   DSA sink  kv[0] alone, every non-empty row keeps one slot: by SPEC 2, d_sink depends only on
//             lse, sink, out and dout of the non-empty rows -> d_sink (all heads).
//
// The backward sub-problems take o/out and lse from the problem (what the GPU backward was given).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compare.hpp"
#include "problems.hpp"

namespace sa_tool {

struct SampledComparison {
  std::vector<Check> checks;
  std::string what;  // what was compared, over which part of the outputs
};

// p holds the inputs and, in its output tensors, the GPU's results (downloaded).
// mask: options.mask of the run compared (the bench's per-variant mask=; else the shape's).
SampledComparison bsa_forward_vs_reference(BsaProblem& p, uint64_t seed);
SampledComparison bsa_forward_vs_reference(BsaProblem& p, uint64_t seed, sa_mask mask);
SampledComparison bsa_backward_vs_reference(BsaProblem& p, uint64_t seed);
SampledComparison dsa_forward_vs_reference(DsaProblem& p, uint64_t seed);
SampledComparison dsa_backward_vs_reference(DsaProblem& p, uint64_t seed);

}  // namespace sa_tool
