// The argument struct of the DSA backward main kernels (portable: dsa_backward_kernel.cuh;
// Hopper: src/sm90/dsa_backward_kernel.cuh), built from a validated problem; host-usable.
#pragma once

#include <cstdint>

#include "common/dsa_params.hpp"
#include "common/problem.hpp"

namespace sa::portable::dsa_bwd {

struct FixCtl;  // cuda/dsa_fixed_point.cuh

// Kernel arguments: typed pointers and element strides, everything resolved on the host.
struct DsaBwdParams {
  const void* q;       // [S_q, H, D_qk]: (t, h, d) at t * q_ss + h * q_sh + d
  const void* kv;      // [S_kv, D_qk]: row j at j * kv_ss
  const void* out;     // [S_q, H, 512]: (t, h, d) at t * o_ss + h * o_sh + d
  const void* dout;    // [S_q, H, 512]: (t, h, d) at t * do_ss + h * do_sh + d
  void* dq;            // [S_q, H, D_qk]: (t, h, d) at t * dq_ss + h * dq_sh + d
  const float* lse;    // [S_q, H]: (t, h) at t * lse_ss + h * lse_sh
  const int32_t* idx;  // [S_q, topk]: (t, i) at t * idx_ss + i * idx_si
  const int32_t* len;  // [S_q] at t * len_s; may be null
  const float* sink;   // [H] at h * sink_s; may be null
  float* dkv_acc;      // [S_kv, D_qk] fp32, row j at j * D_qk: reduction target (atomic mode)
  float* dkv_part;     // deterministic mode: [tokens of the launch, head_groups, topk, D_qk] fp32
                       // partial rows, (t - tok_begin, group, slot) -> its own row; else null
  float* sink_terms;   // [H, S_q]: (h, t) at h * sq + t, -exp(sink - L) * delta; may be null
  // Fixed-point deterministic mode (a policy with fixed_point, cuda/dsa_fixed_point.cuh): each
  // value is rounded at 2^s and reduced into dkv_fix int64 (natural column order);
  // a non-finite value marks its row in dkv_bad [S_kv]; pass 0 raises fix_ctl->max_x, pass 1
  // runs only when fix_scale says retry. All null / 0 otherwise.
  int64_t* dkv_fix;   // [S_kv + 1, D_qk]: row S_kv takes the inactive slots, never read
  uint32_t* dkv_bad;
  FixCtl* fix_ctl;
  int32_t fix_pass;
  int32_t fix_rows;  // the heads of a work item in the scale's estimate (the driver's, so that
                     // the kernels and the conversion compute the same scale)
  int64_t q_ss, q_sh, kv_ss, o_ss, o_sh, do_ss, do_sh, dq_ss, dq_sh, lse_ss, lse_sh, idx_ss, idx_si,
      len_s, sink_s;
  int64_t skv;            // S_kv
  int64_t sq;             // S_q (the row length of sink_terms)
  int64_t tok_begin;      // token of blockIdx.x = 0
  int32_t H;              // heads (the portable kernels: a multiple of 8)
  int32_t topk;           // slots per row
  int32_t head_groups;    // ceil(H / M)
  int32_t deterministic;  // nonzero: store partial rows instead of reducing into dkv_acc
  float scale;            // softmax scale
  float scale_log2;       // scale * log2(e)
  int32_t dqk;            // D_qk (the kernels are compiled for one; launchers dispatch on it)
  int32_t tune;           // Hopper kernel experiment bits (sm90/dsa_backward_kernel.cuh); 0
  int64_t items;          // Hopper persistent kernel: work items (tokens x head groups) of the
                          // launch, item i = (token tok_begin + i / head_groups, group i % ..)
  uint32_t* item_counter;  // Hopper persistent kernel with topk_length or token groups (items of
                           // different lengths): dynamic items from this counter, zeroed by the
                           // Hopper launcher before each launch (sm90/persistent_items.cuh); else
                           // null
  // Token groups (cuda/dsa_token_groups.hpp; Hopper kernel): item i is group b = tok_begin + i,
  // G = 64 / H tokens [G b, G b + G) as 64 rows (token, head), walking its union of keys (row i
  // of the arrays below: the launch's slice of groups). The driver then passes q, out, dout, dq
  // and lse with the group as their "token" (q_ss = G x the token stride, ...; rows past S_q H
  // are padding) and head_groups = 1. All null / 0 without token groups.
  const int32_t* group_keys;   // [items, group_cap]: the union's kv rows, ascending
  const uint32_t* group_mult;  // [items, group_cap]: per entry, G 4-bit fields: token g's
                               // multiplicity of the key
  const int32_t* group_len;    // [items]: the union's entries
  const uint32_t* group_present;  // [items]: field g nonzero when token g has an active slot
  int64_t group_cap;
  // Binned fixed point (the driver's binned plan; cuda/dsa_binned_fixed.cuh): the Hopper
  // kernel's binned form reduces into dkv_bins, kBinCount planes [S_kv + 1, D_qk / 2] of packed
  // words (bin_word), and runs only where bin_serves(fix_ctl->count, head_groups, fix_bin_min);
  // elsewhere its int64 form runs, with dkv_fix at the planes' start. Null / 0 otherwise.
  uint64_t* dkv_bins;
  int32_t fix_bin_min;
};

// Kernel arguments of a validated problem (the host checks support first). The workspace
// pointers and tok_begin are filled by the caller.
inline DsaBwdParams make_params(const DsaBwdProblem& p, int block_m) {
  const DsaDims& d = p.dims;
  DsaBwdParams prm{};
  fill_dsa_common_params(prm, p);
  prm.dout = p.dout.data;
  prm.dq = p.dq.data;
  prm.do_ss = p.dout.ss;
  prm.do_sh = p.dout.sh;
  prm.dq_ss = p.dq.ss;
  prm.dq_sh = p.dq.sh;
  prm.sq = d.Sq;
  prm.H = static_cast<int32_t>(d.H);
  prm.head_groups = static_cast<int32_t>((d.H + block_m - 1) / block_m);
  prm.deterministic = p.options.deterministic != 0;
  prm.scale = p.scale;
  prm.dqk = static_cast<int32_t>(d.Dqk);
  return prm;
}

}  // namespace sa::portable::dsa_bwd
