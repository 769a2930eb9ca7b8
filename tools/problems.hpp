// Random BSA and DSA problems for the command-line tool: inputs, sparsity metadata and (poisoned)
// outputs in host memory, and the public-API argument structs over them on any device.
//
//   BsaProblem p = make_bsa_problem(shape, seed);            // outputs filled with NaN
//   BsaViews v = bsa_views(p, [](HostTensor& t) { return t.view(); });   // or device copies
//   sparse_attention::bsa_forward(bsa_forward_args(p.shape, v), ctx);
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sparse_attention/sparse_attention.hpp"
#include "testing/host_tensor.hpp"

namespace sa_tool {

// Host tensors and their views come from the testing library (testing/host_tensor.hpp), which
// the tests share.
using sa_testing::count_nan;
using sa_testing::HostTensor;
using sa_testing::narrow;
using sa_testing::values;

// Maps a host tensor to the view an operation gets: the host view itself, or a device copy.
using Place = std::function<sa_tensor(HostTensor&)>;

// ---- BSA (SPEC 1) -------------------------------------------------------------------------------
struct BsaShape {
  int64_t B = 1, Hq = 2, Hkv = 1;
  int64_t S = 256;  // S_q = S_kv
  int64_t D = 64;   // D = D_v
  int32_t block = 64;
  double density = 0.5;  // fraction of the KV blocks each query block attends
  sa_layout layout = SA_LAYOUT_BHSD;
  sa_dtype dtype = SA_DTYPE_BF16;
  // Bench only (bsa_fwd): causal_blocks: query block m lists its diagonal block m and
  // round(density * m) distinct random earlier blocks (the MoBA pattern; per-row counts in
  // q2k_count, K_max = row_count(N_q - 1)); mask: options.mask (S_q = S_kv: offset 0).
  bool causal_blocks = false;
  // Bench only: each row's distinct random blocks in ascending order (as bench/anchors.py and
  // cuDNN-frontend's examples list them) instead of in draw order.
  bool sorted_blocks = false;
  sa_mask mask = SA_MASK_NONE;

  int64_t Nq() const { return S <= 0 || block <= 0 ? 0 : (S - 1) / block + 1; }
  int64_t Nkv() const { return Nq(); }
  int64_t group() const { return Hq / Hkv; }  // query heads per KV head
  int32_t count() const;                      // KV blocks per query block, in [1, N_kv] (K_max)
  int32_t row_count(int64_t m) const;         // blocks query block m lists (count() unless
                                              // causal_blocks)
  int64_t key_block_len(int64_t n) const;     // valid keys of KV block n (the last one cut at S)
  // Physical shape of a logical [B, H, S, X] tensor in this layout.
  std::vector<int64_t> physical(int64_t B_, int64_t H, int64_t S_, int64_t X) const;
  // The part of a [B, H, S, X] view in this layout at batch b, heads [h0, h0 + nh) and tokens
  // [s0, s0 + ns) (a view of the same memory, shaped [1, nh, ns, X] or [1, ns, nh, X]).
  sa_tensor slice(const sa_tensor& t, int64_t b, int64_t h0, int64_t nh, int64_t s0,
                  int64_t ns) const;
  std::string describe() const;
};

struct BsaProblem {
  BsaShape shape;
  HostTensor q, k, v, dout;  // inputs, uniform in [-1, 1], stored in shape.layout
  HostTensor q2k_index;      // [B, Hq, Nq, count] int32: distinct, uniformly random KV blocks
  HostTensor q2k_count;      // [B, Hq, Nq] int32 row counts (causal_blocks only)
  HostTensor o, lse;         // forward outputs (the backward's inputs); NaN until computed
  HostTensor dq, dk, dv;     // backward outputs; NaN until computed

