#include "common/indexer_problem.hpp"

#include <sstream>

#include "common/host_numeric.hpp"

namespace sa {

std::string indexer_gpu_contract(const IndexerDims& d, sa_dtype dtype_I, sa_dtype w_dtype) {
  std::ostringstream why;
  if (dtype_I != SA_DTYPE_BF16)
    why << "q_I: dtype " << dtype_name(dtype_I) << " (the GPU paths take bf16)";
  else if (w_dtype != SA_DTYPE_FP32)
    why << "w: dtype " << dtype_name(w_dtype) << " (the GPU paths take fp32)";
  else if (d.DI != 128)
    why << "q_I: D_I = " << d.DI << " (the GPU paths take 128)";
  else if (d.HI != 16 && d.HI != 32 && d.HI != 64)
    why << "q_I: H_I = " << d.HI << " (the GPU paths take 16, 32 or 64)";
  return why.str();
}

std::string indexer_gpu_contract(const IndexerLossProblem& p) {
  std::string why = indexer_gpu_contract(p.dims, p.dtype, p.in.w_dtype);
  if (!why.empty()) return why;
  std::ostringstream os;
  if (p.attn_dtype != SA_DTYPE_BF16)
    os << "q: dtype " << dtype_name(p.attn_dtype) << " (the GPU paths take bf16)";
  else if (p.loss_dtype != SA_DTYPE_FP32)
    os << "loss: dtype " << dtype_name(p.loss_dtype) << " (the GPU paths write fp32)";
  return os.str();
}

}  // namespace sa
