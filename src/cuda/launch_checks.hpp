// Host-side checks that the portable launchers share before they accept a problem. No device
// code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/problem.hpp"

namespace sa::portable {

// Whether `ptr` is a multiple of `bytes`.
inline bool is_aligned(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// "" when a kernel of `need` bytes of dynamic shared memory per block fits what `device` lets a
// block opt into (queried once per device: no driver call per call), else the reason.
std::string smem_unsupported(int32_t device, size_t need);

// "" when the tensor's addressing suits 16-byte vector access, else the reason.
std::string check_tensor_addressing(const char* name, const Bhsd& t, int64_t B, int64_t H,
                                    int64_t S);

// "" when the portable DSA kernels serve these sizes (D_qk 512 or 576, d_v 512, H a multiple of
// 8, topk and H in int32 range), else the reason; `path` names the kernel in the message
// ("portable DSA forward").
std::string dsa_sizes_unsupported(const DsaDims& d, const char* path);

// "" when the DSA forward's tensors suit its copies (16-byte cp.async of q and kv rows, 4-byte
// stores of out pairs), else the reason naming `path`. Validation guarantees this for CUDA
// tensors; the launchers check again because their kernels rely on it.
std::string dsa_forward_layout_unsupported(const DsaFwdProblem& p, const char* path);

}  // namespace sa::portable
