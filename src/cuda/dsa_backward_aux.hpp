// The small kernels around the portable DSA backward's main kernel (dsa_backward_kernel.cuh):
// the dkv conversion pass, the d_sink reduction and, for deterministic mode, the key-major
// reduction of partial dkv rows (slot keys, a stable radix sort, a fixed-order sum per key).
// Every function launches on `stream` (device current), no host synchronisation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "sparse_attention/sparse_attention.h"

namespace sa::portable::dsa_bwd {

// The column order of the fp32 dkv accumulator row.
//   kNatural: column c at c.
//   kQuad16:  within each 16-column group, position 4q + i (q, i < 4) holds column 2q + i for
//             i < 2 and 2q + 6 + i for i >= 2: the four columns one lane of a wgmma accumulator
//             holds in two adjacent 8-column blocks, so that it reduces them with one 16-byte
//             vector (the Hopper main kernel's order; dqk % 16 == 0).
enum class AccColumns { kNatural, kQuad16 };

// dkv[j, c] = column c of acc row j (at j * dqk, in `columns` order) converted to `dtype` (bf16
// or fp16), for every j < skv, c < dqk. dkv rows at j * dkv_ss elements; dkv 8-byte aligned,
// dkv_ss and dqk multiples of 4.
void convert_dkv(const float* acc, void* dkv, sa_dtype dtype, int64_t skv, int dqk, int64_t dkv_ss,
                 AccColumns columns, cudaStream_t stream);

// d_sink[h * stride] = sum over t < sq of terms[h * sq + t] (has_sink), in a fixed order
// (bitwise reproducible), or 0 for every head (no sink).
void reduce_d_sink(const float* terms, int64_t sq, int64_t heads, float* d_sink, int64_t stride,
                   bool has_sink, cudaStream_t stream);

// Deterministic mode --------------------------------------------------------------------------
// Slot (t, i) of the tokens [tok_begin, tok_begin + tokens) is item e = (t - tok_begin) * topk + i;
// keys[e] = its kv row if the slot is active (SPEC 2, the kernel's rule), else skv (sorted last);
// vals[e] = e.
struct SlotKeyArgs {
  const int32_t* idx;  // [S_q, topk] at t * idx_ss + i * idx_si
  const int32_t* len;  // [S_q] at t * len_s; may be null
  int64_t idx_ss, idx_si, len_s;
  int64_t skv;
  int32_t topk;
};
void slot_keys(const SlotKeyArgs& a, int64_t tok_begin, int64_t tokens, uint32_t* keys,
               uint32_t* vals, cudaStream_t stream);

// Bits of a key (keys are <= skv).
int key_bits(int64_t skv);

// Scratch bytes of sort_slots for n items.
size_t sort_temp_bytes(int n, int end_bit);

// Stable sort of (keys, vals) by key: items of one key keep ascending e (deterministic).
void sort_slots(void* temp, size_t temp_bytes, const uint32_t* keys_in, uint32_t* keys_out,
                const uint32_t* vals_in, uint32_t* vals_out, int n, int end_bit,
                cudaStream_t stream);

// acc[j, :] += sum of the partial rows of key j's items, in sorted order; item e has the rows
// part[((e / topk) * groups + g) * topk + e % topk, :] for g = 0 .. groups - 1 (in that order).
// keys/vals: the sorted n items. dqk % 4 == 0.
void reduce_partials(const uint32_t* keys, const uint32_t* vals, int n, const float* part,
                     float* acc, int64_t skv, int dqk, int topk, int groups, cudaStream_t stream);

// Fixed-point deterministic mode (cuda/dsa_fixed_point.cuh) ----------------------------------
struct FixCtl;

// counts[j] += the active slots (the kernel's rule, as slot_keys) on key j over tokens [0, sq).
// counts zeroed before; [skv].
void fix_count_keys(const SlotKeyArgs& a, int64_t sq, uint32_t* counts, cudaStream_t stream);

// The tensors the scale's estimate reads: rows of `len` contiguous elements (a multiple of 8,
// 16-byte aligned), row (o, i) at o * s_outer + i * s_inner, o < outer, i < inner.
struct FixRows {
  const void* base;
  int64_t s_outer, s_inner, outer, inner;
  int len;
};

// ctl->max_q, max_dout, max_kv = the largest finite |element| of q, dout, kv (kv's rows in kv's
// leading columns only: D_qk), ctl->count = the largest counts[j]; ctl zeroed before. 16-bit
// floats of `dtype`.
void fix_input_maxima(const FixRows& q, const FixRows& dout, const FixRows& kv,
                      const uint32_t* counts, int64_t skv, sa_dtype dtype, FixCtl* ctl,
                      cudaStream_t stream);

// What fix_scale needs besides the control words.
struct FixScaleArgs {
  const FixCtl* ctl;
  float scale;      // the softmax scale
  int rows;         // heads per work item: min(H, the kernel's M)
  int head_groups;  // work items per token
};

// fix[0, n) = 0 when fix_scale says retry (after the first pass), else nothing. n even, fix
// 16-byte aligned.
void fix_zero_if_retry(int64_t* fix, int64_t n, const FixScaleArgs& s, cudaStream_t stream);

// dkv[j, c] = fix[j * dqk + c] 2^-s in `dtype`, or NaN for every column of a row with bad[j] != 0.
// dkv rows at j * dkv_ss elements, 8-byte aligned; dqk and dkv_ss multiples of 4.
void convert_dkv_fixed(const int64_t* fix, const uint32_t* bad, const FixScaleArgs& s, void* dkv,
                       sa_dtype dtype, int64_t skv, int dqk, int64_t dkv_ss, cudaStream_t stream);

// The binned plan (cuda/dsa_binned_fixed.cuh): the binned form where
// bin_serves(ctl->count, head_groups, min_resolution), else the int64 form, its rows [skv, dqk]
// int64 at the start of the planes.
struct BinArgs {
  FixScaleArgs fix;    // the control words, scale, rows and head groups (both forms)
  int min_resolution;  // the least LW the binned form serves (kBinMinResolution; tests: more)
};

// Zeroes, when the first pass missed: the kBinCount planes [skv + 1, dqk / 2] (binned form,
// bin_bound says retry), or the int64 rows [skv, dqk] (int64 form, fix_scale says retry); else
// nothing. bins 16-byte aligned, dqk a multiple of 4.
void bin_zero_if_retry(uint64_t* bins, int64_t skv, int dqk, const BinArgs& s,
                       cudaStream_t stream);

// dkv[j, c] = bin_decode of column c's kBinCount sums (binned form), or the int64 form's
// fix[j * dqk + c] 2^-s, in `dtype`; NaN for every column of a row with bad[j] != 0. dkv rows at
// j * dkv_ss elements, 8-byte aligned; dqk and dkv_ss multiples of 4, bins 16-byte aligned.
void convert_dkv_binned(const uint64_t* bins, const uint32_t* bad, const BinArgs& s, void* dkv,
                        sa_dtype dtype, int64_t skv, int dqk, int64_t dkv_ss, cudaStream_t stream);

}  // namespace sa::portable::dsa_bwd
