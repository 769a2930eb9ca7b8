// The two-pass indexer top-k's driver (indexer_topk_two_pass.hpp).
#include "cuda/indexer_topk_two_pass.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/error.hpp"
#include "cuda/indexer_topk_rows.hpp"

namespace sa::portable::indexer {
namespace {

constexpr size_t kAlign = 256;

// The score problem of query rows [r0, r0 + rows): the same inputs from row r0 on, the scores into
// `dense` (row stride ld).
IndexerScoresProblem chunk_scores(const IndexerTopkProblem& p, int64_t r0, int64_t rows,
                                  float* dense, int64_t ld) {
  IndexerScoresProblem sp;
  sp.dims = p.dims;
  sp.dims.Sq = rows;
  sp.dtype = p.dtype;
  sp.device = p.device;
  sp.device_index = p.device_index;
  sp.scale = p.scale;
  sp.options = p.options;
  sp.meta = p.meta;
  if (sp.meta.k_start.data != nullptr) sp.meta.k_start.data += r0 * sp.meta.k_start.stride[0];
  if (sp.meta.k_end.data != nullptr) sp.meta.k_end.data += r0 * sp.meta.k_end.stride[0];
  sp.in = p.in;
  // bf16 q_I and fp32 w (the GPU contract, indexer_gpu_contract).
  sp.in.q_I.data = static_cast<uint16_t*>(sp.in.q_I.data) + r0 * sp.in.q_I.ss;
  sp.in.w = static_cast<const float*>(sp.in.w) + r0 * sp.in.w_stride[0];
  sp.scores = dense;
  sp.scores_stride[0] = ld;
  sp.scores_stride[1] = 1;
  sp.in_range_only = true;  // topk_rows reads each row's range only
  return sp;
}

}  // namespace

TwoPassPlan two_pass_plan(const IndexerTopkProblem& p, int64_t chunk_rows) {
  TwoPassPlan plan;
  plan.ld = (std::max<int64_t>(p.dims.Skv, 1) + 3) / 4 * 4;
  // The whole workspace, the alignment slack included, within the budget (at S 131072 the
  // budget is exactly the output's S k 4 bytes, the O(S k) bound).
  plan.chunk = std::clamp<int64_t>(
      chunk_rows > 0 ? chunk_rows : (kTwoPassBudget - int64_t{kAlign}) / (plan.ld * 4), 1,
      std::max<int64_t>(p.dims.Sq, 1));
  plan.bytes = static_cast<size_t>(plan.chunk * plan.ld) * sizeof(float) + kAlign;
  return plan;
}

std::string two_pass_unsupported(const IndexerTopkProblem& p, const TwoPassOptions& o) {
  const TwoPassPlan plan = two_pass_plan(p, o.chunk_rows);
  return o.scores_unsupported(chunk_scores(p, 0, p.dims.Sq, nullptr, plan.ld));
}

void two_pass_topk(const IndexerTopkProblem& p, void* workspace, size_t workspace_bytes,
                   const TwoPassOptions& o, cudaStream_t stream) {
  if (p.dims.Sq == 0) return;
  const TwoPassPlan plan = two_pass_plan(p, o.chunk_rows);
  SA_CHECK(workspace != nullptr && workspace_bytes >= plan.bytes, SA_ERROR_WORKSPACE,
           "indexer_topk (" << o.path << ", two passes): needs " << plan.bytes
                            << " bytes of workspace, got " << workspace_bytes
                            << (workspace == nullptr ? " (null)" : ""));
  float* dense = reinterpret_cast<float*>(
      (reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) / kAlign * kAlign);
  TopkRowsArgs a;
  a.scores = dense;
  a.ld = plan.ld;
  a.dims = p.dims;
  a.meta = p.meta;
  a.k = static_cast<int32_t>(p.dims.topk);
  a.idx = p.topk_idx;
  a.idx_ss = p.topk_idx_stride[0];
  a.len = p.topk_length;
  a.len_s = p.topk_length_stride;
  a.list_cap = o.list_cap;
  for (int64_t r0 = 0; r0 < p.dims.Sq; r0 += plan.chunk) {
    const int64_t rows = std::min(plan.chunk, p.dims.Sq - r0);
    o.scores(chunk_scores(p, r0, rows, dense, plan.ld), stream);
    a.row0 = r0;
    a.rows = rows;
    topk_rows(a, o.rows_kernel, stream);
  }
}

}  // namespace sa::portable::indexer
