// Portable (sm80 and newer) kernels of the DSA lightning indexer (SPEC 5), host side: for each
// operation, the support check ("" or the missing feature), the workspace it needs and the run.
// Every run launches on `stream` (device p.device_index current), with no host synchronisation,
// and throws sa::Error when the problem is unsupported. Designs: indexer_score_tile.cuh (the
// scores both kernels share), indexer_scores_kernel.cuh, indexer_topk_kernel.cuh,
// indexer_loss.cu (the KL loss and its gradients); docs/indexer_decisions.md.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "common/indexer_problem.hpp"

namespace sa::portable {

// Dense scores: writes every element of p.scores. No workspace.
std::string indexer_scores_unsupported(const IndexerScoresProblem& p);
void indexer_scores(const IndexerScoresProblem& p, cudaStream_t stream);

// Fused top-k: writes every element of p.topk_idx and p.topk_length. The workspace holds the
// candidate buffers of the persistent CTAs (O(k) per CTA, independent of S_kv).
std::string indexer_topk_unsupported(const IndexerTopkProblem& p);
size_t indexer_topk_workspace_bytes(const IndexerTopkProblem& p);
void indexer_topk(const IndexerTopkProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream);

// The KL loss (sparse mode) and, when requested, its gradients: writes loss, loss_per_token,
// dq_I, dk_I and dw (every element).
std::string indexer_loss_unsupported(const IndexerLossProblem& p);
size_t indexer_loss_workspace_bytes(const IndexerLossProblem& p);
void indexer_loss(const IndexerLossProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream);

}  // namespace sa::portable
