// Hopper (sm_90a) kernels of the DSA lightning indexer (SPEC 5), host side: for each operation,
// the support check ("" or the missing feature) and the run. Every run launches on `stream`
// (device p.device_index current), with no host synchronisation, and throws sa::Error
// (SA_ERROR_UNSUPPORTED) when the problem is unsupported. Designs: indexer_scores_kernel.cuh,
// indexer_topk_kernel.cuh, indexer_target_kernel.cuh (the loss's attention target),
// docs/indexer_decisions.md ("The sm90 score kernel", "The sm90 attention target").
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "common/indexer_problem.hpp"

namespace sa::sm90 {

// Dense scores: writes every element of p.scores. No workspace. The caller checks the device
// (sm_90).
std::string indexer_scores_unsupported(const IndexerScoresProblem& p);
void indexer_scores(const IndexerScoresProblem& p, cudaStream_t stream);

// Top-k: writes every element of p.topk_idx and p.topk_length. Two passes by default (the dense
// scores of up to 1 GiB of query rows in the workspace, then a top-k per row); the fused kernel
// (workspace O(k) per CTA slot) when the internal tuning forces it (indexer_topk.cu). The caller
// checks the device (sm_90).
std::string indexer_topk_unsupported(const IndexerTopkProblem& p);
size_t indexer_topk_workspace_bytes(const IndexerTopkProblem& p);
void indexer_topk(const IndexerTopkProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream);

// The KL loss and, when requested, its gradients: writes loss, loss_per_token, dq_I, dk_I and dw
// (every element). The shared driver (cuda/indexer_loss_driver.hpp) with the Hopper attention
// target; the same workspace as the portable loss. The caller checks the device (sm_90).
std::string indexer_loss_unsupported(const IndexerLossProblem& p);
size_t indexer_loss_workspace_bytes(const IndexerLossProblem& p);
void indexer_loss(const IndexerLossProblem& p, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream);

}  // namespace sa::sm90
