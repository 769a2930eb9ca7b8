// Internal tuning: which variant of a kernel runs where the library has measured alternatives.
// Not part of the API. The shipped library never changes it (these symbols are hidden in
// libsparse_attention.so), so every call through the C ABI runs the defaults below, and a
// workspace size depends on the call's arguments only. The in-tree bench and tests, which link
// the library's objects statically (CMake target sparse_attention_internal), set it to measure
// and test the alternatives: `sparse-attention bench --variants "impl=sm90,tune.NAME=VALUE"`.
#pragma once

#include <cstdint>

namespace sa::detail {

struct Tuning {
  // Hopper BSA forward, split-KV: slices of each row's block list run as separate tiles.
  // 0: the automatic rule (sm90/bsa_forward.cu); 1: never split; 2..16: that many.
  int32_t sm90_fwd_splits = 0;
  // Hopper BSA forward, masked and packed calls: the order of the persistent CTAs' tiles. 0: the
  // rule (block 128: dynamic where the workspace holds the tile counter: tiles from the counter,
  // each head's query blocks from the last; static without it; block 64: static); 1: static
  // (blockIdx.x + k gridDim.x); 2: dynamic, an error where the workspace lacks the counter.
  // Unmasked dense calls ignore it. H100, session 47, causal MoBA: dynamic over static +4.9% at
  // block 128, -2.5% at block 64.
  int32_t sm90_fwd_dyn = 0;
  // Hopper BSA backward: how many of the last work items the reverse map launches longest first
  // (its step 6). -1: two waves of CTAs; 0: item order; at most portable::kMaxTailItems.
  int32_t sm90_bwd_tail = -1;
  // Hopper BSA backward main kernel variants (sm90/bsa_backward_kernel.cuh, kTune bits). stats:
  // warp 2 of the producer warpgroup walks the tiles and brings each tile's lse2 / delta into a
  // ring on mbarriers (kTuneStatsWarp). full: the full-block path (no padded-key selects) where
  // every KV block of the call is full (no kv_block_len, S_kv a multiple of the block; other
  // calls run the general kernel). -1: the rule (both on at block 128: +9.6% / +9.1% at 50% /
  // 12.5% on an H100, session 37; off at block 64, level there); 0: off; 1: on.
  int32_t sm90_bsa_bwd_stats = -1;
  int32_t sm90_bsa_bwd_full = -1;
  // Hopper DSA backward variant bits (sm90/dsa_backward_kernel.cuh, kTune*): 1 releases the K
  // stage late, 2 loads each row's index inside the gather loop (not with token groups), 4 token
  // groups walk their unions from the first key instead of a rotated start. 0: the default.
  int32_t sm90_dsa_bwd_bits = 0;
  // Hopper DSA backward at H 8, 16, 32 (not deterministic): 1 token groups (G = 64 / H tokens
  // per 64-row work item over the union of their keys, cuda/dsa_token_groups.hpp), 0 one token
  // per work item with its heads padded to 64 (the kernel before issue 33).
  int32_t sm90_dsa_bwd_groups = 1;
  // Hopper DSA backward, deterministic mode (sm90/dsa_backward.cu): 0 the int64 fixed point
  // (cuda/dsa_fixed_point.cuh); 1 the binned plan (exponent-binned int32 pairs, design D1,
  // cuda/dsa_binned_fixed.cuh: its binned form where the slot counts allow, else its int64
  // form); 2 the binned plan with its int64 form forced (tests). Sets the workspace size too.
  int32_t sm90_dsa_bwd_det_binned = 0;
  // Hopper DSA forward at H 16: the padded 64-row kernel instead of the transposed one.
  bool sm90_dsa_fwd_pad_h16 = false;
  // Hopper indexer top-k (sm90/indexer_topk.cu): 0 the default (two passes, the candidates row
  // kernel), 1 the fused kernel, 2 two passes (dense scores of a chunk of rows in the workspace,
  // then a radix select per row, rows staged in shared memory where they fit), 3 two passes with
  // the radix select unstaged, 4 two passes with the candidates row kernel
  // (cuda/indexer_topk_rows.cu).
  int32_t sm90_indexer_topk = 0;
  // Portable indexer top-k (sm80/indexer_topk.cu): 0 the default (two passes, the candidates row
  // kernel), 1 fused, 2 / 3 / 4 two passes as sm90_indexer_topk.
  int32_t portable_indexer_topk = 0;
  // The candidates row kernel's list entries (0: kTopkListCap); tests force the row fallback.
  int32_t indexer_topk_list_cap = 0;
  // Two passes, every path: query rows per chunk (0: as many as 1 GiB of scores holds).
  int32_t indexer_topk_rows = 0;
  // Hopper indexer loss (sm90_impl.cpp, sm90/indexer_loss.cu): 0 the default (the shared loss
  // driver with the Hopper attention target, Q in registers: sm90/indexer_target_rs_kernel.cuh),
  // 1 the portable loss entry on the sm90 entry (the same driver with the portable target), 2 the
  // Q-in-registers target (= 0), 3 the Hopper target with Q in shared memory
  // (sm90/indexer_target_kernel.cuh).
  int32_t sm90_indexer_target = 0;
  // Hopper indexer loss, the loss kernel (sm90/indexer_loss.cu): 0 the default = 4; 1 the Hopper
  // (wgmma) loss kernel (sm90/indexer_loss_kernel.cuh) with one token per CTA where it serves the
  // call (sparse or dense mode, not deterministic, H_I 16 / 32 / 64), the portable one elsewhere;
  // 2 as 1, with dense mode's two tokens per CTA (loss_sm90_pair_kernel); 3 the portable loss
  // kernel (cuda/indexer_loss_kernel.cuh) everywhere. Only with sm90_indexer_target != 1 (1 runs
  // the portable entry). H100, session 36: 1 against 3 sparse S 4096 1.075x, dense S 8192
  // 1.061x; 2 dense 1.105x. 4 (the default) as 2 with dense mode's pipelined kernel
  // (loss_sm90_pipe_kernel, sm90/indexer_loss_pipe_kernel.cuh; H100, session 37: dense S 8192
  // 1.23x tuning 2) and sparse mode's pipelined one-token kernel (loss_sm90_sparse_pipe_kernel,
  // session 43).
  int32_t sm90_indexer_loss_kernel = 0;
};

// The tuning of the calls made on this thread (the defaults unless set_tuning changed them).
const Tuning& tuning();
// Sets the tuning of the calls made on this thread; returns the previous one.
Tuning set_tuning(const Tuning& t);

// A tuning for the scope of this object; the previous one is restored on exit.
class ScopedTuning {
 public:
  explicit ScopedTuning(const Tuning& t) : previous_(set_tuning(t)) {}
  ~ScopedTuning() { set_tuning(previous_); }
  ScopedTuning(const ScopedTuning&) = delete;
  ScopedTuning& operator=(const ScopedTuning&) = delete;

 private:
  Tuning previous_;
};

}  // namespace sa::detail
