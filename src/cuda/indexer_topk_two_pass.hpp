// The indexer top-k in two passes (SPEC 5), the driver every CUDA path shares: for each chunk of
// query rows, an arch's score kernel writes the chunk's dense fp32 scores into the workspace,
// then topk_rows (indexer_topk_rows.cu) selects each row's top-k. The chunk is as many rows as
// kTwoPassBudget bytes hold with the workspace's alignment slack. The selection is SPEC 5's over
// the score kernel's bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/indexer_problem.hpp"
#include "cuda/indexer_topk_rows.hpp"

namespace sa::portable::indexer {

constexpr int64_t kTwoPassBudget = int64_t{1} << 30;  // workspace bytes: a chunk's scores + slack

struct TwoPassPlan {
  int64_t ld = 0;     // floats per score row: S_kv rounded up to 4 (16-byte rows)
  int64_t chunk = 0;  // query rows per chunk
  size_t bytes = 0;   // workspace, with slack to align the caller's pointer
};

// chunk_rows > 0 forces the rows per chunk (tests); else the budget decides.
TwoPassPlan two_pass_plan(const IndexerTopkProblem& p, int64_t chunk_rows = 0);

// The score kernel of an arch: dense scores of p (every element of p.scores, or, where the kernel
// honours p.in_range_only, the elements of each row's range), on `stream`; and
// its support check ("" or why not).
using ScoresLaunch = void (*)(const IndexerScoresProblem& p, cudaStream_t stream);
using ScoresUnsupported = std::string (*)(const IndexerScoresProblem& p);

struct TwoPassOptions {
  ScoresLaunch scores = nullptr;
  ScoresUnsupported scores_unsupported = nullptr;
  TopkRowsKernel rows_kernel = TopkRowsKernel::kCandidates;  // the selection (topk_rows)
  int32_t list_cap = kTopkListCap;  // kCandidates' candidate list (tests: smaller forces the rows)
  int64_t chunk_rows = 0;           // as two_pass_plan
  const char* path = "";   // the arch path, for errors
};

// The row kernel of a top-k tuning value (Tuning::{sm90,portable}_indexer_topk): 2 the radix
// kernel staged, 3 unstaged, anything else the candidates kernel.
inline TopkRowsKernel rows_kernel_of(int32_t tuning) {
  return tuning == 2 ? TopkRowsKernel::kRadixStaged
                     : tuning == 3 ? TopkRowsKernel::kRadix : TopkRowsKernel::kCandidates;
}

// "" when the arch's score kernel serves every chunk of p (checked once, on all of p's rows: a
// chunk's checks are those of the whole), else why not.
std::string two_pass_unsupported(const IndexerTopkProblem& p, const TwoPassOptions& o);

// Writes every element of p.topk_idx and p.topk_length; needs two_pass_plan(p).bytes of
// workspace. The caller has checked two_pass_unsupported.
void two_pass_topk(const IndexerTopkProblem& p, void* workspace, size_t workspace_bytes,
                   const TwoPassOptions& o, cudaStream_t stream);

}  // namespace sa::portable::indexer
