// The `bench` subcommand: BENCHMARKING.md's method for our own implementations and variants.
//
//   sparse-attention bench --op bsa_bwd --seq 8192 --heads 32 --dim 128 --block 128
//       --density 0.5 --variants "bucket=0/bucket=1" --json out.json
//
// For each operation: one random problem at the GPU size (demo flags), then for each variant
// (a set of option overrides: impl=, bucket=, deterministic=): outputs poisoned with NaN, one
// call, a NaN check and a comparison with the fp64 reference on exact sub-problems; then timing
// with CUDA events: warm-up calls, rounds of `calls` calls, variants alternating round by round,
// a second pass in reverse order; the median round is reported. FLOPs count attended pairs only.
// JSON records follow BENCHMARKING.md ("anchor" is the first variant; "speedup" = its median
// over this one's). A variant can also be another library's kernel on the same tensors:
// anchor=flashmla (flashmla_anchor.hpp; records with impl "flashmla").
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/tuning.hpp"
#include "demo.hpp"

namespace sa_tool {

struct BenchVariant {
  std::string label = "auto";  // as written on the command line
  sa_impl impl = SA_IMPL_AUTO;
  int bucket = -1;             // -1: leave options.bucket_size as it is
  int deterministic = -1;      // -1: leave as it is
  // The library's internal tuning (common/tuning.hpp) around each of this variant's calls:
  // "tune.NAME=VALUE" in --variants (parse_variants below lists the keys).
  sa::detail::Tuning tuning;
  bool tuned = false;
  // "anchor=flashmla": not our library but FlashMLA's Hopper sparse prefill (dsa_fwd only;
  // flashmla_anchor.hpp) on the same tensors, checked against the same reference.
  std::string anchor;
  // "mask=none|causal" (bsa_fwd only): options.mask of this variant instead of --mask's, checked
  // against the reference with the same mask (an A/B of masked and unmasked runs of one list).
  int mask = -1;  // -1: --mask's
};

struct BenchOptions {
  std::vector<BenchVariant> variants = {BenchVariant{}};
  int warmup = 10;     // calls per variant before timing
  int rounds = 5;      // timed rounds per variant and pass (two passes)
  int calls = 20;      // calls per round
  std::string json;    // write records here (appends to a JSON list if the file exists)
  bool check = true;   // compare with the reference before timing
};

// "impl=portable,bucket=1/impl=sm90" -> two variants.
// Keys: impl=, bucket=, deterministic=, anchor=flashmla, and the tuning keys
//   tune.fwd_splits=auto|1..16   Hopper BSA forward split-KV slices (1: never split)
//   tune.fwd_dyn=auto|0|1|2      Hopper BSA forward, masked and packed calls: the tile order (0 =
//                                auto: dynamic where the workspace holds the counter, 1 static,
//                                2 dynamic; unmasked dense calls ignore it)
//   tune.bwd_tail=auto|0..1024   Hopper BSA backward: last work items launched longest first
//   tune.sm90_bsa_bwd_stats=0|1  Hopper BSA backward: the loader warp's lse2 / delta ring
//   tune.sm90_bsa_bwd_full=0|1   Hopper BSA backward: the full-block path (calls whose KV blocks
//                                are all full: no kv_block_len, S_kv a multiple of the block)
//   tune.dsa_bwd=0..7            Hopper DSA backward variant bits (1 late K release, 2 per-row
//                                index loads, 4 token groups walk their unions from the first
//                                key)
//   tune.sm90_dsa_bwd_groups=0|1 Hopper DSA backward at H 8 / 16 / 32: 1 token groups (the
//                                default), 0 one token per item, heads padded to 64
//   tune.sm90_dsa_bwd_det_binned=0..2 Hopper DSA backward, deterministic: 0 int64 fixed point
//                                (the default), 1 the binned plan (exponent-binned int32 pairs;
//                                its int64 form where a key has too many slots), 2 the binned
//                                plan with its int64 form forced
//   tune.dsa_fwd_pad=0|1         Hopper DSA forward at H 16 on the padded 64-row kernel
//   tune.topk=0..4               Hopper indexer top-k: default, fused, two passes with the radix
//                                select staged / unstaged, two passes with the candidates kernel
//   tune.ptopk=0..4              portable indexer top-k: as tune.topk
//   tune.sm90_indexer_target=0..3 Hopper indexer loss: 0 the Hopper attention target (Q in
//                                registers; default), 1 the portable target (the portable
//                                loss entry), 2 = 0, 3 the Hopper target with Q in shared memory
//   tune.sm90_indexer_loss_kernel=0..4 Hopper indexer loss kernel: 0 the default (= 4), 1 the
//                                wgmma one (sm90/indexer_loss_kernel.cuh; sparse or dense, not
//                                deterministic, H_I 16/32/64; the portable one elsewhere), 2 as 1
//                                with two tokens per CTA in dense mode, 3 the portable loss kernel,
//                                4 the pipelined kernels (sm90/indexer_loss_pipe_kernel.cuh:
//                                dense mode's pair kernel, sparse mode's one-token kernel)
// The former spellings env.SA_TUNE_SM90_{FWD_SPLITS,BWD_TAIL,DSA_BWD,DSA_FWD_PAD}=VALUE are
// accepted for the same keys.
std::vector<BenchVariant> parse_variants(const std::string& text);

// Returns the exit status: 0 when every variant ran and passed its check.
int run_bench(const DemoOptions& demo, const BenchOptions& bench);

}  // namespace sa_tool
