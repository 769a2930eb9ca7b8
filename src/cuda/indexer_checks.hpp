// Host-side checks that the indexer launchers of every path share (the shared CUDA layer): SPEC
// 5's GPU contract again (the kernels rely on it), the addressing of q_I and k_I rows, the sizes
// the kernels index with, and the shared memory a kernel needs. No device code.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "common/indexer_problem.hpp"
#include "cuda/launch_checks.hpp"

namespace sa::portable {

// "" when the indexer inputs of `p` suit the portable kernels, else the reason naming `path`.
template <class Problem>
std::string indexer_inputs_unsupported(const Problem& p, const char* path) {
  const IndexerDims& d = p.dims;
  std::ostringstream os;
  if (p.device != SA_DEVICE_CUDA) return "needs CUDA tensors";
  const std::string contract = indexer_gpu_contract(d, p.dtype, p.in.w_dtype);
  if (!contract.empty()) {
    os << contract << " (" << path << ")";
    return os.str();
  }
  // 16-byte cp.async of q_I and k_I rows.
  const Shd& q = p.in.q_I;
  const Shd& k = p.in.k_I;
  const bool rows_ok = q.sd == 1 && k.sd == 1 && is_aligned(q.data, 16) &&
                       is_aligned(k.data, 16) && (q.sh % 8 == 0 || d.HI == 1) &&
                       (q.ss % 8 == 0 || d.Sq == 1) && (k.ss % 8 == 0 || d.Skv == 1);
  if (!rows_ok) {
    os << "q_I, k_I: the last dimension must be contiguous and rows 16-byte aligned (" << path
       << ")";
    return os.str();
  }
  // Key indices, ranges and tile starts are int32 in the kernels.
  if (d.Skv > INT32_MAX - 128) {
    os << "S_kv = " << d.Skv << " (" << path << " supports < 2^31 - 128)";
    return os.str();
  }
  return "";
}

}  // namespace sa::portable
