// What an implementation declares to the dispatcher (FlashMLA-style "dispatch that refuses
// loudly"): for each operation, whether it serves a validated problem (and if not, the missing
// feature, in words), how much device workspace it needs, and how to run it.
//
// Implementations live in their own folders (src/reference; src/sm80, the portable path; src/sm90;
// src/cuda holds the CUDA layer both GPU paths share) and each defines one `Implementation`
// object; src/api/dispatch.cpp lists them in priority order.
#pragma once

#include <cstddef>
#include <string>

#include "common/indexer_problem.hpp"
#include "common/problem.hpp"
#include "sparse_attention/sparse_attention.h"

namespace sa {

// Resources of one call, already acquired by the API layer.
struct ExecContext {
  sa_stream_t stream = nullptr;
  void* workspace = nullptr;     // at least the bytes the implementation asked for, or null when
  size_t workspace_bytes = 0;    // the entry's workspace is optional and the caller gave none
};

template <class Problem>
struct OpEntry {
  // "" when the implementation serves `p`, otherwise the reason ("D = 96 (supports 64, 128)").
  // Null: the operation is not implemented here.
  std::string (*unsupported)(const Problem& p) = nullptr;
  size_t (*workspace_bytes)(const Problem& p) = nullptr;  // null: none
  void (*run)(const Problem& p, const ExecContext& ctx) = nullptr;
  // True for the problems whose workspace only speeds the call up: without a workspace of that
  // size and without an allocator, run() gets none and takes a slower path instead of the call
  // failing. Null: the workspace is required.
  bool (*workspace_optional)(const Problem& p) = nullptr;
};

struct Implementation {
  sa_impl id;
  const char* name;
  OpEntry<BsaFwdProblem> bsa_fwd;
  OpEntry<BsaBwdProblem> bsa_bwd;
  OpEntry<DsaFwdProblem> dsa_fwd;
  OpEntry<DsaBwdProblem> dsa_bwd;
  // The DSA indexer (SPEC 5). An implementation that leaves these out does not serve them.
  OpEntry<IndexerScoresProblem> indexer_scores;
  OpEntry<IndexerTopkProblem> indexer_topk;
  OpEntry<IndexerLossProblem> indexer_loss;
};

}  // namespace sa