  int32_t block_at(int64_t b, int64_t h, int64_t m, int64_t slot) const;
  // Flat offset of logical element (b, h, s, x) of a contiguous [B, H, S, X] tensor `t`.
  int64_t offset(const HostTensor& t, int64_t b, int64_t h, int64_t s, int64_t x) const;
  // The contents of a [B, H, S, X] tensor as doubles in logical BHSD order, whatever the layout.
  std::vector<double> logical(const HostTensor& t) const;
};

// Checks that the problem fits this machine before anything is allocated: every tensor's element
// count and the total bytes fit in int64 (overflow-checked products), and the total is at most
// the machine's physical memory. With dense_oracle, also the CPU demo's dense [S_q, S_kv] oracle
// buffers. Throws ToolError(kExitBadArgument) naming the flags that set the sizes.
void check_bsa_size(const BsaShape& shape, bool dense_oracle);
// Calls check_bsa_size(shape, false) first.
BsaProblem make_bsa_problem(const BsaShape& shape, uint64_t seed);

struct BsaViews {
  sa_tensor q, k, v, q2k_index, dout, o, lse, dq, dk, dv;
  sa_tensor q2k_count = sa_tensor_none();  // causal_blocks only
};
BsaViews bsa_views(BsaProblem& p, const Place& place);
// Layout, block size and mask of the shape; every row reads all K_max = count entries (count -1,
// no q2k_count) unless causal_blocks (q2k_count); scale 1/sqrt(D); the implementation the
// library picks.
sparse_attention::BsaOptions bsa_options(const BsaShape& s);
sparse_attention::BsaForwardArgs bsa_forward_args(const BsaShape& s, const BsaViews& v);
sparse_attention::BsaBackwardArgs bsa_backward_args(const BsaShape& s, const BsaViews& v);

// ---- DSA (SPEC 2) -------------------------------------------------------------------------------
struct DsaShape {
  int64_t Sq = 32, Skv = 256, H = 16, Dqk = 576, Dv = 512, topk = 64;
  bool topk_length = true;  // random lengths in [1, topk]
  bool sink = true;         // per-head sink logits in [-1, 4]
  sa_dtype dtype = SA_DTYPE_BF16;
  std::string describe() const;
};

struct DsaProblem {
  DsaShape shape;
  HostTensor q, kv, dout;      // inputs, uniform in [-1, 1]: [Sq, H, Dqk], [Skv, Dqk], [Sq, H, Dv]
  HostTensor topk_idx;         // [Sq, topk] int32: distinct random keys per row (-1 past S_kv)
  HostTensor topk_length;      // [Sq] int32, or absent
  HostTensor sink;             // [H] fp32, or absent
  HostTensor out, lse;         // forward outputs [Sq, H, Dv], [Sq, H]; NaN until computed
  HostTensor dq, dkv, d_sink;  // backward outputs [Sq, H, Dqk], [Skv, Dqk], [H]

  int32_t index(int64_t t, int64_t i) const;
  // SPEC 2: slot i of row t is active when i < topk_length[t] (if given) and the index is in
  // [0, S_kv).
  bool active(int64_t t, int64_t i) const;
  bool row_empty(int64_t t) const;
};

void check_dsa_size(const DsaShape& shape, bool dense_oracle);
// Calls check_dsa_size(shape, false) first.
DsaProblem make_dsa_problem(const DsaShape& shape, uint64_t seed);

struct DsaViews {
  sa_tensor q, kv, topk_idx, topk_length, sink, dout, out, lse, dq, dkv, d_sink;
};
DsaViews dsa_views(DsaProblem& p, const Place& place);
// d_v = shape.Dv; scale 1/sqrt(D_qk); the implementation the library picks.
sparse_attention::DsaOptions dsa_options(const DsaShape& s);
sparse_attention::DsaForwardArgs dsa_forward_args(const DsaShape& s, const DsaViews& v);
sparse_attention::DsaBackwardArgs dsa_backward_args(const DsaShape& s, const DsaViews& v);

}  // namespace sa_tool
